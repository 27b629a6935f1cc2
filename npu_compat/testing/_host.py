"""A process made a simulated Ascend host: its environment, its path, and entering one at any time.

:func:`simulation_env` is the environment of a simulated host (for children, ``ray start`` or a
Ray ``runtime_env``); :func:`enable` and :func:`simulated_ascend` make this process one.  A
simulated host has the stand-ins "installed" (:mod:`._sites`: ``torch_npu`` and vllm-ascend, as
``importlib.metadata`` sees them), ``ASCEND_RT_VISIBLE_DEVICES`` and ``ASCEND_TOOLKIT_HOME`` set,
and -- once torch is imported -- the ``npu`` device and the ``hccl`` backend.

A process may enter the simulation at any time.  If torch was imported before, the torch side is
installed at once; if a backward already ran then, torch's autograd engine has no worker for
``npu`` and backward runs on its calling thread instead (``_torch_sim.cover_early_autograd``).
What cannot be done is refused at entry, saying why: torch's ``npu`` device, once registered, keeps
its number of devices for the life of the process.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from collections.abc import Iterator, Mapping

from .. import _env
from ._npu_backend import libhccl
from ._sites import SIM_SITE, all_sites, sites

TOOLKIT_HOME = SIM_SITE / "Ascend"
#: Where CANN's ``set_env.sh`` puts its compiler ``bisheng`` on ``PATH``; the simulated one compiles nothing.
COMPILER_BIN = TOOLKIT_HOME / "compiler" / "ccec_compiler" / "bin"


def is_simulated(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``NPU_COMPAT_SIMULATE`` is on in ``environ`` (default: this process)."""
    return _env.is_true((os.environ if environ is None else environ).get(_env.SIMULATE))


