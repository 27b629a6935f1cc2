"""``python -m npu_compat doctor``: what would break a run, with the fix; no patch target imported."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from npu_compat import PatchSpec, _env
from npu_compat.doctor import checks, plan, upstream
from npu_compat.doctor.findings import Diagnosis

from .conftest import child_env, healthy_npu_host, last_json, py, run

DOCTOR = [sys.executable, "-m", "npu_compat", "doctor"]


def test_a_plain_cpu_host_is_fine_and_nothing_is_imported() -> None:
    proc = run(DOCTOR, child_env())
    assert proc.returncode == 0
    assert "device decision: cpu" in proc.stdout
    assert "SGLang, Megatron and `trinity perf`" in proc.stdout
    out = last_json(
        py(
            "import json, sys\nfrom npu_compat.doctor import diagnose\ndiagnose()\n"
            "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))",
            child_env({"NPU_COMPAT_DEVICE": "npu"}),
        )
    )
    for target in ("torch", "ray", "vllm", "trinity", "verl", "wrapt"):
        assert target not in out  # type: ignore[operator]


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        ({"ASCEND_RT_VISIBLE_DEVICES": "1,0"}, ["not in ascending order", "Fix: 0,1"]),
        ({"ASCEND_RT_VISIBLE_DEVICES": "0,,1"}, ["an empty entry"]),
        ({"ASCEND_RT_VISIBLE_DEVICES": "0,x"}, ["'x' is not a device number"]),
        ({"ASCEND_RT_VISIBLE_DEVICES": "0,0"}, ["listed twice"]),
        (
            {
                "NPU_COMPAT_SIMULATE": "1",
                "NPU_COMPAT_SIMULATE_DEVICES": "4",
                "ASCEND_RT_VISIBLE_DEVICES": "2,5,7",
            },
            ["names NPU 5, 7, which this host does not have (it has 0-3: NPU_COMPAT_SIMULATE_DEVICES=4)"],
        ),
        ({"NPU_COMPAT_DEVICE": "npu"}, ["CANN toolkit environment is not sourced", "set_env.sh"]),
        ({"ASCEND_TOOLKIT_HOME": "/nonexistent/Ascend"}, ["is not a directory"]),
        (
            {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "NPU_COMPAT_DEVICE": "npu"},
            ["unset TORCH_DEVICE_BACKEND_AUTOLOAD"],
        ),
        ({"NPU_COMPAT_DEVICE": "gpu"}, ["'gpu' is not a device"]),
        (
            {"NPU_COMPAT_DEVICE": "npu", "HCCL_EXEC_TIMEOUT": "30m"},
            ["HCCL_EXEC_TIMEOUT='30m' is not a whole"],
        ),
        (
            {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1", "ASCEND_RT_VISIBLE_DEVICES": "2,3"},
            [
                "Worker._setup_env_cuda_visible_devices",
                "'Invalid device ID'",
                "Fix: unset RAY_EXPERIMENTAL_NOSET",
            ],
        ),
        (
            {"NPU_COMPAT_DEVICE": "npu", "HCCL_CONNECT_TIMEOUT": "60"},
            ["HCCL_CONNECT_TIMEOUT='60' is not a whole number of seconds from 120 to 7200"],
        ),
        (
            {"NPU_COMPAT_DEVICE": "npu", "HCCL_HOST_SOCKET_PORT_RANGE": "61000-60000"},
            ["'61000-60000' ends before it starts"],
        ),
        (
            {"NPU_COMPAT_DEVICE": "npu", "HCCL_HOST_SOCKET_PORT_RANGE": "60000-60010,60005"},
            ["'60005' overlaps '60000-60010'"],
        ),
        (
            {
                "NPU_COMPAT_DEVICE": "npu",
                "PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:256,expandable_segments:True",
            },
            ["cannot be enabled with `expandable_segments`", "Fix: drop max_split_size_mb"],
        ),
        (
            {
                "NPU_COMPAT_DEVICE": "npu",
                "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True, garbage_collection_threshold:0.6",
            },
            ["PYTORCH_NPU_ALLOC_CONF", "please set `expandable_segments` to `False`"],
        ),
        (
            {"NPU_COMPAT_DEVICE": "npu", "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:true"},
            ["Expected a single True/False argument for expandable_segments"],
        ),
        (
            {"NPU_COMPAT_DEVICE": "npu", "HCCL_NPU_SOCKET_PORT_RANGE": "60000,any"},
            ["'any' is neither a port nor a first-last range of ports", "Fix: auto"],
        ),
    ],
)
def test_what_would_break_a_run_exits_1_with_the_fix(
    env: dict[str, str], fragments: list[str], tmp_path: Path
) -> None:
    proc = run(DOCTOR, child_env(env), check=False)
    assert proc.returncode == 1, proc.stdout
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert errors
    for fragment in fragments:
        assert any(fragment in e for e in errors), (fragment, errors)


def test_a_healthy_simulated_ascend_host_passes(tmp_path: Path) -> None:
    env = child_env(healthy_npu_host(tmp_path) | {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"})
    proc = run([*DOCTOR, "--json"], env, check=False)
    out = json.loads(proc.stdout)
    assert out["decision"]["device"] == "npu"
    assert out["activation"]["effective"]
    assert out["ok"] and proc.returncode == 0, out["findings"]
    assert {c["status"] for c in out["ascend"]} == {"ok"}


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("expandable_segments:True", False),
        ("expandable_segments:False,max_split_size_mb:256", False),
        ("roundup_power2_divisions:[256:1,512:2], expandable_segments:True", False),
        ("expandable_segments:True,garbage_collection_threshold:0", False),
        ("max_split_size_mb:128,expandable_segments:True", True),  # read in any order
        ("expandable_segments : True,garbage_collection_threshold:0.8", True),  # spaces dropped
        ("expandable_segments:true", True),
    ],
)
def test_the_allocator_setting_is_refused_as_torch_npus_parser_refuses_it(value: str, refused: bool) -> None:
    assert (checks.allocator_conf_problem(value) is not None) is refused


def test_a_simulated_host_near_its_memory_is_a_warning_that_names_the_cause() -> None:
    env = {"NPU_COMPAT_SIMULATE": "1", "NPU_COMPAT_SIMULATE_DEVICES": "4"}
    gib = 1 << 30
    near = Diagnosis()
    checks.check_simulated_memory(near, env, memory=(24 * gib, 1 * gib))
    [warning] = [f.message for f in near.findings if f.level == "warning"]
    assert "1.0 GiB of 24.0 GiB left" in warning and "4 NPUs of 64 GiB" in warning
    assert "KV-cache block" in warning and "NPU_COMPAT_SIMULATE_NPU_MEMORY" in warning
    assert near.sections["simulation"] == {
        "npus": 4,
        "npu_memory": 64 * gib,
        "host_total": 24 * gib,
        "host_available": 1 * gib,
    }
    roomy = Diagnosis()
    checks.check_simulated_memory(
        roomy, {**env, "NPU_COMPAT_SIMULATE_NPU_MEMORY": "4GiB"}, (24 * gib, 20 * gib)
    )
    assert roomy.findings == [] and roomy.sections["simulation"]["npu_memory"] == 4 * gib  # type: ignore[index]
    real = Diagnosis()
    checks.check_simulated_memory(real, {})  # not simulated: nothing to say
    assert real.findings == [] and "simulation" not in real.sections
    assert checks.host_memory("/nonexistent/meminfo") is None


def test_an_hccl_library_that_does_not_load_is_an_error_on_npu_naming_the_fix(tmp_path: Path) -> None:
    """vllm-ascend's PyHcclCommunicator disables itself where libhccl.so (or HCCL_SO_PATH) does not load,
    and Trinity's weight sync over it then moves nothing: doctor names the library, the loader's words and
    the fix; with the library on the path it is quiet; on a CPU host it is not checked."""
    npu = healthy_npu_host(tmp_path)
    fine = json.loads(run([*DOCTOR, "--json"], child_env(npu), check=False).stdout)
    assert {"check": "HCCL library", "status": "ok", "detail": "libhccl.so loads"} in fine["ascend"]
    unsourced = json.loads(
        run([*DOCTOR, "--json"], child_env(npu | {"LD_LIBRARY_PATH": ""}), check=False).stdout
    )
    [error] = [f["message"] for f in unsourced["findings"] if "HCCL library" in f["message"]]
    assert not unsourced["ok"] and "'libhccl.so' does not load here" in error and "cannot open" in error
    assert "source CANN's set_env.sh" in error and "would disable itself and move no weight" in error
    wrong = str(tmp_path / "nowhere" / "libhccl.so")
    pointed = json.loads(
        run([*DOCTOR, "--json"], child_env(npu | {"HCCL_SO_PATH": wrong}), check=False).stdout
    )
    [error] = [f["message"] for f in pointed["findings"] if "HCCL library" in f["message"]]
    assert wrong in error and "point HCCL_SO_PATH at CANN's libhccl.so" in error
    cpu = json.loads(run([*DOCTOR, "--json"], child_env({"HCCL_SO_PATH": wrong}), check=False).stdout)
    assert {"check": "HCCL library", "status": "n/a", "detail": "not an NPU decision"} in cpu["ascend"]


def test_an_unset_hccl_exec_timeout_is_a_note_on_npu_naming_trinitys_unbounded_weight_sync(
    tmp_path: Path,
) -> None:
    """Trinity's weight sync over HCCL passes no timeout, so HCCL_EXEC_TIMEOUT is its only bound (the
    weight-sync fault of tests/faults): unset, doctor says so on an NPU host, with the line and the fix;
    set, it is quiet; on a CPU host it says nothing."""
    npu = healthy_npu_host(tmp_path)
    unset = json.loads(run([*DOCTOR, "--json"], child_env(npu), check=False).stdout)
    notes = [f["message"] for f in unset["findings"] if "HCCL_EXEC_TIMEOUT" in f["message"]]
    assert len(notes) == 1 and unset["ok"], unset["findings"]
    assert "waits HCCL's default 1836 s" in notes[0]
    assert (
        "trinity.trainer.verl.workers:TrinityActorRolloutRefWorker.setup_weight_sync_group" in notes[0]
        and "export HCCL_EXEC_TIMEOUT=<seconds>" in notes[0]
    )
    bounded = json.loads(
        run([*DOCTOR, "--json"], child_env(npu | {"HCCL_EXEC_TIMEOUT": "600"}), check=False).stdout
    )
    assert not [f for f in bounded["findings"] if "HCCL_EXEC_TIMEOUT" in f["message"]]
    assert {"check": "HCCL_EXEC_TIMEOUT", "status": "ok", "detail": "600 s"} in bounded["ascend"]
    cpu = run(DOCTOR, child_env(), check=False)
    assert "HCCL_EXEC_TIMEOUT is unset" not in cpu.stdout


def test_hccls_connect_timeout_and_socket_ports_unset_are_notes_on_npu_and_quiet_once_set(
    tmp_path: Path,
) -> None:
    """Field failures only the environment can fix: peers of an HCCL group joining more than
    HCCL_CONNECT_TIMEOUT apart (EI0006), and processes on one NPU or host binding HCCL's default ports
    (EJ0003; Trinity's colocate mode). Unset on an NPU host, doctor names each with its fix; set, it
    is quiet; on a CPU host it says nothing."""
    npu = healthy_npu_host(tmp_path)
    unset = json.loads(run([*DOCTOR, "--json"], child_env(npu), check=False).stdout)
    [connect] = [f["message"] for f in unset["findings"] if "HCCL_CONNECT_TIMEOUT" in f["message"]]
    [ports] = [f["message"] for f in unset["findings"] if "HCCL_HOST_SOCKET_PORT_RANGE" in f["message"]]
    assert unset["ok"], unset["findings"]  # notes, not errors: doctor cannot know the run's layout
    assert "EI0006" in connect and "export HCCL_CONNECT_TIMEOUT=<seconds, 120-7200>" in connect
    assert "EJ0003" in ports and "colocate mode" in ports
    assert "export HCCL_HOST_SOCKET_PORT_RANGE=auto HCCL_NPU_SOCKET_PORT_RANGE=auto" in ports
    chosen = {
        "HCCL_CONNECT_TIMEOUT": "1200",
        "HCCL_HOST_SOCKET_PORT_RANGE": "auto",
        "HCCL_NPU_SOCKET_PORT_RANGE": "61000-61050,62000",
    }
    set_ = json.loads(run([*DOCTOR, "--json"], child_env(npu | chosen), check=False).stdout)
    assert not [
        f for f in set_["findings"] if "HCCL_CONNECT" in f["message"] or "SOCKET_PORT" in f["message"]
    ]
    assert {"check": "HCCL_CONNECT_TIMEOUT", "status": "ok", "detail": "1200 s"} in set_["ascend"]
    assert {"check": "HCCL_NPU_SOCKET_PORT_RANGE", "status": "ok", "detail": "61000-61050,62000"} in set_[
        "ascend"
    ]
    base = json.loads(
        run([*DOCTOR, "--json"], child_env(npu | {"HCCL_IF_BASE_PORT": "60100"}), check=False).stdout
    )
    assert not [f for f in base["findings"] if "SOCKET_PORT" in f["message"]]  # the older scheme, chosen
    cpu = run(DOCTOR, child_env(), check=False)
    assert (
        "HCCL_CONNECT_TIMEOUT is unset" not in cpu.stdout and "SOCKET_PORT_RANGE are unset" not in cpu.stdout
    )


@pytest.mark.parametrize("visible", [None, "0,1"])
def test_ray_leaving_the_visible_devices_alone_is_fine_where_they_are_numbered_from_0(
    visible: str | None,
) -> None:
    env = {"NPU_COMPAT_DEVICE": "npu", "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}
    if visible is not None:
        env["ASCEND_RT_VISIBLE_DEVICES"] = visible
    out = json.loads(run([*DOCTOR, "--json"], child_env(env), check=False).stdout)
    assert not [f for f in out["findings"] if "NOSET" in f["message"]]
    [check] = [c for c in out["ascend"] if c["check"] == "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"]
    assert check["status"] == "ok", check


def test_no_automatic_activation_on_an_npu_host_is_an_error(tmp_path: Path) -> None:
    # python -S: no site, so neither the .pth nor a sitecustomize can run
    toolkit = tmp_path / "Ascend"
    toolkit.mkdir()
    env = child_env({"ASCEND_RT_VISIBLE_DEVICES": "0", "ASCEND_TOOLKIT_HOME": str(toolkit)})
    proc = run([sys.executable, "-S", "-m", "npu_compat", "doctor"], env, check=False)
    assert proc.returncode == 1
    assert "automatic activation does not reach this interpreter" in proc.stdout
    assert "npu-compat ray start --head" in proc.stdout


def _report(pid: int, role: str, statuses: dict[str, str], device: str = "npu") -> dict[str, object]:
    return {
        "schema": 1,
        "pid": pid,
        "host": "node1",
        "role": role,
        "program": "python x.py",
        "activated_by": ".pth",
        "ray": {"mode": "worker", "actor_name": "explorer"} if role == "ray-actor" else None,
        "decision": {"device": device, "source": "auto", "evidence": []},
        "updated": 1.0 + pid,
        "patches": [
            {"id": k, "status": v, "reason": "why not" if v == "failed" else ""} for k, v in statuses.items()
        ],
    }


def test_reports_become_a_process_by_patch_table(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    for rep in (
        _report(11, "ray-driver", {"p.one": "applied", "p.two": "pending"}),
        _report(12, "ray-actor", {"p.one": "applied", "p.two": "failed"}),
        _report(13, "main", {"p.one": "skipped", "p.two": "skipped"}, device="cpu"),
    ):
        (reports / f"node1-{rep['pid']}.json").write_text(json.dumps(rep))
    (reports / ".node1-14.json.1.tmp").write_text("{not json")
    proc = run([*DOCTOR, "--reports", str(reports)], child_env(), check=False)
    assert proc.returncode == 1
    assert "processes (3 reports)" in proc.stdout
    assert "ray-actor explorer" in proc.stdout
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("  p.")}
    assert rows == {"p.one": ["A", "A", "s"], "p.two": [".", "F", "s"]}
    assert "error: pid 12 (ray-actor): patch p.two failed: why not" in proc.stdout
    assert "decided differently (cpu, npu)" in proc.stdout


def test_visible_devices_rules() -> None:
    assert checks.visible_devices_problem("0,1,2,3") is None
    assert checks.visible_devices_problem("4, 5") is None
    assert checks.visible_devices_problem("") is not None
    assert checks.visible_devices_problem("3,1") is not None
    davinci = ([0, 1, 2, 3, 6], "/dev/davinci*")
    assert checks.visible_devices_problem("0,3,6", davinci) is None
    assert "names NPU 4, which this host does not have (it has 0-3, 6: /dev/davinci*)" in str(
        checks.visible_devices_problem("0,4", davinci)
    )


def test_an_unknown_option_exits_2() -> None:
    assert run([*DOCTOR, "--bogus"], child_env(), check=False).returncode == 2


def test_a_distribution_outside_every_range_is_a_warning_not_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plan, "installed_version", lambda dist: "9.0")
    spec = PatchSpec("x.f", "xpkg.mod:f", distribution="xpkg", versions=">=1,<2", why="t", wrapper="a:b")
    d = Diagnosis()
    rows = plan.check_targets(d, (spec,), _env.Decision("npu", "test"))
    assert rows == {"xpkg": "9.0"} and d.sections["targets"][0]["verdict"] == "not covered"  # type: ignore[index]
    assert [f.level for f in d.findings] == ["warning"]
    assert "xpkg 9.0 is outside every range" in d.findings[0].message
    d = Diagnosis()
    plan.check_targets(d, (spec,), _env.Decision("cpu", "test"))
    assert [f.level for f in d.findings] == ["note"]


def _used_home(tmp_path: Path) -> Path:
    """A home directory holding a Ray token file, as an earlier local ``ray.init()`` leaves it."""
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("0" * 64)
    return tmp_path


def _ray_warnings(env: dict[str, str]) -> tuple[int, list[str], dict[str, object]]:
    proc = run([*DOCTOR, "--json"], env, check=False)
    out = json.loads(proc.stdout)
    messages = [f["message"] for f in out["findings"] if "Ray token authentication" in f["message"]]
    levels = [f["level"] for f in out["findings"] if "Ray token authentication" in f["message"]]
    assert set(levels) <= {"warning"}, levels  # never an error: a cluster started elsewhere may be fine
    return proc.returncode, messages, out["ray_auth"]


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="needs the installed Ray (the stack sessions)"
)
def test_a_token_file_with_ray_auth_mode_unset_is_a_warning_with_the_fix(tmp_path: Path) -> None:
    env = child_env({"HOME": str(_used_home(tmp_path))})
    rc, messages, section = _ray_warnings(env)
    assert rc == 0  # a warning: the exit status says nothing would break
    assert section == {"ray": section["ray"], "auth_mode": None, "token": "~/.ray/auth_token",
                       "start_enables_token": True}  # fmt: skip
    assert len(messages) == 1, messages
    for fragment in ("`ray start --head` will turn token authentication on", "`ray status`",
                     "trinity run", "RAY_AUTH_MODE=token for `ray start` and for `trinity run`"):  # fmt: skip
        assert fragment in messages[0], fragment
    text = run(DOCTOR, env, check=False).stdout
    assert "warning: Ray token authentication" in text
    assert "`ray start --head` turns it on when a token exists" in text
    # the token file is only looked for, never read out: the doctor's output does not hold it
    assert "0" * 64 not in text
    # RAY_AUTH_TOKEN_PATH and RAY_AUTH_TOKEN are tokens too
    token_file = tmp_path / "elsewhere"
    token_file.write_text("1" * 64)
    for extra in ({"RAY_AUTH_TOKEN_PATH": str(token_file)}, {"RAY_AUTH_TOKEN": "1" * 64}):
        _, messages, _ = _ray_warnings(child_env({"HOME": str(tmp_path / "empty"), **extra}))
        assert len(messages) == 1, (extra, messages)


@pytest.mark.parametrize(
    "extra",
    [
        {"RAY_AUTH_MODE": "token"},
        {"RAY_AUTH_MODE": "disabled"},
        {"RAY_AUTH_TOKEN_PATH": "/nonexistent/token"},
    ],
)
def test_no_ray_warning_where_both_sides_agree_or_no_token_exists(
    tmp_path: Path, extra: dict[str, str]
) -> None:
    _, messages, section = _ray_warnings(child_env({"HOME": str(_used_home(tmp_path)), **extra}))
    assert messages == [], messages
    _, messages, _ = _ray_warnings(child_env({"HOME": str(tmp_path / "empty")}))
    assert messages == [] and section["auth_mode"] == extra.get("RAY_AUTH_MODE")


def _dist(root: Path, name: str, version: str, files: dict[str, str]) -> None:
    """An installed distribution as ``importlib.metadata`` finds it: its files, and a RECORD naming them."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    for f, text in files.items():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(text)


_VIEW = "npu_compat.patches.torch_view:torch_for_npu"


def _x(id: str, target: str, versions: str = ">=1,<2", **kw: str) -> PatchSpec:
    kw = kw or {"wrapper": "a:b"}
    return PatchSpec(id, target, distribution="xpkg", versions=versions, why="t", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("source", "warned", "nothing_because"),
    [
        # what the patches change is there: no patch supports this version of it
        (
            "import torch\n\nclass Worker:\n    def run(self):\n        torch.cuda.synchronize()\n",
            {"xpkg.mod:torch", "xpkg.mod:Worker.run"},
            {},
        ),
        # the layout moved on: the view has no torch.cuda to redirect, and the class is gone
        (
            "try:\n    import torch\nexcept ImportError:\n    torch = None\n\ndef run():\n    return torch.ones(1)\n",
            set(),
            {"x.view": "its xpkg.mod never uses torch.cuda", "x.cls": "its xpkg.mod has no Worker"},
        ),
        # no torch bound at all; a star import, or globals(), hides which names the module has: the class
        # may be there
        ("from elsewhere import *\n", {"xpkg.mod:Worker.run"}, {"x.view": "never uses torch.cuda"}),
        (
            "globals()['Worker'] = type('Worker', (), {})\n",
            {"xpkg.mod:Worker.run"},
            {"x.view": "never uses torch.cuda"},
        ),
    ],
)
def test_a_version_outside_a_patchs_range_is_reported_only_where_it_holds_what_the_patch_changes(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    source: str,
    warned: set[str],
    nothing_because: dict[str, str],
) -> None:
    _dist(tmp_path, "xpkg", "9.0", {"xpkg/__init__.py": "", "xpkg/now.py": "", "xpkg/mod.py": source})
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = (
        # this version is supported: its other patches are checked one by one
        _x("x.now", "xpkg.now:f", ">=9,<10"),
        _x("x.view", "xpkg.mod:torch", replacement=_VIEW),
        _x("x.cls", "xpkg.mod:Worker.run"),
        _x("x.gone", "xpkg.old:f"),
    )
    d = Diagnosis()
    decision = _env.Decision("npu", "test")
    installed = plan.check_targets(d, specs, decision, served=())
    plan.check_plans(d, specs, installed, decision, {})
    assert installed == {"xpkg": "9.0"} and d.ok
    found = {f.message.split(" for ")[1].split(" ")[0] for f in d.findings if f.level == "warning"}
    assert found == warned, d.findings
    plans = {p["id"]: p for p in d.sections["plans"]}  # type: ignore[attr-defined]
    assert plans["x.now"]["plan"] == "would apply"
    assert "xpkg 9.0 does not ship xpkg.old: nothing to patch" in plans["x.gone"]["why"]
    for pid, because in nothing_because.items():
        assert f"{because}: nothing to patch" in plans[pid]["why"], plans[pid]
    for pid in ("x.view", "x.cls"):
        assert ("nothing to patch" in plans[pid]["why"]) == (pid in nothing_because), plans[pid]


@pytest.mark.parametrize(
    ("gone", "fix_versions", "problem"),
    [
        # confirmed here: the version is served, nothing to report
        (("xpkg.old",), ">=2,<3", None),
        # what the declaration says is gone is there
        (("xpkg.mod",), ">=2,<3", "xpkg 9.0 ships xpkg.mod"),
        # the serving patch does not apply to the installed ypkg
        (("xpkg.old",), ">=3,<4", "y.fix needs ypkg>=3,<4 (installed: 2.0)"),
    ],
)
def test_a_distribution_outside_every_range_is_served_elsewhere_only_where_this_environment_confirms_it(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    gone: tuple[str, ...],
    fix_versions: str,
    problem: str | None,
) -> None:
    _dist(tmp_path, "xpkg", "9.0", {"xpkg/__init__.py": "", "xpkg/mod.py": "import torch\n"})
    _dist(tmp_path, "ypkg", "2.0", {"ypkg/__init__.py": "", "ypkg/m.py": ""})
    monkeypatch.syspath_prepend(str(tmp_path))
    fix = PatchSpec("y.fix", "ypkg.m:g", distribution="ypkg", versions=fix_versions, why="t", wrapper="a:b")
    specs = (_x("x.old", "xpkg.old:f"), fix)
    served = (
        upstream.ServedElsewhere("xpkg", ">=9,<10", gone, ("y.fix",), "xpkg 9 has no old; y.fix serves it"),
    )
    d = Diagnosis()
    plan.check_targets(d, specs, _env.Decision("npu", "test"), served=served)
    row = next(r for r in d.sections["targets"] if r["distribution"] == "xpkg")  # type: ignore[attr-defined]
    if problem is None:
        assert d.findings == []
        assert row == {"distribution": "xpkg", "installed": "9.0", "ranges": [">=1,<2"],
                       "verdict": "no patch needed", "served_by": ["y.fix"], "how": served[0].how}  # fmt: skip
        return
    assert row["verdict"] == "not covered"
    about_x = [f for f in d.findings if f.message.startswith("xpkg ")]  # (ypkg 2.0 may be outside too)
    assert [f.level for f in about_x] == ["warning"]
    message = about_x[0].message
    assert message.startswith("xpkg 9.0 is outside every range npu-compat patches (>=1,<2)"), message
    assert problem in message and "xpkg 9 has no old" in message, message


def test_with_nothing_declared_a_distribution_whose_patch_targets_are_all_gone_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _dist(tmp_path, "xpkg", "9.0", {"xpkg/__init__.py": "", "xpkg/mod.py": "def run():\n    pass\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    d = Diagnosis()
    specs = (_x("x.old", "xpkg.old:f"), _x("x.cls", "xpkg.mod:Worker.run"))
    plan.check_targets(d, specs, _env.Decision("cpu", "test"), served=())
    assert [f.level for f in d.findings] == ["note"]
    assert (
        "nothing any of them changes is in it (its xpkg.mod has no Worker; xpkg 9.0 does not ship xpkg.old)"
        in d.findings[0].message
    )


def test_a_wrong_value_or_a_misspelt_name_of_ours_is_a_warning_that_names_it() -> None:
    env = child_env({"NPU_COMPAT_SIMULATE_DEVICES": "two", "NPU_COMPAT_STRICKT": "1"})
    proc = run(DOCTOR, env)
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert (
        "warning: NPU_COMPAT_SIMULATE_DEVICES='two': give the number of simulated NPUs, a whole number of at least 1"
        in warnings
    )
    assert any("NPU_COMPAT_STRICKT is not a variable" in w and "NPU_COMPAT_STRICT?" in w for w in warnings), (
        warnings
    )


def test_the_timeline_orders_a_runs_processes_by_start_and_draws_them(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    base = 1_800_000_000.0
    marks = {  # pid: (ppid, role, started, activated, role known, updated)
        21: (1, "ray-driver", 0.0, 0.4, 2.0, 30.0),
        23: (21, "ray-actor", 9.5, 11.0, 12.5, 40.0),
        22: (21, "main", 5.0, 5.2, None, 6.0),
    }
    for pid, (ppid, role, started, activated, known, updated) in marks.items():
        rep = _report(pid, role, {"p.one": "applied"})
        times = {"started": base + started, "activated": base + activated}
        if known is not None:
            times["role"] = base + known
        rep.update(ppid=ppid, times=times, updated=base + updated)
        (reports / f"node1-{pid}.json").write_text(json.dumps(rep))
    # the actor's import log: its imports are done at the last look before its role (12.5)
    log = [(10.0, ["a", "b"]), (12.0, ["c"]), (20.0, ["d"])]
    (reports / "node1-23.imports.jsonl").write_text(
        "".join(json.dumps({"t": base + t, "new": new}) + "\n" for t, new in log) + '{"t": 1'  # cut by a kill
    )
    svg = tmp_path / "timeline.svg"
    proc = run(
        [*DOCTOR, "--reports", str(reports), "--timeline", "--svg", str(svg)], child_env(), check=False
    )
    lines = proc.stdout.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("timeline (3 processes")))
    rows = [x.split() for x in lines[at + 2 : at + 5]]
    assert [r[6] for r in rows] == ["21", "22", "23"]  # by start
    assert rows[0][1:9] == ["0.00", "+0.40", "-", "+2.00", "+30.00", "21", "-", "-"]
    # 22's parent is the timeline's first process, and it started after the driver was ready (its role at 2.0)
    assert rows[1][1:9] == ["5.00", "+0.20", "-", "-", "+1.00", "22", "#1", "#1"]
    # 23 started after 22 was ready (activated at 5.2, no role, no import log): the last ready before 9.5
    assert rows[2][1:9] == ["9.50", "+1.50", "+2.50", "+3.00", "+30.50", "23", "#1", "#2"]
    assert "last change at 40.00 s" in proc.stdout
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg.read_text())
    bars = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.get("fill") == "#4a7ebb"]
    assert len(bars) == 3
    importing = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.get("fill") == "#8fb0d9"]
    assert len(importing) == 1 and "3 modules" in svg.read_text()
    assert "23 ray-actor" in svg.read_text()


def test_the_timeline_needs_a_runs_reports() -> None:
    proc = run([*DOCTOR, "--timeline"], child_env(), check=False)
    assert proc.returncode == 2 and "give --reports DIR" in proc.stderr
