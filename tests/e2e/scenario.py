"""The end-to-end scenario: the real ``trinity run`` on a simulated Ascend Ray cluster.

Test harness, never part of ``npu_compat``.  ``python -m tests.e2e.scenario {compat,stock} OUT``:

* makes the tiny model (``tests/e2e/tiny_model.py``) and a scratch directory under ``OUT``;
* starts one simulated Ascend Ray cluster (``npu_ray_cluster``: ``{"NPU": 2}``, no GPU) -- through
  ``python -m npu_compat`` for ``compat``, plainly with ``NPU_COMPAT=0`` for ``stock``;
* runs ``trinity run --config examples/e2e/trinity_tiny.yaml`` (through the launcher for ``compat``)
  with a bounded timeout, then copies the driver's output, every Ray process's log and the
  per-process npu-compat reports into ``OUT``, and prints a JSON summary: the stages reached
  (:data:`STAGES`, found in the logs), the wall time, the host memory the driver's run added at its
  peak (``host_memory_peak_gib``: the whole machine's, sampled, over what it used once the cluster
  was up), the exit status and the first error.

While the driver runs, the logs are read as they grow (:class:`_LogWatch`): ``stage_s`` in the
summary says when each stage, compute boundary and infeasible Ray request was first seen;
:func:`run`'s ``progress`` is told each phase and each of those as it happens, and ``stuck_after``
stops a run that Ray has declared unschedulable.  The driver's process group is killed on every
way out of :func:`run` (an exception or Ctrl-C included), and the cluster stopped.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from npu_compat.doctor.reports import read_reports
from npu_compat.testing._ray import RayCluster, npu_ray_cluster
from npu_compat.tools import timeline

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "e2e" / "trinity_tiny.yaml"
DATA = REPO / "examples" / "e2e" / "data"

#: (stage, regular expression over all logs) in the order a run reaches them.  The Trainer actor's
#: constructor builds the verl worker group and its models, so in mode `both` the trainer side
#: comes before the Explorer's ``prepare`` (rollout placement group, vLLM engines).
STAGES: list[tuple[str, str]] = [
    ("npus_counted", r"Auto-detected and set gpu_per_node: [1-9]"),
    ("config_validated", r"total_gpu_num=2,\s*rollout_gpu_num=1,"),
    ("explorer_actor", r"Finished initializing Explorer"),
    # 0.6.0 logs the first; 0.5.2 logs nothing there, and Ray names the actor's worker (its .out log)
    ("trainer_actor", r"Initializing verl Trainer|^:actor_name:Trainer$"),
    ("verl_pg_ready", r"Successfully created placement group global_pool"),
    ("verl_workers_started", r"^:actor_name:WorkerDict"),
    # verl 0.8's engine path; Trinity's legacy fsdp_workers (verl 0.7.1) ends init_model with the second
    ("verl_models_built", r"actor and ref model engine initialized|Cached state_dict meta: \d+ parameters"),
    ("trainer_ready", r"Trainer is ready"),
    ("rollout_pg_ready", r"> Bundle \d+: Actor "),
    ("rollout_actor_scheduled", r"^:actor_name:vLLMRolloutModel"),
    ("rollout_models_ready", r"All models are ready"),
    ("weight_sync_setup_started", r"Coordinating weight sync setup"),
    ("weight_sync_group_formed", r"Weight sync group setup complete"),
    ("explore_step_started", r"Explore step 1 started"),
    ("train_step_started", r"Training at step 1 started"),
    ("train_step_finished", r"Training at step 1 finished"),
    ("second_train_step_finished", r"Training at step 2 finished"),
    ("rollout_on_weight_version_2", r"Explorer sync_weights at step 2 finished, model version = 2"),
]

#: Where the simulated Ascend cannot compute (harness, not npu-compat): label -> pattern in the logs.
BOUNDARIES: dict[str, str] = {
    # FSDP2's fully_shard moves the parameters to the "npu" device: no tensor can live there.
    "fsdp2: parameters moved to npu tensors": r"Could not run 'aten::\w+' with arguments from the 'npu' backend",
    # the released vllm-ascend (or torch_npu's user) reached a kernel or graph the simulation does not compute.
    "simulated Ascend: needs a real NPU": r"simulated Ascend: .+? needs a real NPU",
}


#: Ray's verdict on a resource request that no node of the cluster can ever fulfil: on an NPU-only
#: cluster a ``"GPU"`` request stays pending for good (the stock hang).
INFEASIBLE = r"No available node types can fulfill resource request"

#: Log files read for stages (the suffixes :func:`all_logs` reads).
_LOG_SUFFIXES = {".log", ".out", ".err", ".txt"}


class _LogWatch:
    """The logs of a running scenario, read incrementally: which patterns appeared, and when.

    ``roots`` are files or directories (searched recursively); only complete lines are matched,
    each pattern with ``re.MULTILINE`` against the lines new since the last :meth:`poll`.
    """

    def __init__(self, roots: list[Path], patterns: dict[str, str], started: float) -> None:
        self.roots = roots
        self.patterns = {name: re.compile(pattern, re.MULTILINE) for name, pattern in patterns.items()}
        self.started = started
        self.found: dict[str, float] = {}
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self.memory_base = self.memory_peak = host_memory_used()

    def _files(self) -> list[Path]:
        files = []
        for root in self.roots:
            if root.is_file():
                files.append(root)
            elif root.is_dir():
                with contextlib.suppress(OSError):  # a directory that went away while listed
                    files += [p for p in root.rglob("*") if p.suffix in _LOG_SUFFIXES and p.is_file()]
        return files

    def poll(self) -> list[str]:
        """The names of the patterns seen for the first time since the last call, in pattern order.

        Also samples the host's memory in use (:func:`host_memory_used`) into ``memory_peak``."""
        self.memory_peak = max(self.memory_peak, host_memory_used())
        new_text = []
        for path in self._files():
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            self._offsets[path] = offset + len(chunk)
            data = self._partial.pop(path, b"") + chunk
            complete, _, rest = data.rpartition(b"\n")
            if rest:
                self._partial[path] = rest
            if complete:
                new_text.append(complete.decode(errors="replace"))
        text = "\n".join(new_text)
        now = round(time.monotonic() - self.started, 1)
        fresh = [n for n, p in self.patterns.items() if n not in self.found and p.search(text)]
        for name in fresh:
            self.found[name] = now
        return fresh


