"""What the simulated Ascend's ``libhccl.so`` does behind its C entry points: root infos, communicators and
collectives, between the processes of one simulated host.

The library (``_npu_backend/libhccl/hccl.cpp``) has HCCL's real names, signatures and result codes, and hands
each call here with the GIL held.  vllm-ascend's ``PyHcclCommunicator`` loads it with ctypes and calls it as
it calls CANN's, so the real ``pyhccl.py`` and ``pyhccl_wrapper.py`` run unchanged above it.

* ``HcclGetRootInfo`` starts a TCP store on this host and writes its address and a nonce into the 4108-byte
  root info: as on the device, the root rank listens and the others connect to it.  The address is
  ``HCCL_IF_IP`` where set, else the loopback (the simulated nodes share one machine).
* ``HcclCommInitRootInfo`` joins: it waits for every rank, within ``HCCL_CONNECT_TIMEOUT`` (CANN's default 120
  s), and fails with ``HCCL_E_TIMEOUT`` and HCCL's ``EI0006`` words past it; a rank given twice is
  ``HCCL_E_PARA``.
* ``HcclBroadcast`` and ``HcclAllReduce`` read and write the bytes at the addresses they are given (the
  simulated NPU's memory is host memory) and move them through the store.  The simulated streams run work
  when it is issued, so a collective returns once every rank took part; one whose peer never comes fails
  within ``HCCL_EXEC_TIMEOUT`` (Atlas A2's default 1836 s) with ``HCCL_E_TIMEOUT``, naming the missing ranks.
* Reduction ops and data types are HCCL's enums (``hccl_types.h``); one HCCL cannot reduce is
  ``HCCL_E_NOT_SUPPORT``.

Kinder than the device: no HCCL listen ports are bound (``HCCL_IF_BASE_PORT``, the socket port ranges), the
stream handle is not checked, and an address is not checked to be the communicator's device's memory.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .. import _env

#: ``HcclResult`` (hccl_types.h)
SUCCESS, E_PARA, E_PTR, E_NOT_SUPPORT, E_TIMEOUT, E_TCP_CONNECT = 0, 1, 2, 5, 9, 11
#: ``sizeof(HcclRootInfo)`` (``HCCL_ROOT_INFO_BYTES``)
ROOT_INFO_BYTES = 4108
_MAGIC = b"npu-compat simulated HcclRootInfo\n"

#: ``HcclDataType`` -> (torch dtype, item size); None where torch has no such dtype (bytes still move)
DATA_TYPES: dict[int, tuple[torch.dtype | None, int]] = {
    0: (torch.int8, 1),
    1: (torch.int16, 2),
    2: (torch.int32, 4),
    3: (torch.float16, 2),
    4: (torch.float32, 4),
    5: (torch.int64, 8),
    6: (torch.uint64, 8),
    7: (torch.uint8, 1),
    8: (torch.uint16, 2),
    9: (torch.uint32, 4),
    10: (torch.float64, 8),
    11: (torch.bfloat16, 2),
    12: (None, 16),  # HCCL_DATA_TYPE_INT128
}
#: ``HcclReduceOp``: sum, prod, max, min
REDUCE_OPS = {0: "sum", 1: "prod", 2: "max", 3: "min"}


@dataclass
class Communicator:
    """What an ``HcclComm`` handle stands for in this process."""

    store: Any
    rank: int
    size: int
    nonce: str
    ops: int = 0

    def next_op(self) -> str:
        self.ops += 1
        return f"op/{self.ops}"


#: the TCP stores this process serves as a root rank, by nonce (kept for the communicators' lifetime)
_served: dict[str, Any] = {}
_communicators: dict[int, Communicator] = {}
_handles = itertools.count(0x5C0001)


def _log(message: str) -> None:
    sys.stderr.write(f"[ERROR] HCCL(simulated) pid {os.getpid()}: {message}\n")
    sys.stderr.flush()


def _seconds(name: str, default: int) -> float:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return float(default)


def connect_timeout_s() -> float:
    return _seconds(_env.HCCL_CONNECT_TIMEOUT, _env.HCCL_CONNECT_TIMEOUT_DEFAULT_S)


def exec_timeout_s() -> float:
    return _seconds(_env.HCCL_EXEC_TIMEOUT, _env.HCCL_EXEC_TIMEOUT_DEFAULT_S)


def get_root_info(root_info: int) -> int:
    if not root_info:
        return E_PTR
    host = os.environ.get(_env.HCCL_IF_IP) or "127.0.0.1"
    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    nonce = os.urandom(8).hex()
    _served[nonce] = store
    payload = _MAGIC + json.dumps({"host": host, "port": store.port, "nonce": nonce}).encode()
    ctypes.memmove(root_info, payload.ljust(ROOT_INFO_BYTES, b"\0"), ROOT_INFO_BYTES)
    return SUCCESS


def comm_init_root_info(ranks: int, root_info: int, rank: int, comm: int) -> int:
    if not root_info or not comm:
        return E_PTR
    if ranks < 1 or rank >= ranks:
        _log(f"HcclCommInitRootInfo: rank {rank} of {ranks} ranks")
        return E_PARA
    raw = ctypes.string_at(root_info, ROOT_INFO_BYTES)
    if not raw.startswith(_MAGIC):
        _log("HcclCommInitRootInfo: the root info was not made by HcclGetRootInfo")
        return E_PARA
    where = json.loads(raw[len(_MAGIC) :].rstrip(b"\0"))
    bound = connect_timeout_s()
    # each rank its own connection, also the root's and ranks in threads of one process: a store client runs
    # one request at a time, so ranks sharing one would wait on each other's blocking waits for good
    try:
        store = dist.TCPStore(where["host"], where["port"], is_master=False, timeout=timedelta(seconds=bound))
    except (RuntimeError, OSError) as exc:
        root = f"{where['host']}:{where['port']}"
        _log(f"HcclCommInitRootInfo: rank {rank} cannot reach the root at {root}: {exc}")
        return E_TCP_CONNECT
    store = dist.PrefixStore(f"hccl/{where['nonce']}/", store)
    if store.add(f"claim/{rank}", 1) > 1:
        _log(f"HcclCommInitRootInfo: rank {rank} of {ranks} joined twice")
        return E_PARA
    store.set(f"joined/{rank}", b"1")
    try:
        store.wait([f"joined/{r}" for r in range(ranks)], timedelta(seconds=bound))
    except RuntimeError:
        missing = [r for r in range(ranks) if not store.check([f"joined/{r}"])]
        _log(
            f"EI0006: getting socket times out: rank {rank} of {ranks} waited "
            f"HCCL_CONNECT_TIMEOUT={bound:g} s for ranks {missing} to join"
        )
        return E_TIMEOUT
    handle = next(_handles)
    _communicators[handle] = Communicator(store, rank, ranks, where["nonce"])
    ctypes.c_void_p.from_address(comm).value = handle
    return SUCCESS


def _communicator(comm: int, call: str) -> Communicator | None:
    found = _communicators.get(comm)
    if found is None:
        _log(f"{call}: {comm:#x} is not a communicator of this process")
    return found


def _wait_for(c: Communicator, keys: list[str], call: str) -> bool:
    bound = exec_timeout_s()
    try:
        c.store.wait(keys, timedelta(seconds=bound))
    except RuntimeError:
        missing = [k for k in keys if not c.store.check([k])]
        _log(
            f"{call} on rank {c.rank} of {c.size} did not complete within HCCL_EXEC_TIMEOUT={bound:g} s: "
            f"{len(missing)} of {len(keys)} parts never came (a peer process gone, or stuck before this "
            "collective)"
        )
        return False
    return True


def _wait_count(c: Communicator, key: str, count: int, call: str) -> bool:
    bound = exec_timeout_s()
    deadline, pause = time.monotonic() + bound, 0.0005
    while (done := c.store.add(key, 0)) < count:
        if time.monotonic() >= deadline:
            _log(
                f"{call} from rank {c.rank} of {c.size} did not complete within "
                f"HCCL_EXEC_TIMEOUT={bound:g} s: {count - done} of {count} peer ranks never took part"
            )
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


def broadcast(buf: int, count: int, data_type: int, root: int, comm: int, stream: int) -> int:
    del stream
    c = _communicator(comm, "HcclBroadcast")
    if c is None:
        return E_PARA
    if data_type not in DATA_TYPES or not 0 <= root < c.size:
        _log(f"HcclBroadcast: data type {data_type}, root {root} of {c.size}")
        return E_PARA
    size = count * DATA_TYPES[data_type][1]
    if size and not buf:
        return E_PTR
    op = c.next_op()
    if c.rank == root:
        c.store.set(f"{op}/data", ctypes.string_at(buf, size) if size else b"")
        if not _wait_count(c, f"{op}/done", c.size - 1, "HcclBroadcast"):
            return E_TIMEOUT
        c.store.delete_key(f"{op}/data")
        c.store.delete_key(f"{op}/done")
        return SUCCESS
    if not _wait_for(c, [f"{op}/data"], "HcclBroadcast"):
        return E_TIMEOUT
    data = c.store.get(f"{op}/data")
    if len(data) != size:
        _log(f"HcclBroadcast: root {root} sent {len(data)} bytes, rank {c.rank} expects {size}")
        return E_PARA
    if size:
        ctypes.memmove(buf, data, size)
    c.store.add(f"{op}/done", 1)
    return SUCCESS


def _reduce(parts: list[bytes], dtype: torch.dtype, how: str) -> bytes:
    tensors = [torch.frombuffer(bytearray(p), dtype=dtype) for p in parts]
    result = tensors[0].clone()
    for t in tensors[1:]:
        if how == "sum":
            result.add_(t)
        elif how == "prod":
            result.mul_(t)
        elif how == "max":
            result = torch.maximum(result, t)
        else:
            result = torch.minimum(result, t)
    return bytes(result.view(torch.uint8).numpy().tobytes())


def all_reduce(send: int, recv: int, count: int, data_type: int, op: int, comm: int, stream: int) -> int:
    del stream
    c = _communicator(comm, "HcclAllReduce")
    if c is None:
        return E_PARA
    if data_type not in DATA_TYPES or op not in REDUCE_OPS:
        _log(f"HcclAllReduce: data type {data_type}, reduce op {op}")
        return E_PARA
    dtype, item = DATA_TYPES[data_type]
    if dtype is None:
        _log(f"HcclAllReduce: data type {data_type} cannot be reduced")
        return E_NOT_SUPPORT
    size = count * item
    if size and not (send and recv):
        return E_PTR
    key = c.next_op()
    c.store.set(f"{key}/{c.rank}", ctypes.string_at(send, size) if size else b"")
    parts = [f"{key}/{r}" for r in range(c.size)]
    if not _wait_for(c, parts, "HcclAllReduce"):
        return E_TIMEOUT
    data = [c.store.get(p) for p in parts]
    if size:
        try:
            reduced = _reduce(data, dtype, REDUCE_OPS[op])
        except (RuntimeError, TypeError) as exc:  # torch has no such arithmetic for the dtype
            _log(f"HcclAllReduce: {REDUCE_OPS[op]} of {dtype}: {exc}")
            return E_NOT_SUPPORT
        ctypes.memmove(recv, reduced, size)
    if c.store.add(f"{key}/done", 1) == c.size:  # the last rank to read cleans up
        for p in [*parts, f"{key}/done"]:
            c.store.delete_key(p)
    return SUCCESS


def _answer(comm: int, out: int, call: str, field: str) -> int:
    """``HcclGetRankSize`` / ``HcclGetRankId``: one of the communicator's numbers into ``*out`` (a uint32)."""
    c = _communicator(comm, call)
    if c is None or not out:
        return E_PARA if c is None else E_PTR
    ctypes.c_uint32.from_address(out).value = getattr(c, field)
    return SUCCESS


def get_rank_size(comm: int, out: int) -> int:
    return _answer(comm, out, "HcclGetRankSize", "size")


def get_rank_id(comm: int, out: int) -> int:
    return _answer(comm, out, "HcclGetRankId", "rank")


def comm_destroy(comm: int) -> int:
    c = _communicators.pop(comm, None)
    if c is None:
        _log(f"HcclCommDestroy: {comm:#x} is not a communicator of this process")
        return E_PARA
    if not any(other.nonce == c.nonce for other in _communicators.values()):
        _served.pop(c.nonce, None)
    return SUCCESS
