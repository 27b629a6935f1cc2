"""The process's activation state: one :class:`State`, its re-entrant lock, and the listeners told of
every change.

Every engine module is handed this state (``activate()`` in :mod:`._activation` owns it); none
of them imports the module that activates.  Imports nothing of the package at run time.
"""

import _thread
import os

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol

    from ._env import Decision
    from ._ledger import Record
    from ._spec import PatchSpec

    class Finder(Protocol):
        """What the state needs of the activation's meta-path finders: the one that watches target
        modules (``names``) and the start-up module's ``Waiting``, which waits for the first import."""

        def install(self) -> None: ...

        def uninstall(self) -> None: ...

    class Watching(Finder, Protocol):
        names: frozenset[str]


#: Called (no arguments, never under the state's lock) after ``activate()``, after ``deactivate()``
#: and after every post-import hook that may have changed a patch's status.  The per-process
#: report file (:mod:`._reportfile`) listens here.  A listener that raises is reported as a
#: warning; it never breaks an import.
LISTENERS: "list[Callable[[], None]]" = []


class State:
    """The process's activation; ``lock`` is held only for steps that import nothing (see _apply)."""

    def __init__(self) -> None:
        self.lock = _thread.RLock()
        self.generation = 0
        # id(new) -> (reference to new, original): see _ledger.remember
        self.originals: dict[int, tuple[Callable[[], object], object]] = {}
        self.summary_logged = False
        self.reset()

    def reset(self) -> None:
        self.generation += 1  # a commit prepared for an earlier activation is dropped
        self.active = False
        self.decision: Decision | None = None
        self.strict = False
        self.records: dict[str, Record] = {}
        self.order: list[Record] = []
        self.by_module: dict[str, list[Record]] = {}
        self.by_copy: dict[str, list[Record]] = {}
        self.finder: Watching | None = None
        self.waiting: Finder | None = None
        self.warned_versions: set[tuple[str, str]] = set()
        # True while the patch list waits for the first import of a target package (or a
        # report()); ``specs`` is what it will be (None: the built-in catalogue), and
        # ``read_disable`` whether NPU_COMPAT_DISABLE is read then.
        self.pending = False
        self.specs: tuple[PatchSpec, ...] | None = None
        self.read_disable = False

    def notify(self) -> None:
        for listener in list(LISTENERS):
            try:
                listener()
            except Exception as exc:  # noqa: BLE001 - a report must never break the user's import
                from ._errors import warn

                warn(f"npu_compat: report listener {listener!r} failed: {type(exc).__name__}: {exc}")


#: The one state of this process.
STATE = State()


if hasattr(os, "register_at_fork"):
    # No commit is half done at a fork: the forking thread holds the lock across it, and the child's
    # is unlocked anew.  Bound methods of the lock, not functions of this module: those would keep
    # its globals alive into finalisation (about 0.1 ms at every exit, bench/startup.py).  Records
    # that other threads of the parent were applying are told by their pid (_apply.settle).
    os.register_at_fork(
        before=STATE.lock.acquire,
        after_in_parent=STATE.lock.release,
        after_in_child=STATE.lock._at_fork_reinit,  # type: ignore[attr-defined]  # as threading does
    )
