"""The field-failure catalogue (``tests/field/rows.py``) rendered as a Markdown page."""

from __future__ import annotations

from tests.field.rows import ROWS, Row

COMMAND = "python -m tests.field > docs/field-failures.md"


def _sources(row: Row) -> str:
    return "<br>".join(f"`{s.ref}`: {s.says}" for s in row.sources)


def _handled(row: Row) -> str:
    if not row.handled_by:
        return row.status
    return f"{row.status} ({', '.join(f'`{h}`' for h in row.handled_by.split(', '))})"


def render() -> str:
    out = [
        "# Field failures: what Ascend users of RL report, on the simulated Ascend",
        "",
        f"<!-- Generated from tests/field/rows.py; do not edit. Regenerate with:\n     {COMMAND} -->",
        "",
        "Each row is a failure people report from real Ascend hosts in RL post-training, with its public sources.",
        "The simulated Ascend models it only as far as the sources and the released code describe it. The row",
        "then says what stock Trinity meets, what it meets with npu-compat, and which tests show both.",
        "`patched`: a patch of [the catalogue](patches.md) turns it green; `doctor`: only the environment can fix",
        "it, and `python -m npu_compat doctor` names it; `not reached`: reproduced, but Trinity's own code never",
        "takes that path; `not yet reproduced`: found in the trackers, not yet modelled.",
        "",
        "| row | failure | npu-compat | sources |",
        "|---|---|---|---|",
    ]
    out += [f"| {r.id} | {r.failure} | {_handled(r)} | {_sources(r)} |" for r in ROWS]
    for row in ROWS:
        out += ["", f"## {row.id}: {row.failure}", ""]
        out += [f"- **Sources.** {_sources(row).replace('<br>', '; ')}."]
        if row.reproduced:
            out += [f"- **Reproduced.** {row.reproduced}."]
        if row.stock:
            out += [f"- **Stock.** {row.stock}."]
        if row.npu_compat:
            out += [f"- **With npu-compat** ({_handled(row)}). {row.npu_compat}."]
        if row.tests:
            out += ["- **Tests.**", *(f"  - `{t}`" for t in row.tests)]
        if row.status == "not yet reproduced":
            out += ["- Not yet reproduced on the simulated Ascend."]
    return "\n".join(out) + "\n"
