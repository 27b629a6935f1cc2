"""Test harness for tests/e2e only: repairs one defect of the simulated ``torch.npu`` in every process.

``npu_compat/testing/_torch_sim.py`` builds ``torch.npu.memory_allocated``, ``memory_reserved``,
``max_memory_allocated`` and ``max_memory_reserved`` with ``types.FunctionType(code, {}, name)``,
which drops the ``device=None`` default: a bare ``torch.npu.memory_allocated()`` -- what verl's
``log_gpu_memory_usage`` calls after building the FSDP model -- raises ``TypeError``.  The real
torch_npu takes ``device=None``.  This module, loaded through torch's own ``torch.backends`` entry
point when its directory is on ``PYTHONPATH`` after the simulation's site, gives those functions
their default back.  Remove it once the stand-in passes ``argdefs=(None,)``.
"""

from __future__ import annotations

NAMES = ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved")


def autoload() -> None:
    import torch

    npu = getattr(torch, "npu", None)
    for name in NAMES:
        inner = getattr(getattr(npu, name, None), "__wrapped__", None)
        if inner is not None and inner.__defaults__ is None and inner.__code__.co_argcount == 1:
            inner.__defaults__ = (None,)
