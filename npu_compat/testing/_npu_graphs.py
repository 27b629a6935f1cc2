"""``torch.npu``'s ACL graph API on the simulated Ascend: capture records, replay reads the captured storages.

torch_npu 2.13.0 (``torch_npu/npu/graphs.py``, ``streams.py``) gives vllm-ascend ``NPUGraph``, the
``graph`` context manager, ``graph_pool_handle``, ``is_current_stream_capturing``, ``ExternalEvent`` and
the ``graph_task_group_*``/``graph_task_update_*`` calls.

An ACL graph, as a CUDA graph, is a recording of the device work issued while it was captured, with the
addresses that work read and wrote.  A replay issues the same work on the same addresses: it sees what
now lies in the memory it captured, not what a Python name now refers to.  So:

* an update made in place (``param.copy_(new)``) is seen by the next replay;
* a re-allocating update (``param.data = new``, ``module.weight = Parameter(new)``) is not: the graph
  keeps reading the old memory.  While anything still holds that memory, the replay reads the old
  values (stale).  Where nothing else holds it, the device has freed it and may have given it to
  another tensor: the replay reads garbage or fails (``ERR99999``).  Here the replay then raises
  :class:`GraphReplayError`, naming the operator, the argument and the tensor.

Capture (:meth:`NPUGraph.capture_begin`) records every operator the capturing thread runs on an ``npu``
tensor -- aten operators and the ``torch.library`` kernels of ``_npu_ops`` alike, each as one task --
with the storages of its arguments and results, as a ``TorchDispatchMode``.  The storages are held by
aliases made at capture time (not the Python tensors: ``param.data = new`` moves a tensor to other
memory and leaves the alias where the graph captured it).  Replay runs the recorded operators again on
those storages, in order: an operator that writes its arguments in place writes them again, a view
needs nothing (it aliases memory that the other operators fill), and any other operator's result is
written into the storage its captured result had, which later operators read.

Fidelity notes.  The device does not run work while it captures it; the simulation runs it (capture
runs are vLLM's warm-up runs: what they compute is thrown away).  Memory of the graph pool is not a
pool of its own here.  ``ExternalEvent``, ``graph_task_group_*`` and ``graph_task_update_*`` (vllm-ascend's
FULL graphs) are not modelled yet: they stay the compute boundary.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ._boundary import needs_npu

_FULL = "ACL graph task groups and their updates (vllm-ascend's FULL graphs)"
_WHY = "the simulation captures PIECEWISE graphs only: run with cudagraph_mode PIECEWISE or enforce_eager"
_pools = 0
_capturing = threading.local()
#: Across every live recording of the process: StorageImpl pointer -> how many aliases hold it, and its
#: Python storage (one reference more, whether or not torch keeps a Python storage alive with its
#: StorageImpl).  A replay finds memory that nothing but graphs holds by these counts.
_aliases: collections.Counter[int] = collections.Counter()
_storages: dict[int, Any] = {}
_ledger = threading.Lock()


class GraphReplayError(RuntimeError):
    """A replay read memory that only the graph still held: on the device, freed memory (garbage or
    ``ERR99999``)."""


class _NPUTaskGroupHandle:
    """``torch_npu._C._NPUTaskGroupHandle``: what ``graph_task_group_end`` returns, inside a capture."""


def _is_npu(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "npu"


def _describe(t: torch.Tensor) -> str:
    kind = "a Parameter" if isinstance(t, torch.nn.Parameter) else "a tensor"
    shape = ", ".join(str(s) for s in t.shape)
    return f"{kind} {str(t.dtype).removeprefix('torch.')}[{shape}] at {t.data_ptr():#x}"


@dataclass
class _Task:
    """One recorded operator: its arguments and results as storage-holding aliases."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    results: list[torch.Tensor]
    #: Rerun as it is (it writes its arguments); else a view (nothing to do) or a result to write back.
    mutates: bool
    views: bool


