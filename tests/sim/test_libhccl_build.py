"""Building the ``libhccl.so`` stand-in: where it cannot be built, the words say why (no compiler, or the
compiler's own error), and a simulated host goes on without it, as a host without CANN's library does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env

pytestmark = pytest.mark.same_on_every_stack  # the Python headers and a compiler: no upstream package

BUILD = "from npu_compat.testing._npu_backend import libhccl\nprint(libhccl())\n"


def _build(tmp_path: Path, cxx: str) -> subprocess.CompletedProcess[str]:
    env = clean_env({"NPU_COMPAT_SIMULATE_BUILD_DIR": str(tmp_path / "cache"), "CXX": cxx})
    return subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True, text=True, timeout=120)


def test_without_a_compiler_the_error_says_to_install_one(tmp_path: Path) -> None:
    proc = _build(tmp_path, str(tmp_path / "no-such-c++"))
    assert proc.returncode != 0
    assert (
        "RuntimeError: simulated Ascend: building the libhccl.so stand-in needs a C++ compiler" in proc.stderr
    )
    assert "install one (g++ or clang++) or name it in CXX" in proc.stderr


def test_a_failing_compiler_is_quoted(tmp_path: Path) -> None:
    failing = tmp_path / "cxx"
    failing.write_text(
        "#!/bin/sh\necho 'cc1plus: fatal error: Python.h: No such file or directory' >&2\nexit 1\n"
    )
    failing.chmod(0o755)
    proc = _build(tmp_path, str(failing))
    assert proc.returncode != 0
    assert "failed to build the libhccl.so stand-in (exit 1)" in proc.stderr
    assert "cc1plus: fatal error: Python.h: No such file or directory" in proc.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="the simulated Ascend is a Linux host")
def test_a_simulated_host_goes_on_without_it_and_says_so(tmp_path: Path) -> None:
    code = (
        "import warnings\nwarnings.simplefilter('always')\n"
        "from npu_compat.testing import simulation_env\nenv = simulation_env(1, {})\n"
        "print('LD', env.get('LD_LIBRARY_PATH', ''))\n"
    )
    env = clean_env({"NPU_COMPAT_SIMULATE_BUILD_DIR": str(tmp_path / "cache"), "CXX": str(tmp_path / "none")})
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "libhccl.so failed to build" in proc.stderr and "needs a C++ compiler" in proc.stderr
    assert "libhccl" not in proc.stdout.split("LD", 1)[1]
