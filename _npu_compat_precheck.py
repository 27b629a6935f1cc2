"""npu-compat's pre-check: what runs first, at every interpreter start, in every Python process.

Interpreter start goes: the ``.pth`` line (or a ``sitecustomize`` of ours) -> this
pre-check -> activation (``npu_compat._autostart``), at once or at the first import of a
target package.  This module is reached three ways; whichever runs first holds the state,
and npu-compat starts at most once per interpreter:

* ``npu_compat.pth`` in site-packages imports it (every interpreter of the environment,
  also under ``-I``, not under ``-S``), even when another ``sitecustomize`` shadows ours;
* the ``sitecustomize`` at the top of the wheel, a stub that calls it;
* the launcher's site directory (``npu_compat/_launcher_site``, first on the command's
  ``PYTHONPATH``), whose ``sitecustomize`` is a copy of this file (a link in the
  repository), so that a launched interpreter loads one module, not two.

A ``sitecustomize`` of ours activates, then runs the next ``sitecustomize`` on ``sys.path``
-- the environment's own -- exactly once, as Python would have.

Every interpreter pays for this file, so it imports nothing (``os`` and ``sys`` are
loaded before ``site`` runs) and first asks one cheap question: can npu-compat be
anything but a no-op here?  Only an Ascend hint (a device override that is not
``cpu``/``cuda``, an Ascend variable, ``/dev/davinci*``, ``torch_npu`` on the path) or
a report directory leads on to ``npu_compat._autostart``, which imports the package and
makes the real decision.  Even then that waits, when nothing could tell the difference,
for the first import of a package some patch targets (or of ``npu_compat`` itself): a
process that never imports one has nothing to patch, and one that does pays the start
inside an import that takes seconds.  Asked cheaply: the environment is read from ``os.environ``'s
own dict, ``/dev`` is listed once and searched as one string, and the next
``sitecustomize`` is looked for in the path finders' listings before any finder is made.
Nothing is ever imported from the current directory or a relative ``sys.path`` entry:
the package is imported from this file's own location.
"""

import os
import sys

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import ModuleType
    from typing import Any

# The few names of npu_compat._env this pre-check reads before anything is imported
# (importing _env costs every interpreter ~0.3 ms); tests/seams keeps them equal.
_ENABLE = "NPU_COMPAT"
_AUTO = "NPU_COMPAT_AUTO"
_OVERRIDES = ("NPU_COMPAT_DEVICE", "TRINITY_DEVICE")
_REPORT_DIR = "NPU_COMPAT_REPORT_DIR"
_HINTS = (
    "NPU_COMPAT_SIMULATE",
    _REPORT_DIR,
    "ASCEND_RT_VISIBLE_DEVICES",
    "ASCEND_TOOLKIT_HOME",
    "ASCEND_HOME_PATH",
)
_FALSE = ("0", "false", "no", "off")
_NOT_NPU = ("cpu", "cuda")
DEV_DIR = "/dev"
_NONE = object()
#: The top-level packages whose first import finishes a waiting start: those of
#: npu_compat._activation.CATALOG_PACKAGES (tests/engine keeps them equal).
_PACKAGES = frozenset({"ray", "torch", "trinity", "verl", "vllm"})
#: Set, any of these needs the whole start at once: the simulation's path entry, the
#: per-process report file, the warning for an unknown id in the disable list.
_NOW = ("NPU_COMPAT_SIMULATE", _REPORT_DIR, "NPU_COMPAT_DISABLE")

#: Every trigger that reached this interpreter, in order (``.pth``, ``sitecustomize``, ``launcher``).
TRIGGERS: "list[str]" = []
#: The trigger that started npu-compat here, or None (no trigger, or nothing to do).
STARTED: "str | None" = None
#: While the start waits (see :func:`complete`): the trigger it waits for, else None.
PENDING: "str | None" = None

_HERE = os.path.dirname(os.path.abspath(__file__))
#: Where the npu_compat package is: beside this file, or two levels up from npu_compat/_launcher_site.
_ROOT = os.path.dirname(os.path.dirname(_HERE)) if os.path.basename(_HERE) == "_launcher_site" else _HERE
_OURS: "list[str]" = []  # the sitecustomize files of ours that ran here
_HOST: "list[bool | None]" = []  # what the environment and /dev said, once read


def wanted(environ: "Mapping[str, str] | None" = None) -> bool:
    # False when npu-compat can only be a no-op in this process (decided without imports).
    # The environment and /dev are read once per interpreter; only sys.path grows between
    # the .pth (read before later site directories are added) and sitecustomize.
    if environ is not None:
        host = _host_says(environ)
    else:
        if not _HOST:
            _HOST.append(_host_says(os.environ) if _environ_names_set() else _dev_says())
        host = _HOST[0]
    return host if host is not None else _torch_npu_on_path()


def _environ_names_set() -> bool:
    # Whether any name the pre-check reads is in os.environ.  Its own dict (bytes keys on POSIX)
    # answers without os.environ's encoding and two KeyErrors for each name that is not set.
    data = getattr(os.environ, "_data", None)
    if os.name != "posix" or type(data) is not dict:
        return True
    for name in (_ENABLE, _AUTO, *_OVERRIDES, *_HINTS):
        if name.encode() in data:
            return True
    return False


