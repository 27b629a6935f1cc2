"""The break catalogue as data: every place where released Trinity-RFT breaks on Ascend.

A row names the upstream code (``module:qualname``, never a line number), what breaks there on an
Ascend host, the npu-compat patches that handle it (ids of ``npu_compat._catalog.SPECS``), and how it is
driven.  Ids: ``A<n>`` rows are trinity-rft 0.6.0, ``B<n>`` rows trinity-rft 0.5.2, ``N<n>`` rows were
found by npu-compat's own whole runs.  Code and tests cite rows by these ids.

A row with ``red`` has a catalogue probe (``probe_<id>`` in ``probes.py``), and
``tests/catalogue/test_catalogue.py`` runs its twins: ``test_red[<id>]`` (stock fails as ``red`` says) and
``test_green[<id>]`` (npu-compat passes).  A row without one says in ``elsewhere`` where it is driven
instead, or why it is not.  ``python -m tests.catalogue`` renders ``docs/break-map.md`` from these rows.
"""

from __future__ import annotations

from dataclasses import dataclass

#: severities: see docs/break-map.md
HANG, CRASH, WRONG, OK = "HANG", "CRASH", "WRONG", "OK"
#: trainer paths of trinity-rft 0.6.0
ANY, NEW, LEGACY = "any", "verl>=0.8", "verl<0.8"


@dataclass(frozen=True)
class Row:
    id: str  # A<n>: trinity-rft 0.6.0; B<n>: 0.5.2; N<n>: found by npu-compat's own runs
    trinity: str  # "0.6.0" or "0.5.2"
    trainer: str  # "any", "verl>=0.8" (trinity.trainer.verl) or "verl<0.8" (trinity.trainer.verl_legacy)
    severity: str  # HANG, CRASH, WRONG or OK
    where: str  # module:qualname of the upstream code
    breaks: str  # what breaks on Ascend, one sentence
    patches: tuple[str, ...] = ()  # the npu-compat patch ids that handle it
    red: str = ""  # with a catalogue probe: "pending", or the start of the error a user sees
    elsewhere: str = ""  # without a probe: where the row is driven instead, or why it is not

    @property
    def probe(self) -> str:
        """The probe's name in ``probes.py`` (``probe_<id>``) and its key in the probe results."""
        return self.id

    @property
    def probed(self) -> bool:
        return bool(self.red)


_NO_CUDA = "AssertionError: Torch not compiled with CUDA enabled"
_WRONG_ROWS = "`tests/patches/test_trinity_wrong_rows.py` (npu-compat, stock and the CUDA decision)"
_SYNC_052 = (
    "`tests/patches/test_weight_sync_052.py` across two processes, both twins (stock: "
    "`test_without_npu_compat_neither_side_forms_the_group`)"
)
_COMPILE = "`tests/patches/test_torch_compile.py` (stock compiles; off on an NPU without an Inductor backend)"

