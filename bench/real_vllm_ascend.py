"""The rollout's tokens per second on the simulated Ascend: the released vllm-ascend against the stand-in.

Run in a stack with the real vllm-ascend laid out: stack c (vLLM 0.18, vllm-ascend 0.18.0,
``.nox/stack-c/bin/python bench/real_vllm_ascend.py [rounds]``) or stack a (vLLM 0.23, 0.23.0.post1).

The engine of ``bench/acl_graphs.py`` (the tiny Qwen2 of ``tests/e2e/tiny_model.py``, TP 1, float32, 16
prompts of 64 greedy tokens each, ``rounds`` times after a warm-up), eager, once on the real vllm-ascend
(``NPU_COMPAT_SIMULATE_VLLM_ASCEND=real``: its ``NPUWorker``, ``NPUModelRunner``, attention backend and
sampler over the simulation's kernels) and once on the stand-in, each in its own process, in turn.  Prints
each median, the ratio real / stand-in, and whether the two generated the same tokens.  No floor: the two run
different Python above the same simulated device; the ratio says what the move to the real package costs a
simulated run, not what a device would do.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from acl_graphs import release_and_rounds, run


def main() -> None:
    release, rounds = release_and_rounds()
    real, stand_in = run(True, rounds, "real"), run(True, rounds, "stand-in")
    r, s = statistics.median(real["rates"]), statistics.median(stand_in["rates"])
    print(f"real vllm-ascend {release + ':':13s}{r:8.1f} tokens/s (median of {rounds})")
    print(f"stand-in:                     {s:8.1f} tokens/s (median of {rounds})")
    print(f"real / stand-in: {r / s:.2f}  (no floor: see the docstring)")
    print(f"same tokens: {real['tokens'] == stand_in['tokens']}")


if __name__ == "__main__":
    main()
