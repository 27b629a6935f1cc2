"""Activation at interpreter start: the shipped sitecustomize, the launcher's, and the pre-check.

Each case runs in a fresh interpreter started with the checkout's bootstrap on
``PYTHONPATH`` (the repository root holds the top-level ``sitecustomize``; the
launcher's lives in ``npu_compat/_launcher_site``).  Needs nothing but the stdlib.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from npu_compat import _activation, _env

from .conftest import BOOTSTRAP, PROBE, REPO, child_env, last_json, pth_installed, py, run

# With the wheel installed (the nox sessions), npu_compat.pth runs before any sitecustomize.
FIRST = ".pth" if pth_installed() else None


@pytest.fixture
def boot() -> Iterator[object]:
    sys.path.insert(0, str(REPO))
    try:
        import _npu_compat_precheck

        yield _npu_compat_precheck
    finally:
        sys.path.remove(str(REPO))


def test_env_reads_its_decision_names_from_the_start_up_module(boot: object) -> None:
    # one literal for each name, in the import-free module both the pre-check and the engine read
    assert _env.startup is sys.modules["_npu_compat_precheck"]
    for name in ("ENABLE", "AUTO", "DEVICE", "TRINITY_DEVICE", "REPORT_DIR", "SIMULATE", "DISABLE"):
        assert getattr(_env, name) == getattr(boot, name)
    assert _env.ASCEND_TOOLKIT_VARS == boot.ASCEND_TOOLKIT_VARS  # type: ignore[attr-defined]
    assert _env.FALSE_VALUES == boot.FALSE_VALUES  # type: ignore[attr-defined]
    assert _activation.CATALOG_PACKAGES == boot.PACKAGES  # type: ignore[attr-defined]


ENVIRONMENTS = [
    {},
    {"NPU_COMPAT_DEVICE": "cuda"},
    {"NPU_COMPAT_DEVICE": "CPU "},
    {"NPU_COMPAT_DEVICE": "npu"},
    {"NPU_COMPAT_DEVICE": "auto", "TRINITY_DEVICE": "npu"},
    {"NPU_COMPAT_DEVICE": "cpu", "TRINITY_DEVICE": "npu"},
    {"TRINITY_DEVICE": "cuda", "ASCEND_RT_VISIBLE_DEVICES": "0"},
    {"ASCEND_RT_VISIBLE_DEVICES": "0,1"},
    {"ASCEND_HOME_PATH": "/x"},
    {"ASCEND_TOOLKIT_HOME": "/x"},
    {"NPU_COMPAT": "0", "NPU_COMPAT_DEVICE": "npu"},
    {"NPU_COMPAT": "off", "ASCEND_RT_VISIBLE_DEVICES": "0"},
    {"DAVINCI": "1"},
    {"DAVINCI": "1", "NPU_COMPAT_DEVICE": "cuda"},
]


@pytest.mark.parametrize(
    "environ", ENVIRONMENTS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "empty"
)
def test_the_pre_check_never_skips_an_npu_decision(
    boot: object, environ: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    if environ.pop("DAVINCI", None):
        (dev / "davinci3").touch()
    for module in (boot, _env.startup):  # the checkout's and the installed copy, where they differ
        monkeypatch.setattr(module, "DEV_DIR", str(dev))
        monkeypatch.setattr(module, "torch_npu_findable", lambda: False)
    decision = _env.decide(environ=environ)
    assert boot.wanted(environ) == decision.is_npu  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["gpu", " "])
def test_a_bad_override_goes_on_so_that_env_can_name_it(boot: object, value: str) -> None:
    assert boot.wanted({"NPU_COMPAT_DEVICE": value})  # type: ignore[attr-defined]


def test_a_report_directory_or_the_simulation_goes_on(boot: object) -> None:
    assert boot.wanted({"NPU_COMPAT_REPORT_DIR": "/tmp/x"})  # type: ignore[attr-defined]
    assert boot.wanted({"NPU_COMPAT_SIMULATE": "1"})  # type: ignore[attr-defined]
    assert not boot.wanted({"NPU_COMPAT_AUTO": "0", "NPU_COMPAT_DEVICE": "npu"})  # type: ignore[attr-defined]


@pytest.mark.parametrize("where", ["sitecustomize", "launcher"])
def test_noop_start_imports_nothing_of_npu_compat(where: str) -> None:
    pythonpath = [str(REPO)] if where == "sitecustomize" else [str(BOOTSTRAP)]
    out = last_json(py(PROBE, child_env(pythonpath=pythonpath)))
    # installed, the launcher's sitecustomize runs the one at the top of site-packages next
    installed = [FIRST, where, "sitecustomize"] if FIRST and where == "launcher" else [FIRST, where]
    assert out["triggers"] == [t for t in installed if t]  # type: ignore[index]
    assert out["started"] is None  # type: ignore[index]
    assert out["loaded"] == []  # type: ignore[index]
    assert "PostImportFinder" not in out["finders"]  # type: ignore[index]


@pytest.mark.parametrize("where", ["sitecustomize", "launcher"])
def test_npu_start_activates_once(where: str) -> None:
    pythonpath = [str(REPO)] if where == "sitecustomize" else [str(BOOTSTRAP)]
    out = last_json(
        py(
            "import npu_compat; again = npu_compat.activate()\n" + PROBE,
            child_env({"NPU_COMPAT_DEVICE": "npu"}, pythonpath=pythonpath),
        )
    )
    assert out["started"] == (FIRST or where)  # type: ignore[index]
    assert out["via"] == out["started"]  # type: ignore[index]
    assert out["active"]  # type: ignore[index]
    assert out["finders"].count("PostImportFinder") == 1  # type: ignore[index]
    assert not out["start_waiting"]  # type: ignore[index]


@pytest.mark.parametrize("where", ["sitecustomize", "launcher"])
def test_npu_start_waits_for_the_first_import_of_a_target_package(where: str, tmp_path: Path) -> None:
    # an empty top-level package named like a patch target: its import finishes the start, and
    # the engine's own finder answers for that very import (the patch list is read before it runs)
    (tmp_path / "verl").mkdir()
    (tmp_path / "verl" / "__init__.py").write_text("")
    pythonpath = [str(REPO)] if where == "sitecustomize" else [str(BOOTSTRAP)]
    code = (
        "import json, sys\n"
        "before = sorted(m for m in sys.modules if m.startswith('npu_compat'))\n"
        "finders = [type(f).__name__ for f in sys.meta_path]\n"
        f"sys.path.append({str(tmp_path)!r})\n"
        "import verl\n"
        "eng = sys.modules.get('npu_compat._activation')\n"
        "print(json.dumps({'before': before, 'finders': finders, 'after': [type(f).__name__ for f in sys.meta_path],"
        " 'active': bool(eng and eng._state.active), 'read': bool(eng and eng._state.records),"
        " 'pending': getattr(sys.modules['_npu_compat_precheck'], 'PENDING', 0),"
        " 'via': getattr(sys.modules.get('npu_compat._autostart'), 'VIA', None)}))"
    )
    out = last_json(py(code, child_env({"NPU_COMPAT_DEVICE": "npu"}, pythonpath=pythonpath)))
    assert out["before"] == []  # type: ignore[index]
    assert out["finders"][0] == "Waiting"  # type: ignore[index]
    # the import ended both waits: the start's and the patch list's (the engine's, of the same class)
    assert out["after"].count("PostImportFinder") == 1 and "Waiting" not in out["after"]  # type: ignore[index]
    assert out["active"] and out["read"] and out["pending"] is None  # type: ignore[index]
    assert out["via"] == (FIRST or where)  # type: ignore[index]


THREADS = """
import json, sys, threading
sys.path.insert(0, sys.argv[1])  # the stand-in packages shadow any real ones
names = ["ray.actor", "ray.remote_function", "verl", "trinity", "vllm", "ray", "verl", "ray.actor"]
barrier = threading.Barrier(len(names))
errors = []
def load(name):
    barrier.wait()
    try:
        __import__(name)
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=load, args=(n,)) for n in names]
for t in threads: t.start()
for t in threads: t.join(60)
import npu_compat
rep = npu_compat.report()
seen = [r for r in rep if r["target"].partition(":")[0] in sys.modules]
print(json.dumps({
    "errors": errors,
    "seen": sorted({r["target"].partition(":")[0] for r in seen}),
    "still_pending": [r["id"] for r in seen if r["status"] == "pending"],
    "finders": [type(f).__name__ for f in sys.meta_path],
}))
"""


def test_a_waiting_start_hooks_every_target_imported_from_eight_threads_at_once(tmp_path: Path) -> None:
    # Eight threads race to import target packages first, so several meet the waiting finder while
    # one of them finishes the start.  Small stand-in packages (real torch and Ray cannot be
    # imported from threads at once even without npu-compat): every patch target among them must
    # have been seen by the engine's post-import hook -- none left "pending".
    for package in ("ray", "verl", "trinity", "vllm"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "ray" / "actor.py").write_text(
        "class ActorClass:\n    def _remote(self, args=None, kwargs=None, **o): ...\n"
    )
    (tmp_path / "ray" / "remote_function.py").write_text(
        "class RemoteFunction:\n    def _remote(self, args=None, kwargs=None, **o): ...\n"
    )
    script = tmp_path / "threads.py"
    script.write_text(THREADS)
    env = child_env({"NPU_COMPAT_DEVICE": "npu"}, pythonpath=[str(BOOTSTRAP)])
    for _ in range(3):
        out = last_json(run([sys.executable, str(script), str(tmp_path)], env))
        assert out["errors"] == []  # type: ignore[index]
        assert out["seen"] == ["ray.actor", "ray.remote_function"]  # type: ignore[index]
        assert out["still_pending"] == []  # type: ignore[index]
        assert out["finders"].count("PostImportFinder") == 1 and "Waiting" not in out["finders"]  # type: ignore[index]


@pytest.mark.parametrize(
    "now",
    [
        {"NPU_COMPAT_REPORT_DIR": "REPORTS"},
        {"NPU_COMPAT_DISABLE": "no.such.patch"},
        {"NPU_COMPAT_DEVICE": "gpu"},
    ],
)
def test_a_setting_that_must_show_at_start_does_not_wait(now: dict[str, str], tmp_path: Path) -> None:
    extra = {"NPU_COMPAT_DEVICE": "npu", **{k: v.replace("REPORTS", str(tmp_path)) for k, v in now.items()}}
    proc = py(PROBE, child_env(extra, pythonpath=[str(BOOTSTRAP)]))
    out = last_json(proc)
    assert not out["start_waiting"]  # type: ignore[index]
    if "NPU_COMPAT_REPORT_DIR" in now:
        assert out["active"] and list(tmp_path.glob("*.json"))  # type: ignore[index]
    elif "NPU_COMPAT_DISABLE" in now:
        assert out["active"] and "no.such.patch" in proc.stderr  # type: ignore[index]
    else:
        assert not out["active"] and "NPU_COMPAT_DEVICE" in proc.stderr  # type: ignore[index]


def test_the_launcher_bootstrap_imports_npu_compat_from_its_own_tree_not_the_cwd(tmp_path: Path) -> None:
    fake = tmp_path / "npu_compat"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise SystemExit('the npu_compat of the current directory was imported')\n"
    )
    out = last_json(
        py(
            PROBE,
            child_env({"NPU_COMPAT_DEVICE": "npu"}, pythonpath=[str(BOOTSTRAP), str(tmp_path)]),
            cwd=tmp_path,
        )
    )
    assert out["active"]  # type: ignore[index]
    assert not str(out["npu_compat_file"]).startswith(str(tmp_path))  # type: ignore[index]


@pytest.mark.parametrize("off", [{"NPU_COMPAT": "0"}, {"NPU_COMPAT_AUTO": "0"}])
def test_off_switches_leave_the_interpreter_untouched(off: dict[str, str]) -> None:
    out = last_json(
        py(PROBE, child_env({"NPU_COMPAT_DEVICE": "npu", "ASCEND_RT_VISIBLE_DEVICES": "0", **off}))
    )
    assert out["started"] is None and out["loaded"] == []  # type: ignore[index]


def test_explicit_activation_still_works_with_auto_off() -> None:
    out = last_json(
        py(
            "import npu_compat; npu_compat.activate()\n" + PROBE,
            child_env({"NPU_COMPAT_DEVICE": "npu"}, auto=False),
        )
    )
    assert out["active"] and out["started"] is None  # type: ignore[index]


USER_SITECUSTOMIZE = """
import os, sys
with open(os.environ["USER_SC_LOG"], "a") as f:
    started = getattr(sys.modules.get("_npu_compat_precheck"), "STARTED", None) is not None
    f.write(f"{os.getpid()} npu_compat_started={started}\\n")
