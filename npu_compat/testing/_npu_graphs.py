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

Task groups (vllm-ascend's FULL graphs).  torch_npu's ``graph_task_group_begin``/``_end`` (CANN's
``aclmdlRICaptureTaskGrpBegin``/``End``) mark the tasks captured between them as a group and return its
handle.  ``graph_task_update_begin(stream, handle)``/``_end`` (``aclmdlRICaptureTaskUpdateBegin``/``End``)
replace that group's tasks, for every later replay, by the tasks issued between them: those are not run, they
are the group's new arguments (vllm-ascend passes each step's sequence lengths so).  An update issues as many
tasks as the group holds, each the same operator.  An :class:`ExternalEvent` is a flag the device waits on:
captured, ``wait`` holds the replay at that point until the event is recorded, and ``reset`` clears it again.
vllm-ascend captures ``wait``, ``reset`` and a group for each attention layer, replays the graph, then updates
each group from an update stream and records its event.  So here a replay runs until it meets a ``wait`` on an
event not yet recorded and is held there; recording the event (outside a capture) runs it on.  While a replay
is held, work issued on its stream would queue behind it on the device, and a device-wide synchronize would
wait for it: the simulation does not queue work, so either is the compute boundary, by name.

A Triton kernel launched during capture (:func:`launch`, from :mod:`._triton`) is one task, rerun on replay
on the memory it captured, as the device reruns a kernel: not the host copies the interpreter makes.

Fidelity notes.  The device does not run work while it captures it; the simulation runs it (capture
runs are vLLM's warm-up runs: what they compute is thrown away).  Memory of the graph pool is not a
pool of its own here.  Outside a capture, a stream's ``wait`` on an :class:`ExternalEvent` not yet recorded
is the compute boundary (nothing here orders later work behind it).
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from ._boundary import needs_npu

_QUEUE = "the simulation runs work when it is issued and does not queue it behind a held replay"
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
    """``torch_npu._C._NPUTaskGroupHandle``: what ``graph_task_group_end`` returns, inside a capture: the
    group's place among its graph's tasks."""

    def __init__(self, recording: _Recording | None = None, first: int = 0, stop: int = 0) -> None:
        self._recording = None if recording is None else weakref.ref(recording)
        self._first = first
        self._stop = stop


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
    #: The storages its aliases hold (see :class:`_Recording`).
    keys: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.func)

    def run(self) -> None:
        if self.views:
            return
        result = self.func(*self.args, **self.kwargs)
        if self.mutates:
            _wait_for_collective(result)
            return
        flat, _ = tree_flatten(result)
        values = [v for v in flat if isinstance(v, torch.Tensor)]
        if self.func.namespace == _FUNCTIONAL_COLLECTIVES:
            values = [torch.ops._c10d_functional.wait_tensor(v) for v in values]
        for into, value in zip(self.results, values, strict=True):
            into.copy_(value)


@dataclass
class _Launch:
    """One kernel launch (a Triton kernel): rerun on its tensors' captured memory."""

    launch: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    name: str
    keys: list[int] = field(default_factory=list)

    def run(self) -> None:
        self.launch(*self.args, **self.kwargs)


@dataclass
class _Signal:
    """A captured ``wait``, ``reset`` or ``record`` of an :class:`ExternalEvent`."""

    event: ExternalEvent
    op: str
    keys: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"ExternalEvent.{self.op}"

    def run(self) -> None:  # a wait is run once its event is recorded (NPUGraph._run)
        if self.op == "reset":
            self.event._recorded = False
        elif self.op == "record":
            self.event._set()


