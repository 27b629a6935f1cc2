"""``python -m npu_compat check``: each verdict on synthesized releases (a wheel, an sdist, a source
tree), the exit status, the requirements the stacks do not pin; on a stack, the installed packages
and a copy of the installed trinity-rft with its target renamed; and (``beyond_ci``) a downloaded wheel.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from npu_compat._spec import PatchSpec
from npu_compat.doctor import check, source

from .conftest import child_env, run

DIST = "demo-dist"


def _spec(id: str, target: str, **kw: list[str]) -> PatchSpec:
    return PatchSpec(id, target, distribution=DIST, versions=">=1,<2", wrapper="x:y", why="a test", **kw)


SPECS = (
    _spec("demo.func", "demo.mod:func", expects=["backend"], copies=["demo.user"]),
    _spec("demo.method", "demo.mod:Klass.method"),
    _spec("demo.inherited", "demo.mod:Child.method"),
    _spec("demo.global", "demo.mod:torch"),
)

GOOD = {
    "demo/__init__.py": "",
    "demo/mod.py": (
        "import torch\n"
        "def func(backend=None, *, device_id=None):\n    pass\n"
        "class Klass:\n    def method(self):\n        pass\n"
        "class Child(Klass):\n    pass\n"
    ),
    "demo/user.py": "from demo.mod import func\n",
}


def _metadata(name: str, version: str, requires: tuple[str, ...]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    return "\n".join(lines + [f"Requires-Dist: {r}" for r in requires]) + "\n"


def make(
    kind: str,
    where: Path,
    files: dict[str, str],
    version: str = "1.0",
    name: str = DIST,
    requires: tuple[str, ...] = (),
) -> Path:
    """A release of ``files`` as a wheel, an sdist (``src/`` layout) or an unpacked source tree."""
    meta = _metadata(name, version, requires)
    stem = f"{name.replace('-', '_')}-{version}"
    if kind == "wheel":
        path = where / f"{stem}-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as zf:
            for rel, text in files.items():
                zf.writestr(rel, text)
            zf.writestr(f"{stem}.dist-info/METADATA", meta)
        return path
    if kind == "sdist":
        path = where / f"{stem}.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            for rel, text in {**{f"src/{k}": v for k, v in files.items()}, "PKG-INFO": meta}.items():
                data = text.encode()
                info = tarfile.TarInfo(f"{stem}/{rel}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path
    tree = where / stem
    deps = ", ".join(f'"{r}"' for r in requires)
    pyproject = f'[project]\nname = "{name}"\nversion = "{version}"\ndependencies = [{deps}]\n'
    for rel, text in {**files, "pyproject.toml": pyproject}.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return tree


def verdicts(path: Path) -> dict[str, tuple[str, str]]:
    checked = check.check_artifact(source.open_artifact(path), SPECS, pins={})
    return {row.patch: (row.verdict, row.detail) for row in checked.rows}


@pytest.fixture(params=["wheel", "sdist", "tree"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_in_range_and_as_declared_is_ok(kind: str, tmp_path: Path) -> None:
    found = verdicts(make(kind, tmp_path, GOOD))
    assert {p: v for p, (v, _) in found.items()} == dict.fromkeys(
        ("demo.func", "demo.method", "demo.inherited", "demo.global"), "ok"
    )


def test_out_of_range_still_matching_says_so(kind: str, tmp_path: Path) -> None:
    found = verdicts(make(kind, tmp_path, GOOD, version="2.0"))
    assert found["demo.func"] == ("out of range, still matches", "2.0 is outside >=1,<2")


def test_out_of_range_and_changed_says_what_changed(kind: str, tmp_path: Path) -> None:
    files = {**GOOD, "demo/mod.py": "import torch\nclass Klass:\n    pass\n"}
    found = verdicts(make(kind, tmp_path, files, version="2.0"))
    verdict, detail = found["demo.func"]
    assert verdict == "out of range"
    assert "2.0 is outside >=1,<2" in detail and "demo.mod has no func" in detail


def test_a_target_defined_elsewhere_is_moved_and_named(kind: str, tmp_path: Path) -> None:
    files = {
        **GOOD,
        "demo/mod.py": GOOD["demo/mod.py"].replace("def func(", "def _gone("),
        "demo/other.py": "def func(backend=None):\n    pass\n",
    }
    verdict, detail = verdicts(make(kind, tmp_path, files))["demo.func"]
    assert verdict == "moved"
    assert "demo.mod has no func" in detail and "func is defined in demo.other" in detail


def test_a_from_copy_bound_under_another_name_is_moved(kind: str, tmp_path: Path) -> None:
    files = {**GOOD, "demo/user.py": "from demo.mod import func as init_group\n"}
    verdict, detail = verdicts(make(kind, tmp_path, files))["demo.func"]
    assert verdict == "moved"
    assert "demo.user:func is now bound as init_group" in detail


def test_a_renamed_target_is_broken_with_its_name(kind: str, tmp_path: Path) -> None:
    files = {**GOOD, "demo/mod.py": GOOD["demo/mod.py"].replace("def func(", "def funcs(")}
    verdict, detail = verdicts(make(kind, tmp_path, files))["demo.func"]
    assert verdict == "broken"
    assert detail == "demo.mod has no func (close: funcs)"


def test_a_parameter_gone_is_broken_with_the_signature(kind: str, tmp_path: Path) -> None:
    files = {**GOOD, "demo/mod.py": GOOD["demo/mod.py"].replace("backend=None, ", "")}
    verdict, detail = verdicts(make(kind, tmp_path, files))["demo.func"]
    assert verdict == "broken"
    assert detail == "demo.mod:func no longer accepts backend: func(*, device_id=None)"


def test_a_method_gone_and_a_module_gone_are_broken(kind: str, tmp_path: Path) -> None:
    files = {**GOOD, "demo/mod.py": GOOD["demo/mod.py"].replace("def method(self)", "def run(self)")}
    found = verdicts(make(kind, tmp_path, files))
    assert found["demo.method"] == ("broken", "demo.mod:Klass has no method")
    # Child inherits from Klass, which no longer has it either
    assert found["demo.inherited"][0] == "broken"
    files = {k: v for k, v in GOOD.items() if k != "demo/mod.py"}
    (tmp_path / "gone").mkdir()
    assert verdicts(make(kind, tmp_path / "gone", files))["demo.global"] == (
        "broken",
        "demo.mod is not in it",
    )


def test_the_requirements_no_stack_satisfies_are_named(tmp_path: Path) -> None:
    pins = check.stack_pins()
    assert pins["trinity-rft"] == {
        "a-trinity-0.6.0_verl-0.8.0": "0.6.0",
        "b-trinity-0.6.0_verl-0.7.1": "0.6.0",
        "c-trinity-0.5.2_verl-0.7.1": "0.5.2",
    }
    requires = ("transformers>=5.25", "packaging", "brand-new-thing", 'gone; extra == "x"', "wrapt>=2")
    artifact = source.open_artifact(make("wheel", tmp_path, GOOD, requires=requires))
    assert check.check_artifact(artifact, SPECS).unpinned == [
        "transformers>=5.25 (the stacks pin 5.22.2 (a, b), 4.57.6 (c))",
        "brand-new-thing (no stack pins brand-new-thing)",
    ]


VERL_CONFIG = (
    "import collections\nfrom dataclasses import dataclass, field\n"
    "class BaseConfig(collections.abc.Mapping):\n    pass\n"
    "@dataclass\nclass CheckpointConfig(BaseConfig):\n    save_contents: list = None\n{extra}"
)


@pytest.mark.parametrize("accepts", [True, False])
def test_a_release_that_breaks_an_upstream_pair_on_every_device_is_broken_naming_the_pair(
    accepts: bool, tmp_path: Path
) -> None:
    """verl 0.9's CheckpointConfig lost ``mbridge_config``, which Trinity 0.6 always passes: checked beside
    that trinity-rft, the verl release is ``broken`` (exit 1) with the pair, the cause and the fix."""
    extra = "    mbridge_config: dict = None\n" if accepts else ""
    verl = make(
        "wheel",
        tmp_path,
        {"verl/__init__.py": "", "verl/trainer/config/config.py": VERL_CONFIG.format(extra=extra)},
        version="0.9.1",
        name="verl",
    )
    trinity = make("wheel", tmp_path, {"trinity/__init__.py": ""}, version="0.6.0", name="trinity-rft")
    proc = _cli(str(verl), str(trinity), "--json")
    rows = [r for a in json.loads(proc.stdout)["artifacts"] for r in a["rows"] if "mbridge" in r["patch"]]
    if accepts:
        assert rows == []
        return
    assert proc.returncode == 1
    assert [r["verdict"] for r in rows] == ["broken"]
    assert rows[0]["detail"].startswith(
        "trinity-rft 0.6.0 cannot run on verl 0.9.1 on any device: "
        "verl.trainer.config.config:CheckpointConfig has no mbridge_config"
    )
    assert "Fix: install verl 0.8.0" in rows[0]["detail"]
    # a trinity-rft outside the pair's range: nothing to say
    (tmp_path / "later").mkdir()
    later = make(
        "wheel", tmp_path / "later", {"trinity/__init__.py": ""}, version="0.7.0", name="trinity-rft"
    )
    proc = _cli(str(verl), str(later), "--json")
    assert not [r for a in json.loads(proc.stdout)["artifacts"] for r in a["rows"] if "mbridge" in r["patch"]]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "npu_compat", "check", *args], child_env(), check=False)


def test_the_command_exits_1_on_a_broken_release_and_0_on_one_it_does_not_patch(tmp_path: Path) -> None:
    # the real catalogue: a trinity-rft 0.6.0 of one module, so every other target is gone
    broken = make("wheel", tmp_path, {"trinity/__init__.py": ""}, version="0.6.0", name="trinity-rft")
    proc = _cli(str(broken), "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    rows = {r["patch"]: r for r in out["artifacts"][0]["rows"]}
    assert rows["trinity.vllm.worker_cls"]["verdict"] == "broken"
    assert rows["trinity.vllm.worker_cls"]["detail"] == "trinity.common.models.vllm_worker is not in it"
    assert rows["trinity.vllm_worker.cuda"]["verdict"] == "out of range"  # 0.5.2's only
    assert not out["ok"]
    other = make("wheel", tmp_path, {"other/__init__.py": ""}, name="other-dist")
    proc = _cli(str(other))
    assert proc.returncode == 0 and "no patch of npu-compat targets it" in proc.stdout


def test_an_unreadable_artifact_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("")
    proc = _cli(str(tmp_path / "x.txt"))
    assert proc.returncode == 2 and "is not a wheel" in proc.stderr


# -- on a stack: the installed packages, and a copy of the installed trinity-rft -----------------


def _installed_or_skip(dist: str) -> importlib.metadata.Distribution:
    try:
        return importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed here (the stack sessions install it)")


@pytest.mark.upstream
@pytest.mark.uses_verl  # the verdict on verl's patch turns on the stack's verl (stack-b differs in it alone)
def test_the_installed_stack_is_ok_everywhere_in_range() -> None:
    _installed_or_skip("trinity-rft")
    verl = source.installed("verl")
    if verl is not None and check.broken_contracts(
        verl, {"trinity-rft": importlib.metadata.version("trinity-rft")}
    ):
        pytest.skip(
            "this stack is a pair broken on every device (stack d): tests/upstream/test_trinity_verl_pair.py"
        )
    proc = _cli("--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["ok"], proc.stdout
    checked = {a["distribution"]: a for a in out["artifacts"]}
    assert set(checked) >= {"trinity-rft", "ray", "torch"}
    for artifact in checked.values():
        for row in artifact["rows"]:
            assert row["verdict"] in ("ok", "out of range", "out of range, still matches"), row


def _copy_of_installed(dist: str, where: Path, edit: tuple[str, str, str] | None = None) -> Path:
    """A wheel of ``dist``'s installed Python files and metadata; ``edit`` = (path, old, new)."""
    found = _installed_or_skip(dist)
    path = where / f"{dist.replace('-', '_')}-{found.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for f in found.files or ():
            name = str(f)
            if not (name.endswith(".py") or name.endswith(".dist-info/METADATA")):
                continue
            text = Path(str(f.locate())).read_text(encoding="utf-8")
            if edit is not None and name == edit[0]:
                assert edit[1] in text
                text = text.replace(edit[1], edit[2])
            zf.writestr(name, text)
    return path


