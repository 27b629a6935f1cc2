"""Applying a patch: what runs when a watched module has just been imported.

:func:`on_import` is the post-import callback (:mod:`._importhook` calls it, through the
finder of :mod:`._activation`).  For each pending record of that module it checks the
version gate (:mod:`._versions`) and the patch's condition, resolves the target,
checks its kind and its signature against ``expects``, builds the replacement (a
plain-function shim, a ``wrapt.FunctionWrapper`` or the patch's own factory), sets it,
writes the change to the ledger (:mod:`._ledger`) and repoints the declared copies.  A
problem is a ``skipped`` or ``failed`` record with its reason -- and, in strict mode, a
:class:`PatchError` -- never a broken import.

Post-import hooks run inside other imports, in any thread, while that thread holds the
module's import lock.  So the state's lock is held only for two short steps that import
and call nothing: to *claim* a pending record (one thread applies it; another that meets it
passes on) and to *commit* the outcome (set the attribute, write the ledger, repoint the
copies).  Between them, without the lock, come the steps that may import or run other code:
the version gate, the condition, resolving the target, loading the wrapper's module and
building the replacement.  Logging, warnings and the listeners come after the commit.  A
commit whose activation was undone meanwhile (``deactivate()``) is dropped.
"""

import _thread
import sys
from os import getpid as _getpid

from . import _env
from ._errors import warn
from ._ledger import MISSING, Change, Record, own, remember
from ._report import log, log_summary_once
from ._versions import installed_version, version_in_range

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import ModuleType

    from ._errors import PatchError
    from ._spec import PatchSpec
    from ._state import State


class _Found:
    """What the unlocked steps found for one record: the outcome to commit, and what to say after."""

    __slots__ = ("status", "reason", "warn_user", "unsupported", "change")

    def __init__(self, status: str, reason: str = "", warn_user: bool = False) -> None:
        self.status = status
        self.reason = reason
        self.warn_user = warn_user
        #: (distribution, version) that no patch of the list supports: warned about once per process
        self.unsupported: "tuple[str, str] | None" = None
        self.change: "Change | None" = None


def _failure(rec: "Record", problem: str) -> "_Found":
    spec = rec.spec
    where = f"{spec.distribution} {rec.installed}" if rec.installed else spec.distribution
    return _Found(
        "failed",
        f"{problem} (with {where}); this process runs without this patch. "
        f"Upgrade npu-compat, or set {_env.DISABLE}={spec.id} to stand it down knowingly",
    )


def _lookup(owner: type, name: str) -> "tuple[object, type | None]":
    """The raw attribute ``name`` of class ``owner`` and the class of its MRO that defines it, as
    attribute lookup finds it (the raw object keeps a staticmethod or classmethod what it is)."""
    for klass in owner.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name], klass
    return getattr(owner, name, MISSING), None  # a metaclass's attribute, or none


def _resolve(module: "ModuleType", spec: "PatchSpec") -> "tuple[object, str, object, bool, type | None]":
    """``(owner, name, original, had_own, defining_class)``, or AttributeError with a clear message."""
    owner: object = module
    path = spec.attr_path
    for i, part in enumerate(path[:-1]):
        try:
            owner = getattr(owner, part)
        except AttributeError:
            raise AttributeError(
                f"expected {spec.module}:{'.'.join(path[: i + 1])} to exist, it does not"
            ) from None
    name = path[-1]
    defining: type | None = None
    if isinstance(owner, type):
        original, defining = _lookup(owner, name)
        had_own = defining is owner
    else:
        original = getattr(owner, name, MISSING)
        # a module's (or an instance's) own attribute; else one its __getattr__ or class provides,
        # which undoing deletes again
        had_own = own(owner, name) is not MISSING
    if original is MISSING:
        raise AttributeError(f"expected {spec.target} to exist, it does not")
    return owner, name, original, had_own, defining


