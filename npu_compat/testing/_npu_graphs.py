"""``torch.npu``'s ACL graph API on the simulated Ascend: the names and their lifecycle, capture not yet.

torch_npu 2.13.0 (``torch_npu/npu/graphs.py``, ``streams.py``) gives vllm-ascend ``NPUGraph``, the
``graph`` context manager, ``graph_pool_handle``, ``is_current_stream_capturing``, ``ExternalEvent`` and
the ``graph_task_group_*``/``graph_task_update_*`` calls; vllm-ascend names several of them in annotations
that Python evaluates at import (``compilation/acl_graph.py``), so they exist here as classes and
functions.  Capturing work into a graph -- recording the storages it reads so that a replay sees what the
device would see -- is not simulated yet: :meth:`NPUGraph.capture_begin` is the compute boundary, named.
An engine in eager mode (vLLM's ``enforce_eager``) never reaches it.
"""

from __future__ import annotations

from typing import Any

from ._boundary import needs_npu

_CAPTURE = "ACL graph capture (torch.npu.NPUGraph)"
_WHY = "the simulation runs no graph mode yet: run the engine with enforce_eager"
_pools = 0


class _NPUTaskGroupHandle:
    """``torch_npu._C._NPUTaskGroupHandle``: what ``graph_task_group_end`` returns, inside a capture."""


class NPUGraph:
    """``torch.npu.NPUGraph``; capturing into one is the compute boundary (see the module)."""

    def __init__(self) -> None:
        self.auto_dispatch_capture = False

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        raise needs_npu(_CAPTURE, _WHY)

    def capture_end(self) -> None:
        raise needs_npu(_CAPTURE, _WHY)

    def replay(self) -> None:
        raise needs_npu(_CAPTURE, _WHY)

    def reset(self) -> None:
        pass

    def pool(self) -> tuple[int, int]:
        return graph_pool_handle()


class graph:
    """``torch.npu.graph(npu_graph, pool=None, stream=None, ...)``: captures into ``npu_graph``."""

    def __init__(
        self,
        npu_graph: NPUGraph,
        pool: Any = None,
        stream: Any = None,
        auto_dispatch_capture: bool = False,
        capture_error_mode: str = "global",
    ) -> None:
        self.npu_graph = npu_graph
        self.pool = () if pool is None else (pool,)
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        self.npu_graph.capture_begin(
            self.pool[0] if self.pool else None, capture_error_mode=self.capture_error_mode
        )

    def __exit__(self, *exc: object) -> None:
        self.npu_graph.capture_end()


def graph_pool_handle() -> tuple[int, int]:
    """An opaque token naming a graph memory pool (a fresh id per call, as torch_npu's)."""
    global _pools
    _pools += 1
    return (0, _pools)


def is_current_stream_capturing() -> bool:
    return False  # no capture ever begins (see the module)


def graph_task_group_begin(stream: Any) -> None:
    raise needs_npu("torch.npu.graph_task_group_begin", _WHY)


def graph_task_group_end(stream: Any) -> _NPUTaskGroupHandle:
    raise needs_npu("torch.npu.graph_task_group_end", _WHY)


def graph_task_update_begin(stream: Any, handle: _NPUTaskGroupHandle) -> None:
    raise needs_npu("torch.npu.graph_task_update_begin", _WHY)


def graph_task_update_end(stream: Any) -> None:
    raise needs_npu("torch.npu.graph_task_update_end", _WHY)


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
