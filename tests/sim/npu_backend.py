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


def vllm_engine_json(code: str, timeout: float = 900) -> Any:
    """Run a script that drives vLLM's engine on a simulated Ascend (the stand-in ``vllm_ascend``, NZ off,
    ``collective_rpc`` of test functions allowed); the last JSON object it printed."""
    proc = run_py(
        code,
        env=sim_env(VLLM_ASCEND_ENABLE_NZ="0", VLLM_ALLOW_INSECURE_SERIALIZATION="1"),
        pythonpath=SIM_PATH,
        timeout=timeout,
    )
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
