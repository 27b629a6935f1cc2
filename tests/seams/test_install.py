"""A real install of the checkout into a fresh venv: the .pth and the sitecustomize land and work.

Skipped when ``uv`` is not on PATH or cannot build offline (it needs setuptools in its cache).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import PROBE, REPO, child_env, last_json, run

USER_SITECUSTOMIZE = """
import os
with open(os.environ["USER_SC_LOG"], "a") as f:
    f.write(str(os.getpid()) + "\\n")
"""


def _install(root: Path, *how: str) -> Path:
    """A fresh venv at ``root`` with the checkout installed (``how``: e.g. ``-e`` for editable)."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv on PATH to build a fresh venv")
    made = subprocess.run(
        [uv, "venv", "-q", "-p", sys.executable, str(root)], capture_output=True, text=True, timeout=120
    )
    if made.returncode != 0:
        pytest.skip(f"uv venv failed: {made.stderr.strip()[-300:]}")
    python = root / "bin" / "python"
    inst = subprocess.run(
        [uv, "pip", "install", "-q", "--offline", "--no-deps", "--python", str(python), *how, str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if inst.returncode != 0:
        pytest.skip(f"cannot build the checkout offline: {inst.stderr.strip()[-300:]}")
    return root


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield _install(tmp_path_factory.mktemp("venv") / "v")


def _site(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = child_env(pythonpath=[])
    env.pop("PYTHONPATH")  # the venv alone, not the checkout
    env.update(extra or {})
    return env


def test_the_wheel_puts_the_bootstrap_at_the_top_of_site_packages(venv: Path) -> None:
    site = _site(venv)
    assert (
        site / "npu_compat.pth"
    ).read_text().strip() == "import _npu_compat_precheck; _npu_compat_precheck.from_pth()"
    boot = (REPO / "_npu_compat_precheck.py").read_bytes()
    for copy in ("_npu_compat_precheck.py", "npu_compat/_launcher_site/sitecustomize.py"):
        assert not (site / copy).is_symlink() and (site / copy).read_bytes() == boot
    assert (site / "sitecustomize.py").read_bytes() == (REPO / "sitecustomize.py").read_bytes()
    eps = run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "from importlib.metadata import entry_points as e; "
            "print(sorted(p.value for g in ('console_scripts', 'vllm.general_plugins') for p in e(group=g)))",
        ],
        _env(),
    )
    assert eps.stdout.strip() == repr(["npu_compat.__main__:main", "npu_compat._seams:vllm_plugin"])


def test_an_installed_interpreter_activates_through_the_pth_first(venv: Path) -> None:
    out = last_json(run([str(venv / "bin" / "python"), "-c", PROBE], _env({"NPU_COMPAT_DEVICE": "npu"})))
    assert out["triggers"] == [".pth", "sitecustomize"]  # type: ignore[index]
    assert out["started"] == ".pth" and out["active"]  # type: ignore[index]
    assert str(out["npu_compat_file"]).startswith(str(_site(venv)))  # type: ignore[index]


def test_an_editable_install_activates_through_the_pth_too(tmp_path: Path) -> None:
    """``pip install -e``: setuptools' editable wheel carries our .pth beside its own finder's."""
    editable = _install(tmp_path / "e", "-e")
    assert (_site(editable) / "npu_compat.pth").is_file()
    out = last_json(
        run([str(editable / "bin" / "python"), "-I", "-c", PROBE], _env({"NPU_COMPAT_DEVICE": "npu"}))
    )
    assert out["started"] == ".pth" and out["active"]  # type: ignore[index]
    assert str(out["npu_compat_file"]).startswith(str(REPO / "npu_compat"))  # type: ignore[index]


def test_isolated_mode_still_activates(venv: Path) -> None:
    out = last_json(
        run([str(venv / "bin" / "python"), "-I", "-c", PROBE], _env({"NPU_COMPAT_DEVICE": "npu"}))
    )
    assert out["started"] == ".pth" and out["active"]  # type: ignore[index]


def test_a_shadowing_sitecustomize_runs_once_and_the_pth_still_activates(venv: Path, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    log = tmp_path / "log"
    env = _env({"NPU_COMPAT_DEVICE": "npu", "USER_SC_LOG": str(log), "PYTHONPATH": str(tmp_path)})
    out = last_json(run([str(venv / "bin" / "python"), "-c", PROBE], env))
    assert out["triggers"] == [".pth"] and out["active"]  # type: ignore[index]
    assert log.read_text().split() == [str(out["pid"])]  # type: ignore[index]


def test_the_no_op_path_loads_no_module_of_the_package(venv: Path) -> None:
    out = last_json(run([str(venv / "bin" / "python"), "-c", PROBE], _env()))
    assert out["loaded"] == [] and out["started"] is None  # type: ignore[index]


def test_the_console_script_launches(venv: Path) -> None:
    out = last_json(
        run(
            [str(venv / "bin" / "npu-compat"), "--device", "npu", str(venv / "bin" / "python"), "-c", PROBE],
            _env(),
        )
    )
    assert out["active"] and out["triggers"] == [".pth", "launcher", "sitecustomize"]  # type: ignore[index]


def test_a_wheel_built_from_the_sdist_still_ships_the_pth(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv on PATH")
    sdist = subprocess.run(
        [uv, "build", "-q", "--offline", "--sdist", "-o", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if sdist.returncode != 0:
        pytest.skip(f"cannot build offline: {sdist.stderr.strip()[-300:]}")
    (archive,) = tmp_path.glob("*.tar.gz")
    wheel = subprocess.run(
        [uv, "build", "-q", "--offline", "--wheel", "-o", str(tmp_path), str(archive)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wheel.returncode == 0, wheel.stderr
    import zipfile

    (built,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(built).namelist()
    for top in (
        "npu_compat.pth",
        "_npu_compat_precheck.py",
        "sitecustomize.py",
        "npu_compat/_launcher_site/sitecustomize.py",
    ):
        assert top in names
