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
a setting that needs the start leads on to ``npu_compat._autostart``, which imports the
package and makes the real decision (``npu_compat._env.decide``) from the same names and
evidence, defined here once.  Even then that waits, when nothing could tell the difference,
for the first import of a package some patch targets (or of ``npu_compat`` itself): a
process that never imports one has nothing to patch, and one that does pays the start
inside an import that takes seconds.  Everything is asked through public APIs
(``os.environ``, ``os.listdir``, ``os.access``, and ``importlib.machinery``'s path finder,
taken from the import system's frozen modules so that importing ``importlib`` is not
paid).  Nothing is ever imported from the current directory or a relative ``sys.path``
entry: the package is imported from this file's own location.
"""

import os
import sys

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import Any

# -- the device decision's evidence, shared with npu_compat._env ------------------------------------
# npu_compat._env documents every variable and makes the full decision (with its errors) from these
# names and functions; they live here because this module must not import anything.
ENABLE = "NPU_COMPAT"
AUTO = "NPU_COMPAT_AUTO"
DEVICE = "NPU_COMPAT_DEVICE"
TRINITY_DEVICE = "TRINITY_DEVICE"
REPORT_DIR = "NPU_COMPAT_REPORT_DIR"
SIMULATE = "NPU_COMPAT_SIMULATE"
DISABLE = "NPU_COMPAT_DISABLE"
ASCEND_VISIBLE_DEVICES = "ASCEND_RT_VISIBLE_DEVICES"
ASCEND_TOOLKIT_VARS = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
FALSE_VALUES = frozenset({"0", "false", "no", "off"})
TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
#: Where the Ascend driver creates its device nodes (a module attribute: tests point it elsewhere).
DEV_DIR = "/dev"
#: The top-level packages of every module the built-in catalogue patches (``npu_compat._catalog``;
#: tests/engine keeps them equal): the first import of one finishes a waiting start.
PACKAGES = frozenset({"ray", "torch", "trinity", "verl", "vllm", "vllm_ascend"})

#: Variables whose mere presence means npu-compat has something to do here.
_HINTS = (SIMULATE, REPORT_DIR, ASCEND_VISIBLE_DEVICES, *ASCEND_TOOLKIT_VARS)
_NOT_NPU = ("cpu", "cuda")
#: Set, any of these needs the whole start at once: the simulation's path entry, the
#: per-process report file, the warning for an unknown id in the disable list.
_NOW = (SIMULATE, REPORT_DIR, DISABLE)

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
_WANTED: "list[bool]" = []  # what wanted() said of this interpreter, once asked


def is_false(value: "str | None") -> bool:
    return value is not None and value.strip().lower() in FALSE_VALUES


def override(env: "Mapping[str, str]") -> "tuple[str, str] | None":
    """The device override in force, as ``(name, raw value)``: the first of ``NPU_COMPAT_DEVICE`` and
    ``TRINITY_DEVICE`` set to anything but ``auto``; None when neither is."""
    for name in (DEVICE, TRINITY_DEVICE):
        raw = env.get(name)
        if raw and raw.strip().lower() != "auto":
            return name, raw
    return None


def evidence(env: "Mapping[str, str]") -> "tuple[str, ...]":
    """Every sign of an Ascend host, in words; empty on CUDA and plain CPU hosts."""
    found: list[str] = []
    try:
        listing = os.listdir(DEV_DIR)
    except OSError:
        listing = []
    nodes = []
    if "\0davinci" in "\0" + "\0".join(listing):  # one search of the listing (names hold no NUL)
        nodes = sorted(n for n in listing if n.startswith("davinci"))
    if nodes:
        found.append(f"{DEV_DIR}/{nodes[0]}" + (f" (+{len(nodes) - 1} more)" if len(nodes) > 1 else ""))
    visible = env.get(ASCEND_VISIBLE_DEVICES)
    if visible:
        found.append(f"{ASCEND_VISIBLE_DEVICES}={visible}")
    for name in ASCEND_TOOLKIT_VARS:
        if env.get(name):
            found.append(f"{name} is set (CANN toolkit environment)")
            break
    if torch_npu_findable():
        found.append("torch_npu is importable")
    return tuple(found)


def torch_npu_findable() -> bool:
    """Whether ``import torch_npu`` would find a package on ``sys.path``, asked without importing it
    (its import is heavy and, without the CANN toolkit, fails)."""
    if "torch_npu" in sys.modules:
        return True
    for entry in sys.path:
        if isinstance(entry, str) and os.access(f"{entry or '.'}/torch_npu/__init__.py", os.F_OK):
            return True
    return False


def wanted(environ: "Mapping[str, str] | None" = None) -> bool:
    """False when npu-compat can only be a no-op in this process, decided without imports: turned
    off, or a ``cpu``/``cuda`` override, or no Ascend evidence and no setting of ours that needs the
    start.  Never False where ``npu_compat._env.decide`` says ``npu`` (tests/seams keeps them so).
    For this interpreter's own environment it is asked once (the .pth and a sitecustomize both ask)."""
    if environ is None:
        if not _WANTED:
            _WANTED.append(wanted(os.environ))
        return _WANTED[0]
    for name in (ENABLE, AUTO):
        if is_false(environ.get(name)):
            return False
    found = override(environ)
    if found is not None:
        return found[1].strip().lower() not in _NOT_NPU  # "npu", or a bad value that _env will name
    for name in _HINTS:
        if environ.get(name):
            return True
    return bool(evidence(environ))


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
        _WAITING.install()
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
    found = override(environ)
    if found is not None and found[1].strip().lower() != "npu":
        return False
    modules = sys.modules
    return not any(name in modules for name in (*PACKAGES, "npu_compat"))