ROWS: tuple[Row, ...] = (
    # -- trinity-rft 0.6.0 -------------------------------------------------------------------------------
    Row("A1", "0.6.0", ANY, WRONG, "trinity.common.config_validator:RayClusterConfigValidator._set_cluster_info",
        "It fills `gpu_per_node` from each node's Ray `GPU` resource, which is 0 on an NPU cluster, so the run "
        "stops in config validation.",
        ("trinity.config_validator.npu_count",), red="AssertionError: Trinity counted 0 accelerators per node"),
    Row("A2", "0.6.0", ANY, WRONG, "trinity.common.config_validator:ExplorerConfigValidator",
        "In colocate mode it sets the rollout model's `cuda_visible_devices` to `\"0\"`, which only ever reaches "
        "`CUDA_VISIBLE_DEVICES`, a variable Ascend ignores (A7).",
        ("trinity.vllm_model.visible_devices",), elsewhere=_WRONG_ROWS),
    Row("A3", "0.6.0", ANY, WRONG, "trinity.common.config_validator:GPUMemoryValidator",
        "The trainer memory check asks `torch.cuda` for a device, finds none, logs \"NO GPU DETECTED\" and skips; "
        "its FSDP threshold and advice follow `PYTORCH_CUDA_ALLOC_CONF`, which torch_npu does not read.",
        ("trinity.config_validator.npu_memory_check", "trinity.config_validator.npu_alloc_conf"),
        elsewhere=_WRONG_ROWS),
    Row("A5", "0.6.0", ANY, HANG, "trinity.common.models.allocator:Allocator.create_all_models",
        "The rollout engines' placement group asks for `{\"GPU\": n}` bundles and awaits them; on an NPU-only "
        "cluster they never become ready.",
        ("ray.placement_group",), red="pending"),
    Row("A6", "0.6.0", ANY, HANG, "trinity.common.models.allocator:get_model_wrapper",
        "Each rollout actor is created with `num_gpus`, which Ray can never satisfy where the accelerators are "
        "`NPU` resources.",
        ("ray.options.actor",), red="ValueError: Cannot schedule vLLMRolloutModel"),
    Row("A7", "0.6.0", ANY, WRONG, "trinity.common.models.vllm_model:vLLMRolloutModel.__init__",
        "It exports the configured visible devices as `CUDA_VISIBLE_DEVICES`, which neither torch_npu nor "
        "vllm-ascend reads, so the rollout engine keeps every device Ray gave the actor.",
        ("trinity.vllm_model.visible_devices",), elsewhere=_WRONG_ROWS),
    Row("A8", "0.6.0", ANY, CRASH, "trinity.common.models.vllm_model:vLLMRolloutModel",
        "For `sync_method: nccl` it asks vLLM for the `nccl` weight-transfer engine, which is built on NCCL and "
        "cannot run on Ascend.",
        ("vllm.weight_transfer.nccl_is_hccl",),
        elsewhere="Green across two processes in `tests/patches/test_weight_sync.py`; stock never reaches it: "
        "the trainer side crashes first (A17)"),
    Row("A9", "0.6.0", ANY, CRASH, "trinity.common.models.vllm_model:vLLMRolloutModel",
        "It hands vLLM a `worker_cls` that subclasses vLLM's CUDA `Worker`, and vllm-ascend substitutes its "
        "`NPUWorker` only for `worker_cls=\"auto\"`.",
        ("trinity.vllm.worker_cls",),
        elsewhere="The probe of A12 drives it: the worker class it names is A12's"),
    Row("A12", "0.6.0", ANY, CRASH, "trinity.common.models.vllm_worker:TrinityGPUWorker",
        "The worker class every spawned vLLM process resolves is built on vLLM's GPU `Worker`, which cannot run on "
        "an NPU host.",
        ("trinity.vllm.worker_cls",), red="AssertionError: GPU worker class chosen on an NPU host"),
    Row("A13", "0.6.0", ANY, CRASH,
        "trinity.common.models.vllm_extension:CheckpointWeightTransferEngine.init_transfer_engine",
        "Checkpoint and memory weight sync build the rollout side's group with vLLM's NCCL engine "
        "(`PyNcclCommunicator`), in every sync mode, and that group cannot form on Ascend.",
        ("trinity.vllm_extension.hccl_group",), red="AssertionError: the weight-sync group did not reduce"),
    Row("A14", "0.6.0", ANY, CRASH,
        "trinity.common.models.vllm_extension:CheckpointWeightTransferEngine.receive_weights",
        "Moving the synced weights compares `device.type` with `\"cuda\"` and calls `.to(\"cuda\")`, "
        "`torch.empty(device=\"cuda\")` and `torch.cuda.current_stream()`, all of which fail on torch_npu.",
        ("trinity.vllm_extension.produce_checkpoint_weights.cuda_literals",
         "trinity.vllm_extension.consume_checkpoint_weights.cuda_literals", "trinity.vllm_extension.cuda"),
        red=_NO_CUDA),
    Row("A16", "0.6.0", ANY, CRASH, "trinity.utils.distributed:init_process_group",
        "It asserts `backend == \"nccl\"` and `is_nccl_available()`, so no weight-sync group can be built over HCCL "
        "(0.6.0 reaches it on its SGLang path).",
        ("trinity.distributed.init_process_group",), red="AssertionError"),
    Row("A17", "0.6.0", ANY, CRASH, "trinity.utils.distributed:VLLMWeightTransferEngine",
        "The trainer side of `sync_method: nccl` calls vLLM's `NCCLWeightTransferEngine` and its send arguments "
        "directly, and tears down with a `destroy()` that vllm-ascend's `PyHcclCommunicator` does not have.",
        ("trinity.distributed.vllm_weight_transfer",), red="RuntimeError: torch.cuda.Stream requires CUDA support"),
    Row("A20", "0.6.0", NEW, HANG, "trinity.trainer.verl.trainer:VERLTrainer.__init__",
        "It hard-codes `device_name = \"cuda\"` for verl's `RayWorkerGroup`, whose GPU placement group an NPU-only "
        "cluster never grants.",
        ("trinity.verl.trainer.device_name",),
        elsewhere="`tests/e2e/test_trinity_run.py`, both twins: stock hangs on the verl worker group's GPU "
        "placement group, npu-compat gets it ready (verl 0.8; the legacy path's row is A28, which has a probe)"),
    Row("A21", "0.6.0", NEW, CRASH, "trinity.trainer.verl.workers:TrinityActorRolloutRefWorker._save_lora",
        "Saving a LoRA adapter calls `torch.cuda.current_device()`, which raises on torch_npu.",
        ("trinity.verl.workers.cuda",),
        red="RuntimeError: LoRA adapter not saved: Save LoRA adapter error: Torch not compiled with CUDA enabled"),
    Row("A22", "0.6.0", NEW, CRASH, "trinity.trainer.verl.workers:TrinityActorRolloutRefWorker.sync_weight_nccl",
        "After the NCCL weight sync it calls `torch.cuda.synchronize()`, which raises on torch_npu.",
        ("trinity.verl.workers.cuda",), red=_NO_CUDA),
    Row("A23", "0.6.0", NEW, CRASH, "trinity.trainer.verl.fsdp_engine:fsdp_sync_weight_nccl",
        "The FSDP engine's weight helpers call `torch.cuda.synchronize()`, which raises on torch_npu, and take "
        "their offload flag from verl's `is_cuda_available`, which is False on Ascend.",
        ("trinity.verl.fsdp_engine.cuda",), red=_NO_CUDA),
    Row("A24", "0.6.0", NEW, CRASH, "trinity.trainer.verl.monkey_patch:_build_module",
        "Every model build asks `torch.cuda.get_device_capability(0)`, which raises on torch_npu.",
        ("trinity.verl.monkey_patch.cuda",), red=_NO_CUDA),
    Row("A26", "0.6.0", NEW, CRASH, "trinity.trainer.verl.config:_build_actor_config",
        "The actor config turns `use_torch_compile` on, and where torch_npu brings no Inductor backend for npu "
        "the first training step fails compiling verl's entropy helper.",
        ("trinity.verl.config.torch_compile",), elsewhere=_COMPILE),
    Row("A28", "0.6.0", LEGACY, HANG, "trinity.trainer.verl_legacy.verl_config:Trainer.device",
        "`trainer.device` defaults to `\"cuda\"`, so verl asks Ray for GPU bundles and `num_gpus` workers that an "
        "NPU-only cluster never schedules.",
        ("trinity.verl_legacy.trainer_device",), red="pending"),
    Row("A29", "0.6.0", LEGACY, CRASH,
        "trinity.trainer.verl_legacy.fsdp_workers:ActorRolloutRefWorker._build_model_optimizer",
        "Building the model asks `torch.cuda.get_device_capability(0)`, which raises on torch_npu.",
        ("trinity.verl_legacy.fsdp_workers.cuda",), red=_NO_CUDA),
    Row("A30", "0.6.0", LEGACY, CRASH, "trinity.trainer.verl_legacy.fsdp_workers:ActorRolloutRefWorker.sync_weight",
        "After the weight sync it calls `torch.cuda.synchronize()`, which raises on torch_npu.",
        ("trinity.verl_legacy.fsdp_workers.cuda",), red=_NO_CUDA),
    Row("A35", "0.6.0", ANY, WRONG, "trinity.utils.lora_utils:create_dummy_lora",
        "It frees the dummy LoRA model with `torch.cuda.empty_cache()`, which does nothing on Ascend.",
        ("trinity.lora_utils.empty_cache",), elsewhere=_WRONG_ROWS),
    # -- found by npu-compat's own whole runs ----------------------------------------------------------
    Row("N1", "0.6.0", ANY, CRASH, "trinity.common.models.vllm_model:vLLMRolloutModel.__init__",
        "The rollout's vLLM engine starts with vllm-ascend's default `VLLM_ASCEND_ENABLE_NZ=1`, and its "
        "`NPUWorker` then refuses every RL weight update; verl's own vLLM rollout sets 0 on NPU, Trinity does not.",
        ("trinity.vllm_model.weights_not_nz",), red="ValueError: FRACTAL_NZ mode is enabled"),
    # -- trinity-rft 0.5.2 (verl 0.7.1) ----------------------------------------------------------------
    Row("B1", "0.5.2", ANY, WRONG, "trinity.common.config_validator:RayClusterConfigValidator._set_cluster_info",
        "As A1: it counts each node's Ray `GPU` resource, 0 on an NPU cluster, and the run stops in validation.",
        ("trinity.config_validator.npu_count",), red="AssertionError: Trinity counted 0 accelerators per node"),
    Row("B2", "0.5.2", ANY, WRONG, "trinity.common.config_validator:ExplorerConfigValidator",
        "As A2: colocate mode's `cuda_visible_devices=\"0\"` only reaches `CUDA_VISIBLE_DEVICES` (B9).",
        ("trinity.vllm_model.visible_devices",), elsewhere=_WRONG_ROWS),
    Row("B3", "0.5.2", ANY, WRONG, "trinity.common.config_validator:GPUMemoryValidator",
        "As A3: the trainer memory check skips with \"NO GPU DETECTED\" and follows `PYTORCH_CUDA_ALLOC_CONF`.",
        ("trinity.config_validator.npu_memory_check", "trinity.config_validator.npu_alloc_conf"),
        elsewhere=_WRONG_ROWS),
    Row("B6", "0.5.2", ANY, HANG, "trinity.common.models:_BundleAllocator.__init__",
        "It builds a `PACK` placement group of `{\"GPU\": 1}` bundles and waits for it, forever on an NPU-only "
        "cluster.",
        ("ray.placement_group",), red="pending"),
    Row("B7", "0.5.2", ANY, HANG, "trinity.common.models:create_vllm_inference_models",
        "A rollout actor with `tensor_parallel_size: 1` is created with `num_gpus=1`, which Ray never schedules on an "
        "NPU-only cluster.",
        ("ray.options.actor",), red="ValueError: Cannot schedule vLLMRolloutModel"),
    Row("B9", "0.5.2", ANY, WRONG, "trinity.common.models.vllm_model:vLLMRolloutModel.__init__",
        "As A7: the visible devices go to `CUDA_VISIBLE_DEVICES`, and the vLLM engine this `__init__` builds right "
        "after keeps every device of the actor.",
        ("trinity.vllm_model.visible_devices",), elsewhere=_WRONG_ROWS),
    Row("B12", "0.5.2", ANY, WRONG, "trinity.common.models.vllm_model:vLLMRolloutModel.init_process_group",
        "Its `backend` defaults to `\"nccl\"` and goes to the vLLM workers, where B13 builds the weight-sync group "
        "with it.",
        ("trinity.distributed.init_process_group",), elsewhere=_SYNC_052),
    Row("B13", "0.5.2", ANY, CRASH, "trinity.common.models.vllm_worker:WorkerExtension.init_process_group",
        "The rollout side builds the weight-sync group with `backend=\"nccl\"` through its by-name copy of "
        "`trinity.utils.distributed.init_process_group` (B15), which refuses it on Ascend.",
        ("trinity.distributed.init_process_group",), red="AssertionError"),
    Row("B14", "0.5.2", ANY, CRASH, "trinity.common.models.vllm_worker:WorkerExtension.update_weight",
        "Receiving the synced weights calls `torch.cuda.synchronize()` and `torch.cuda.empty_cache()`, and the first "
        "raises on torch_npu.",
        ("trinity.vllm_worker.cuda",), elsewhere=_SYNC_052),
    Row("B15", "0.5.2", ANY, CRASH, "trinity.utils.distributed:init_process_group",
        "As A16: it asserts `backend == \"nccl\"` and `is_nccl_available()`; `vllm_worker`, `fsdp_workers` and "
        "`megatron_workers` import it by name, so every copy needs the fix.",
        ("trinity.distributed.init_process_group",), red="AssertionError"),
    Row("B16", "0.5.2", ANY, HANG, "trinity.trainer.verl.verl_config:Trainer.device",
        "`trainer.device` defaults to `\"cuda\"` and Trinity bypasses verl's `auto_set_device`, so verl asks Ray "
        "for `{\"CPU\": 3, \"GPU\": 1}` `STRICT_PACK` bundles and `num_gpus` workers.",
        ("trinity.verl.trainer_device",), red="pending"),
    Row("B20", "0.5.2", ANY, WRONG, "trinity.trainer.verl.fsdp_workers:ActorRolloutRefWorker",
        "The FSDP worker frees memory with `torch.cuda.empty_cache()`, which does nothing on Ascend (the first of "
        "two such calls; B22 is the other).",
        ("trinity.verl.fsdp_workers.cuda",), elsewhere=_SYNC_052),
    Row("B22", "0.5.2", ANY, WRONG, "trinity.trainer.verl.fsdp_workers:ActorRolloutRefWorker",
        "The second `torch.cuda.empty_cache()` of the FSDP worker (B20), again a no-op on Ascend.",
        ("trinity.verl.fsdp_workers.cuda",), elsewhere=_SYNC_052),
    Row("B23", "0.5.2", ANY, CRASH, "trinity.trainer.verl.fsdp_workers:ActorRolloutRefWorker.setup_weight_sync_group",
        "The trainer side builds the weight-sync group with `backend=\"nccl\"` and a `torch.device(\"cuda:N\")` "
        "device id, through its by-name copy of B15's function.",
        ("trinity.distributed.init_process_group",), elsewhere=_SYNC_052),
    Row("B25", "0.5.2", ANY, CRASH, "trinity.trainer.verl.fsdp_workers:ActorRolloutRefWorker.sync_weight",
        "After the weight sync it calls `torch.cuda.synchronize()`, which raises on torch_npu.",
        ("trinity.verl.fsdp_workers.cuda",), red=_NO_CUDA),
    Row("B29", "0.5.2", ANY, CRASH, "verl.workers.actor.dp_actor:DataParallelPPOActor.__init__",
        "verl 0.7.1's actor compiles `entropy_from_logits` unless its config says `use_torch_compile: False`, a key "
        "Trinity's config lacks, and without an Inductor backend for npu the first training step fails (trinity "
        "0.6.0's legacy trainer meets the same code).",
        ("verl.dp_actor.torch_compile",), elsewhere=_COMPILE),
    Row("B32", "0.5.2", ANY, WRONG, "trinity.utils.lora_utils:create_dummy_lora",
        "As A35: the dummy LoRA model is freed with `torch.cuda.empty_cache()`, a no-op on Ascend.",
        ("trinity.lora_utils.empty_cache",), elsewhere=_WRONG_ROWS),
)  # fmt: skip

