"""Issue 8: the real ``trinity run`` on a simulated Ascend Ray cluster, with and without npu-compat.

Each run starts one simulated Ascend cluster (``{"NPU": 2}``, no GPU), runs the bundled
``examples/e2e/trinity_tiny.yaml`` (a tiny random Qwen2 made at run time) with a bounded
timeout, and reads the stages reached from the logs of every process (``tests/e2e/scenario.py``).
What each stop means is in ``tests/e2e/FINDINGS.md``.  The config's keys are read alike by
trinity-rft 0.6.0 and 0.5.2, so the same scenario runs on all three stacks; what differs by
release (the error stock stops with, which patches apply where, 0.5.2 logging less) is below.
"""

from __future__ import annotations

import importlib.metadata as md
import json
from pathlib import Path

import pytest
from packaging.version import Version

from tests.e2e import scenario

try:
    TRINITY = md.version("trinity-rft")
except md.PackageNotFoundError:
    pytest.skip("needs trinity-rft (installed by the upstream stack sessions)", allow_module_level=True)
if not TRINITY.startswith(("0.5.", "0.6.")):
    pytest.skip(f"the bundled config is for trinity-rft 0.5/0.6, found {TRINITY}", allow_module_level=True)

#: trinity-rft 0.5.2 (stack c): its own trainer module, vLLM 0.18 with Trinity's worker *extension*
REL_052 = TRINITY.startswith("0.5.")
# verl 0.8 runs Trinity 0.6's new engine trainer (trinity.trainer.verl); verl 0.7.1 its legacy one (stack b)
LEGACY = Version(md.version("verl")) < Version("0.8")
if REL_052:
    TRAINER_DEVICE, WORKER_CUDA_VIEW = "trinity.verl.trainer_device", "trinity.verl.fsdp_workers.cuda"
elif LEGACY:
    TRAINER_DEVICE, WORKER_CUDA_VIEW = (
        "trinity.verl_legacy.trainer_device",
        "trinity.verl_legacy.fsdp_workers.cuda",
    )
else:
    TRAINER_DEVICE, WORKER_CUDA_VIEW = "trinity.verl.trainer.device_name", "trinity.verl.monkey_patch.cuda"

TRAINER_SIDE = [
    "config_validated",
    "explorer_actor",
    "trainer_actor",
    "verl_pg_ready",
    "verl_workers_started",
]
# 0.5.2 logs nothing when its rollout placement group is ready; its actor scheduled in the NPU bundle shows it
ROLLOUT_SIDE = [
    "config_validated",
    "explorer_actor",
    *([] if REL_052 else ["rollout_pg_ready"]),
    "rollout_actor_scheduled",
]


def _run(tmp_path: Path, mode: str, cluster: str, timeout: float) -> dict[str, object]:
    result = scenario.run(mode, tmp_path / f"{mode}-{cluster}", timeout=timeout, cluster=cluster)
    print(json.dumps(result))
    return result


def test_stock_stops_at_trinitys_own_gpu_count(tmp_path: Path) -> None:
    """Stock Trinity counts the cluster's "GPU" resources (0 here): config validation divides by zero
    (0.6.0), or finds no GPU left for the trainer (0.5.2)."""
    result = _run(tmp_path, "stock", "auto", 120)
    assert result["stages"] == [], result
    if REL_052:
        assert str(result["first_error"]).startswith("ValueError: Not enough GPUs for trainer."), result
    else:
        assert result["first_error"] == "ZeroDivisionError: integer modulo by zero", result


