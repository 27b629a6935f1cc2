"""The per-process report file: one JSON file per activated process in ``NPU_COMPAT_REPORT_DIR``.

Written when the process is activated and rewritten whenever a patch changes
status or the process learns its role (Ray driver, Ray actor, vLLM process) -- or
when the owner of a :data:`SECTIONS` entry calls :func:`write` -- each
time atomically (a temporary file, then ``os.replace``): Ray workers are often
killed with SIGKILL, so nothing waits for ``atexit``.  The file is named
``<host>-<pid>.json``; ``python -m npu_compat doctor --reports DIR`` reads them all.

Nothing from the environment is written but ``NPU_COMPAT*`` and the device
variables of :data:`npu_compat._env.DEVICE_VARS`, and of the command line only the
program's name: no arguments, no secrets.
"""

import _thread
import os
import sys

from . import _env
from ._state import LISTENERS, STATE
from ._version import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

SCHEMA = 1

_attached = False
_activated_by: "str | None" = None
_last: "str | None" = None
_role: "str | None" = None
_actor_class: "str | None" = None
_failed = False
#: When this process reached each mark (``activated``, ``role``): seconds since the epoch.
_times: "dict[str, float]" = {}
_started: "list[float | None]" = []  # the process's start, read once from /proc
#: More sections of the report, by name: each a function called whenever the report is built, whose
#: JSON-ready result is the section (the simulated Ascend adds what it computed: ``simulated``).
SECTIONS: "dict[str, Callable[[], object]]" = {}
#: How often the watcher thread looks for new imports and changed sections, in seconds.
WATCH_EVERY_S = 0.5
_watching: "list[int]" = []  # the PID whose watcher thread runs (a forked child starts its own)
_watcher: "list[object]" = []  # that thread, to be joined when the process stops reporting
_import_log_lock = _thread.allocate_lock()  # forget() never races the watcher's append
#: Held while the watcher runs; released to wake it from its sleep at once (detach(), forget()).
_sleep = _thread.allocate_lock()
#: One writer at a time; a write asked for meanwhile is made by that writer (see write()).
_write_lock = _thread.allocate_lock()
#: attach() and detach() one at a time (activate() and deactivate() may run in several threads at once):
#: held while the watcher is started or stopped, never by the watcher itself.
_attach_lock = _thread.RLock()
_dirty = False


def _forked() -> None:
    """A forked child is a process of its own: its start is read anew, and it was active from it."""
    global _import_log_lock, _write_lock, _sleep, _attach_lock
    # another thread of the parent (its watcher, a writer) may have held these at the fork
    _import_log_lock = _thread.allocate_lock()
    _write_lock = _thread.allocate_lock()
    _attach_lock = _thread.RLock()
    _sleep = _thread.allocate_lock()
    _watcher.clear()
    _started.clear()
    _times.clear()
    if _attached:
        _times["activated"] = _now()
        _start_watcher()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _superseded(token: "int | None", active: bool) -> bool:
    """Whether the activation (``active``) or deactivation that holds ``token`` -- the engine's
    generation when it changed the state -- was followed by another: that one attaches or detaches."""
    if token is None:
        return False
    return STATE.generation != token or STATE.active != active


def attach(token: "int | None" = None) -> None:
    """Write this process's report now and again whenever a patch status changes.  Idempotent.
    ``token``: the engine's generation that ``activate()`` activated (nothing is done if it was
    deactivated since)."""
    global _attached
    with _attach_lock:
        if _superseded(token, True):
            return
        _attached = True
        _times.setdefault("activated", _now())
        if write not in LISTENERS:  # the engine notifies on every change
            LISTENERS.append(write)
        write()
        _start_watcher()


def attach_active() -> None:
    """:func:`attach` for the activation in force, if it is one on ``npu`` (``npu_compat.activate()``)."""
    with _attach_lock:
        decision = STATE.decision
        if STATE.active and decision is not None and decision.is_npu:
            attach(STATE.generation)


def detach(token: "int | None" = None) -> None:
    """Write the report a last time, then stop: the listener removed, the watcher thread ended and
    joined (``deactivate()``; a later ``activate()`` attaches again).  The files stay.  ``token``:
    the engine's generation that ``deactivate()`` left (nothing is done if it was activated since)."""
    global _attached
    with _attach_lock:
        if not _attached or _superseded(token, False):
            return
        _stop_watcher()
        if _write_lock.acquire(timeout=5):  # the last word is this one, whoever else was writing
            try:
                _write_now()
            finally:
                _write_lock.release()
        _attached = False
        if write in LISTENERS:
            LISTENERS.remove(write)


def _start_watcher() -> None:
    if path() is None or (_watching and _watching[0] == os.getpid()):
        return
    _watching[:] = [os.getpid()]
    import threading

    if not _sleep.locked():
        _sleep.acquire()
    thread = threading.Thread(target=_watch, name="npu-compat-report", daemon=True)
    _watcher[:] = [thread]
    thread.start()


