"""Registering: from the patch list to pending records, their modules watched.

The patch list is the catalogue (:mod:`._catalog`), or the specs given to ``activate()``.
:func:`register` makes one record per spec (``skipped`` when ``NPU_COMPAT_DISABLE`` names
it), indexed by the module it patches and by the modules holding its copies; the
activation's finder is then told to watch those modules, and targets already imported are
patched at once (:func:`._apply.apply_imported`).  An activation reads it here: at once when it cannot
wait, else at the first import of a target package (:func:`first_import`, before that
package runs) or the first ``report()``.
"""

import os

from . import _env
from ._apply import apply_imported, settle
from ._errors import warn
from ._ledger import Record

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._report import Report
    from ._spec import PatchSpec
    from ._state import State


def catalog() -> "tuple[PatchSpec, ...]":
    """The built-in patch list."""
    from ._catalog import SPECS

    return SPECS


def packages_of(specs: "Sequence[PatchSpec]") -> "frozenset[str]":
    """The top-level packages of every module ``specs`` patch or repoint a copy in (the ones an
    activation with these specs waits for).  Raises ValueError for duplicate patch ids."""
    ids = [spec.id for spec in specs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate patch ids in {ids}")
    names = set()
    for spec in specs:
        names.add(spec.module.partition(".")[0])
        names.update(module.partition(".")[0] for module, _ in spec.copy_places())
    return frozenset(names)


#: The reason of a record that ``NPU_COMPAT_DISABLE`` names.
DISABLED = f"disabled by {_env.DISABLE}"


def disabled_ids(specs: "Sequence[PatchSpec]", value: str) -> "tuple[set[str], list[str]]":
    """What ``value``, a setting of ``NPU_COMPAT_DISABLE``, disables of ``specs``: the ids it names
    (``*``: every one), and the names it gives that are no id of theirs, sorted (none with ``*``).

    Reads no variable and warns of nothing: the plan ``doctor`` shows is the one registering makes."""
    wanted = {part.strip() for part in value.split(",") if part.strip()}
    known = {spec.id for spec in specs}
    if "*" in wanted:
        return known, []
    return wanted & known, sorted(wanted - known)


def _disabled_ids(specs: "Sequence[PatchSpec]") -> "set[str]":
    disabled, unknown = disabled_ids(specs, os.environ.get(_env.DISABLE, ""))
    if unknown:
        known = {spec.id for spec in specs}
        warn(
            f"npu_compat: {_env.DISABLE} names unknown patch ids {', '.join(unknown)}; "
            f"known ids: {', '.join(sorted(known)) or '(none)'}"
        )
    return disabled


def register(state: "State", specs: "Sequence[PatchSpec]", disabled: "set[str] | None" = None) -> None:
    """One pending record per spec (or skipped, when disabled), indexed by module and copy place.

    ``disabled`` defaults to what ``NPU_COMPAT_DISABLE`` names now.
    """
    if disabled is None:
        disabled = _disabled_ids(specs)
    for spec in specs:
        rec = Record(spec)
        state.records[spec.id] = rec
        if spec.id in disabled:
            rec.status, rec.reason = "skipped", DISABLED
            continue
        state.by_module.setdefault(spec.module, []).append(rec)
        for copy_module, _ in spec.copy_places():
            state.by_copy.setdefault(copy_module, []).append(rec)


def materialise(state: "State") -> None:
    """Read the patch list an activation left waiting, watch its modules, patch what is imported.

    The list is loaded (and ``NPU_COMPAT_DISABLE`` read) without the state's lock, and registered
    under it; another thread that finds the list already read passes on.  Read already, it applies
    what no hook will (:func:`._apply.settle`)."""
    with state.lock:
        pending, generation, specs = state.pending, state.generation, state.specs
        read_disable = state.read_disable
    if not pending:
        settle(state)
        return
    specs = catalog() if specs is None else specs
    # an activation waits only while NPU_COMPAT_DISABLE is unset: what it named then is nothing
    disabled = _disabled_ids(specs) if read_disable else set()
    with state.lock:
        if not state.pending or state.generation != generation:
            return
        state.pending, state.specs = False, None
        register(state, specs, disabled)
        finder = state.finder
        assert finder is not None
        finder.names = frozenset([*state.by_module, *state.by_copy])
        if state.waiting is not None:  # after the names: a racing import meets one or the other
            state.waiting.uninstall()
    apply_imported(state)


def report(state: "State") -> "Report":
    """The report of ``state`` as it stands: the patch list read first if it still waits, and what no
    hook will apply settled (``npu_compat.report()``, and the per-process report file)."""
    if state.active:
        materialise(state)
    from . import _catalog, _report

    with state.lock:
        return _report.build(state, _catalog.SPECS)


def first_import(state: "State") -> None:
    """The first import of a target package is under way (called from the finder, before it runs)."""
    try:
        if state.active:
            materialise(state)
    except Exception as exc:
        from ._errors import PatchError

        if isinstance(exc, PatchError):
            raise
        warn(f"npu_compat: internal error while reading the patch list: {type(exc).__name__}: {exc}")
