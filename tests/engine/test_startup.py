"""What activation costs at interpreter start, and what it defers without changing behaviour.

An activation on ``npu`` loads the package, ``_env`` and ``_activation`` and registers one
finder; the patch list (the catalogue) and the code that applies it are read at the first
import of a package some patch targets -- before that package runs -- or at the first
``report()``.  The package names that finder waits for are written out in ``_activation``;
the first test keeps them equal to the catalogue.
"""

from __future__ import annotations

import importlib.util
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from npu_compat import _activation, _catalog, _env
from tests.conftest import REPO, last_json, run_py

NPU = {"NPU_COMPAT_DEVICE": "npu"}


def test_the_packages_the_engine_waits_for_are_the_catalogues() -> None:
    declared = set()
    for spec in _catalog.SPECS:
        declared.add(spec.module.partition(".")[0])
        declared.update(module.partition(".")[0] for module, _ in spec.copy_places())
    assert _activation.CATALOG_PACKAGES == declared, (
        "npu_compat/_activation.py CATALOG_PACKAGES must list the top-level package of every module the "
        f"catalogue patches or repoints a copy in: set it to frozenset({sorted(declared)})"
    )


def test_npu_activation_loads_four_modules_and_reads_no_patch_list() -> None:
    proc = run_py(
        """
        import json, sys
        before, original = set(sys.modules), sys.meta_path
        import npu_compat
        device = npu_compat.activate()
        loaded = sorted(set(sys.modules) - before)
        finder, watcher = sys.meta_path[:2]
        rep = npu_compat.report()
        print(json.dumps({
            "device": device, "loaded": loaded, "finders_in_front": [type(finder).__name__, type(watcher).__name__],
            "waiting_from": type(finder).__module__, "waiting_after_report": finder in sys.meta_path,
            "not_in_original_list": finder not in original and watcher not in original,
            "again": npu_compat.activate(),
            "finders": sum(type(f).__name__ == "PostImportFinder" for f in sys.meta_path),
            "ids": [r["id"] for r in rep], "statuses": sorted({r["status"] for r in rep}),
            "reasons_ok": all(r["reason"] == "waiting for " + r["target"].partition(":")[0] + " to be imported"
                              for r in rep),
            "decision": rep.decision, "catalogue_read": "npu_compat._catalog" in sys.modules,
        }))
        """,
        env=NPU,
    )
    out = last_json(proc)
    assert out["device"] == out["again"] == "npu"
    assert out["loaded"] == ["npu_compat", "npu_compat._activation", "npu_compat._env", "npu_compat._state"]
    # the start-up module's waiting finder in front of the engine's; report() read the list, and so ended the wait
    assert out["finders_in_front"] == ["Waiting", "PostImportFinder"] and out["finders"] == 1
    assert out["waiting_from"] == "_npu_compat_precheck" and not out["waiting_after_report"]
    assert out["not_in_original_list"]
    # report() reads the catalogue: every declared patch, pending
    assert out["catalogue_read"]
    assert out["ids"] == [spec.id for spec in _catalog.SPECS]
    assert out["statuses"] == ["pending"] and out["reasons_ok"]
    assert out["decision"] == {"device": "npu", "source": "NPU_COMPAT_DEVICE=npu", "evidence": []}


def fake_ray(root: Path) -> Path:
    """A ``ray`` without metadata: what is imported when, not the patches themselves."""
    pkg = root / "ray"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import sys\nCATALOGUE_READ_BEFORE_RAY_RAN = 'npu_compat._catalog' in sys.modules\nfrom . import actor\n"
    )
    (pkg / "actor.py").write_text(
        "class ActorClass:\n    def _remote(self, *a, **k):\n        return 'gpu'\n"
    )
    return root


def test_the_first_import_of_a_target_package_reads_the_catalogue_before_the_package_runs(
    tmp_path: Path,
) -> None:
    proc = run_py(
        """
        import json, sys, warnings
        warnings.simplefilter("ignore")
        import npu_compat
        npu_compat.activate()
        read_at_activation = "npu_compat._catalog" in sys.modules
        import ray
        rec = [r for r in npu_compat.report() if r["id"] == "ray.guard.actor"][0]
        print(json.dumps({
            "read_at_activation": read_at_activation, "read_before_ray_ran": ray.CATALOGUE_READ_BEFORE_RAY_RAN,
            "watched": "ray.actor" in sys.meta_path[0].names, "status": rec["status"], "reason": rec["reason"],
        }))
        """,
        env=NPU,
        pythonpath=[str(fake_ray(tmp_path))],
    )
    out = last_json(proc)
    assert not out["read_at_activation"]
    assert out["read_before_ray_ran"] and out["watched"]
    # ray.actor ran while its hook was registered: the patch was tried (applied where a real ray's
    # metadata is installed, else skipped for want of it)
    assert out["status"] in ("applied", "skipped")
    if out["status"] == "skipped":
        assert "has no installed metadata" in out["reason"]


@pytest.mark.parametrize("logging", [False, True])
def test_whether_logging_is_imported_does_not_change_when_the_catalogue_is_read(logging: bool) -> None:
    proc = run_py(
        ("import logging\n" if logging else "")
        + """
import json, sys
import npu_compat
npu_compat.activate()
print(json.dumps({"read": "npu_compat._catalog" in sys.modules}))
""",
        env=NPU,
    )
    assert last_json(proc) == {"read": False}


