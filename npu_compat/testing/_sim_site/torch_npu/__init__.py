"""SIMULATED torch_npu, from npu_compat.testing -- not Huawei's torch_npu.

It exists only on a simulated Ascend host (``NPU_COMPAT_SIMULATE=1``).  Like the real
package it is found by name, auto-loaded by ``import torch`` through the
``torch.backends`` entry point, and registers the ``npu`` device with torch and the
``hccl`` backend with torch.distributed -- here backed by the CPU and Gloo.
"""

__version__ = "2.13.0+sim"
SIMULATED = True


def _autoload() -> None:
    """The ``torch.backends`` entry point (torch calls it at the end of ``import torch``)."""
    from npu_compat.testing import _torch_sim

    _torch_sim.install()


_autoload()

from npu_compat.testing._torch_sim import npu  # noqa: E402  (``torch_npu.npu`` as in the real package)

__all__ = ["SIMULATED", "__version__", "npu"]
