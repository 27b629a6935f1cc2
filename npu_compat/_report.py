"""The report: what ``npu_compat.report()`` answers, and what npu-compat logs.

:func:`build` turns the ledger's records (:mod:`._ledger`) into :class:`Report`, one dict
per patch plus the device decision as ``.decision``; a process where npu-compat is not
active gets every catalogue patch as ``skipped`` with the reason.  The one-line summary
(``npu_compat active in pid ...: N patches: ...``) is logged once, when a process first imports a
patch target; :func:`log` is the one way npu-compat logs (``logging``
costs milliseconds to import and is only imported once something happens).  The
per-process report file is :mod:`._reportfile`'s.
"""

import os

from . import _env
from ._ledger import STATUSES, Record

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._spec import PatchSpec
    from ._state import State


class Report(list):  # type: ignore[type-arg]
    """``report()``'s answer: one dict per patch, plus the device decision as ``.decision``."""

    decision: "dict[str, object]"

    def to_dict(self) -> "dict[str, object]":
        return {"decision": self.decision, "patches": list(self)}


def row(rec: "Record") -> "dict[str, object]":
    """One patch as the report shows it."""
    spec = rec.spec
    return {
        "id": spec.id,
        "target": spec.target,
        "distribution": spec.distribution,
        "versions": spec.versions,
        "installed": rec.installed,
        "status": rec.status,
        "reason": rec.reason,
        "copies_repointed": [f"{getattr(c.owner, '__name__', c.owner)}:{c.name}" for c in rec.changes[1:]],
        "why": spec.why,
        "upstream_fix": spec.upstream_fix,
        "remove_when": spec.remove_when,
    }


def build(state: "State", catalog: "Sequence[PatchSpec]") -> "Report":
    """The report of ``state`` (called under its lock, once a waiting patch list has been read); where
    npu-compat is not active, ``catalog``'s patches, each ``skipped`` with the reason."""
    out = Report()
    if state.active:
        assert state.decision is not None
        out.decision = state.decision.as_dict()
        out.extend(row(rec) for rec in state.records.values())
        return out
    decision = state.decision or _env.LAST
    if decision is None:
        reason = "npu-compat is not active in this process (activate() was not called)"
        out.decision = {"device": None, "source": "not activated", "evidence": []}
    else:
        reason = (
            f"device decision is {decision.device!r} ({decision.source}): npu-compat patches nothing here"
        )
        out.decision = decision.as_dict()
    for spec in catalog:
        rec = Record(spec)
        rec.status, rec.reason = "skipped", reason
        out.append(row(rec))
    return out


def log(level: str, message: str) -> None:
    """Log ``message`` on the ``npu_compat`` logger (importing logging only now)."""
    import logging

    getattr(logging.getLogger("npu_compat"), level)(message)


def _summary(state: "State") -> str:
    counts = {status: 0 for status in STATUSES}
    for rec in state.records.values():
        counts[rec.status] += 1
    decision = state.decision
    assert decision is not None
    evidence = f": {'; '.join(decision.evidence)}" if decision.evidence else ""
    return (
        f"npu_compat active in pid {os.getpid()}: device={decision.device} ({decision.source}{evidence}); "
        f"{len(state.records)} patches: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES)
    )


def log_summary_once(state: "State") -> None:
    """Log the summary once, when the process has imported a target (whether or not logging was loaded)."""
    with state.lock:
        if state.summary_logged or state.pending or not state.active:
            return
        state.summary_logged = True
        text = _summary(state)
    log("info", text)  # without the lock: logging's handlers are anyone's code
