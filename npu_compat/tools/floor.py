"""A run's start-up floor: the same processes, each only importing what it imported, started in the
same order and with the same overlap -- and the run laid along the floor's critical path.

``python -m npu_compat doctor --reports DIR --floor [--until EPOCH]`` and ``bench/run_startup.py``.

The run's start-up is the span from ``begin`` (the first process of the run: with
:func:`run_begin`, the Ray driver's start) to ``until`` (where its start-up ended, e.g. the weight
sync's set-up; default: the last process became ready).  Its processes are those of the reports
that started inside it.  For each, its import log (:func:`npu_compat.tools.timeline.read_imports`)
names the modules it had imported by ``until``, and when (to the watcher's half second);
:func:`replay` starts, for each process, a child interpreter (the same executable, with the same
``sys.path``) that imports those modules in the same order and exits.  A child starts once the
child of every process that had started before its process did has imported as many modules as
that process had by then: what the run did one after the other, the floor does one after the
other (a driver that imports Trinity's explorer before it creates the Explorer actor), and what
overlapped overlaps -- on the same machine, with the same contention -- while every span in which
the run imported nothing on the way is gone.

The floor's critical path is the chain that ends with the child that ended last, each step the
child (and the point in it) that its successor waited for last.  Along it, the run's start-up is
exactly the sum of each process's span from its start to that point, the *waits* between that
point and the next process's start, and the tail to ``until`` (:func:`render`).

npu-compat's own modules are not imported again (they are what is measured against the floor);
the simulated Ascend's torch_npu stand-in and the released vllm-ascend are, as they are
imported on a real NPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from .. import _env
from . import timeline

#: Modules a floor child does not import again: npu-compat's own, and each interpreter's entry points.
_SKIP_PREFIXES = ("npu_compat", "_npu_compat")
_SKIP = {"__main__", "__mp_main__", "sitecustomize", "usercustomize"}

#: What a floor child runs: ``sys.argv[1]`` names a JSON file with its ``sys_path``, ``modules`` and
#: ``marks``.  It imports each module; before the module at index ``k`` in ``marks`` (and at the end,
#: ``k`` = their number) it creates ``sys.argv[1] + ".<k>"``: ``k`` modules are done.  It prints how
#: many imports failed.
_CHILD = """
import importlib, json, sys
with open(sys.argv[1], encoding="utf-8") as f:
    spec = json.load(f)
sys.path[:] = spec["sys_path"]
marks = set(spec["marks"])
failed = 0
for i, name in enumerate(spec["modules"]):
    if i in marks:
        open(sys.argv[1] + "." + str(i), "w").close()
    if name in sys.modules:
        continue
    try:
        importlib.import_module(name)
    except BaseException:
        failed += 1
open(sys.argv[1] + "." + str(len(spec["modules"])), "w").close()
print(json.dumps({"failed": failed}), flush=True)
"""


@dataclass
class Step:
    """One process of the run, and its floor child."""

    row: timeline.Row
    modules: list[str]
    #: when the run's process had imported each of ``modules`` (its import log's look)
    times: list[float]
    sys_path: list[str]
    executable: str
    #: index (into the plan) of each process that started before this one -> how many of its modules
    #: it had imported when this one started: the child waits for that many in that one's child
    after: dict[int, int] = field(default_factory=dict)
    #: the counts other children wait for in this one
    marks: set[int] = field(default_factory=set)
    #: the child's start and end, and when it reached each mark, seconds after the replay began
    started: float | None = None
    ended: float | None = None
    reached: dict[int, float] = field(default_factory=dict)
    #: imports that raised in the child
    failed: int | None = None
    notes: list[str] = field(default_factory=list)

    def imported_by(self, t: float) -> int:
        """How many of its modules the run's process had imported by ``t``."""
        return sum(1 for x in self.times if x <= t)

    def run_time_of(self, count: int) -> float:
        """When the run's process had imported ``count`` of its modules (its start for 0)."""
        return self.times[count - 1] if count > 0 else (self.row.start or 0.0)


def run_begin(table: list[timeline.Row]) -> float | None:
    """The start of the run's first Ray driver (the processes before it are the cluster's)."""
    drivers = [row.start for row in table if row.role == "ray-driver" and row.start is not None]
    return min(drivers) if drivers else None


def plan(table: list[timeline.Row], directory: str, begin: float, until: float) -> list[Step]:
    """A floor step for each process of the run's rows (:func:`npu_compat.tools.timeline.rows` of the
    reports in ``directory``) that started in ``[begin, until)``."""
    steps: list[Step] = []
    for row in table:
        if row.start is None or not begin <= row.start < until:
            continue
        lines = timeline.read_imports(directory, row.host, row.pid)
        modules: list[str] = []
        times: list[float] = []
        for line in lines:
            t = timeline.as_seconds(line.get("t")) or 0.0
            if t > until:
                break
            new = line["new"]
            assert isinstance(new, list)
            kept = [n for n in new if n not in _SKIP and not n.startswith(_SKIP_PREFIXES)]
            modules += kept
            times += [t] * len(kept)
        first = lines[0] if lines else {}
        found = first.get("sys_path")
        sys_path = [str(entry) for entry in found] if isinstance(found, list) else sys.path
        steps.append(Step(row, modules, times, list(sys_path), row.executable or sys.executable))
    for i, step in enumerate(steps):
        start = step.row.start
        assert start is not None
        for j, other in enumerate(steps):
            if j != i and other.row.start is not None and other.row.start < start:
                step.after[j] = other.imported_by(start)
                other.marks.add(step.after[j])
    return steps


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """A floor child's environment: this one without npu-compat's variables, so that nothing activates."""
    env = dict(os.environ if environ is None else environ)
    for name in list(env):
        if name.startswith(_env.PREFIX):
            del env[name]
    env[_env.ENABLE] = "0"
    return env