def _host_says(env: "Mapping[str, str]") -> "bool | None":
    for name in (_ENABLE, _AUTO):
        value = env.get(name)
        if value is not None and value.strip().lower() in _FALSE:
            return False
    override = _override(env)
    if override is not None:
        return override not in _NOT_NPU  # "npu", or a bad value that _env will name
    for name in _HINTS:
        if env.get(name):
            return True
    return _dev_says()


def _override(env: "Mapping[str, str]") -> "str | None":
    # The device override in force, lower-cased, or None (unset or "auto"): the first of
    # _OVERRIDES that says anything else, the precedence of npu_compat._env.decide.
    for name in _OVERRIDES:
        raw = env.get(name)
        if raw:
            value = raw.strip().lower()
            if value != "auto":
                return value
    return None


def _dev_says() -> "bool | None":
    # any /dev/davinci*: one listing, searched as one string (names hold no NUL)
    try:
        if "\0davinci" in "\0" + "\0".join(os.listdir(DEV_DIR)):
            return True
    except OSError:
        pass
    return None  # no answer yet: a torch_npu on the path decides


def _torch_npu_on_path() -> bool:
    cache = sys.path_importer_cache
    for entry in sys.path:
        if not isinstance(entry, str) or not os.path.isabs(entry):
            continue
        listing = getattr(cache.get(entry), "_path_cache", None)
        if listing:
            if "torch_npu" in listing:
                return True
        elif os.access(f"{entry}{os.sep}torch_npu", os.F_OK):
            return True
    return False


def from_pth() -> None:
    """The ``npu_compat.pth`` line."""
    _trigger(".pth")


def from_sitecustomize(path: str, via: str) -> None:
    """A shipped ``sitecustomize`` (``via``: ``sitecustomize`` or ``launcher``) at ``path``.

    Activates, then runs the next ``sitecustomize`` on ``sys.path`` after ``path``'s
    directory, exactly as Python would have without ours, and makes it the module
    ``import sitecustomize`` answers.
    """
    _trigger(via)
    _chain(path)


def _trigger(via: str) -> None:
    global STARTED, PENDING
    if via in TRIGGERS:
        return  # CPython 3.11 processes a venv's .pth files twice
    TRIGGERS.append(via)
    if STARTED is not None:
        return
    if not wanted():
        _forget_report()
        return
    STARTED = via
    if _can_wait():
        PENDING = via
        sys.meta_path = [_WAITING, *sys.meta_path]  # a new list: see npu_compat._activation.PostImportFinder
        if hasattr(os, "register_at_fork"):
            # another thread may hold the lock at a fork.  A bound method of the lock, not a function
            # of this module: a function would keep this module's globals alive into finalisation
            # (about 0.1 ms at every exit, measured with bench/startup.py)
            os.register_at_fork(after_in_child=_LOCK._at_fork_reinit)
        return
    _start(via)


def _start(via: str) -> None:
    try:
        autostart = sys.modules.get("npu_compat._autostart")
        if autostart is None:
            autostart = _import_autostart()
        autostart.start(via)
    except Exception as exc:  # noqa: BLE001 - interpreter start-up must never fail because of us
        sys.stderr.write(
            f"npu_compat: activation at interpreter start ({via}) failed: {type(exc).__name__}: {exc}; "
            "this process runs without npu-compat\n"
        )


def _can_wait() -> bool:
    # Whether the start can wait for the first import of a target package: no setting that
    # needs it now, a device override (if any) that is plainly "npu" (a bad value is named at
    # start), and no target package or npu_compat module already imported.
    environ = os.environ
    for name in _NOW:
        if environ.get(name):
            return False
    if _override(environ) not in (None, "npu"):
        return False
    modules = sys.modules
    return not any(name in modules for name in (*_PACKAGES, "npu_compat"))


class _Waiting:
    """The meta-path finder of a waiting start: the first import of a package in
    :data:`_PACKAGES` finishes the start, and the finders that installed then answer
    for that import (so the package's own post-import hooks see it)."""

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        if fullname.partition(".")[0] not in _PACKAGES:
            return None
        complete()
        for finder in _ADDED:
            if finder in sys.meta_path:
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
        return None


_WAITING = _Waiting()
_LOCK = __import__("_thread").RLock()  # _thread is loaded before site runs
_ADDED: "list[Any]" = []  # the meta-path finders that finishing the start installed


def complete(wait: bool = True) -> None:
    """Finish a start that waits (:data:`PENDING`); no-op otherwise.

    Called by the waiting finder and by ``import npu_compat`` (so ``report()``, ``doctor`` and
    an explicit ``activate()`` see the start that auto-activation made).  Thread-safe: a second
    importer of a target package waits until the first has finished it.  ``import npu_compat``
    does not wait (``wait=False``): a start under way in another thread is importing npu_compat
    itself, and so waits for this very import to end.
    """
    global PENDING
    if not _LOCK.acquire(wait):
        return
    try:
        via = PENDING
        if via is None:
            return
        PENDING = None
        before = [f for f in sys.meta_path if f is not _WAITING]
        sys.meta_path = before
        _start(via)
        _ADDED[:] = [f for f in sys.meta_path if not any(f is b for b in before)]
    finally:
        _LOCK.release()


