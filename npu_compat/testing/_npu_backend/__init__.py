"""The simulated NPU's C++ backend: its sources (``csrc/``) and the build that loads them.

The backend gives ``npu`` tensors host memory (PrivateUse1: allocator, device guard,
hooks, generators, and a CPU fallback that aliases the tensors' memory rather than
copying it).  It is compiled on first use with ``torch.utils.cpp_extension`` (a C++
compiler and ninja) into a cache directory keyed by the torch version, the Python
version and a hash of the sources, under a file lock: many processes starting at once
(Ray workers, vLLM children) wait for one build and then all load it.

:func:`load` returns the extension module, or ``None`` when it cannot be had; then
:func:`failure` says why, naming what to install.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

from ... import _env

NAME = "npu_compat_npu_backend"
CSRC = Path(__file__).resolve().with_name("csrc")
#: The vllm_ascend_C stand-in's source: a library of its own, loaded where vllm-ascend imports it.
VLLM_ASCEND_C = Path(__file__).resolve().with_name("vllm_ascend_C")
#: The libhccl.so stand-in's source: HCCL's C entry points, which hand each call to ``_libhccl``.
LIBHCCL = Path(__file__).resolve().with_name("libhccl")
CFLAGS = ("-O2",)

_module: types.ModuleType | None = None
_failure: str | None = None
_tried = False
#: True in the one process that compiled the backend (the others waited for it, then loaded it).
built_here = False


def cache_root() -> Path:
    explicit = os.environ.get(_env.SIMULATE_BUILD_DIR)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "npu_compat"


def sources() -> list[Path]:
    return sorted(CSRC.glob("*.cpp"))


def build_dir() -> Path:
    """The cache directory of this torch, this Python and these sources."""
    import torch

    digest = hashlib.sha256()
    for path in [*sorted(CSRC.iterdir()), *sorted(VLLM_ASCEND_C.iterdir())]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(" ".join(CFLAGS).encode())
    key = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest.hexdigest()[:16]}"
    return cache_root() / key.replace("+", "_")


def _ninja() -> str | None:
    found = shutil.which("ninja")
    if found:
        return found
    candidates = [Path(sys.executable).parent / "ninja"]
    with contextlib.suppress(ImportError, AttributeError):
        import ninja  # type: ignore[import-not-found,import-untyped,unused-ignore]

        candidates.insert(0, Path(ninja.BIN_DIR) / "ninja")
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def missing_tools() -> str | None:
    """What the build needs and this host lacks, in words; ``None`` when nothing is missing."""
    missing = []
    compiler = os.environ.get("CXX", "c++")
    if not shutil.which(compiler):
        missing.append(f"a C++ compiler ({compiler!r} is not on PATH: install g++ or clang++, or set CXX)")
    if _ninja() is None:
        missing.append("ninja (pip install ninja)")
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.is_file():
        missing.append(f"the Python headers ({include} is missing: install python3-dev)")
    return " and ".join(missing) if missing else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _import(so: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(NAME, so)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {so}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[NAME] = module
    return module


def _build(where: Path) -> types.ModuleType:
    global built_here
    from torch.utils import cpp_extension

    ninja = _ninja()
    if ninja and not shutil.which("ninja"):  # a venv's ninja, the venv not on PATH
        os.environ["PATH"] = f"{Path(ninja).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    where.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    module: types.ModuleType = cpp_extension.load(
        NAME, [str(s) for s in sources()], extra_cflags=list(CFLAGS), build_directory=str(where)
    )
    (where / "built").write_text(f"{time.monotonic() - started:.1f} s\n")
    built_here = True
    return module


def load() -> types.ModuleType | None:
    """The backend module, built first if this host has not built it yet; ``None`` if it cannot be."""
    global _module, _failure, _tried
    if _tried:
        return _module
    _tried = True
    if NAME in sys.modules:
        _module = sys.modules[NAME]
        return _module
    missing = missing_tools()
    if missing:
        _failure = f"the simulated npu backend cannot be built here: it needs {missing}"
    else:
        try:
            where = build_dir()
            so = where / f"{NAME}.so"  # the name torch.utils.cpp_extension gives it
            if not (where / "built").is_file():
                with _locked(where.with_name(where.name + ".lock")):
                    if not (where / "built").is_file():
                        _module = _build(where)
            if _module is None:
                _module = _import(so)
            sys.modules[NAME] = _module  # the vllm_ascend_C stand-in finds the runtime's table here
        except Exception as exc:  # noqa: BLE001 -- any build failure leaves the simulation at its boundary
            lines = str(exc).strip().splitlines()
            last = lines[-1] if lines else type(exc).__name__
            _failure = f"the simulated npu backend failed to build ({last})"
            _module = None
    if _failure:
        message = f"simulated Ascend: {_failure}; npu tensors stay at the compute boundary"
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    return _module


def vllm_ascend_c() -> Path:
    """The vllm_ascend_C stand-in's library, built first if this host has not built it yet (needs the
    backend loaded: :func:`load`)."""
    from torch.utils import cpp_extension

    where = build_dir() / "vllm_ascend_C"
    so = where / "vllm_ascend_C.so"
    if not (where / "built").is_file():
        with _locked(where.with_name(where.name + ".lock")):
            if not (where / "built").is_file():
                where.mkdir(parents=True, exist_ok=True)
                cpp_extension.load(
                    "vllm_ascend_C", [str(VLLM_ASCEND_C / "vllm_ascend_C.cpp")], extra_cflags=list(CFLAGS),
                    extra_include_paths=[str(CSRC)], build_directory=str(where), is_python_module=False,
                )  # fmt: skip
                (where / "built").write_text("built\n")
    return so


def libhccl_dir() -> Path:
    """Where the libhccl.so stand-in is built: keyed by this Python and its source, not by torch (it uses
    the Python headers alone), so that a simulated host's library path can name it before torch loads."""
    return cache_root() / f"libhccl-py{sys.version_info[0]}{sys.version_info[1]}-{_libhccl_digest()}"