def replay(steps: list[Step], timeout: float = 600.0, poll: float = 0.02) -> float:
    """Run the floor: each step's child once every child it comes after has reached its mark.  Returns
    the floor's length (the last child's end); each step gets its child's start, marks, end, failures."""
    env = child_env()
    with tempfile.TemporaryDirectory(prefix="npu-compat-floor-") as scratch:
        specs = []
        for i, step in enumerate(steps):
            spec = os.path.join(scratch, f"{i}.json")
            with open(spec, "w", encoding="utf-8") as f:
                json.dump(
                    {"sys_path": step.sys_path, "modules": step.modules, "marks": sorted(step.marks)}, f
                )
            specs.append(spec)
        pending = set(range(len(steps)))
        running: dict[int, subprocess.Popen[str]] = {}
        t0 = time.monotonic()
        while pending or running:
            now = time.monotonic() - t0
            if now > timeout:
                for proc in running.values():
                    proc.kill()
                raise TimeoutError(f"the floor did not end within {timeout:.0f} s")
            for i in running:
                for mark in steps[i].marks - steps[i].reached.keys():
                    if os.path.exists(f"{specs[i]}.{mark}"):
                        steps[i].reached[mark] = now
            for i in sorted(pending):
                if all(k in steps[j].reached for j, k in steps[i].after.items()):
                    pending.discard(i)
                    steps[i].started = now
                    running[i] = subprocess.Popen(
                        [steps[i].executable, "-c", _CHILD, specs[i]],
                        env=env,
                        cwd=scratch,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                    )
            for i, proc in list(running.items()):
                if proc.poll() is None:
                    continue
                ended = steps[i].ended = time.monotonic() - t0
                for mark in steps[i].marks - steps[i].reached.keys():  # a child that died: all at its end
                    steps[i].reached[mark] = ended
                out = proc.stdout.read() if proc.stdout is not None else ""
                try:
                    steps[i].failed = int(json.loads(out.strip().splitlines()[-1])["failed"])
                except (ValueError, IndexError, KeyError, TypeError):
                    steps[i].notes.append(f"child exited {proc.returncode} without its count")
                del running[i]
            time.sleep(poll)
    return max((step.ended or 0.0 for step in steps), default=0.0)


def floor_path(steps: list[Step]) -> list[tuple[int, int]]:
    """The floor's critical path as (step, mark) pairs: from the child that ended last (its mark: all
    its modules), back through the child and mark each one waited for last, to one that waited for none."""
    done = [i for i, step in enumerate(steps) if step.ended is not None]
    if not done:
        return []
    last = max(done, key=lambda i: steps[i].ended or 0.0)
    path = [(last, len(steps[last].modules))]
    while steps[path[-1][0]].after:
        after = steps[path[-1][0]].after
        j = max(after, key=lambda j: steps[j].reached.get(after[j], 0.0))
        path.append((j, after[j]))
    return path[::-1]


def _name(row: timeline.Row) -> str:
    return f"{row.pid} {row.actor or row.role} ({row.program})"


def render(steps: list[Step], begin: float, until: float, floor: float) -> list[str]:
    """The run's start-up against its floor, along the floor's critical path, as lines.

    For each process of the path: in the run, how long it started after the process above had
    reached the point it waited for (a wait: the run imported nothing on the way), and its span
    from its start to its own point (the next one's wait, or for the last one its last import);
    in the floor, the same span of its child, and how much longer the run's span was: the time the
    process (or the run around it) spent on anything but these imports -- its own work, or waiting
    for another process.  The run's start-up is exactly the sum of its waits, its spans and the tail
    from the last one's point to ``until``."""
    startup = until - begin
    if floor <= 0:
        return ["floor: nothing to replay"]
    lines = [
        f"start-up {startup:.1f} s (from the first Ray driver's start); floor {floor:.1f} s "
        f"({len(steps)} processes importing what they imported, in the run's order and overlap); "
        f"ratio {startup / floor:.2f}x",
        "along the floor's critical path (each process started once the one above had imported as much as "
        "when it started):",
        f"  {'run: waited':>11s} {'start':>7s} {'span':>7s} | {'floor: span':>11s} {'modules':>7s} | "
        f"{'run - floor':>11s}  process",
    ]
    waited = spans = floors = 0.0
    previous = begin
    for i, mark in floor_path(steps):
        step = steps[i]
        start = step.row.start or 0.0
        point = step.run_time_of(mark)
        wait = max(0.0, start - previous)
        own = step.reached.get(mark, step.ended or 0.0) - (step.started or 0.0)
        span = max(0.0, point - start)
        waited, spans, floors = waited + wait, spans + span, floors + own
        lines.append(
            f"  {wait:11.1f} {start - begin:7.1f} {span:7.1f} | {own:11.1f} {mark:7d} | {span - own:+11.1f}  "
            f"{_name(step.row)}"
        )
        previous = max(point, start)
    tail = until - previous
    lines.append(
        f"  {tail:11.1f} {until - begin:7.1f} {'':7s} | {'':11s} {'':7s} | {'':11s}  the rest of the start-up"
    )
    lines.append(
        f"  in all: the run waited {waited + tail:.1f} s between processes and its processes' spans took "
        f"{spans:.1f} s, {spans - floors:+.1f} s against the floor's {floors:.1f} s"
    )
    for step in steps:
        lines += [f"  note: {_name(step.row)}: {note}" for note in step.notes]
    return lines
