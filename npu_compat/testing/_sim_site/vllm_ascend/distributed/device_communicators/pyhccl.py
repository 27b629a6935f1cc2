# Mirrors upstream signatures as they are (some unannotated); vLLM ships no stubs for mypy here.
# mypy: disable-error-code="import-not-found,no-untyped-def"
"""SIMULATED vllm_ascend.distributed.device_communicators.pyhccl (npu_compat.testing).

Mirrors ``vllm_ascend/distributed/device_communicators/pyhccl.py`` of vllm-ascend
0.23.0.post1 and 0.18.0 (the two differ only in a no-op branch of ``broadcast``):
:class:`PyHcclCommunicator` with the real constructor, ``all_reduce`` and ``broadcast`` --
and nothing else (the real one has no ``destroy``, unlike vLLM 0.23's PyNcclCommunicator).

There is no ``libhccl.so`` behind it.  The collectives run for real, on CPU tensors, over
the group the communicator is attached to:

* a vLLM ``StatelessProcessGroup``: through its object broadcast / all-gather (pickled
  through its TCP store; correct, and slow for large tensors);
* a ``torch.distributed`` ProcessGroup (Gloo, or a mixed ``cpu:gloo,npu:hccl`` group):
  through ``torch.distributed``.  Like the real one it refuses a plain HCCL group.

A collective ends on a rank only once every rank took part, as on the device: over a
``StatelessProcessGroup`` the source of a ``broadcast`` then waits for each receiver's
acknowledgement (the store alone would let it return at once, even with every peer dead).  Like
HCCL's task execution, that wait is bounded by ``HCCL_EXEC_TIMEOUT`` (seconds; Atlas A2's default
1836): past it the collective raises ``RuntimeError`` naming the ranks that never took part.  A
receiver waits on the store, within the group's ``store_timeout``.

As in the real one: ``world_size == 1`` leaves it ``available=False, disabled=True`` (and
without ``device``), ``all_reduce`` returns a new tensor (``None`` when disabled),
``broadcast`` works in place, ``src`` is the rank within the group, the dtypes and reduce
ops HCCL lacks raise ``ValueError``, and constructing it is collective (every rank must
construct it: the unique id is broadcast from rank 0 and a warm-up all-reduce runs).
``device`` is kept as the real one keeps it (``npu:N``); tensors on the CPU -- where every
simulated NPU tensor lives -- are accepted as being on it.
"""

import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup, ReduceOp
from vllm.distributed.utils import StatelessProcessGroup
from vllm.logger import logger

from npu_compat.testing._boundary import host_device
from npu_compat.testing._libhccl import exec_timeout_s

#: ``sizeof(HcclRootInfo)``: the real ``hcclUniqueId`` is ``ctypes.c_byte * 4108``.
HCCL_UNIQUE_ID_BYTES = 4108

_HCCL_DTYPES = (
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.bfloat16,
)
_HCCL_OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.MIN)


def _check_dtype(dtype: Any) -> None:
    # hcclDataTypeEnum.from_torch
    if dtype not in _HCCL_DTYPES:
        raise ValueError(f"Unsupported dtype: {dtype}")


def _check_op(op: Any) -> None:
    # hcclRedOpTypeEnum.from_torch
    if not any(op == known for known in _HCCL_OPS):
        raise ValueError(f"Unsupported op: {op}")


def _reduce(parts: list[Any], op: Any) -> Any:
    result = parts[0].clone()
    for part in parts[1:]:
        if op == ReduceOp.SUM:
            result.add_(part)
        elif op == ReduceOp.PRODUCT:
            result.mul_(part)
        elif op == ReduceOp.MAX:
            result = torch.maximum(result, part)
        else:
            result = torch.minimum(result, part)
    return result


def _check_device(comm: "PyHcclCommunicator", tensor: torch.Tensor) -> None:
    # hccl communicator created on a specific device
    # will only work on tensors on the same device
    assert tensor.device == comm.device or tensor.device == host_device(comm.device), (
        f"this hccl communicator is created to work on {comm.device}, "
        f"but the input tensor is on {tensor.device}"
    )


class _SimulatedHcclComm:
    """Stands where the real ``hcclComm_t`` handle is: which group, which rank, which id."""

    def __init__(self, unique_id: bytes, rank: int, world_size: int) -> None:
        self.unique_id = unique_id
        self.rank = rank
        self.world_size = world_size

    def __repr__(self) -> str:
        return f"<simulated hcclComm rank={self.rank}/{self.world_size}>"


