"""Post-import hooks: run a callback right after a named module finishes executing.

A meta-path finder that watches a module (:class:`._activation.PostImportFinder`) hands
the import to :func:`wrap_spec`, which asks the other finders for the real spec and
wraps the spec's loader in a :class:`HookLoader`, so that ``exec_module`` runs the real
loader and then the callback.  The module's ``__loader__`` and ``__spec__.loader`` are
set back to the real loader before the module runs, so nothing downstream
(``importlib.resources``, pickling by reference, ``inspect``) ever sees the wrapper.
Modelled on wrapt's ``ImportHookFinder``, with removal (the finder is taken off
``sys.meta_path``), which wrapt does not offer.  Knows nothing of patches: what the
callback does is :mod:`._apply`'s.
"""

import sys

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType


#: The finders resolving a module right now, by ``(id(finder), module name)``: a finder up the stack is
#: passed over, as wrapt's finder passes over itself (its ``in_progress``).  Python holds the module's
#: import lock around ``find_spec``, so one name is resolved by one thread at a time.
_resolving: "set[tuple[int, str]]" = set()


def wrap_spec(
    finder: object,
    fullname: str,
    path: "Sequence[str] | None",
    target: "ModuleType | None",
    fire: "Callable[[ModuleType], None]",
) -> "ModuleSpec | None":
    """The spec the other finders give for ``fullname`` (finders of ``finder``'s type, and any finder
    resolving ``fullname`` further up the stack, are passed over), its loader wrapped so that
    ``fire(module)`` runs after the module executes.  Where another hook's finder watches the same
    module, the loaders nest and both callbacks run, the innermost first."""
    spec: ModuleSpec | None = None
    key = (id(finder), fullname)
    _resolving.add(key)
    try:
        for other in list(sys.meta_path):
            if isinstance(other, type(finder)) or (id(other), fullname) in _resolving:
                continue
            find = getattr(other, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
    finally:
        _resolving.discard(key)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return spec
    spec.loader = HookLoader(spec.loader, fire)  # type: ignore[assignment]
    return spec


class HookLoader:
    """Delegates to the real loader and calls ``fire(module)`` after ``exec_module``."""

    def __init__(self, loader: object, fire: "Callable[[ModuleType], None]") -> None:
        self._npu_compat_loader = loader
        self._npu_compat_fire = fire

    def __getattr__(self, name: str) -> object:
        return getattr(self._npu_compat_loader, name)

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        create = getattr(self._npu_compat_loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: "ModuleType") -> None:
        loader = self._npu_compat_loader
        if not isinstance(loader, HookLoader):  # a nested hook's loader sets the real one itself
            module.__loader__ = loader  # type: ignore[assignment]
            if module.__spec__ is not None:
                module.__spec__.loader = loader  # type: ignore[assignment]
        loader.exec_module(module)  # type: ignore[attr-defined]
        self._npu_compat_fire(module)
