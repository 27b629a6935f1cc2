"""Faults injected into a whole simulated ``trinity run`` at a named point, and what the run did then.

Test harness, never part of ``npu_compat``.  A :class:`Fault` is one run of ``tests/e2e/scenario.py``
(``python -m npu_compat trinity run`` on a simulated NPU-only Ray cluster) with a ``during`` hook that
waits for a point of the run -- a stage of :data:`tests.e2e.scenario.STAGES` or a line of the logs --
and then acts on processes found in the run's own per-process reports (by PID, never by name): a
signal to the rollout's vLLM processes, to one trainer rank, or to the driver as Ctrl-C does.  A fault
of the device's memory is a setting of the run instead (``NPU_COMPAT_SIMULATE_NPU_MEMORY``).

:func:`measure` runs one and returns a row: when the fault was injected, how long the run took to
end after it, the bound the user configured that it had to end within, the first error the driver
printed, and the run's processes still alive once the drivers ended (the cluster still up, as a
user's stays) and after the cluster was stopped.  The bounds are the config's own keys, set small in
:data:`BOUNDED` so that a run that keeps them ends in minutes: ``explorer.max_timeout`` and
``synchronizer.sync_timeout`` 60 s, and HCCL's ``HCCL_EXEC_TIMEOUT`` 60 s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e import scenario

#: The bounds a user sets, small: every fault row must end within one of them plus :data:`MARGIN_S`.
BOUND_S = 60
BOUNDED: list[tuple[str, str]] = [
    ("  max_timeout: 300\n", f"  max_timeout: {BOUND_S}\n"),
    ("  sync_timeout: 300\n", f"  sync_timeout: {BOUND_S}\n"),
]
#: Trinity's own waits once its rollout is dead, each bounded by the config: the explore steps left (2 in the
#: bundled run) end at ``max_timeout`` each; the launcher then waits ``sync_timeout`` for the trainer
#: (trinity/cli/launcher.py:287), up to 30 s for the weight-sync teardown (:308), and ``sync_timeout`` for the
#: shutdown (:312-316).
TRINITY_WAITS_AFTER_A_DEAD_ROLLOUT_S = 2 * BOUND_S + BOUND_S + 30 + BOUND_S
#: HCCL's own bound on a collective's execution, the same as the config's.
ENV = {"HCCL_EXEC_TIMEOUT": str(BOUND_S)}
#: What a run may take beyond its bound to end: Ray's teardown of the actors, Trinity's ``finally``
#: (monitor, buffers), and this harness's poll of the logs (2 s).
MARGIN_S = 60
#: How long the run's processes are watched after its drivers ended, the cluster still up.
LINGER_S = 60
#: A driver still running this long past a fault's bound and margin is hung: the harness kills it.
HUNG_AFTER_S = 60


def vllm_processes(known: dict[int, str]) -> list[int]:
    """The rollout's vLLM engine core and workers: the rollout actor's children that compute (not vLLM's
    short-lived helpers, such as its model-registry probe)."""
    return sorted(
        pid for pid, what in known.items() if what.startswith(("vllm (EngineCore", "vllm (VllmWorker"))
    )


def one_trainer_rank(known: dict[int, str]) -> list[int]:
    """One trainer rank of several: the ``WorkerDict`` actor with the highest PID, the last started (verl
    starts rank 0 first)."""
    ranks = sorted(pid for pid, what in known.items() if what == "WorkerDict")
    return ranks[-1:] if len(ranks) > 1 else []


@dataclass
class Fault:
    """One fault: where in the run (``at``: a stage or a ``watch`` name), what (``act``), and its bound."""

    name: str
    at: str
    act: Callable[[scenario.Running], str | None]
    bound: str
    #: the bound in seconds: the run's driver must have ended this long after the fault, plus MARGIN_S
    bound_s: float = BOUND_S
    #: the driver's exit status a user gets: "error" (any but 0), or the very status expected
    exits: str | int = "error"
    #: where Trinity itself never ends after this fault, on any device: the upstream file:line (the harness
    #: then stops the driver HUNG_AFTER_S past the bound, and the test asserts that it had to)
    hangs: str | None = None
    #: a ``watch`` name: the first error the user sees, which must show within BOUND_S + MARGIN_S of the
    #: fault even where the driver's end has a longer bound (Trinity's own waits after the error)
    error_at: str | None = None
    npus: int = 2
    cpus: int | None = None
    edit: list[tuple[str, str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    watch: dict[str, str] = field(default_factory=dict)
    cluster: str = "auto"


def signal_processes(
    select: Callable[[dict[int, str]], list[int]], sig: signal.Signals
) -> Callable[..., str | None]:
    """An action: ``sig`` to the processes ``select`` picks from the run's reports (None: not there yet)."""

    def act(run: scenario.Running) -> str | None:
        known = scenario.report_pids(run.reports)
        pids = select(known)
        if not pids:
            return None
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return f"{sig.name} to " + ", ".join(f"{pid} ({known[pid]})" for pid in pids)

    return act


