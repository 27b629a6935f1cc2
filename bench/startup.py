"""Interpreter start-up cost of npu-compat, measured side by side in one run.

Variants, run interleaved (round-robin, shuffled each round) so machine noise hits
them alike; the figure of merit is the ratio of medians against plain start-up:

* ``plain``        -- ``python -c pass``
* ``noop``         -- ``import npu_compat; npu_compat.activate()`` on a host with no
                      Ascend evidence (the path every CUDA/CPU user takes)
* ``npu-register`` -- the same with ``NPU_COMPAT_DEVICE=npu``: every post-import hook
                      registered, no upstream target imported

Goals (issue 2): noop <= 1.02x, npu-register <= 1.05x.  Run: ``python bench/startup.py [rounds]``.
"""

from __future__ import annotations

import compileall
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ACTIVATE = "import npu_compat; npu_compat.activate()"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPU_COMPAT", "ASCEND_", "TRINITY_"))}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


PY = os.environ.get("BENCH_PYTHON", sys.executable)

VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "plain": ([PY, "-c", "pass"], _env()),
    "noop": ([PY, "-c", ACTIVATE], _env()),
    "npu-register": ([PY, "-c", ACTIVATE], _env(NPU_COMPAT_DEVICE="npu")),
}


def _time_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True)
    return time.perf_counter() - start


def measure(rounds: int) -> dict[str, list[float]]:
    # Installed packages carry compiled bytecode; a checkout may not (PYTHONDONTWRITEBYTECODE).
    compileall.compile_dir(str(REPO / "npu_compat"), quiet=1)
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for argv, env in VARIANTS.values():  # warm the page cache
        _time_once(argv, env)
    for _ in range(rounds):
        order = list(VARIANTS)
        random.shuffle(order)
        for name in order:
            argv, env = VARIANTS[name]
            samples[name].append(_time_once(argv, env))
    return samples


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    samples = measure(rounds)
    base = statistics.median(samples["plain"])
    print(f"interpreter start-up, {rounds} interleaved rounds, median wall time per start")
    for name, values in samples.items():
        med = statistics.median(values)
        print(f"  {name:14s} {med * 1e3:7.2f} ms   ratio {med / base:5.3f}   (+{(med - base) * 1e3:5.2f} ms)")


if __name__ == "__main__":
    main()
