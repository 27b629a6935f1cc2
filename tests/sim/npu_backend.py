"""Shared by the tests of the simulated NPU's compute: the skip without a toolchain, and one build."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from npu_compat.testing import simulation_env
from npu_compat.testing._npu_backend import missing_tools
from npu_compat.testing._sites import sites
from tests.conftest import clean_env, free_port, last_json, run_py

MISSING = missing_tools()

#: Skips a test of npu compute where the backend cannot be built, naming what is missing.
needs_backend = pytest.mark.skipif(MISSING is not None, reason=f"the simulated npu backend needs {MISSING}")


def sim_env(devices: int = 2, **extra: str) -> dict[str, str]:
    """The simulation's variables for a child with ``devices`` NPUs (``run_py`` adds the rest)."""
    env = {k: v for k, v in simulation_env(devices, {}).items() if k != "PYTHONPATH"}
    env.update(extra)
    return env


def sim_path(env: dict[str, str]) -> list[str]:
    """The directories a child with ``env``'s choices puts first on its path (``_sites.sites``)."""
    return [str(p) for p in sites(env)]


def child_env(devices: int = 2, **extra: str) -> dict[str, str]:
    """A whole environment for a ``subprocess.Popen`` child: the simulation, its sites on PYTHONPATH."""
    env = sim_env(devices, **extra)
    return clean_env(env, sim_path(env))


def sim_run(
    code: str, timeout: float = 240, devices: int = 2, check: bool = True, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` on a simulated Ascend (``run_py``: with ``check``, a failed child fails the test)."""
    env = sim_env(devices, **extra)
    return run_py(code, env=env, pythonpath=sim_path(env), timeout=timeout, check=check)


def sim_json(code: str, timeout: float = 240, devices: int = 2, **extra: str) -> Any:
    """Run ``code`` on a simulated Ascend; what it printed last, as JSON."""
    return last_json(sim_run(code, timeout, devices, **extra))


#: The port the child was given, bound by another process before the child's worker bound it: rare
#: now that it is drawn outside the ephemeral range (``free_port``), but not impossible.
_PORT_TAKEN = ("EADDRINUSE", "Address already in use")


#: What a process that died without a Python exception leaves in the output (with faulthandler on).
_DEATHS = ("Fatal Python error", "died unexpectedly", "Killed", "Segmentation fault", "Bus error")


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
    # a worker that died without a Python exception: a signal (faulthandler names it), the kernel
    deaths = [x for x in lines if any(d in x for d in _DEATHS)]
    if deaths:
        return deaths[0].strip()
    errors = [
        x
        for x in lines
        if x.lstrip().startswith(("RuntimeError", "ValueError", "Exception", "AssertionError"))
    ]
    return errors[0].strip() if errors else "no error line in the child's output"


def vllm_engine_run(code: str, timeout: float = 900, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run a script that drives vLLM's engine on a simulated Ascend (the released vllm-ascend, NZ off, and
    ``extra``).  A failure names its root cause first; one retry, said so, only where a port vLLM picked was
    taken before it bound it."""
    for attempt in (1, 2):
        # spawn: vLLM forks its engine core and workers by default (it forces spawn only in a Ray actor,
        # as Trinity's rollout is, or once CUDA is initialised); a fork after torch's thread pool has
        # started fails now and then in the child's torch.set_num_threads -- "pool INTERNAL ASSERT
        # FAILED ... Invalid thread pool!" (CI, stack-a) -- on a real Ascend host as here.
        # faulthandler: a worker killed by a signal prints where it was, not nothing.  VLLM_PORT: the
        # executor's store port comes from outside the kernel's ephemeral range (``free_port``), which
        # the other test worker's connections draw from in the half minute before the worker binds it.
        env = sim_env(
            VLLM_ASCEND_ENABLE_NZ="0",
            VLLM_WORKER_MULTIPROC_METHOD="spawn",
            PYTHONFAULTHANDLER="1",
            VLLM_PORT=str(free_port()),
            **extra,
        )
        proc = run_py(code, env=env, pythonpath=sim_path(env), timeout=timeout, check=False)
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
