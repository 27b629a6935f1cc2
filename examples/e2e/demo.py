"""The main job: the real ``trinity run`` on a simulated Ascend, stock and through npu-compat, side by side.

``python3 -m nox -s demo`` installs stack (a) (trinity-rft 0.6.0, verl 0.8.0, vLLM 0.23, Ray, torch CPU;
exactly as the ``stack-a`` session) and runs this with the repository root as working directory::

    python examples/e2e/demo.py [--stock auto|explicit|explore] [--compat auto|explicit|explore] [--keep DIR]

Each run is one ``tests/e2e/scenario.py`` run (the single implementation of the scenario): its own
NPU-only Ray cluster (``{"NPU": 2}``, no GPU), the bundled ``examples/e2e/trinity_tiny.yaml`` on a tiny
random model, the logs read as they grow.  It prints one line per phase with the elapsed seconds, then
the two runs side by side (where stock stops, which stages npu-compat reaches, wall times and their
ratio), the npu-compat run step by step, then the per-process patch table of the npu-compat run
(``python -m npu_compat doctor --reports DIR``).

The variants, chosen to fit a few minutes on a 2-core machine:

* stock ``explicit`` -- the bundled config plus ``node_num: 1`` / ``gpu_per_node: 2``, the workaround a
  user writes after the bundled config fails Trinity's own GPU count (``ZeroDivisionError`` in config
  validation, ~15 s; ``--stock auto`` shows it).  Stock then gets three stages further and hangs on the
  verl worker group's ``{"GPU": 1}`` placement group.  The hang is cut short: the run stops
  :data:`STUCK_AFTER_S` seconds after Ray declares the request infeasible (no node of the cluster can
  ever fulfil it), instead of waiting for the e2e test's fixed bound; 1.5-2.5 minutes in all here.
* npu-compat ``auto`` -- the bundled config unchanged: npu-compat counts the NPUs, and the whole run goes
  through -- FSDP2 trains on simulated ``npu`` tensors, vLLM generates on vllm-ascend's ``NPUWorker``, the
  weights sync over HCCL before step 1 and after each of the two GRPO steps -- and exits 0.  Then the
  run step by step: each train step's reward and loss, each sync with the digest both sides logged.

On Ctrl-C or SIGTERM the current scenario kills its ``trinity run`` process group and stops its Ray
cluster; then every process left with this demo's scratch directory in its environment is killed and
the scratch directory removed (``--keep DIR`` keeps the logs and reports there instead).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: make `tests.e2e` importable
    sys.path.insert(0, str(REPO))

from tests.e2e import scenario  # noqa: E402

#: Seconds a stock run goes on after Ray declared its request infeasible.
STUCK_AFTER_S = 20.0
#: Bounds of the driver, if nothing stops it earlier (the e2e tests' bounds).
BOUND_S = {"stock": 240.0, "compat": 900.0}

#: What a stage is, in words (for the stage a run did not reach).
STAGE_WORDS = {
    "npus_counted": "config validation, where Trinity counts the cluster's accelerators",
    "config_validated": "config validation",
    "explorer_actor": "the Explorer actor",
    "trainer_actor": "the Trainer actor",
    "verl_pg_ready": "the verl worker group's placement group",
    "verl_workers_started": "the verl workers (WorkerDict)",
    "verl_models_built": "building the verl models (FSDP2)",
    "trainer_ready": "the Trainer's readiness",
    "rollout_pg_ready": "the rollout placement group",
    "rollout_actor_scheduled": "the rollout actor (vLLMRolloutModel)",
    "rollout_models_ready": "the vLLM engines",
    "weight_sync_setup_started": "the weight-sync setup",
    "weight_sync_group_formed": "the weight-sync group",
    "explore_step_started": "the first explore step",
    "train_step_started": "the first train step",
    "train_step_finished": "the end of the first train step",
    "second_train_step_finished": "the end of the second train step",
    "rollout_on_weight_version_2": "the rollout on weight version 2",
}
TRAINER_STAGES = {
    "trainer_actor",
    "verl_pg_ready",
    "verl_workers_started",
    "verl_models_built",
    "trainer_ready",
}


class Clock:
    def __init__(self, since: float) -> None:
        self.since = since

    def say(self, line: str) -> None:
        print(f"[{time.time() - self.since:5.0f} s] {line}", flush=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """The first SIGINT/SIGTERM stops the demo (cleanup in ``finally``); later ones cannot cut it short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def host_summary() -> list[str]:
    """A short `python -m npu_compat report` on this host and `report --device npu`."""
    lines = []
    for device in (None, "npu"):
        cmd = [
            sys.executable,
            "-m",
            "npu_compat",
            "report",
            "--json",
            *(["--device", device] if device else []),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NPU_COMPAT")}
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            lines.append(f"  {' '.join(cmd[1:])}: exit {done.returncode} {done.stderr.strip()[-300:]}")
            continue
        data = json.loads(done.stdout)
        decision, patches = data["decision"], data["patches"]
        counts: dict[str, int] = {}
        for p in patches:
            counts[p["status"]] = counts.get(p["status"], 0) + 1
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        what = "this host" if device is None else "an NPU decision"
        device_line = f"device {decision['device']} ({decision['source']})"
        lines.append(f"  {what}: {device_line}; {len(patches)} patches: {statuses}")
    lines.append(
        "  (`python -m npu_compat report [--device npu]` lists them; pending = applied when imported)"
    )
    return lines


def _stages(result: dict[str, object]) -> list[str]:
    stages = result.get("stages")
    return [str(s) for s in stages] if isinstance(stages, list) else []


def _expected(variant: str) -> list[str]:
    """The stages a run of this variant can reach, in order."""
    names = [name for name, _ in scenario.STAGES]
    if variant != "auto":  # node_num/gpu_per_node are stated: Trinity counts nothing
        names.remove("npus_counted")
    if variant == "explore":
        names = [n for n in names if n not in TRAINER_STAGES]
    return names


def _next_stage(result: dict[str, object]) -> str | None:
    reached = _stages(result)
    expected = _expected(str(result.get("cluster")))
    remaining = [n for n in expected if n not in reached]
    return remaining[0] if remaining else None


def _infeasible_request(out: Path) -> str | None:
    match = re.search(
        scenario.INFEASIBLE + r"\s*(?:defaultdict\(<class 'float'>, )?(\{[^}]*\})", scenario.all_logs(out)
    )
    return match.group(1) if match else None


def _at(result: dict[str, object], name: str) -> str:
    times = result.get("stage_s")
    seconds = times.get(name) if isinstance(times, dict) else None
    return f" (+{seconds:.0f} s)" if isinstance(seconds, (int, float)) else ""


def side_by_side(stock: dict[str, object], compat: dict[str, object], out: Path) -> list[str]:
    lines = ["", "side by side -- stack (a) on a simulated Ascend Ray cluster ({'NPU': 2}, no GPU):"]
    for label, result, run_out in (
        ("stock", stock, out / "stock"),
        ("npu-compat", compat, out / "npu-compat"),
    ):
        variant = str(result.get("cluster"))
        config = "bundled config" if variant == "auto" else f"config variant `{variant}`"
        reached = _stages(result)
        how = "stock `trinity run`" if label == "stock" else "python -m npu_compat trinity run"
        lines.append(f"  {label:10s}  {config}, {how}")
        lines.append(f"    reached   {' > '.join(reached) if reached else 'nothing'}")
        nxt = _next_stage(result)
        where = STAGE_WORDS.get(nxt, nxt) if nxt else "the end"
        boundaries = result.get("boundaries")
        request = _infeasible_request(run_out)
        rc = result.get("rc")
        error = str(result.get("first_error")).split(". ", 1)[0][:200]
        if isinstance(boundaries, list) and boundaries:
            for b in boundaries:
                lines.append(
                    f"    stops at  the simulation's compute boundary{_at(result, f'boundary: {b}')}: {b}"
                )
            lines.append(f"              (next would be {where}: a real NPU computes from here on)")
            lines.append(f"    error     {error}")
        elif rc in ("stuck", "timeout") and request:
            lines.append(
                f"    stuck at  {where}{_at(result, 'infeasible')}: Ray cannot place {request} "
                "on an NPU-only cluster; pending for good"
            )
        elif rc == 0 and nxt is None:
            lines.append("    finished  every stage, to the end of the run")
        elif rc == "stuck":
            lines.append(f"    stuck at  {where}: no further stage, no error")
        elif rc == "timeout":
            lines.append(f"    stuck at  {where}: no further stage until the bound")
        else:
            lines.append(f"    crashed at {where}: {error}")
        ends = {
            "stuck": f"stopped {STUCK_AFTER_S:.0f} s after Ray's verdict" if request else "stopped there",
            "timeout": "killed at the bound",
        }
        end = ends.get(str(rc), f"driver exit status {rc}")
        lines.append(f"    wall      {result.get('wall_s')} s ({end})")
    stock_wall, compat_wall = stock.get("wall_s"), compat.get("wall_s")
    if isinstance(stock_wall, (int, float)) and isinstance(compat_wall, (int, float)) and stock_wall > 0:
        further = len(_stages(compat)) - len(_stages(stock))
        lines.append(
            f"  ratio       npu-compat / stock wall time = {compat_wall / stock_wall:.2f} "
            f"({compat_wall} s / {stock_wall} s); npu-compat got {further:+d} stages further"
        )
    return lines


def the_run(out: Path) -> list[str]:
    """The npu-compat run step by step: each train step's reward and actor loss (the Trainer's metrics),
    and each weight sync over HCCL with the digest both sides logged (``npu_compat.testing._digest``)."""
    steps, syncs = scenario.train_steps(out), scenario.weight_syncs(out)
    if not steps and not syncs:
        return []
    lines = ["", "the npu-compat run, step by step:"]
    for step in steps:
        lines.append(
            f"  train step {step['step']}   reward mean {step['reward_mean']}, "
            f"actor pg_loss {step['pg_loss']}, grad norm {step['grad_norm']}"
        )
    for i, sync in enumerate(syncs):
        when = "before step 1" if i == 0 else f"after train step {i}"
        verdict = "equal" if sync["sent"] == sync["loaded"] else "DIFFERENT"
        lines.append(
            f"  weight sync over HCCL ({when}): trainer sent {sync['sent']}; rollout loaded "
            f"{sync['loaded'] or 'nothing'} -- {verdict}"
        )
    if steps and all(step["pg_loss"] == 0 for step in steps):
        lines.append(
            "  (a random tiny model earns every response the same reward: GRPO's advantages and loss are 0,"
            " and the weights move by AdamW's weight decay alone)"
        )
    return lines


#: Stages a run reaches before anything device-related has run: up to here stock and npu-compat
#: are the same program but for Trinity's count of the accelerators.
BEFORE_DEVICE = {"npus_counted", "config_validated"}


def environment_failure(stock: dict[str, object], compat: dict[str, object]) -> str | None:
    """The error both runs stopped on, when they stopped the same way before anything device-related.

    Both drivers exited by themselves (no compute boundary, not stuck at a placement group) with the
    same first error, and neither got past config validation: what stopped them is the machine they
    ran on, not the device and not npu-compat.
    """
    runs = (stock, compat)
    if any(r.get("rc") in ("stuck", "timeout") or r.get("boundaries") for r in runs):
        return None
    if any(not set(_stages(r)) <= BEFORE_DEVICE for r in runs):
        return None
    error = stock.get("first_error")
    return str(error) if error and error == compat.get("first_error") else None


def doctor(reports: Path | None = None, svg: Path | None = None) -> tuple[int, list[str]]:
    """``doctor`` on this machine; with ``reports``, on the run's reports too, with its timeline (and
    the timeline's chart written to ``svg``)."""
    cmd = [sys.executable, "-m", "npu_compat", "doctor"]
    if reports:
        cmd += ["--reports", str(reports), "--timeline", *(["--svg", str(svg)] if svg else [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPU_COMPAT")}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=300)
    return done.returncode, (done.stdout + done.stderr).rstrip().splitlines()


def sweep(scratch: Path) -> list[int]:
    """Kill every process of ours left with ``scratch`` in its environment (``E2E_WORKDIR``); remove
    the Ray temp directories they name.  Normally there are none: each scenario cleans up after itself."""
    marker = f"E2E_WORKDIR={scratch}".encode()
    killed, temp_dirs = [], set()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            environ = (pid_dir / "environ").read_bytes()
            cmdline = (pid_dir / "cmdline").read_bytes()
        except OSError:
            continue
        if not any(var.startswith(marker) for var in environ.split(b"\0")):
            continue
        for arg in cmdline.split(b"\0"):
            match = re.match(rb"--temp[-_]dir=(/tmp/ncray-[^/\0]+)", arg)
            if match:
                temp_dirs.add(match.group(1).decode())
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(pid_dir.name), signal.SIGKILL)
            killed.append(int(pid_dir.name))
    for temp_dir in temp_dirs:
        shutil.rmtree(temp_dir, ignore_errors=True)
    return killed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    variants = ["auto", "explicit", "explore"]
    parser.add_argument("--stock", choices=variants, default="explicit", help="stock run's config variant")
    parser.add_argument("--compat", choices=variants, default="auto", help="npu-compat run's config variant")
    parser.add_argument(
        "--keep", metavar="DIR", help="keep the logs and reports in DIR (default: a temp dir, removed)"
    )
    parser.add_argument(
        "--since", type=float, default=None, help="epoch seconds the elapsed times count from"
    )
    args = parser.parse_args(argv)
    clock = Clock(args.since if args.since is not None else time.time())
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    if args.keep:
        scratch = Path(args.keep).resolve()
        scratch.mkdir(parents=True, exist_ok=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="npu-compat-demo-"))
    status = 0
    try:
        clock.say(f"installed stack (a) into {Path(sys.executable).parent.parent}; npu-compat on this host:")
        for line in host_summary():
            print(line, flush=True)
        clock.say(f"making the tiny model (tests/e2e/tiny_model.py) for both runs; scratch {scratch}")
        model = scenario.make_model(scratch / "tiny-model")
        clock.say(f"stock run ({args.stock})")
        stock = scenario.run(
            "stock", scratch / "stock", timeout=BOUND_S["stock"], cluster=args.stock,
            progress=clock.say, stuck_after=STUCK_AFTER_S, model=model,
        )  # fmt: skip
        clock.say(f"npu-compat run ({args.compat})")
        compat = scenario.run(
            "compat",
            scratch / "npu-compat",
            timeout=BOUND_S["compat"],
            cluster=args.compat,
            progress=clock.say,
            model=model,
        )
        reports = scratch / "npu-compat" / "work" / "reports"
        clock.say(f"collecting the reports: python -m npu_compat doctor --reports {reports} --timeline")
        chart = scratch / "npu-compat" / "timeline.svg"  # next to the run's logs
        rc, table = doctor(reports, chart)
        for line in side_by_side(stock, compat, scratch):
            print(line)
        for line in the_run(scratch / "npu-compat"):
            print(line)
        print(
            "\nper-process patches of the npu-compat run, and its timeline "
            f"(doctor --reports DIR --timeline, exit status {rc}):"
        )
        start = next((i for i, line in enumerate(table) if line.startswith("processes (")), 0)
        for line in table[start:]:
            print(f"  {line}" if line else "")
        if args.keep and chart.exists():
            print(f"  the timeline as a chart: {chart}")
        cause = environment_failure(stock, compat)
        if cause:
            print(
                "\nboth runs stopped the same way before anything device-related ran:\n"
                f"  {cause[:300]}\n"
                "the cause is this machine's environment, not the device and not npu-compat. "
                "`python -m npu_compat doctor` on this machine says:"
            )
            _, found = doctor()
            for line in [line for line in found if line.startswith(("error:", "warning:"))] or ["  nothing"]:
                print(f"  {line}")
            status = 1
        elif len(_stages(compat)) <= len(_stages(stock)):
            print("\nnpu-compat did not get further than stock: see the logs (--keep DIR)")
            status = 1
        clock.say("done")
    except KeyboardInterrupt as exc:
        print(f"\ninterrupted ({exc or 'SIGINT'}): the driver and its Ray cluster are stopped", flush=True)
        status = 130
    finally:
        killed = sweep(scratch)
        if killed:
            print(f"killed leftover processes {killed}", flush=True)
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        if status == 130:
            clock.say(f"cleaned up ({'kept ' + str(scratch) if args.keep else 'scratch directory removed'})")
    return status


if __name__ == "__main__":
    sys.exit(main())
