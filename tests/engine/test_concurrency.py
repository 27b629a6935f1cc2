"""The engine under threads and forks: imports that wait on each other never hang, no patch is applied
twice, and a forked child never inherits a lock some other thread held.

Each case runs in a fresh interpreter under a timeout.  The waits are made certain, not left to
chance: a package whose ``__init__`` sleeps before it imports its watched submodule, a wrapper module
that imports that package, a thread paused where ``import npu_compat`` finishes a waiting start.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO, clean_env, last_json, run_py

NPU = {"NPU_COMPAT_DEVICE": "npu"}


def write_dist(root: Path, name: str, version: str = "1.0.0") -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def crossing_packages(root: Path) -> Path:
    """Two packages whose post-import hooks cross.

    ``pb``'s ``__init__`` takes a moment, then imports its watched submodule ``pb.sub``; the wrapper
    of ``pa``'s patch lives in a module that imports ``pb``.  A thread importing ``pa`` meanwhile runs
    ``pa``'s hook, which imports the wrapper module and so waits for ``pb`` -- whose own hook (for
    ``pb.sub``) then must not wait for the first.
    """
    (root / "pa").mkdir(parents=True)
    (root / "pa" / "__init__.py").write_text("def f():\n    return 'pa'\n")
    (root / "pb").mkdir()
    (root / "pb" / "__init__.py").write_text("import time\ntime.sleep(0.6)\nimport pb.sub\n")
    (root / "pb" / "sub.py").write_text("def g():\n    return 'pb'\n")
    (root / "wrap_pa.py").write_text(
        "import pb  # the wrapper's module needs the other package\n"
        "def w(wrapped, instance, args, kwargs):\n    return 'patched-' + wrapped(*args, **kwargs)\n"
    )
    (root / "wrap_pb.py").write_text(
        "def w(wrapped, instance, args, kwargs):\n    return 'patched-' + wrapped(*args, **kwargs)\n"
    )
    (root / "crossspecs.py").write_text(
        "from npu_compat import PatchSpec\n"
        "SPECS = [\n"
        "    PatchSpec('x.pa', 'pa:f', wrapper='wrap_pa:w', distribution='pa', versions='>=1', why='test'),\n"
        "    PatchSpec('x.pb', 'pb.sub:g', wrapper='wrap_pb:w', distribution='pb', versions='>=1', why='test'),\n"
        "]\n"
    )
    write_dist(root, "pa")
    write_dist(root, "pb")
    return root


CROSSING = """
import json, os, sys, threading, time
import npu_compat
from crossspecs import SPECS
npu_compat.activate(specs=SPECS)
done = {}
def load(name):
    mod = __import__(name, fromlist=["_"])
    done[name] = True
b = threading.Thread(target=load, args=("pb.sub",), daemon=True)
a = threading.Thread(target=load, args=("pa",), daemon=True)
b.start(); time.sleep(0.2); a.start()   # a's hook runs while b is still inside pb's __init__
a.join(15); b.join(15)
out = {"hung": sorted({"pa", "pb.sub"} - set(done))}
if not out["hung"]:
    import pa, pb.sub
    out.update(pa=pa.f(), pb=pb.sub.g(), status={r["id"]: r["status"] for r in npu_compat.report()})
print(json.dumps(out), flush=True)
os._exit(0)  # a hung thread must not keep the interpreter from exiting
"""


def test_hooks_that_import_each_others_packages_do_not_deadlock(tmp_path: Path) -> None:
    root = crossing_packages(tmp_path / "site")
    out = last_json(run_py(CROSSING, env=NPU, pythonpath=[str(root)], timeout=60))
    assert out == {
        "hung": [],
        "pa": "patched-pa",
        "pb": "patched-pb",
        "status": {"x.pa": "applied", "x.pb": "applied"},
    }


SLOW_PACKAGE = """
import json, os, sys, threading, time

precheck = sys.modules["_npu_compat_precheck"]
waiting = precheck.PENDING is not None
sys.path.append(sys.argv[1])
done = {}
at_complete = threading.Event()

