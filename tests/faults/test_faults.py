"""Faults inside a whole simulated run, each with the bound it must end within and nothing left.

Each test is one ``python -m npu_compat trinity run`` of the bundled config on a simulated NPU-only
cluster, with one fault injected at a named point (``tests/faults/injection.py``).  It asserts what a
user would see: the driver ended within the configured bound plus a margin (Trinity's own waits added
up, where it has them), with the exit status it gives (Trinity's 0 after a failed stage, launcher.py:416,
is asserted as such), the first error within the bound where the end comes later, and no process of the
run left behind -- checked by PID from the run's own records.  Each prints its
row (``FAULT-ROW {...}``) for the table in ``docs/findings/faults.md``.  Minutes each: ``beyond_ci``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import trinity_or_skip
from tests.e2e import scenario
from tests.faults import injection

TRINITY = trinity_or_skip(("0.6.",), "the faults are injected into trinity-rft 0.6 runs (stacks a, b)")

pytestmark = [pytest.mark.many_processes, pytest.mark.beyond_ci]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario.make_model(tmp_path_factory.mktemp("faults") / "tiny-model")


def _row(name: str, tmp_path: Path, tiny_model: Path) -> dict[str, object]:
    row = injection.measure(injection.FAULTS[name], tmp_path / name, tiny_model)
    print("FAULT-ROW " + json.dumps({k: v for k, v in row.items() if k != "run"}))
    print(json.dumps(row["run"]))
    return row


def _surfaced_within_bound(row: dict[str, object]) -> None:
    assert row["injected_s"] is not None, f"the fault's point was never reached: {row['run']}"
    surfaced = row["surfaced_after_s"]
    assert isinstance(surfaced, float)
    assert surfaced <= injection.FAULTS[str(row["fault"])].bound_s + injection.MARGIN_S, row


def _nothing_left(row: dict[str, object]) -> None:
    assert row["left_after_driver"] == {}, row["left_after_driver"]
    assert row["left_after_cluster_stop"] == {}, row["left_after_cluster_stop"]


def _log_time(line: str) -> float:
    """Seconds since midnight of a Trinity/vLLM log line's ``MM-DD HH:MM:SS``."""
    match = re.search(r" \d\d-\d\d (\d\d):(\d\d):(\d\d) ", line)
    assert match, line
    hours, minutes, seconds = map(int, match.groups())
    return hours * 3600.0 + minutes * 60 + seconds


def _broadcast_raised_at_its_bound(out: Path) -> float:
    """Seconds from the trainer's broadcast into the dead rollout to the simulated HCCL's error."""
    lines = (out / "driver.log").read_text(errors="replace").splitlines()
    starts = [line for line in lines if "Starting NCCL weight sync broadcast." in line]
    raised = [line for line in lines if "did not complete within HCCL_EXEC_TIMEOUT" in line]
    assert len(starts) >= 2 and raised, (starts, raised)
    return _log_time(raised[0]) - _log_time(starts[1])


@pytest.mark.parametrize("name", sorted(injection.FAULTS))
def test_a_fault_ends_the_run_within_its_bound_and_leaves_nothing(
    name: str, tmp_path: Path, tiny_model: Path
) -> None:
    row = _row(name, tmp_path, tiny_model)
    fault = injection.FAULTS[name]
    if name == "rollout_dies_in_weight_sync":
        waited = _broadcast_raised_at_its_bound(tmp_path / name)
        print(f"the trainer's broadcast raised {waited:.0f} s after it began")
        assert injection.BOUND_S <= waited <= injection.BOUND_S + 5
    if fault.hangs:  # Trinity's own: it must still be so, or this row has to be measured again
        assert row["hung"], f"Trinity no longer hangs after {name}: {row}"
        _nothing_left(row)
        return
    _surfaced_within_bound(row)
    if fault.error_at:
        error_after = row["error_after_s"]
        assert isinstance(error_after, float), f"{fault.error_at} never showed: {row}"
        assert error_after <= injection.BOUND_S + injection.MARGIN_S, row
    _nothing_left(row)
    exits = fault.exits
    if exits == "error":
        assert row["rc"] not in (0, "timeout", "stuck"), (
            f"the run exited {row['rc']} after {row['did']}: {row['first_error']}"
        )
    else:
        assert row["rc"] == exits, row
