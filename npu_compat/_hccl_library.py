"""Which HCCL library vllm-ascend's ``PyHcclCommunicator`` loads, and whether it loads: read by the patch
that makes a communicator without it an error (:mod:`npu_compat.patches.vllm_ascend_pyhccl`) and by
``doctor``.

vllm-ascend (0.18.0 and 0.23.0.post1, ``utils.find_hccl_library``) takes ``HCCL_SO_PATH``, else
``libhccl.so`` by name: found where torch_npu's libraries already loaded it, or on the library path that
CANN's ``set_env.sh`` sets.  Where ``ctypes`` cannot load it, the communicator disables itself without an
error and each of its broadcasts does nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from . import _env


def library(environ: Mapping[str, str] | None = None) -> str:
    """The file vllm-ascend's ``HCCLLibrary`` hands to ``ctypes.CDLL``."""
    return (os.environ if environ is None else environ).get(_env.HCCL_SO_PATH) or _env.HCCL_LIBRARY_DEFAULT


def load_problem(path: str) -> str | None:
    """Why ``ctypes.CDLL(path)`` fails, in the loader's words; ``None`` when it loads."""
    import ctypes

    try:
        ctypes.CDLL(path)
    except OSError as exc:
        return str(exc)
    return None


def how_to_fix(environ: Mapping[str, str] | None = None) -> str:
    if (os.environ if environ is None else environ).get(_env.HCCL_SO_PATH):
        return f"point {_env.HCCL_SO_PATH} at CANN's libhccl.so, or unset it to use the library path's"
    return (
        "source CANN's set_env.sh (it puts the toolkit's lib64, which holds libhccl.so, on LD_LIBRARY_PATH) "
        f"before `ray start`, or set {_env.HCCL_SO_PATH} to that libhccl.so"
    )