def _kind_problem(spec: "PatchSpec", original: object, defining: "type | None") -> "str | None":
    """Why a wrapper cannot stand in for ``original``, or None.  A wrapper keeps a function, method,
    staticmethod, classmethod, builtin or class what it is; a data descriptor (a property, a slot)
    or a plain value it cannot, so such a target is refused rather than broken."""
    if spec.wrapper is None:
        return None  # a replacement factory builds the whole object itself
    kind = type(original)
    where = f" defined on {defining.__module__}.{defining.__qualname__}" if defining is not None else ""
    if hasattr(kind, "__set__") or hasattr(kind, "__delete__"):
        return (
            f"{spec.target} is a {kind.__name__}{where}, a data descriptor that a wrapper cannot stand in "
            "for: declare this patch with replacement= (a factory that builds the new descriptor)"
        )
    if not (callable(original) or isinstance(original, (staticmethod, classmethod))):
        return (
            f"{spec.target} is a {kind.__name__}{where}, not a callable: declare this patch with replacement="
        )
    return None


def _check_expects(spec: "PatchSpec", original: object) -> "str | None":
    if not spec.expects:
        return None
    import inspect

    func = getattr(original, "__func__", original)
    try:
        params = inspect.signature(func).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return f"expected {spec.target} to be a callable with a signature, found {type(original).__name__}"
    missing = [p for p in spec.expects if p not in params]
    if missing:
        return (
            f"expected {spec.target} to accept {', '.join(spec.expects)}; "
            f"its signature is {spec.attr_path[-1]}{inspect.signature(func)}"  # type: ignore[arg-type]
        )
    return None


def build(rec: "Record", original: object, method: bool = False) -> object:
    """The object installed in place of ``original`` (``method``: it is a class attribute)."""
    from ._spec import load

    spec = rec.spec
    if spec.replacement is not None:
        factory = load(spec.replacement)
        return factory(original)  # type: ignore[operator]
    wrapper = load(spec.wrapper)  # type: ignore[arg-type]
    if type(original).__name__ == "function":
        return _function_shim(rec, original, wrapper, method)  # type: ignore[arg-type]
    import wrapt

    # After deactivate() a wrapper can survive in places nobody declared (a later
    # ``from x import f``); wrapt's ``enabled`` check (in C) then calls straight through.
    new: object = wrapt.FunctionWrapper(original, wrapper, enabled=rec.is_live)  # type: ignore[arg-type]
    new._self_npu_compat_patch = spec.id  # type: ignore[attr-defined]
    return new


def _function_shim(
    rec: "Record", original: "Callable[..., object]", wrapper: "Callable[..., object]", method: bool
) -> object:
    """A plain Python function standing in for a plain Python function: wrapt's calling convention
    (``wrapper(wrapped, instance, args, kwargs)``) at a fraction of a ``FunctionWrapper``'s per-call
    cost (bench/overhead.py), and the same pass-through once the patch is no longer live.

    Name, docstring, ``__dict__`` and ``__wrapped__`` (so ``inspect.signature`` reads the original's)
    are copied from the original; as a plain function it binds as a method exactly as the original.
    """
    import functools

    def method_shim(self: object, *args: object, **kwargs: object) -> object:
        if rec.live:
            return wrapper(original.__get__(self, type(self)), self, args, kwargs)
        return original(self, *args, **kwargs)

    def function_shim(*args: object, **kwargs: object) -> object:
        if rec.live:
            return wrapper(original, None, args, kwargs)
        return original(*args, **kwargs)

    shim = method_shim if method else function_shim
    functools.update_wrapper(shim, original)
    shim.__dict__["_self_npu_compat_patch"] = rec.spec.id
    return shim


