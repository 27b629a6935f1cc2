"""The simulated Ascend as a user meets it: from the documented API, in a fresh venv with the built wheel.

* A pytest suite of the user's own, with the plugin (``-p npu_compat.testing.pytest_plugin``): a
  reference on CPU first -- one backward -- then the same on ``npu`` inside ``simulated_ascend()``
  and under the ``ascend_host`` fixture, equal to it; the stand-ins are installed as
  ``importlib.metadata`` sees them.
* ``python -m npu_compat.testing cluster --nodes 2 --npus 2``: Trinity's own config validation counts
  4 NPUs, a placement group of ``{"NPU": 1}`` bundles spread over both nodes becomes ready, each
  bundle's worker sees one NPU of its own node, and after SIGTERM no process of the cluster is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.user.conftest import dotenv, user_env

pytestmark = (
    pytest.mark.same_on_every_stack
)  # torch and Ray alone (and Trinity's validator, same in 0.5.2/0.6.0)

USER_TESTS = """
import importlib.metadata as md

import torch

from npu_compat.testing import simulated_ascend


def loss_and_grads(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
    x = torch.randn(4, 8).to(device)
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.item(), [p.grad.cpu() for p in model.parameters()]


def test_cpu_reference_then_the_same_on_npu():
    ref_loss, ref_grads = loss_and_grads("cpu")  # the engine's device threads start here, on CPU alone
    with simulated_ascend():
        loss, grads = loss_and_grads("npu:1")
        versions = {name: md.version(name) for name in ("torch_npu", "vllm-ascend")}
        platforms = [ep.value for ep in md.entry_points(group="vllm.platform_plugins")]
    assert loss == ref_loss
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert versions["torch_npu"].startswith("2.13.0") and versions["vllm-ascend"] in ("0.18.0", "0.23.0.post1")
    assert platforms == ["vllm_ascend:register"]


def test_the_plugins_fixture(ascend_host):
    ref_loss, ref_grads = loss_and_grads("cpu")
    loss, grads = loss_and_grads("npu")
    assert loss == ref_loss and all(torch.equal(g, w) for g, w in zip(grads, ref_grads))


def test_another_number_of_npus_is_refused_saying_why():
    import pytest

    with pytest.raises(RuntimeError, match="already used its 2 simulated NPUs.*simulation_env\\\\(4\\\\)"):
        with simulated_ascend(devices=4):
            pass
"""


def test_a_users_suite_computes_a_cpu_reference_then_the_same_on_npu(user_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "test_mine.py").write_text(USER_TESTS)
    proc = subprocess.run(
        [str(user_venv), "-m", "pytest", "-p", "npu_compat.testing.pytest_plugin", "-q", "-p", "no:cacheprovider",
         "test_mine.py"],
        cwd=tmp_path, env=user_env(user_venv), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "3 passed" in proc.stdout


DRIVER = """
import json, os
import ray
from ray.util.placement_group import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from trinity.common.config import Config
from trinity.common.config_validator import RayClusterConfigValidator

ray.init(namespace="user-ci")  # the address and the authentication: from the env file
config = Config()
RayClusterConfigValidator()._set_cluster_info(config)  # what `trinity run` validates

pg = placement_group([{"NPU": 1, "CPU": 0.5}] * 4, strategy="SPREAD")
ray.get(pg.ready(), timeout=120)

@ray.remote(num_cpus=0.5, resources={"NPU": 1})
def where():
    return ray.get_runtime_context().get_node_id(), os.environ.get("ASCEND_RT_VISIBLE_DEVICES")

seen = ray.get([
    where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)).remote()
    for i in range(4)
], timeout=120)
print(json.dumps({
    "node_num": config.cluster.node_num, "gpu_per_node": config.cluster.gpu_per_node,
    "bundle_nodes": sorted(set(placement_group_table(pg)["bundles_to_node_id"].values())),
    "seen": sorted(seen), "gpu": ray.cluster_resources().get("GPU", 0),
}))
"""


def _processes_naming(marker: str) -> list[str]:
    found = []
    for pid in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            cmdline = (pid / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            words = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{pid.name}: {words[:200]}")
    return found


@pytest.mark.many_processes
def test_a_two_node_cluster_from_the_shell(user_venv: Path, tmp_path: Path) -> None:
    env_file = tmp_path / "ci.env"
    env_file.write_text("EARLIER=kept\n")  # a CI system's file: appended to, never replaced
    argv = [str(user_venv), "-m", "npu_compat.testing", "cluster", "--nodes", "2", "--npus", "2", "--cpus", "2",
            "--env-file", str(env_file)]  # fmt: skip
    with (tmp_path / "cluster.out").open("wb") as out:
        cluster = subprocess.Popen(
            argv, cwd=tmp_path, env=user_env(user_venv), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 300
        while "RAY_ADDRESS=" not in env_file.read_text():
            assert cluster.poll() is None, (tmp_path / "cluster.out").read_text()[-4000:]
            assert time.monotonic() < deadline, (tmp_path / "cluster.out").read_text()[-4000:]
            time.sleep(1)
        client = dotenv(env_file)
        assert client["EARLIER"] == "kept" and client["NPU_COMPAT_SIMULATE"] == "1"
        assert "ready: " in (tmp_path / "cluster.out").read_text()
        temp_dir = str(Path(client["RAY_AUTH_TOKEN_PATH"]).parent)
        (tmp_path / "driver.py").write_text(DRIVER)
        proc = subprocess.run([str(user_venv), "driver.py"], cwd=tmp_path, env=user_env(user_venv, **client),
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        # Trinity's validator (patched by the installed npu-compat) counts 2 nodes x 2 NPUs
        assert (out["node_num"], out["gpu_per_node"]) == (2, 2) and out["gpu"] == 0
        assert len(out["bundle_nodes"]) == 2  # the SPREAD group is ready over both nodes
        # each bundle's worker sees one NPU, its own: two per node, 0 and 1 of that node
        per_node: dict[str, list[str]] = {}
        for node, visible in out["seen"]:
            per_node.setdefault(node, []).append(visible)
        assert sorted(per_node) == out["bundle_nodes"]
        assert all(sorted(v) == ["0", "1"] for v in per_node.values()), out["seen"]
        assert _processes_naming(temp_dir), "the cluster's processes name its temporary directory"
    finally:
        cluster.send_signal(signal.SIGTERM)
        rc = cluster.wait(timeout=120)
    assert rc == 0, (tmp_path / "cluster.out").read_text()[-4000:]
    assert "the cluster is stopped" in (tmp_path / "cluster.out").read_text()
    assert _processes_naming(temp_dir) == [] and not os.path.exists(temp_dir)
