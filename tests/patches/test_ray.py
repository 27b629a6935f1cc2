"""Ray on the NPU-only cluster: GPU requests made by unmodified code get scheduled onto NPUs."""

from __future__ import annotations

from typing import Any

import pytest

from npu_compat.testing import simulation_env
from tests.conftest import SIM_PATH, last_json, run_py

#: torch and Ray alone, pinned alike in every stack: stack-a runs these (noxfile.SHARED_PINS)
pytestmark = pytest.mark.same_on_every_stack

pytest.importorskip("ray", reason="needs ray (installed by the upstream stack sessions)")

DRIVER = """
import json, logging, sys
logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
from ray.util.placement_group import placement_group as copied_before   # a `from x import y` copy
import npu_compat
device = npu_compat.activate()
import ray
from ray.util.placement_group import placement_group, placement_group_table
ray.init(address=ADDRESS, log_to_driver=False)
"""


def _driver(cluster: Any, body: str, **env: str) -> dict[str, Any]:
    sim = {k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}
    sim.update(env)
    code = DRIVER.replace("ADDRESS", repr(cluster.address)) + body
    return last_json(run_py(code, env=sim, pythonpath=SIM_PATH, timeout=240))  # type: ignore[return-value]


def test_gpu_requests_are_scheduled_on_npus(npu_ray_cluster: Any) -> None:
    out = _driver(
        npu_ray_cluster,
        """
@ray.remote(num_gpus=1)
class Trainer:
    def look(self):
        import os
        return [os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), ray.get_runtime_context().get_assigned_resources()]

@ray.remote(num_gpus=0.5)
def half():
    return ray.get_runtime_context().get_assigned_resources()

trainer = Trainer.remote()
seen = ray.get(trainer.look.remote(), timeout=120)
fraction = ray.get(half.options(num_gpus=0.5).remote(), timeout=120)
ray.kill(trainer)  # the cluster has two NPUs; the placement group below needs both
pg = placement_group([{"GPU": 1, "CPU": 1}, {"GPU": 1}], strategy="PACK")
pg_ready = bool(ray.wait([pg.ready()], timeout=60)[0])
bundles = [dict(sorted(b.items())) for b in placement_group_table(pg)["bundles"].values()]
ray.util.remove_placement_group(pg)
old = copied_before([{"GPU": 1}])
old_ready = bool(ray.wait([old.ready()], timeout=60)[0])
print(json.dumps({"device": device, "seen": seen, "fraction": fraction, "pg_ready": pg_ready,
                  "bundles": bundles, "copy_ready": old_ready,
                  "cluster": sorted(ray.cluster_resources())}))
""",
    )
    assert out["device"] == "npu"
    # as for num_gpus=1: an actor that names any resource also holds one CPU for its lifetime
    assert out["seen"][0] in {"0", "1"} and out["seen"][1] == {"NPU": 1.0, "CPU": 1.0}
    assert out["fraction"] == {"NPU": 0.5, "CPU": 1.0}  # a task keeps its default CPU
    assert out["pg_ready"] and out["copy_ready"]
    assert out["bundles"] == [{"CPU": 1.0, "NPU": 1.0}, {"NPU": 1.0}]
    assert "GPU" not in out["cluster"]  # nothing fake was advertised


def test_guard_names_the_caller_when_the_rewrite_is_disabled(npu_ray_cluster: Any) -> None:
    sim = {k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}
    sim["NPU_COMPAT_DISABLE"] = "ray.options.actor"
    proc = run_py(
        DRIVER.replace("ADDRESS", repr(npu_ray_cluster.address))
        + """
@ray.remote(num_gpus=1)
class Stuck:
    pass

def make_it():
    return Stuck.remote()

actor = make_it()
ready = bool(ray.wait([actor.__ray_ready__.remote()], timeout=3)[0])
ray.kill(actor)
print(json.dumps({"ready": ready}))
""",
        env=sim,
        pythonpath=SIM_PATH,
        timeout=240,
    )
    assert last_json(proc) == {"ready": False}
    assert "asks Ray for num_gpus=1" in proc.stderr
    assert "__main__:make_it" in proc.stderr
    assert "resources={'NPU': n}" in proc.stderr


def test_guard_names_a_placement_group_the_cluster_can_never_hold(npu_ray_cluster: Any) -> None:
    """A config asking for more NPUs than the cluster has (Trinity's allocator awaits ready())."""
    sim = {k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}
    proc = run_py(
        DRIVER.replace("ADDRESS", repr(npu_ray_cluster.address))
        + """
def allocate(n, strategy="PACK"):
    pg = placement_group([{"GPU": 1}] * n, strategy=strategy)
    ready = bool(ray.wait([pg.ready()], timeout=3 if n > 2 else 60)[0])
    ray.util.remove_placement_group(pg)
    return ready

fits = allocate(2)
print("-- fits above, too many below --", file=sys.stderr, flush=True)
print(json.dumps({"fits": fits, "too_many": allocate(3)}))
""",
        env=sim,
        pythonpath=SIM_PATH,
        timeout=240,
    )
    assert last_json(proc) == {"fits": True, "too_many": False}
    (before, after) = proc.stderr.split("-- fits above, too many below --")
    assert "can never be ready" not in before
    assert "__main__:allocate" in after and "3 bundles, 3 NPU in all, on a cluster of 2 NPU" in after, after


def test_cuda_decision_leaves_ray_identical(npu_ray_cluster: Any) -> None:
    out = _driver(
        npu_ray_cluster,
        """
import ray.actor, ray.remote_function
pgmod = sys.modules["ray.util.placement_group"]  # `ray.util.placement_group` is the function, not the module
plain = [ray.actor.ActorClass._remote, ray.remote_function.RemoteFunction._remote, pgmod.placement_group]
print(json.dumps({"device": device, "patched": [npu_compat.is_patched(f) for f in plain],
                  "copy_same": copied_before is pgmod.placement_group}))
""",
        NPU_COMPAT_DEVICE="cuda",
    )
    assert out == {"device": "cuda", "patched": [False, False, False], "copy_same": True}


VISIBLE = """
import json, os
import npu_compat
ACTIVATE and npu_compat.activate()
from ray._private.accelerators.npu import NPUAcceleratorManager
NPUAcceleratorManager.set_current_process_visible_accelerator_ids(["2", "1"])  # as Ray assigned a bundle's NPUs
import torch
print(json.dumps({"visible": os.environ["ASCEND_RT_VISIBLE_DEVICES"], "count": torch.npu.device_count(),
                  "available": torch.npu.is_available()}))
"""


@pytest.mark.parametrize("activate", [False, True])
def test_ray_shows_a_worker_its_npus_in_ascending_order(activate: bool) -> None:
    """Ray's own ``set_current_process_visible_accelerator_ids``, as a worker runs it for an actor given NPUs
    2 and 1: stock joins them as assigned, and torch_npu (CANN) counts no device for ids that do not ascend
    (field failure F9); with npu-compat the worker sees both NPUs, numbered 1,2."""
    sim = {k: v for k, v in simulation_env(3, {}).items() if k != "PYTHONPATH"}
    out = last_json(
        run_py(VISIBLE.replace("ACTIVATE", str(activate)), env=sim, pythonpath=SIM_PATH, timeout=120)
    )
    if activate:
        assert out == {"visible": "1,2", "count": 2, "available": True}
    else:  # (torch_npu's is_available is then False too; the simulation's says True: kinder, docs/testing.md)
        assert (out["visible"], out["count"]) == ("2,1", 0)
