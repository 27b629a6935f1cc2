"""Undoing: every change in the ledger restored, last first.

Called by ``deactivate()`` (:mod:`._activation`), which then removes the finder and
resets the state.  A record is no longer live from the moment it is undone, so a wrapper
that survives where nobody declared it (a later ``from x import f``) calls straight
through; an attribute that someone replaced again after npu-compat patched it is left as
it is, with a warning.
"""

from ._errors import warn
from ._ledger import MISSING

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from ._activation import _State
    from ._ledger import Change


def undo(state: "_State") -> None:
    """Restore every change, in reverse order."""
    for rec in reversed(state.order):
        rec.live = False
        for change in reversed(rec.changes):
            _restore(change)


def _restore(change: "Change") -> None:
    owner, name = change.owner, change.name
    if isinstance(owner, type):
        current = owner.__dict__.get(name, MISSING)
    else:
        current = getattr(owner, name, MISSING)
    if current is not change.new:
        warn(
            f"npu_compat: {getattr(owner, '__name__', owner)}.{name} was replaced again after "
            "npu-compat patched it; left as it is"
        )
        return
    if change.had_own:
        setattr(owner, name, change.original)
    else:
        delattr(owner, name)
