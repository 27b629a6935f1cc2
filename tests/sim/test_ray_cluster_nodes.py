"""The simulated NPU-only Ray cluster with several nodes, as a driver sees it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from npu_compat.testing._ray import npu_ray_cluster
from tests.conftest import REPO

#: torch and Ray alone, pinned alike in every stack: stack-a runs these (noxfile.SHARED_PINS)
pytestmark = pytest.mark.same_on_every_stack
pytest.importorskip("ray", reason="needs ray (installed by the upstream stack sessions)")

DRIVER = """
import time, ray
ray.init()

@ray.remote(resources={"NPU": 1}, num_cpus=0)
class Node:
    def where(self):
        node = ray.get_runtime_context().get_node_id()
        print("actor line from node", node, flush=True)
        return node

actors = [Node.remote() for _ in range(2)]  # one NPU per node: one actor on each
nodes = ray.get([a.where.remote() for a in actors])
time.sleep(3)  # Ray forwards the actors' output within a second
print("nodes", len(set(nodes)), flush=True)
"""


def test_each_workers_output_reaches_the_driver_once_from_a_cluster_of_two_nodes() -> None:
    """Each node has a Ray temporary directory of its own, as each host of a real cluster has: with one shared
    directory, every node's log monitor forwarded every worker's output, and each line reached the driver once
    per node."""
    with npu_ray_cluster(nodes=2, npus_per_node=1, cpus_per_node=1) as cluster:
        env = {**cluster.env, "RAY_ADDRESS": cluster.address}
        done = subprocess.run(
            [sys.executable, "-c", DRIVER], env=env, cwd=str(REPO), capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert [d.name for d in cluster.log_dirs() if d.is_dir()] == ["logs", "logs"], cluster.log_dirs()
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "nodes 2" in output, output[-3000:]
    lines = [line for line in output.splitlines() if "actor line from node" in line]
    assert len(lines) == 2, output[-3000:]


#: The head's monitor.log as Ray 2.60's autoscaler writes it (a real run's, trimmed): waiting, then two reports.
MONITOR_LOG = """\
2026-12-05 03:35:09,602	INFO monitor.py:408 -- Autoscaler has not yet received load metrics. Waiting.
2026-12-05 03:35:15,644	INFO autoscaler.py:408 --
======== Autoscaler status: 2026-12-05 03:35:15.644176 ========
Node status
---------------------------------------------------------------
Active:
 1 node_e22bb29eef8e9fd74c6651340b31a1ca18c87461152ed19331fb7fcc
Pending:
 (no pending nodes)
Recent failures:
 (no failures)
2026-12-05 03:35:16,650	INFO autoscaler.py:408 --
======== Autoscaler status: 2026-12-05 03:35:16.650001 ========
Node status
---------------------------------------------------------------
Active:
 1 node_e22bb29eef8e9fd74c6651340b31a1ca18c87461152ed19331fb7fcc
 1 node_0aa1c5f1d2e3b4a5968778695a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d
Pending:
 (no pending nodes)
"""


def test_the_cluster_reads_the_autoscalers_last_report_before_it_asks_ray_status(tmp_path: Path) -> None:
    """npu_ray_cluster asks ``ray status`` (3 s of a core) only once the head's monitor.log lists the nodes."""
    from npu_compat.testing._ray import _monitor_active

    log = tmp_path / "monitor.log"
    assert _monitor_active(log) is None  # no log yet
    log.write_text(MONITOR_LOG.split("2026-12-05 03:35:15,644")[0])
    assert _monitor_active(log) is None  # no report yet
    log.write_text(MONITOR_LOG.split("2026-12-05 03:35:16,650")[0])
    assert _monitor_active(log) == 1
    log.write_text(MONITOR_LOG)
    assert _monitor_active(log) == 2  # the last report counts


#: Ray's own deduplicator, as a driver runs it on the output of the workers (``ray_logging.LogDeduplicator``, its
#: allowed pattern read from the environment by ``ray_constants``): each rank's ``served`` line as the simulated
#: host logs it, at 1, 2 and 4 requests, from the two workers of a TP 2 engine.  What reaches the terminal.
DEDUP = """
import json
from ray._private import ray_constants
from ray._private.ray_logging import LogDeduplicator

def printed(allow):
    dedup, out = LogDeduplicator(5, allow, None, _timesource=lambda: 0.0), []
    for count in (1, 2, 4):
        for rank in (0, 1):
            line = (f"INFO 12-07 14:48:38 [_requests_served.py:55] simulated Ascend: NPUModelRunner on npu:{rank} "
                    f"served {count} requests (tensor parallel rank {rank} of 2)")
            for batch in dedup.deduplicate({"ip": "10.0.0.1", "pid": 100 + rank, "lines": [line]}):
                out += batch["lines"]
    return len(out)

print(json.dumps({"ray's default": printed(None), "simulated host": printed(ray_constants.RAY_DEDUP_LOGS_ALLOW_REGEX)}))
"""


def test_the_drivers_print_every_workers_simulated_lines_as_each_logs_them() -> None:
    """Ray folds a line of one worker into another worker's line that differs from it only in numbers (and
    prints the fold only after its window, which a driver that exits first never does): of the six ``served``
    lines of a TP 2 engine on vLLM's Ray executor, one reached the log.  The simulated host's environment lets
    its own lines through whole."""
    from npu_compat import _env
    from npu_compat.testing import simulation_env
    from tests.conftest import last_json, run_py

    allow = simulation_env(1, {})[_env.RAY_DEDUP_ALLOW]
    out = last_json(run_py(DEDUP, env={_env.RAY_DEDUP_ALLOW: allow}))
    assert out["ray's default"] < 6
    assert out["simulated host"] == 6
