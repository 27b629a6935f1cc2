"""The break catalogue (``tests/catalogue/rows.py``) rendered as a Markdown page, ``docs/break-map.md``."""

from __future__ import annotations

import re

from tests.catalogue.rows import ALREADY_FINE, OUT_OF_SCOPE, ROWS, Row

COMMAND = "python -m tests.catalogue > docs/break-map.md"
TEST = "tests/catalogue/test_catalogue.py"
TRAINERS = {
    "any": "any",
    "verl>=0.8": "verl >= 0.8 (`trinity.trainer.verl`)",
    "verl<0.8": "verl < 0.8 (`trinity.trainer.verl_legacy`)",
}


def _anchor(heading: str) -> str:
    """The fragment GitHub gives a heading: code marks and punctuation dropped, lower case, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")


def heading(row: Row) -> str:
    return f"{row.id}: {row.severity} in `{row.where.split(':', 1)[1]}`"


def _patches(row: Row) -> str:
    return ", ".join(f"[`{p}`](patches.md#{_anchor(p)})" for p in row.patches) or "none"


def _tests(row: Row) -> str:
    if row.probed:
        stock = "its Ray request stays pending" if row.red == "pending" else f"`{row.red}`"
        return f"`{TEST}::test_red[{row.id}]` (stock: {stock}), `test_green[{row.id}]` (npu-compat)"
    return row.elsewhere


def _scope() -> str:
    return "; ".join(f"{what}: {ids}" for what, ids in OUT_OF_SCOPE.items())


def render() -> str:
    out = [
        "# The break map: where released Trinity-RFT breaks on Ascend",
        "",
        f"<!-- Generated from tests/catalogue/rows.py; do not edit. Regenerate with:\n     {COMMAND} -->",
        "",
        "Each row is a place in a released trinity-rft, or in the verl code it drives, that assumes CUDA where an",
        "Ascend host has an NPU, with the npu-compat patches that handle it ([the patch reference](patches.md)).",
        "Code, tests and the patch reference cite rows by their ids:",
        "",
        "- `A<n>`: trinity-rft 0.6.0, the latest release (verl 0.8 selects its trainer `trinity.trainer.verl`,",
        "  verl < 0.8 its `trinity.trainer.verl_legacy`);",
        "- `B<n>`: trinity-rft 0.5.2, on verl 0.7.1;",
        "- `N<n>`: not in the original inventory, found by npu-compat's own whole runs on the simulated Ascend.",
        "",
        "The numbers follow the inventory the rows were read from, so they have gaps. Among them, npu-compat",
        f"leaves these out of scope: {_scope()}.",
        "",
        "Severity:",
        "",
        "- **HANG**: a Ray request that an NPU-only cluster can never satisfy; no error, the run waits forever;",
        "- **CRASH**: raises on torch_npu's CPU-built torch (`Torch not compiled with CUDA enabled`, an NCCL",
        "  assert) or in an Ascend library;",
        "- **WRONG**: runs, but does the CUDA thing: a check skipped, memory not freed, a variable Ascend ignores;",
        "- **OK**: already device-aware through verl's helpers; npu-compat leaves it alone (listed at the end).",
        "",
        "The upstream code is named by module and qualified name (`module:qualname`), never by a line number:",
        "lines move between releases, names rarely do. A row with a catalogue probe runs on the simulated Ascend",
        f"as `{TEST}::test_red[<id>]` (stock fails the way a user sees it) and `test_green[<id>]` (with",
        "npu-compat it passes); a row without one says where it is driven instead.",
        "",
        "| id | trinity-rft | trainer | severity | upstream | npu-compat patches | probe |",
        "|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| [{r.id}](#{_anchor(heading(r))}) | {r.trinity} | {r.trainer} | {r.severity} | `{r.where}` | "
        f"{_patches(r)} | {'yes' if r.probed else 'no'} |"
        for r in ROWS
    ]
    for row in ROWS:
        out += ["", f"## {heading(row)}", ""]
        out += [f"- **Release.** trinity-rft {row.trinity}; trainer: {TRAINERS[row.trainer]}."]
        out += [f"- **Upstream.** `{row.where}`"]
        out += [f"- **What breaks.** {row.breaks}"]
        out += [f"- **npu-compat.** {_patches(row)}."]
        out += [f"- **Tests.** {_tests(row)}."]
    out += ["", "## Already device-aware (OK)", ""]
    out += ["trinity-rft 0.5.2 code that needs no patch; npu-compat must not patch it twice:", ""]
    out += [f"- {item};" for item in ALREADY_FINE[:-1]] + [f"- {ALREADY_FINE[-1]}."]
    return "\n".join(out) + "\n"