def signal_driver(sig: signal.Signals) -> Callable[[scenario.Running], str | None]:
    """An action: ``sig`` to the driver's process group, as a terminal's Ctrl-C (SIGINT) does."""

    def act(run: scenario.Running) -> str | None:
        os.killpg(run.drivers[0].pid, sig)
        return f"{sig.name} to the driver's process group ({run.drivers[0].pid}: python -m npu_compat trinity run)"

    return act


def measure(fault: Fault, out: Path, model: Path, timeout: float = 1500) -> dict[str, object]:
    """Run ``fault`` once; its row (see the module docstring) and the whole run's summary under ``run``."""

    def during(run: scenario.Running) -> None:
        injected = run.notes.get("injected_s")
        if injected is not None:
            if "hung_s" not in run.notes and run.elapsed() > float(str(injected)) + patience:
                run.notes["hung_s"] = run.elapsed()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.drivers[0].pid, signal.SIGKILL)
            return
        if fault.at not in run.found:
            return
        did = fault.act(run)
        if did is not None:
            run.notes.update(injected_s=run.elapsed(), did=did)

    patience = fault.bound_s + MARGIN_S + HUNG_AFTER_S
    # Ctrl-C reaches a driver whose SIGINT is at its default, as in a terminal.  A shell that starts this
    # pytest as a background job ignores SIGINT in it, every child inherits that, and Python then installs
    # no KeyboardInterrupt handler: the driver would run on.  A handler of this process's own is reset to
    # the default in its children.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

    result = scenario.run(
        "compat",
        out,
        timeout=timeout,
        cluster=fault.cluster,
        model=model,
        npus=fault.npus,
        cpus=fault.cpus,
        edit=lambda text: scenario.replaced(text, BOUNDED + fault.edit),
        name=fault.name,
        env=ENV | fault.env,
        watch_for=fault.watch,
        during=during,
        linger_s=LINGER_S,
        progress=print,
    )
    notes = result["notes"]
    assert isinstance(notes, dict)
    injected = notes.get("injected_s")
    ended = result["ended_s"]
    assert isinstance(ended, float)
    processes = result["processes"]
    assert isinstance(processes, dict)
    stages = result["stage_s"]
    assert isinstance(stages, dict)
    return {
        "fault": fault.name,
        "injected_s": injected,
        "did": notes.get("did"),
        "error_after_s": None
        if injected is None or fault.error_at not in stages
        else round(float(stages[fault.error_at]) - float(injected), 1),
        "surfaced_after_s": None
        if injected is None or "hung_s" in notes
        else round(ended - float(injected), 1),
        "hung": None
        if "hung_s" not in notes
        else f"stopped by the harness {float(str(notes['hung_s'])) - float(str(injected)):.0f} s after the fault",
        "bound": fault.bound,
        "rc": result["rc"],
        "first_error": result["first_error"],
        "left_after_driver": processes["left_after_driver"],
        "cluster_pool_workers": processes["cluster_pool_workers"],
        "all_gone_after_s": processes["all_gone_after_s"],
        "left_after_cluster_stop": processes["left_after_cluster_stop"],
        "run": result,
    }


class _Follower:
    """An action run by a thread that follows the driver's output (every actor's log reaches it) every
    50 ms, from the moment the fault's point is reached.  Trinity's steps and syncs last about a second
    here, and the harness reads the logs every 2 s: a fault meant for the inside of one is pinned to
    the lines that open it instead.  :meth:`step` sees the output so far and returns what it did once it
    injected the fault (the thread then records it), else None."""

    def __call__(self, run: scenario.Running) -> str | None:
        if "follower" not in run.notes:
            run.notes["follower"] = "started"
            threading.Thread(target=self._follow, args=(run,), daemon=True).start()
        return None  # the thread records the injection itself

    def step(self, run: scenario.Running, text: bytes) -> str | None:
        raise NotImplementedError

    def _follow(self, run: scenario.Running) -> None:
        log = run.out / "driver.log"
        while all(proc.poll() is None for proc in run.drivers):
            did = self.step(run, log.read_bytes() if log.is_file() else b"")
            if did is not None:
                run.notes.update(did=did, injected_s=run.elapsed())
                return
            time.sleep(0.05)