def _stop_watcher() -> None:
    """End the watcher thread (and wait for it, unless this is it)."""
    with _import_log_lock:
        _watching.clear()
    if _sleep.locked():
        _sleep.release()  # wakes it now rather than at the end of its sleep
    for thread in list(_watcher):
        if thread is not _current_thread():
            thread.join(5)  # type: ignore[attr-defined]
    _watcher.clear()


def _current_thread() -> object:
    threading = sys.modules.get("threading")
    return threading.current_thread() if threading is not None else None


def imports_path(
    directory: "str | None" = None, pid: "int | None" = None, host: "str | None" = None
) -> "str | None":
    """Where this process's (or ``host``'s ``pid``'s) import log goes: ``<host>-<pid>.imports.jsonl``."""
    directory = directory or os.environ.get(_env.REPORT_DIR)
    if not directory:
        return None
    return os.path.join(directory, f"{host or _host()}-{pid or os.getpid()}.imports.jsonl")


def _watch() -> None:
    """The watcher thread: appends the modules new since its last look to the import log, and
    rewrites the report when a section changed; until the process stops reporting (:func:`forget`)."""
    import json

    pid = os.getpid()
    seen: set[str] = set()
    sections: object = None
    first = True
    while _attached and _watching and _watching[0] == pid:
        new = [name for name in list(sys.modules) if name not in seen]
        if new:
            seen.update(new)
            line: dict[str, object] = {"t": _now(), "new": new}
            if first:
                line["sys_path"] = list(sys.path)
            target = imports_path()
            with _import_log_lock:
                try:
                    if target is not None and _attached and _watching and _watching[0] == pid:
                        with open(target, "a", encoding="utf-8") as out:
                            out.write(json.dumps(line) + "\n")
                        first = False
                except OSError:
                    pass  # the report's own write warns about an unwritable directory
        if SECTIONS:
            now = _sections()
            if now != sections:
                sections = now
                write()
        if _sleep.acquire(timeout=WATCH_EVERY_S):  # released: stop now
            _sleep.release()
            break


def set_activated_by(via: str) -> None:
    """Name how this process was activated (``.pth``, ``launcher``, ``ray-setup-hook``…), before
    activation writes the first report; without it the report says ``activate()``."""
    global _activated_by
    _activated_by = via


def set_role(role: str, *, actor_class: "str | None" = None, first: bool = False, keep: bool = False) -> None:
    """Name what this process is (``ray-driver``, ``vllm (EngineCore_DP0)``…) and rewrite the report.

    With ``first``, an actor class already named is kept (with its role); with ``keep``, any role
    already named is (a vLLM engine process that connects to Ray as a client stays a vLLM process).
    """
    global _role, _actor_class
    if (first and _actor_class is not None) or (keep and _role is not None):
        return
    _role = role
    _actor_class = actor_class or _actor_class
    _times.setdefault("role", _now())
    if _attached:
        write()


def forget() -> None:
    """Remove this process's report and import log and stop writing them (before an exec into
    another program, which starts its own)."""
    global _attached, _last
    target, imports = path(), imports_path()
    with _attach_lock:
        _attached = False
        _stop_watcher()
    _last = None
    if write in LISTENERS:
        LISTENERS.remove(write)
    for name in (target, imports):
        if name is not None:
            try:
                os.remove(name)
            except OSError:
                pass


def path(directory: str | None = None) -> "str | None":
    directory = directory or os.environ.get(_env.REPORT_DIR)
    if not directory:
        return None
    return os.path.join(directory, f"{_host()}-{os.getpid()}.json")


def write() -> None:
    """Rewrite the report if anything in it changed.  Never raises; a failure is warned about once.

    Never waits: while another thread writes, this one leaves its request behind, and that writer
    writes again once it is done -- so the last report written is never older than the last change,
    and no post-import hook waits on a writer (whose report() may be importing)."""
    global _dirty
    _dirty = True
    while _dirty:
        if not _write_lock.acquire(False):
            return  # the writer in progress sees _dirty when it is done
        try:
            while _dirty:
                _dirty = False
                _write_now()
        finally:
            _write_lock.release()


def _write_now() -> None:
    global _last, _failed
    target = path()
    if target is None or not _attached:
        return
    import json

    record = build()
    text = json.dumps(record, indent=1)
    if text == _last:
        return
    record["updated"] = _now()
    # one temporary file per thread: no lock, which could deadlock against the engine's
    temp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{_thread.get_ident()}.tmp")
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(temp, "w", encoding="utf-8") as out:
            json.dump(record, out, indent=1)
            out.write("\n")
        os.replace(temp, target)
    except OSError as exc:
        if not _failed:
            _failed = True
            import warnings

            from ._errors import NpuCompatWarning

            warnings.warn(
                f"npu_compat: cannot write the report file {target}: {exc}; check {_env.REPORT_DIR}",
                NpuCompatWarning,
                stacklevel=2,
            )
        return
    _last = text


