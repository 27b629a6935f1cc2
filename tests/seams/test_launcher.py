"""The launcher: ``python -m npu_compat [options] [--] COMMAND`` becomes COMMAND (same PID, no shell)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from npu_compat import _launcher

from .conftest import BOOTSTRAP, PROBE, REPO, child_env, last_json, report_for, run

LAUNCH = [sys.executable, "-m", "npu_compat"]


def test_exit_codes_pass_through() -> None:
    for code in (0, 1, 7, 42):
        proc = run([*LAUNCH, sys.executable, "-c", f"raise SystemExit({code})"], child_env(), check=False)
        assert proc.returncode == code


def test_the_launcher_becomes_the_command_same_pid_and_signals_pass_through() -> None:
    proc = subprocess.Popen(
        [
            *LAUNCH,
            sys.executable,
            "-c",
            "import os, signal, sys; print(os.getpid(), flush=True); sys.stdin.read()",
        ],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        assert pid == proc.pid  # no wrapper process in between
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_command_killed_by_a_signal_ends_the_launcher_with_that_signal() -> None:
    proc = run(
        [*LAUNCH, "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
        child_env(),
        check=False,
    )
    assert proc.returncode == -signal.SIGTERM


def test_stdin_and_stdout_are_the_commands() -> None:
    proc = run(
        [*LAUNCH, sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"],
        child_env(),
        stdin="hello",
    )
    assert proc.stdout.strip() == "HELLO"


def test_no_shell_is_involved(tmp_path: Path) -> None:
    proc = run(
        [*LAUNCH, sys.executable, "-c", "import sys; print(sys.argv[1:])", "$HOME", "a b", "*"], child_env()
    )
    assert proc.stdout.strip() == repr(["$HOME", "a b", "*"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no command given"),
        (["--strict"], "no command given"),
        (["--bogus", "python"], "unknown option '--bogus'"),
        (["--device", "gpu", "python"], "--device 'gpu' is not a device"),
        (["--device"], "--device needs a value"),
        (["no-such-command-npu-compat"], "cannot run 'no-such-command-npu-compat': not found"),
    ],
)
def test_usage_errors_exit_2_and_say_what_to_do(argv: list[str], message: str) -> None:
    proc = run([*LAUNCH, *argv], child_env(), check=False)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_help_exits_0() -> None:
    proc = run([*LAUNCH, "--help"], child_env())
    assert "npu-compat [--device" in proc.stdout


def test_options_are_exported_and_the_bootstrap_goes_first(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    code = (
        "import json, os, sys; print(json.dumps({k: v for k, v in os.environ.items() "
        "if k.startswith('NPU_COMPAT') or k == 'PYTHONPATH'}))"
    )
    out = last_json(
        run(
            [
                *LAUNCH,
                "--device=npu",
                "--strict",
                "--report-dir",
                "reports",
                "--",
                sys.executable,
                "-c",
                code,
            ],
            child_env({"NPU_COMPAT_AUTO": "0"}, pythonpath=["/somewhere", str(BOOTSTRAP), str(REPO)]),
            cwd=tmp_path,
        )
    )
    assert out["NPU_COMPAT_DEVICE"] == "npu"  # type: ignore[index]
    assert out["NPU_COMPAT_STRICT"] == "1"  # type: ignore[index]
    assert out["NPU_COMPAT_REPORT_DIR"] == str(reports)  # type: ignore[index]  # absolute
    assert "NPU_COMPAT_AUTO" not in out  # type: ignore[operator]
    entries = out["PYTHONPATH"].split(os.pathsep)  # type: ignore[index]
    assert entries[0] == str(BOOTSTRAP) and entries.count(str(BOOTSTRAP)) == 1
    assert "/somewhere" in entries
    assert reports.is_dir()


def test_subcommand_names_after_double_dash_are_commands(tmp_path: Path) -> None:
    (tmp_path / "report").write_text("#!/bin/sh\necho i-am-the-report-command\n")
    (tmp_path / "report").chmod(0o755)
    env = child_env({"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    assert run([*LAUNCH, "--", "report"], env).stdout.strip() == "i-am-the-report-command"
    assert "device:" in run([*LAUNCH, "report"], env).stdout


def test_the_command_and_its_python_children_are_activated(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    code = PROBE + (
        "import subprocess\n"
        "sub = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)\n"
        "print(sub.stdout.strip())\n"
    )
    proc = run(
        [*LAUNCH, "--device", "npu", "--report-dir", str(reports), sys.executable, "-c", code],
        child_env(pythonpath=[]),  # npu_compat is found through the launcher's PYTHONPATH alone
    )
    lines = proc.stdout.splitlines()
    import json

    out, sub_pid = json.loads(lines[-2]), int(lines[-1])
    assert out["active"] and out["started"] in {"launcher", ".pth"}
    for pid in (out["pid"], sub_pid):
        rep = report_for(reports, pid)
        assert rep is not None, f"no report for pid {pid} in {sorted(p.name for p in reports.iterdir())}"
        assert rep["decision"]["device"] == "npu"  # type: ignore[index]


def test_parse_keeps_the_commands_own_options() -> None:
    options, command = _launcher.parse(["--device", "cpu", "python", "-m", "x", "--device", "npu", "--", "y"])
    assert options.device == "cpu"
    assert command == ["python", "-m", "x", "--device", "npu", "--", "y"]


def test_a_checkout_puts_its_root_after_the_bootstrap() -> None:
    env = _launcher.command_env(_launcher.Options(), {"PYTHONPATH": ""})
    entries = env["PYTHONPATH"].split(os.pathsep)
    assert entries[0] == _launcher.SITE_DIR
    root = os.path.dirname(os.path.dirname(_launcher.SITE_DIR))
    assert (root in entries) == (not _launcher._is_site_dir(root))
    assert "" not in entries
