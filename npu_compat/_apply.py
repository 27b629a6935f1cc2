"""Applying a patch: what runs when a watched module has just been imported.

:func:`on_import` is the post-import callback (:mod:`._importhook` calls it, through the
finder of :mod:`._activation`).  For each pending record of that module it checks the
version gate (:mod:`._versions`) and the patch's condition, resolves the target,
checks its signature against ``expects``, builds the replacement (a plain-function shim,
a ``wrapt.FunctionWrapper`` or the patch's own factory), sets it, writes the change to the
ledger (:mod:`._ledger`) and repoints the declared copies.  A problem is a ``skipped`` or
``failed`` record with its reason -- and, in strict mode, a :class:`PatchError` -- never
a broken import.  Everything here runs under the state's lock.
"""

import sys

from . import _env
from ._errors import warn
from ._ledger import MISSING, Change, Record
from ._report import log, maybe_log_summary
from ._versions import installed_version, version_in_range

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from ._activation import _State
    from ._spec import PatchSpec


def _skip(rec: "Record", reason: str, warn_user: bool = False) -> None:
    rec.status = "skipped"
    rec.reason = reason
    log("debug", f"npu_compat: skipped {rec.spec.id}: {reason}")
    if warn_user:
        warn(f"npu_compat: skipped {rec.spec.id}: {reason}")


def _fail(state: "_State", rec: "Record", problem: str) -> None:
    spec = rec.spec
    where = f"{spec.distribution} {rec.installed}" if rec.installed else spec.distribution
    rec.status = "failed"
    rec.reason = (
        f"{problem} (with {where}); this process runs without this patch. "
        f"Upgrade npu-compat, or set {_env.DISABLE}={spec.id} to stand it down knowingly"
    )
    message = f"npu_compat: patch {spec.id} failed: {rec.reason}"
    log("debug", message)
    if state.strict:
        from ._errors import PatchError

        raise PatchError(message)
    warn(message)


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
        original = owner.__dict__[name] if had_own else getattr(owner, name, MISSING)
    else:
        had_own = True
        original = getattr(owner, name, MISSING)
    if original is MISSING:
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


def _set(owner: object, name: str, value: object) -> None:
    setattr(owner, name, value)


def apply(state: "_State", rec: "Record", module: "ModuleType") -> None:
    """Apply one pending patch to its just-imported ``module``, or say why not."""
    if rec.status != "pending":
        return
    spec = rec.spec
    rec.installed = installed_version(spec.distribution)
    if rec.installed is None:
        _skip(
            rec,
            f"{spec.module} is imported but distribution {spec.distribution!r} has no installed "
            f"metadata, so its version cannot be checked against {spec.versions!r}",
            warn_user=True,
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
            rec,
            f"{spec.distribution} {rec.installed} is outside {spec.versions!r}"
            + (
                ""
                if covered
                else f"; no npu-compat patch supports this version ({', '.join(map(repr, ranges))})"
            ),
            warn_user=first,
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
            _skip(rec, str(why_not))
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
        new = build(rec, original, method=isinstance(owner, type))
    except Exception as exc:  # noqa: BLE001
        _fail(state, rec, f"building the replacement raised {type(exc).__name__}: {exc}")
        return
    rec.original, rec.new, rec.live = original, new, True
    rec.changes.append(Change(owner, name, original, new, had_own))
    state.originals[id(new)] = (new, original)
    _set(owner, name, new)
    rec.status = "applied"
    rec.reason = ""
    state.order.append(rec)
    for copy_module, copy_name in spec.copy_places():
        mod = sys.modules.get(copy_module)
        if mod is not None:
            _repoint(rec, mod, copy_name)
    log("debug", f"npu_compat: applied {spec.id} to {spec.target} ({spec.distribution} {rec.installed})")


def _repoint(rec: "Record", module: "ModuleType", name: str) -> None:
    current = getattr(module, name, MISSING)
    if current is rec.original:
        _set(module, name, rec.new)
    elif current is not rec.new:
        return  # bound to something else; not a copy of ours
    if not any(c.owner is module and c.name == name for c in rec.changes):
        rec.changes.append(Change(module, name, rec.original, rec.new, True))


def on_import(state: "_State", module: "ModuleType") -> None:
    """The post-import hook.  Never lets an error of ours break the user's import (unless strict)."""
    try:
        with state.lock:
            if not state.active:
                return
            name = module.__name__
            try:
                for rec in state.by_module.get(name, ()):
                    apply(state, rec, module)
                for rec in state.by_copy.get(name, ()):
                    if rec.status == "applied":
                        for copy_module, copy_name in rec.spec.copy_places():
                            if copy_module == name:
                                _repoint(rec, module, copy_name)
                maybe_log_summary(state, force=True)
            finally:
                if name in state.by_module:
                    state.notify()
    except Exception as exc:
        from ._errors import PatchError

        if isinstance(exc, PatchError):
            raise
        warn(f"npu_compat: internal error while patching {module.__name__}: {type(exc).__name__}: {exc}")
