"""The whole run on a one-NPU cluster, in the mode Trinity 0.6.0 picks for it (``colocate``).

On a cluster of one node and one accelerator Trinity 0.6.0 switches mode ``both`` to ``colocate``
(``RayClusterConfigValidator._set_cluster_info``: "Detected single-node single-GPU Ray cluster, setting mode to
`colocate`"), sets the rollout's ``gpu_memory_utilization`` to 0.25 and its visible device to ``"0"``, and the
weight sync to ``memory``.  Read in the installed 0.6.0, colocate is no more than that:

* nothing in 0.6.0 calls the rollout's ``sleep``/``wake_up`` (``vLLMRolloutModel.sleep`` has no caller, and
  Trinity's engine arguments leave vLLM's ``enable_sleep_mode`` off; the ``enable_sleep_mode`` in
  ``trinity/trainer/verl/config.py`` is for verl's own rollout, which Trinity does not build): trainer and
  rollout hold their memory side by side, the rollout in its 0.25 of the device;
* the trainer and the rollout still ask Ray for a whole accelerator each -- verl's resource pool
  ``{"GPU": 1, "CPU": 3}``, Trinity's rollout allocator ``{"GPU": 1, "CPU": 1}`` -- so on a node of one the
  second placement group stays pending: the run never gets past the trainer's start.  On CUDA the same
  (agentscope-ai/Trinity-RFT#602: "v0.6.0 ... 单卡colocate模式卡在Ray资源调度", one A100); not Ascend's, not
  npu-compat's to change.

So the tests assert what happens: stock stops in validation (it counts no GPU, and never gets to colocate);
with npu-compat Trinity counts the one NPU, picks colocate, builds the trainer on the NPU and then waits on its
own rollout bundle (stopped 90 s after the trainer is ready); and colocate itself runs two GRPO steps when the
config asks for one accelerator (``gpu_per_node: 1``) of a two-NPU cluster, where Ray can place both bundles --
without the rollout ever sleeping (docs/findings/shapes.md, "Colocate").
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import trinity_or_skip
from tests.e2e import scenario

TRINITY = trinity_or_skip(("0.6.",), "colocate is checked with trinity-rft 0.6 (stacks a, b)")

#: each is a whole run (a Ray cluster of some 20 processes), and CI has no time for more of them
pytestmark = [pytest.mark.many_processes, pytest.mark.beyond_ci]

PICKED = "Detected single-node single-GPU Ray cluster, setting mode to `colocate`."
MEMORY_SYNC = (
    "Colocate mode can't use NCCL synchronization. Set `synchronizer.sync_method` to `memory` instead."
)
QUARTER = "In `colocate` mode, `explorer.rollout_model.gpu_memory_utilization` is set to 0.25."
#: what vLLM's executor and the vllm-ascend worker log when the rollout sleeps (never, in 0.6.0's colocate)
SLEPT = re.compile(r"It took [\d.]+ seconds to fall asleep|Sleep mode \(level=\d\) freed")
#: Ray's autoscaler report of a placement group it cannot place now (monitor.log)
PENDING_PG = re.compile(r"^ (\{[^}]*\}) \* 1 \(PACK\): 1\+ pending placement groups$", re.MULTILINE)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario.make_model(tmp_path_factory.mktemp("colocate") / "tiny-model")


def _run(tmp_path: Path, folder: str, mode: str, **kw: Any) -> tuple[dict[str, object], Path]:
    out = tmp_path / folder
    result = scenario.run(mode, out, model=kw.pop("tiny_model"), progress=print, **kw)
    print(json.dumps(result))
    return result, out


def test_stock_on_one_npu_stops_in_validation_before_colocate(tmp_path: Path, tiny_model: Path) -> None:
    """Stock Trinity counts the cluster's "GPU" resources: 0 on ``{"NPU": 1}``, so it never decides on
    colocate; the bundled config then divides by that count in validation (as on two NPUs)."""
    result, out = _run(tmp_path, "stock", "stock", tiny_model=tiny_model, timeout=300, npus=1, stuck_after=60)
    assert result["stages"] == [], result
    assert result["first_error"] == "ZeroDivisionError: integer modulo by zero", result
    text = scenario.all_logs(out)
    assert "Auto-detected and set gpu_per_node: 0" in text
    assert PICKED not in text


def test_compat_on_one_npu_picks_colocate_and_waits_on_trinitys_own_rollout_bundle(
    tmp_path: Path, tiny_model: Path
) -> None:
    """With npu-compat Trinity counts the one NPU and picks colocate by itself; the trainer's verl workers
    come up on the NPU, and then the rollout allocator's bundle (``{"GPU": 1}`` made ``{"NPU": 1}``) waits
    for the accelerator verl's pool holds -- Trinity 0.6.0's own colocate hang, as on one GPU."""
    result, out = _run(
        tmp_path, "compat-1npu", "compat", tiny_model=tiny_model, timeout=900, npus=1,
        settle_after=("trainer_ready", 90),
    )  # fmt: skip
    assert result["rc"] == "stuck", result
    assert result["stages"] == [
        "npus_counted", "explorer_actor", "trainer_actor", "verl_pg_ready", "verl_workers_started",
        "verl_models_built", "trainer_ready",
    ], result  # fmt: skip
    assert result["first_error"] is None, result
    text = scenario.all_logs(out)
    assert "Auto-detected and set gpu_per_node: 1" in text
    assert PICKED in text and MEMORY_SYNC in text and QUARTER in text
    assert re.search(r"Config\(mode='colocate'", text)
    # Ray: one NPU, held by verl's pool; the rollout's bundle pending for it -- no "GPU" asked anywhere
    monitor = (out / "ray-logs" / "monitor.log").read_text()
    assert set(PENDING_PG.findall(monitor)) == {"{'CPU': 1.0, 'NPU': 1.0}"}, monitor[-2000:]
    assert "'GPU'" not in monitor
    assert re.search(
        r"[\d.]+/1\.0 NPU \([\d.]+ used of 1\.0 reserved in placement groups\)", monitor
    )  # verl's
    assert not SLEPT.search(text)


#: the config asks for one accelerator per node on a two-NPU cluster: Trinity counts the node and, with
#: ``gpu_per_node`` 1 stated, picks colocate itself (``node_num`` left unset, else it would not look)
ONE_OF_TWO = (
    "  ray_address: auto          # node_num / gpu_per_node left unset: Trinity counts the accelerators itself\n",
    "  ray_address: auto\n  gpu_per_node: 1            # colocate: one accelerator for trainer and rollout\n",
)


def _one_of_two(text: str) -> str:
    if ONE_OF_TWO[0] not in text:
        raise ValueError("the bundled config's cluster section changed")
    return text.replace(*ONE_OF_TWO, 1)


def _visible_devices(out: Path) -> dict[str, set[str]]:
    """``ASCEND_RT_VISIBLE_DEVICES`` of each kind of process, as its npu-compat report recorded it."""
    seen: dict[str, set[str]] = {}
    for path in sorted((out / "work" / "reports").glob("*.json")):
        report = json.loads(path.read_text())
        key = str((report.get("ray") or {}).get("actor_class") or report.get("role"))
        value = (report.get("environment") or {}).get("ASCEND_RT_VISIBLE_DEVICES")
        seen.setdefault(key, set()).add(str(value))
    return seen


def _assert_colocated_two_steps(result: dict[str, object], out: Path) -> None:
    assert result["rc"] == 0, result
    stages = result["stages"]
    assert isinstance(stages, list), result
    for stage in ("trainer_ready", "rollout_models_ready", "explore_step_started", "train_step_finished",
                  "second_train_step_finished", "rollout_on_weight_version_2"):  # fmt: skip
        assert stage in stages, result
    text = scenario.all_logs(out)
    assert PICKED in text and MEMORY_SYNC in text and QUARTER in text
    assert re.search(r"Config\(mode='colocate'", text)
    assert "Error in Trainer" not in text, result["first_error"]
    steps = scenario.train_steps(out)
    assert [step["step"] for step in steps] == [1, 2], steps
    # the trainer's verl worker and the rollout's vLLM worker on the same device: Ray gave the trainer NPU 0
    # and reserved NPU 1 for the rollout's bundle; colocate's visible device "0" (exported for Ascend by
    # npu-compat's trinity.vllm_model.visible_devices) put the vLLM engine on NPU 0 beside the trainer
    devices = _visible_devices(out)
    assert devices.get("WorkerDict") == {"0"}, devices
    assert devices.get("vllm (VllmWorker-0)") == {"0"}, devices
    # a memory sync after each train step: the rollout received the trainer's FSDP state dict of that step
    # and holds it converted to its own layout; the last is the trainer's final checkpoint shard
    loads = scenario.converted_loads(out)
    assert len(loads) == 2, loads
    assert all(load["holds"] == load["expected"] for load in loads), loads
    assert loads[0]["received"] != loads[1]["received"], loads
    assert scenario.trainer_checkpoint(out, "shard") == (2, loads[-1]["received"]), loads
    # and the rollout never slept: Trinity 0.6.0 does not ask it to
    assert not SLEPT.search(text)


@pytest.mark.uses_verl
def test_compat_colocate_runs_two_grpo_steps_where_ray_can_place_both_bundles(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Colocate past Trinity's own hang: ``gpu_per_node: 1`` on ``{"NPU": 2}``.  Trinity picks colocate, the
    rollout's vLLM runs on visible device 0 beside the trainer (``ASCEND_RT_VISIBLE_DEVICES``, npu-compat's
    ``trinity.vllm_model.visible_devices``), the weights go by ``memory`` after each of the two train steps,
    and the run exits 0 -- the rollout never put to sleep."""
    result, out = _run(
        tmp_path, "compat-colocate", "compat", tiny_model=tiny_model, timeout=1200, npus=2,
        edit=_one_of_two, name="colocate",
    )  # fmt: skip
    _assert_colocated_two_steps(result, out)
