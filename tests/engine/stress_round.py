"""One round of the engine's stress harness, in a fresh interpreter (``tests/engine/stress.py`` runs it).

``python tests/engine/stress_round.py CONFIG_JSON`` activates npu-compat (the specs named by the
config, or the built-in catalogue), then 8 threads import the config's modules, each in its own
random order drawn from the round's seed.  Meanwhile, as the round's mode says:

* ``cycle``: another thread deactivates and activates again, over and over;
* ``sequential``: one thread instead of 8 (what the other modes are compared with);
* ``cycle1``: one importing thread, and the cycling thread;
* ``fork``: the modules are imported first; then one thread activates and deactivates in a loop
  while another forks five times at random moments.  Each child, under a deadline, checks the
  activation it inherited, deactivates to exactly the process as it was before any activation,
  activates and deactivates again, and reports through a pipe.  (Not while imports run: a child
  forked while another thread is inside an import waits for good on that module's import lock the
  first time it imports it, with or without npu-compat.)

Then the round checks what a user would rely on, and prints one JSON line: no thread hung, no import
failed, every imported target applied (or as a sequential import leaves it), each patch one layer
deep, every declared copy repointed, and after ``deactivate()`` every patched attribute, environment
variable, thread, ``sys.meta_path`` and ``sys.path`` as before.  A hung thread ends the round with
``os._exit`` after the deadline: the driver's timeout is a second line of defence.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

THREADS = 8


def patched_places(npu_compat: Any) -> dict[str, tuple[object, str, object]]:
    """Every applied patch's target and declared copies: ``place -> (owner, name, original)``."""
    from npu_compat._activation import _state

    places: dict[str, tuple[object, str, object]] = {}
    firsts: dict[tuple[int, str], object] = {}  # two patches of one attribute: the first's original
    with _state.lock:
        for rec in _state.order:
            for change in rec.changes:
                owner = change.owner
                original = firsts.setdefault((id(owner), change.name), change.original)
                label = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
                places[f"{rec.spec.id} {label}.{change.name}"] = (owner, change.name, original)
    return places


