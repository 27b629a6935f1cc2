"""How long ``python -m npu_compat check`` takes on a release, against its goal of 5 s for a wheel of
Trinity's size (the drift session runs it on every release it downloads).

    python bench/check_speed.py [ARTIFACT ...] [--rounds N]

Each artifact (default: every ``*.whl`` under the ``drift`` session's download directory,
``.nox/drift/tmp/drift``) is checked ``N`` times (default 3) in a fresh interpreter, as a user runs
it; the bench prints the median wall time, its size, the patches that target it, and the ratio to
the goal.  A fresh interpreter includes Python's own start-up (~30 ms), which a user pays too.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 5.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifacts", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    artifacts = args.artifacts or sorted((REPO / ".nox" / "drift" / "tmp" / "drift").glob("*/*.whl"))
    if not artifacts:
        print("no artifact: give one, or run `nox -s drift` first (it downloads the newest releases)")
        return 2
    print(f"{'artifact':58s} {'MiB':>7s} {'median s':>9s} {'/ goal 5 s':>10s}")
    for path in artifacts:
        times = []
        for _ in range(args.rounds):
            started = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "npu_compat", "check", str(path)],
                capture_output=True,
                text=True,
                cwd=REPO,
            )
            times.append(time.perf_counter() - started)
            if proc.returncode not in (0, 1):
                print(f"{path.name}: check exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
                return 1
        median = statistics.median(times)
        size = path.stat().st_size / 2**20
        print(f"{path.name:58s} {size:7.1f} {median:9.2f} {median / GOAL_S:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
