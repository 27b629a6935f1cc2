"""A user's machine: a fresh venv with npu-compat installed from its built wheel, nothing from here.

The venv holds the distributions of the stack under test (as ``uv pip freeze`` lists them, npu-compat
left out) and the wheel built from this checkout.  Its processes run from an empty directory with
an environment that names neither this checkout nor npu-compat's settings, so what they can use is
what a user who ran ``pip install npu-compat`` next to their stack has: the documented API.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO


def _find_links() -> list[str]:
    """The local wheels pip is configured with (the CPU build of torch): uv does not read pip's configuration."""
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if not links and shutil.which("pip"):
        out = subprocess.run(["pip", "config", "get", "global.find-links"], capture_output=True, text=True)
        links = out.stdout.split() if out.returncode == 0 else []
    return [arg for link in links for arg in ("--find-links", link)]


@pytest.fixture(scope="session")
def user_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The interpreter of the user's venv."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv to build the wheel and the venv (the README's test command installs it)")
    root = tmp_path_factory.mktemp("user")
    run = {"check": True, "capture_output": True, "text": True, "timeout": 900}
    subprocess.run([uv, "build", "--wheel", "--out-dir", str(root / "dist"), str(REPO)], **run)  # type: ignore[call-overload]
    (wheel,) = (root / "dist").glob("npu_compat-*.whl")
    subprocess.run([uv, "venv", str(root / "venv"), "--python", sys.executable], **run)  # type: ignore[call-overload]
    python = root / "venv" / "bin" / "python"
    frozen = subprocess.run([uv, "pip", "freeze", "--python", sys.executable], **run)  # type: ignore[call-overload]
    pins = [line for line in frozen.stdout.splitlines() if line and not line.lower().startswith("npu-compat")]
    (root / "stack.txt").write_text("\n".join(pins) + "\n")
    subprocess.run(
        [uv, "pip", "install", "--python", str(python), "--no-deps", "-r", str(root / "stack.txt"), str(wheel),
         *_find_links(), "--index-strategy", "unsafe-best-match"],
        **run,
    )  # type: ignore[call-overload]  # fmt: skip
    # the README's recipe: the released vllm-ascend that the simulated host runs, laid out from the registry
    if importlib.util.find_spec("vllm") is not None:
        subprocess.run([str(python), "-m", "npu_compat.testing", "vllm-ascend"], env=user_env(python), **run)  # type: ignore[call-overload]
    yield python


def user_env(python: Path, **extra: str) -> dict[str, str]:
    """A user's shell in that venv: no PYTHONPATH, none of npu-compat's or Ray's settings of this run."""
    drop = (
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "RAY_ADDRESS",
        "RAY_AUTH_MODE",
        "RAY_AUTH_TOKEN",
        "RAY_AUTH_TOKEN_PATH",
    )
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("NPU_COMPAT")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def dotenv(path: Path) -> dict[str, str]:
    """The ``NAME=VALUE`` lines of ``path``."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {name: value for name, value in pairs}