@functools.cache
def _libhccl_digest() -> str:
    """The stand-in's source and flags, hashed once a process (each simulated child's env names it)."""
    return hashlib.sha256((LIBHCCL / "hccl.cpp").read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:16]


def _compile_libhccl(target: Path) -> None:
    """Compile the stand-in into ``target``; a RuntimeError that says why where it cannot."""
    include = sysconfig.get_paths()["include"]
    cxx = os.environ.get("CXX", "c++")
    argv = [
        cxx,
        "-shared",
        "-fPIC",
        *CFLAGS,
        f"-I{include}",
        "-Wl,-soname,libhccl.so",
        str(LIBHCCL / "hccl.cpp"),
    ]
    try:
        subprocess.run([*argv, "-o", str(target)], check=True, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise RuntimeError(
            f"simulated Ascend: building the libhccl.so stand-in needs a C++ compiler, and {cxx!r} was not "
            "found: install one (g++ or clang++) or name it in CXX"
        ) from exc
    except subprocess.CalledProcessError as exc:
        words = (exc.stderr or exc.stdout or "")[-2000:]
        raise RuntimeError(
            f"simulated Ascend: {cxx} failed to build the libhccl.so stand-in (exit {exc.returncode}) "
            f"against the Python headers in {include}:\n{words}"
        ) from exc


def libhccl() -> Path:
    """The libhccl.so stand-in, built first if this host has not built it yet: one C++ file against the Python
    headers, with the SONAME ``libhccl.so``: found by that name on a simulated host's ``LD_LIBRARY_PATH``
    (as CANN's ``set_env.sh`` puts its own there), and by ``ctypes.CDLL("libhccl.so")`` once loaded
    (:func:`load_libhccl`)."""
    where = libhccl_dir()
    so = where / "libhccl.so"
    if not (where / "built").is_file():
        with _locked(where.with_name(where.name + ".lock")):
            if not (where / "built").is_file():
                where.mkdir(parents=True, exist_ok=True)
                partial = where / f"libhccl.so.{os.getpid()}"
                _compile_libhccl(partial)
                partial.replace(so)
                (where / "built").write_text("built\n")
    return so


def load_libhccl() -> ctypes.CDLL | None:
    """Load the libhccl.so stand-in into this process, as torch_npu's libraries load CANN's: afterwards
    ``ctypes.CDLL("libhccl.so")`` (vllm-ascend's ``find_hccl_library`` without ``HCCL_SO_PATH``) finds it.
    ``None``, with a warning, where it cannot be built: the HCCL library is then missing, as on a host without
    CANN's."""
    try:
        return ctypes.CDLL(str(libhccl()), mode=ctypes.RTLD_GLOBAL)
    except (OSError, RuntimeError) as exc:
        warnings.warn(
            f"simulated Ascend: libhccl.so failed to build or load ({exc})", RuntimeWarning, stacklevel=2
        )
        return None


class VllmAscendCFinder:
    """Finds ``vllm_ascend.vllm_ascend_C`` -- the compiled library a real vllm-ascend ships, left out of
    the simulated host's layout -- as the stand-in library (:func:`vllm_ascend_c`), built on first import.
    Where it cannot be built, nothing is found, and vllm-ascend goes on without it as it does on a host
    whose build lacks it (custom operators and sleep mode off)."""

    NAME = "vllm_ascend.vllm_ascend_C"

    @classmethod
    def find_spec(cls, fullname: str, path: object = None, target: object = None) -> object:
        if fullname != cls.NAME or load() is None:
            return None
        try:
            so = vllm_ascend_c()
        except Exception as exc:  # noqa: BLE001 -- as a missing library: vllm-ascend decides
            warnings.warn(
                f"simulated Ascend: vllm_ascend_C failed to build ({exc})", RuntimeWarning, stacklevel=2
            )
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(so))
        return importlib.util.spec_from_file_location(fullname, so, loader=loader)


def failure() -> str | None:
    """Why :func:`load` gave ``None`` (after it was called)."""
    return _failure


__all__ = [
    "CSRC",
    "LIBHCCL",
    "NAME",
    "VLLM_ASCEND_C",
    "VllmAscendCFinder",
    "build_dir",
    "cache_root",
    "failure",
    "libhccl",
    "libhccl_dir",
    "load",
    "load_libhccl",
    "missing_tools",
    "sources",
    "vllm_ascend_c",
]  # fmt: skip
