"""SIMULATED torch_npu, from npu_compat.testing -- not Huawei's torch_npu.

It exists only on a simulated Ascend host (``NPU_COMPAT_SIMULATE=1``).  Like the real
package it is found by name, auto-loaded by ``import torch`` through the
``torch.backends`` entry point, and registers the ``npu`` device with torch and the
``hccl`` backend with torch.distributed -- here backed by the CPU and Gloo.
"""

import os

__version__ = "2.13.0+sim"
SIMULATED = True

# torch_npu's own order: autoloading off while it imports torch, so that `import torch_npu` before
# `import torch` does not have torch load this half-imported package as its device backend
_ORG_AUTOLOAD = os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402,F401

from npu_compat.testing import _torch_sim  # noqa: E402

_torch_sim.install()


def _autoload() -> None:
    """The ``torch.backends`` entry point (torch calls it at the end of ``import torch``); as torch_npu's,
    it restores the switch that child processes inherit (the package registered ``npu`` on import)."""
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = _ORG_AUTOLOAD


_autoload()  # where `import torch_npu` came first, torch skipped its autoload

from . import _C, npu, op_plugin, optim, profiler  # noqa: E402  (the real package's submodules)

__all__ = ["SIMULATED", "_C", "__version__", "npu", "op_plugin", "optim", "profiler"]


def __getattr__(name: str) -> object:
    """``torch_npu.npu_*`` fused kernels: importable (transformers, verl and vLLM import them when
    torch_npu is present).  Those registered as ``torch.library`` operators by
    ``npu_compat.testing._npu_ops`` (the ones vllm-ascend's eager path calls, and those of transformers and
    verl, with their autograd formulas, whose calls are counted: ``torch.npu.call_count("torch_npu.<name>")``
    and the process's report) are served as the real package serves them, the operator packet itself
    (``.default``, ``.out``); calling any other is the compute boundary of the simulation."""
    if name.startswith(("npu_", "_npu_")):  # only a kernel's name is looked up (nothing is imported else)
        from npu_compat.testing._npu_ops import TORCH_NPU_NAMES, torch_npu_names

        if name in TORCH_NPU_NAMES:
            operator = torch_npu_names()[name]
            globals()[name] = operator
            return operator
    if name.startswith("npu_"):
        from npu_compat.testing._torch_sim import compute_boundary

        kernel = compute_boundary(f"torch_npu.{name}")
        globals()[name] = kernel  # one object per name, as attributes of a real module
        return kernel
    raise AttributeError(f"module 'torch_npu' (simulated) has no attribute {name!r}")
