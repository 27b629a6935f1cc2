"""The torch side of the simulated Ascend: ``torch.npu`` and the ``hccl`` backend.

``install()`` renames PrivateUse1 to ``npu`` (so ``torch.device("npu:0")`` parses),
registers a CPU-backed ``torch.npu`` device module whose functions record every call,
and registers a ``hccl`` torch.distributed backend that builds a real Gloo process
group, so that ``init_process_group("hccl")`` and ``"cpu:gloo,npu:hccl"`` run real
collectives on CPU tensors across processes.  ``torch.cuda`` is not touched:
``torch.cuda.is_available()`` stays False.

What cannot be simulated: memory on an ``npu`` device (``torch.empty(..., device="npu")``
has no allocator behind it).  That is the compute boundary of the simulation.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from .. import _env
from ._boundary import SimulatedComputeBoundary, needs_npu

__all__ = ["CALLS", "SimulatedComputeBoundary", "call_count", "compute_boundary", "counted", "install", "npu"]

F = TypeVar("F", bound=Callable[..., Any])

#: Every call of a ``torch.npu`` function in this process, in order: ``(name, args)``.
CALLS: list[tuple[str, tuple[Any, ...]]] = []
_COUNTS: collections.Counter[str] = collections.Counter()
_LOCK = threading.Lock()
_GIB = 1 << 30
TOTAL_MEMORY = 64 * _GIB  # an Ascend 910B3 has 64 GiB of HBM
DEVICE_NAME = "Ascend910B3 (simulated)"


def _record(fn: F) -> F:
    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            CALLS.append((fn.__name__, args))
            _COUNTS[fn.__name__] += 1
        return fn(*args, **kwargs)

    return recorded  # type: ignore[return-value]


def counted(what: str, fn: F) -> F:
    """``fn`` that counts its calls under ``what`` (read with :func:`call_count`), without keeping
    the arguments (a kernel's are tensors; :data:`CALLS` would hold them for the process's life)."""

    @functools.wraps(fn)
    def counting(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            _COUNTS[what] += 1
        return fn(*args, **kwargs)

    return counting  # type: ignore[return-value]


def compute_boundary(what: str) -> Callable[..., Any]:
    """A stand-in for a torch_npu kernel: importable, and the compute boundary when called."""

    def boundary(*args: Any, **kwargs: Any) -> Any:
        raise needs_npu(what)

    boundary.__name__ = what.rsplit(".", 1)[-1]
    boundary.__qualname__ = what
    return boundary


def call_count(name: str) -> int:
    """How often ``name`` was called: a ``torch.npu`` function (``"synchronize"``) or a computed
    ``torch_npu`` kernel (``"torch_npu.npu_fusion_attention"``)."""
    return _COUNTS[name]


def device_count_from_env() -> int:
    visible = os.environ.get(_env.ASCEND_VISIBLE_DEVICES, "").strip()
    if visible:
        return len([d for d in visible.split(",") if d.strip()])
    return int(os.environ.get(_env.SIMULATE_DEVICES, "2"))


_current = threading.local()


def _index(device: Any = None) -> int:
    if device is None:
        return getattr(_current, "index", 0)
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return device.index if device.index is not None else getattr(_current, "index", 0)
    raise TypeError(f"simulated torch.npu: cannot read a device index from {device!r}")


class _Properties(types.SimpleNamespace):
    pass


class Stream:
    """A stream that is always idle (the CPU runs everything synchronously)."""

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        self.device = torch.device("npu", _index(device))
        self.priority = priority

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Stream) -> None:
        pass

    def wait_event(self, event: Event) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, **_: Any) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Stream | None = None) -> None:
        pass

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Event) -> float:
        return 0.0


def _build_module() -> types.ModuleType:
    npu = types.ModuleType(
        "torch.npu", "SIMULATED torch.npu (npu_compat.testing): CPU-backed, records calls."
    )
    npu.SIMULATED = True  # type: ignore[attr-defined]
    npu.Stream = Stream  # type: ignore[attr-defined]
    npu.Event = Event  # type: ignore[attr-defined]
    default_streams: dict[int, Stream] = {}

    @_record
    def is_available() -> bool:
        return True

    @_record
    def is_initialized() -> bool:
        return True

    @_record
    def init() -> None:
        pass

    @_record
    def device_count() -> int:
        return device_count_from_env()

    @_record
    def current_device() -> int:
        return _index()

    @_record
    def set_device(device: Any) -> None:
        index = _index(device)
        if not 0 <= index < device_count_from_env():
            raise RuntimeError(f"simulated torch.npu.set_device: invalid device {index}")
        _current.index = index

    @_record
    def synchronize(device: Any = None) -> None:
        pass

    @_record
    def empty_cache() -> None:
        pass

    @_record
    def current_stream(device: Any = None) -> Stream:
        return default_streams.setdefault(_index(device), Stream(device))

    @_record
    def default_stream(device: Any = None) -> Stream:
        return default_streams.setdefault(_index(device), Stream(device))

    @_record
    def set_stream(stream: Stream) -> None:
        pass

    @contextlib.contextmanager
    def stream(s: Stream | None) -> Iterator[Stream | None]:
        yield s

    @_record
    def get_device_capability(device: Any = None) -> None:
        # torch_npu answers None: CANN has no notion of a compute capability.
        return None

    @_record
    def get_device_properties(device: Any = None) -> _Properties:
        return _Properties(
            name=DEVICE_NAME, total_memory=TOTAL_MEMORY, multi_processor_count=24, index=_index(device)
        )

    @_record
    def get_device_name(device: Any = None) -> str:
        return DEVICE_NAME

    @_record
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return (TOTAL_MEMORY - 2 * _GIB, TOTAL_MEMORY)

    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        npu.__dict__[name] = _record(types.FunctionType((lambda device=None: 0).__code__, {}, name, (None,)))

    @_record
    def reset_peak_memory_stats(device: Any = None) -> None:
        pass

    @_record
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        pass

    @_record
    def manual_seed(seed: int) -> None:
        pass

    @_record
    def manual_seed_all(seed: int) -> None:
        pass

    @_record
    def ipc_collect() -> None:
        pass

    def _is_in_bad_fork() -> bool:  # torch.manual_seed asks every device module (as torch_npu's)
        return False

    class device:
        def __init__(self, dev: Any) -> None:
            self.index = _index(dev)
            self.prev = 0

        def __enter__(self) -> None:
            self.prev = _index()
            _current.index = self.index

        def __exit__(self, *exc: object) -> None:
            _current.index = self.prev

    for fn in (
        is_available, is_initialized, init, device_count, current_device, set_device, synchronize,
        empty_cache, current_stream, default_stream, set_stream, stream, get_device_capability,
        get_device_properties, get_device_name, mem_get_info, reset_peak_memory_stats,
        set_per_process_memory_fraction, manual_seed, manual_seed_all, ipc_collect, _is_in_bad_fork,
    ):  # fmt: skip
        setattr(npu, fn.__name__, fn)
    npu.device = device  # type: ignore[attr-defined]
    npu.calls = CALLS  # type: ignore[attr-defined]
    npu.call_count = call_count  # type: ignore[attr-defined]
    return npu


npu = _build_module()


def _create_hccl(store: Any, rank: int, world_size: int, timeout: Any) -> Any:
    """The simulated HCCL process group: a real Gloo group (CPU tensors)."""
    from torch.distributed import ProcessGroupGloo

    return ProcessGroupGloo(store, rank, world_size, timeout)


def _accelerator_bindings() -> dict[str, Callable[..., Any]]:
    """Stand-ins for the C++ half of ``torch.accelerator`` that torch_npu's core provides.

    ``torch.accelerator.*`` calls ``torch._C._accelerator_*`` at call time; without a
    PrivateUse1 device guard those raise "PyTorch is not linked with support for npu
    devices".  These answer from the simulated ``torch.npu`` instead.
    """

    def exchange(index: int) -> int:
        previous = _index()
        if index >= 0:
            _current.index = index
        return previous

    return {
        # torch.distributed asks this for the accelerator (barrier, default devices); the
        # C++ version needs torch_npu's PrivateUse1 hooks, which cannot exist here.
        "_get_accelerator": lambda check=False: torch.device("npu"),
        "_accelerator_getDeviceIndex": lambda: npu.current_device(),
        "_accelerator_setDeviceIndex": lambda index: npu.set_device(index) if index >= 0 else None,
        "_accelerator_exchangeDevice": exchange,
        "_accelerator_maybeExchangeDevice": exchange,
        "_accelerator_getStream": lambda index: npu.current_stream(index),
        "_accelerator_setStream": lambda stream: None,
        "_accelerator_synchronizeDevice": lambda index: npu.synchronize(index),
        "_accelerator_isAllocatorInitialized": lambda: True,
        "_accelerator_emptyCache": lambda: npu.empty_cache(),
        "_accelerator_getMemoryInfo": lambda index: npu.mem_get_info(index),
    }


def _unbind_simulated_hccl_groups() -> None:
    """A group built for ``hccl`` with ``device_id=npu:N`` is bound to that device, and torch then
    allocates its barrier tensor there.  The simulated HCCL computes on CPU tensors, so its groups
    are left unbound (barrier then runs on the CPU); other backends are untouched."""
    import torch.distributed.distributed_c10d as c10d

    original = c10d._new_process_group_helper
    if getattr(original, "_npu_compat_sim", False):
        return

    @functools.wraps(original)
    def helper(*args: Any, **kwargs: Any) -> Any:
        pg, store = original(*args, **kwargs)
        backend = kwargs["backend"] if "backend" in kwargs else args[3] if len(args) > 3 else None
        if "hccl" in str(backend).lower().replace("npu:hccl", "hccl").split(","):
            pg.bound_device_id = None
        return pg, store

    helper._npu_compat_sim = True  # type: ignore[attr-defined]
    c10d._new_process_group_helper = helper


def install() -> None:
    """Register ``npu`` and ``hccl`` with this process's torch.  Idempotent; cannot be undone."""
    if getattr(sys.modules.get("torch.npu"), "SIMULATED", False):
        return
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    torch._register_device_module("npu", npu)
    for name, binding in _accelerator_bindings().items():
        setattr(torch._C, name, binding)
    with contextlib.suppress(RuntimeError):  # methods already generated
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=False)
    import torch.distributed as dist

    if dist.is_available():
        _unbind_simulated_hccl_groups()
    if dist.is_available() and "hccl" not in dist.Backend.backend_list:
        # torch_npu registers hccl for "npu" only; the simulation also claims "cpu"
        # because every simulated tensor lives on the CPU.  "cpu:gloo,npu:hccl" still
        # sends CPU tensors to gloo, as on a real host.
        dist.Backend.register_backend("hccl", _create_hccl, devices=["npu", "cpu"])
