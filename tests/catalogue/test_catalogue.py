"""The break catalogue: real upstream code under the simulated Ascend, without and with npu-compat.

For each row of docs/break-map.md with a catalogue probe that applies to the installed stack:

* ``test_red``   -- stock upstream fails the way a user would see it (an assert, "Torch
  not compiled with CUDA enabled", a placement group still pending after a bounded wait);
* ``test_green`` -- its twin: the same probe with npu-compat active must succeed;
* ``test_cuda_decision_changes_nothing`` -- with npu-compat activated on a CUDA decision the
  outcome is exactly the stock one.

Each mode runs every probe of the stack in one fresh interpreter (see ``probes.py``), the three side by side.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest

from npu_compat.testing import simulation_env
from tests.catalogue.rows import Row, applicable
from tests.conftest import REPO, SIM_PATH, clean_env, upstream_versions

#: exercises verl: stack-b (stack-a with another verl) runs it; its probe runs, each a Ray driver
#: with its actors, run with no other test beside them (noxfile)
pytestmark = [pytest.mark.uses_verl, pytest.mark.many_processes]

TRINITY, VERL = upstream_versions("trinity-rft", "verl")

ROWS = applicable(TRINITY, VERL)
# "stock" switches npu-compat off explicitly: an installed npu-compat auto-activates in every
# interpreter (sitecustomize / .pth), and stock means upstream exactly as released.
MODES = {
    "stock": ([], {"NPU_COMPAT": "0"}),
    "npu-compat": (["--activate"], {}),
    "cuda": (["--activate"], {"NPU_COMPAT_DEVICE": "cuda"}),
}


@pytest.fixture(scope="session")
def outcomes(npu_ray_cluster: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Each mode's outcomes.  The three interpreters run side by side on the one cluster: most of a probe
    run is imports and bounded waits, and only npu-compat's asks for NPUs (stock's GPU requests pend)."""
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        runs = {}
        for mode, (args, extra) in MODES.items():
            env = clean_env(simulation_env(2, {}), SIM_PATH)
            env.update(extra, RAY_ADDRESS=npu_ray_cluster.address)
            out = stack.enter_context(tempfile.TemporaryFile("w+"))
            argv = [sys.executable, "-m", "tests.catalogue.probes", *args, *(r.probe for r in ROWS)]
            proc = subprocess.Popen(
                argv, env=env, cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT, text=True
            )
            stack.callback(proc.kill)  # a no-op once it has exited
            runs[mode] = (proc, out)
        deadline = time.monotonic() + 900
        for mode, (proc, out) in runs.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            out.seek(0)
            output = out.read()
            lines = [line for line in output.splitlines() if line.startswith("PROBE-RESULTS ")]
            assert lines, f"probe run ({mode}) printed no result within 900 s:\n{output[-8000:]}"
            results[mode] = json.loads(lines[-1].removeprefix("PROBE-RESULTS "))
    return results


def _ids(rows: list[Row]) -> list[str]:
    return [row.id for row in rows]


@pytest.mark.parametrize("row", ROWS, ids=_ids(ROWS))
def test_red(row: Row, outcomes: dict[str, dict[str, dict[str, Any]]]) -> None:
    got = outcomes["stock"][row.probe]
    if row.red == "pending":
        assert got["status"] == "pending", got
    else:
        assert got["status"] == "error" and got["error"].startswith(row.red), got


@pytest.mark.parametrize("row", ROWS, ids=_ids(ROWS))
def test_green(row: Row, outcomes: dict[str, dict[str, dict[str, Any]]]) -> None:
    got = outcomes["npu-compat"][row.probe]
    assert got["status"] == "ok", got


@pytest.mark.parametrize("row", ROWS, ids=_ids(ROWS))
def test_cuda_decision_changes_nothing(row: Row, outcomes: dict[str, dict[str, dict[str, Any]]]) -> None:
    stock, cuda = outcomes["stock"][row.probe], outcomes["cuda"][row.probe]
    assert (cuda["status"], cuda["error"]) == (stock["status"], stock["error"])
