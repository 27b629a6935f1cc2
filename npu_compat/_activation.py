"""Activation: ``activate()``, ``deactivate()``, ``report()`` and the meta-path finder that watches
target modules, over the process's one state (:mod:`._state`).

On ``npu`` this is the one engine module activation loads (with the state, :mod:`._state`): the
start-up module's ``Waiting`` finder, in front of its :class:`PostImportFinder`, waits for the
first import of a package some patch targets (:data:`CATALOG_PACKAGES`),
which -- before that package runs -- or the first ``report()`` reads the patch list
(:mod:`._register`).  The other parts are loaded when needed and handed the state; none
imports this module.  docs/design.md, "How the engine works", follows one patch through them.
Every byte here is unmarshalled by every activated process: keep it small.
"""

import os
import sys

from . import _env
from ._state import STATE as _state

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from ._env import Decision
    from ._report import Report
    from ._spec import PatchSpec

#: The top-level package of every module the built-in catalogue (``npu_compat._catalog``)
#: patches or repoints a copy in, written out (in the start-up module, which waits for them
#: too) so that activating never reads the catalogue.  tests/engine keeps it equal to the catalogue.
CATALOG_PACKAGES: "frozenset[str]" = _env.startup.PACKAGES


class PostImportFinder:
    """The meta-path finder that watches target modules; one per activation, removed again by
    :meth:`uninstall`.  It answers only for the modules in ``names`` (see
    :func:`._importhook.wrap_spec`); while the patch list waits, ``names`` is empty and the start-up
    module's :class:`Waiting` finder, in front of it, waits for the first import of a target package.
    """

    def __init__(self, names: "Iterable[str]") -> None:
        self.names = frozenset(names)

    def find_spec(
        self, fullname: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        if fullname not in self.names:
            return None
        from ._importhook import wrap_spec

        return wrap_spec(self, fullname, path, target, _fire)

    def install(self) -> None:
        if self not in sys.meta_path:
            # A new list rather than an insert: the interpreter keeps the list it started with (in
            # its copy of the sys namespace) until the end of finalisation, and a finder in that
            # list keeps this module -- and through it os and much of the stdlib -- alive past the
            # collection that frees them: about 1% of a bare interpreter start, at every exit.
            sys.meta_path = [self, *sys.meta_path]

    def uninstall(self) -> None:
        if self in sys.meta_path:
            # a new list, never a removal: another thread's import may be iterating the old one
            sys.meta_path = [f for f in sys.meta_path if f is not self]


def _fire(module: "ModuleType") -> None:
    from ._apply import on_import

    on_import(_state, module)


def _first_import() -> None:
    # the patch list, read before the package runs; then its modules are watched
    from ._register import first_import

    first_import(_state)


def _can_wait(packages: "frozenset[str]") -> bool:
    """Whether reading the patch list can wait for the first import of one of ``packages``: none is
    imported yet, and ``NPU_COMPAT_DISABLE`` (unknown ids are warned about at activation) is unset."""
    if os.environ.get(_env.DISABLE):
        return False
    modules = sys.modules
    return not any(name in modules for name in packages)


# -- public entry points (re-exported by npu_compat) ------------------------------------


def activate(
    device: "str | None" = None,
    *,
    strict: "bool | None" = None,
    specs: "Iterable[PatchSpec] | None" = None,
    decision: "Decision | None" = None,
) -> str:
    """Activate npu-compat in this process and return the device decided.

    Only on ``"npu"`` is anything registered: post-import hooks for every patch target,
    and patches applied at once to targets already imported.  Idempotent and
    thread-safe.  ``specs`` replaces the built-in catalogue (tests, extensions).
    """
    state = _state
    wait = True
    chosen = None if specs is None else tuple(specs)
    packages = CATALOG_PACKAGES
    if chosen is not None:
        from ._register import packages_of

        packages = packages_of(chosen)
    decision = decision or _env.decide(device)  # the package's activate() has often decided already
    with state.lock:
        if state.active:
            assert state.decision is not None
            active = state.decision.device
        else:
            active = None
            state.decision = _env.LAST = decision
            if decision.is_npu:
                state.strict = strict if strict is not None else _env.is_true(os.environ.get(_env.STRICT))
                # The patch list is read at the first import of a target package (or report());
                # at once when that cannot wait.
                state.finder = PostImportFinder(())
                state.waiting = _env.startup.Waiting(packages, _first_import)
                state.pending, state.specs = True, chosen
                wait = _can_wait(packages)
                state.read_disable = not wait
                state.finder.install()
                state.waiting.install()  # in front of the finder, which answers for that first import
                state.active = True
    if active is not None:
        if not state.pending:
            from ._apply import settle  # what no hook will apply (a target imported meanwhile)

            settle(state)
        if decision.device != active:
            from ._errors import warn

            warn(
                f"npu_compat: already active for {active!r}; "
                f"call deactivate() before activating for {decision.device!r}"
            )
        return active
    if not decision.is_npu:
        return decision.device
    for problem in _env.value_problems(os.environ):
        from ._errors import warn

        warn(f"npu_compat: {problem}")
    try:
        if not wait:
            from . import _register

            _register.materialise(state)
    finally:
        state.notify()
    return "npu"


def deactivate() -> None:
    """Undo every change, in reverse order, and remove the hooks.  Safe to call when inactive."""
    from . import _undo

    _undo.deactivate(_state)


def report() -> "Report":
    """One record per patch (``id``, ``target``, ``status``, ``reason``, …) and ``.decision``."""
    from . import _register

    return _register.report(_state)


def is_patched(obj: object) -> bool:
    """True if ``obj`` is a replacement npu-compat installed (and has not been dropped)."""
    entry = _state.originals.get(id(obj))
    return entry is not None and entry[0]() is obj


def get_original(obj: object) -> object:
    """The object ``obj`` replaced, if npu-compat installed it; otherwise ``obj`` itself."""
    entry = _state.originals.get(id(obj))
    if entry is not None and entry[0]() is obj:
        return entry[1]
    return obj
