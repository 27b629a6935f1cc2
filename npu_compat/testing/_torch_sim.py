"""The torch side of the simulated Ascend: ``torch.npu`` and the ``hccl`` backend.

``install()`` renames PrivateUse1 to ``npu`` (so ``torch.device("npu:0")`` parses), loads
the simulated NPU's C++ backend (:mod:`._npu_backend`, compiled on first use), registers
the ``torch.npu`` device module -- every call of its functions recorded -- and registers an
``hccl`` torch.distributed backend.  ``torch.cuda`` is not touched:
``torch.cuda.is_available()`` stays False.

With the backend, ``npu`` tensors are real tensors in host memory: every operator
computes (the CPU kernels, on the same memory), autograd and optimizers run, each
device counts its allocations (``memory_allocated``/``max_*``/``mem_get_info`` against
a capacity, ``torch.OutOfMemoryError`` past it), has a current device per thread, a
generator (``manual_seed``, ``get/set_rng_state``), synchronous streams and events,
pinned host memory and ``torch.save``/``torch.load``.  ``hccl`` is a Gloo group
that runs each collective on CPU tensors aliasing the ``npu`` tensors' memory.

Without it (no C++ compiler or no ninja: one warning says which), ``npu`` tensors are
the compute boundary: any operator on one raises :class:`SimulatedComputeBoundary`
with that reason, and ``hccl`` runs Gloo on CPU tensors only.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import os
import re
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from .. import _env
from . import _npu_graphs as _graphs
from ._boundary import SimulatedComputeBoundary, needs_npu
from ._npu_backend import failure as backend_failure
from ._npu_backend import load as load_backend
from ._npu_graphs import NAMES as _GRAPH_NAMES

__all__ = [
    "CALLS",
    "SimulatedComputeBoundary",
    "call_count",
    "compute_boundary",
    "counted",
    "install",
    "npu",
    "simulated_counts",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Every call of a ``torch.npu`` function in this process, in order: ``(name, args)``.
CALLS: list[tuple[str, tuple[Any, ...]]] = []
_COUNTS: collections.Counter[str] = collections.Counter()
_LOCK = threading.Lock()
_GIB = 1 << 30
TOTAL_MEMORY = _env.SIMULATED_NPU_MEMORY  # an Ascend 910B3 has 64 GiB of HBM
DEVICE_NAME = f"{_env.SIMULATED_SOC} (simulated)"

#: The C++ backend once :func:`install` loaded it; ``None`` at the compute boundary.
NATIVE: Any = None


def _record(fn: F) -> F:
    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            CALLS.append((fn.__name__, args))
            _COUNTS[fn.__name__] += 1
        return fn(*args, **kwargs)

    return recorded  # type: ignore[return-value]


def counted(what: str, fn: F, variant: Callable[[tuple[Any, ...], dict[str, Any]], str] | None = None) -> F:
    """``fn`` that counts its calls under ``what`` (read with :func:`call_count`), without keeping
    the arguments (a kernel's are tensors; :data:`CALLS` would hold them for the process's life);
    with ``variant``, also under ``what[variant(args, kwargs)]`` (``torch_npu.npu_fusion_attention[TND]``).
    Counts of ``torch_npu`` kernels reach the process's report (:func:`simulated_counts`)."""

    @functools.wraps(fn)
    def counting(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            _COUNTS[what] += 1
            if variant is not None:
                _COUNTS[f"{what}[{variant(args, kwargs)}]"] += 1
        _keep_counts_reported()
        return fn(*args, **kwargs)

    return counting  # type: ignore[return-value]


def simulated_counts() -> dict[str, dict[str, int]]:
    """What the simulated Ascend computed in this process: each ``torch_npu`` kernel's calls
    (``kernels``, ``npu_fusion_attention`` also by layout) and each collective run over ``hccl``
    (``hccl``, by its torch.distributed name).  The ``simulated`` section of the process's report."""
    with _LOCK:
        kernels = {name: n for name, n in sorted(_COUNTS.items()) if name.startswith("torch_npu.")}
    collectives = dict(NATIVE.collective_counts()) if NATIVE is not None else {}
    return {"kernels": kernels, "hccl": collectives}


#: The PID that already decided whether its counts are reported (a forked child decides anew).
_decided: list[int] = []


def _keep_counts_reported() -> None:
    """Once per process that writes a report (``NPU_COMPAT_REPORT_DIR``): :func:`simulated_counts`
    becomes its ``simulated`` section, which the report's watcher thread rewrites when it changed
    (:data:`npu_compat._reportfile.WATCH_EVERY_S`), and once more at exit.  A Ray worker is often
    SIGKILLed, so the report never waits for the exit alone.  Called on every kernel call: after
    the first, a process pays one ``getpid``."""
    pid = os.getpid()
    if _decided and _decided[0] == pid:
        return
    with _LOCK:
        if _decided and _decided[0] == pid:
            return
        _decided[:] = [pid]
    if not os.environ.get(_env.REPORT_DIR):
        return
    from .. import _reportfile

    _reportfile.SECTIONS["simulated"] = simulated_counts
    atexit.register(_reportfile.write)


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


def host_device_count(environ: Mapping[str, str] | None = None) -> int:
    """The NPUs the simulated host has (``NPU_COMPAT_SIMULATE_DEVICES``, default 2): what the
    driver reports, whatever a process is shown of them."""
    env = os.environ if environ is None else environ
    raw = env.get(_env.SIMULATE_DEVICES, "2")
    count = _env.parse_count(raw)
    if count is None:
        raise ValueError(f"{_env.SIMULATE_DEVICES}={raw!r}: {_env.COUNT_HINT}")
    return count


def visible_device_count(visible: str | None, host_devices: int) -> int:
    """How many of ``host_devices`` NPUs ``ASCEND_RT_VISIBLE_DEVICES=visible`` (None: unset) shows.

    torch_npu's own reading (``npu/__init__.py``, ``_parse_visible_devices`` and
    ``_device_count_ascend_hal``): unset shows every device; ids are read up to the first character
    that is neither a digit nor a comma, and up to an empty element; ids that do not ascend show
    none; an id past the host's last NPU ends the list.  The backend counts the same way at a
    process's first use of a device.
    """
    if visible is None:
        return host_devices
    end = 0
    while end < len(visible) and (visible[end].isdigit() or visible[end] == ","):
        end += 1
    ids: list[int] = []
    for element in visible[:end].split(",") if end else []:
        if not element:
            break
        ident = int(element)
        if ids and ident <= ids[-1]:
            return 0
        if ident >= host_devices:
            break
        ids.append(ident)
    return len(ids)


def device_count_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The simulated NPUs a process with ``environ`` (default: this one's) sees."""
    env = os.environ if environ is None else environ
    return visible_device_count(env.get(_env.ASCEND_VISIBLE_DEVICES), host_device_count(env))


def memory_capacity_from_env() -> int:
    """Bytes of memory per simulated NPU: ``NPU_COMPAT_SIMULATE_NPU_MEMORY`` or 64 GiB."""
    raw = os.environ.get(_env.SIMULATE_NPU_MEMORY, "").strip()
    if not raw:
        return TOTAL_MEMORY
    size = _env.parse_size(raw)
    if size is None:
        raise ValueError(f"{_env.SIMULATE_NPU_MEMORY}={raw!r}: {_env.SIZE_HINT}")
    return size


_current = threading.local()


def _counted() -> bool:
    """Whether this process used a device yet: the runtime counts the visible NPUs then, once."""
    return NATIVE is not None and bool(NATIVE.devices_counted())


def _index(device: Any = None) -> int:
    if device is None:
        return NATIVE.current_device() if NATIVE is not None else getattr(_current, "index", 0)
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return device.index if device.index is not None else _index()
    raise TypeError(f"simulated torch.npu: cannot read a device index from {device!r}")


def _set_index(index: int) -> None:
    if NATIVE is not None:
        NATIVE.set_device(index)
    else:
        _current.index = index


class _Properties(types.SimpleNamespace):
    pass


class _IdleStream:
    """A stream that is always idle (the CPU runs everything synchronously); at the boundary."""

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        self.device = torch.device("npu", _index(device))
        self.priority = priority

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        event = event or _IdleEvent()
        event.record(self)
        return event

    def __enter__(self) -> _IdleStream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _IdleEvent:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, **_: Any) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Any) -> float:
        return 0.0


