"""The engine on a synthetic upstream package, each ordering in a fresh interpreter.

The target (``synthpkg.target``) asserts nccl, names ``cuda``, asks for GPU bundles and
is copied by name into ``synthpkg.user`` -- the shapes the real Trinity patches meet.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import last_json, run_py

NPU = {"NPU_COMPAT_DEVICE": "npu"}

PRELUDE = """
import json, sys, warnings
warnings.simplefilter("always")
import npu_compat
from synthspecs import SPECS

def statuses():
    return {r["id"]: r["status"] for r in npu_compat.report()}
"""


def child(
    synth: Path, *parts: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    code = "\n".join(textwrap.dedent(part) for part in (PRELUDE, *parts))
    return run_py(code, env={**NPU, **(env or {})}, pythonpath=[str(synth)], check=check)


def test_activate_before_import_patches_on_import(synth: Path) -> None:
    proc = child(
        synth,
        """
        assert npu_compat.activate(specs=SPECS) == "npu"
        before = statuses()
        import synthpkg.target as t, synthpkg.user as u
        a = t.Allocator()
        print(json.dumps({
            "before": before, "after": statuses(),
            "init": t.init_process_group("hccl"), "user": u.start(), "name": t.device_name(),
            "bundles": a.bundles(2), "resource": t.Allocator.resource(), "kind": t.Child.kind(),
            "limit": t.LIMIT, "patched": npu_compat.is_patched(t.init_process_group),
            "orig_is_plain": not npu_compat.is_patched(npu_compat.get_original(t.init_process_group)),
            "loader_real": type(t.__loader__).__name__, "spec_loader_real": t.__spec__.loader is t.__loader__,
        }))
        """,
    )
    out = last_json(proc)
    assert set(out["before"].values()) == {"pending"}
    assert set(out["after"].values()) == {"applied"}
    assert out["init"] == ["patched", "init", "nccl", 1]
    assert out["user"] == ["patched", "init", "nccl", 1]  # the copy bound by `from x import y`
    assert out["name"] == "npu"
    assert out["bundles"] == [{"NPU": 1}, {"NPU": 1}]
    assert out["resource"] == "NPU"
    assert out["kind"] == "patched:Child"  # classmethod still binds to the subclass
    assert out["limit"] == 8
    assert out["patched"] and out["orig_is_plain"]
    assert out["loader_real"] == "SourceFileLoader" and out["spec_loader_real"]


@pytest.mark.parametrize("first", ["npu-compat", "other hook"])
def test_another_post_import_hook_on_a_target_module_runs_beside_the_patches(synth: Path, first: str) -> None:
    """A hook of another kind watching the same module (the simulated host's ``WhenImported``, in front of
    npu-compat's finder or behind it): the import resolves once, both run, and the module keeps its real
    loader.  The two finders once asked each other for the spec until the recursion limit."""
    proc = child(
        synth,
        f"""
        from npu_compat.testing._when_imported import WhenImported
        seen = []
        hook = WhenImported("synthpkg.target", lambda module: seen.append(npu_compat.is_patched(
            module.init_process_group)))
        if {first!r} == "other hook":
            hook.install()
        assert npu_compat.activate(specs=SPECS) == "npu"
        if {first!r} == "npu-compat":
            hook.install()
        import synthpkg.target as t
        print(json.dumps({{
            "seen": seen, "status": statuses()["synth.init_pg"],
            "patched": npu_compat.is_patched(t.init_process_group),
            "loader_real": type(t.__loader__).__name__, "spec_loader_real": t.__spec__.loader is t.__loader__,
        }}))
        """,
    )
    out = last_json(proc)
    assert len(out["seen"]) == 1 and out["status"] == "applied" and out["patched"], out
    assert out["loader_real"] == "SourceFileLoader" and out["spec_loader_real"], out


def test_activate_after_import_patches_at_once_and_repoints_copies(synth: Path) -> None:
    proc = child(
        synth,
        """
        import synthpkg.target as t, synthpkg.user as u
        original = t.init_process_group
        assert u.init_process_group is original
        npu_compat.activate(specs=SPECS)
        print(json.dumps({
            "status": statuses(), "user": u.start(),
            "copy_is_wrapper": u.init_process_group is t.init_process_group,
            "copies": [r["copies_repointed"] for r in npu_compat.report() if r["id"] == "synth.init_pg"][0],
        }))
        """,
    )
    out = last_json(proc)
    assert set(out["status"].values()) == {"applied"}
    assert out["user"] == ["patched", "init", "nccl", 1]
    assert out["copy_is_wrapper"]
    assert out["copies"] == ["synthpkg.user:init_process_group"]


def test_activate_twice_changes_nothing(synth: Path) -> None:
    proc = child(
        synth,
        """
        import synthpkg.target as t
        npu_compat.activate(specs=SPECS)
        first = t.init_process_group
        finders = len(sys.meta_path)
        npu_compat.activate(specs=SPECS)
        npu_compat.activate()
        print(json.dumps({"same": t.init_process_group is first, "finders": len(sys.meta_path) - finders,
                          "layers": type(t.init_process_group.__wrapped__).__name__,
                          "init": t.init_process_group("hccl")}))
        """,
    )
    out = last_json(proc)
    assert out == {"same": True, "finders": 0, "layers": "function", "init": ["patched", "init", "nccl", 1]}


IDENTITY_SNAPSHOT = """
def snapshot():
    import synthpkg.target as t, synthpkg.user as u
    return {
        "t.init": t.init_process_group, "t.name": t.device_name, "u.init": u.init_process_group,
        "bundles": t.Allocator.__dict__["bundles"], "resource": t.Allocator.__dict__["resource"],
        "kind": t.Allocator.__dict__["kind"], "limit": t.LIMIT, "child_has_own": "bundles" in t.Child.__dict__,
    }
"""


def test_deactivate_restores_identity_and_reactivate_works(synth: Path) -> None:
    proc = child(
        synth,
        IDENTITY_SNAPSHOT,
        """
        import synthpkg.target as t, synthpkg.user as u
        before = snapshot()
        finders_before = list(sys.meta_path)
        npu_compat.activate(specs=SPECS)
        during = snapshot()
        npu_compat.deactivate()
        after = snapshot()
        restored = {k: after[k] is before[k] for k in before}
        changed = {k: during[k] is not before[k] for k in before if k != "child_has_own"}
        meta_clean = sys.meta_path == finders_before
        report_after = npu_compat.report()
        npu_compat.activate(specs=SPECS)
        again = {"init": t.init_process_group("hccl"), "user": u.start(), "status": statuses()}
        npu_compat.deactivate()
        final = snapshot()
        print(json.dumps({"restored": restored, "changed": changed, "meta_clean": meta_clean,
                          "again": again, "final": {k: final[k] is before[k] for k in before},
                          "report_after": report_after.decision,
                          "unpatched": t.init_process_group("nccl")}))
        """,
    )
    out = last_json(proc)
    assert all(out["restored"].values()), out["restored"]
    assert all(out["changed"].values()), out["changed"]
    assert out["meta_clean"]
    assert out["again"]["init"] == ["patched", "init", "nccl", 1]
    assert out["again"]["user"] == ["patched", "init", "nccl", 1]
    assert set(out["again"]["status"].values()) == {"applied"}
    assert all(out["final"].values())
    assert out["report_after"]["source"] == "not activated"
    assert out["unpatched"] == ["init", "nccl", 1]


def test_copy_imported_after_patching_is_restored_too(synth: Path) -> None:
    proc = child(
        synth,
        """
        import synthpkg.target as t
        original = t.init_process_group
        npu_compat.activate(specs=SPECS)
        import synthpkg.user as u   # binds the wrapper itself
        held = u.init_process_group is t.init_process_group
        npu_compat.deactivate()
        print(json.dumps({"held_wrapper": held, "restored": u.init_process_group is original}))
        """,
    )
    assert last_json(proc) == {"held_wrapper": True, "restored": True}


def test_undeclared_copy_passes_through_after_deactivate(synth: Path) -> None:
    proc = child(
        synth,
        """
        npu_compat.activate(specs=SPECS)
        from synthpkg.target import init_process_group as mine   # nobody declared this copy
        npu_compat.deactivate()
        try:
            mine("hccl"); hccl = "accepted"
        except AssertionError:
            hccl = "refused"
        print(json.dumps({"nccl": mine("nccl"), "hccl": hccl}))
        """,
    )
    assert last_json(proc) == {"nccl": ["init", "nccl", 1], "hccl": "refused"}


def test_concurrent_imports_apply_each_patch_once(synth: Path) -> None:
    proc = child(
        synth,
        """
        import threading
        npu_compat.activate(specs=SPECS)
        barrier = threading.Barrier(8)
        seen = []
        def worker():
            barrier.wait()
            import synthpkg.user as u
            import synthpkg.target as t
            seen.append((t.init_process_group, u.init_process_group, t.Allocator.__dict__["bundles"]))
        threads = [threading.Thread(target=worker) for _ in range(8)]
        [th.start() for th in threads]; [th.join(30) for th in threads]
        import synthpkg.target as t
        inner = t.init_process_group.__wrapped__
        print(json.dumps({
            "threads": len(seen), "one_object": len({id(x) for s in seen for x in s[:2]}),
            "one_bundles": len({id(s[2]) for s in seen}),
            "single_layer": not npu_compat.is_patched(inner),
            "status": statuses(), "call": t.init_process_group("hccl"),
        }))
        """,
    )
    out = last_json(proc)
    assert out["threads"] == 8
    assert out["one_object"] == 1 and out["one_bundles"] == 1 and out["single_layer"]
    assert set(out["status"].values()) == {"applied"}
    assert out["call"] == ["patched", "init", "nccl", 1]


def test_concurrent_activate_from_threads_is_one_activation(synth: Path) -> None:
    proc = child(
        synth,
        """
        import threading
        import synthpkg.target as t
        barrier = threading.Barrier(8)
        results = []
        def worker():
            barrier.wait()
            results.append(npu_compat.activate(specs=SPECS))
        threads = [threading.Thread(target=worker) for _ in range(8)]
        [th.start() for th in threads]; [th.join(30) for th in threads]
        finders = sum(type(f).__name__ == "PostImportFinder" for f in sys.meta_path)
        print(json.dumps({"results": results, "finders": finders,
                          "single_layer": not npu_compat.is_patched(t.init_process_group.__wrapped__)}))
        """,
    )
    assert last_json(proc) == {"results": ["npu"] * 8, "finders": 1, "single_layer": True}


VANISHED = """
import pathlib, importlib
import synthpkg
target = pathlib.Path(synthpkg.__file__).with_name("target.py")
target.write_text(target.read_text().replace("def vanishing", "def renamed_upstream"))
importlib.invalidate_caches()
from npu_compat import PatchSpec
GONE = PatchSpec("synth.vanishing", "synthpkg.target:vanishing", wrapper="synthpatches:never",
                 distribution="synthpkg", versions=">=1,<2", why="test")
"""


def test_vanished_attribute_fails_clearly_and_import_still_works(synth: Path) -> None:
    proc = child(
        synth,
        VANISHED,
        """
        npu_compat.activate(specs=[*SPECS, GONE])
        with warnings.catch_warnings(record=True) as caught:
            import synthpkg.target as t
        rec = [r for r in npu_compat.report() if r["id"] == "synth.vanishing"][0]
        print(json.dumps({"status": rec["status"], "reason": rec["reason"],
                          "others": statuses(), "works": t.device_name(),
                          "warnings": [(w.category.__name__, str(w.message)) for w in caught]}))
        """,
    )
    out = last_json(proc)
    assert out["status"] == "failed"
    for fragment in ("synthpkg.target:vanishing", "synthpkg 1.2.0", "NPU_COMPAT_DISABLE=synth.vanishing"):
        assert fragment in out["reason"]
    assert out["works"] == "npu"  # the other patches still applied, the import went through
    assert out["others"]["synth.device_name"] == "applied"
    assert [w[0] for w in out["warnings"]] == ["NpuCompatWarning"]
    assert "synth.vanishing" in out["warnings"][0][1]


@pytest.mark.parametrize("how", ["env", "argument"])
def test_strict_mode_raises(synth: Path, how: str) -> None:
    env = {"NPU_COMPAT_STRICT": "1"} if how == "env" else {}
    arg = "" if how == "env" else "strict=True"
    proc = child(
        synth,
        VANISHED,
        f"""
        npu_compat.activate({arg}{", " if arg else ""}specs=[*SPECS, GONE])
        try:
            import synthpkg.target
            outcome = "imported"
        except npu_compat.PatchError as exc:
            outcome = "PatchError: " + str(exc)
        print(json.dumps({{"outcome": outcome}}))
        """,
        env=env,
    )
    outcome = last_json(proc)["outcome"]
    assert outcome.startswith("PatchError: npu_compat: patch synth.vanishing failed")


def test_strict_mode_raises_from_activate_for_imported_target(synth: Path) -> None:
    proc = child(
        synth,
        VANISHED,
        """
        import synthpkg.target
        try:
            npu_compat.activate(strict=True, specs=[*SPECS, GONE])
            outcome = "activated"
        except npu_compat.PatchError as exc:
            outcome = "PatchError"
        print(json.dumps({"outcome": outcome}))
        """,
    )
    assert last_json(proc) == {"outcome": "PatchError"}


def test_disabled_patch_stays_off_and_unknown_ids_are_named(synth: Path) -> None:
    proc = child(
        synth,
        """
        with warnings.catch_warnings(record=True) as caught:
            npu_compat.activate(specs=SPECS)
        import synthpkg.target as t
        rec = [r for r in npu_compat.report() if r["id"] == "synth.device_name"][0]
        print(json.dumps({"name": t.device_name(), "status": rec["status"], "reason": rec["reason"],
                          "others": statuses(), "warnings": [str(w.message) for w in caught]}))
        """,
        env={"NPU_COMPAT_DISABLE": "synth.device_name, synth.nope"},
    )
    out = last_json(proc)
    assert out["name"] == "cuda"
    assert (out["status"], out["reason"]) == ("skipped", "disabled by NPU_COMPAT_DISABLE")
    assert out["others"]["synth.init_pg"] == "applied"
    assert len(out["warnings"]) == 1
    assert "synth.nope" in out["warnings"][0] and "synth.init_pg" in out["warnings"][0]


def test_disable_star_turns_every_patch_off(synth: Path) -> None:
    proc = child(
        synth,
        """
        npu_compat.activate(specs=SPECS)
        import synthpkg.target as t
        print(json.dumps({"status": statuses(), "name": t.device_name(), "patched": npu_compat.is_patched(t.LIMIT)}))
        """,
        env={"NPU_COMPAT_DISABLE": "*"},
    )
    out = last_json(proc)
    assert set(out["status"].values()) == {"skipped"}
    assert out["name"] == "cuda" and not out["patched"]


def test_out_of_range_version_is_skipped_with_versions_named(tmp_path: Path) -> None:
    from tests.conftest import make_synth

    synth = make_synth(tmp_path / "site", version="2.1.0")
    proc = child(
        synth,
        """
        with warnings.catch_warnings(record=True) as caught:
            npu_compat.activate(specs=SPECS)
            import synthpkg.target as t
        rec = [r for r in npu_compat.report() if r["id"] == "synth.init_pg"][0]
        print(json.dumps({"status": rec["status"], "reason": rec["reason"], "installed": rec["installed"],
                          "name": t.device_name(), "warnings": len(caught)}))
        """,
    )
    out = last_json(proc)
    assert out["status"] == "skipped" and out["installed"] == "2.1.0"
    assert "synthpkg 2.1.0 is outside '>=1.0,<2'" in out["reason"]
    assert "no npu-compat patch supports this version ('>=1.0,<2')" in out["reason"]
    assert out["name"] == "cuda"
    assert out["warnings"] == 1  # one for the distribution that no patch in npu-compat supports any more


def test_condition_stands_a_patch_down(synth: Path) -> None:
    (synth / "synthpkg" / "__init__.py").write_text("NATIVE_NPU = True\n")
    proc = child(
        synth,
        """
        npu_compat.activate(specs=SPECS)
        import synthpkg.target as t
        rec = [r for r in npu_compat.report() if r["id"] == "synth.device_name"][0]
        print(json.dumps({"status": rec["status"], "reason": rec["reason"], "name": t.device_name()}))
        """,
    )
    assert last_json(proc) == {
        "status": "skipped",
        "reason": "synthpkg has native NPU support",
        "name": "cuda",
    }


def test_signature_change_is_a_failure_not_a_guess(synth: Path) -> None:
    target = synth / "synthpkg" / "target.py"
    target.write_text(
        target.read_text().replace('def init_process_group(backend="nccl"', "def init_process_group(kind")
    )
    proc = child(
        synth,
        """
        npu_compat.activate(specs=SPECS)
        with warnings.catch_warnings(record=True):
            import synthpkg.target as t
        rec = [r for r in npu_compat.report() if r["id"] == "synth.init_pg"][0]
        print(json.dumps({"status": rec["status"], "reason": rec["reason"],
                          "untouched": not npu_compat.is_patched(t.init_process_group)}))
        """,
    )
    out = last_json(proc)
    assert out["status"] == "failed" and out["untouched"]
    assert "expected synthpkg.target:init_process_group to accept backend" in out["reason"]
    assert "init_process_group(kind, world_size=1)" in out["reason"]


def test_broken_wrapper_reference_never_breaks_the_import(synth: Path) -> None:
    proc = child(
        synth,
        """
        from npu_compat import PatchSpec
        BROKEN = PatchSpec("synth.broken", "synthpkg.target:vanishing", wrapper="synthpatches:no_such_wrapper",
                           distribution="synthpkg", versions=">=1", why="test")
        npu_compat.activate(specs=[BROKEN])
        with warnings.catch_warnings(record=True) as caught:
            import synthpkg.target as t
        rec = npu_compat.report()[0]
        print(json.dumps({"status": rec["status"], "reason": rec["reason"], "call": t.vanishing(),
                          "warned": len(caught)}))
        """,
    )
    out = last_json(proc)
    assert out["status"] == "failed" and out["call"] == "still here" and out["warned"] == 1
    assert "AttributeError" in out["reason"]


def test_off_switch_disables_activate(synth: Path) -> None:
    proc = child(
        synth,
        """
        before = set(sys.modules)
        result = npu_compat.activate(specs=SPECS)
        import synthpkg.target as t
        new = sorted(m for m in set(sys.modules) - before if not m.startswith("synthpkg"))
        print(json.dumps({"result": result, "patched": npu_compat.is_patched(t.device_name), "new": new}))
        """,
        env={"NPU_COMPAT": "0"},
    )
    out = last_json(proc)
    assert (out["result"], out["patched"]) == ("off", False)
    assert set(out["new"]) <= {"npu_compat._env"}  # the bootstrap and nothing else


def test_a_wrong_value_or_a_misspelt_name_of_ours_is_named_on_npu_and_silent_elsewhere(synth: Path) -> None:
    code = """
        with warnings.catch_warnings(record=True) as caught:
            device = npu_compat.activate(specs=SPECS)
        from npu_compat._activation import _state
        print(json.dumps({"device": device, "strict": _state.strict,
                          "warnings": [str(w.message) for w in caught]}))
        """
    wrong = {"NPU_COMPAT_STRICT": "maybe", "NPU_COMPAT_SIMULATED": "1"}
    out = last_json(child(synth, code, env=wrong))
    assert out["device"] == "npu" and out["strict"] is False
    assert sorted(out["warnings"]) == [
        "npu_compat: NPU_COMPAT_SIMULATED is not a variable npu-compat reads: it has no effect; "
        "did you mean NPU_COMPAT_SIMULATE?",
        "npu_compat: NPU_COMPAT_STRICT='maybe' is neither on (1, true, yes, on) nor off (0, false, no, off): "
        "taken as off",
    ]
    quiet = last_json(child(synth, code, env={**wrong, "NPU_COMPAT_DEVICE": "cpu"}))
    assert quiet["device"] == "cpu" and quiet["warnings"] == []  # invisible off Ascend
