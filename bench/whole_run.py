"""A whole ``trinity run``'s wall time on the simulated Ascend: the released vllm-ascend against the stand-in.

Run in a stack session's environment with the real vllm-ascend laid out, e.g. ``.nox/stack-a/bin/python
bench/whole_run.py [rounds]``.  The main job's run (``tests/e2e/scenario.py``: the bundled
``examples/e2e/trinity_tiny.yaml``, GRPO in mode ``both``, two train steps, the rollout at Trinity's defaults,
a cluster of 2 simulated NPUs, with npu-compat), once with ``NPU_COMPAT_SIMULATE_VLLM_ASCEND=real`` (the
default) and once with ``stand-in``, in turn, ``rounds`` times (default 1).  Each run starts its own cluster
and ends with the driver.  Prints each run's wall time from the driver's start to its exit, the medians, and
real / stand-in.  No floor: the two run different Python above the same simulated device; the release also
captures ACL graphs at Trinity's default, which the stand-in does not (it runs eager).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e import scenario


def one(kind: str, model: Path, root: Path, i: int) -> float:
    out = root / f"{kind}-{i}"
    started = time.monotonic()
    result = scenario.run(
        "compat", out, timeout=1500, model=model, env={"NPU_COMPAT_SIMULATE_VLLM_ASCEND": kind}
    )
    took = time.monotonic() - started
    stages = result.get("stages") or []
    if result.get("rc") != 0 or "second_train_step_finished" not in stages:
        raise SystemExit(
            f"{kind}: the run did not finish: rc {result.get('rc')}, {result.get('first_error')}"
        )
    print(f"  {kind:8s} run {i + 1}: {took:6.1f} s", flush=True)
    return took


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    with tempfile.TemporaryDirectory(prefix="npu-compat-whole-run-") as directory:
        root = Path(directory)
        model = scenario.make_model(root / "tiny-model")
        times: dict[str, list[float]] = {"real": [], "stand-in": []}
        for i in range(rounds):
            for kind in times:
                times[kind].append(one(kind, model, root, i))
    real, stand_in = (statistics.median(times[k]) for k in ("real", "stand-in"))
    print(f"real vllm-ascend: {real:6.1f} s (median of {rounds})")
    print(f"stand-in:         {stand_in:6.1f} s (median of {rounds})")
    print(f"real / stand-in: {real / stand_in:.2f}  (no floor: see the docstring)")


if __name__ == "__main__":
    main()
