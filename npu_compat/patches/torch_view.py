"""Scoped ``torch.cuda`` -> ``torch.npu``: a view of torch for the upstream modules that need it.

A patch replaces the ``torch`` global of one upstream module (never torch itself) with a
:class:`TorchView`: a module object holding the same attributes as torch, so every
``torch.x`` lookup in that module is the same dictionary lookup as before and hot loops
run at the same speed, except ``torch.cuda``, which answers from ``torch.npu`` for the
device calls listed in :data:`REDIRECTED` and from the real ``torch.cuda`` for everything
else -- ``torch.cuda.is_available()`` stays False, as it is on an Ascend host (verl and
vLLM choose CUDA first when it says True).  Other modules, and torch, are untouched.

Attributes torch gains after the view is made are found through ``__getattr__``; an
attribute of torch rebound after that (a later monkeypatch of ``torch.x``) is not seen by
the view -- patching one module means taking a snapshot of torch for it.
"""

from __future__ import annotations

import types
from typing import Any

#: torch.cuda functions that have a torch.npu twin with the same meaning.
REDIRECTED = frozenset(
    {
        "synchronize", "current_device", "set_device", "device_count", "empty_cache", "current_stream",
        "default_stream", "stream", "Stream", "Event", "get_device_properties",
        "get_device_name", "mem_get_info", "memory_allocated", "memory_reserved", "max_memory_allocated",
        "max_memory_reserved", "reset_peak_memory_stats", "set_per_process_memory_fraction", "manual_seed",
        "manual_seed_all", "ipc_collect", "device",
    }
)  # fmt: skip


class CudaRedirect(types.ModuleType):
    """``torch.cuda`` as seen from a patched module."""

    def __init__(self, torch: Any) -> None:
        super().__init__(
            "torch.cuda", "torch.cuda as seen by an npu-compat-patched module (device calls -> torch.npu)"
        )
        self._npu_compat_torch = torch

    def __getattr__(self, name: str) -> Any:
        torch = self.__dict__["_npu_compat_torch"]
        if name == "get_device_capability":
            return _capability
        if name in REDIRECTED:
            return getattr(torch.npu, name)
        return getattr(torch.cuda, name)


#: CANN has no compute capability (torch_npu answers None).  Callers compare the major
#: version with thresholds (>= 8: bf16, >= 9: FSDP2 meta-device init); upstream
#: Trinity's own NPU support answers 10 for Ascend, so the same branches are taken.
NPU_CAPABILITY = (10, 0)


def _capability(device: Any = None) -> tuple[int, int]:
    import torch

    answer = torch.npu.get_device_capability(device)
    return (int(answer[0]), int(answer[1])) if answer else NPU_CAPABILITY


class TorchView(types.ModuleType):
    """``torch`` as seen from a patched module."""

    def __init__(self, torch: Any) -> None:
        super().__init__(torch.__name__, torch.__doc__)
        self.__dict__.update(torch.__dict__)
        self.__dict__["cuda"] = CudaRedirect(torch)
        self.__dict__["_npu_compat_torch"] = torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_npu_compat_torch"], name)


def torch_for_npu(original: Any) -> Any:
    """The replacement factory: the module's ``torch`` global -> a :class:`TorchView` of it."""
    return TorchView(original)