@dataclass
class _Recording:
    tasks: list[_Task | _Launch | _Signal] = field(default_factory=list)
    #: StorageImpl pointer -> what it was when first captured, for the storages the graph read but did
    #: not make (weights, the runner's buffers).
    outside: dict[int, str] = field(default_factory=dict)
    #: The storages of the results the graph made.
    made: set[int] = field(default_factory=set)
    #: StorageImpl pointer -> how many of the recording's aliases hold it (also in :data:`_aliases`, until
    #: the recording is gone).
    held: collections.Counter[int] = field(default_factory=collections.Counter)
    #: Where the open task group began (``graph_task_group_begin``), if one is open.
    group: int | None = None

    def __post_init__(self) -> None:
        weakref.finalize(self, _release, self.held)

    def pin(self, keys: list[int], t: torch.Tensor, described: str | None = None) -> torch.Tensor:
        """A tensor on ``t``'s storage, offset, sizes and strides that ``t.data = ...`` does not move; held
        by the recording, its key added to ``keys``."""
        key = _storage_key(t)
        _hold(self.held, t, key)
        keys.append(key)
        if key not in self.made and key not in self.outside:
            self.outside[key] = described or _describe(t)
        with _disable_current_modes():  # bookkeeping, no device work: not behind a held replay, not a task
            return t.detach()

    def pin_all(self, keys: list[int], name: str, args: Any, kwargs: Any) -> tuple[Any, Any]:
        position = itertools.count()

        def pin(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            return self.pin(keys, value, f"argument {next(position)} of {name}: {_describe(value)}")

        pinned: tuple[Any, Any] = tree_map(pin, (tuple(args), dict(kwargs)))
        return pinned

    def unpin(self, keys: list[int]) -> None:
        """Let go of the storages ``keys`` (a replaced task's); those no longer held leave the recording."""
        _release(collections.Counter(keys), self.held)
        for key in keys:
            if self.held[key] <= 0:
                del self.held[key]
                self.outside.pop(key, None)
                self.made.discard(key)


def _hold(held: collections.Counter[int], t: torch.Tensor, key: int) -> None:
    with _ledger:
        held[key] += 1
        _aliases[key] += 1
        if key not in _storages:
            _storages[key] = t.untyped_storage()


def _release(released: collections.Counter[int], held: collections.Counter[int] | None = None) -> None:
    with _ledger:
        for key, count in released.items():
            if held is not None:
                held[key] -= count
            _aliases[key] -= count
            if _aliases[key] <= 0:
                del _aliases[key]
                _storages.pop(key, None)


def _only_graphs_hold(key: int) -> bool:
    with _ledger:
        return bool(torch._C._storage_Use_Count(key) <= _aliases[key] + 1)


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _wait_for_collective(result: Any) -> None:
    """Wait for the ``Work`` a collective returned: on the device the stream's next task runs after it."""
    for value in tree_flatten(result)[0]:
        if not isinstance(value, torch.Tensor) and callable(getattr(value, "wait", None)):
            value.wait()


def _task(recording: _Recording, func: Any, args: Any, kwargs: Any, results: list[torch.Tensor]) -> _Task:
    """``func``'s call as a task of ``recording``, its tensors pinned.  A collective (``c10d``'s operators,
    whose schemas mark no argument written) writes its tensors in place: it is rerun as it is."""
    mutates = func.namespace == _COLLECTIVES or any(
        a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments
    )
    flat, _ = tree_flatten((args, kwargs))
    read = {_storage_key(t) for t in flat if isinstance(t, torch.Tensor)}
    # new memory: a view's result is its input's (``contiguous`` of a contiguous tensor is a view, of any
    # other tensor a copy)
    fresh = [key for key in map(_storage_key, results) if key not in read]
    views = not mutates and not fresh
    keys: list[int] = []
    pinned_args, pinned_kwargs = recording.pin_all(keys, str(func), args, kwargs)
    if not mutates:
        recording.made.update(fresh)
    pinned_results = [
        recording.pin(keys, r, f"result {i} of {func}: {_describe(r)}") for i, r in enumerate(results)
    ]
    return _Task(func, pinned_args, pinned_kwargs, pinned_results, mutates, views, keys)


#: On the device an HCCL collective is one task of the stream, captured as such: ``c10d``'s operators (what
#: ``torch.distributed``'s calls dispatch, writing their tensors in place) and the functional collectives
#: (``_c10d_functional``: a new result, ready once ``wait_tensor`` returns).
_COLLECTIVES, _FUNCTIONAL_COLLECTIVES = "c10d", "_c10d_functional"
#: The namespaces of the operators that are device kernels: torch's, the simulated Ascend's, the collectives.
_KERNEL_NAMESPACES = {
    "aten",
    "prims",
    "prim",
    "npu",
    "atb",
    "_C_ascend",
    "_C",
    _COLLECTIVES,
    _FUNCTIONAL_COLLECTIVES,
}


def _composite_key(func: Any) -> Any:
    """The dispatch key of ``func``'s Python implementation on the device, where ``func`` is an operator a
    framework wrote in Python over device work (vLLM's ``direct_register_custom_op`` ops, such as its
    attention): on the device its tasks are the kernels it issues, not the operator.  None for a kernel."""
    if func.namespace in _KERNEL_NAMESPACES:
        return None
    for key in (torch._C.DispatchKey.PrivateUse1, torch._C.DispatchKey.CompositeExplicitAutograd):
        if func.has_kernel_for_dispatch_key(key):
            return key
    return None


def _is_view(task: _Task | _Launch | _Signal) -> bool:
    return isinstance(task, _Task) and task.views


def _capture() -> _Recording | None:
    """The recording this thread is capturing into, if it is capturing."""
    graph: NPUGraph | None = getattr(_capturing, "graph", None)
    return None if graph is None else graph._recording


def _capturing_recording(what: str) -> _Recording:
    recording = _capture()
    if recording is None:
        raise RuntimeError(f"simulated npu: {what} outside a graph capture (the stream is not capturing)")
    return recording


class _Capture(TorchDispatchMode):  # type: ignore[misc]
    """Runs each operator and records it (see the module)."""

    #: A higher-order operator in a compiled graph (``auto_functionalized_v2`` around an in-place custom op,
    #: as vLLM's LoRA layers call them) is Python over operators: the operators it runs are the tasks.
    supports_higher_order_operators = True

    def __init__(self, recording: _Recording) -> None:
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(_capturing, "launching", False):  # a kernel's host copies: the launch is the task
            return func(*args, **kwargs)
        if isinstance(func, torch._ops.HigherOrderOperator):
            dense = func.py_kernels.get(torch._C.DispatchKey.CompositeExplicitAutograd)
            if dense is None:
                raise needs_npu(f"{func.name()} inside an ACL graph capture", "no dense kernel to record")
            with self:
                return dense(*args, **kwargs)
        composite = _composite_key(func)
        if composite is not None:  # Python over device work: its operators and launches are the tasks
            with self:
                return func._op_dk(composite, *args, **kwargs)
        result = func(*args, **kwargs)
        flat_in, _ = tree_flatten((args, kwargs))
        flat_out, _ = tree_flatten(result)
        if any(_is_npu(v) for v in (*flat_in, *flat_out)):
            results = [v for v in flat_out if isinstance(v, torch.Tensor)]
            self.recording.tasks.append(_task(self.recording, func, args, kwargs, results))
        return result


class _Update(TorchDispatchMode):  # type: ignore[misc]
    """Between ``graph_task_update_begin`` and ``_end``: records each operator as a new task of the group,
    without running it (it is the group's new arguments)."""

    def __init__(self, recording: _Recording, handle: _NPUTaskGroupHandle) -> None:
        super().__init__()
        self.recording = recording
        self.handle = handle
        self.tasks: list[_Task | _Launch | _Signal] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        schema = func._schema
        written = {
            frozenset(a.alias_info.before_set): a for a in schema.arguments if a.alias_info is not None
        }
        if not schema.returns or any(r.alias_info is None for r in schema.returns):
            raise RuntimeError(
                f"simulated npu: {func} inside a graph task update: an update issues the group's tasks "
                "again with new arguments, writing what they wrote (an operator with an out= form)"
            )
        self.tasks.append(_task(self.recording, func, args, kwargs, []))
        returned = []
        for r in schema.returns:
            arg = written[frozenset(r.alias_info.before_set)]
            index = schema.arguments.index(arg)
            returned.append(kwargs[arg.name] if arg.name in kwargs else args[index])
        return returned[0] if len(returned) == 1 else tuple(returned)

    def apply(self) -> None:
        """The group's tasks become the update's; its views (no device work) stay."""
        rec, first, stop = self.recording, self.handle._first, self.handle._stop
        old = [t for t in rec.tasks[first:stop] if not _is_view(t)]
        views = [t for t in rec.tasks[first:stop] if _is_view(t)]
        new = [t for t in self.tasks if not _is_view(t)]
        new_names = [t.name for t in new]
        old_names = [t.name for t in old]
        if new_names != old_names:
            for task in self.tasks:
                rec.unpin(task.keys)
            raise RuntimeError(
                f"simulated npu: graph_task_update_end: the update issued {new_names} for a task group of "
                f"{old_names}; an update gives each of the group's tasks, one for one, new arguments"
            )
        for task in [*old, *(t for t in self.tasks if _is_view(t))]:
            rec.unpin(task.keys)
        rec.tasks[first:stop] = [*new, *views]


class _BehindReplay(TorchDispatchMode):  # type: ignore[misc]
    """While a replay is held: work on its stream would queue behind it (see the module)."""

    def __init__(self, stream_id: int) -> None:
        super().__init__()
        self.stream_id = stream_id

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if _current_stream_id() == self.stream_id:
            flat, _ = tree_flatten((args, kwargs))
            if any(_is_npu(v) for v in flat):
                raise needs_npu(f"{func} issued behind a held ACL graph replay", _HELD_WHY)
        return func(*args, **kwargs)


_HELD_WHY = (
    "the replay waits on an ExternalEvent not yet recorded; on the device this work would wait behind it: "
    f"{_QUEUE}"
)
#: The replays held at an ExternalEvent's wait, in this process.
_held: list[NPUGraph] = []


def _current_stream_id() -> int:
    return int(torch.accelerator.current_stream().stream_id)


def check_no_held_replay(what: str, stream_id: int | None = None) -> None:
    """Raise the compute boundary for ``what`` (a synchronize, a replay) while a replay is held (on the
    stream ``stream_id``, where given)."""
    if any(stream_id is None or (g._behind is not None and g._behind.stream_id == stream_id) for g in _held):
        raise needs_npu(what, _HELD_WHY)


def launch(run: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    """``run(*args, **kwargs)``, a kernel launch: inside a capture also one task of the graph (its tensors'
    own operators, the interpreter's host copies, are not), inside a task update only that task."""
    update: _Update | None = getattr(_capturing, "update", None)
    recording = update.recording if update is not None else _capture()
    if recording is None:
        return run(*args, **kwargs)
    keys: list[int] = []
    pinned_args, pinned_kwargs = recording.pin_all(keys, name, args, kwargs)
    task = _Launch(run, pinned_args, pinned_kwargs, name, keys)
    if update is not None:
        update.tasks.append(task)
        return None
    _capturing.launching = True
    try:
        result = run(*args, **kwargs)
    finally:
        _capturing.launching = False
    recording.tasks.append(task)
    return result


class NPUGraph:
    """``torch.npu.NPUGraph``: :meth:`capture_begin`/:meth:`capture_end` record, :meth:`replay` reruns
    (see the module)."""

    def __init__(self) -> None:
        self.auto_dispatch_capture = False
        self._recording: _Recording | None = None
        self._mode: _Capture | None = None
        self._pool: Any = None
        #: Where a held replay goes on, and what holds it there.
        self._held_at: int | None = None
        self._behind: _BehindReplay | None = None
        #: The stream the replay was issued on: what a hold blocks, wherever the event that resumed it was
        #: recorded (vllm-ascend records it on its update stream, and the replay may be held again there)
        self._stream_id: int | None = None

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
        check_no_held_replay("an ACL graph replay")
        self._check_held()
        self._stream_id = _current_stream_id()
        self._run(0)

    def _run(self, start: int) -> None:
        assert self._recording is not None
        tasks = self._recording.tasks
        for i in range(start, len(tasks)):
            task = tasks[i]
            if isinstance(task, _Signal) and task.op == "wait" and not task.event._recorded:
                self._hold(i, task.event)
                return
            task.run()

    def _hold(self, at: int, event: ExternalEvent) -> None:
        self._held_at = at
        event._waiter = self
        _held.append(self)
        assert self._stream_id is not None  # set by the replay this hold belongs to
        self._behind = _BehindReplay(self._stream_id)
        self._behind.__enter__()

    def _go_on(self) -> None:
        """The event this replay waits on is recorded: run on from the wait."""
        assert self._behind is not None and self._held_at is not None
        behind, self._behind = self._behind, None
        behind.__exit__(None, None, None)
        _held.remove(self)
        at, self._held_at = self._held_at, None
        self._run(at)

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
        """How many tasks the capture recorded (0 before capture); not part of torch_npu's API."""
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
    recording = _capturing_recording("torch.npu.graph_task_group_begin")
    if recording.group is not None:
        raise RuntimeError("simulated npu: graph_task_group_begin inside a task group (groups do not nest)")
    recording.group = len(recording.tasks)


def graph_task_group_end(stream: Any) -> _NPUTaskGroupHandle:
    recording = _capturing_recording("torch.npu.graph_task_group_end")
    if recording.group is None:
        raise RuntimeError("simulated npu: graph_task_group_end without graph_task_group_begin")
    handle = _NPUTaskGroupHandle(recording, recording.group, len(recording.tasks))
    recording.group = None
    return handle


def graph_task_update_begin(stream: Any, handle: _NPUTaskGroupHandle) -> None:
    if getattr(_capturing, "update", None) is not None:
        raise RuntimeError("simulated npu: graph_task_update_begin inside another update")
    recording = handle._recording() if handle._recording is not None else None
    if recording is None:
        raise RuntimeError("simulated npu: graph_task_update_begin: the task group's graph is gone")
    update = _Update(recording, handle)
    update.__enter__()
    _capturing.update = update


def graph_task_update_end(stream: Any) -> None:
    update: _Update | None = getattr(_capturing, "update", None)
    if update is None:
        raise RuntimeError("simulated npu: graph_task_update_end without graph_task_update_begin")
    _capturing.update = None
    update.__exit__(None, None, None)
    update.apply()


class ExternalEvent:
    """``torch.npu.ExternalEvent``: a flag the device waits on, which may be waited on before it is recorded
    (see the module)."""

    def __init__(self) -> None:
        self._recorded = False
        self._waiter: NPUGraph | None = None

    def _signal(self, op: str) -> bool:
        """Inside a capture: record ``op`` as a task of the graph (True)."""
        recording = _capture()
        if recording is None:
            return False
        recording.tasks.append(_Signal(self, op))
        return True

    def _set(self) -> None:
        self._recorded = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter._go_on()

    def record(self, stream: Any = None) -> None:
        if not self._signal("record"):
            self._set()

    def wait(self, stream: Any = None) -> None:
        if not self._signal("wait") and not self._recorded:
            raise needs_npu("a stream's wait for an ExternalEvent not yet recorded, outside a graph", _QUEUE)

    def reset(self, stream: Any = None) -> None:
        if not self._signal("reset"):
            self._recorded = False


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
