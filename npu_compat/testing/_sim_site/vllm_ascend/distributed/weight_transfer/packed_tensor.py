# Mirrors upstream signatures as they are (some unannotated); vLLM ships no stubs for mypy here.
# mypy: disable-error-code="type-arg"
"""SIMULATED vllm_ascend.distributed.weight_transfer.packed_tensor (npu_compat.testing).

Mirrors ``vllm_ascend/distributed/weight_transfer/packed_tensor.py`` of vllm-ascend
0.23.0.post1: the same defaults (1 GiB buffers, 2 of them) and the same packed broadcast
protocol -- the producer concatenates the flattened uint8 views of consecutive tensors
until a buffer holds more than ``buffer_size_bytes``, broadcasts it, and moves on; the
consumer rebuilds the same chunks from the names, shapes and dtypes alone -- so both
sides must use the same buffer size.  Buffers that the real code allocates with
``device="npu"`` live on the CPU here; the ``torch.npu`` streams are the simulation's
(always idle).  The NPU IPC helpers need IPC handles of NPU memory: they stop at the
simulated compute boundary.
"""

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from npu_compat.testing._boundary import host_device, needs_npu

# Default values for packed tensor configuration.
# These are imported by HCCLWeightTransferUpdateInfo and trainer_send_weights.
DEFAULT_PACKED_BUFFER_SIZE_BYTES = 1024 * 1024 * 1024  # 1GB
DEFAULT_PACKED_NUM_BUFFERS = 2


def packed_broadcast_producer(
    iterator: Iterator[tuple[str, torch.Tensor]],
    group: Any,
    src: int,
    post_iter_func: Callable[[tuple[str, torch.Tensor]], torch.Tensor],
    buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
    num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS,
) -> None:
    """Broadcast tensors in a packed manner from trainer to workers (``group``: PyHcclCommunicator)."""
    target_packed_tensor_size = buffer_size_bytes
    device = host_device("npu")

    streams = [torch.npu.Stream() for _ in range(num_buffers)]
    buffer_idx = 0

    packing_tensor_list: list[list[torch.Tensor]] = [[] for _ in range(num_buffers)]
    packing_tensor_sizes: list[int] = [0 for _ in range(num_buffers)]
    packed_tensors: list[torch.Tensor] = [
        torch.empty(0, dtype=torch.uint8, device=device) for _ in range(num_buffers)
    ]

    done = False
    while not done:
        streams[buffer_idx].synchronize()
        with torch.npu.stream(streams[buffer_idx]):
            packing_tensor_list[buffer_idx] = []
            packing_tensor_sizes[buffer_idx] = 0
            while True:
                try:
                    item = next(iterator)
                except StopIteration:
                    done = True
                    break
                # Apply post processing and convert to linearized uint8 tensor
                tensor = post_iter_func(item).contiguous().view(torch.uint8).view(-1)
                packing_tensor_list[buffer_idx].append(tensor)
                packing_tensor_sizes[buffer_idx] += tensor.numel()
                if packing_tensor_sizes[buffer_idx] > target_packed_tensor_size:
                    break
            if len(packing_tensor_list[buffer_idx]) > 0:
                packed_tensors[buffer_idx] = torch.cat(packing_tensor_list[buffer_idx], dim=0)

        if len(packing_tensor_list[buffer_idx]) == 0:
            # No more tensors -- nothing left to broadcast
            break

        streams[buffer_idx].synchronize()
        group.broadcast(packed_tensors[buffer_idx], src=src)

        buffer_idx = (buffer_idx + 1) % num_buffers

    torch.npu.current_stream().synchronize()


