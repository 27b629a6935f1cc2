"""The real catalogue on the real stack: CUDA leaves every upstream object identical; deactivate() restores them."""

from __future__ import annotations

from typing import Any

import pytest

from npu_compat.testing import simulation_env
from tests.conftest import SIM_PATH, last_json, run_py

#: exercises verl: stack-b (stack-a with another verl) runs it (noxfile)
pytestmark = pytest.mark.uses_verl

pytest.importorskip("trinity", reason="needs trinity-rft (installed by the upstream stack sessions)")

SNAPSHOT = """
import importlib, json, sys
from npu_compat._catalog import SPECS

def places():
    out = []
    for spec in SPECS:
        out.append((spec.module, spec.attr_path))
        out.extend((module, (name,)) for module, name in spec.copy_places())
    return out

def load_targets():
    loaded = []
    for module, _ in places():
        try:
            importlib.import_module(module)
            loaded.append(module)
        except Exception:
            pass  # not part of this stack (e.g. the other trinity release's modules)
    return loaded

def snapshot():
    snap = {}
    for module, path in places():
        obj = sys.modules.get(module)
        if obj is None:
            continue
        owner = obj
        try:
            for part in path[:-1]:
                owner = getattr(owner, part)
            raw = owner.__dict__.get(path[-1], getattr(owner, path[-1], None)) if isinstance(owner, type) \\
                else getattr(owner, path[-1], None)
        except AttributeError:
            continue
        snap[module + ":" + ".".join(path)] = raw
    return snap
"""


def _run(body: str, **env: str) -> Any:
    sim = {k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}
    sim.update(env)
    return last_json(run_py(SNAPSHOT + body, env=sim, pythonpath=SIM_PATH, timeout=600))


def test_cuda_decision_leaves_every_target_identical() -> None:
    out = _run(
        """
loaded = load_targets()
before = snapshot()
import npu_compat
device = npu_compat.activate()
after = snapshot()
print(json.dumps({"device": device, "loaded": len(loaded), "places": len(before),
                  "changed": sorted(k for k in before if after.get(k) is not before[k])}))
""",
        NPU_COMPAT_DEVICE="cuda",
    )
    assert out["device"] == "cuda"
    assert out["places"] >= 15, out  # the stack really holds the targets
    assert out["changed"] == []


def test_npu_activation_patches_and_deactivate_restores_identity() -> None:
    out = _run(
        """
loaded = load_targets()
before = snapshot()
import npu_compat
npu_compat.activate()
during = snapshot()
report = {r["id"]: r["status"] for r in npu_compat.report()}
npu_compat.deactivate()
after = snapshot()
print(json.dumps({"changed": sorted(k for k in before if during.get(k) is not before[k]),
                  "not_restored": sorted(k for k in before if after.get(k) is not before[k]),
                  "failed": sorted(i for i, s in report.items() if s == "failed"),
                  "applied": sorted(i for i, s in report.items() if s == "applied")}))
"""
    )
    assert out["failed"] == []
    assert len(out["applied"]) >= 8, out
    assert len(out["changed"]) >= 8, out
    assert out["not_restored"] == []
