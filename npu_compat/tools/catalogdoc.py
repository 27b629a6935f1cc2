"""The patch reference page, ``docs/patches.md``, rendered from the catalogue.

Every patch of :mod:`npu_compat._catalog` with its id, target, distribution and supported
versions, why it exists, the upstream fix and when it can go.  The page is generated, never
edited by hand; a test compares the file in the repository with :func:`render`.  Regenerate it
from the repository root with::

    python -m npu_compat.tools.catalogdoc > docs/patches.md

Only the catalogue is read: no patch implementation and no upstream module is imported.
"""

import re
import sys

from .._catalog import SEAM_SPECS, SPECS
from .._spec import PatchSpec

#: The command that regenerates the page, from the repository root.
COMMAND = "python -m npu_compat.tools.catalogdoc > docs/patches.md"


def _cell(text: str) -> str:
    """``text`` as a table cell: a ``|`` would end the cell."""
    return text.replace("|", "\\|")


def _anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: lower case, punctuation dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _by_distribution(specs: "tuple[PatchSpec, ...]") -> "dict[str, list[PatchSpec]]":
    """The specs grouped by distribution, the groups in order of first appearance, each in catalogue order."""
    groups: dict[str, list[PatchSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.distribution, []).append(spec)
    return groups


def _ranges(specs: "list[PatchSpec]") -> "list[str]":
    """The distinct version ranges of ``specs``, in order of first appearance."""
    return list(dict.fromkeys(spec.versions for spec in specs))


def _entry(spec: PatchSpec, seams: "frozenset[str]") -> "list[str]":
    lines = [
        f"### `{spec.id}`",
        "",
        f"- **target**: `{spec.target}`",
        f"- **distribution**: `{spec.distribution}` `{spec.versions}`",
    ]
    if spec.id in seams:
        lines.append("- **kind**: process seam (reaches Ray workers; not a CUDA assumption)")
    lines.append(f"- **why**: {spec.why}")
    lines.append(f"- **upstream fix**: {spec.upstream_fix or '(none named)'}")
    lines.append(f"- **remove when**: {spec.remove_when or '(not stated)'}")
    if spec.copies:
        places = ", ".join(f"`{module}:{name}`" for module, name in spec.copy_places())
        lines.append(f"- **also repoints** (`from ... import` copies): {places}")
    if spec.expects:
        lines.append(f"- **expects parameters**: {', '.join(f'`{name}`' for name in spec.expects)}")
    if spec.condition:
        lines.append(f"- **applies only if**: `{spec.condition}` says so")
    code = spec.wrapper if spec.wrapper is not None else spec.replacement
    kind = "wrapper" if spec.wrapper is not None else "replacement"
    lines.append(f"- **{kind}**: `{code}`")
    lines.append("")
    return lines


def render(specs: "tuple[PatchSpec, ...]" = SPECS, seam_ids: "frozenset[str] | None" = None) -> str:
    """The whole page, as Markdown."""
    seams = frozenset(spec.id for spec in SEAM_SPECS) if seam_ids is None else seam_ids
    groups = _by_distribution(specs)
    lines = [
        "# Patch reference",
        "",
        "<!-- Generated from npu_compat/_catalog.py; do not edit. Regenerate with:",
        f"     {COMMAND} -->",
        "",
        f"Every patch npu-compat declares ({len(specs)}), generated from the catalogue "
        "(`npu_compat/_catalog.py`). Regenerate this page from the repository root with "
        f"`{COMMAND}`; a test fails while it is stale.",
        "",
        "A patch applies only on an NPU decision, and only where the installed version of its distribution "
        "is in its range (read from installed metadata, never by importing): an out-of-range version is "
        "`skipped` with the versions named, a target whose shape changed is `failed`. "
        "`python -m npu_compat report` shows each patch's status on this host, `python -m npu_compat doctor` "
        "the plan for this environment, and `NPU_COMPAT_DISABLE=id,...` leaves patches alone. "
        "Specs on the same target apply in the order listed (a later one wraps an earlier one).",
        "",
        "## Supported versions",
        "",
        "| distribution | versions | patches |",
        "|---|---|---|",
    ]
    for distribution, members in groups.items():
        for versions in _ranges(members):
            count = sum(1 for spec in members if spec.versions == versions)
            lines.append(f"| `{distribution}` | `{_cell(versions)}` | {count} |")
    lines += ["", "## Patches", "", "| id | target | distribution |", "|---|---|---|"]
    for spec in specs:
        link = f"[`{_cell(spec.id)}`](#{_anchor(spec.id)})"
        lines.append(f"| {link} | `{_cell(spec.target)}` | `{spec.distribution}` `{_cell(spec.versions)}` |")
    lines.append("")
    for distribution, members in groups.items():
        lines += [f"## {distribution}", ""]
        for spec in members:
            lines += _entry(spec, seams)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    sys.stdout.buffer.write(render().encode("utf-8"))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