def _forget_report() -> None:
    # Off here, but this pid's previous program (before an exec: Ray's setup_worker.py, the
    # launcher) may have written a report that would now describe the wrong process.
    # The name is npu_compat._reportfile's, <host>-<pid>.json.
    directory = os.environ.get(_REPORT_DIR)
    if directory:
        try:
            os.remove(os.path.join(directory, f"{os.uname().nodename}-{os.getpid()}.json"))
        except OSError:
            pass


def _import_autostart() -> "ModuleType":
    # The package next to this file: its absolute directory goes first for the one
    # import, so a relative sys.path entry or the current directory is never searched.
    if "npu_compat" not in sys.modules:
        sys.path.insert(0, _ROOT)
        try:
            import npu_compat
        finally:
            if sys.path and sys.path[0] == _ROOT:
                del sys.path[0]
    import npu_compat._autostart

    return npu_compat._autostart


def _chain(path: str) -> None:
    _OURS.append(path)
    # Most interpreters have no other sitecustomize: say so from the path finders' listings (or a
    # stat per name) before normalising sys.path and creating finders for the search below.
    here = os.path.dirname(path)
    start = sys.path.index(here) + 1 if here in sys.path else 0
    if not _may_hold_sitecustomize(sys.path[start:]):
        return
    ours = [_norm(os.path.abspath(p)) for p in _OURS]
    mine = _norm(os.path.dirname(os.path.abspath(path)))
    entries = [(e, _norm(e)) for e in sys.path if isinstance(e, str) and os.path.isabs(e)]
    dirs = [n for _, n in entries]
    rest = entries[dirs.index(mine) + 1 :] if mine in dirs else entries
    machinery: Any = sys.modules.get("_frozen_importlib_external")  # importlib without importing it
    loading: Any = sys.modules.get("_frozen_importlib")
    if machinery is None or loading is None:  # not CPython
        import importlib.machinery
        import importlib.util

        machinery, loading = importlib.machinery, importlib.util
    while True:
        rest = [(e, n) for e, n in rest if n != mine]
        if not rest:
            return
        spec = machinery.PathFinder.find_spec("sitecustomize", [e for e, _ in rest])
        if spec is None or spec.loader is None or not spec.origin:
            return
        if _norm(spec.origin) not in ours:
            break
        # a file of ours that already ran here (its directory is not where sys.path says): skip past it
        mine = _norm(os.path.dirname(spec.origin))
        rest = rest[[n for _, n in rest].index(mine) + 1 :] if mine in [n for _, n in rest] else []
    module = loading.module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # what `import sitecustomize` answers from now on
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("sitecustomize", None)  # as if theirs had failed on its own; site reports it
        raise


def _may_hold_sitecustomize(entries: "list[Any]") -> bool:
    # False only when no absolute directory among ``entries`` holds a file (or package) named
    # sitecustomize that the path finders could load; anything unusual answers True, and then
    # _chain searches properly.
    machinery: Any = sys.modules.get("_frozen_importlib_external")
    relax_case = getattr(machinery, "_relax_case", None)
    if relax_case is None or relax_case() or len(sys.path_hooks) != 2:
        return True  # not CPython, PYTHONCASEOK, or path hooks of someone's own
    suffixes = ("", *machinery.SOURCE_SUFFIXES, *machinery.BYTECODE_SUFFIXES, *machinery.EXTENSION_SUFFIXES)
    names = ["sitecustomize" + suffix for suffix in suffixes]
    cache = sys.path_importer_cache
    for entry in entries:
        if not isinstance(entry, str) or not os.path.isabs(entry):
            continue
        finder = cache.get(entry, _NONE)
        if finder is None:
            continue  # nothing there (the path finder skips it too)
        try:
            stat = os.stat(entry)
        except OSError:
            continue
        if finder is not _NONE:
            listing = getattr(finder, "_path_cache", None)
            if type(listing) is not set or getattr(finder, "_path_mtime", None) != stat.st_mtime:
                return True  # not a file finder with a current listing
            for name in names:
                if name in listing:
                    return True
        elif stat.st_mode & 0o170000 != 0o040000:
            return True  # a zip file, say
        else:
            for name in names:
                if os.access(f"{entry}{os.sep}{name}", os.F_OK):
                    return True
    return False


def _norm(path: str) -> str:
    return os.path.normcase(os.path.normpath(path))


if __name__ == "sitecustomize":
    # Loaded as a sitecustomize: share the state of the .pth's module if it ran, else be it.
    _shared = sys.modules.setdefault("_npu_compat_precheck", sys.modules[__name__])
    _shared.from_sitecustomize(__file__, "launcher" if _ROOT != _HERE else "sitecustomize")
