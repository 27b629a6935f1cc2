"""Undoing: every change in the ledger restored, last first.

Called by ``deactivate()`` (:mod:`._activation`) under the state's lock, which then removes
the finder and resets the state.  A record is no longer live from the moment it is undone,
so a wrapper that survives where nobody declared it (a later ``from x import f``) calls
straight through; an attribute that someone replaced again after npu-compat patched it is
left as it is, with a warning -- returned, and given once the lock is released.  An
inherited target is deleted from the subclass again, so that it inherits the original.
"""

import sys

from . import _env
from ._ledger import own

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from ._ledger import Change
    from ._state import State


def deactivate(state: "State") -> None:
    """``deactivate()``: under the lock, every change undone, the environment variables patches set
    restored (:mod:`._effects`), the finder removed and the state reset; then the warnings, the
    listeners, and the report file's last write and its watcher stopped."""
    messages: list[str] = []
    with state.lock:
        if state.order:
            messages = undo(state)
        if state.waiting is not None:
            state.waiting.uninstall()
        if state.finder is not None:
            state.finder.uninstall()
        effects = sys.modules.get("npu_compat._effects")
        if effects is not None:
            effects.undo()
        state.reset()
        if state.originals:
            from ._ledger import forget_values

            forget_values(state.originals)
        state.summary_logged = False
        _env.LAST = None
        token = state.generation
    if messages:
        from ._errors import warn

        for message in messages:
            warn(message)
    state.notify()  # the report file says so once more
    if "npu_compat._reportfile" in sys.modules:  # (an import, not a look-up: it may be half imported)
        from . import _reportfile

        _reportfile.detach(token)  # and its listener and watcher thread stop (unless activated since)


def undo(state: "State") -> "list[str]":
    """Restore every change, in reverse order; the warnings to give."""
    messages = []
    for rec in reversed(state.order):
        rec.live = False
        for change in reversed(rec.changes):
            message = _restore(change)
            if message:
                messages.append(message)
    return messages


def _restore(change: "Change") -> "str | None":
    owner, name = change.owner, change.name
    if own(owner, name) is not change.new:
        return (
            f"npu_compat: {getattr(owner, '__name__', owner)}.{name} was replaced again after "
            "npu-compat patched it; left as it is"
        )
    if change.had_own:
        setattr(owner, name, change.original)
    else:
        delattr(owner, name)  # inherited again
    return None
