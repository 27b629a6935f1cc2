"""Per-process report files: written at activation, rewritten when a patch changes status, atomic, no secrets."""

from __future__ import annotations

import json
from pathlib import Path

from npu_compat import _reportfile
from tests.conftest import make_synth

from .conftest import child_env, last_json, py, report_for, reports_in


def test_a_report_follows_each_patch_status_change(tmp_path: Path) -> None:
    synth = make_synth(tmp_path / "site")
    reports = tmp_path / "reports"
    out = last_json(
        py(
            f"""
            import time
            began = time.time()
            import json, os, pathlib
            import npu_compat
            from synthspecs import SPECS
            npu_compat.activate(specs=SPECS)
            path = pathlib.Path({str(reports)!r}) / f"{{os.uname().nodename}}-{{os.getpid()}}.json"
            before = json.loads(path.read_text())
            import synthpkg.target
            after = json.loads(path.read_text())
            print(json.dumps({{"before": before, "after": after, "pid": os.getpid(), "began": began}}))
            """,
            child_env(
                {"NPU_COMPAT_DEVICE": "npu", "NPU_COMPAT_REPORT_DIR": str(reports), "MY_API_TOKEN": "s3cret"},
                pythonpath=[str(synth), str(Path(__file__).resolve().parents[2])],
                auto=False,
            ),
        )
    )
    before, after = out["before"], out["after"]  # type: ignore[index]
    assert before["pid"] == out["pid"] and before["activated_by"] == "activate()"  # type: ignore[index]
    assert {p["status"] for p in before["patches"]} == {"pending"}
    assert {p["status"] for p in after["patches"]} == {"applied"}
    assert after["decision"] == {"device": "npu", "source": "NPU_COMPAT_DEVICE=npu", "evidence": []}
    assert after["counts"] == {"applied": len(after["patches"])}
    assert after["updated"] >= before["updated"]
    # the timeline's marks: the process's start (from /proc), then activation, within the child's life
    times = after["times"]
    assert set(times) == {"started", "activated"}, times
    began = out["began"]  # the child's first line: its start is before, by its interpreter's start-up
    assert began - 30 <= times["started"] <= began + 0.05, (began, times)  # type: ignore[operator]
    assert times["started"] <= times["activated"] <= after["updated"]
    text = (reports / Path(next(iter(reports.glob("*.json")))).name).read_text()
    assert "s3cret" not in text and "MY_API_TOKEN" not in text
    assert set(after["environment"]) == {"NPU_COMPAT_AUTO", "NPU_COMPAT_DEVICE", "NPU_COMPAT_REPORT_DIR"}
    assert not list(reports.glob(".*"))  # no temporary file left behind


