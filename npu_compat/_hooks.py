"""Post-import hooks: run a callback right after a named module finishes executing.

A meta-path finder sits first on ``sys.meta_path`` and answers only for watched names.
It asks the other finders for the real spec and wraps the spec's loader, so that
``exec_module`` runs the real loader and then the callback.  The module's
``__loader__`` and ``__spec__.loader`` are set back to the real loader before the
module runs, so nothing downstream (``importlib.resources``, pickling by reference,
``inspect``) ever sees the wrapper.  Modelled on wrapt's ``ImportHookFinder``,
with removal, which wrapt does not offer.
"""

import sys

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType


class _HookLoader:
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
        module.__loader__ = loader  # type: ignore[assignment]
        if module.__spec__ is not None:
            module.__spec__.loader = loader  # type: ignore[assignment]
        loader.exec_module(module)  # type: ignore[attr-defined]
        self._npu_compat_fire(module)


class PostImportFinder:
    """The meta-path finder; one per activation, removed again by :meth:`uninstall`."""

    def __init__(self, fire: "Callable[[ModuleType], None]", names: "Iterable[str]") -> None:
        self._fire = fire
        self._names = frozenset(names)

    @property
    def names(self) -> "frozenset[str]":
        return self._names

    def find_spec(
        self, fullname: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        if fullname not in self._names:
            return None
        spec: ModuleSpec | None = None
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, PostImportFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        if isinstance(spec.loader, _HookLoader):
            return spec
        spec.loader = _HookLoader(spec.loader, self._fire)  # type: ignore[assignment]
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        while self in sys.meta_path:
            sys.meta_path.remove(self)

    def invalidate_caches(self) -> None:
        pass