class AtLine(_Follower):
    """``act`` once ``line`` appears in the driver's output."""

    def __init__(self, line: str, act: Callable[[scenario.Running], str | None]) -> None:
        self.line, self.act = line, act

    def step(self, run: scenario.Running, text: bytes) -> str | None:
        if self.line.encode() not in text:
            return None
        did = self.act(run)
        return None if did is None else f"at {self.line!r}: {did}"


class StopThenKill(_Follower):
    """Stop processes at one line of the driver's output and kill them at a later one.

    At ``stop_at`` it stops the processes ``select`` picks (SIGSTOP), so that they can take part in
    nothing after it; once ``kill_at`` has appeared ``count`` times, it kills them (SIGKILL).  The kill
    is the injection: whatever the others began after ``stop_at`` is waiting for the dead processes.
    """

    def __init__(
        self, select: Callable[[dict[int, str]], list[int]], stop_at: str, kill_at: str, count: int = 1
    ) -> None:
        self.select, self.stop_at, self.kill_at, self.count = select, stop_at, kill_at, count

    def step(self, run: scenario.Running, text: bytes) -> str | None:
        stopped = run.notes.get("stopped") or []
        assert isinstance(stopped, list)
        if not stopped and self.stop_at.encode() in text:
            stopped = self.select(scenario.report_pids(run.reports))
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            run.notes.update(stopped=stopped, stopped_s=run.elapsed())
        if not stopped or text.count(self.kill_at.encode()) < self.count:
            return None
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        known = scenario.report_pids(run.reports)
        return (
            f"SIGSTOP at {self.stop_at!r}, SIGKILL at {self.kill_at!r} (seen {self.count}x), to "
            + ", ".join(f"{pid} ({known.get(pid, '?')})" for pid in stopped)
        )


def memory_ran_out(run: scenario.Running) -> str | None:
    """No action: the device's memory is the run's setting; the fault's point is where it first ran out."""
    return "the simulated NPU's memory ran out (NPU_COMPAT_SIMULATE_NPU_MEMORY)"


#: Lines of the driver's output (every actor's log reaches it) that pin a fault inside a step or a sync.
EXPLORER_SYNC_1 = "Explorer sync_weights at step 1 started"
BROADCAST = "Starting NCCL weight sync broadcast."
TRAINER_SYNC_0_DONE = "Trainer sync_weights at step 0 finished."
STEP_1 = "Training at step 1 started."
STEP_1_DONE = "Training at step 1 finished."
TRAINER_SYNC_1 = "Trainer sync_weights at step 1 started."

#: Where the device's memory running out shows in the logs: torch_npu's error, or vLLM's own check of
#: the memory left for the KV cache.
OUT_OF_MEMORY = {
    "out_of_memory": r"NPU out of memory|No available memory for the cache blocks|Free memory on device"
}


def out_of_memory(name: str, capacity: str, cluster: str = "auto") -> Fault:
    """The device's memory fault: every simulated NPU holds ``capacity``; its point is where it first ran
    out.  No bound is configured: the run must end with the error.  Trinity exits 0 after it -- the stage
    fails and `trinity run` drops that (trinity/cli/launcher.py:416)."""
    return Fault(
        name,
        at="out_of_memory",
        act=memory_ran_out,
        bound=f"none configured: the run must end with the error (within {BOUND_S} s here)",
        env={"NPU_COMPAT_SIMULATE_NPU_MEMORY": capacity},
        watch=OUT_OF_MEMORY,
        exits=0,
        cluster=cluster,
    )