# B7's green twin counts the rollout actor as scheduled once Ray has started its worker process in the
# NPU bundle (GCS actor table). 0.5.2's vLLMRolloutModel then builds its vLLM engine inside __init__,
# which the probe (no model on disk) cannot do; the constructor's error is reported in the detail.

#: Code of trinity-rft 0.5.2 that is already device-aware through verl's helpers: left alone, no id.
ALREADY_FINE: tuple[str, ...] = (
    "the FSDP process group, built as `cpu:gloo,{device}:{backend}` from verl's helpers",
    "`checkpoint_converter`, which takes its backend from verl's `get_nccl_backend`",
    "verl's resource check, which falls back to the `NPU` resource",
)

#: Ids of the inventory the rows were read from that npu-compat leaves out of scope.
OUT_OF_SCOPE: dict[str, str] = {
    "SGLang": "A15, A18, A37",
    "Megatron": "A27, A33",
    "`trinity perf` (NVML)": "A36",
}


def applicable(trinity: str, verl: str) -> list[Row]:
    """The rows with a catalogue probe that apply to an installed trinity-rft / verl pair."""
    from packaging.version import Version

    legacy = Version(verl) < Version("0.8")
    out = []
    for row in ROWS:
        if not row.probed or row.trinity != trinity:
            continue
        if (row.trainer == NEW and legacy) or (row.trainer == LEGACY and not legacy):
            continue
        out.append(row)
    return out