class PyHcclCommunicator:
    def __init__(
        self,
        group: ProcessGroup | StatelessProcessGroup,
        device: int | str | torch.device,
        library_path: str | None = None,
    ):
        """
        Args:
            group: the process group to work on.
            device: the device to bind the PyHcclCommunicator to (``npu:N``; an int N
                means ``npu:N``).
            library_path: the path to the HCCL library (ignored: no library is loaded).
        It is the caller's responsibility to make sure each communicator
        is bind to a unique device.
        """

        if not isinstance(group, StatelessProcessGroup):
            assert dist.is_initialized()
            assert dist.get_backend(group) != dist.Backend.HCCL, (
                "PyHcclCommunicator should be attached to a non-HCCL group."
            )
            # note: this rank is the rank in the group
            self.rank = dist.get_rank(group)
            self.world_size = dist.get_world_size(group)
        else:
            self.rank = group.rank
            self.world_size = group.world_size

        self.group = group

        # if world_size == 1, no need to create communicator
        if self.world_size == 1:
            self.available = False
            self.disabled = True
            return

        # The real one loads libhccl.so here (and disables itself when that fails).
        self.hccl = None
        self.available = True
        self.disabled = False

        logger.info("vLLM is using pyhccl (simulated: collectives over the group, on CPU tensors)")

        if isinstance(device, int):
            device = torch.device(f"npu:{device}")
        elif isinstance(device, str):
            device = torch.device(device)
        # now `device` is a `torch.device` object
        assert isinstance(device, torch.device)
        self.device = device

        if self.rank == 0:
            with torch.npu.device(device):
                self.unique_id = os.urandom(HCCL_UNIQUE_ID_BYTES)
        else:
            self.unique_id = bytes(HCCL_UNIQUE_ID_BYTES)

        if not isinstance(group, StatelessProcessGroup):
            tensor = torch.tensor(list(self.unique_id), dtype=torch.uint8)
            ranks = dist.get_process_group_ranks(group)
            # arg `src` in `broadcast` is the global rank
            dist.broadcast(tensor, src=ranks[0], group=group)
            self.unique_id = bytes(tensor.tolist())
        else:
            self.unique_id = group.broadcast_obj(self.unique_id, src=0)

        with torch.npu.device(device):
            self.comm = _SimulatedHcclComm(self.unique_id, self.rank, self.world_size)
            self._ops = 0  # the broadcasts so far: every rank makes the same ones, in the same order

            stream = torch.npu.current_stream()
            # A small all_reduce for warmup.
            data = torch.zeros(1, device=host_device(device))
            self.all_reduce(data)
            stream.synchronize()
            del data

    def all_reduce(self, in_tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM, stream=None) -> torch.Tensor:
        if self.disabled:
            return None
        _check_device(self, in_tensor)
        _check_dtype(in_tensor.dtype)
        _check_op(op)

        if stream is None:
            stream = torch.npu.current_stream()
        if isinstance(self.group, StatelessProcessGroup):
            parts = self.group.all_gather_obj(in_tensor.detach().cpu())
            out_tensor = _reduce(parts, op).to(in_tensor.device)
        else:
            out_tensor = in_tensor.detach().clone()
            dist.all_reduce(out_tensor, op=op, group=self.group)
        return out_tensor

    def broadcast(self, tensor: torch.Tensor, src: int, stream=None):
        if self.disabled:
            return
        _check_device(self, tensor)
        _check_dtype(tensor.dtype)
        if stream is None:
            stream = torch.npu.current_stream()
        if isinstance(self.group, StatelessProcessGroup):
            if src == self.rank:
                self.group.broadcast_obj(tensor.detach().cpu(), src=src)
                _wait_for_peers(self, "HcclBroadcast")
            else:
                _wait_for_source(self, src, "HcclBroadcast")
                received = self.group.broadcast_obj(None, src=src)
                if received.shape != tensor.shape or received.dtype != tensor.dtype:
                    raise RuntimeError(
                        f"simulated HCCL broadcast: rank {src} sent {received.dtype}{list(received.shape)}, "
                        f"rank {self.rank} expects {tensor.dtype}{list(tensor.shape)}"
                    )
                with torch.no_grad():
                    tensor.copy_(received)
                _took_part(self)
        else:
            dist.broadcast(tensor, src=dist.get_process_group_ranks(self.group)[src], group=self.group)


# -- a collective's end: every rank took part (StatelessProcessGroup only) ---------------------------
# Module functions, not methods: the class keeps the real one's methods, no more.


def _done_key(comm: PyHcclCommunicator) -> str:
    return f"pyhccl/{comm.unique_id[:8].hex()}/done/{comm._ops}"


def _took_part(comm: PyHcclCommunicator) -> None:
    """A receiver's side of a collective: tell the source it took part."""
    comm.group.store.add(_done_key(comm), 1)
    comm._ops += 1


def _wait_for_source(comm: PyHcclCommunicator, src: int, op: str) -> None:
    """A receiver's side of a collective: wait, within ``HCCL_EXEC_TIMEOUT``, for the source's data (the
    group's store would wait its own timeout, 300 s by default); raise as HCCL's task does."""
    group = comm.group
    assert isinstance(group, StatelessProcessGroup)
    key = f"broadcast_from/{src}/{group.broadcast_recv_src_counter[src]}"  # broadcast_obj's next key
    bound = exec_timeout_s()
    try:
        group.store.wait([key], timedelta(seconds=bound))
    except RuntimeError as exc:  # torch's DistStoreError: the wait timed out, or the store is gone
        raise RuntimeError(
            f"simulated HCCL: {op} to rank {comm.rank} of {comm.world_size} did not complete within "
            f"HCCL_EXEC_TIMEOUT={bound:g} s: source rank {src} never sent (a peer process gone, or stuck "
            f"before this collective): {exc}"
        ) from exc


def _wait_for_peers(comm: PyHcclCommunicator, op: str) -> None:
    """The source's side of a collective: wait, within ``HCCL_EXEC_TIMEOUT``, until every other rank has
    taken part; raise as HCCL's task does when one never does."""
    key, peers, bound = _done_key(comm), comm.world_size - 1, exec_timeout_s()
    comm._ops += 1
    deadline = time.monotonic() + bound
    pause = 0.0005
    while (done := comm.group.store.add(key, 0)) < peers:
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"simulated HCCL: {op} from rank {comm.rank} of {comm.world_size} did not complete "
                f"within HCCL_EXEC_TIMEOUT={bound:g} s: {peers - done} of {peers} peer ranks never took "
                "part (a peer process gone, or stuck before this collective)"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