def held(owner: object, name: str) -> object:
    """What attribute lookup of ``name`` on ``owner`` finds, as the raw object (a class: along its MRO)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if name in klass.__dict__:
                return klass.__dict__[name]
        return None
    return owner.__dict__.get(name) if hasattr(owner, "__dict__") else getattr(owner, name, None)


def check_active(npu_compat: Any, expect: dict[str, str] | None) -> list[str]:
    """Problems with the activation as it is now (empty: none)."""
    problems = []
    rep = npu_compat.report()
    for row in rep:
        module = row["target"].partition(":")[0]
        loaded = sys.modules.get(module)
        initialised = loaded is not None and not getattr(
            getattr(loaded, "__spec__", None), "_initializing", False
        )
        if initialised and row["status"] == "pending":
            problems.append(f"{row['id']}: {module} is imported but the patch is still pending")
        if expect is not None and initialised and row["status"] != expect.get(row["id"], row["status"]):
            problems.append(
                f"{row['id']}: {row['status']} ({row['reason']}), sequentially {expect[row['id']]}"
            )
    for where, (owner, name, _) in patched_places(npu_compat).items():
        current = held(owner, name)
        if not npu_compat.is_patched(current):
            problems.append(f"{where}: not the replacement")
            continue
        # the layers down to the original: two patches may target one attribute (one wraps the
        # other), but no patch may appear twice
        layers = []
        while npu_compat.is_patched(current):
            layers.append(getattr(current, "_self_npu_compat_patch", None) or id(current))
            current = npu_compat.get_original(current)
        if len(set(layers)) != len(layers):
            problems.append(f"{where}: patched twice ({layers})")
    return problems


#: With the real catalogue, upstream's own imports set variables, start threads and add finders:
#: there only npu-compat's share is compared -- the variables its patches set, its threads, its finders.
OURS_ONLY = {"environ": ("VLLM_ASCEND_ENABLE_NZ", "ASCEND_RT_VISIBLE_DEVICES"), "thread": "npu-compat"}


def snapshot(ours_only: bool = False) -> dict[str, Any]:
    environ, threads = dict(os.environ), sorted(t.name for t in threading.enumerate())
    finders, path = [id(f) for f in sys.meta_path], list(sys.path)
    if ours_only:
        environ = {
            k: v for k, v in environ.items() if k.startswith("NPU_COMPAT") or k in OURS_ONLY["environ"]
        }
        threads = [t for t in threads if t.startswith(OURS_ONLY["thread"])]
        # npu-compat's finders; the simulated host's own (npu_compat.testing: triton-ascend's driver, set when
        # upstream imports triton) belong to the host, like upstream's
        finders = [
            id(f)
            for f in sys.meta_path
            if type(f).__module__.startswith(("npu_compat", "_npu_compat"))
            and not type(f).__module__.startswith("npu_compat.testing")
        ]
        path = []
    return {"environ": environ, "threads": threads, "meta_path": finders, "path": path}


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    out = []
    env = sorted(set(before["environ"].items()) ^ set(after["environ"].items()))
    if env:
        out.append(f"environment changed: {env}")
    for key in ("threads", "meta_path", "path"):
        if before[key] != after[key]:
            out.append(f"{key} changed: {before[key]} -> {after[key]}")
    return out


def import_all(modules: list[str], order: random.Random, errors: list[str]) -> None:
    names = list(modules)
    order.shuffle(names)
    for name in names:
        try:
            __import__(name)
        except Exception as exc:  # noqa: BLE001 - each failure is the round's finding
            errors.append(f"{name}: {type(exc).__name__}: {exc}")


def pristine(npu_compat: Any, specs: Any) -> dict[str, tuple[object, str, object]]:
    """Every target and declared copy of ``specs`` whose module is imported, as it is now (before any
    activation): ``place -> (owner, name, raw object)``."""
    if specs is None:
        from npu_compat._catalog import SPECS as specs
    places: dict[str, tuple[object, str, object]] = {}
    for spec in specs:
        module = sys.modules.get(spec.module)
        if module is None:
            continue
        owner: Any = module
        try:
            for part in spec.attr_path[:-1]:
                owner = getattr(owner, part)
        except AttributeError:
            continue
        name = spec.attr_path[-1]
        places[spec.target] = (owner, name, held(owner, name))
        for copy_module, copy_name in spec.copy_places():
            if copy_module in sys.modules:
                places[f"{copy_module}:{copy_name}"] = (
                    sys.modules[copy_module],
                    copy_name,
                    held(sys.modules[copy_module], copy_name),
                )
    return places


def changed(places: dict[str, tuple[object, str, object]]) -> list[str]:
    return [where for where, (owner, name, raw) in places.items() if held(owner, name) is not raw]


def forked_child(write_end: int, specs: Any, npu_compat: Any, places: Any, expect: Any) -> None:
    """A child forked while other threads activate and deactivate: nothing of the engine hangs, and
    it can be deactivated to exactly the pristine process, and activated again."""
    problems: list[str] = []
    threading.Thread(target=lambda: (time.sleep(20), os._exit(3)), daemon=True).start()  # a watchdog
    try:
        if npu_compat._activation._state.active:
            problems += check_active(npu_compat, expect)
        npu_compat.deactivate()
        problems += [f"not restored after the fork: {w}" for w in changed(places)]
        npu_compat.activate(specs=specs)
        problems += check_active(npu_compat, expect)
        npu_compat.deactivate()
        problems += [f"not restored in the child: {w}" for w in changed(places)]
    except BaseException as exc:  # noqa: BLE001
        import traceback

        problems.append(f"child: {type(exc).__name__}: {exc}: {traceback.format_exc()[-1500:]}")
    os.write(write_end, json.dumps(problems).encode())
    os._exit(0)


def reap(pid: int, deadline: float) -> bool:
    """Wait up to ``deadline`` seconds for child ``pid``; True if it hung (it is then killed)."""
    until = time.time() + deadline
    while time.time() < until and os.waitpid(pid, os.WNOHANG) == (0, 0):
        time.sleep(0.02)
    try:
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return True
    except ChildProcessError:
        pass
    return False


def fork_once(specs: Any, npu_compat: Any, places: Any, expect: Any, deadline: float) -> dict[str, Any]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        forked_child(write_end, specs, npu_compat, places, expect)
    os.close(write_end)
    hung = reap(pid, deadline)
    data = os.read(read_end, 1 << 20)
    os.close(read_end)
    return {"hung": hung, "problems": json.loads(data) if data else ["the child wrote nothing"]}


def main() -> None:
    config = json.loads(sys.argv[1])
    seed, mode, deadline = config["seed"], config["mode"], config.get("deadline", 60)
    rnd = random.Random(seed)
    for path in config.get("path", []):
        sys.path.insert(0, path)
    for name in config.get("first", []):
        __import__(name)  # imported before anything else, as every program does (torch)
    import warnings

    import npu_compat

    caught: list[str] = []
    warnings.simplefilter("always")
    # npu-compat's own warnings (upstream's deprecation notices are not the round's concern)
    warnings.showwarning = lambda message, category, *args, **kwargs: (
        caught.append(str(message)) if category.__name__ == "NpuCompatWarning" else None
    )
    specs = None
    if config.get("specs"):
        module, _, attr = config["specs"].partition(":")
        specs = getattr(__import__(module), attr)
    modules: list[str] = config["modules"]
    expect = config.get("expect")
    errors: list[str] = []
    done: list[int] = []
    places: dict[str, tuple[object, str, object]] = {}
    if mode == "fork":  # everything imported first: the forks fall at random points of activation
        import_all(modules, rnd, errors)
        places = pristine(npu_compat, specs)
    ours_only = bool(config.get("ours_only"))
    before = snapshot(ours_only)
    npu_compat.activate(specs=specs)
    count = 1 if mode in ("sequential", "cycle1") else (0 if mode == "fork" else THREADS)
    cycling = mode in ("cycle", "cycle1", "fork")
    start = threading.Barrier(count + cycling + (mode == "fork"))

    def importer(i: int) -> None:
        order = random.Random(rnd.random() + i)
        start.wait()
        import_all(modules, order, errors)
        done.append(i)

    stop = threading.Event()
    side: dict[str, Any] = {"cycles": 0, "forks": []}

    def cycler() -> None:
        start.wait()
        while not stop.is_set():
            npu_compat.deactivate()
            time.sleep(rnd.random() * 0.002)
            npu_compat.activate(specs=specs)
            side["cycles"] += 1
            time.sleep(rnd.random() * 0.004)

    def forker() -> None:
        start.wait()
        for _ in range(config.get("forks", 5)):
            time.sleep(rnd.random() * 0.05)
            side["forks"].append(fork_once(specs, npu_compat, places, expect, deadline / 4))
        stop.set()

    threads = [threading.Thread(target=importer, args=(i,), daemon=True) for i in range(count)]
    if cycling:
        threads.append(threading.Thread(target=cycler, daemon=True))
    if mode == "fork":
        threads.append(threading.Thread(target=forker, daemon=True))
    for thread in threads:
        thread.start()
    until = time.time() + deadline
    for thread in threads[:count] if count else threads[-1:]:
        thread.join(max(0.0, until - time.time()))
    stop.set()
    for thread in threads[count:]:
        thread.join(max(0.0, until - time.time()))
    hung = [t.name for t in threads if t.is_alive()]
    result: dict[str, Any] = {"seed": seed, "mode": mode, "hung": hung, "errors": errors}
    if hung:
        print(json.dumps(result), flush=True)
        os._exit(0)
    npu_compat.activate(specs=specs)  # a cycle may have ended inactive
    result["problems"] = check_active(npu_compat, expect)
    result["statuses"] = {r["id"]: r["status"] for r in npu_compat.report()}
    result["cycles"] = side["cycles"]
    result["warnings"] = caught
    result["forks"] = side["forks"]
    places = patched_places(npu_compat)
    npu_compat.deactivate()
    restored = [
        where for where, (owner, name, original) in places.items() if held(owner, name) is not original
    ]
    result["not_restored"] = restored
    result["left_behind"] = differences(before, snapshot(ours_only))
    result["not_restored"] += changed(places)
    print(json.dumps(result), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