def test_compat_both_reaches_fsdp_on_npu_tensors(tmp_path: Path) -> None:
    """The bundled config as it is: npu-compat counts the NPUs, the verl worker group is up on NPU
    bundles, then FSDP2 moves the parameters to ``npu`` -- the simulation's compute boundary."""
    result = _run(tmp_path, "compat", "auto", 420)
    if REL_052:
        # 0.5.2 brings up the Explorer's rollout engine beside the Trainer's worker group, so whether its
        # actor is seen scheduled before the FSDP2 boundary ends the run is a race ...
        assert set(result["stages"]) - {"rollout_actor_scheduled"} == {"npus_counted", *TRAINER_SIDE}, result
        # ... and its vLLM worker may reach the vllm-ascend stand-in's boundary too
        assert "fsdp2: parameters moved to npu tensors" in result["boundaries"], result
        assert set(result["boundaries"]) <= set(scenario.BOUNDARIES), result
    else:
        assert result["stages"] == ["npus_counted", *TRAINER_SIDE], result
        assert result["boundaries"] == ["fsdp2: parameters moved to npu tensors"], result
    # each patch is reported applied in the process where its code runs
    _assert_applied(
        result,
        {
            "ray-driver": ["trinity.config_validator.npu_count"],
            "Trainer": [TRAINER_DEVICE, "ray.placement_group"],
            "WorkerDict": [WORKER_CUDA_VIEW, "torch.distributed.init_process_group"],
        },
    )


def test_stock_both_hangs_on_a_gpu_placement_group(tmp_path: Path) -> None:
    """Stock Trinity's verl worker group asks for {"GPU": 1, "CPU": 3}: pending forever on an NPU-only cluster."""
    # stock never gets past the GPU placement group: the bound is the whole run (long enough for a loaded CI)
    result = _run(tmp_path, "stock", "explicit", 180)
    assert result["rc"] == "timeout", result
    if REL_052:
        # 0.5.2's Explorer waits in its constructor on the rollout allocator's {"GPU": 1} bundles too
        assert result["stages"] == ["config_validated", "trainer_actor"], result
    else:
        assert result["stages"] == ["config_validated", "explorer_actor", "trainer_actor"], result
    text = scenario.all_logs(tmp_path / "stock-explicit")
    assert "No available node types can fulfill resource request" in text
    assert "'GPU': 1.0" in text


def test_compat_explore_reaches_the_vllm_ascend_worker(tmp_path: Path) -> None:
    """Mode explore: the rollout actor sits in an NPU bundle and vLLM builds its engine on the
    (simulated) Ascend platform; the worker's ``init_device`` forms its HCCL world group, and its
    ``load_model`` (0.6.0: npu-compat's Trinity worker on ``NPUWorker``) registers Trinity's checkpoint
    weight-transfer engine -- importing ``vllm_extension``, whose patches apply in that process --
    until the vllm_ascend stand-in's ``NPUModelRunner`` needs a real NPU."""
    result = _run(tmp_path, "compat", "explore", 300)
    assert result["stages"] == ROLLOUT_SIDE, result
    assert result["boundaries"] == ["vllm-ascend stand-in: needs a real NPU"], result
    assert str(result["first_error"]).startswith(
        "npu_compat.testing._boundary.SimulatedComputeBoundary: simulated Ascend: NPUModelRunner.load_model"
    ), result
    common = {
        "ray-driver": ["trinity.config_validator.npu_count"],
        "Explorer": ["ray.options.actor", "ray.placement_group"],
        "vLLMRolloutModel": ["trinity.vllm_model.visible_devices", "vllm.weight_transfer.nccl_is_hccl"],
    }
    if REL_052:
        # vLLM 0.18 runs the worker inside its EngineCore process; 0.5.2 hands vLLM a worker extension
        # (its weight-sync group and torch.cuda calls), which the NPUWorker loads there
        worker = {"vllm (EngineCore)": ["trinity.vllm_worker.cuda", "trinity.distributed.init_process_group"]}
    else:
        worker = {
            "vllm (VllmWorker-0)": [
                "trinity.vllm.worker_cls",
                "vllm.weight_transfer.nccl_is_hccl",
                "trinity.vllm_extension.hccl_group",
                "trinity.vllm_extension.cuda",
                "trinity.vllm_extension.produce_checkpoint_weights.cuda_literals",
                "trinity.vllm_extension.consume_checkpoint_weights.cuda_literals",
            ]
        }
    _assert_applied(result, {**common, **worker})


def _assert_applied(result: dict[str, object], expected: dict[str, list[str]]) -> None:
    applied = result["applied"]
    assert isinstance(applied, dict), result
    for process, ids in expected.items():
        assert process in applied, f"no report of a {process} process applying a patch: {sorted(applied)}"
        missing = set(ids) - set(applied[process])
        assert not missing, f"{process}: {sorted(missing)} not applied; applied: {applied[process]}"