@pytest.mark.parametrize("why", ["imported", "disable"])
def test_activation_reads_the_catalogue_at_once_when_waiting_would_show(tmp_path: Path, why: str) -> None:
    before = {"imported": "import ray\n"}.get(why, "")
    proc = run_py(
        before
        + """
import json, sys, warnings
import npu_compat
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    npu_compat.activate()
statuses = {r["id"]: r["status"] for r in npu_compat.report()}
print(json.dumps({"read": "npu_compat._catalog" in sys.modules, "guard": statuses["ray.guard.actor"],
                  "warned": [str(w.message) for w in caught]}))
""",
        env={**NPU, **({"NPU_COMPAT_DISABLE": "ray.guard.actor,no.such.id"} if why == "disable" else {})},
        pythonpath=[str(fake_ray(tmp_path))],
    )
    out = last_json(proc)
    assert out["read"]
    if why == "imported":
        assert out["guard"] != "pending"  # tried at once: ray.actor was already imported
    if why == "disable":
        assert out["guard"] == "skipped"
        assert len(out["warned"]) == 1 and "no.such.id" in out["warned"][0]  # at activation, as before


def test_a_package_runs_with_its_targets_already_patched(synth: Path) -> None:
    # synthpkg binds a copy of a patched function while it runs: the patch list must be read,
    # and the hook registered, before synthpkg itself runs
    (synth / "synthpkg" / "__init__.py").write_text("from .target import init_process_group as early\n")
    proc = run_py(
        """
        import json, sys
        import npu_compat
        from synthspecs import SPECS
        npu_compat.activate(specs=SPECS)
        engine = sys.modules["npu_compat._activation"]
        waiting = engine._state.pending
        import synthpkg
        print(json.dumps({"waiting": waiting, "after": engine._state.pending,
                          "early": npu_compat.is_patched(synthpkg.early), "call": synthpkg.early("hccl")}))
        """,
        env=NPU,
        pythonpath=[str(synth)],
    )
    assert last_json(proc) == {
        "waiting": True,
        "after": False,
        "early": True,
        "call": ["patched", "init", "nccl", 1],
    }


def test_deactivate_while_waiting_leaves_nothing_behind() -> None:
    proc = run_py(
        """
        import json, sys
        original, had_importlib = list(sys.meta_path), "importlib" in sys.modules
        import npu_compat
        npu_compat.activate()
        npu_compat.deactivate()
        print(json.dumps({"meta_path": sys.meta_path == original,
                          "hooks_loaded": "npu_compat._apply" in sys.modules,
                          "importlib_loaded": "importlib" in sys.modules and not had_importlib,
                          "report": npu_compat.report().decision["source"]}))
        """,
        env=NPU,
    )
    assert last_json(proc) == {
        "meta_path": True,
        "hooks_loaded": False,  # nothing was applied: nothing to undo
        "importlib_loaded": False,
        "report": "not activated",
    }


# -- the environment, read fast ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "found"), [([], False), (["xdavinci0", "null"], False), (["davinci7"], True)]
)
def test_davinci_nodes_are_found_by_prefix_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: list[str], found: bool
) -> None:
    for node in nodes:
        (tmp_path / node).touch()
    monkeypatch.setattr(_env.startup, "DEV_DIR", str(tmp_path))
    monkeypatch.setattr(_env.startup, "torch_npu_findable", lambda: False)
    assert bool(_env.ascend_evidence({})) is found


# -- the interpreter-start bootstrap ----------------------------------------------------------------


@pytest.fixture
def boot() -> Iterator[object]:
    # the checkout's file, as a module of its own: an installed npu-compat has loaded its own copy
    spec = importlib.util.spec_from_file_location(
        "_npu_compat_precheck_under_test", REPO / "_npu_compat_precheck.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module


@pytest.mark.parametrize(
    ("nodes", "says"), [([], False), (["xdavinci1"], False), (["davinci_manager"], True)]
)
def test_the_pre_check_finds_davinci_nodes_by_prefix(
    boot: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: list[str], says: bool
) -> None:
    for node in nodes:
        (tmp_path / node).touch()
    monkeypatch.setattr(boot, "DEV_DIR", str(tmp_path))
    monkeypatch.setattr(boot, "torch_npu_findable", lambda: False)
    assert boot.wanted({}) is says  # type: ignore[attr-defined]


def test_the_next_sitecustomize_is_looked_for_without_missing_one(boot: object, tmp_path: Path) -> None:
    machinery = boot._machinery()[0]  # type: ignore[attr-defined]

    def may_hold(entries: list[str]) -> bool:
        return bool(boot._may_hold_sitecustomize(entries, machinery))  # type: ignore[attr-defined]

    empty, module, package, late = (tmp_path / n for n in ("empty", "module", "package", "late"))
    for directory in (empty, module, package, late):
        directory.mkdir()
    (module / "sitecustomize.py").write_text("")
    (package / "sitecustomize").mkdir()
    archive = tmp_path / "site.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("sitecustomize.py", "")
    assert not may_hold([str(empty), "relative", "", str(tmp_path / "missing")])
    assert may_hold([str(empty), str(module)])
    assert may_hold([str(package)])
    assert may_hold([str(archive)])  # not a directory: searched properly
    assert not may_hold([str(late)])
    (late / f"sitecustomize{machinery.EXTENSION_SUFFIXES[0]}").touch()  # an extension module counts too
    assert may_hold([str(late)])


def test_settings_are_read_at_activation_even_when_the_patch_list_is_read_later() -> None:
    proc = run_py(
        """
        import json, os
        import npu_compat
        npu_compat.activate()
        os.environ["NPU_COMPAT_DISABLE"] = "*"  # too late: activation read the settings
        print(json.dumps(sorted({r["status"] for r in npu_compat.report()})))
        """,
        env=NPU,
    )
    assert last_json(proc) == ["pending"]