def pause_before_complete(frame, event, arg):
    # in thread b only: npu_compat's own import has seen the start waiting and is about to finish it
    if event == "call" and frame.f_code.co_name == "complete" and "precheck" in frame.f_code.co_filename:
        sys.setprofile(None)
        at_complete.set()
        time.sleep(0.6)   # meanwhile thread a's first target import starts npu-compat

def load_npu_compat():
    sys.setprofile(pause_before_complete)
    import npu_compat
    done["npu_compat"] = True

def load_target():
    at_complete.wait(10)
    import verl
    done["verl"] = True

b = threading.Thread(target=load_npu_compat, daemon=True)
a = threading.Thread(target=load_target, daemon=True)
b.start(); a.start()
a.join(15); b.join(15)
out = {"waiting": waiting, "paused": at_complete.is_set(), "hung": sorted({"npu_compat", "verl"} - set(done))}
if not out["hung"]:
    eng = sys.modules.get("npu_compat._activation")
    out["active"] = bool(eng and eng._state.active)
    out["finders"] = [type(f).__name__ for f in sys.meta_path]
print(json.dumps(out), flush=True)
os._exit(0)
"""


def test_a_waiting_start_and_an_import_of_npu_compat_in_another_thread_do_not_deadlock(
    tmp_path: Path,
) -> None:
    # The pre-check's start (at the first import of a target package) imports npu_compat under the
    # pre-check's lock, while npu_compat's own import finishes a waiting start: two threads, each on
    # one of these paths at once.
    (tmp_path / "verl").mkdir()
    (tmp_path / "verl" / "__init__.py").write_text("")
    script = tmp_path / "slow.py"
    script.write_text(SLOW_PACKAGE)
    env = clean_env({**NPU, "NPU_COMPAT_AUTO": "1"})  # the repository's sitecustomize starts it
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=60,
        cwd=str(REPO),
    )  # fmt: skip
    out = last_json(proc)
    assert out["waiting"] and out["paused"], (
        "the start did not wait for the first target import: nothing to test"
    )
    assert out["hung"] == [], proc.stderr
    assert out["active"] and out["finders"].count("PostImportFinder") == 1 and "Waiting" not in out["finders"]


FORK_WHILE_HELD = """
import json, os, sys, threading, time
import npu_compat
from tests.engine.stress_round import reap
from synthspecs import SPECS
npu_compat.activate(specs=SPECS)
npu_compat.report()                          # the patch list is read: its modules are watched
held = threading.Event()
def hold(lock):
    with lock:
        held.set()
        time.sleep(3)
locks = {"engine": npu_compat._activation._state.lock}
if "npu_compat._reportfile" in sys.modules:
    locks["report"] = sys.modules["npu_compat._reportfile"]._import_log_lock
results = {}
for name, lock in locks.items():
    held.clear()
    threading.Thread(target=hold, args=(lock,), daemon=True).start()
    held.wait()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        # the child: one thread, and none of the parent's locks held
        import synthpkg.target as t
        os.write(w, json.dumps({"name": t.device_name(),
                                "status": {x["id"]: x["status"] for x in npu_compat.report()}}).encode())
        os._exit(0)
    os.close(w)
    alive = reap(pid, 10)
    data = os.read(r, 65536)
    results[name] = {"hung": alive, "child": json.loads(data) if data else None}