def packed_broadcast_consumer(
    iterator: Iterator[tuple[str, tuple[list[int], torch.dtype]]],
    group: Any,
    src: int,
    post_unpack_func: Callable[[list[tuple[str, torch.Tensor]]], None],
    buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
    num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS,
) -> None:
    """Consume packed tensors and unpack them into a list of tensors (``iterator``: name, (shape, dtype))."""

    def unpack_tensor(
        packed_tensor: torch.Tensor,
        names: list[str],
        shapes: list[list[int]],
        dtypes: list[torch.dtype],
        tensor_sizes: list[int],
    ) -> list[tuple[str, torch.Tensor]]:
        """Unpack a packed uint8 tensor into a list of typed tensors."""
        unpacked_tensors = packed_tensor.split(tensor_sizes)
        return [
            (name, tensor.contiguous().view(dtype).view(*shape))
            for name, shape, dtype, tensor in zip(names, shapes, dtypes, unpacked_tensors, strict=False)
        ]

    target_packed_tensor_size = buffer_size_bytes
    device = host_device("npu")

    streams = [torch.npu.Stream() for _ in range(num_buffers)]
    default_stream = torch.npu.current_stream()
    buffer_idx = 0

    packing_tensor_meta_data: list[list[tuple[str, list[int], torch.dtype, int]]] = [
        [] for _ in range(num_buffers)
    ]
    packing_tensor_sizes: list[int] = [0 for _ in range(num_buffers)]
    packed_tensors: list[torch.Tensor] = [
        torch.empty(0, dtype=torch.uint8, device=device) for _ in range(num_buffers)
    ]

    done = False
    while not done:
        streams[buffer_idx].synchronize()
        with torch.npu.stream(streams[buffer_idx]):
            packing_tensor_meta_data[buffer_idx] = []
            packing_tensor_sizes[buffer_idx] = 0
            while True:
                try:
                    name, (shape, dtype) = next(iterator)
                except StopIteration:
                    done = True
                    break
                tensor_size = math.prod(shape) * dtype.itemsize
                packing_tensor_meta_data[buffer_idx].append((name, shape, dtype, tensor_size))
                packing_tensor_sizes[buffer_idx] += tensor_size
                if packing_tensor_sizes[buffer_idx] > target_packed_tensor_size:
                    break
            if len(packing_tensor_meta_data[buffer_idx]) > 0:
                packed_tensors[buffer_idx] = torch.empty(
                    packing_tensor_sizes[buffer_idx],
                    dtype=torch.uint8,
                    device=device,
                )

        if len(packing_tensor_meta_data[buffer_idx]) == 0:
            break

        group.broadcast(packed_tensors[buffer_idx], src=src)

        default_stream.synchronize()

        with torch.npu.stream(streams[buffer_idx]):
            names, shapes, dtypes, tensor_sizes = zip(*packing_tensor_meta_data[buffer_idx], strict=False)
            post_unpack_func(
                unpack_tensor(
                    packed_tensors[buffer_idx],
                    list(names),
                    list(shapes),
                    list(dtypes),
                    list(tensor_sizes),
                )
            )

        buffer_idx = (buffer_idx + 1) % num_buffers

    for s in streams:
        s.synchronize()


# -- NPU IPC packed transfer: IPC handles of NPU memory, not simulated ------------------


def packed_npu_ipc_producer(
    iterator: Iterator[tuple[str, torch.Tensor]],
    npu_uuid: str,
    post_iter_func: Callable[[tuple[str, torch.Tensor]], torch.Tensor],
    buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES,
) -> Iterator[dict[str, Any]]:
    """Pack tensors into a reusable NPU IPC buffer and yield chunks -- not simulated."""
    raise needs_npu("packed_npu_ipc_producer", "IPC handles of NPU memory")
    yield {}  # unreachable: keeps this a generator function, like the real one


def packed_npu_ipc_consumer(
    ipc_handle: dict[str, tuple],
    physical_npu_id: str,
    names: list[str],
    shapes: list[list[int]],
    dtype_names: list[str],
    tensor_sizes: list[int],
    device_index: int,
) -> list[tuple[str, torch.Tensor]]:
    """Unpack a single packed IPC chunk into named tensors -- not simulated."""
    raise needs_npu("packed_npu_ipc_consumer", "IPC handles of NPU memory")
