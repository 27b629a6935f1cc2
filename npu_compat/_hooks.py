"""Post-import hooks: run a callback right after a named module finishes executing --
and what that callback does: apply each patch to its target, repoint the copies, keep
the ledger, undo it; the patch list and the report.

The engine (:mod:`._engine`) holds the state and the meta-path finder, and loads this
module only once there is something to do: at the first import of a target package
(before it runs), at the first :func:`npu_compat.report`, or at an activation that
cannot wait -- never at interpreter start.  What takes the engine's state runs under
its lock.

For a watched name the finder (:func:`find_spec`) asks the other finders for the real
spec and wraps the spec's loader in a :class:`_HookLoader`, so that ``exec_module``
runs the real loader and then the hook.  The module's ``__loader__`` and
``__spec__.loader`` are set back to the real loader before the module runs, so nothing
downstream (``importlib.resources``, pickling by reference, ``inspect``) ever sees the
wrapper.  Modelled on wrapt's ``ImportHookFinder``, with removal, which wrapt does not
offer.
"""

import os
import sys

from . import _env
from ._engine import PostImportFinder, _can_wait, _notify, _state, _warn

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from ._engine import _State
    from ._spec import PatchSpec

STATUSES = ("pending", "applied", "skipped", "failed")
_MISSING = object()


def find_spec(
    finder: "PostImportFinder", fullname: str, path: "Sequence[str] | None", target: "ModuleType | None"
) -> "ModuleSpec | None":
    """:meth:`PostImportFinder.find_spec` for a name it watches, or one in a package it waits for."""
    if fullname not in finder.names:
        first_import(_state)  # the patch list, read before the package runs; then its modules are watched
        if fullname not in finder.names:
            return None
    spec: ModuleSpec | None = None
    for other in list(sys.meta_path):
        if isinstance(other, PostImportFinder):
            continue
        find = getattr(other, "find_spec", None)
        if find is None:
            continue
        spec = find(fullname, path, target)
        if spec is not None:
            break
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return spec
    if isinstance(spec.loader, _HookLoader):
        return spec
    spec.loader = _HookLoader(spec.loader, _fire)  # type: ignore[assignment]
    return spec


def _fire(module: "ModuleType") -> None:
    on_import(_state, module)


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


class _Change:
    __slots__ = ("owner", "name", "original", "new", "had_own")

    def __init__(self, owner: object, name: str, original: object, new: object, had_own: bool) -> None:
        self.owner = owner
        self.name = name
        self.original = original
        self.new = new
        self.had_own = had_own


class _Record:
    __slots__ = ("spec", "status", "reason", "installed", "changes", "live", "new", "original")

    def __init__(self, spec: "PatchSpec") -> None:
        self.spec = spec
        self.status = "pending"
        self.reason = f"waiting for {spec.module} to be imported"
        self.installed: str | None = None
        self.changes: list[_Change] = []
        self.live = False
        self.new: object = _MISSING
        self.original: object = _MISSING

    def is_live(self) -> bool:
        return self.live

    def as_dict(self) -> "dict[str, object]":
        spec = self.spec
        return {
            "id": spec.id,
            "target": spec.target,
            "distribution": spec.distribution,
            "versions": spec.versions,
            "installed": self.installed,
            "status": self.status,
            "reason": self.reason,
            "copies_repointed": [
                f"{getattr(c.owner, '__name__', c.owner)}:{c.name}" for c in self.changes[1:]
            ],
            "why": spec.why,
            "upstream_fix": spec.upstream_fix,
            "remove_when": spec.remove_when,
        }


class Report(list):  # type: ignore[type-arg]
    """``report()``'s answer: one dict per patch, plus the device decision as ``.decision``."""

    decision: "dict[str, object]"

    def to_dict(self) -> "dict[str, object]":
        return {"decision": self.decision, "patches": list(self)}


# -- logging and versions -------------------------------------------------------------


def _log(level: str, message: str) -> None:
    # logging costs milliseconds to import; it is only imported once something happens.
    import logging

    getattr(logging.getLogger("npu_compat"), level)(message)