def _prepare(rec: "Record", module: "ModuleType", records: "Iterable[Record]") -> "_Found":
    """The unlocked steps for one claimed record: may import and run other code."""
    spec = rec.spec
    rec.installed = installed_version(spec.distribution)
    if rec.installed is None:
        return _Found(
            "skipped",
            f"{spec.module} is imported but distribution {spec.distribution!r} has no installed "
            f"metadata, so its version cannot be checked against {spec.versions!r}",
            warn_user=True,
        )
    if not version_in_range(rec.installed, spec.versions):
        # A patch set split by version (0.5.2 / 0.6.0 layouts) leaves the other layout's specs out of
        # range: that is expected.  Only a version that no spec of this distribution supports means
        # upstream moved on; that is warned about once per distribution.
        ranges = sorted({r.spec.versions for r in records if r.spec.distribution == spec.distribution})
        covered = any(version_in_range(rec.installed, v) for v in ranges)
        found = _Found(
            "skipped",
            f"{spec.distribution} {rec.installed} is outside {spec.versions!r}"
            + (
                ""
                if covered
                else f"; no npu-compat patch supports this version ({', '.join(map(repr, ranges))})"
            ),
        )
        if not covered:
            found.unsupported = (spec.distribution, rec.installed)
        return found
    if spec.condition is not None:
        from ._spec import load

        try:
            why_not = load(spec.condition)()  # type: ignore[operator]
        except Exception as exc:  # noqa: BLE001 - a broken condition is a failed patch, not a broken import
            return _failure(rec, f"its condition {spec.condition} raised {type(exc).__name__}: {exc}")
        if why_not:
            return _Found("skipped", str(why_not))
    try:
        owner, name, original, had_own, defining = _resolve(module, spec)
    except AttributeError as exc:
        return _failure(rec, f"upstream changed shape: {exc}")
    problem = _kind_problem(spec, original, defining)
    if problem:
        return _failure(rec, f"the target cannot be wrapped: {problem}")
    problem = _check_expects(spec, original)
    if problem:
        return _failure(rec, f"upstream changed shape: {problem}")
    try:
        new = build(rec, original, method=isinstance(owner, type))
    except Exception as exc:  # noqa: BLE001
        return _failure(rec, f"building the replacement raised {type(exc).__name__}: {exc}")
    found = _Found("applied")
    found.change = Change(owner, name, original, new, had_own)
    return found


def _commit(state: "State", rec: "Record", found: "_Found") -> "_Found":
    """Under the lock: record the outcome; for ``applied``, set the attribute and repoint the copies.
    Imports nothing and calls no code of anyone else's but ``setattr``."""
    change = found.change
    if change is not None:
        owner, name = change.owner, change.name
        current = own(owner, name)
        if current is not (change.original if change.had_own else MISSING):
            found = _failure(
                rec, f"{rec.spec.target} was replaced by someone else while it was being patched"
            )
        else:
            rec.original, rec.new, rec.live = change.original, change.new, True
            rec.changes.append(change)  # in the ledger before anything can observe it
            remember(state.originals, change.new, change.original)
            setattr(owner, name, change.new)
            state.order.append(rec)
            for copy_module, copy_name in rec.spec.copy_places():
                mod = sys.modules.get(copy_module)
                if mod is not None:
                    _repoint(rec, mod, copy_name)
            found.reason = ""
    if found.unsupported is not None and found.unsupported not in state.warned_versions:
        state.warned_versions.add(found.unsupported)
        found.warn_user = True
    rec.status, rec.reason = found.status, found.reason
    return found


def _announce(state: "State", rec: "Record", found: "_Found") -> "PatchError | None":
    """After the commit, without the lock: the log line, the warning, and in strict mode the error."""
    spec = rec.spec
    if found.status == "applied":
        log("debug", f"npu_compat: applied {spec.id} to {spec.target} ({spec.distribution} {rec.installed})")
        return None
    if found.status == "skipped":
        log("debug", f"npu_compat: skipped {spec.id}: {found.reason}")
        if found.warn_user:
            warn(f"npu_compat: skipped {spec.id}: {found.reason}")
        return None
    message = f"npu_compat: patch {spec.id} failed: {found.reason}"
    log("debug", message)
    if state.strict:
        from ._errors import PatchError

        return PatchError(message)
    warn(message)
    return None


def apply(
    state: "State", rec: "Record", module: "ModuleType", generation: int, records: "Iterable[Record]"
) -> None:
    """Apply one record this thread has claimed (see :func:`claim`) to its just-imported ``module``,
    or say why not; raises :class:`PatchError` in strict mode once the outcome is recorded."""
    try:
        found = _prepare(rec, module, records)
    except BaseException:
        with state.lock:
            rec.claimed = None  # pending again: the next import or report() tries it again
        raise
    with state.lock:
        rec.claimed = None
        if state.generation != generation or rec.status != "pending":
            # deactivate() ran meanwhile (this record, and what was built for it, are gone), or in a
            # forked child both the thread that forked and another applied it: the first stands
            return
        found = _commit(state, rec, found)
    error = _announce(state, rec, found)
    if error is not None:
        raise error


def claim(state: "State", records: "Iterable[Record]") -> "list[Record]":
    """Under the lock: the pending records no other thread is applying, now this thread's."""
    pid, thread = _getpid(), _thread.get_ident()
    mine = []
    for rec in records:
        if _claimable(rec, pid, thread):
            rec.claimed = (pid, thread)
            mine.append(rec)
    return mine


