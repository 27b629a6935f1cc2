"""Where the simulated Ascend stops: the compute boundary.

``npu`` tensors compute under the simulation (host memory, from the C++ backend of ``_npu_backend``), and
so do the torch_npu kernels that vllm-ascend, transformers and verl call (``_npu_ops``, ``_npu_kernels``).
Above them runs the released vllm-ascend's own Python.  Where real code needs an NPU for what the
simulation does not do -- a torch_npu kernel it does not compute, GE compilation, torchair's own graphs --
the simulation raises :class:`SimulatedComputeBoundary` (made by :func:`needs_npu`), whose message names
what was called: ``simulated Ascend: <what> needs a real NPU``.  Where the backend cannot be built (no
compiler, no ninja), every operator on an ``npu`` tensor is the boundary, with that reason.
"""

from __future__ import annotations


class SimulatedComputeBoundary(RuntimeError):
    """Raised where real NPU compute would begin: the simulation cannot go further."""


def needs_npu(what: str, why: str = "") -> SimulatedComputeBoundary:
    """The error the simulation raises for ``what``: ``simulated Ascend: <what> needs a real NPU (<why>)``."""
    message = f"simulated Ascend: {what} needs a real NPU"
    return SimulatedComputeBoundary(f"{message} ({why})" if why else message)


__all__ = ["SimulatedComputeBoundary", "needs_npu"]