def simulation_env(
    devices: int = 2,
    environ: Mapping[str, str] | None = None,
    *,
    vllm_platform: bool | None = None,
) -> dict[str, str]:
    """The environment variables that make a process, and its children, a simulated Ascend host.

    Returns a copy of ``environ`` (default: ``os.environ``) with the simulation switched on: ``devices``
    NPUs (unless ``ASCEND_RT_VISIBLE_DEVICES`` already names some), the stand-ins' directories first on
    ``PYTHONPATH``.  ``vllm_platform=False`` leaves vllm-ascend's distribution out (vLLM then finds no
    platform plugin, as on a host without vllm-ascend); None keeps ``environ``'s setting (default on).
    A process with vLLM runs the released vllm-ascend's own Python, laid out by ``python -m
    npu_compat.testing vllm-ascend``.  Ray's drivers print the simulated host's own lines as each worker logs
    them (``RAY_DEDUP_LOGS_ALLOW_REGEX`` gains their pattern).  Pass it to ``subprocess``, ``ray start`` or a
    Ray ``runtime_env``.

    As CANN's ``set_env.sh`` puts its compiler on ``PATH``, ``PATH`` starts with the simulated toolkit's (a
    ``bisheng`` that answers triton-ascend's probe and compiles nothing), and ``TRITON_INTERPRET=1`` runs
    Triton's kernels in its interpreter (see ``_triton``).  As ``set_env.sh`` puts the toolkit's ``lib64``
    there, ``LD_LIBRARY_PATH`` starts with the directory of the ``libhccl.so`` stand-in, which is built here
    if this host has not built it yet (a C++ compiler and the Python headers; without them it is left out,
    with a warning, and the HCCL library is missing).
    """
    env = dict(os.environ if environ is None else environ)
    env[_env.SIMULATE] = "1"
    env[_env.SIMULATE_DEVICES] = str(devices)
    if vllm_platform is not None:
        env[_env.SIMULATE_VLLM_PLATFORM] = "1" if vllm_platform else "0"
    env.setdefault(_env.ASCEND_VISIBLE_DEVICES, ",".join(str(i) for i in range(devices)))
    env.setdefault(_env.ASCEND_TOOLKIT_VARS[0], str(TOOLKIT_HOME))
    _library_path_first(env)
    # an environ of the simulation's alone (no PATH) gets this process's PATH after the compiler
    _first_on(env, "PATH", str(COMPILER_BIN), default=os.environ.get("PATH", os.defpath))
    env.setdefault(_env.TRITON_INTERPRET, "1")
    _lines_kept_whole(env)
    ours = all_sites()
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in ours]
    env["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in sites(env)), *paths])
    return env


def _lines_kept_whole(env: dict[str, str]) -> None:
    """Ray's drivers print the simulated host's lines as each worker logs them: not folded into one
    ``[repeated Nx across cluster]`` line by Ray's deduplication (a user's own pattern is kept beside it)."""
    own = env.get(_env.RAY_DEDUP_ALLOW, "")
    if _env.SIMULATION_LINES not in own:
        env[_env.RAY_DEDUP_ALLOW] = f"{own}|{_env.SIMULATION_LINES}" if own else _env.SIMULATION_LINES


def _library_path_first(env: dict[str, str]) -> None:
    try:
        where = str(libhccl().parent)
    except (OSError, RuntimeError) as exc:  # no compiler, or its words
        warnings.warn(
            f"simulated Ascend: libhccl.so failed to build ({exc}); the HCCL library is missing",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    _first_on(env, "LD_LIBRARY_PATH", where)


def _first_on(env: dict[str, str], name: str, directory: str, default: str = "") -> None:
    """``directory`` first on the search path ``env[name]`` (``default`` where unset or empty), once."""
    rest = [p for p in (env.get(name) or default).split(os.pathsep) if p and p != directory]
    env[name] = os.pathsep.join([directory, *rest])


def put_sites_first(environ: Mapping[str, str]) -> None:
    """The simulated host's directories first on this process's ``sys.path`` (a fresh choice)."""
    ours = all_sites()
    sys.path[:] = [*(str(p) for p in sites(environ)), *(p for p in sys.path if p not in ours)]
    importlib.invalidate_caches()  # the import system's and importlib.metadata's


def _refuse_other_device_count(env: Mapping[str, str]) -> None:
    torch_sim = sys.modules.get("npu_compat.testing._torch_sim")  # loaded with torch's npu device, not here
    native = getattr(torch_sim, "NATIVE", None)
    if native is None:
        return
    wanted = torch_sim.device_count_from_env(env)  # type: ignore[union-attr]
    if not native.devices_counted():
        native.set_physical_count(torch_sim.host_device_count(env))  # type: ignore[union-attr]
        return  # no device used yet: the runtime counts them at the first use, as on a real host
    if native.device_count() != wanted:
        raise RuntimeError(
            f"this process already used its {native.device_count()} simulated NPUs, and a runtime counts "
            f"its devices once, at their first use: asked for {wanted}.  Enter the simulation with the "
            f"same number here, or run the code that needs {wanted} NPUs in a child process with "
            f"simulation_env({wanted})"
        )


def enable(devices: int = 2) -> None:
    """Switch the simulation on in this process (and in children that inherit ``os.environ``).

    Works at any time: before ``import torch`` (which then loads the stand-in torch_npu, as a real
    one) or after it, also after a backward on CPU.  Raises :class:`RuntimeError`, changing
    nothing, when this process's torch already has a different number of simulated NPUs.
    """
    env = simulation_env(devices)
    _refuse_other_device_count(env)
    os.environ.update(env)
    put_sites_first(os.environ)
    if "torch" in sys.modules:
        importlib.import_module("torch_npu")  # torch already ran its backend autoload: do it now
        from ._torch_sim import cover_early_autograd

        cover_early_autograd()


@contextlib.contextmanager
def simulated_ascend(devices: int = 2) -> Iterator[None]:
    """Make this process a simulated Ascend host for the duration of the ``with`` block.

    The environment and ``sys.path`` are restored afterwards; torch's ``npu`` device and
    the ``hccl`` backend, once registered, stay (torch cannot unregister them).
    """
    saved_env = dict(os.environ)
    saved_path = list(sys.path)
    try:
        enable(devices)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        importlib.invalidate_caches()
