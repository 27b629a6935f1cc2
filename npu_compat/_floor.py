"""A run's start-up floor: the same processes, each only importing what it imported, started in the
same order and with the same overlap -- and the critical paths of the run and of that floor.

``python -m npu_compat doctor --reports DIR --floor [--until EPOCH]`` and ``bench/run_startup.py``.

The run's start-up is the span from ``begin`` (the first process of the run: with
:func:`run_begin`, the Ray driver's start) to ``until`` (where its start-up ended, e.g. the weight
sync's set-up; default: the last process became ready).  Its processes are those of the reports
that started inside it.  For each, its import log (:func:`npu_compat._timeline.read_imports`)
names the modules it had imported by ``until``; :func:`replay` starts, for each process, a child
interpreter (the same executable, with the same ``sys.path``) that imports those modules in the
same order and exits.  The child says when it has imported what its process had imported by the
time it was *ready* (:attr:`npu_compat._timeline.Row.ready`: its role, e.g. a Ray actor's class
instantiated), and goes on with the rest.  A child starts once the children of every process
that was ready before its process started are ready: what ran one after the other in the run
runs one after the other in the floor, and what overlapped overlaps -- on the same machine, with
the same contention -- while every wait between them is gone.

The floor's critical path is the chain that ends with the child that ended last, each step the
one (of those its successor waited for) that was ready last.  The run's critical path is the
chain of processes each started after the one it *follows* (:func:`npu_compat._timeline.follows`).

npu-compat's own modules are not imported again (they are what is measured against the floor);
the simulated Ascend's stand-ins for torch_npu and vllm-ascend are, as the real ones are
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

from . import _timeline

#: Modules a floor child does not import again: npu-compat's own, and each interpreter's entry points.
_SKIP_PREFIXES = ("npu_compat", "_npu_compat")
_SKIP = {"__main__", "__mp_main__", "sitecustomize", "usercustomize"}

#: What a floor child runs: ``sys.argv[1]`` names a JSON file with its ``sys_path``, ``modules`` and
#: ``ready`` (how many of the modules its process had imported when it was ready).  It imports each
#: module, creates ``sys.argv[1] + ".ready"`` once the first ``ready`` are done, and prints how many
#: failed.
_CHILD = """
import importlib, json, sys
with open(sys.argv[1], encoding="utf-8") as f:
    spec = json.load(f)
sys.path[:] = spec["sys_path"]
failed = 0
for i, name in enumerate(spec["modules"]):
    if i == spec["ready"]:
        open(sys.argv[1] + ".ready", "w").close()
    if name in sys.modules:
        continue
    try:
        importlib.import_module(name)
    except BaseException:
        failed += 1
open(sys.argv[1] + ".ready", "w").close()
print(json.dumps({"failed": failed}), flush=True)
"""


@dataclass
class Step:
    """One process of the run, and its floor child."""

    row: _timeline.Row
    modules: list[str]
    #: how many of ``modules`` it had imported when it was ready
    ready: int
    sys_path: list[str]
    executable: str
    #: indices (into the plan) of the processes that were ready before this one started
    after: list[int]
    #: the child's start, ready and end, seconds after the replay began; failed: imports that raised
    started: float | None = None
    was_ready: float | None = None
    ended: float | None = None
    failed: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def took(self) -> float | None:
        return None if self.started is None or self.ended is None else self.ended - self.started


def run_begin(table: list[_timeline.Row]) -> float | None:
    """The start of the run's first Ray driver (the processes before it are the cluster's)."""
    drivers = [row.start for row in table if row.role == "ray-driver" and row.start is not None]
    return min(drivers) if drivers else None


def plan(
    reports: list[dict[str, object]], directory: str, begin: float, until: float
) -> tuple[list[_timeline.Row], list[Step]]:
    """The run's rows, and a floor step for each process that started in ``[begin, until)``."""
    table = _timeline.rows(reports, directory)
    by_key = {(str(r.get("host") or "?"), r.get("pid")): r for r in reports}
    steps: list[Step] = []
    for row in table:
        if row.start is None or not begin <= row.start < until:
            continue
        lines = _timeline.read_imports(directory, row.host, row.pid)
        modules: list[str] = []
        ready = 0
        for line in lines:
            t = _timeline._time(line.get("t")) or 0.0
            if t > until:
                break
            new = line["new"]
            assert isinstance(new, list)
            modules += [n for n in new if n not in _SKIP and not n.startswith(_SKIP_PREFIXES)]
            if row.ready is None or t <= row.ready:
                ready = len(modules)
        first = lines[0] if lines else {}
        found = first.get("sys_path")
        sys_path = [str(entry) for entry in found] if isinstance(found, list) else sys.path
        executable = str(by_key.get((row.host, row.pid), {}).get("executable") or sys.executable)
        steps.append(Step(row, modules, ready, list(sys_path), executable, []))
    for i, step in enumerate(steps):
        start = step.row.start
        assert start is not None
        step.after = [
            j
            for j, other in enumerate(steps)
            if j != i
            and other.row.start is not None
            and other.row.start < start
            and other.row.ready is not None
            and other.row.ready <= start
        ]
    return table, steps


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """A floor child's environment: this one without npu-compat's variables, so that nothing activates."""
    env = dict(os.environ if environ is None else environ)
    for name in list(env):
        if name.startswith("NPU_COMPAT"):
            del env[name]
    env["NPU_COMPAT"] = "0"
    return env


