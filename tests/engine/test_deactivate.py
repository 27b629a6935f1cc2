"""``deactivate()`` gives the process back as ``activate()`` found it, however often the two alternate.

The same attributes (by identity), environment variables, threads, ``sys.meta_path`` and
``sys.path``; nothing of npu-compat's own bookkeeping grows from one cycle to the next.  Modules
imported meanwhile may stay loaded.  The environment variable is set by a real wrapper of the
catalogue (``VLLM_ASCEND_ENABLE_NZ``, which the rollout's engine must see as ``0``), here on a
stand-in class of the same shape.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import last_json, run_py

NPU = {"NPU_COMPAT_DEVICE": "npu"}

ROLLOUT = """
class vLLMRolloutModel:
    def __init__(self, config=None):
        import os
        self.nz = os.environ.get("VLLM_ASCEND_ENABLE_NZ")
"""

CYCLES = """
import gc, json, os, sys, threading
import npu_compat
from npu_compat import PatchSpec
from synthspecs import SPECS
import synthpkg.target as t, synthpkg.user as u, rollout

NZ = PatchSpec("synth.nz", "rollout:vLLMRolloutModel.__init__",
               wrapper="npu_compat.patches.trinity_vllm:weights_not_nz",
               distribution="synthpkg", versions=">=1", why="test")

def snapshot():
    return {
        "attrs": [id(x) for x in (t.init_process_group, t.device_name, u.init_process_group, t.LIMIT,
                                 t.Allocator.__dict__["bundles"], t.Allocator.__dict__["resource"],
                                 rollout.vLLMRolloutModel.__dict__["__init__"])],
        "environ": dict(os.environ),
        "threads": sorted(th.name for th in threading.enumerate()),
        "meta_path": [id(f) for f in sys.meta_path],
        "path": list(sys.path),
    }

from npu_compat import _activation, _state
before = snapshot()
cycles = []
for i in range(6):
    npu_compat.activate(specs=[*SPECS, NZ])
    seen = {"nz": rollout.vLLMRolloutModel().nz, "name": t.device_name(),
            "threads": sorted(th.name for th in threading.enumerate()),
            "statuses": sorted({r["status"] for r in npu_compat.report()})}
    npu_compat.deactivate()
    gc.collect()
    after = snapshot()
    cycles.append({
        "seen": seen,
        "same": {k: after[k] == before[k] for k in before},
        "environ_diff": sorted(set(after["environ"].items()) ^ set(before["environ"].items())),
        "threads_diff": sorted(set(after["threads"]) ^ set(before["threads"])),
        "originals": len(_activation._state.originals),
        "listeners": len(_state.LISTENERS),
    })
print(json.dumps(cycles))
"""


def test_repeated_cycles_leave_the_process_as_it_was(synth: Path, tmp_path: Path) -> None:
    (synth / "rollout.py").write_text(ROLLOUT)
    reports = tmp_path / "reports"
    cycles = last_json(
        run_py(
            CYCLES, env={**NPU, "NPU_COMPAT_REPORT_DIR": str(reports)}, pythonpath=[str(synth)], timeout=120
        )
    )
    assert isinstance(cycles, list) and len(cycles) == 6
    for cycle in cycles:
        # while active: the wrapper set the variable, the report's watcher runs
        assert cycle["seen"]["nz"] == "0" and cycle["seen"]["name"] == "npu"
        assert "npu-compat-report" in cycle["seen"]["threads"]
        assert cycle["seen"]["statuses"] == ["applied"]
        # after deactivate(): nothing left
        assert cycle["environ_diff"] == [], cycle["environ_diff"]
        assert cycle["threads_diff"] == [], cycle["threads_diff"]
        assert all(cycle["same"].values()), cycle["same"]
        assert cycle["originals"] == 0 and cycle["listeners"] == 0, cycle
    # the report says what the process is now: not active
    (report,) = reports.glob("*.json")
    assert '"source": "not activated"' in report.read_text()


def test_threads_that_activate_and_deactivate_at_once_with_a_report_file(tmp_path: Path) -> None:
    # the report file's watcher is started and stopped by whichever thread activates or deactivates
    out = last_json(
        run_py(
            """
            import json, sys, threading
            import npu_compat
            errors = []
            def cycle():
                try:
                    for _ in range(150):
                        npu_compat.deactivate()
                        npu_compat.activate()
                except BaseException as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
            threads = [threading.Thread(target=cycle) for _ in range(4)]
            [t.start() for t in threads]; [t.join(60) for t in threads]
            during = sorted(t.name for t in threading.enumerate())
            report = npu_compat._reportfile.path()
            active = json.load(open(report))["decision"]["source"]
            npu_compat.deactivate()
            print(json.dumps({"errors": errors, "during": during, "active": active,
                              "after": sorted(t.name for t in threading.enumerate()),
                              "last": json.load(open(report))["decision"]["source"]}))
            """,
            env={**NPU, "NPU_COMPAT_REPORT_DIR": str(tmp_path / "reports")},
            timeout=120,
        )
    )
    assert out["errors"] == []
    # each thread's last call was activate(): active, so reported and watched
    assert out["during"] == ["MainThread", "npu-compat-report"]
    assert out["active"] == "NPU_COMPAT_DEVICE=npu"
    assert out["after"] == ["MainThread"] and out["last"] == "not activated"