def test_every_bootstrapped_process_writes_one_even_on_cpu(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    out = last_json(
        py(
            "import json, os; print(json.dumps(os.getpid()))",
            child_env({"NPU_COMPAT_REPORT_DIR": str(reports)}),
        )
    )
    rep = report_for(reports, int(out))  # type: ignore[arg-type]
    assert rep is not None
    assert rep["decision"]["device"] == "cpu"  # type: ignore[index]
    assert rep["program"].endswith(" -c")  # type: ignore[union-attr]
    assert rep["role"] == "main"
    assert len(reports_in(reports)) == 1


def test_off_means_no_report(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    py(
        "pass",
        child_env({"NPU_COMPAT_REPORT_DIR": str(reports), "NPU_COMPAT": "0", "NPU_COMPAT_DEVICE": "npu"}),
    )
    assert not reports.exists() or not list(reports.iterdir())


def test_environment_keeps_only_our_and_device_variables() -> None:
    env = {
        "NPU_COMPAT_DEVICE": "npu",
        "ASCEND_RT_VISIBLE_DEVICES": "0,1",
        "ASCEND_TOOLKIT_HOME": "/usr/local/Ascend",
        "AWS_SECRET_ACCESS_KEY": "x",
        "HF_TOKEN": "y",
        "PATH": "/bin",
    }
    assert _reportfile.environment(env) == {
        "ASCEND_RT_VISIBLE_DEVICES": "0,1",
        "ASCEND_TOOLKIT_HOME": "/usr/local/Ascend",
        "NPU_COMPAT_DEVICE": "npu",
    }


def test_program_names_the_program_never_its_arguments() -> None:
    assert (
        _reportfile.program(["/v/bin/python", "-u", "-m", "trinity.cli", "run", "--api-key", "k"])
        == "python -m trinity.cli"
    )
    assert _reportfile.program(["/v/bin/python", "/x/train.py", "--password=p"]) == "python train.py"
    assert _reportfile.program(["/v/bin/python", "-c", "secret()"]) == "python -c"
    assert (
        _reportfile.program(["/v/bin/python", "-X", "importtime", "-W", "error", "t.py", "x"])
        == "python t.py"
    )
    assert (
        _reportfile.program(["/v/bin/python", "/v/bin/ray", "start", "--redis-password", "p"]) == "python ray"
    )


def test_a_report_is_valid_json_at_every_moment(tmp_path: Path) -> None:
    # writers race; a reader never sees a partial file (temporary file + os.replace)
    reports = tmp_path / "reports"
    code = f"""
        import os, threading, json
        os.environ["NPU_COMPAT_REPORT_DIR"] = {str(reports)!r}
        from npu_compat import _reportfile
        _reportfile.attach()
        def spin(i):
            for n in range(100):
                _reportfile.set_role(f"role-{{i}}-{{n}}")
        ts = [threading.Thread(target=spin, args=(i,)) for i in range(4)]
        [t.start() for t in ts]
        seen = 0
        path = _reportfile.path()
        while any(t.is_alive() for t in ts):
            json.loads(open(path).read()); seen += 1
        [t.join() for t in ts]
        print(json.dumps(seen))
        """
    assert int(last_json(py(code, child_env(auto=False)))) > 0  # type: ignore[arg-type]
    # no temporary file left behind: the report and its import log (written by the report's watcher)
    report = next(reports.glob("*.json"))
    assert sorted(p.name for p in reports.iterdir()) == [
        report.name.replace(".json", ".imports.jsonl"),
        report.name,
    ]


def test_report_dir_that_cannot_be_written_is_one_warning(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = py(
        "import npu_compat; npu_compat.activate(); print('alive')",
        child_env({"NPU_COMPAT_DEVICE": "npu", "NPU_COMPAT_REPORT_DIR": str(blocker / "sub")}, auto=False),
    )
    assert proc.stdout.strip() == "alive"
    assert proc.stderr.count("cannot write the report file") == 1


def test_build_is_json_serialisable_in_process() -> None:
    json.dumps(_reportfile.build())


def test_a_vllm_process_that_connects_to_ray_stays_a_vllm_process(tmp_path: Path) -> None:
    # vLLM's engine process is named by its plugin; when Trinity's code there calls ray.init() (a Ray
    # client, a "driver" to Ray), the report keeps the vLLM role; a plain driver still becomes one
    reports = tmp_path / "reports"
    code = f"""
        import os, json
        os.environ["NPU_COMPAT_REPORT_DIR"] = {str(reports)!r}
        from npu_compat import _reportfile
        _reportfile.attach()
        _reportfile.set_role("vllm (EngineCore_DP0)")
        _reportfile.set_role("ray-driver", keep=True)
        named = json.load(open(_reportfile.path()))["role"]
        _reportfile._role = None
        _reportfile.set_role("ray-driver", keep=True)
        print(json.dumps([named, json.load(open(_reportfile.path()))["role"]]))
        """
    assert last_json(py(code, child_env(auto=False))) == ["vllm (EngineCore_DP0)", "ray-driver"]


def test_a_forked_child_reports_its_own_start_not_its_parents(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    out = last_json(
        py(
            """
            import json, os, time
            import npu_compat
            from npu_compat import _reportfile
            npu_compat.activate()
            parent = _reportfile.build()["times"]
            time.sleep(0.3)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                _reportfile.set_role("forked-child")
                os.write(write, json.dumps(_reportfile.build()["times"]).encode())
                os._exit(0)
            os.waitpid(pid, 0)
            print(json.dumps({"parent": parent, "child": json.loads(os.read(read, 4096))}))
            """,
            child_env({"NPU_COMPAT_DEVICE": "npu", "NPU_COMPAT_REPORT_DIR": str(reports)}),
        )
    )
    parent, child = out["parent"], out["child"]  # type: ignore[index]
    assert child["started"] >= parent["started"] + 0.25, out
    assert child["started"] <= child["activated"] + 0.02 and child["activated"] <= child["role"], out
