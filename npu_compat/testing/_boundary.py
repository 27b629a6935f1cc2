"""Where the simulated Ascend stops: the compute boundary, and the device tensors really use.

The ``vllm_ascend`` stand-ins in ``_sim_site`` do the bookkeeping of the real package for
real -- configuration, registration, process groups, collectives on CPU tensors -- and
stop where the real code needs an NPU to compute or to hold memory.  There they raise
:class:`SimulatedComputeBoundary` (made by :func:`needs_npu`), whose message names the
method: ``simulated Ascend: <method> needs a real NPU``.

Under the simulation ``torch.device("npu:0")`` parses but no tensor can be allocated on
it; :func:`host_device` is the device a stand-in allocates on instead (the CPU).
"""

from __future__ import annotations

from typing import Any


class SimulatedComputeBoundary(RuntimeError):
    """Raised where real NPU compute would begin: the simulation cannot go further."""


def needs_npu(what: str, why: str = "") -> SimulatedComputeBoundary:
    """The error a stand-in raises for ``what``: ``simulated Ascend: <what> needs a real NPU (<why>)``."""
    message = f"simulated Ascend: {what} needs a real NPU"
    return SimulatedComputeBoundary(f"{message} ({why})" if why else message)


def host_device(device: Any = None) -> Any:
    """The ``torch.device`` a simulated tensor meant for ``device`` lives on.

    ``npu``, ``npu:N`` and a bare device index (Ascend code's shorthand for ``npu:N``) map
    to ``cpu``; any other device is returned as a ``torch.device`` unchanged.
    """
    import torch

    if device is None or isinstance(device, int):
        return torch.device("cpu")
    device = device if isinstance(device, torch.device) else torch.device(device)
    return torch.device("cpu") if device.type == "npu" else device


__all__ = ["SimulatedComputeBoundary", "host_device", "needs_npu"]
