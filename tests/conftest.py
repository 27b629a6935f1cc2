"""Shared helpers: fresh interpreters, and a synthetic upstream package for the engine tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from npu_compat.testing._ray import _free_port
from npu_compat.testing._sites import sites

pytest_plugins = ["npu_compat.testing.pytest_plugin"]

REPO = Path(__file__).resolve().parents[1]

#: What a simulated child puts first on its path, as ``simulation_env`` does: the stand-ins and the
#: vllm-ascend distribution of the installed vLLM's flavour (a whole simulated Ascend host).
SIM_PATH = [str(p) for p in sites({})]

#: A TCP port on 127.0.0.1 that was free a moment ago (process groups, stores): the Ray fixture's own helper.
free_port = _free_port


#: Variables that would change a child's device decision; cleared for every child.
DECISION_VARS = (
    "NPU_COMPAT",
    "NPU_COMPAT_DEVICE",
    "TRINITY_DEVICE",
    "NPU_COMPAT_STRICT",
    "NPU_COMPAT_DISABLE",
    "NPU_COMPAT_REPORT_DIR",
    "NPU_COMPAT_SIMULATE",
    "NPU_COMPAT_AUTO",
    "ASCEND_RT_VISIBLE_DEVICES",
    "ASCEND_TOOLKIT_HOME",
    "ASCEND_HOME_PATH",
)


def upstream_versions(*distributions: str) -> tuple[str, ...]:
    """The installed versions of ``distributions``; where one is missing, a skip of the calling module
    (call it at a test module's top level) naming them."""
    try:
        return tuple(metadata.version(d) for d in distributions)
    except metadata.PackageNotFoundError:
        pytest.skip(
            f"needs {' and '.join(distributions)} (installed by the upstream stack sessions)",
            allow_module_level=True,
        )


def trinity_or_skip(releases: tuple[str, ...], what: str) -> str:
    """The installed trinity-rft's version where it starts with one of ``releases``; else a skip of the
    calling module saying ``what`` is checked with and what was found."""
    (trinity,) = upstream_versions("trinity-rft")
    if not trinity.startswith(releases):
        pytest.skip(f"{what}, found {trinity}", allow_module_level=True)
    return trinity


def beyond_ci_where(condition: bool) -> Any:
    """``beyond_ci`` (left out of CI for time, docs/testing.md "What each stack runs") on the stacks where
    ``condition``; nothing elsewhere."""
    return pytest.mark.beyond_ci if condition else (lambda test: test)


def clean_env(extra: dict[str, str] | None = None, pythonpath: list[str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DECISION_VARS}
    paths = [*(pythonpath or []), str(REPO)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # Children activate explicitly (or not at all): an installed npu-compat, or the repository's
    # own sitecustomize on PYTHONPATH, would otherwise activate at interpreter start.  Tests of
    # auto-activation itself pass NPU_COMPAT_AUTO=1.
    env["NPU_COMPAT_AUTO"] = "0"
    env.update(extra or {})
    return env


def run_py(
    code: str,
    *,
    env: dict[str, str] | None = None,
    pythonpath: list[str] | None = None,
    timeout: float = 60,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; the child's environment has no device settings but ``env``."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env(env, pythonpath),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_ranks(script: str, env: dict[str, str], *, world: int = 2, timeout: float = 180) -> list[Any]:
    """Run ``script`` as ranks ``0..world-1`` (argv: rank, a free port) with ``env``; each rank's last
    line of output, parsed as JSON, in rank order."""
    port = str(free_port())
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(rank), port], env=env, cwd=str(REPO),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(world)
    ]  # fmt: skip
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


def last_json(proc: subprocess.CompletedProcess[str]) -> object:
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"child printed nothing; stderr:\n{proc.stderr}"
    return json.loads(lines[-1])


SYNTH_TARGET = '''
"""A stand-in for an upstream module that assumes CUDA."""

def init_process_group(backend="nccl", world_size=1):
    assert backend == "nccl", f"backend must be nccl, got {backend}"
    return ("init", backend, world_size)

def device_name():
    return "cuda"

def vanishing():
    return "still here"

class Allocator:
    def bundles(self, n):
        return [{"GPU": 1}] * n

    @staticmethod
    def resource():
        return "GPU"

    @classmethod
    def kind(cls):
        return cls.__name__

class Child(Allocator):
    pass

LIMIT = 4
'''

SYNTH_USER = '''
"""Binds a copy by name, the way Trinity's vllm_worker does with init_process_group."""
from synthpkg.target import init_process_group

def start():
    return init_process_group("hccl")
'''

SYNTH_PATCHES = '''
"""Wrappers for the synthetic target (wrapt signature)."""

def accept_hccl(wrapped, instance, args, kwargs):
    backend = kwargs.pop("backend", args[0] if args else "nccl")
    args = args[1:]
    if backend == "hccl":
        backend = "nccl"  # the synthetic target only knows nccl: translate back
    return ("patched",) + wrapped(backend, *args, **kwargs)

def npu_name(wrapped, instance, args, kwargs):
    return "npu"

def npu_bundles(wrapped, instance, args, kwargs):
    return [{"NPU": b["GPU"]} for b in wrapped(*args, **kwargs)]

def npu_resource(wrapped, instance, args, kwargs):
    return "NPU"

def kind_marker(wrapped, instance, args, kwargs):
    return "patched:" + wrapped(*args, **kwargs)

def double_limit(original):
    return original * 2

def never(wrapped, instance, args, kwargs):
    raise AssertionError("a disabled or skipped patch ran")

def not_native():
    import synthpkg
    return "synthpkg has native NPU support" if getattr(synthpkg, "NATIVE_NPU", False) else None
'''

SYNTH_SPECS = """
from npu_compat import PatchSpec

COMMON = dict(distribution="synthpkg", versions=">=1.0,<2", why="test")
SPECS = [
    PatchSpec("synth.init_pg", "synthpkg.target:init_process_group", wrapper="synthpatches:accept_hccl",
              copies=["synthpkg.user"], expects=["backend"], **COMMON),
    PatchSpec("synth.device_name", "synthpkg.target:device_name", wrapper="synthpatches:npu_name",
              condition="synthpatches:not_native", **COMMON),
    PatchSpec("synth.bundles", "synthpkg.target:Allocator.bundles", wrapper="synthpatches:npu_bundles", **COMMON),
    PatchSpec("synth.resource", "synthpkg.target:Allocator.resource", wrapper="synthpatches:npu_resource",
              **COMMON),
    PatchSpec("synth.kind", "synthpkg.target:Allocator.kind", wrapper="synthpatches:kind_marker", **COMMON),
    PatchSpec("synth.limit", "synthpkg.target:LIMIT", replacement="synthpatches:double_limit", **COMMON),
]
"""


def make_synth(root: Path, version: str = "1.2.0") -> Path:
    pkg = root / "synthpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text(SYNTH_TARGET)
    (pkg / "user.py").write_text(SYNTH_USER)
    (root / "synthpatches.py").write_text(SYNTH_PATCHES)
    (root / "synthspecs.py").write_text(SYNTH_SPECS)
    info = root / f"synthpkg-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: synthpkg\nVersion: {version}\n")
    return root


@pytest.fixture
def synth(tmp_path: Path) -> Path:
    """A temp dir holding ``synthpkg`` (target + a copy-binding user module), its metadata and specs."""
    return make_synth(tmp_path / "site")