@dataclass
class _Recording:
    tasks: list[_Task] = field(default_factory=list)
    #: StorageImpl pointer -> what it was when first captured, for the storages the graph read but did
    #: not make (weights, the runner's buffers).
    outside: dict[int, str] = field(default_factory=dict)
    #: The storages of the results the graph made.
    made: set[int] = field(default_factory=set)
    #: StorageImpl pointer -> how many of the recording's aliases hold it (also in :data:`_aliases`, until
    #: the recording is gone).
    held: collections.Counter[int] = field(default_factory=collections.Counter)

    def __post_init__(self) -> None:
        weakref.finalize(self, _release, self.held)


def _hold(held: collections.Counter[int], t: torch.Tensor, key: int) -> None:
    with _ledger:
        held[key] += 1
        _aliases[key] += 1
        if key not in _storages:
            _storages[key] = t.untyped_storage()


def _release(held: collections.Counter[int]) -> None:
    with _ledger:
        for key, count in held.items():
            _aliases[key] -= count
            if _aliases[key] <= 0:
                del _aliases[key]
                _storages.pop(key, None)


def _only_graphs_hold(key: int) -> bool:
    with _ledger:
        return bool(torch._C._storage_Use_Count(key) <= _aliases[key] + 1)


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


class _Capture(TorchDispatchMode):  # type: ignore[misc]
    """Runs each operator and records it (see the module)."""

    def __init__(self, recording: _Recording) -> None:
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        flat_in, _ = tree_flatten((args, kwargs))
        flat_out, _ = tree_flatten(result)
        if any(_is_npu(v) for v in (*flat_in, *flat_out)):
            self._record(func, args, kwargs, [v for v in flat_out if isinstance(v, torch.Tensor)])
        return result

    def _alias(self, t: torch.Tensor, described: str | None = None) -> torch.Tensor:
        """A tensor on ``t``'s storage, offset, sizes and strides that ``t.data = ...`` does not move."""
        rec = self.recording
        key = _storage_key(t)
        _hold(rec.held, t, key)
        if key not in rec.made and key not in rec.outside:
            rec.outside[key] = described or _describe(t)
        return t.detach()

    def _record(self, func: Any, args: Any, kwargs: Any, results: list[torch.Tensor]) -> None:
        schema = func._schema
        mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        views = not mutates and any(r.alias_info is not None for r in schema.returns)
        name = str(func)
        position = itertools.count()

        def pin(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            return self._alias(value, f"argument {next(position)} of {name}: {_describe(value)}")

        pinned_args, pinned_kwargs = tree_map(pin, (tuple(args), dict(kwargs)))
        if not mutates and not views:
            for r in results:
                self.recording.made.add(_storage_key(r))
        pinned_results = [self._alias(r) for r in results]
        self.recording.tasks.append(_Task(func, pinned_args, pinned_kwargs, pinned_results, mutates, views))


class NPUGraph:
    """``torch.npu.NPUGraph``: :meth:`capture_begin`/:meth:`capture_end` record, :meth:`replay` reruns
    (see the module)."""

    def __init__(self) -> None:
        self.auto_dispatch_capture = False
        self._recording: _Recording | None = None
        self._mode: _Capture | None = None
        self._pool: Any = None

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        if self._mode is not None or getattr(_capturing, "graph", None) is not None:
            raise RuntimeError("simulated npu: a graph capture is already under way on this thread")
        self._pool = pool if pool is not None else graph_pool_handle()
        self._recording = _Recording()
        self._mode = _Capture(self._recording)
        self._mode.__enter__()
        _capturing.graph = self

    def capture_end(self) -> None:
        if self._mode is None:
            raise RuntimeError("simulated npu: capture_end without capture_begin")
        mode, self._mode = self._mode, None
        _capturing.graph = None
        mode.__exit__(None, None, None)

    def replay(self) -> None:
        if self._recording is None or self._mode is not None:
            raise RuntimeError("simulated npu: replay of a graph that has not been captured")
        self._check_held()
        for task in self._recording.tasks:
            if task.views:
                continue
            result = task.func(*task.args, **task.kwargs)
            if task.mutates:
                continue
            flat, _ = tree_flatten(result)
            values = [v for v in flat if isinstance(v, torch.Tensor)]
            for into, value in zip(task.results, values, strict=True):
                into.copy_(value)

    def _check_held(self) -> None:
        """Raise :class:`GraphReplayError` for a storage the graph read from outside that nothing but graphs
        hold any more."""
        assert self._recording is not None
        for key, what in self._recording.outside.items():
            if _only_graphs_hold(key):
                raise GraphReplayError(
                    "simulated npu: ACL graph replay reads memory that only the graph still holds -- "
                    f"{what}. "
                    "It was freed or re-allocated after capture (on the device the replay reads whatever now "
                    "lies there, or fails with ERR99999); update it in place (copy_) to keep its memory"
                )

    def reset(self) -> None:
        self._recording = None

    def pool(self) -> Any:
        return self._pool if self._pool is not None else graph_pool_handle()

    def captured_tasks(self) -> int:
        """How many operators the capture recorded (0 before capture); not part of torch_npu's API."""
        return 0 if self._recording is None else len(self._recording.tasks)


class graph:
    """``torch.npu.graph(npu_graph, pool=None, stream=None, ...)``: captures into ``npu_graph`` on
    ``stream`` (a side stream of its own by default), as torch_npu's context manager does."""

    default_capture_stream: Any = None

    def __init__(
        self,
        npu_graph: NPUGraph,
        pool: Any = None,
        stream: Any = None,
        auto_dispatch_capture: bool = False,
        capture_error_mode: str = "global",
    ) -> None:
        if self.__class__.default_capture_stream is None:
            self.__class__.default_capture_stream = torch.npu.Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = torch.npu.stream(self.capture_stream)
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode
        self.npu_graph.auto_dispatch_capture = auto_dispatch_capture

    def __enter__(self) -> None:
        torch.npu.synchronize()
        torch.npu.empty_cache()
        self.stream_ctx.__enter__()
        self.npu_graph.capture_begin(self.pool[0] if self.pool else None, self.capture_error_mode)

    def __exit__(self, *exc: Any) -> None:
        self.npu_graph.capture_end()
        self.stream_ctx.__exit__(*exc)


def graph_pool_handle() -> tuple[int, int]:
    """An opaque token naming a graph memory pool (a fresh id per call, as torch_npu's)."""
    global _pools
    _pools += 1
    return (0, _pools)


def is_current_stream_capturing() -> bool:
    return getattr(_capturing, "graph", None) is not None


def graph_task_group_begin(stream: Any) -> None:
    raise needs_npu("torch.npu.graph_task_group_begin", f"{_FULL}: {_WHY}")


def graph_task_group_end(stream: Any) -> _NPUTaskGroupHandle:
    raise needs_npu("torch.npu.graph_task_group_end", f"{_FULL}: {_WHY}")


def graph_task_update_begin(stream: Any, handle: _NPUTaskGroupHandle) -> None:
    raise needs_npu("torch.npu.graph_task_update_begin", f"{_FULL}: {_WHY}")


def graph_task_update_end(stream: Any) -> None:
    raise needs_npu("torch.npu.graph_task_update_end", f"{_FULL}: {_WHY}")


class ExternalEvent:
    """``torch.npu.ExternalEvent``: an event that may be waited on before it is recorded.

    Outside a graph nothing waits on a simulated device (every operator is done when it returns), so
    ``record``/``wait``/``reset`` have nothing to order.
    """

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def reset(self, stream: Any = None) -> None:
        pass


NAMES: dict[str, Any] = {
    "NPUGraph": NPUGraph,
    "graph": graph,
    "graph_pool_handle": graph_pool_handle,
    "is_current_stream_capturing": is_current_stream_capturing,
    "graph_task_group_begin": graph_task_group_begin,
    "graph_task_group_end": graph_task_group_end,
    "graph_task_update_begin": graph_task_update_begin,
    "graph_task_update_end": graph_task_update_end,
    "ExternalEvent": ExternalEvent,
}
