"""The ledger: one record per patch -- its status, its reason, and every change it made.

A :class:`Record` is made for each declared patch when the patch list is read
(:mod:`._register`); it starts ``pending`` and becomes ``applied``, ``skipped`` or
``failed`` when its target is imported (:mod:`._apply`).  Each change an applied patch
makes to an upstream object is a :class:`Change` -- ``(owner, name, original, new)`` --
appended before anything else can observe it; :mod:`._undo` restores them in reverse
order, and :mod:`._report` describes the records.
"""

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from ._spec import PatchSpec

#: Every status a record can have, in the order the summary counts them.
STATUSES = ("pending", "applied", "skipped", "failed")
#: "No such attribute": an attribute's value can be None.
MISSING = object()


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
    straight through.  ``claimed`` is the thread applying a pending record right now (see
    :mod:`._apply`), else None.
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
        self.claimed: int | None = None

    def is_live(self) -> bool:
        return self.live
