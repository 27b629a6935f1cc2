"""Scoped ``torch.cuda`` -> ``torch.npu``: a view of torch for the upstream modules that need it.

A patch replaces the ``torch`` global of one upstream module (never torch itself) with a view
(:func:`torch_view`): a module object holding the same attributes as torch, so every
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


def cuda_redirect(torch: Any) -> types.ModuleType:
    """``torch.cuda`` as seen from a patched module."""
    redirect = types.ModuleType(
        "torch.cuda", "torch.cuda as seen by an npu-compat-patched module (device calls -> torch.npu)"
    )

    def __getattr__(name: str) -> Any:  # PEP 562: consulted only for names not in the module dict
        if name == "get_device_capability":
            return _capability
        if name in REDIRECTED:
            return getattr(torch.npu, name)
        return getattr(torch.cuda, name)

    redirect.__getattr__ = __getattr__  # type: ignore[method-assign]
    return redirect


#: CANN has no compute capability (torch_npu answers None).  Callers compare the major
#: version with thresholds (>= 8: bf16, >= 9: FSDP2 meta-device init); upstream
#: Trinity's own NPU support answers 10 for Ascend, so the same branches are taken.
NPU_CAPABILITY = (10, 0)


def _capability(device: Any = None) -> tuple[int, int]:
    import torch

    answer = torch.npu.get_device_capability(device)
    return (int(answer[0]), int(answer[1])) if answer else NPU_CAPABILITY


def torch_view(torch: Any) -> types.ModuleType:
    """``torch`` as seen from a patched module.

    A plain module object (not a subclass): CPython's attribute fast path for modules only
    applies to exact module objects, so ``torch.x`` in a hot loop costs what it did before.
    """
    view = types.ModuleType(torch.__name__, torch.__doc__)
    view.__dict__.update(torch.__dict__)
    view.__dict__["cuda"] = cuda_redirect(torch)

    def __getattr__(name: str) -> Any:  # names torch gains later (lazy submodules)
        return getattr(torch, name)

    view.__dict__["__getattr__"] = __getattr__
    return view


def torch_for_npu(original: Any) -> Any:
    """The replacement factory: the module's ``torch`` global -> a view of it (:func:`torch_view`)."""
    return torch_view(original)
