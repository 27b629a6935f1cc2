"""A simulated Ascend host, for npu-compat's tests and for users' own CI.

Nothing here runs on a real NPU.  It makes a process -- and every child
process that inherits its environment -- look like an Ascend host to npu-compat and to
the upstream code:

* a ``torch_npu`` stand-in that is findable by name and auto-loaded by ``import torch``
  (through the same ``torch.backends`` entry point as the real one);
* ``torch.npu``: PrivateUse1 renamed to ``npu`` (``torch.device("npu:0")`` parses) and the
  device functions upstream code calls, every call recorded; ``npu`` tensors in host memory
  that compute (a C++ backend compiled on first use; see ``_npu_backend``);
* an ``hccl`` torch.distributed backend that builds a real Gloo group, so collectives run
  (on ``npu`` tensors too);
* ``ASCEND_RT_VISIBLE_DEVICES`` and ``ASCEND_TOOLKIT_HOME`` set.

``torch.cuda.is_available()`` stays False.  Switch it on with :func:`simulated_ascend`
(a context manager), :func:`enable`, or -- for child processes, Ray workers and
``ray start`` -- the environment from :func:`simulation_env` (``NPU_COMPAT_SIMULATE=1``).
The torch side, once installed in a process, stays for the life of that process.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from .. import _env

#: The directory that holds the stand-ins (``torch_npu``); first on ``sys.path`` when simulating.
SIM_SITE = Path(__file__).resolve().with_name("_sim_site")
TOOLKIT_HOME = SIM_SITE / "Ascend"


def is_simulated(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``NPU_COMPAT_SIMULATE`` is on in ``environ`` (default: this process)."""
    return _env.is_true((os.environ if environ is None else environ).get(_env.SIMULATE))


def simulation_env(devices: int = 2, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables that make a process, and its children, a simulated Ascend host.

    Returns a copy of ``environ`` (default: ``os.environ``) with the simulation switched on;
    pass it to ``subprocess``, ``ray start`` or a Ray ``runtime_env``.
    """
    env = dict(os.environ if environ is None else environ)
    env[_env.SIMULATE] = "1"
    env[_env.SIMULATE_DEVICES] = str(devices)
    env.setdefault(_env.ASCEND_VISIBLE_DEVICES, ",".join(str(i) for i in range(devices)))
    env.setdefault(_env.ASCEND_TOOLKIT_VARS[0], str(TOOLKIT_HOME))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SIM_SITE)]
    env["PYTHONPATH"] = os.pathsep.join([str(SIM_SITE), *paths])
    return env


def enable(devices: int = 2) -> None:
    """Switch the simulation on in this process (and in children that inherit ``os.environ``)."""
    os.environ.update(simulation_env(devices))
    if str(SIM_SITE) not in sys.path:
        sys.path.insert(0, str(SIM_SITE))
    importlib.invalidate_caches()
    if "torch" in sys.modules:
        importlib.import_module("torch_npu")  # torch already ran its backend autoload: do it now


@contextlib.contextmanager
def simulated_ascend(devices: int = 2) -> Iterator[None]:
    """Make this process a simulated Ascend host for the duration of the ``with`` block.

    The environment and ``sys.path`` are restored afterwards; torch's ``npu`` device and
    the ``hccl`` backend, once registered, stay (torch cannot unregister them).
    """
    saved_env = dict(os.environ)
    saved_path = list(sys.path)
    enable(devices)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        importlib.invalidate_caches()


__all__ = ["SIM_SITE", "TOOLKIT_HOME", "enable", "is_simulated", "simulated_ascend", "simulation_env"]
