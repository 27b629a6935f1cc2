"""On anything but an Ascend host, activation registers nothing and imports nothing heavy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import last_json, run_py

BOOTSTRAP_MODULES = ["npu_compat", "npu_compat._env"]


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"NPU_COMPAT_DEVICE": "cuda"},
        {"NPU_COMPAT_DEVICE": "cpu"},
        {"TRINITY_DEVICE": "cuda"},
        {"NPU_COMPAT": "0"},
    ],
)
def test_noop_activation_imports_only_the_bootstrap(synth: Path, env: dict[str, str]) -> None:
    proc = run_py(
        """
        import json, sys
        before, finders = set(sys.modules), list(sys.meta_path)
        import npu_compat
        device = npu_compat.activate()
        again = npu_compat.activate()
        new = sorted(set(sys.modules) - before)
        same_finders = sys.meta_path == finders
        import synthpkg.target as t
        print(json.dumps({"device": device, "again": again, "new": new, "same_finders": same_finders,
                          "plain": type(t.init_process_group).__name__,
                          "loader": type(t.__loader__).__name__}))
        """,
        env=env,
        pythonpath=[str(synth)],
    )
    out = last_json(proc)
    expected = {"NPU_COMPAT": "off", "NPU_COMPAT_DEVICE": env.get("NPU_COMPAT_DEVICE")}
    assert (
        out["device"]
        == out["again"]
        == (
            "off"
            if "NPU_COMPAT" in env
            else expected["NPU_COMPAT_DEVICE"] or env.get("TRINITY_DEVICE") or "cpu"
        )
    )
    assert out["new"] == BOOTSTRAP_MODULES
    assert out["same_finders"]
    assert out["plain"] == "function" and out["loader"] == "SourceFileLoader"


def test_objects_imported_before_stay_identical(synth: Path) -> None:
    proc = run_py(
        """
        import json, sys
        import synthpkg.target as t, synthpkg.user as u
        snap = lambda: [t.init_process_group, u.init_process_group, t.device_name, t.LIMIT,
                        t.Allocator.__dict__["bundles"], t.Allocator.__dict__["resource"]]
        before = snap()
        import npu_compat
        npu_compat.activate("cuda")
        print(json.dumps({"identical": all(a is b for a, b in zip(before, snap())),
                          "patched": any(npu_compat.is_patched(x) for x in snap())}))
        """,
        pythonpath=[str(synth)],
    )
    assert last_json(proc) == {"identical": True, "patched": False}


def test_report_on_the_noop_path_says_why() -> None:
    proc = run_py(
        """
        import json, npu_compat
        npu_compat.activate()
        rep = npu_compat.report()
        print(json.dumps({"decision": rep.decision, "statuses": sorted({r["status"] for r in rep}),
                          "reasons": sorted({r["reason"] for r in rep})}))
        """,
        env={"NPU_COMPAT_DEVICE": "cuda"},
    )
    out = last_json(proc)
    assert out["decision"] == {"device": "cuda", "source": "NPU_COMPAT_DEVICE=cuda", "evidence": []}
    assert out["statuses"] in ([], ["skipped"])
    assert all("device decision is 'cuda'" in reason for reason in out["reasons"])