#: The faults, each at its named point of the bundled run.
FAULTS: dict[str, Fault] = {
    # vLLM notices at once (EngineDeadError in every request), but Trinity's explorer ends each explore
    # step left -- this one and the next of the run's two -- only at explorer.max_timeout; the launcher
    # then sees the Explorer finished and waits for the trainer, tears the weight sync down and shuts both
    # down, each wait bounded by the config (below), and `trinity run` exits 0
    "rollout_killed_mid_explore": Fault(
        "rollout_killed_mid_explore",
        at="explore_step_started",
        act=signal_processes(vllm_processes, signal.SIGKILL),
        bound=(
            f"the error: explorer.max_timeout {BOUND_S} s; the driver's end: Trinity's waits after it, "
            f"2 explore steps x max_timeout {BOUND_S} s + the launcher's wait for the trainer (sync_timeout "
            f"{BOUND_S} s, trinity/cli/launcher.py:287) + the weight-sync teardown (30 s, :308) + the "
            f"shutdown (sync_timeout {BOUND_S} s, :312-316)"
        ),
        bound_s=TRINITY_WAITS_AFTER_A_DEAD_ROLLOUT_S,
        error_at="engine_dead",
        watch={"engine_dead": r"EngineDeadError"},
        exits=0,
    ),
    "rollout_dies_in_weight_sync": Fault(
        "rollout_dies_in_weight_sync",
        at="weight_sync_group_formed",
        act=StopThenKill(vllm_processes, stop_at=EXPLORER_SYNC_1, kill_at=BROADCAST, count=2),
        bound=f"HCCL_EXEC_TIMEOUT {BOUND_S} s (the trainer's broadcast); Trinity passes sync_timeout to neither side",
        # the trainer's broadcast raises at HCCL_EXEC_TIMEOUT and Trinity trains on, with stale weights
        # (trinity/trainer/trainer.py:240-245); the Explorer's side never returns
        hangs=(
            "the rollout actor's sync_model_weights awaits vLLM's AsyncLLM (pause_generation, start_weight_update, "
            "update_weights), whose calls to a dead engine core never resolve; the Explorer passes "
            "timeout=synchronizer.sync_timeout (trinity/explorer/explorer.py:242) and the actor does not use it "
            "(trinity/common/models/vllm_model.py:557-561); the trainer then waits for step 2's experiences"
        ),
    ),
    # the rank is stopped once the first weight sync is over and killed when step 1 begins, so the other
    # rank's first collective of the step waits for a dead peer: Ray's ActorDiedError reaches the Trainer
    # at once, the launcher logs "Explorer or Trainer failed", and `trinity run` exits 0 all the same: run()
    # drops run_stage's StageStatus (trinity/cli/launcher.py:416)
    "trainer_rank_killed_mid_step": Fault(
        "trainer_rank_killed_mid_step",
        at="weight_sync_group_formed",
        act=StopThenKill(one_trainer_rank, stop_at=TRAINER_SYNC_0_DONE, kill_at=STEP_1),
        bound=(
            "the trainer group's timeout (verl passes none: torch's default 30 min) -- a dead peer must not "
            f"wait for it; Trinity's shutdown waits after the error (sync_timeout {BOUND_S} s)"
        ),
        exits=0,
        npus=3,  # Trinity gives the rollout 1 and the trainer 2
        cpus=8,  # verl's two trainer bundles take 3 CPUs each, the rollout's bundle 1
    ),
    # the rank is stopped once step 1 is over and killed when the Trainer starts the weight sync after it;
    # the Explorer is already inside that sync, its vLLM workers waiting for the trainer's broadcast
    "trainer_rank_killed_in_weight_sync": Fault(
        "trainer_rank_killed_in_weight_sync",
        at="weight_sync_group_formed",
        act=StopThenKill(one_trainer_rank, stop_at=STEP_1_DONE, kill_at=TRAINER_SYNC_1),
        bound=(
            f"HCCL_EXEC_TIMEOUT {BOUND_S} s (the rollout's side of the broadcast), then Trinity's waits as "
            "for a dead rollout"
        ),
        bound_s=TRINITY_WAITS_AFTER_A_DEAD_ROLLOUT_S,
        exits=0,
        npus=3,
        cpus=8,
    ),
    # the trainer's peak in the bundled run is 31.4 MiB (verl's perf/max_memory_allocated_gb 0.0314) and
    # the rollout fits in far less: 24 MiB per NPU runs out in the trainer's step, not before it
    "npu_memory_out_in_trainer": out_of_memory("npu_memory_out_in_trainer", "24MiB"),
    # the rollout alone (mode explore), on 32 KiB: its weights fit (about 24 KiB in bfloat16), and the profile
    # run that sizes its KV cache (vllm-ascend's determine_available_memory) runs out (2 MiB still held 17,920
    # tokens of KV cache); the Explorer fails to prepare and `trinity run` exits 0 (launcher.py:416)
    "npu_memory_out_in_rollout": out_of_memory("npu_memory_out_in_rollout", "32KiB", cluster="explore"),
    "ctrl_c_mid_run": Fault(
        "ctrl_c_mid_run",
        at="weight_sync_group_formed",
        act=AtLine(STEP_1, signal_driver(signal.SIGINT)),
        bound=f"synchronizer.sync_timeout {BOUND_S} s (Trinity's shutdown wait)",
        exits=128 + signal.SIGINT,  # Trinity's launcher turns KeyboardInterrupt into the shell's 130
    ),
    "sigterm_mid_run": Fault(
        "sigterm_mid_run",
        at="weight_sync_group_formed",
        act=AtLine(STEP_1, signal_driver(signal.SIGTERM)),
        bound=f"synchronizer.sync_timeout {BOUND_S} s (Trinity's shutdown wait)",
        # Ray's driver turns SIGTERM into an abort ("*** SIGTERM received ***" from its C++ failure-signal
        # handler, logging.cc:474), as it does for any Ray driver on any device: the shell sees 134
        exits=-signal.SIGABRT,
    ),
}