class Stream(torch.Stream):  # type: ignore[misc]
    """An ``npu`` stream (torch's own ``torch.Stream``): work on it is done when it is issued."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        if kwargs:  # stream_id=, device_index=, device_type=: an existing stream
            return super().__new__(cls, **kwargs)  # type: ignore[no-any-return]
        where = torch.device("npu", _index(device))
        return super().__new__(cls, device=where, priority=priority)  # type: ignore[no-any-return]

    @property
    def npu_stream(self) -> int:
        """The stream's handle (torch_npu gives the ``aclrtStream`` address; the id names it here)."""
        return int(self.stream_id)

    def synchronize(self) -> None:
        """Done at once; the compute boundary while an ACL graph replay on it is held (it would wait)."""
        _graphs.check_no_held_replay(f"synchronize() of npu stream {self.stream_id}", int(self.stream_id))
        super().synchronize()

    @classmethod
    def _of(cls, stream: Any) -> Stream:
        return cls(
            stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type
        )


#: torch's own event class: vllm-ascend sets ``torch.Event = torch.npu.Event`` for good, and an event is
#: still made of this one (whose C++ methods take only their own type).
_TORCH_EVENT = torch.Event


class Event:
    """``torch.npu.Event(...)``: a ``torch.Event`` on the current ``npu`` device (recorded at once; timing
    is host time)."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> Any:
        return _TORCH_EVENT(
            device=torch.device("npu", _index()), enable_timing=enable_timing, blocking=blocking,
            interprocess=interprocess,
        )  # fmt: skip


def _build_module() -> types.ModuleType:
    npu = types.ModuleType(
        "torch.npu", "SIMULATED torch.npu (npu_compat.testing): host memory, calls recorded."
    )
    npu.SIMULATED = True  # type: ignore[attr-defined]
    # install() gives torch's own streams and events where the backend is loaded
    npu.Stream = _IdleStream  # type: ignore[attr-defined]
    npu.Event = _IdleEvent  # type: ignore[attr-defined]
    idle_streams: dict[int, _IdleStream] = {}

    def _stream_of(device: Any) -> Any:
        if NATIVE is None:
            return idle_streams.setdefault(_index(device), _IdleStream(device))
        return Stream._of(torch._C._accelerator_getStream(_index(device)))

    @_record
    def is_available() -> bool:
        return True

    @_record
    def is_initialized() -> bool:
        return _counted()

    @_record
    def init() -> None:
        _lazy_init()

    @_record
    def device_count() -> int:
        # torch_npu's: not fixed before the device's first use, so that ASCEND_RT_VISIBLE_DEVICES
        # may still change; from then on the count the runtime made
        if not _counted():
            return device_count_from_env()
        _lazy_init()
        return int(NATIVE.device_count())

    @_record
    def current_device() -> int:
        _lazy_init()
        return _index()

    @_record
    def set_device(device: Any) -> None:
        index = _index(device)
        if not 0 <= index < device_count():
            raise RuntimeError(f"simulated torch.npu.set_device: invalid device {index}")
        _set_index(index)
        _lazy_init()

    @_record
    def synchronize(device: Any = None) -> None:
        # every operator is done when it returns, but a held ACL graph replay
        _graphs.check_no_held_replay("torch.npu.synchronize()")

    @_record
    def empty_cache() -> None:
        pass  # nothing is cached: freed memory goes back to the host at once

    @_record
    def set_compile_mode(jit_compile: bool = False) -> None:
        """torch_npu's ``npu_config.set_compile_mode``: whether CANN compiles operators just in time
        (``jitCompile``) or runs its binary kernels; the simulation computes every operator alike."""
        if is_initialized():
            synchronize()

    @_record
    def current_stream(device: Any = None) -> Any:
        return _stream_of(device)

    @_record
    def default_stream(device: Any = None) -> Any:
        if NATIVE is None:
            return _stream_of(device)
        current = torch._C._accelerator_getStream(_index(device))
        return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)

    @_record
    def set_stream(stream: Any) -> None:
        if NATIVE is not None and stream is not None:
            torch._C._accelerator_setStream(stream)

    @contextlib.contextmanager
    def stream(s: Any) -> Iterator[Any]:
        if NATIVE is None or s is None:
            yield s
            return
        previous = torch._C._accelerator_getStream(s.device_index)
        torch._C._accelerator_setStream(s)
        try:
            yield s
        finally:
            torch._C._accelerator_setStream(previous)

    @_record
    def get_device_capability(device: Any = None) -> None:
        # torch_npu answers None: CANN has no notion of a compute capability.
        return None

    @_record
    def get_device_properties(device: Any = None) -> _Properties:
        return _Properties(
            name=DEVICE_NAME, total_memory=_capacity(), multi_processor_count=24, index=_index(device)
        )

    @_record
    def get_device_name(device: Any = None) -> str:
        return DEVICE_NAME

    @_record
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True  # the 910B computes in bf16

    def get_amp_supported_dtype() -> list[torch.dtype]:
        """torch.autocast(device_type="npu") asks this (torch_npu.npu.autocast_utils, as the real one)."""
        return [torch.float16, torch.bfloat16, torch.float32]

    def _capacity() -> int:
        return int(NATIVE.capacity()) if NATIVE is not None else TOTAL_MEMORY

    @_record
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        if NATIVE is None:
            return (TOTAL_MEMORY - 2 * _GIB, TOTAL_MEMORY)
        return (max(_capacity() - int(NATIVE.memory_allocated(_index(device))), 0), _capacity())

    @_record
    def memory_allocated(device: Any = None) -> int:
        return int(NATIVE.memory_allocated(_index(device))) if NATIVE is not None else 0

    @_record
    def max_memory_allocated(device: Any = None) -> int:
        return int(NATIVE.max_memory_allocated(_index(device))) if NATIVE is not None else 0

    # no caching allocator: what is reserved is what is allocated
    @_record
    def memory_reserved(device: Any = None) -> int:
        return int(NATIVE.memory_allocated(_index(device))) if NATIVE is not None else 0

    @_record
    def max_memory_reserved(device: Any = None) -> int:
        return int(NATIVE.max_memory_allocated(_index(device))) if NATIVE is not None else 0

    @_record
    def memory_stats(device: Any = None) -> dict[str, int]:
        return dict(NATIVE.memory_stats(_index(device))) if NATIVE is not None else {}

    @_record
    def reset_peak_memory_stats(device: Any = None) -> None:
        if NATIVE is not None:
            NATIVE.reset_peak_memory_stats(_index(device))

    @_record
    def reset_max_memory_allocated(device: Any = None) -> None:
        reset_peak_memory_stats(device)

    @_record
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        """This process may allocate ``fraction`` of the device's capacity, then OutOfMemoryError
        (torch_npu.npu.memory's checks and messages; the device's total stays what mem_get_info says)."""
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        if NATIVE is not None:
            NATIVE.set_memory_fraction(_index(device), fraction)

    def _generator(device: Any = None) -> torch.Generator:
        if NATIVE is None:
            raise needs_npu("torch.npu random number generators", backend_failure() or "")
        generator: torch.Generator = NATIVE.default_generator(_index(device))
        return generator

    @_record
    def manual_seed(seed: int) -> None:
        if NATIVE is not None:
            _generator().manual_seed(int(seed))

    @_record
    def manual_seed_all(seed: int) -> None:
        if NATIVE is not None:
            for index in range(device_count()):
                _generator(index).manual_seed(int(seed))

    @_record
    def seed() -> None:
        if NATIVE is not None:
            _generator().seed()

    @_record
    def seed_all() -> None:
        if NATIVE is not None:
            for index in range(device_count()):
                _generator(index).seed()

    @_record
    def initial_seed() -> int:
        return int(_generator().initial_seed())

    @_record
    def get_rng_state(device: Any = "npu") -> torch.Tensor:
        return _generator(device).get_state()

    @_record
    def set_rng_state(new_state: torch.Tensor, device: Any = "npu") -> None:
        _generator(device).set_state(new_state)

    @_record
    def get_rng_state_all() -> list[torch.Tensor]:
        return [_generator(i).get_state() for i in range(device_count())]

    @_record
    def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
        for index, state in enumerate(new_states):
            _generator(index).set_state(state)

    @_record
    def ipc_collect() -> None:
        pass

    def _is_in_bad_fork() -> bool:  # torch.manual_seed asks every device module (as torch_npu's)
        return False

    def _lazy_init() -> None:
        # torch_npu's _lazy_init (_npu_init): the runtime counts the visible devices now (unless a
        # first tensor on npu made it count already), and the default generators are made
        if NATIVE is not None and not npu.default_generators:
            npu.default_generators = tuple(  # type: ignore[attr-defined]
                NATIVE.default_generator(i) for i in range(NATIVE.device_count())
            )

    class device:
        def __init__(self, dev: Any) -> None:
            self.index = _index(dev)
            self.prev = 0

        def __enter__(self) -> None:
            self.prev = _index()
            if self.index >= 0:
                _set_index(self.index)

        def __exit__(self, *exc: object) -> None:
            _set_index(self.prev)

    for fn in (
        is_available, is_initialized, init, device_count, current_device, set_device, synchronize,
        empty_cache, current_stream, default_stream, set_stream, stream, get_device_capability,
        get_device_properties, get_device_name, is_bf16_supported, get_amp_supported_dtype, mem_get_info,
        memory_allocated,
        max_memory_allocated, memory_reserved, max_memory_reserved, memory_stats, reset_peak_memory_stats,
        reset_max_memory_allocated, set_per_process_memory_fraction, manual_seed, manual_seed_all, seed,
        seed_all, initial_seed, get_rng_state, set_rng_state, get_rng_state_all, set_rng_state_all,
        ipc_collect, _is_in_bad_fork, _lazy_init, set_compile_mode,
    ):  # fmt: skip
        setattr(npu, fn.__name__, fn)
    npu.device = device  # type: ignore[attr-defined]
    npu.calls = CALLS  # type: ignore[attr-defined]
    npu.call_count = call_count  # type: ignore[attr-defined]
    npu.config = _Config()  # type: ignore[attr-defined]
    for name, value in _GRAPH_NAMES.items():
        setattr(npu, name, value)
    npu.memory = _memory_module(npu)  # type: ignore[attr-defined]
    return npu


class _Config:
    """``torch.npu.config`` (torch_npu's ``_npuConfig``): ``allow_internal_format`` lets operators choose
    the device's private formats (NZ); the simulated device keeps every tensor in ND, as with it off."""

    allow_internal_format = False


#: ``torch.npu.memory``'s functions that the device module also has (torch_npu star-imports them).
_MEMORY_FUNCTIONS = (
    "empty_cache", "mem_get_info", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "memory_stats", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "set_per_process_memory_fraction",
)  # fmt: skip


# torch_npu._C's pluggable-allocator and memory-pool bindings, over the backend's


def _pool_backend(what: str) -> Any:
    if NATIVE is None:
        raise needs_npu(what, backend_failure() or "the npu backend is not loaded")
    return NATIVE


class _npu_NPUAllocator:
    """torch_npu._C's handle of a pluggable allocator."""

    def __init__(self, ident: int) -> None:
        self._id = ident


def _npu_customAllocator(alloc_fn: int, free_fn: int) -> _npu_NPUAllocator:
    """A pluggable allocator from the addresses of its ``alloc(size, device, stream)`` and
    ``free(ptr, size, device, stream)`` functions."""
    return _npu_NPUAllocator(
        _pool_backend("torch.npu.memory.NPUPluggableAllocator").custom_allocator(alloc_fn, free_fn)
    )


class _MemPool:
    """torch_npu._C's memory pool: allocations routed to it (``use_mem_pool``) come from its allocator,
    or from the device's own where it has none."""

    def __init__(
        self,
        allocator: Any = None,
        is_user_created: bool = True,
        use_on_oom: bool = False,
        no_split: bool = False,
    ) -> None:
        native = _pool_backend("torch.npu.memory.MemPool")
        self._pool = int(native.create_pool(-1 if allocator is None else allocator._id))

    @property
    def id(self) -> tuple[int, int]:
        return (0, self._pool)  # a user-created pool's id: (0, its number)

    def use_count(self) -> int:
        return int(_pool_backend("torch.npu.memory.MemPool").pool_use_count(self._pool))


def _npu_beginAllocateCurrentThreadToPool(device: int, pool_id: tuple[int, int]) -> None:
    _pool_backend("torch.npu.memory.use_mem_pool").begin_allocate_to_pool(device, pool_id[1])


def _npu_endAllocateToPool(device: int, pool_id: tuple[int, int]) -> None:
    _pool_backend("torch.npu.memory.use_mem_pool").end_allocate_to_pool(device, pool_id[1])


def _npu_releasePool(device: int, pool_id: tuple[int, int]) -> None:
    _pool_backend("torch.npu.memory.use_mem_pool").release_pool(device, pool_id[1])


def _memory_module(npu: types.ModuleType) -> types.ModuleType:
    """``torch.npu.memory``: the memory functions, the pluggable allocator, memory pools and
    ``use_mem_pool``, as torch_npu's Python has them, over ``torch_npu._C``'s stand-ins."""
    memory = types.ModuleType("torch.npu.memory", "SIMULATED torch.npu.memory (npu_compat.testing)")
    for name in _MEMORY_FUNCTIONS:
        setattr(memory, name, getattr(npu, name))

    class _NPUAllocator:
        def __init__(self, allocator: Any) -> None:
            self._allocator = allocator

        def allocator(self) -> Any:
            return self._allocator

    class NPUPluggableAllocator(_NPUAllocator):
        """torch_npu's: the allocator's two functions, loaded from a shared library with ctypes."""

        def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str) -> None:
            import ctypes

            allocator = ctypes.CDLL(path_to_so_file)
            alloc_fn = ctypes.cast(getattr(allocator, alloc_fn_name), ctypes.c_void_p).value
            free_fn = ctypes.cast(getattr(allocator, free_fn_name), ctypes.c_void_p).value
            if alloc_fn is None:
                raise RuntimeError("alloc_fn is None")
            if free_fn is None:
                raise RuntimeError("free_fn is None")
            self._allocator = _npu_customAllocator(alloc_fn, free_fn)

    class MemPool(_MemPool):
        """torch_npu's: a pool of the allocator's memory; allocations route to it under use_mem_pool."""

        def __init__(self, allocator: Any = None, use_on_oom: bool = False, no_split: bool = False) -> None:
            super().__init__(allocator, True, use_on_oom, no_split)

    @contextlib.contextmanager
    def use_mem_pool(pool: Any, device: Any = None) -> Iterator[None]:
        """torch_npu's: this thread's allocations on ``device`` go to ``pool`` inside the block."""
        device_index = npu.current_device() if device is None else _index(device)
        _npu_beginAllocateCurrentThreadToPool(device_index, pool.id)
        try:
            yield
        finally:
            _npu_endAllocateToPool(device_index, pool.id)
            _npu_releasePool(device_index, pool.id)

    for value in (NPUPluggableAllocator, MemPool, use_mem_pool):
        value.__module__ = memory.__name__
        setattr(memory, value.__name__, value)
        setattr(npu, value.__name__, value)
    return memory


