"""Lines of code by area, at one or more commits: ``python tools/loc_by_area.py [REF ...]`` (default HEAD).

The areas are the layout's: the product (what runs in a user's processes: the package less the
rest, the pre-check and the files beside it at the top of the wheel), the diagnostics (``doctor``,
``check`` and the upstream source they read), the tools (the start-up timeline and floor, the page
generators, ``bench/`` and ``tools/``), the simulated Ascend (``npu_compat/testing``), and, apart, the
tests and the docs.  Both layouts are known, so that commits before and after a move compare.
Counts are the lines of every text file git holds at the commit (``git grep -c``), like ``wc -l``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: (area, path prefixes), the first match wins.
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("simulation", ("npu_compat/testing/",)),
    (
        "diagnostics",
        (
            "npu_compat/doctor/",
            "npu_compat/_doctor.py",
            "npu_compat/_check.py",
            "npu_compat/_source.py",
            "npu_compat/_upstream.py",
        ),
    ),
    (
        "tools",
        (
            "npu_compat/tools/",
            "npu_compat/_floor.py",
            "npu_compat/_timeline.py",
            "npu_compat/_catalogdoc.py",
            "tools/",
            "bench/",
        ),
    ),
    ("product", ("npu_compat/", "_npu_compat_precheck.py", "sitecustomize.py", "npu_compat.pth")),
    ("tests", ("tests/",)),
    ("docs", ("docs/", "README.md")),
)
ORDER = [area for area, _ in AREAS]


def area_of(path: str) -> str | None:
    for area, prefixes in AREAS:
        if path.startswith(prefixes):
            return area
    return None


def count(ref: str) -> dict[str, tuple[int, int]]:
    """``area -> (files, lines)`` at ``ref``."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "grep", "-c", "-I", "", ref], capture_output=True, text=True, check=True
    ).stdout
    totals = {area: (0, 0) for area in ORDER}
    for line in out.splitlines():
        _, path, lines = line.rsplit(":", 2)  # REF:path:count
        area = area_of(path)
        if area is not None:
            files, total = totals[area]
            totals[area] = (files + 1, total + int(lines))
    return totals


def main(refs: list[str]) -> None:
    refs = refs or ["HEAD"]
    table = {ref: count(ref) for ref in refs}
    print("| area | " + " | ".join(f"{ref}: files, lines" for ref in refs) + " |")
    print("|---|" + "---|" * len(refs))
    for area in ORDER:
        cells = [f"{table[ref][area][0]}, {table[ref][area][1]}" for ref in refs]
        print(f"| {area} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
