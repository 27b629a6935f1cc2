"""Where the simulated Ascend stops: the compute boundary.

``npu`` tensors compute under the simulation (host memory, from the C++ backend of ``_npu_backend``), and
so do the torch_npu kernels that vllm-ascend, transformers and verl call (``_npu_ops``, ``_npu_kernels``).
Above them runs the released vllm-ascend's own Python.  Where real code needs an NPU for what the
simulation does not do -- a torch_npu kernel it does not compute, GE compilation, torchair's own graphs --
the simulation raises :class:`SimulatedComputeBoundary` (made by :func:`needs_npu`), whose message names
what was called: ``simulated Ascend: <what> needs a real NPU``.  Where the backend cannot be built (no
compiler, no ninja), every operator on an ``npu`` tensor is the boundary, with that reason.

:func:`npu_on_host` serves requests for ``npu`` memory on the host, for a test that drives a data path (a
weight sync, an adapter save) past the point where real code moves tensors to the device, without the
backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class SimulatedComputeBoundary(RuntimeError):
    """Raised where real NPU compute would begin: the simulation cannot go further."""


def needs_npu(what: str, why: str = "") -> SimulatedComputeBoundary:
    """The error the simulation raises for ``what``: ``simulated Ascend: <what> needs a real NPU (<why>)``."""
    message = f"simulated Ascend: {what} needs a real NPU"
    return SimulatedComputeBoundary(f"{message} ({why})" if why else message)


def _is_npu(device: Any) -> bool:
    import torch

    if isinstance(device, str):
        return device == "npu" or device.startswith("npu:")
    return isinstance(device, torch.device) and device.type == "npu"


@contextlib.contextmanager
def npu_on_host() -> Iterator[list[str]]:
    """Let tensors meant for the NPU live on the host, and record every such request.

    Without the npu backend no tensor can be allocated on ``npu``; inside this context a
    ``device=`` argument naming ``npu``/``npu:N`` (a factory such as ``torch.empty``, or
    ``Tensor.to``), or a bare index where torch reads it as an ``npu`` index (as in
    ``module.to(torch.npu.current_device())``), is served on the CPU instead -- the same
    host memory the simulated collectives use -- and appended to the list the context
    yields.  Anything else, ``cuda`` included, is passed through untouched, so code that
    still asks for CUDA fails as it would on an Ascend host.  For tests that drive a data
    path (weight sync) past the point where real code moves tensors to the device.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    requests: list[str] = []
    # torch reads a bare index as a device of the current accelerator: ``npu`` under the simulation
    accelerator = torch.accelerator.current_accelerator()
    indices_are_npu = accelerator is not None and accelerator.type == "npu"

    def on_host(value: Any) -> Any:
        if _is_npu(value):
            requests.append(str(value))
            return torch.device("cpu")
        if indices_are_npu and isinstance(value, int) and not isinstance(value, bool):
            requests.append(f"npu:{value}")
            return torch.device("cpu")
        return value

    class NpuOnHost(TorchFunctionMode):  # type: ignore[misc]
        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = on_host(kwargs["device"])
            if func is torch.Tensor.to and len(args) > 1:
                args = (args[0], on_host(args[1]), *args[2:])
            return func(*args, **kwargs)

    with NpuOnHost():
        yield requests


__all__ = ["SimulatedComputeBoundary", "needs_npu", "npu_on_host"]
