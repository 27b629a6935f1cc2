"""SIMULATED torch_npu._C (npu_compat.testing): the names of torch_npu's compiled core Python reaches.

The real ``_C`` is torch_npu's C++ extension.  Here: the graph task-group handle type, the weak tensor
reference vllm-ascend keeps of graph outputs, the pluggable allocator's and memory pools' bindings
(``torch.npu.memory``'s), and ``_distributed_c10d`` (HCCL process-group options).
"""

import torch

from npu_compat.testing._npu_graphs import _NPUTaskGroupHandle
from npu_compat.testing._torch_sim import (
    _MemPool,
    _npu_beginAllocateCurrentThreadToPool,
    _npu_customAllocator,
    _npu_endAllocateToPool,
    _npu_NPUAllocator,
    _npu_releasePool,
)

from . import _distributed_c10d


def _weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor on ``tensor``'s memory.  torch_npu's does not keep that memory alive; this one does (a
    view): the simulation is kinder here, which only matters to a graph's outputs (no graph mode yet)."""
    return tensor.view(tensor.shape)


__all__ = [
    "_MemPool",
    "_NPUTaskGroupHandle",
    "_distributed_c10d",
    "_npu_NPUAllocator",
    "_npu_beginAllocateCurrentThreadToPool",
    "_npu_customAllocator",
    "_npu_endAllocateToPool",
    "_npu_releasePool",
    "_weak_ref_tensor",
]