def _summary(state: "_State") -> str:
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


def maybe_log_summary(state: "_State", force: bool = False) -> None:
    if state.summary_logged or state.pending or not (force or "logging" in sys.modules):
        return
    state.summary_logged = True
    _log("info", _summary(state))


def installed_version(distribution: str) -> "str | None":
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def version_in_range(installed: str, versions: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(versions).contains(Version(installed), prereleases=True)
    except InvalidVersion:
        return False


# -- applying -------------------------------------------------------------------------


def _skip(state: "_State", rec: "_Record", reason: str, warn: bool = False) -> None:
    rec.status = "skipped"
    rec.reason = reason
    _log("debug", f"npu_compat: skipped {rec.spec.id}: {reason}")
    if warn:
        _warn(f"npu_compat: skipped {rec.spec.id}: {reason}")


def _fail(state: "_State", rec: "_Record", problem: str) -> None:
    spec = rec.spec
    where = f"{spec.distribution} {rec.installed}" if rec.installed else spec.distribution
    rec.status = "failed"
    rec.reason = (
        f"{problem} (with {where}); this process runs without this patch. "
        f"Upgrade npu-compat, or set {_env.DISABLE}={spec.id} to stand it down knowingly"
    )
    message = f"npu_compat: patch {spec.id} failed: {rec.reason}"
    _log("debug", message)
    if state.strict:
        from ._errors import PatchError

        raise PatchError(message)
    _warn(message)


def _resolve(module: "ModuleType", spec: "PatchSpec") -> "tuple[object, str, object, bool]":
    """Return ``(owner, name, original, had_own)`` or raise AttributeError with a clear message."""
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
    if isinstance(owner, type):
        had_own = name in owner.__dict__
        # the raw class attribute keeps staticmethod/classmethod descriptors intact
        original = owner.__dict__[name] if had_own else getattr(owner, name, _MISSING)
    else:
        had_own = True
        original = getattr(owner, name, _MISSING)
    if original is _MISSING:
        raise AttributeError(f"expected {spec.target} to exist, it does not")
    return owner, name, original, had_own


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


def _build(rec: "_Record", original: object, method: bool = False) -> object:
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
    rec: "_Record", original: "Callable[..., object]", wrapper: "Callable[..., object]", method: bool
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


def _set(owner: object, name: str, value: object) -> None:
    setattr(owner, name, value)


def _apply(state: "_State", rec: "_Record", module: "ModuleType") -> None:
    if rec.status != "pending":
        return
    spec = rec.spec
    rec.installed = installed_version(spec.distribution)
    if rec.installed is None:
        _skip(
            state,
            rec,
            f"{spec.module} is imported but distribution {spec.distribution!r} has no installed "
            f"metadata, so its version cannot be checked against {spec.versions!r}",
            warn=True,
        )
        return
    if not version_in_range(rec.installed, spec.versions):
        # A patch set split by version (0.5.2 / 0.6.0 layouts) leaves the other layout's specs out of
        # range: that is expected.  Only a version that no spec of this distribution supports means
        # upstream moved on; that is warned about once per distribution.
        ranges = sorted(
            {r.spec.versions for r in state.records.values() if r.spec.distribution == spec.distribution}
        )
        covered = any(version_in_range(rec.installed, v) for v in ranges)
        first = not covered and (spec.distribution, rec.installed) not in state.warned_versions
        if first:
            state.warned_versions.add((spec.distribution, rec.installed))
        _skip(
            state,
            rec,
            f"{spec.distribution} {rec.installed} is outside {spec.versions!r}"
            + (
                ""
                if covered
                else f"; no npu-compat patch supports this version ({', '.join(map(repr, ranges))})"
            ),
            warn=first,
        )
        return
    if spec.condition is not None:
        from ._spec import load

        try:
            why_not = load(spec.condition)()  # type: ignore[operator]
        except Exception as exc:  # noqa: BLE001 - a broken condition is a failed patch, not a broken import
            _fail(state, rec, f"its condition {spec.condition} raised {type(exc).__name__}: {exc}")
            return
        if why_not:
            _skip(state, rec, str(why_not))
            return
    try:
        owner, name, original, had_own = _resolve(module, spec)
    except AttributeError as exc:
        _fail(state, rec, f"upstream changed shape: {exc}")
        return
    problem = _check_expects(spec, original)
    if problem:
        _fail(state, rec, f"upstream changed shape: {problem}")
        return
    try:
        new = _build(rec, original, method=isinstance(owner, type))
    except Exception as exc:  # noqa: BLE001
        _fail(state, rec, f"building the replacement raised {type(exc).__name__}: {exc}")
        return
    rec.original, rec.new, rec.live = original, new, True
    rec.changes.append(_Change(owner, name, original, new, had_own))
    state.originals[id(new)] = (new, original)
    _set(owner, name, new)
    rec.status = "applied"
    rec.reason = ""
    state.order.append(rec)
    for copy_module, copy_name in spec.copy_places():
        mod = sys.modules.get(copy_module)
        if mod is not None:
            _repoint(rec, mod, copy_name)
    _log("debug", f"npu_compat: applied {spec.id} to {spec.target} ({spec.distribution} {rec.installed})")


def _repoint(rec: "_Record", module: "ModuleType", name: str) -> None:
    current = getattr(module, name, _MISSING)
    if current is rec.original:
        _set(module, name, rec.new)
    elif current is not rec.new:
        return  # bound to something else; not a copy of ours
    if not any(c.owner is module and c.name == name for c in rec.changes):
        rec.changes.append(_Change(module, name, rec.original, rec.new, True))


def _is_initialised(module: "ModuleType") -> bool:
    spec = getattr(module, "__spec__", None)
    return not getattr(spec, "_initializing", False)


def on_import(state: "_State", module: "ModuleType") -> None:
    """The post-import hook.  Never lets an error of ours break the user's import (unless strict)."""
    try:
        with state.lock:
            if not state.active:
                return
            name = module.__name__
            try:
                for rec in state.by_module.get(name, ()):
                    _apply(state, rec, module)
                for rec in state.by_copy.get(name, ()):
                    if rec.status == "applied":
                        for copy_module, copy_name in rec.spec.copy_places():
                            if copy_module == name:
                                _repoint(rec, module, copy_name)
                maybe_log_summary(state, force=True)
            finally:
                if name in state.by_module:
                    _notify()
    except Exception as exc:
        from ._errors import PatchError

        if isinstance(exc, PatchError):
            raise
        _warn(f"npu_compat: internal error while patching {module.__name__}: {type(exc).__name__}: {exc}")


# -- registering ----------------------------------------------------------------------


def _disabled_ids(specs: "Sequence[PatchSpec]") -> "set[str]":
    raw = os.environ.get(_env.DISABLE, "")
    wanted = {part.strip() for part in raw.split(",") if part.strip()}
    known = {spec.id for spec in specs}
    if "*" in wanted:
        return known
    unknown = sorted(wanted - known)
    if unknown:
        _warn(
            f"npu_compat: {_env.DISABLE} names unknown patch ids {', '.join(unknown)}; "
            f"known ids: {', '.join(sorted(known)) or '(none)'}"
        )
    return wanted & known


def catalog() -> "tuple[PatchSpec, ...]":
    from ._catalog import SPECS

    return SPECS


def _packages(specs: "Iterable[PatchSpec]") -> "frozenset[str]":
    """The top-level packages of every module ``specs`` patch or repoint a copy in."""
    names = set()
    for spec in specs:
        names.add(spec.module.partition(".")[0])
        names.update(module.partition(".")[0] for module, _ in spec.copy_places())
    return frozenset(names)


def activate(state: "_State", specs: "Iterable[PatchSpec] | None") -> None:
    """The registration of an activation (:func:`._engine.activate`) that did not leave it all
    to the first import of a target package.

    ``specs`` given (tests, extensions): checked, and still left waiting for the first
    import of one of their packages when none is imported yet.  Otherwise the records are
    made now (``NPU_COMPAT_DISABLE`` is read and checked here), their modules watched and
    the targets already imported patched.
    """
    chosen = None if specs is None else tuple(specs)
    finder = None
    if chosen is not None:
        ids = [spec.id for spec in chosen]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate patch ids in {ids}")
        packages = _packages(chosen)
        if _can_wait(packages):
            state.pending, state.specs = True, chosen
            finder = PostImportFinder((), packages)
    if finder is None:
        register(state, catalog() if chosen is None else chosen)
        finder = PostImportFinder([*state.by_module, *state.by_copy])
    state.finder = finder
    finder.install()
    state.active = True
    try:
        apply_imported(state)
    finally:
        maybe_log_summary(state)


def register(state: "_State", specs: "Sequence[PatchSpec]", disabled: "set[str] | None" = None) -> None:
    """One pending record per spec (or skipped, when disabled), indexed by module and copy place.

    ``disabled`` defaults to what ``NPU_COMPAT_DISABLE`` names now.
    """
    if disabled is None:
        disabled = _disabled_ids(specs)
    for spec in specs:
        rec = _Record(spec)
        state.records[spec.id] = rec
        if spec.id in disabled:
            rec.status, rec.reason = "skipped", f"disabled by {_env.DISABLE}"
            continue
        state.by_module.setdefault(spec.module, []).append(rec)
        for copy_module, _ in spec.copy_places():
            state.by_copy.setdefault(copy_module, []).append(rec)


def apply_imported(state: "_State") -> None:
    """Patch the targets (and repoint the copies) that are already imported."""
    for name in [*state.by_module, *state.by_copy]:
        module = sys.modules.get(name)
        if module is not None and _is_initialised(module):
            on_import(state, module)


def materialise(state: "_State") -> None:
    """Read the patch list an activation left waiting, watch its modules, patch what is imported."""
    if not state.pending:
        return
    state.pending = False
    specs, state.specs = state.specs, None
    # an activation waits only while NPU_COMPAT_DISABLE is unset: what it named then is nothing
    register(state, catalog() if specs is None else specs, disabled=set())
    finder = state.finder
    assert finder is not None
    finder.names = frozenset([*state.by_module, *state.by_copy])
    finder.packages = frozenset()  # after the names: a racing find_spec sees one or the other
    apply_imported(state)


def first_import(state: "_State") -> None:
    """The first import of a target package is under way (called from the finder, before it runs)."""
    try:
        with state.lock:
            if state.active:
                materialise(state)
    except Exception as exc:
        from ._errors import PatchError

        if isinstance(exc, PatchError):
            raise
        _warn(f"npu_compat: internal error while reading the patch list: {type(exc).__name__}: {exc}")


# -- undoing and reporting --------------------------------------------------------------


def undo(state: "_State") -> None:
    """Restore every change, in reverse order (the engine then removes the finder and resets)."""
    for rec in reversed(state.order):
        rec.live = False
        for change in reversed(rec.changes):
            _restore(change)


def _restore(change: "_Change") -> None:
    owner, name = change.owner, change.name
    if isinstance(owner, type):
        current = owner.__dict__.get(name, _MISSING)
    else:
        current = getattr(owner, name, _MISSING)
    if current is not change.new:
        _warn(
            f"npu_compat: {getattr(owner, '__name__', owner)}.{name} was replaced again after "
            "npu-compat patched it; left as it is"
        )
        return
    if change.had_own:
        setattr(owner, name, change.original)
    else:
        delattr(owner, name)


def report(state: "_State") -> "Report":
    with state.lock:
        out = Report()
        if state.active:
            materialise(state)
            assert state.decision is not None
            out.decision = state.decision.as_dict()
            out.extend(rec.as_dict() for rec in state.records.values())
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
        for spec in catalog():
            rec = _Record(spec)
            rec.status, rec.reason = "skipped", reason
            out.append(rec.as_dict())
        return out
