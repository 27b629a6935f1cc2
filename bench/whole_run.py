"""A whole ``trinity run``'s wall time on the simulated Ascend: Trinity's rollout default against eager.

Run in a stack session's environment (the released vllm-ascend laid out), e.g. ``.nox/stack-a/bin/python
bench/whole_run.py [rounds]``.  The main job's run (``tests/e2e/scenario.py``: the bundled
``examples/e2e/trinity_tiny.yaml``, GRPO in mode ``both``, two train steps, a cluster of 2 simulated NPUs,
with npu-compat), once with the rollout at Trinity's default (``enforce_eager: false``: the release captures
ACL graphs) and once with ``enforce_eager: true``, in turn, ``rounds`` times (default 1).  Each run starts its
own cluster and ends with the driver.  Prints each run's wall time from the driver's start to its exit, the
medians, and default / eager: what graph capture and replay cost a simulated run.  No floor: on the device
graphs save the host's launch time, which the simulated device does not have.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e import scenario

ONE_ENGINE = "    tensor_parallel_size: 1\n"
#: The rollout's section of the bundled config, made eager
EDITS: dict[str, Callable[[str], str] | None] = {
    "default": None,
    "eager": lambda text: text.replace(ONE_ENGINE, ONE_ENGINE + "    enforce_eager: true\n"),
}


def one(kind: str, model: Path, root: Path, i: int) -> float:
    out = root / f"{kind}-{i}"
    started = time.monotonic()
    result = scenario.run("compat", out, timeout=1500, model=model, edit=EDITS[kind])
    took = time.monotonic() - started
    stages = result.get("stages") or []
    if result.get("rc") != 0 or "second_train_step_finished" not in stages:
        raise SystemExit(
            f"{kind}: the run did not finish: rc {result.get('rc')}, {result.get('first_error')}"
        )
    print(f"  {kind:8s} run {i + 1}: {took:6.1f} s", flush=True)
    return took


def main() -> None:
    if ONE_ENGINE not in scenario.CONFIG.read_text():
        raise SystemExit(f"the bundled config has no {ONE_ENGINE.strip()!r} to make eager")
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    with tempfile.TemporaryDirectory(prefix="npu-compat-whole-run-") as directory:
        root = Path(directory)
        model = scenario.make_model(root / "tiny-model")
        times: dict[str, list[float]] = {kind: [] for kind in EDITS}
        for i in range(rounds):
            for kind in times:
                times[kind].append(one(kind, model, root, i))
    default, eager = (statistics.median(times[k]) for k in EDITS)
    print(f"Trinity's default (ACL graphs): {default:6.1f} s (median of {rounds})")
    print(f"enforce_eager: true:            {eager:6.1f} s (median of {rounds})")
    print(f"default / eager: {default / eager:.2f}  (no floor: see the docstring)")


if __name__ == "__main__":
    main()