@pytest.mark.upstream
def test_a_renamed_target_in_a_copied_trinity_wheel_is_broken_and_exit_1(tmp_path: Path) -> None:
    same = _copy_of_installed("trinity-rft", tmp_path)
    started = time.monotonic()
    proc = _cli(str(same))
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout
    # a target of both Trinity releases (0.5.2 and 0.6.0), renamed
    edit = ("trinity/utils/distributed.py", "def init_process_group(", "def init_process_groups(")
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    proc = _cli(str(_copy_of_installed("trinity-rft", renamed, edit)))
    assert proc.returncode == 1
    shown = proc.stdout.splitlines()
    line = next(i for i, text in enumerate(shown) if "trinity.distributed.init_process_group " in text)
    assert shown[line].split()[0] == "broken"
    assert (
        "trinity.utils.distributed has no init_process_group (close: init_process_groups" in shown[line + 1]
    )
    print(f"check of a copy of the installed trinity-rft: {took:.2f} s (the goal: under 5 s)")


# -- a real release, downloaded --------------------------------------------------------------------


@pytest.mark.beyond_ci
def test_a_downloaded_trinity_wheel_is_checked_in_under_5_s(tmp_path: Path) -> None:
    import importlib.util

    pip_cmd = [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else None
    if pip_cmd is None:
        found = shutil.which("pip3") or shutil.which("pip")
        if found is None:
            pytest.skip("no pip here to download the wheel")
        pip_cmd = [found]
    pip = [*pip_cmd, "download", "--no-deps", "-q", "-d", str(tmp_path), "trinity-rft==0.6.0"]
    got = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        pytest.skip(f"trinity-rft 0.6.0 could not be downloaded: {got.stderr.strip()[-300:]}")
    wheel = next(tmp_path.glob("*.whl"))
    started = time.monotonic()
    proc = _cli(str(wheel), "--json")
    took = time.monotonic() - started
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["ok"], proc.stdout
    rows = out["artifacts"][0]["rows"]
    assert {r["verdict"] for r in rows if r["patch"] == "trinity.vllm.worker_cls"} == {"ok"}
    assert took < 5, f"check took {took:.1f} s"
