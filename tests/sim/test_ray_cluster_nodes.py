"""The simulated NPU-only Ray cluster with several nodes, as a driver sees it."""

from __future__ import annotations

import subprocess
import sys

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