@dataclass
class Running:
    """What :func:`run`'s ``during`` hook sees of a run in progress, once per poll of its logs.

    ``found`` maps each stage or ``watch_for`` pattern seen so far to its seconds after ``started``
    (``time.monotonic()`` when the drivers started); ``reports`` is the per-process reports' directory.
    Only the driver's output under ``out`` is complete while the run goes (Ray's logs are copied there at
    its end).
    A hook that acts (a fault) records what it did in ``notes``, which the summary carries.
    """

    started: float
    found: dict[str, float]
    drivers: list[subprocess.Popen[bytes]]
    reports: Path
    out: Path  # the run's output directory: ``driver.log`` grows there
    notes: dict[str, object] = field(default_factory=dict)

    def elapsed(self) -> float:
        return round(time.monotonic() - self.started, 1)


class ProcessRecord:
    """Every process a run started, as this harness saw it: a walk of ``/proc`` at each poll, from the
    cluster's ``ray start`` processes and the drivers down, keyed by PID with its start time (so that a
    PID the kernel reuses later is not taken for the same process).

    ``baseline`` is the cluster's own processes before any driver ran (GCS, raylet, dashboard...); what
    appears later is the run's.  Only PIDs from this record are ever checked afterwards, never names.
    """

    def __init__(self) -> None:
        self.seen: dict[int, tuple[int, str]] = {}
        self.baseline: set[int] = set()

    @staticmethod
    def _stat(pid: int) -> tuple[int, int] | None:
        """``(ppid, starttime)`` of a live process, or ``None``."""
        try:
            raw = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            return None
        fields = raw[raw.rfind(b")") + 2 :].split()
        if fields[0] == b"Z":  # a zombie has ended: only its parent has not read its status yet
            return None
        return int(fields[1]), int(fields[19])

    @staticmethod
    def _name(pid: int) -> str:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return "?"
        words = [a.decode(errors="replace") for a in argv if a][:4]
        return " ".join(os.path.basename(w) if i == 0 else w for i, w in enumerate(words))[:120]

    def sample(self, roots: list[int]) -> None:
        children: dict[int, list[int]] = {}
        stats: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                stat = self._stat(int(entry.name))
                if stat is not None:
                    children.setdefault(stat[0], []).append(int(entry.name))
                    stats[int(entry.name)] = stat[1]
        todo = [pid for pid in roots if pid in stats]
        while todo:
            pid = todo.pop()
            if pid not in self.seen or self.seen[pid][0] != stats[pid]:
                self.seen[pid] = (stats[pid], self._name(pid))
            todo += children.get(pid, [])

    def add(self, pids: list[int]) -> None:
        """PIDs known from elsewhere (the per-process reports), if they are alive now."""
        for pid in pids:
            stat = self._stat(pid)
            if stat is not None and pid not in self.seen:
                self.seen[pid] = (stat[1], self._name(pid))

    def alive(self, *, run_only: bool = False) -> dict[int, str]:
        """The recorded processes still alive (the same process: same start time), by PID."""
        out = {}
        for pid, (start, name) in self.seen.items():
            stat = self._stat(pid)
            if stat is not None and stat[1] == start and not (run_only and pid in self.baseline):
                out[pid] = name
        return out