def replay(steps: list[Step], timeout: float = 600.0, poll: float = 0.02) -> float:
    """Run the floor: each step's child once every step it comes after is ready.  Returns the
    floor's length (the last child's end); each step gets its child's start, ready, end and failures."""
    env = child_env()
    with tempfile.TemporaryDirectory(prefix="npu-compat-floor-") as scratch:
        specs = []
        for i, step in enumerate(steps):
            spec = os.path.join(scratch, f"{i}.json")
            with open(spec, "w", encoding="utf-8") as f:
                json.dump({"sys_path": step.sys_path, "modules": step.modules, "ready": step.ready}, f)
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
                if steps[i].was_ready is None and os.path.exists(specs[i] + ".ready"):
                    steps[i].was_ready = now
            for i in sorted(pending):
                if all(steps[j].was_ready is not None for j in steps[i].after):
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
                steps[i].ended = time.monotonic() - t0
                if steps[i].was_ready is None:
                    steps[i].was_ready = steps[i].ended
                out = proc.stdout.read() if proc.stdout is not None else ""
                try:
                    steps[i].failed = int(json.loads(out.strip().splitlines()[-1])["failed"])
                except (ValueError, IndexError, KeyError, TypeError):
                    steps[i].notes.append(f"child exited {proc.returncode} without its count")
                del running[i]
            time.sleep(poll)
    return max((step.ended or 0.0 for step in steps), default=0.0)


def floor_path(steps: list[Step]) -> list[int]:
    """The floor's critical path: from the child that ended last, back through the step it waited for
    (of those it came after, the one that ended last), to one that waited for none."""
    done = [i for i, step in enumerate(steps) if step.ended is not None]
    if not done:
        return []
    path = [max(done, key=lambda i: steps[i].ended or 0.0)]
    while steps[path[-1]].after:
        path.append(max(steps[path[-1]].after, key=lambda j: steps[j].was_ready or 0.0))
    return path[::-1]


def _name(row: _timeline.Row) -> str:
    return f"{row.pid} {row.actor or row.role} ({row.program})"


def render(
    table: list[_timeline.Row], steps: list[Step], begin: float, until: float, floor: float
) -> list[str]:
    """The run's start-up against its floor, along the floor's critical path, as lines.

    For each process of the path: in the run, how long it started after the one above it was
    ready (a wait: what the run did besides starting processes) and how long it took from its
    start to ready; in the floor, the same span of its child.  The run's start-up is exactly the
    sum of its waits, its spans and the tail from the last one's ready to ``until``."""
    startup = until - begin
    if floor <= 0:
        return ["floor: nothing to replay"]
    lines = [
        f"start-up {startup:.1f} s (from the first Ray driver's start); floor {floor:.1f} s "
        f"({len(steps)} processes importing what they imported, in the run's order and overlap); "
        f"ratio {startup / floor:.2f}x",
        "along the floor's critical path (each process started once the one above was ready):",
        f"  {'run: waited':>11s} {'start':>7s} {'to ready':>8s} | {'floor: to ready':>15s} {'modules':>7s}"
        "  process",
    ]
    path = floor_path(steps)
    waited = spans = floors = 0.0
    previous: float | None = begin
    for i in path:
        step, row = steps[i], steps[i].row
        start, ready = row.start or 0.0, row.ready or 0.0
        wait = max(0.0, start - previous) if previous is not None else 0.0
        own = (step.was_ready or 0.0) - (step.started or 0.0)
        waited, spans, floors = waited + wait, spans + (ready - start), floors + own
        lines.append(
            f"  {wait:11.1f} {start - begin:7.1f} {ready - start:8.1f} | {own:15.1f} {len(step.modules):7d}  "
            f"{_name(row)}"
        )
        previous = ready
    if path:
        last = steps[path[-1]]
        tail = until - (previous or until)
        floor_tail = (last.ended or 0.0) - (last.was_ready or 0.0)
        lines.append(
            f"  {tail:11.1f} {until - begin:7.1f} {'':8s} | {floor_tail:15.1f} {'':7s}  after the last was "
            "ready: the run to its end of start-up, the floor to its child's end"
        )
        lines.append(
            f"  in all: the run waited {waited + tail:.1f} s and its processes took {spans:.1f} s to be "
            f"ready; the floor's took {floors:.1f} s"
        )
    return lines
