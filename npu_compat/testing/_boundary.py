"""Where the simulated Ascend stops: the compute boundary, and the device tensors really use.

``npu`` tensors compute under the simulation (host memory, from the C++ backend of
``_npu_backend``), and so do the fused ``torch_npu.npu_*`` kernels that transformers and verl
call (``_npu_kernels``).  The ``vllm_ascend`` stand-ins in ``_sim_site`` do the bookkeeping of
the real package for real -- configuration, registration, process groups, collectives -- and
their ``NPUModelRunner`` generates for real (a transformers model, recomputing each sequence;
see ``vllm_ascend.worker.model_runner_v1``).  They stop where the real code needs an NPU for
what the simulation does not do (ATB kernels, the torch_npu profiler, LoRA at TP > 1, speculative
decoding, pipeline parallelism).  There they raise :class:`SimulatedComputeBoundary`
(made by :func:`needs_npu`), whose message names the method: ``simulated Ascend: <method>
needs a real NPU``.  Where the backend cannot be built (no compiler, no ninja), every
operator on an ``npu`` tensor is the boundary, with that reason.

:func:`host_device` is the device a stand-in allocates on where no ``npu`` tensor can be
allocated (the CPU); the runner places its model on ``npu`` itself once it can
(``placement_device``).  :func:`npu_on_host` serves requests for ``npu`` memory on the host
for code driven without the backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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


__all__ = ["SimulatedComputeBoundary", "host_device", "needs_npu", "npu_on_host"]
