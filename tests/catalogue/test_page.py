"""The break map: its page is current, its ids follow one scheme, and what a row names exists.

Reads the rows, the catalogue of patches and ``probes.py``'s source; imports no upstream package.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.catalogue.page import COMMAND, render
from tests.catalogue.rows import ROWS, Row

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "break-map.md"
PROBES = Path(__file__).with_name("probes.py")


def test_the_page_is_generated_from_the_rows() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), f"docs/break-map.md is stale; run: {COMMAND}"


def test_every_patch_a_row_names_is_in_the_catalogue() -> None:
    from npu_compat._catalog import SPECS

    ids = {spec.id for spec in SPECS}
    assert [(row.id, p) for row in ROWS for p in row.patches if p not in ids] == []


def test_ids_are_unique_and_follow_the_release() -> None:
    assert len({row.id for row in ROWS}) == len(ROWS)
    release = {"A": "0.6.0", "B": "0.5.2"}
    for row in ROWS:
        assert re.fullmatch(r"[ABN][1-9]\d*", row.id), row.id
        assert row.trinity == release.get(row.id[0], row.trinity), row.id
        assert row.trainer == "any" or row.trinity == "0.6.0", row.id


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_a_row_says_where_what_and_how_it_is_driven(row: Row) -> None:
    assert row.severity in {"HANG", "CRASH", "WRONG", "OK"}
    assert row.trainer in {"any", "verl>=0.8", "verl<0.8"}
    assert re.fullmatch(r"[a-z_][\w.]*:[A-Za-z_][\w.]*", row.where), f"not module:qualname: {row.where}"
    assert row.breaks.endswith(".") and row.breaks.count(". ") == 0, "one sentence"
    assert row.patches or row.severity == "OK"
    assert row.probed != bool(row.elsewhere), "a probe, or where the row is driven instead"
    for path in re.findall(r"tests/[\w/]+\.py", row.elsewhere):
        assert (REPO / path).is_file(), f"{row.id}: no {path}"


def _probe_names() -> set[str]:
    tree = ast.parse(PROBES.read_text(encoding="utf-8"))
    names = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    names |= {
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    return {name.removeprefix("probe_") for name in names if name.startswith("probe_")}


def test_every_probe_has_its_row_and_every_probed_row_its_probe() -> None:
    assert _probe_names() == {row.probe for row in ROWS if row.probed}
