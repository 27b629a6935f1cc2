"""A run's start-up floor (``doctor --floor``): each reporting process's import log, replayed in the run's order."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from npu_compat import _doctor, _floor, _timeline

from .conftest import child_env, last_json, py, run

#: A process of a run: activated, it imports ``before``, learns its role, then imports ``after``; each
#: import waits for the report's watcher to log it.
PROCESS = """
import json, os, time
import npu_compat
npu_compat.activate()
from npu_compat import _reportfile
import {before}
time.sleep(1.2)
_reportfile.set_role({role!r})
import {after}
time.sleep(1.2)
print(json.dumps({{"pid": os.getpid()}}))
"""


def test_the_floor_replays_each_processs_imports_in_the_runs_order(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    env = child_env({"NPU_COMPAT_DEVICE": "npu", "NPU_COMPAT_REPORT_DIR": str(reports)}, auto=False)
    # the driver, then an actor started once the driver was ready: the floor runs them in that order
    driver = last_json(py(PROCESS.format(before="email.mime.text", role="ray-driver", after="wave"), env))
    actor = last_json(py(PROCESS.format(before="xml.dom.minidom", role="ray-actor", after="tabnanny"), env))
    until = time.time()
    found = _doctor.read_reports(str(reports))
    begin = _floor.run_begin(_timeline.rows(found, str(reports)))
    assert begin is not None
    table, steps = _floor.plan(found, str(reports), begin, until)
    assert [s.row.pid for s in steps] == [driver["pid"], actor["pid"]]  # type: ignore[index]
    first, second = steps
    for step, before, after in ((first, "email.mime.text", "wave"), (second, "xml.dom.minidom", "tabnanny")):
        # what it imported before it was ready, then after; npu-compat's own modules are not replayed
        assert before in step.modules[: step.ready] and after in step.modules[step.ready :], step.ready
        assert not [m for m in step.modules if m.startswith("npu_compat")]
        assert step.executable == sys.executable and str(Path(__file__).resolve().parents[2]) in step.sys_path
    assert first.after == [] and second.after == [0]
    floor = _floor.replay(steps)
    assert first.failed == 0 and second.failed == 0
    assert first.started is not None and first.was_ready is not None and second.started is not None
    assert first.was_ready <= second.started  # the actor's child waited for the driver's to be ready
    assert floor == max(s.ended or 0.0 for s in steps) > 0
    assert _floor.floor_path(steps) == [0, 1]
    lines = _floor.render(table, steps, begin, until, floor)
    assert (
        lines[0].startswith(f"start-up {until - begin:.1f} s")
        and f"ratio {(until - begin) / floor:.2f}x" in lines[0]
    )
    # along the path: the actor's wait in the run (started after the driver was ready), then the tail
    assert "ray-driver (" in lines[3] and "ray-actor (" in lines[4], lines
    waited = float(lines[4].split()[0])
    assert abs(waited - (second.row.start - first.row.ready)) < 0.06  # type: ignore[operator]


def test_doctor_prints_the_floor_of_a_runs_reports(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    env = child_env({"NPU_COMPAT_DEVICE": "npu", "NPU_COMPAT_REPORT_DIR": str(reports)}, auto=False)
    py(PROCESS.format(before="email.mime.text", role="ray-driver", after="wave"), env)
    proc = run(
        [sys.executable, "-m", "npu_compat", "doctor", "--reports", str(reports), "--floor"], child_env()
    )
    assert "floor" in proc.stdout and "ratio" in proc.stdout and "ray-driver" in proc.stdout, proc.stdout