def build() -> "dict[str, object]":
    """This process's report as a JSON-ready dict (without the ``updated`` time)."""
    from ._register import report

    rep = report(STATE)
    patches = [{k: r[k] for k in ("id", "target", "status", "reason", "installed", "versions")} for r in rep]
    counts: dict[str, int] = {}
    for p in patches:
        counts[str(p["status"])] = counts.get(str(p["status"]), 0) + 1
    precheck = sys.modules.get("_npu_compat_precheck")
    ray = _ray_identity()
    return {
        "schema": SCHEMA,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "host": _host(),
        "program": program(),
        "role": _role or _guess_role(ray),
        "ray": ray,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "npu_compat": __version__,
        "activated_by": _activated_by or "activate()",
        "times": {"started": process_start(), **_times},
        "triggers": list(getattr(precheck, "TRIGGERS", [])),
        "decision": rep.decision,
        "environment": environment(),
        "counts": counts,
        "patches": patches,
        **_sections(),
    }


def _sections() -> "dict[str, object]":
    found: dict[str, object] = {}
    for name, section in list(SECTIONS.items()):
        try:
            found[name] = section()
        except Exception as exc:  # noqa: BLE001 - a section must never stop the report
            found[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return found


def environment(environ: "Mapping[str, str] | None" = None) -> "dict[str, str]":
    """The ``NPU_COMPAT*`` and device variables of ``environ``: the only values a report may hold."""
    env = os.environ if environ is None else environ
    keep = set(_env.DEVICE_VARS)
    return {k: env[k] for k in sorted(env) if k.startswith(_env.PREFIX) or k in keep}


def program(argv: "list[str] | None" = None) -> str:
    """The program this process runs, by name only: ``python -m pytest``, ``ray``, ``python train.py``."""
    args: list[str] = list(getattr(sys, "orig_argv", sys.argv) if argv is None else argv)
    if not args:
        return "?"
    exe = os.path.basename(args[0])
    rest = args[1:]
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
        # interpreter options (-u, -X dev, -W error …) say nothing about the program
        rest = rest[2:] if rest[0] in ("-X", "-W", "--check-hash-based-pycs") else rest[1:]
    if not rest:
        return exe
    if rest[0] == "-m" and len(rest) > 1:
        return f"{exe} -m {rest[1]}"
    if rest[0] == "-c":
        return f"{exe} -c" + (" (multiprocessing)" if "--multiprocessing-fork" in rest else "")
    return f"{exe} {os.path.basename(rest[0])}"


def _guess_role(ray: "dict[str, object] | None") -> str:
    if ray is not None:
        if ray.get("mode") == "worker":
            return "ray-actor" if ray.get("actor_id") else "ray-worker"
        return "ray-driver"
    args = getattr(sys, "orig_argv", sys.argv)
    if any(os.path.basename(a) == "default_worker.py" for a in args[:3]):
        return "ray-worker"
    if "--multiprocessing-fork" in args:
        return "multiprocessing-child"
    mp = sys.modules.get("multiprocessing")
    if mp is not None:
        name = mp.current_process().name
        if name != "MainProcess":
            return f"multiprocessing-child ({name})"
    return "main"


def _ray_identity() -> "dict[str, object] | None":
    """Mode, job, node, actor id and name of this Ray process, if Ray is connected here (the node tells
    apart the raylets of one host: a simulated cluster's nodes, or Ray's ``--num-nodes`` on one machine)."""
    worker_mod = sys.modules.get("ray._private.worker")
    if worker_mod is None:
        return None
    try:
        worker = worker_mod.global_worker
        if not worker.connected:
            return None
        info: dict[str, object] = {
            "mode": "worker" if worker.mode == worker_mod.WORKER_MODE else "driver",
            "job_id": worker.current_job_id.hex(),
            "node_id": worker.current_node_id.hex(),
        }
        if worker.mode == worker_mod.WORKER_MODE:
            actor_id = worker.actor_id
            if not actor_id.is_nil():
                info["actor_id"] = actor_id.hex()
                info["actor_name"] = worker.actor_name or None
                info["actor_class"] = _actor_class
        return info
    except Exception:  # noqa: BLE001 - Ray internals: describe what can be read, never fail
        return None


def process_start() -> "float | None":
    """When this process started, in seconds since the epoch (Linux: ``/proc``), else None."""
    if not _started:
        _started.append(_read_process_start())
    return _started[0]


def _read_process_start() -> "float | None":
    import time

    try:
        with open("/proc/self/stat", "rb") as stat:
            # after the command's ")" fields run from the 3rd; the 22nd: the start, in clock ticks since boot
            ticks = int(stat.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as uptime:
            since_boot, now = float(uptime.read().split()[0]), time.time()
    except (OSError, ValueError, IndexError):
        return None
    # /proc/stat's btime is whole seconds; uptime and the clock, read together, place the start to 10 ms
    return round(now - (since_boot - ticks / os.sysconf("SC_CLK_TCK")), 2)


def _host() -> str:
    return os.uname().nodename if hasattr(os, "uname") else "host"


def _now() -> float:
    import time

    return round(time.time(), 3)
