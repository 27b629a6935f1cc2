"""Helpers for the process-seam tests: real child processes, every wait bounded.

Children get an environment with no device settings but the ones a test names, and
with automatic activation on (``NPU_COMPAT_AUTO`` removed) unless the test turns it off.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

from npu_compat.testing._npu_backend import libhccl

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "npu_compat" / "_launcher_site"

#: Variables that change what a child decides or does; removed unless a test sets them.
CLEARED_PREFIXES = (
    "NPU_COMPAT",
    "ASCEND_",
    "TRINITY_DEVICE",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
    "VLLM_PLUGINS",
    "RAY_AUTH_",  # the simulated Ray cluster's pytest fixture sets these for its session
)


def pth_installed() -> bool:
    """Whether npu_compat.pth is in a site directory of this interpreter (nox sessions install it)."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any((Path(d) / "npu_compat.pth").is_file() for d in dirs)


def child_env(
    extra: dict[str, str] | None = None, *, pythonpath: list[str] | None = None, auto: bool = True
) -> dict[str, str]:
    """A child's environment: ``pythonpath`` (default: the checkout) and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] if pythonpath is None else pythonpath)
    if not auto:
        env["NPU_COMPAT_AUTO"] = "0"
    env.update(extra or {})
    return env


def healthy_npu_host(tmp_path: Path) -> dict[str, str]:
    """An NPU host's variables with CANN's environment sourced: a toolkit directory, and on the library path
    a ``libhccl.so`` (the simulated Ascend's, built here, standing in for the toolkit's ``lib64``)."""
    toolkit = tmp_path / "Ascend"
    toolkit.mkdir()
    return {
        "ASCEND_RT_VISIBLE_DEVICES": "0,1",
        "ASCEND_TOOLKIT_HOME": str(toolkit),
        "LD_LIBRARY_PATH": str(libhccl().parent),
    }


def run(
    argv: list[str],
    env: dict[str, str],
    *,
    cwd: Path | str | None = None,
    timeout: float = 60,
    check: bool = True,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        argv, env=env, cwd=str(cwd or REPO), capture_output=True, text=True, timeout=timeout, input=stdin
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{argv[:4]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def py(code: str, env: dict[str, str], **kw: object) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-c", textwrap.dedent(code)], env, **kw)  # type: ignore[arg-type]


def last_json(proc: subprocess.CompletedProcess[str]) -> object:
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"the child printed nothing; stderr:\n{proc.stderr}"
    return json.loads(lines[-1])


#: Printed by a child: how npu-compat reached it.  A start that waits for the first import of a
#: target package (``waited``: its trigger) is finished first, as that import would.
PROBE = """
import json, os, sys
boot = sys.modules.get("_npu_compat_precheck")
waited = getattr(boot, "PENDING", None)
if waited is not None:
    boot.complete()
eng = sys.modules.get("npu_compat._activation")
print(json.dumps({
    "pid": os.getpid(),
    "waited": waited,
    "triggers": list(getattr(boot, "TRIGGERS", [])),
    "started": getattr(boot, "STARTED", None),
    "via": getattr(sys.modules.get("npu_compat._autostart"), "VIA", None),
    "active": bool(eng and eng._state.active),
    "loaded": sorted(m for m in sys.modules if m.startswith("npu_compat")),
    "npu_compat_file": getattr(sys.modules.get("npu_compat"), "__file__", None),
    "finders": [type(f).__name__ for f in sys.meta_path],
    "start_waiting": getattr(boot, "_WAITING", None) in sys.meta_path,
}))
"""


def reports_in(directory: Path) -> list[dict[str, object]]:
    out = []
    for path in sorted(directory.glob("*.json")):
        out.append(json.loads(path.read_text()))
    return out


def report_for(directory: Path, pid: int) -> dict[str, object] | None:
    for rep in reports_in(directory):
        if rep.get("pid") == pid:
            return rep
    return None