print(json.dumps(results), flush=True)
os._exit(0)
"""


def test_a_child_forked_while_another_thread_holds_a_lock_of_the_engine_does_not_hang(
    synth: Path, tmp_path: Path
) -> None:
    out = last_json(
        run_py(FORK_WHILE_HELD, env={**NPU, "NPU_COMPAT_REPORT_DIR": str(tmp_path / "reports")},
               pythonpath=[str(synth)], timeout=90)
    )  # fmt: skip
    assert set(out) == {"engine", "report"}
    for name, result in out.items():
        assert not result["hung"], f"the child hung on the {name} lock the parent's thread held at the fork"
        assert result["child"]["name"] == "npu"
        assert set(result["child"]["status"].values()) == {"applied"}


def test_two_threads_applying_at_once_apply_each_patch_once(synth: Path) -> None:
    # Both threads reach the same pending records at once: the target is imported by one while the
    # other reads the waiting patch list (report()), which patches what is imported.
    code = """
        import json, threading
        import npu_compat
        from synthspecs import SPECS
        rounds = []
        for _ in range(20):
            for name in [m for m in sys.modules if m.startswith("synthpkg")]:
                del sys.modules[name]
            npu_compat.activate(specs=SPECS)
            barrier = threading.Barrier(2)
            def importer():
                barrier.wait()
                import synthpkg.target
            def reporter():
                barrier.wait()
                npu_compat.report()
            threads = [threading.Thread(target=importer), threading.Thread(target=reporter)]
            [t.start() for t in threads]; [t.join(20) for t in threads]
            import synthpkg.target as t
            rounds.append({"layers": not npu_compat.is_patched(t.init_process_group.__wrapped__),
                           "limit": t.LIMIT, "applied": sorted({r["status"] for r in npu_compat.report()})})
            npu_compat.deactivate()
        print(json.dumps(rounds))
        """
    rounds = last_json(run_py("import sys\n" + textwrap.dedent(code), env=NPU, pythonpath=[str(synth)]))
    assert all(r == {"layers": True, "limit": 8, "applied": ["applied"]} for r in rounds), rounds


FOUND_BEFORE = """
import importlib.machinery, json, sys, threading, time
import npu_compat
from synthspecs import SPECS
import synthpkg  # a target package already imported: the patch list is read at activation

found = threading.Event()

class SlowCreate:
    '''PathFinder's spec for synthpkg.target, whose module is created only a moment later.'''
    def find_spec(self, name, path=None, target=None):
        if name != "synthpkg.target":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        real = spec.loader
        class Slow:
            def create_module(self, spec):
                found.set()
                time.sleep(0.5)   # meanwhile the main thread activates
                return None
            def exec_module(self, module):
                real.exec_module(module)
        spec.loader = Slow()
        return spec

sys.meta_path.insert(0, SlowCreate())
loader = threading.Thread(target=lambda: __import__("synthpkg.target"))
loader.start()
found.wait(10)
npu_compat.activate(specs=SPECS)   # the import under way was found before this finder existed
loader.join(10)
import synthpkg.target as t
status = {r["id"]: r["status"] for r in npu_compat.report()}
print(json.dumps({"name": t.device_name(), "init": status["synth.init_pg"], "device": status["synth.device_name"]}))
"""


def test_a_target_whose_import_began_before_activation_is_applied_at_the_next_report(synth: Path) -> None:
    out = last_json(run_py(FOUND_BEFORE, env=NPU, pythonpath=[str(synth)], timeout=60))
    assert out == {"name": "npu", "init": "applied", "device": "applied"}


def test_an_internal_error_part_way_leaves_the_other_records_pending_not_held(synth: Path) -> None:
    # One record's preparation fails in a way npu-compat does not expect (installed_version raises
    # once); the module's other records must be applied at the next report(), not held by a claim.
    code = """
        import json, warnings
        import npu_compat, npu_compat._apply as engine
        from synthspecs import SPECS
        real, calls = engine.installed_version, []
        def once_broken(name):
            calls.append(name)
            if len(calls) == 1:
                raise RuntimeError("unexpected")
            return real(name)
        engine.installed_version = once_broken
        npu_compat.activate(specs=SPECS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import synthpkg.target as t
        statuses = sorted({r["status"] for r in npu_compat.report()})
        print(json.dumps({"statuses": statuses, "name": t.device_name(),
                          "warned": any("internal error" in str(w.message) for w in caught)}))
        """
    out = last_json(run_py(textwrap.dedent(code), env=NPU, pythonpath=[str(synth)]))
    assert out == {"statuses": ["applied"], "name": "npu", "warned": True}
