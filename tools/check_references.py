"""Find references a reader of this repository cannot follow.

    python tools/check_references.py [PATH ...]

Two kinds, in every text file git knows (tracked, or new and not ignored), or in the PATHs given:

* a citation of this project's own issue numbers ("issue 5", "issues 5-7", "(#12)", a bare "#12"):
  a reason must be stated where it is used.  A number after a repository name (``vllm-ascend#12``,
  ``owner/repo#12``) or in a URL cites another project and passes;
* a path outside the repository (a sibling checkout, a home directory, a machine's work folder).
  Paths a user's run really meets (``/tmp/ray``, ``/dev/shm``, ``/usr/...``) match no pattern here.

Prints ``path:line: text`` for each hit and exits 1 if there is one.  Stdlib only.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: This file names every pattern it looks for, so it is not scanned.
SELF = "tools/check_references.py"

ISSUE = [
    re.compile(r"\b[Ii]ssues?\s*#?\d"),
    # "#12" alone: not after a word character (repo#12, &#12;), "/" (URLs), "." or "-", and not a whole
    # quoted string ("#1" as a value in code, such as the timeline's parent column)
    re.compile(r"(?<![\w/&.\-])(?!(?<=[\"'])#\d+[\"'])#\d+\b"),
]
OUTSIDE = [
    re.compile(r"\.\./shared\b"),
    re.compile(r"\bshared/UPSTREAM_MAP"),
    re.compile(r"\bUPSTREAM_MAP\.md"),
    re.compile(r"/work/"),
    re.compile(r"(?<![\w)\]])\.library/"),
    re.compile(r"/root/"),
    re.compile(r"/home/"),
]

#: (path, text of the line) pairs that are not references, each with its reason.  Empty: add an entry
#: only for a line that cannot be written without matching.
ALLOWED: tuple[tuple[str, str], ...] = ()


def find(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` for every line of ``text`` that cites an issue or a path outside."""
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        if any(p.search(line) for p in (*ISSUE, *OUTSIDE)):
            hits.append((number, line))
    return hits


def check(path: str, text: str) -> list[str]:
    """``path:line: text`` for each hit in ``text``, the file at ``path``, less the allowed ones."""
    return [
        f"{path}:{number}: {line.strip()[:200]}"
        for number, line in find(text)
        if (path, line.strip()) not in ALLOWED
    ]


def _files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return sorted({name for name in out.decode().split("\0") if name})


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary, undecodable or missing file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def main(argv: list[str]) -> int:
    names = argv or _files()
    found = []
    for name in names:
        if Path(name).as_posix() == SELF:
            continue
        text = _text(REPO / name)
        if text is not None:
            found += check(name, text)
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} reference(s) a reader of this repository cannot follow", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
