"""The documentation stays true to the code: the generated patch reference matches the catalogue,
every relative link of the README and of ``docs/`` leads somewhere, and every variable npu-compat owns
is in the README's table.

Read from the repository checkout (the tests run from its root); stdlib and pytest only.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from npu_compat import _env
from npu_compat._catalog import SPECS
from npu_compat.tools import catalogdoc

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PATCH_PAGE = REPO / "docs" / "patches.md"


def _pages() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "findings").glob("*.md"))]


# -- the patch reference ------------------------------------------------------------------------------


def test_the_patch_reference_is_generated_from_the_current_catalogue() -> None:
    page = PATCH_PAGE.read_text(encoding="utf-8") if PATCH_PAGE.exists() else ""
    expected = catalogdoc.render()
    if page != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    page.splitlines(keepends=True),
                    expected.splitlines(keepends=True),
                    "docs/patches.md (in the repository)",
                    "docs/patches.md (from the catalogue)",
                )
            )[:60]
        )
        raise AssertionError(
            "docs/patches.md is stale: the catalogue (npu_compat/_catalog.py) or its renderer changed. "
            f"Regenerate it from the repository root with:\n\n    {catalogdoc.COMMAND}\n\n{diff}"
        )


def test_the_regeneration_command_is_the_one_the_page_and_the_readme_name() -> None:
    assert catalogdoc.COMMAND == "python -m npu_compat.tools.catalogdoc > docs/patches.md"
    assert catalogdoc.COMMAND in catalogdoc.render()
    assert catalogdoc.COMMAND in README.read_text(encoding="utf-8")


def test_every_patch_has_its_section_with_target_versions_and_reasons() -> None:
    page = catalogdoc.render()
    sections = re.split(r"(?m)^### ", page)[1:]
    by_id = {section.split("\n", 1)[0].strip("`"): section for section in sections}
    assert len(sections) == len(SPECS)
    assert sorted(by_id) == sorted(spec.id for spec in SPECS)
    for spec in SPECS:
        section = by_id[spec.id]
        assert f"`{spec.target}`" in section, spec.id
        assert f"`{spec.distribution}` `{spec.versions}`" in section, spec.id
        for text in (spec.why, spec.upstream_fix, spec.remove_when):
            assert text in section, (spec.id, text)


def test_a_table_cell_cannot_be_split_by_a_bar_in_the_catalogue() -> None:
    from npu_compat._spec import PatchSpec

    spec = PatchSpec("x.y", "m:a|b", distribution="d", versions=">=1", why="w", wrapper="p:f")
    row = next(line for line in catalogdoc.render((spec,), frozenset()).splitlines() if "m:a" in line)
    assert "`m:a\\|b`" in row
    assert row.count(" | ") == 2


# -- links ------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_CODE = re.compile(r"`[^`\n]*`")
_INLINE_LINK = re.compile(r"\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_REFERENCE_LINK = re.compile(r"(?m)^\s{0,3}\[[^\]]+\]:\s+(\S+)")


def _prose(text: str) -> str:
    """``text`` without code blocks, code spans and comments: what a link can be in."""
    return _CODE.sub("code", _COMMENT.sub("", _FENCE.sub("", text)))


def _anchors(path: Path) -> set[str]:
    """The fragments GitHub gives the headings of the Markdown file ``path``."""
    found: set[str] = set()
    for line in _FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1)).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def broken_links(pages: list[Path]) -> list[str]:
    """``page: target (why)`` for every relative link of ``pages`` whose file or heading is missing."""
    broken = []
    for page in pages:
        prose = _prose(page.read_text(encoding="utf-8"))
        for target in [*_INLINE_LINK.findall(prose), *_REFERENCE_LINK.findall(prose)]:
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:
            file_part, _, fragment = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no heading #{fragment} in {dest.name})")
    return broken


def test_every_relative_link_of_the_readme_and_the_docs_leads_somewhere() -> None:
    pages = _pages()
    assert {page.name for page in pages} >= {"README.md", "patches.md", "design.md", "testing.md"}
    linked = sum(len(_INLINE_LINK.findall(_prose(page.read_text(encoding="utf-8")))) for page in pages)
    assert linked > 20  # the pattern still finds this project's links
    assert broken_links(pages) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B page\n\n## The `x` part: one\n")
    page = tmp_path / "a.md"
    page.write_text(
        "# A\n\nGood: [b](docs/b.md), [part](docs/b.md#the-x-part-one), [here](#a), [web](https://x.org/n).\n"
        "Bad: [gone](docs/gone.md) and [heading](docs/b.md#nowhere) and [self](#missing).\n\n"
        "```\n[in code](not/checked.md)\n```\n`[span](not/checked.md)`\n\n[ref]: docs/also-gone.md\n"
    )
    assert broken_links([page]) == [
        "a.md: docs/gone.md (no such file)",
        "a.md: docs/b.md#nowhere (no heading #nowhere in b.md)",
        "a.md: #missing (no heading #missing in a.md)",
        "a.md: docs/also-gone.md (no such file)",
    ]


# -- environment variables --------------------------------------------------------------------------


def _owned_names() -> set[str]:
    return {
        value
        for name, value in vars(_env).items()
        if name.isupper() and isinstance(value, str) and value.startswith(_env.PREFIX)
    }


def _readme_table_names() -> set[str]:
    section = README.read_text(encoding="utf-8").split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"(?m)^\| `([A-Z][A-Z0-9_]*)` \|", section))


def test_every_variable_npu_compat_owns_is_in_the_readme_table() -> None:
    owned = _owned_names()
    assert {"NPU_COMPAT", "NPU_COMPAT_DEVICE", "NPU_COMPAT_REPORT_DIR"} <= owned
    missing = sorted(owned - _readme_table_names())
    assert missing == [], f"add a row for each to the README's Environment variables table: {missing}"


def test_the_readme_and_the_docs_name_no_variable_that_npu_compat_does_not_have() -> None:
    owned = _owned_names()
    named = set()
    for page in _pages():
        named |= set(re.findall(r"\bNPU_COMPAT(?:_[A-Z0-9]+)*\b", page.read_text(encoding="utf-8")))
    assert named >= {"NPU_COMPAT_STRICT", "NPU_COMPAT_SIMULATE"}
    unknown = sorted(named - owned - set(_env.RETIRED))
    assert unknown == [], f"named in README.md or docs/ but not defined in npu_compat/_env.py: {unknown}"


def test_a_retired_variable_is_out_of_the_table_and_the_readme_says_it_is_no_longer_read() -> None:
    readme = README.read_text(encoding="utf-8")
    assert _env.RETIRED and not set(_env.RETIRED) & _readme_table_names()
    for name in _env.RETIRED:
        assert f"`{name}` is no longer read" in readme, name
        assert name in " ".join(_env.value_problems({name: "1"})), name
