"""The ledger: one record per patch -- its status, its reason, and every change it made.

A :class:`Record` is made for each declared patch when the patch list is read
(:mod:`._register`); it starts ``pending`` and becomes ``applied``, ``skipped`` or
``failed`` when its target is imported (:mod:`._apply`).  Each change an applied patch
makes to an upstream object is a :class:`Change` -- ``(owner, name, original, new)`` --
appended before anything else can observe it; :mod:`._undo` restores them in reverse
order, and :mod:`._report` describes the records.
"""

import _weakref

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable

    from ._spec import PatchSpec

#: Every status a record can have, in the order the summary counts them.
STATUSES = ("pending", "applied", "skipped", "failed")
#: "No such attribute": an attribute's value can be None.
MISSING = object()


def own(owner: object, name: str) -> object:
    """What ``owner`` itself holds under ``name`` (MISSING if nothing): a class's or a module's own
    dict, never a lookup that could run a module's ``__getattr__`` (and import) under the lock."""
    held = getattr(owner, "__dict__", None)
    if isinstance(owner, type) or type(held) is dict:
        return owner.__dict__.get(name, MISSING)
    return getattr(owner, name, MISSING)


class Change:
    """One attribute of one upstream object, as npu-compat set it (``had_own``: the
    owner held the attribute itself, rather than inheriting it)."""

    __slots__ = ("owner", "name", "original", "new", "had_own")

    def __init__(self, owner: object, name: str, original: object, new: object, had_own: bool) -> None:
        self.owner = owner
        self.name = name
        self.original = original
        self.new = new
        self.had_own = had_own


class Record:
    """What became of one patch: status, reason, the installed version and its changes.

    The first change is the target itself; the rest are the copies repointed.  ``live``
    is False once the patch is undone: a wrapper left where nobody declared it then calls
    straight through.  ``claimed`` is ``(pid, thread)`` applying a pending record right now
    (see :mod:`._apply`), else None.
    """

    __slots__ = ("spec", "status", "reason", "installed", "changes", "live", "new", "original", "claimed")

    def __init__(self, spec: "PatchSpec") -> None:
        self.spec = spec
        self.status = "pending"
        self.reason = f"waiting for {spec.module} to be imported"
        self.installed: str | None = None
        self.changes: list[Change] = []
        self.live = False
        self.new: object = MISSING
        self.original: object = MISSING
        self.claimed: tuple[int, int] | None = None

    def is_live(self) -> bool:
        return self.live


class _Strong:
    """Holds a replacement that cannot be referenced weakly (an int, a tuple) while it is applied."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __call__(self) -> object:
        return self.obj


def remember(
    originals: "dict[int, tuple[Callable[[], object], object]]", new: object, original: object
) -> None:
    """Note in ``originals`` (the state's: ``id(new) -> (reference to new, original)``) that ``new``
    replaced ``original``, for ``is_patched``/``get_original``.  Weakly where ``new`` allows it: a
    wrapper that outlives ``deactivate()`` (a copy nobody declared) is still answered for, and nothing
    is kept once it is gone."""
    key = id(new)

    def gone(ref: object) -> None:
        entry = originals.get(key)
        if entry is not None and entry[0] is ref:
            del originals[key]

    try:
        ref: Callable[[], object] = _weakref.ref(new, gone)
    except TypeError:
        ref = _Strong(new)
    originals[key] = (ref, original)


def forget_values(originals: "dict[int, tuple[Callable[[], object], object]]") -> None:
    """After undoing: drop what is held strongly (plain values); wrappers are held weakly."""
    # a copy first (one step in C): a collection during the loop runs the weak references'
    # callbacks, which remove entries
    for key, (ref, _) in originals.copy().items():
        if type(ref) is _Strong:
            originals.pop(key, None)
