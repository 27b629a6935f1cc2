"""The break catalogue as data: map row -> the probe that drives it -> what a user hits.

The HANG and CRASH rows of the map, plus WRONG rows whose consequence a user meets (A1: the run
stops in validation with a division by zero GPUs).

``green`` is the issue whose patches turn the row's "green with npu-compat" twin on;
until it lands the twin is a strict expected failure, so progress is counted by the
suite itself.  ``python -m tests.catalogue`` prints this table with each row's status.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    id: str  # the row id in shared/UPSTREAM_MAP.md
    trinity: str  # "0.6.0" or "0.5.2"
    trainer: str  # "any", "verl>=0.8" (trinity.trainer.verl) or "verl<0.8" (trinity.trainer.verl_legacy)
    severity: str
    where: str
    red: str  # "pending", or the start of the error a user sees
    green_issue: int  # the issue whose patches make the twin pass
    fixed: bool = False  # True once the patch has landed: the twin must pass

    @property
    def probe(self) -> str:
        return self.id


ROWS: tuple[Row, ...] = (
    # trinity-rft 0.6.0 (stacks a and b)
    Row("A1", "0.6.0", "any", "WRONG", "trinity.common.config_validator:RayClusterConfigValidator._set_cluster_info",
        "AssertionError: Trinity counted 0 accelerators per node", 6, fixed=True),
    Row("A5", "0.6.0", "any", "HANG", "trinity.common.models.allocator:Allocator.create_all_models", "pending", 5, fixed=True),
    Row("A6", "0.6.0", "any", "HANG", "trinity.common.models.allocator:get_model_wrapper",
        "ValueError: Cannot schedule vLLMRolloutModel", 5, fixed=True),
    Row("A12", "0.6.0", "any", "CRASH", "trinity.common.models.vllm_worker:TrinityGPUWorker",
        "AssertionError: GPU worker class chosen on an NPU host", 6, fixed=True),
    Row("A13", "0.6.0", "any", "CRASH", "trinity.common.models.vllm_extension:CheckpointWeightTransferEngine.init_transfer_engine",
        "AssertionError: the weight-sync group did not reduce", 6, fixed=True),
    Row("A14", "0.6.0", "any", "CRASH", "trinity.common.models.vllm_extension:CheckpointWeightTransferEngine.receive_weights",
        "AssertionError: Torch not compiled with CUDA enabled", 6, fixed=True),
    Row("A16", "0.6.0", "any", "CRASH", "trinity.utils.distributed:init_process_group", "AssertionError", 5, fixed=True),
    Row("A17", "0.6.0", "any", "CRASH", "trinity.utils.distributed:VLLMWeightTransferEngine",
        "RuntimeError: torch.cuda.Stream requires CUDA support", 6, fixed=True),
    Row("A21", "0.6.0", "verl>=0.8", "CRASH", "trinity.trainer.verl.workers:TrinityActorRolloutRefWorker._save_lora",
        "RuntimeError: LoRA adapter not saved: Save LoRA adapter error: Torch not compiled with CUDA enabled", 6,
        fixed=True),
    Row("A22", "0.6.0", "verl>=0.8", "CRASH", "trinity.trainer.verl.workers:TrinityActorRolloutRefWorker.sync_weight_nccl",
        "AssertionError: Torch not compiled with CUDA enabled", 6, fixed=True),
    Row("A23", "0.6.0", "verl>=0.8", "CRASH", "trinity.trainer.verl.fsdp_engine:fsdp_sync_weight_nccl",
        "AssertionError: Torch not compiled with CUDA enabled", 6, fixed=True),
    Row("A24", "0.6.0", "verl>=0.8", "CRASH", "trinity.trainer.verl.monkey_patch:_build_module",
        "AssertionError: Torch not compiled with CUDA enabled", 6, fixed=True),
    Row("A28", "0.6.0", "verl<0.8", "HANG", "trinity.trainer.verl_legacy.verl_config:Trainer.device", "pending", 6, fixed=True),
    Row("A29", "0.6.0", "verl<0.8", "CRASH", "trinity.trainer.verl_legacy.fsdp_workers:ActorRolloutRefWorker._build_model_optimizer",
        "AssertionError: Torch not compiled with CUDA enabled", 6, fixed=True),
    Row("A30", "0.6.0", "verl<0.8", "CRASH", "trinity.trainer.verl_legacy.fsdp_workers:ActorRolloutRefWorker.sync_weight",
        "AssertionError: Torch not compiled with CUDA enabled", 6, fixed=True),
    # N rows: not on the map, found by npu-compat's own whole runs (tests/e2e/FINDINGS.md)
    Row("N1", "0.6.0", "any", "CRASH", "trinity.common.models.vllm_model:vLLMRolloutModel.__init__",
        "ValueError: FRACTAL_NZ mode is enabled", 16, fixed=True),
    # trinity-rft 0.5.2 (stack c)
    Row("1", "0.5.2", "any", "WRONG", "trinity.common.config_validator:RayClusterConfigValidator._set_cluster_info",
        "AssertionError: Trinity counted 0 accelerators per node", 7, fixed=True),
    Row("6", "0.5.2", "any", "HANG", "trinity.common.models:_BundleAllocator.__init__", "pending", 5, fixed=True),
    Row("7", "0.5.2", "any", "HANG", "trinity.common.models:create_vllm_inference_models",
        "ValueError: Cannot schedule vLLMRolloutModel", 7, fixed=True),
    Row("13", "0.5.2", "any", "CRASH", "trinity.common.models.vllm_worker:WorkerExtension.init_process_group",
        "AssertionError", 5, fixed=True),
    Row("15", "0.5.2", "any", "CRASH", "trinity.utils.distributed:init_process_group", "AssertionError", 5, fixed=True),
    Row("16", "0.5.2", "any", "HANG", "trinity.trainer.verl.verl_config:Trainer.device", "pending", 7, fixed=True),
    Row("25", "0.5.2", "any", "CRASH", "trinity.trainer.verl.fsdp_workers:ActorRolloutRefWorker.sync_weight",
        "AssertionError: Torch not compiled with CUDA enabled", 7, fixed=True),
)  # fmt: skip

# Row 7's green twin counts the rollout actor as scheduled once Ray has started its worker process in
# the NPU bundle (GCS actor table). 0.5.2's vLLMRolloutModel then builds its vLLM engine inside __init__,
# which the probe (no model on disk) cannot do; the constructor's error is reported in the detail.

#: HANG/CRASH rows of the map without a catalogue probe: where they are driven instead, or why not.
NOT_YET_DRIVEN: dict[str, str] = {
    "A8": "green across two processes in tests/patches/test_weight_sync.py; stock never reaches it: the "
    "trainer side crashes first (row A17)",
    "A20": "driven by tests/e2e (both twins): stock hangs on the verl worker group's GPU placement group, "
    "npu-compat gets it ready (stack a, verl 0.8; the legacy path's row is A28, a catalogue row)",
    "14": "driven across two processes by tests/patches/test_weight_sync_052.py, both twins (stock: "
    "test_without_npu_compat_neither_side_forms_the_group)",
    "23": "driven across two processes by tests/patches/test_weight_sync_052.py, both twins (stock: "
    "test_without_npu_compat_neither_side_forms_the_group)",
}


def applicable(trinity: str, verl: str) -> list[Row]:
    """The rows that apply to an installed trinity-rft / verl pair."""
    from packaging.version import Version

    legacy = Version(verl) < Version("0.8")
    out = []
    for row in ROWS:
        if row.trinity != trinity:
            continue
        if (row.trainer == "verl>=0.8" and legacy) or (row.trainer == "verl<0.8" and not legacy):
            continue
        out.append(row)
    return out