npu = _build_module()


def _create_hccl(store: Any, rank: int, world_size: int, timeout: Any) -> Any:
    """The simulated HCCL process group: a real Gloo group, on host aliases of ``npu`` tensors."""
    from torch.distributed import ProcessGroupGloo

    gloo = ProcessGroupGloo(store, rank, world_size, timeout)
    return gloo if NATIVE is None else NATIVE.hccl_backend(gloo)


def _accelerator_bindings() -> dict[str, Callable[..., Any]]:
    """Stand-ins for the C++ half of ``torch.accelerator``, for the compute boundary only.

    ``torch.accelerator.*`` calls ``torch._C._accelerator_*`` at call time; without the
    backend's PrivateUse1 hooks those raise "PyTorch is not linked with support for npu
    devices".  These answer from the simulated ``torch.npu`` instead.
    """

    def exchange(index: int) -> int:
        previous = _index()
        if index >= 0:
            _current.index = index
        return previous

    return {
        # torch.distributed asks this for the accelerator (barrier, default devices)
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
    """At the compute boundary only: a group built for ``hccl`` with ``device_id=npu:N`` is bound
    to that device, and torch then allocates its barrier tensor there, which cannot be done
    without the backend.  So its groups are left unbound (barrier then runs on the CPU); other
    backends are untouched.  With the backend, the barrier tensor is a real ``npu`` tensor."""
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


_BOUNDARY_LIBRARY: Any = None


def _npu_tensors_are_the_boundary(reason: str) -> None:
    """Every operator on an ``npu`` tensor raises :class:`SimulatedComputeBoundary` with ``reason``."""
    global _BOUNDARY_LIBRARY

    def boundary(op: Any, *args: Any, **kwargs: Any) -> Any:
        raise needs_npu(f"{op} on an npu tensor", reason)

    with contextlib.suppress(RuntimeError, AttributeError):  # already registered, or a torch without it
        library = torch.library.Library("_", "IMPL", "PrivateUse1")
        library.fallback(boundary)
        _BOUNDARY_LIBRARY = library


def _release_autograd_workers() -> None:
    """At exit: let torch's autograd workers drop their last npu graph task while Python is alive.

    Registered by :func:`install` with :mod:`atexit`, so it runs before the interpreter
    finalizes.  A worker that drops a finished task later needs the GIL to free the task's
    Python state, and past finalization that aborts the process (the C++ side,
    ``drain_autograd_workers``, says why).  Nothing runs in a process that never allocated on
    ``npu``: its workers never had a task.
    """
    native = NATIVE
    if native is None:
        return
    if not native.devices_counted():
        return  # no device was used
    devices = range(native.device_count())
    if any(native.memory_stats(i)["allocation.all.allocated"] for i in devices):
        native.drain_autograd_workers()


class _CallingThreadEngine:
    """torch's autograd engine, with every backward run on the thread that calls it.

    Stands in for ``Variable._execution_engine`` (through which every Python backward goes:
    ``torch.autograd.backward``/``grad``, ``Tensor.backward``) in a process whose engine made its
    per-device worker queues before the ``npu`` backend existed (:func:`cover_early_autograd`).
    ``run_backward`` runs under ``torch.autograd.set_multithreading_enabled(False)``, torch's own
    switch for that: the graph's nodes, ``npu`` ones included, run on the caller's CPU ready queue,
    which needs no per-device worker.  Everything else (``queue_callback``,
    ``is_checkpoint_valid``) is the engine's own.
    """

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def run_backward(self, *args: Any, **kwargs: Any) -> Any:
        previous = torch._C._is_multithreading_enabled()
        torch._C._set_multithreading_enabled(False)
        try:
            return self._engine.run_backward(*args, **kwargs)
        finally:
            torch._C._set_multithreading_enabled(previous)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def cover_early_autograd() -> bool:
    """Make backward on ``npu`` work in a process that ran a backward before the simulation began.

    torch's autograd engine makes its per-device worker queues once, at the process's first
    backward, for the devices of the backends registered by then; a simulation entered later
    (``enable()``/``simulated_ascend()`` after a backward on CPU) finds none for ``npu``, and torch
    fails an INTERNAL ASSERT at the first backward on it.  A real torch_npu is loaded by
    ``import torch``, before any backward, so it never meets this.  Here, when the engine has
    fewer queues than there are simulated NPUs, every backward runs on its calling thread
    (:class:`_CallingThreadEngine`) -- the same results, one thread.  Returns whether that was
    needed.  Idempotent.
    """
    from torch.autograd.variable import Variable

    if NATIVE is None or isinstance(Variable._execution_engine, _CallingThreadEngine):
        return NATIVE is not None
    devices = NATIVE.device_count() if NATIVE.devices_counted() else device_count_from_env()
    if NATIVE.autograd_device_queues() >= devices:
        return False  # made after the npu backend existed: it has a worker for every NPU
    Variable._execution_engine = _CallingThreadEngine(Variable._execution_engine)
    return True


def _is_hccl_available() -> bool:
    return True


#: the libhccl.so stand-in, loaded at install as torch_npu's libraries load CANN's (None: not loaded)
LIBHCCL: object = None


def cann_version(environ: Mapping[str, str] | None = None) -> str:
    """``torch.version.cann`` as torch_npu sets it at import (``utils/collect_env.get_cann_version``): the
    ``version=`` line of the first ``ascend_*_install.info`` under ``ASCEND_HOME_PATH``, else ``"not known"``.
    Where ``ASCEND_HOME_PATH`` is unset the real one walks the working directory; this one does not."""
    home = (os.environ if environ is None else environ).get("ASCEND_HOME_PATH", "")
    if home:
        for where, _, files in os.walk(os.path.realpath(home)):
            for name in files:
                if re.match(r"ascend_.*_install\.info", name):
                    for line in Path(where, name).read_text(errors="replace").splitlines():
                        if "version" in line:
                            return line.strip().split("=")[-1]
                    return "not known"
    return "not known"


def install() -> None:
    """Register ``npu`` and ``hccl`` with this process's torch.  Idempotent; cannot be undone."""
    global NATIVE
    if getattr(sys.modules.get("torch.npu"), "SIMULATED", False):
        return
    if torch._C._get_privateuse1_backend_name() != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    NATIVE = load_backend()
    if NATIVE is not None:
        NATIVE.set_physical_count(host_device_count())
        NATIVE.set_capacity(memory_capacity_from_env())
        npu.Stream = Stream  # type: ignore[attr-defined]
        npu.Event = Event  # type: ignore[attr-defined]
        npu.default_generators = ()  # type: ignore[attr-defined]  # torch_npu's until its first use
        atexit.register(_release_autograd_workers)
        _keep_counts_reported()
        from ._npu_backend import VllmAscendCFinder, load_libhccl

        global LIBHCCL
        LIBHCCL = load_libhccl()
        from . import _triton

        _triton.install()  # triton-ascend's driver, when triton is imported
        from ._sites import paired_torch_defaults

        finders: list[object] = list(sys.meta_path)
        if VllmAscendCFinder not in finders:
            sys.meta_path.append(VllmAscendCFinder)  # type: ignore[arg-type]
        for name, value in paired_torch_defaults().items():
            os.environ.setdefault(name, value)  # before vLLM reads it; a user's own setting stands
        from . import _lora_digests, _requests_served, _weight_sync_digests

        _weight_sync_digests.install()  # each HCCL weight sync's digests, on both sides
        _requests_served.install()  # the requests each model runner served
        _lora_digests.install()  # each LoRA adapter's digests, as read and as held
    torch._register_device_module("npu", npu)
    torch.version.cann = cann_version()  # as torch_npu's import sets it
    if NATIVE is None:
        for name, binding in _accelerator_bindings().items():
            setattr(torch._C, name, binding)
        _npu_tensors_are_the_boundary(backend_failure() or "the npu backend is not loaded")
    with contextlib.suppress(RuntimeError):  # methods already generated
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=NATIVE is not None)
    import torch.distributed as dist

    if dist.is_available() and NATIVE is None:
        _unbind_simulated_hccl_groups()
    if dist.is_available() and "hccl" not in dist.Backend.backend_list:
        # torch_npu registers hccl for "npu" only; the simulation also claims "cpu", so that
        # a plain "hccl" group takes CPU tensors too.  "cpu:gloo,npu:hccl" still sends CPU
        # tensors to gloo, as on a real host.
        dist.Backend.register_backend("hccl", _create_hccl, devices=["npu", "cpu"])
    if dist.is_available():
        # torch_npu adds torch.distributed.is_hccl_available (its _init/patches/distributed_patches.py)
        dist.is_hccl_available = _is_hccl_available