def report_pids(reports: Path) -> dict[int, str]:
    """PID -> what the process was (its Ray actor class, else its role), from the per-process reports."""
    found = read_reports(str(reports)) if reports.is_dir() else []
    return {int(str(r["pid"])): _what(r) for r in found}


def _what(report: dict[str, object]) -> str:
    """What a reported process was: its Ray actor class where it has one, else its role."""
    ray = report.get("ray")
    return str((ray.get("actor_class") if isinstance(ray, dict) else None) or report.get("role"))


def host_memory_used() -> int:
    """Bytes of this machine's memory in use (``MemTotal - MemAvailable``): the whole machine, not one run."""
    fields = dict(
        line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line
    )
    return (int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])) * 1024


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the driver's process group, SIGKILL it if it has not exited 30 s later."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def inherited_env() -> dict[str, str]:
    """This process's environment without npu-compat's settings or a Ray address: a child decides those."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("NPU_COMPAT", "RAY_ADDRESS"))}


def _env(mode: str, workdir: Path, model: Path) -> dict[str, str]:
    env = inherited_env()
    env["PYTHONPATH"] = str(REPO)  # the cluster's simulation_env puts the simulated host's sites first
    env.update(E2E_WORKDIR=str(workdir), E2E_MODEL=str(model), E2E_DATA=str(DATA))
    env["PYTHONUNBUFFERED"] = "1"
    # every process's lines as it wrote them: Ray's driver folds lines alike from several processes into
    # one ("[repeated 3x across cluster]"), and each rank of each engine logs its own digests
    env["RAY_DEDUP_LOGS"] = "0"
    env["TRINITY_LOG_DIR"] = str(workdir / "trinity-logs")
    if mode == "compat":
        env["NPU_COMPAT_REPORT_DIR"] = str(workdir / "reports")
    else:
        env["NPU_COMPAT"] = "0"
    return env


def _collect(cluster: RayCluster, out: Path) -> None:
    """Each node's Ray logs into ``out/ray-logs`` (the head's), ``out/ray-logs/node<i>`` (the others')."""
    for index, logs in enumerate(cluster.log_dirs()):
        if logs.is_dir():
            target = out / "ray-logs" / (f"node{index}" if index else "")
            shutil.copytree(logs, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sock"))


def _config(workdir: Path, cluster: str, sync_method: str = "nccl", trinity_mode: str = "both") -> Path:
    """The bundled config; with ``cluster="explicit"`` a copy that states ``node_num``/``gpu_per_node``.

    Stating them is what a user can do in the YAML to get past Trinity's own count of the cluster's
    ``"GPU"`` resources (``RayClusterConfigValidator._set_cluster_info``), which finds 0 on Ascend.
    ``cluster="explore"`` also switches to mode ``explore`` (the rollout side alone: in mode ``both``
    the Trainer actor's constructor builds the FSDP models before the Explorer prepares anything).
    ``sync_method`` other than ``nccl`` replaces the config's ``synchronizer.sync_method``;
    ``trinity_mode`` ``explore`` or ``train`` makes the config of one of the two commands of a split run
    (:data:`SPLIT`): that mode, and the experience buffer in SQLite under the checkpoint directory the
    two share (a ``queue`` is an actor of the command that made it, gone when that command ends).
    """
    if cluster == "auto" and sync_method == "nccl" and trinity_mode == "both":
        return CONFIG
    text = CONFIG.read_text()

    def stating(gpus: int) -> str:
        return text.replace(
            "  ray_address: auto", f"  ray_address: auto\n  node_num: 1\n  gpu_per_node: {gpus}", 1
        )

    if cluster not in {"auto", "split"}:
        text = stating(2)
    if cluster == "explore":
        trinity_mode = "explore"
    text = text.replace("\nmode: both\n", f"\nmode: {trinity_mode}\n", 1)
    text = text.replace("  sync_method: nccl\n", f"  sync_method: {sync_method}\n", 1)
    if cluster == "split":
        text = text.replace("      storage_type: queue\n", "      storage_type: sql\n", 1)
        # mode train wants it stated (mode both derives it: batch_size x repeat_times)
        text = text.replace("  batch_size: 2\n", "  batch_size: 2\n  train_batch_size: 4\n", 1)
        if trinity_mode == "train":  # Trinity gives a trainer alone every accelerator it counts: 1 of 2
            text = stating(1)
    path = workdir / f"trinity_tiny.{cluster}.{trinity_mode}.{sync_method}.yaml"
    path.write_text(text)
    return path


def replaced(text: str, pairs: list[tuple[str, str]]) -> str:
    """``text`` (a config) with each ``(old, new)`` replaced once; an ``old`` it lacks is an error."""
    for old, new in pairs:
        if old not in text:
            raise ValueError(f"the bundled config has no {old!r}")
        text = text.replace(old, new, 1)
    return text


def _edited(config: Path, edit: Callable[[str], str], workdir: Path, name: str) -> Path:
    """A copy of ``config`` changed by ``edit`` (which must change it), written as ``<stem>.<name>.yaml``."""
    text = config.read_text()
    changed = edit(text)
    if changed == text:
        raise ValueError(f"the config edit {name!r} changed nothing in {config.name}")
    path = workdir / f"{config.stem}.{name}.yaml"
    path.write_text(changed)
    return path


#: ``cluster="split"``: the run as two commands on one cluster, sharing its checkpoint directory --
#: Trinity's mode ``explore`` and mode ``train``, whose only weight sync is ``checkpoint``.
SPLIT = ("explore", "train")


#: Seconds between two reads of the growing logs while the driver runs.
POLL_S = 2.0


def eval_tasksets(name: str, *, temperature: float, workflow: str = "math_workflow") -> str:
    """An ``eval_tasksets`` block for the bundled config, to go before its ``trainer_input``: the bundled data
    (``E2E_DATA``) evaluated through ``workflow`` at ``temperature`` (0: greedy) with Trinity's math reward."""
    return f"""\
    eval_tasksets:
    - name: {name}
      storage_type: file
      path: ${{oc.env:E2E_DATA}}
      split: train
      format:
        prompt_key: question
        response_key: answer
      rollout_args:
        temperature: {temperature}
      default_workflow_type: {workflow}
      default_reward_fn_type: math_reward
"""


def make_model(directory: Path, initializer_range: float = 0.02) -> Path:
    """The tiny model of ``tests/e2e/tiny_model.py`` written to ``directory``, in a process of its own with
    npu-compat off (a run only reads it: runs can share one).  ``initializer_range``: its weights' spread (0.5
    for varied greedy answers)."""
    subprocess.run(
        [sys.executable, "-m", "tests.e2e.tiny_model", str(directory), str(initializer_range)],
        env={**inherited_env(), "NPU_COMPAT": "0"}, cwd=REPO, check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    return directory


def run(
    mode: str,
    out: Path,
    timeout: float = 600,
    cluster: str = "auto",
    *,
    sync_method: str = "nccl",
    progress: Callable[[str], None] | None = None,
    stuck_after: float | None = None,
    settle_after: tuple[str, float] | None = None,
    model: Path | None = None,
    npus: int = 2,
    cpus: int | None = None,
    nodes: int = 1,
    edit: Callable[[str], str] | None = None,
    name: str = "",
    env: dict[str, str] | None = None,
    watch_for: dict[str, str] | None = None,
    during: Callable[[Running], None] | None = None,
    linger_s: float = 0.0,
    config: Path | None = None,
) -> dict[str, object]:
    """Run the scenario once; return its summary (see the module docstring).

    ``progress`` is called with one line per phase (tiny model, cluster, driver, each stage /
    boundary / infeasible request as it first appears in the logs, collecting).  ``stuck_after``:
    stop the driver that many seconds after Ray declared a request infeasible (:data:`INFEASIBLE`),
    with ``rc`` ``"stuck"``; ``None`` waits for the driver or the ``timeout`` (``rc`` ``"timeout"``).
    ``settle_after=(stage, seconds)``: the same, that many seconds after ``stage`` first appeared with no
    stage after it (a run known to hang there is not kept waiting for the whole bound).
    ``model``: the tiny model directory an earlier run made (:func:`make_model`); ``None`` makes one in ``out``.
    ``npus``: each node's ``{"NPU": npus}``; ``cpus`` its CPUs (default ``max(4, 2 * npus)``: verl's
    trainer bundles take 3 CPUs each, the rollout's 1); ``nodes``: how many nodes (raylets) the cluster has.
    ``edit``: a change of the bundled config's text for another shape of run (``name`` names that config's
    file), applied after ``cluster``'s and ``sync_method``'s.
    ``env``: variables added to every process's environment (the cluster's and the drivers').
    ``config``: another shipped config than the bundled one (``examples/e2e/trinity_tiny_*.yaml``), run as
    it is (``cluster`` and ``sync_method`` then change nothing; ``edit`` still applies).

    For faults (``tests/faults``): ``watch_for`` adds patterns to the stages; ``during`` is called once per
    poll with the :class:`Running` run, and may act on it.  The summary's ``ended_s`` is when the drivers
    had all ended (seconds after their start, to one poll), ``notes`` what ``during`` recorded, and
    ``processes``: with ``linger_s`` > 0, the run's processes (:class:`ProcessRecord`, less the cluster's
    own) still alive that long after the drivers ended, with the cluster still up -- as a user's cluster
    stays -- and, after the cluster was stopped, every recorded process still alive.
    """
    say = progress or (lambda line: None)
    out.mkdir(parents=True, exist_ok=True)
    workdir = out / "work"
    workdir.mkdir(exist_ok=True)
    if model is None:
        say("making the tiny model (tests/e2e/tiny_model.py)")
        model = make_model(out / "tiny-model")
    extra_env = env or {}
    env = _env(mode, workdir, model) | extra_env
    prefix = [sys.executable, "-m", "npu_compat"] if mode == "compat" else None
    trinity = str(Path(sys.executable).with_name("trinity"))
    if cluster == "split":
        sync_method = "checkpoint"
        configs = {m: _config(workdir, cluster, sync_method, m) for m in SPLIT}
    elif config is not None:
        stated = re.search(r"^mode: (\w+)$", config.read_text(), re.MULTILINE)
        configs = {stated.group(1) if stated else "both": config}
    else:
        configs = {"both": _config(workdir, cluster, sync_method)}
    if edit is not None:
        configs = {m: _edited(c, edit, workdir, name or "edited") for m, c in configs.items()}
    summary: dict[str, object] = {"mode": mode, "cluster": cluster, "sync_method": sync_method}
    what = "`python -m npu_compat trinity run`" if prefix else "stock `trinity run`"
    names = " and ".join(f"--config {c.name}" for c in configs.values())
    modes = " + ".join("explore" if cluster == "explore" else m for m in configs)
    what += f" {names} (mode {modes}, bound {timeout:.0f} s)"
    how = "through python -m npu_compat" if prefix else "plainly, NPU_COMPAT=0"
    shape = f"{{'NPU': {npus}}}" + (f" on each of {nodes} nodes" if nodes > 1 else "")
    say(f"starting the simulated NPU-only Ray cluster ({shape}, no GPU; {how})")
    with npu_ray_cluster(
        nodes,
        npus_per_node=npus,
        cpus_per_node=cpus or max(4, 2 * npus),
        env=env,
        command_prefix=prefix,
        start_timeout=180,
    ) as ray_cluster:
        driver_env = {**ray_cluster.env, "RAY_ADDRESS": ray_cluster.address}
        say(f"running {what}")
        started = time.monotonic()
        summary["started_at"] = time.time()  # the epoch of stage_s's zero (the drivers' start)
        patterns = {name: pattern for name, pattern in STAGES}
        patterns |= {f"boundary: {label}": pattern for label, pattern in BOUNDARIES.items()}
        patterns["infeasible"] = INFEASIBLE
        patterns |= watch_for or {}
        record = ProcessRecord()
        cluster_pids = [proc.pid for proc in ray_cluster.processes]
        record.sample(cluster_pids)
        record.baseline = set(record.seen)
        logs = ray_cluster.log_dirs()[0]  # the head's
        # one driver: driver.log; two: driver.<mode>.log each, joined into driver.log once both ended
        outputs = {m: out / ("driver.log" if len(configs) == 1 else f"driver.{m}.log") for m in configs}
        watch = _LogWatch(
            [*outputs.values(), *ray_cluster.log_dirs(), workdir / "trinity-logs"], patterns, started
        )
        with contextlib.ExitStack() as stack:
            procs = []
            for m, config in configs.items():
                log = stack.enter_context(outputs[m].open("wb"))
                argv = [*(prefix or []), trinity, "run", "--config", str(config)]
                procs.append(
                    subprocess.Popen(
                        argv,
                        env=driver_env,
                        cwd=workdir,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            running = Running(started, watch.found, procs, workdir / "reports", out)
            roots = [*cluster_pids, *(proc.pid for proc in procs)]

            def hook() -> None:
                record.sample(roots)
                if during is not None:
                    during(running)

            try:
                summary["rc"] = _wait(procs, started + timeout, watch, say, stuck_after, settle_after, hook)
            finally:
                for proc in procs:
                    if proc.poll() is None:  # an exception or an interrupt: the drivers go too
                        _stop_group(proc)
            summary["ended_s"] = running.elapsed()
            summary["notes"] = running.notes
            record.add(list(report_pids(workdir / "reports")))
            if linger_s > 0:
                summary["processes"] = _linger(record, roots, linger_s, workdir / "reports", logs)
        if len(configs) > 1:
            (out / "driver.log").write_bytes(b"".join(path.read_bytes() for path in outputs.values()))
        summary["wall_s"] = round(time.monotonic() - started, 1)
        watch.poll()
        # sampled every POLL_S while the driver ran: what the run added to the machine's memory at its peak
        summary["host_memory_peak_gib"] = round((watch.memory_peak - watch.memory_base) / (1 << 30), 2)
        summary["stage_s"] = dict(watch.found)
        say("collecting the logs and the per-process reports; stopping the Ray cluster")
        _collect(ray_cluster, out)
        shutil.copy(ray_cluster.log, out / "ray-start.log")
    if linger_s > 0:
        processes = summary["processes"]
        assert isinstance(processes, dict)
        processes["left_after_cluster_stop"] = {str(pid): name for pid, name in record.alive().items()}
        processes["recorded"] = len(record.seen)
    summary["stages"] = stages_reached(out)
    summary["first_error"] = first_error(out)
    text = all_logs(out)
    summary["boundaries"] = [label for label, pattern in BOUNDARIES.items() if re.search(pattern, text)]
    summary["applied"] = applied_by_process(workdir / "reports")
    reports = workdir / "reports"
    summary["timeline"] = [
        asdict(row)
        for row in (timeline.rows(read_reports(str(reports)), str(reports)) if reports.is_dir() else [])
    ]
    return summary


def _wait(
    procs: list[subprocess.Popen[bytes]],
    deadline: float,
    watch: _LogWatch,
    say: Callable[[str], None],
    stuck_after: float | None,
    settle_after: tuple[str, float] | None = None,
    hook: Callable[[], None] | None = None,
) -> int | str:
    """The drivers' exit status, ``"timeout"`` at the deadline or ``"stuck"`` (see :func:`run`).

    With several drivers: 0 once all exited 0; the first that fails stops the others (a driver waiting
    on one that is gone would wait for the whole bound) and its status is the run's."""
    order = [name for name, _ in STAGES]

    def stop(verdict: int | str) -> int | str:
        for proc in procs:
            if proc.poll() is None:
                _stop_group(proc)
        return verdict

    while True:
        codes = [proc.poll() for proc in procs]
        failed = next((code for code in codes if code), None)
        if failed is not None:
            return stop(failed)
        if all(code == 0 for code in codes):
            return 0
        time.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))
        for name in watch.poll():
            say(f"  +{watch.found[name]:.0f} s in the run: {_describe(name)}")
        if hook is not None:
            hook()
        if time.monotonic() >= deadline:
            return stop("timeout")
        seen = watch.found.get("infeasible")
        if stuck_after is not None and seen is not None:
            if time.monotonic() - watch.started >= seen + stuck_after:
                say(f"stopping the driver: its request was still infeasible {stuck_after:.0f} s later")
                return stop("stuck")
        if settle_after is not None and settle_after[0] in watch.found:
            stage, seconds = settle_after
            later = [n for n in watch.found if n in order and order.index(n) > order.index(stage)]
            if not later and time.monotonic() - watch.started >= watch.found[stage] + seconds:
                say(f"stopping the driver: no stage after {stage} {seconds:.0f} s later")
                return stop("stuck")


def pool_workers(logs: Path) -> set[int]:
    """PIDs of the cluster's idle Ray workers: started by the raylet for no job (job id ``ffffffff`` in the
    names of their log files, Ray's own record), to be leased later. They are the cluster's, as its
    raylet is, not a run's."""
    found = set()
    for path in logs.glob("worker-*-ffffffff-*.out") if logs.is_dir() else []:
        with contextlib.suppress(ValueError):
            found.add(int(path.stem.rsplit("-", 1)[1]))
    return found


def _linger(
    record: ProcessRecord, roots: list[int], seconds: float, reports: Path, logs: Path
) -> dict[str, object]:
    """Watch the run's processes for ``seconds`` after its drivers ended, the cluster still up: when the
    last of them ended, or which were still alive at the end (PID -> name, and what its report says).
    The cluster's idle pool workers (:func:`pool_workers`) are listed apart, not as the run's."""
    ended = time.monotonic()

    def left_by_run() -> dict[int, str]:
        pool = pool_workers(logs)
        return {pid: name for pid, name in record.alive(run_only=True).items() if pid not in pool}

    left = left_by_run()
    while left and time.monotonic() - ended < seconds:
        time.sleep(1.0)
        record.sample(roots)  # a process started after the last poll (a shutdown's own) counts too
        left = left_by_run()
    known = report_pids(reports)
    idle = pool_workers(logs)
    pool = {pid: name for pid, name in record.alive(run_only=True).items() if pid in idle}
    return {
        "all_gone_after_s": None if left else round(time.monotonic() - ended, 1),
        "left_after_driver": {
            str(pid): f"{name} [{known.get(pid, 'no report')}]" for pid, name in left.items()
        },
        "cluster_pool_workers": {str(pid): name for pid, name in pool.items()},
        "lingered_s": seconds,
    }


def _describe(name: str) -> str:
    if name == "infeasible":
        return "Ray: a resource request no node of this cluster can fulfil (pending for good)"
    if name.startswith("boundary: "):
        return f"compute boundary of the simulation -- {name[len('boundary: ') :]}"
    return f"logs show stage {name}"


def applied_by_process(reports: Path) -> dict[str, list[str]]:
    """Which patches each process reported ``applied``, keyed by what the process was.

    The key is the Ray actor class (``Explorer``, ``vLLMRolloutModel``, ``WorkerDict``...) where
    there is one, else the role (``ray-driver``, ``vllm (VllmWorker-0)``...); processes of one
    kind are merged.  Only processes that applied something beyond the Ray/torch patches that
    apply wherever those packages are imported are listed.
    """
    out: dict[str, set[str]] = {}
    for path in sorted(reports.glob("*.json")) if reports.is_dir() else []:
        report = json.loads(path.read_text())
        key = _what(report)
        applied = {p["id"] for p in report.get("patches", []) if p.get("status") == "applied"}
        if applied - {i for i in applied if i.startswith(("ray.", "torch."))}:
            out.setdefault(key, set()).update(applied)
    return {key: sorted(ids) for key, ids in sorted(out.items())}


def all_logs(out: Path) -> str:
    parts = []
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.suffix in {".log", ".out", ".err", ".txt"}:
            parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)


def stages_reached(out: Path) -> list[str]:
    text = all_logs(out)
    return [name for name, pattern in STAGES if re.search(pattern, text, re.MULTILINE)]


_PREFIX = re.compile(
    r"^(?:\x1b\[[0-9;]*m)?(?:\(\w+ pid=\d+\)(?:\x1b\[0m)? )?(?:\w+ [\d-]+ [\d:]+ \[[\w.]+:\d+\] )?"
)
_ERROR = re.compile(r"^([\w.]*(?:Error|Exception|Boundary)): (.+)$")


_SYNC = re.compile(r"simulated weight sync \((trainer sent|rollout loaded)\): (\d+) tensors, sha256 (\w+)")
_TRAINER_STEP = re.compile(r"\(Trainer pid=\d+\).*\[monitor\.py:\d+\] Step (\d+): (\{.*\})")


def _digests(out: Path, side: str) -> list[str]:
    """The digests one side (``trainer sent`` / ``rollout loaded``) logged, in order."""
    return [f"{n} tensors, sha256 {d}" for s, n, d in _SYNC.findall(_driver_log(out)) if s == side]


def weight_syncs(out: Path) -> list[dict[str, str]]:
    """Each weight sync of a run, in order: the digest the trainer sent and the one the rollout's model
    holds after loading it (``npu_compat.testing._digest``), as the two processes logged them."""
    sent, loaded = _digests(out, "trainer sent"), _digests(out, "rollout loaded")
    return [{"sent": s, "loaded": lo} for s, lo in itertools.zip_longest(sent, loaded, fillvalue="")]


_TP_SYNC = re.compile(
    r"simulated weight sync \(rollout tp rank (\d+)/(\d+) (received|expected|holds)\): (\d+) tensors, sha256 (\w+)"
)


def converted_loads(out: Path) -> list[dict[str, str]]:
    """Each rollout rank's digests of each weight update where it holds shards or another dtype than was
    sent, in the order logged: what it ``received`` (the full tensors), what it should hold (``expected``:
    its slice of them, in its dtype) and what it ``holds`` once loaded; with the process
    (``pid:rank/size``) and which of that process's updates it was (``update``, from 0)."""
    loads: dict[tuple[str, int], dict[str, str]] = {}
    order: list[tuple[str, int]] = []
    seen: dict[tuple[str, str], int] = {}
    for line in _driver_log(out).splitlines():
        match = _TP_SYNC.search(line)
        if not match:
            continue
        rank, size, side, n, digest = match.groups()
        pid = re.search(r"pid=(\d+)", line)
        who = f"{pid.group(1) if pid else '?'}:{rank}/{size}"
        count = seen.get((who, side), 0)
        seen[(who, side)] = count + 1
        key = (who, count)
        if key not in loads:
            loads[key] = {"rank": rank, "size": size, "process": who, "update": str(count)}
            order.append(key)
        loads[key][side] = f"{n} tensors, sha256 {digest}"
    return [loads[key] for key in order]


_SERVED = re.compile(
    r"vLLMRolloutModel pid=(\d+)\).*served (\d+) requests \(tensor parallel rank (\d+) of (\d+)\)"
)


def served_per_rank(out: Path) -> dict[tuple[str, str], int]:
    """How many requests each rank of each rollout engine took, by ``(engine's pid, rank)``: the largest
    count its runner logged (``npu_compat.testing._requests_served`` logs at each power of two)."""
    most: dict[tuple[str, str], int] = {}
    for engine, count, rank, _size in _SERVED.findall(all_logs(out)):
        most[engine, rank] = max(most.get((engine, rank), 0), int(count))
    return most


def trainer_sent(out: Path) -> list[str]:
    """The digest of what the trainer sent at each weight sync, in order."""
    return _digests(out, "trainer sent")


def rollout_loads(out: Path) -> list[str]:
    """The digest of what the rollout's model held after each weight update (every sync method)."""
    return _digests(out, "rollout loaded")


#: Digests the checkpoint directory argv[1]: read with Trinity's own loader (``loader``), or the trainer's
#: one FSDP shard as it was saved (``shard``); run on a simulated Ascend host.
_DIGEST_CHECKPOINT = """
import sys, torch
from npu_compat.testing._digest import digest_of
path, how = sys.argv[1], sys.argv[2]
if how == "loader":
    from trinity.common.models.utils import load_state_dict_iterator
    pairs = load_state_dict_iterator(path)
else:
    state = torch.load(path + "/model_world_size_1_rank_0.pt", weights_only=False)
    pairs = ((name, t.to_local() if hasattr(t, "to_local") else t) for name, t in state.items())
print(digest_of(pairs))
"""


def trainer_checkpoint(out: Path, how: str = "loader") -> tuple[int, str] | None:
    """The trainer's last saved checkpoint (``global_step_N/actor`` under the run's checkpoint
    directory), as ``(N, digest)``, digested as the rollout side digests what it loaded (``_digest``).

    ``how="loader"``: the weights read back with Trinity's own loader, what its checkpoint weight
    transfer reads (it merges FSDP shards into bfloat16).  ``how="shard"``: the trainer's single FSDP
    shard as verl saved it (one trainer rank), in the dtype it trains in.  Read in a process of its own
    on a simulated Ascend host: the shards hold ``npu`` tensors, which ``torch.load`` puts on an ``npu``
    device (this process has none)."""
    from npu_compat.testing import simulation_env

    steps = sorted(
        out.glob("work/checkpoints/*/*/global_step_*/actor"), key=lambda p: int(p.parent.name[12:])
    )
    if not steps:
        return None
    done = subprocess.run(
        [sys.executable, "-c", _DIGEST_CHECKPOINT, str(steps[-1]), how],
        env=simulation_env(1), capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return int(steps[-1].parent.name[12:]), done.stdout.strip().splitlines()[-1]


def trainer_metrics(out: Path) -> dict[int, dict[str, Any]]:
    """The Trainer's metrics of each step, as its monitor logged them (``Step N: {...}``), all keys."""
    import ast

    return {int(step): ast.literal_eval(metrics) for step, metrics in _TRAINER_STEP.findall(_driver_log(out))}


def train_steps(out: Path) -> list[dict[str, float]]:
    """The Trainer's metrics of each step (its monitor's ``Step N: {...}`` line): reward and actor loss."""
    return [
        {
            "step": step,
            "reward_mean": values.get("critic/rewards/mean"),
            "pg_loss": values.get("actor/pg_loss"),
            "grad_norm": values.get("actor/grad_norm"),
        }
        for step, values in trainer_metrics(out).items()
    ]


def _driver_log(out: Path) -> str:
    """The driver's output: every process's lines once (Ray forwards them, prefixed with the actor)."""
    path = out / "driver.log"
    return path.read_text(errors="replace") if path.exists() else ""


def first_error(out: Path) -> str | None:
    """The first ``SomeError: message`` line the driver printed (Ray prefixes stripped).

    Ray's own wrappers (``ray.exceptions.*``) only when no underlying error was printed.
    """
    log = out / "driver.log"
    if not log.is_file():
        return None
    found = []
    for line in log.read_text(errors="replace").splitlines():
        stripped = None
        while stripped != line:  # "(Actor pid=1) (Worker pid=2) ERROR ... [file.py:1] " nest
            stripped, line = line, _PREFIX.sub("", line, count=1).strip()
        match = _ERROR.match(line)
        if match:
            found.append(f"{match.group(1)}: {match.group(2)[:300]}")
    own = [e for e in found if not e.startswith("ray.exceptions.")]
    return (own or found or [None])[0]


if __name__ == "__main__":
    args = sys.argv[1:]
    result = run(
        args[0],
        Path(args[1]),
        float(args[2]) if len(args) > 2 else 600,
        *args[3:4],
        sync_method=(args[4:5] or ["nccl"])[0],
    )
    print(json.dumps(result))