USER_SITECUSTOMIZE_RAN = True
"""


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("where", ["sitecustomize", "launcher"])
def test_the_users_own_sitecustomize_runs_exactly_once_after_ours(
    tmp_path: Path, where: str, device: str
) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    log = tmp_path / "log"
    ours = str(REPO) if where == "sitecustomize" else str(BOOTSTRAP)
    env = child_env({"USER_SC_LOG": str(log), "NPU_COMPAT_DEVICE": device}, pythonpath=[ours, str(user)])
    out = last_json(
        py(
            "import sitecustomize\n"
            "assert sitecustomize.USER_SITECUSTOMIZE_RAN and sitecustomize.__file__.startswith("
            f"{str(user)!r})\n" + PROBE,
            env,
        )
    )
    lines = log.read_text().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == f"{out['pid']} npu_compat_started={device == 'npu'}"  # type: ignore[index]
    assert out["active"] == (device == "npu")  # type: ignore[index]


def test_launcher_then_top_level_then_users_each_run_once(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text(USER_SITECUSTOMIZE)
    log = tmp_path / "log"
    env = child_env({"USER_SC_LOG": str(log)}, pythonpath=[str(BOOTSTRAP), str(REPO), str(user)])
    out = last_json(py(PROBE, env))
    assert out["triggers"] == [t for t in (FIRST, "launcher", "sitecustomize") if t]  # type: ignore[index]
    assert len(log.read_text().splitlines()) == 1


def test_a_failing_user_sitecustomize_is_reported_as_python_would_and_we_stay_active(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("raise RuntimeError('user sitecustomize is broken')\n")
    proc = py(
        "import sys\n" + PROBE + "print('sitecustomize' in sys.modules)",
        child_env({"NPU_COMPAT_DEVICE": "npu"}, pythonpath=[str(BOOTSTRAP), str(user)]),
    )
    assert "Error in sitecustomize" in proc.stderr and "user sitecustomize is broken" in proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "False"
    import json

    assert json.loads(lines[-2])["active"]


def test_a_bad_setting_is_one_line_on_stderr_and_the_interpreter_runs_on() -> None:
    proc = py("print('alive')", child_env({"NPU_COMPAT_DEVICE": "gpu"}))
    assert proc.stdout.strip() == "alive"
    assert proc.stderr.count("npu_compat:") == 1
    assert "'gpu' is not a device" in proc.stderr and "runs without npu-compat" in proc.stderr


SPAWN = """
import json, multiprocessing as mp, subprocess, sys

