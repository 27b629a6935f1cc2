"""Exact ``"cuda"`` device literals inside one upstream function become ``"npu"``.

Some upstream functions spell their device as a string constant: ``tensor.to(device="cuda")``,
``torch.empty(n, device="cuda")``, ``tensor.device.type == "cuda"``.  The replacement made here
is the same function -- same globals, defaults, closure, name, and the same bytecode -- whose
code constants equal to ``"cuda"`` or ``"cuda:N"`` read ``"npu"`` / ``"npu:N"``.  Nested
functions defined inside it (a ``post_iter_func`` closure) are rewritten the same way.

Only whole constants are rewritten, never a substring: ``"cuda_graph"``, a path or a
message that mentions CUDA stays as it is.  Nothing else in the process changes, and the
rewritten function runs at the speed of the original (no wrapper is added).
"""

from __future__ import annotations

import types
from typing import Any

from .torch_distributed import npu_device


def _is_cuda_literal(value: object) -> bool:
    return type(value) is str and npu_device(value) is not value


def npu_code(code: types.CodeType) -> types.CodeType:
    """``code`` with its exact ``cuda`` / ``cuda:N`` constants (and its nested functions') on ``npu``."""
    consts = tuple(
        npu_device(c) if _is_cuda_literal(c) else npu_code(c) if isinstance(c, types.CodeType) else c
        for c in code.co_consts
    )
    if all(a is b for a, b in zip(consts, code.co_consts, strict=True)):
        return code
    return code.replace(co_consts=consts)


def cuda_literals(func: Any) -> list[str]:
    """The ``cuda`` device constants in ``func``'s code and its nested functions (for reports and tests)."""
    found: list[str] = []

    def walk(code: types.CodeType) -> None:
        for c in code.co_consts:
            if _is_cuda_literal(c):
                found.append(c)
            elif isinstance(c, types.CodeType):
                walk(c)

    walk(func.__code__)
    return found


def npu_literals(original: Any) -> Any:
    """Replacement factory: a plain function whose exact ``cuda`` constants read ``npu``.

    Raises ``TypeError`` for anything but a plain Python function, and ``ValueError`` when the
    function holds no such constant (upstream changed; the patch then fails with that reason).
    """
    if not isinstance(original, types.FunctionType):
        raise TypeError(f"expected a plain function, found {type(original).__name__}")
    if not cuda_literals(original):
        raise ValueError(f"{original.__qualname__} no longer holds a 'cuda' device constant")
    new = types.FunctionType(
        npu_code(original.__code__),
        original.__globals__,
        original.__name__,
        original.__defaults__,
        original.__closure__,
    )
    new.__kwdefaults__ = original.__kwdefaults__
    new.__qualname__ = original.__qualname__
    new.__module__ = original.__module__
    new.__doc__ = original.__doc__
    new.__annotations__ = dict(original.__annotations__)
    new.__dict__.update(original.__dict__)
    new.__wrapped__ = original  # type: ignore[attr-defined]
    return new