class Waiting:
    """A meta-path finder that waits for the first import of a package in ``packages``.

    That import takes it off ``sys.meta_path`` and calls ``then()``; the finders ``then``
    installed answer for that very import, so their post-import hooks see it.  Two wait with one:
    this pre-check's start (``lock``: its lock, held across ``then``, so a second importer waits
    until the start has ended, and ``then`` runs once), and the engine's patch list
    (``npu_compat._activation``; no lock: its ``then`` is thread-safe and runs for every importer
    that meets the finder, the first reading the list and the others passing on once it is read).
    """

    def __init__(self, packages: "frozenset[str]", then: "Callable[[], object]", lock: "Any" = None) -> None:
        self.packages = packages
        self.then = then
        self.lock = lock
        self.pending = False
        self.added: "list[Any]" = []  # the finders that ``then`` installed

    def install(self) -> None:
        self.pending = True
        if self not in sys.meta_path:
            # a new list: the interpreter keeps the list it started with until the end of finalisation
            sys.meta_path = [self, *sys.meta_path]

    def uninstall(self) -> None:
        self.pending = False
        if self in sys.meta_path:
            # a new list, never a removal: another thread's import may be iterating the old one
            sys.meta_path = [f for f in sys.meta_path if f is not self]

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        if fullname.partition(".")[0] not in self.packages:
            return None
        self.finish()
        for finder in self.added:
            if finder in sys.meta_path:
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
        return None

    def finish(self, wait: bool = True) -> None:
        """Stop waiting and call ``then()`` (with a lock: once, and only if still waiting)."""
        lock = self.lock
        if lock is None:
            self.uninstall()
            self.then()
            return
        if not lock.acquire(wait):
            return
        try:
            if not self.pending:
                return
            self.uninstall()
            before = list(sys.meta_path)
            self.then()
            self.added[:] = [f for f in sys.meta_path if not any(f is b for b in before)]
        finally:
            lock.release()


def _start_pending() -> None:
    global PENDING
    via, PENDING = PENDING, None
    if via is not None:
        _start(via)


_LOCK = __import__("_thread").RLock()  # _thread is loaded before site runs
#: The pre-check's waiting start.
_WAITING = Waiting(PACKAGES, _start_pending, _LOCK)


def complete(wait: bool = True) -> None:
    """Finish a start that waits (:data:`PENDING`); no-op otherwise.

    Called by the waiting finder and by ``import npu_compat`` (so ``report()``, ``doctor`` and
    an explicit ``activate()`` see the start that auto-activation made).  Thread-safe: a second
    importer of a target package waits until the first has finished it.  ``import npu_compat``
    does not wait (``wait=False``): a start under way in another thread is importing npu_compat
    itself, and so waits for this very import to end.
    """
    _WAITING.finish(wait)


def _forget_report() -> None:
    # Off here, but this pid's previous program (before an exec: Ray's setup_worker.py, the
    # launcher) may have written a report that would now describe the wrong process.
    # The name is npu_compat._reportfile's, <host>-<pid>.json.
    directory = os.environ.get(REPORT_DIR)
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
    # Most interpreters have no other sitecustomize: say so with a few access() calls on the entries
    # after this file's directory before normalising sys.path and creating path finders.
    here = os.path.dirname(path)
    start = sys.path.index(here) + 1 if here in sys.path else 0
    machinery, loading = _machinery()
    later = [e for e in sys.path[start:] if isinstance(e, str) and os.path.isabs(e) and e != here]
    if not _may_hold_sitecustomize(later, machinery):
        return
    ours = [_norm(os.path.abspath(p)) for p in _OURS]
    mine = _norm(os.path.dirname(os.path.abspath(path)))
    entries = [(e, _norm(e)) for e in sys.path if isinstance(e, str) and os.path.isabs(e)]
    dirs = [n for _, n in entries]
    rest = entries[dirs.index(mine) + 1 :] if mine in dirs else entries
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


def _machinery() -> "tuple[Any, Any]":
    # importlib.machinery's PathFinder and suffixes, and importlib.util's module_from_spec: the same
    # objects, taken from the import system's own frozen modules, which are loaded in every CPython
    # before site runs (importing the importlib package would cost ~0.6 ms, with warnings).
    machinery = sys.modules.get("_frozen_importlib_external")
    loading = sys.modules.get("_frozen_importlib")
    if machinery is None or loading is None:  # not CPython
        import importlib.machinery
        import importlib.util

        return importlib.machinery, importlib.util
    return machinery, loading


def _may_hold_sitecustomize(entries: "list[str]", machinery: "Any") -> bool:
    # False only when no entry holds a file or package named sitecustomize that the path finders
    # could load (one access() per suffix); an entry that is not a directory (a zip file, say)
    # answers True, and then _chain searches properly.
    suffixes = ("", *machinery.SOURCE_SUFFIXES, *machinery.BYTECODE_SUFFIXES, *machinery.EXTENSION_SUFFIXES)
    for entry in entries:
        for suffix in suffixes:
            if os.access(f"{entry}{os.sep}sitecustomize{suffix}", os.F_OK):
                return True
        if os.path.isfile(entry):
            return True
    return False


def _norm(path: str) -> str:
    return os.path.normcase(os.path.normpath(path))


if __name__ == "sitecustomize":
    # Loaded as a sitecustomize: share the state of the .pth's module if it ran, else be it.
    _shared = sys.modules.setdefault("_npu_compat_precheck", sys.modules[__name__])
    _shared.from_sitecustomize(__file__, "launcher" if _ROOT != _HERE else "sitecustomize")
