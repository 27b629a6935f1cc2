"""Shared by the tests of the simulated NPU's compute: the skip without a toolchain, and one build."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from npu_compat.testing import simulation_env
from npu_compat.testing._npu_backend import missing_tools
from tests.conftest import SIM_PATH, clean_env, last_json, run_py

MISSING = missing_tools()

#: Skips a test of npu compute where the backend cannot be built, naming what is missing.
needs_backend = pytest.mark.skipif(MISSING is not None, reason=f"the simulated npu backend needs {MISSING}")


def sim_env(devices: int = 2, **extra: str) -> dict[str, str]:
    """The simulation's variables for a child with ``devices`` NPUs (``run_py`` adds the rest)."""
    env = {k: v for k, v in simulation_env(devices, {}).items() if k != "PYTHONPATH"}
    env.update(extra)
    return env


def child_env(devices: int = 2, **extra: str) -> dict[str, str]:
    """A whole environment for a ``subprocess.Popen`` child: the simulation, stand-ins on PYTHONPATH."""
    return clean_env(sim_env(devices, **extra), SIM_PATH)


def sim_run(
    code: str, timeout: float = 240, devices: int = 2, check: bool = True, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` on a simulated Ascend (``run_py``: with ``check``, a failed child fails the test)."""
    return run_py(code, env=sim_env(devices, **extra), pythonpath=SIM_PATH, timeout=timeout, check=check)


def sim_json(code: str, timeout: float = 240, devices: int = 2, **extra: str) -> Any:
    """Run ``code`` on a simulated Ascend; what it printed last, as JSON."""
    return last_json(sim_run(code, timeout, devices, **extra))


#: A port vLLM picked (bound and released) that another process took before vLLM bound it again:
#: vLLM's own race (``get_open_port``), which the stack sessions' second worker can meet.
_PORT_TAKEN = ("EADDRINUSE", "Address already in use")


def engine_failure(output: str) -> str:
    """The root cause of a failed vLLM engine child, for the first line of the failure: vLLM's
    executor only says "WorkerProc initialization failed ... See stack trace for root cause", which
    its worker process printed earlier (and a log's tail cuts off)."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if "WorkerProc failed to start" in line or "WorkerProc failed." in line:
            tail = [x for x in lines[i + 1 : i + 80] if "(Worker" in x or "Worker_" in x]
            errors = [x for x in tail if "Error" in x or "Exception" in x]
            return (errors[-1] if errors else line).strip()
    errors = [
        x
        for x in lines
        if x.lstrip().startswith(("RuntimeError", "ValueError", "Exception", "AssertionError"))
    ]
    return errors[0].strip() if errors else "no error line in the child's output"


def vllm_engine_run(code: str, timeout: float = 900, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run a script that drives vLLM's engine on a simulated Ascend (the stand-in ``vllm_ascend``, NZ
    off, and ``extra``).  A failure names its root cause first; one retry, said so, only where a port
    vLLM picked was taken before it bound it."""
    env = sim_env(VLLM_ASCEND_ENABLE_NZ="0", **extra)
    for attempt in (1, 2):
        proc = run_py(code, env=env, pythonpath=SIM_PATH, timeout=timeout, check=False)
        if proc.returncode == 0:
            return proc
        output = proc.stdout + proc.stderr
        if attempt == 1 and any(p in output for p in _PORT_TAKEN):
            print(f"vLLM's port was taken before it bound it ({engine_failure(output)}): once more")
            continue
        break
    raise AssertionError(
        f"the vLLM engine child failed ({proc.returncode}): {engine_failure(output)}\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )


def vllm_engine_json(code: str, timeout: float = 900) -> Any:
    """Run a script that drives vLLM's engine on a simulated Ascend (``collective_rpc`` of test
    functions allowed); the last JSON object it printed."""
    proc = vllm_engine_run(code, timeout, VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="session")
def npu_backend_built() -> None:
    """Build the backend once (minutes when cold) before the tests that time out sooner."""
    if MISSING is not None:
        pytest.skip(f"the simulated npu backend needs {MISSING}")
    code = "import torch; from npu_compat.testing import _torch_sim as s; assert s.NATIVE is not None"
    sim_run(code, timeout=900)
