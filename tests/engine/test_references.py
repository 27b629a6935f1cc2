"""Every reason is inside the repository: ``tools/check_references.py`` finds no citation of this
project's issue numbers and no path outside the repository.  Stdlib and pytest only."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "check_references.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_references", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="lists its files with git: needs a git checkout")
def test_the_repository_cites_no_issue_and_no_path_outside_it() -> None:
    proc = subprocess.run([sys.executable, str(TOOL)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"state the reason where it is used:\n{proc.stdout}{proc.stderr}"


def test_the_check_finds_an_issue_number_and_a_path_outside() -> None:
    tool = _tool()
    # built from pieces, so that this file passes its own check
    issue, outside = "(iss" + "ue 5)", "../sha" + "red/notes.md"
    text = (
        f"fine\n# -- torch.distributed {issue} --\nsee {outside}\nvllm-project/vllm-ascend#16322\n/tmp/ray\n"
    )
    assert tool.check("a.py", text) == [
        f"a.py:2: # -- torch.distributed {issue} --",
        f"a.py:3: see {outside}",
    ]
