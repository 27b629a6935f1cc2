"""The field-failure catalogue: its page is current, and every test a row names exists."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.field.page import COMMAND, render
from tests.field.rows import NOT_YET, PATCHED, ROWS, Row

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "field-failures.md"


def test_the_page_is_generated_from_the_rows() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), f"docs/field-failures.md is stale; run: {COMMAND}"


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_a_row_names_its_sources_and_tests_that_exist(row: Row) -> None:
    assert row.sources and all(s.ref and s.says for s in row.sources)
    if row.status == NOT_YET:
        return
    assert row.reproduced and row.stock and row.npu_compat and row.tests
    for node in row.tests:
        file, name = node.split("::")
        assert name.split("[")[0] in _functions(REPO / file), f"{row.id}: no test {node}"


def test_a_patched_row_names_a_patch_of_the_catalogue() -> None:
    from npu_compat import _catalog

    ids = {spec.id for spec in _catalog.SPECS}
    named = [(r.id, h) for r in ROWS if r.status == PATCHED for h in r.handled_by.split(", ")]
    assert [(row, h) for row, h in named if h not in ids] == []