def probe(q):
    import sys
    boot = sys.modules.get("_npu_compat_precheck")
    if getattr(boot, "PENDING", None) is not None:
        boot.complete()  # what the first import of a target package would do
    eng = sys.modules.get("npu_compat._activation")
    q.put([getattr(boot, "STARTED", None), bool(eng and eng._state.active), "npu_compat" in sys.modules])

if __name__ == "__main__":
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=probe, args=(q,))
    p.start()
    spawned = q.get(timeout=60)
    p.join(30)
    code = ("import sys, json; b = sys.modules.get('_npu_compat_precheck');"
            "b.complete() if getattr(b, 'PENDING', None) is not None else None;"
            "e = sys.modules.get('npu_compat._activation');"
            "print(json.dumps([getattr(b, 'STARTED', None), bool(e and e._state.active), 'npu_compat' in sys.modules]))")
    sub = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    print(json.dumps({"spawned": spawned, "sub": json.loads(sub.stdout)}))
"""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"NPU_COMPAT_DEVICE": "npu"}, True),
        ({"NPU_COMPAT_DEVICE": "npu", "NPU_COMPAT": "0"}, False),
        ({}, False),
    ],
)
def test_spawn_and_subprocess_children_are_reached(
    tmp_path: Path, extra: dict[str, str], expected: bool
) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(SPAWN)
    out = last_json(
        py(
            f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
            child_env(extra, pythonpath=[str(BOOTSTRAP)]),
            timeout=120,
        )
    )
    for started, active, loaded in (out["spawned"], out["sub"]):  # type: ignore[index]
        assert active is expected and loaded is expected
        assert (started is not None) is expected


def test_the_doctor_can_see_how_this_interpreter_was_reached() -> None:
    out = last_json(
        py(
            "import json, sys\nfrom npu_compat.doctor import diagnose\n"
            "d = diagnose()\nprint(json.dumps(d.sections['activation']))",
            child_env(pythonpath=[str(BOOTSTRAP), str(REPO)]),
        )
    )
    assert out["effective"] and out["path"] == (FIRST or "launcher")  # type: ignore[index]


def test_bootstrap_costs_the_no_op_path_no_module_of_the_package() -> None:
    # the one module a no-op start loads is the bootstrap file itself (as sitecustomize)
    out = last_json(
        py(
            "import json, sys; print(json.dumps(sorted(m for m in sys.modules if 'npu' in m)))",
            child_env(pythonpath=[str(BOOTSTRAP)]),
        )
    )
    assert out == ["_npu_compat_precheck"]


def test_relative_entries_are_never_searched_for_the_next_sitecustomize(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("raise SystemExit('imported from a relative path')\n")
    elsewhere = tmp_path / "not-on-the-path" / "sitecustomize.py"
    proc = py(
        f"""
        import sys
        boot = sys.modules["_npu_compat_precheck"]
        sys.path[:0] = ["", ".", "relative/dir"]
        boot._chain({str(elsewhere)!r})
        print("searched", sys.modules["sitecustomize"].__file__)
        """,
        child_env(pythonpath=[str(BOOTSTRAP)]),
        cwd=tmp_path,
    )
    assert proc.stdout.startswith("searched") and str(tmp_path) not in proc.stdout
