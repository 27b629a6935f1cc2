"""A simulated Ascend host, for npu-compat's tests and for users' own CI.

Nothing here runs on a real NPU.  It makes a process -- and every child
process that inherits its environment -- look like an Ascend host to npu-compat and to
the upstream code:

* a ``torch_npu`` stand-in and the released vllm-ascend's own Python (laid out by ``python -m
  npu_compat.testing vllm-ascend``), installed as far as ``importlib.metadata`` can tell (versions
  and the real wheels' entry points: ``import torch`` auto-loads torch_npu, vLLM finds the Ascend
  platform and runs vllm-ascend's general plugins; see ``_sites``);
* ``torch.npu``: PrivateUse1 renamed to ``npu`` (``torch.device("npu:0")`` parses) and the
  device functions upstream code calls, every call recorded; ``npu`` tensors in host memory
  that compute (a C++ backend compiled on first use; see ``_npu_backend``);
* an ``hccl`` torch.distributed backend that builds a real Gloo group, so collectives run
  (on ``npu`` tensors too);
* ``ASCEND_RT_VISIBLE_DEVICES`` and ``ASCEND_TOOLKIT_HOME`` set;
* where triton-ascend is installed, its NPU driver active (CANN's answers simulated) and its kernels
  run in Triton's interpreter (``TRITON_INTERPRET=1``; see ``_triton``);
* an NPU-only Ray cluster of any size (:func:`npu_ray_cluster`; from a shell,
  ``python -m npu_compat.testing cluster``).

``torch.cuda.is_available()`` stays False.  Switch it on with :func:`simulated_ascend`
(a context manager), :func:`enable`, or -- for child processes, Ray workers and
``ray start`` -- the environment from :func:`simulation_env` (``NPU_COMPAT_SIMULATE=1``).
A process may enter it at any time, also after torch computed a backward on CPU.  The torch
side, once installed in a process, stays for the life of that process.
"""

from __future__ import annotations

from ._host import TOOLKIT_HOME, enable, is_simulated, simulated_ascend, simulation_env
from ._ray import RayCluster, npu_ray_cluster
from ._sites import SIM_SITE

__all__ = [
    "SIM_SITE",
    "TOOLKIT_HOME",
    "RayCluster",
    "enable",
    "is_simulated",
    "npu_ray_cluster",
    "simulated_ascend",
    "simulation_env",
]
