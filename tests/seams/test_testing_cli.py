"""``python -m npu_compat.testing``, where it has nothing to start: the cluster without Ray says so."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import clean_env


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is not None or shutil.which("ray") is not None,
    reason="Ray is installed here: the stack sessions start real clusters (tests/user)",
)
def test_the_cluster_without_ray_says_what_is_missing_and_leaves_nothing() -> None:
    before = set(Path(tempfile.gettempdir()).glob("ncray-*"))
    proc = subprocess.run([sys.executable, "-m", "npu_compat.testing", "cluster", "--timeout", "5"],
                          env=clean_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "the cluster needs Ray installed" in proc.stderr and "Traceback" not in proc.stderr
    assert set(Path(tempfile.gettempdir()).glob("ncray-*")) == before
