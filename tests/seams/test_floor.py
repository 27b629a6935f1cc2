"""A run's start-up floor (``doctor --floor``): each reporting process's import log, replayed in the run's order."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from npu_compat.doctor.reports import read_reports
from npu_compat.tools import floor, timeline

from .conftest import child_env, last_json, py, run

#: An actor of a run: activated, it imports a module, learns its role, imports another.  Each import
#: waits for the report's watcher to log it.
ACTOR = """
import time
import npu_compat
npu_compat.activate()
from npu_compat import _reportfile
import xml.dom.minidom
time.sleep(1.2)
_reportfile.set_role("ray-actor")
import tabnanny
time.sleep(1.2)
"""

#: The driver: it imports a module, connects (its role), starts the actor, then imports another while
#: the actor starts.
DRIVER = f"""
import json, os, subprocess, sys, time
import npu_compat
npu_compat.activate()
from npu_compat import _reportfile
import email.mime.text
time.sleep(1.2)
_reportfile.set_role("ray-driver")
actor = subprocess.Popen([sys.executable, "-c", {ACTOR!r}])
time.sleep(0.6)
import wave
time.sleep(1.2)
actor.wait()
print(json.dumps({{"pid": os.getpid(), "actor": actor.pid}}))
"""


def test_the_floor_replays_each_processs_imports_in_the_runs_order(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    env = child_env({"NPU_COMPAT_DEVICE": "npu", "NPU_COMPAT_REPORT_DIR": str(reports)}, auto=False)
    pids = last_json(py(DRIVER, env))
    until = time.time()
    found = read_reports(str(reports))
    table = timeline.rows(found, str(reports))
    begin = floor.run_begin(table)
    assert begin is not None
    steps = floor.plan(table, str(reports), begin, until)
    assert [s.row.pid for s in steps] == [pids["pid"], pids["actor"]]  # type: ignore[index]
    driver, actor = steps
    for step, first, then in ((driver, "email.mime.text", "wave"), (actor, "xml.dom.minidom", "tabnanny")):
        # what it imported, in order, when; npu-compat's own modules are not replayed
        assert step.modules.index(first) < step.modules.index(then)
        assert step.times[step.modules.index(first)] < step.times[step.modules.index(then)]
        assert not [m for m in step.modules if m.startswith("npu_compat")]
        assert step.executable == sys.executable and str(Path(__file__).resolve().parents[2]) in step.sys_path
    # the actor started when the driver had imported email.mime.text and not yet wave: its child waits
    # for the driver's child to be just as far
    assert driver.after == {} and list(actor.after) == [0]
    waits_for = actor.after[0]
    assert "email.mime.text" in driver.modules[:waits_for] and "wave" in driver.modules[waits_for:]
    assert driver.marks == {waits_for}
    length = floor.replay(steps)
    assert driver.failed == 0 and actor.failed == 0
    assert driver.started is not None and actor.started is not None and driver.ended is not None
    assert driver.reached[waits_for] <= actor.started < driver.ended  # they overlap, as in the run
    assert length == max(s.ended or 0.0 for s in steps) > 0
    assert floor.floor_path(steps) == [(0, waits_for), (1, len(actor.modules))]
    lines = floor.render(steps, begin, until, length)
    assert lines[0].startswith(f"start-up {until - begin:.1f} s")
    assert f"ratio {(until - begin) / length:.2f}x" in lines[0]
    assert "ray-driver (" in lines[3] and "ray-actor (" in lines[4], lines
    # the actor's wait: from the driver's last import before it started to its start (the driver slept)
    waited = float(lines[4].split()[0])
    assert abs(waited - (actor.row.start - driver.run_time_of(waits_for))) < 0.06  # type: ignore[operator]
    assert 0.0 < waited < 1.8


def test_doctor_prints_the_floor_of_a_runs_reports(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    env = child_env({"NPU_COMPAT_DEVICE": "npu", "NPU_COMPAT_REPORT_DIR": str(reports)}, auto=False)
    py(DRIVER, env)
    proc = run(
        [sys.executable, "-m", "npu_compat", "doctor", "--reports", str(reports), "--floor"], child_env()
    )
    assert "floor" in proc.stdout and "ratio" in proc.stdout and "ray-actor" in proc.stdout, proc.stdout