def _claimable(rec: "Record", pid: int, thread: int) -> bool:
    """Pending, and no thread is applying it.  A claim made in another process is the parent's,
    before a fork: no thread here holds it (but the thread that forked, which goes on in the child,
    keeps its own)."""
    claimed = rec.claimed
    return rec.status == "pending" and (claimed is None or (claimed[0] != pid and claimed[1] != thread))


def _repoint(rec: "Record", module: "ModuleType", name: str) -> None:
    current = module.__dict__.get(name, MISSING)
    if current is rec.original:
        setattr(module, name, rec.new)
    elif current is not rec.new:
        return  # bound to something else; not a copy of ours
    if not any(c.owner is module and c.name == name for c in rec.changes):
        rec.changes.append(Change(module, name, rec.original, rec.new, True))


def on_import(state: "State", module: "ModuleType", settling: bool = True) -> None:
    """The post-import hook (``settling``: first apply what :func:`settle` has waiting).  Never lets
    an error of ours break the user's import (unless strict)."""
    try:
        if settling:
            settle(state)
        _on_import(state, module)
    except Exception as exc:
        from ._errors import PatchError

        if isinstance(exc, PatchError):
            raise
        warn(f"npu_compat: internal error while patching {module.__name__}: {type(exc).__name__}: {exc}")


def _on_import(state: "State", module: "ModuleType") -> None:
    name = module.__name__
    with state.lock:
        if not state.active:
            return
        generation, records = state.generation, state.records
        mine = claim(state, state.by_module.get(name, ()))
        copies = state.by_copy.get(name, ())
        watched = name in state.by_module
    errors = []
    every = list(records.values()) if mine else []
    try:
        for rec in mine:
            try:
                apply(state, rec, module, generation, every)
            except Exception as exc:  # every claimed record is settled before strict mode raises
                from ._errors import PatchError

                if not isinstance(exc, PatchError):
                    raise
                errors.append(exc)
    finally:
        # an error of ours part way: the records not reached are pending again, not held for good
        with state.lock:
            for rec in mine:
                if rec.status == "pending":
                    rec.claimed = None
    if copies:
        with state.lock:
            if state.generation == generation:
                for rec in copies:
                    if rec.status == "applied":
                        for copy_module, copy_name in rec.spec.copy_places():
                            if copy_module == name:
                                _repoint(rec, module, copy_name)
    log_summary_once(state)
    if watched:
        state.notify()
    if errors:
        raise errors[0]


def _is_initialised(module: "ModuleType") -> bool:
    spec = getattr(module, "__spec__", None)
    return not getattr(spec, "_initializing", False)


def apply_imported(state: "State") -> None:
    """Patch the targets (and repoint the copies) that are already imported.  A module still being
    imported (by another thread, or further up this one's stack) cannot be patched yet; it is
    :func:`settle`'s."""
    for name in [*state.by_module, *state.by_copy]:
        module = sys.modules.get(name)
        if module is not None and _is_initialised(module):
            on_import(state, module, settling=False)


def settle(state: "State") -> None:
    """Apply what no hook will: at every post-import hook, ``report()`` and ``activate()``.

    A target whose import had begun (its spec found) before the finder was installed -- by another
    thread while this one activated, or in a deactivate/activate cycle -- or that was still running
    when the patch list was read, is imported with no hook of ours; in a forked child, what another
    thread of the parent was applying was left half way.  Each is found here: a watched module,
    imported in full, with a record that is pending and not being applied, or a declared copy still
    bound to the original.  A look at each watched module, no more, when there is nothing to do."""
    if not state.active or state.pending:
        return
    with state.lock:
        modules, copies = list(state.by_module.items()), list(state.by_copy.items())
    pid, thread = _getpid(), _thread.get_ident()
    for name, recs in modules:
        module = sys.modules.get(name)
        if (
            module is not None
            and any(_claimable(rec, pid, thread) for rec in recs)
            and _is_initialised(module)
        ):
            on_import(state, module, settling=False)
    for name, recs in copies:
        module = sys.modules.get(name)
        if module is not None and _is_initialised(module):
            for rec in recs:
                if rec.status == "applied" and any(
                    place == name and module.__dict__.get(copy, MISSING) is rec.original
                    for place, copy in rec.spec.copy_places()
                ):
                    on_import(state, module, settling=False)
                    break
