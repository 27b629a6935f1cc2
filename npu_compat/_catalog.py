"""Every built-in patch, as data (read by the engine, by ``report()`` and by ``doctor``).

Listing this catalogue imports no upstream module.  Specs are grouped by target; within
one target they apply in the order listed (a later spec wraps an earlier one).  A reason that
cites a row (A14, B16, N1) means a row of the break map, ``docs/break-map.md``.
"""

from ._spec import PatchSpec

_P = "npu_compat.patches."

# -- torch.distributed ---------------------------------------------------------------------------------
_TORCH = "torch"
_TORCH_RANGE = ">=2.5,<2.15"
_C10D = "torch.distributed.distributed_c10d"
TORCH_SPECS = (
    PatchSpec(
        "torch.distributed.init_process_group",
        f"{_C10D}:init_process_group",
        distribution=_TORCH,
        versions=_TORCH_RANGE,
        wrapper=_P + "torch_distributed:init_process_group",
        copies=["torch.distributed"],
        expects=["backend", "device_id"],
        why="upstream asks for nccl / cpu:gloo,cuda:nccl and cuda:N ids; torch_npu registers hccl for npu",
        upstream_fix="device-aware backend selection (verl.utils.device.get_nccl_backend)",
        remove_when="the upstream callers select hccl on NPU themselves",
    ),
    PatchSpec(
        "torch.distributed.new_group",
        f"{_C10D}:new_group",
        distribution=_TORCH,
        versions=_TORCH_RANGE,
        wrapper=_P + "torch_distributed:new_group",
        copies=["torch.distributed"],
        expects=["backend", "device_id"],
        why="sub-groups are created with backend='nccl' by upstream code",
        remove_when="the upstream callers select hccl on NPU themselves",
    ),
    PatchSpec(
        "torch.distributed.DeviceMesh",
        "torch.distributed.device_mesh:DeviceMesh.__init__",
        distribution=_TORCH,
        versions=_TORCH_RANGE,
        wrapper=_P + "torch_distributed:device_type_first",
        expects=["device_type"],
        why="a DeviceMesh built directly for device_type='cuda' (FSDP code that slices a mesh it made)",
        remove_when="the upstream callers pass the device name they detected",
    ),
    PatchSpec(
        "torch.distributed.init_device_mesh",
        "torch.distributed.device_mesh:init_device_mesh",
        distribution=_TORCH,
        versions=_TORCH_RANGE,
        wrapper=_P + "torch_distributed:device_type_first",
        copies=["torch.distributed"],
        expects=["device_type"],
        why="device meshes are built for device_type='cuda'",
        remove_when="the upstream callers pass the device name they detected",
    ),
)

# -- Ray -----------------------------------------------------------------------------------------------
_RAY = "ray"
_RAY_RANGE = ">=2.40,<3"
_GUARD_WHY = (
    "a GPU request on an NPU-only cluster waits forever without a word; say who asked and how to fix it"
)
RAY_SPECS = (
    # the guards first: applied first, they sit inside the rewrite and see what still asks for a GPU
    PatchSpec(
        "ray.guard.actor",
        "ray.actor:ActorClass._remote",
        distribution=_RAY,
        versions=_RAY_RANGE,
        wrapper=_P + "ray_resources:guard_remote",
        why=_GUARD_WHY,
    ),
    PatchSpec(
        "ray.guard.task",
        "ray.remote_function:RemoteFunction._remote",
        distribution=_RAY,
        versions=_RAY_RANGE,
        wrapper=_P + "ray_resources:guard_remote",
        why=_GUARD_WHY,
    ),
    PatchSpec(
        "ray.guard.placement_group",
        "ray.util.placement_group:placement_group",
        distribution=_RAY,
        versions=_RAY_RANGE,
        wrapper=_P + "ray_resources:guard_placement_group",
        why=_GUARD_WHY,
        copies=[
            "ray.util",
            "trinity.common.models.allocator",
            "trinity.common.models",
            "verl.single_controller.ray.base",
        ],
    ),
    PatchSpec(
        "ray.options.actor",
        "ray.actor:ActorClass._remote",
        distribution=_RAY,
        versions=_RAY_RANGE,
        wrapper=_P + "ray_resources:remote_options",
        why="num_gpus=n actors can never be scheduled on an NPU cluster: request resources={'NPU': n}",
        upstream_fix="callers request the accelerator resource of the platform (vLLM: ray_device_key)",
        remove_when="Trinity and verl request NPU resources on Ascend",
    ),
    PatchSpec(
        "ray.options.task",
        "ray.remote_function:RemoteFunction._remote",
        distribution=_RAY,
        versions=_RAY_RANGE,
        wrapper=_P + "ray_resources:remote_options",
        why="num_gpus=n tasks can never be scheduled on an NPU cluster: request resources={'NPU': n}",
        remove_when="Trinity and verl request NPU resources on Ascend",
    ),
    PatchSpec(
        "ray.placement_group.copies",
        "ray.util.placement_group:validate_placement_group",
        distribution=_RAY,
        versions=_RAY_RANGE,
        wrapper=_P + "ray_resources:bundles_in_place",
        why="a copy of placement_group bound before activation, in a module npu-compat does not know, "
        "bypasses ray.placement_group; its GPU bundles are rewritten where Ray validates them",
        remove_when="Trinity and verl build NPU bundles on Ascend",
    ),
    PatchSpec(
        "ray.placement_group",
        "ray.util.placement_group:placement_group",
        distribution=_RAY,
        versions=_RAY_RANGE,
        wrapper=_P + "ray_resources:placement_group_bundles",
        expects=["bundles"],
        copies=[
            "ray.util",
            "trinity.common.models.allocator",
            "trinity.common.models",
            "verl.single_controller.ray.base",
        ],
        why="{'GPU': n} bundles never become ready on an NPU cluster: ask for {'NPU': n}",
        remove_when="Trinity and verl build NPU bundles on Ascend",
    ),
    PatchSpec(
        "ray.npu.visible_devices_ascending",
        "ray._private.accelerators.npu:NPUAcceleratorManager.set_current_process_visible_accelerator_ids",
        distribution=_RAY,
        versions=_RAY_RANGE,
        wrapper=_P + "ray_devices:visible_devices_ascending",
        expects=["visible_npu_devices"],
        why="Ray sets a worker's ASCEND_RT_VISIBLE_DEVICES in the order it assigned the NPUs (2,1); CANN "
        "refuses ids that do not ascend and torch_npu sees no device (field failure F9): set them ascending",
        upstream_fix="Ray sorting the NPU ids it sets, as vLLM's Ray executor sorts each node's devices",
        remove_when="Ray sets ASCEND_RT_VISIBLE_DEVICES in ascending order",
    ),
)

# -- vLLM ----------------------------------------------------------------------------------------------
VLLM_SPECS = (
    PatchSpec(
        "vllm.weight_transfer.nccl_is_hccl",
        "vllm.distributed.weight_transfer.factory:WeightTransferEngineFactory.create_engine",
        distribution="vllm", versions=">=0.18,<0.24", wrapper=_P + "vllm_weight_transfer:hccl_for_nccl",
        why="WeightTransferConfig(backend='nccl') (Trinity's sync_method: nccl) builds vLLM's NCCL engine "
        "in the rollout workers; on Ascend the collective engine is vllm-ascend's 'hccl' (row A8)",
        upstream_fix="vllm-ascend's global platform patch remaps 'nccl' in the factory (0.23.0.post1)",
        remove_when="always safe to keep; redundant where vllm-ascend's remap is active",
    ),
)  # fmt: skip

# -- vllm-ascend ---------------------------------------------------------------------------------------
VLLM_ASCEND_SPECS = (
    PatchSpec(
        "vllm_ascend.pyhccl.library_required",
        "vllm_ascend.distributed.device_communicators.pyhccl:PyHcclCommunicator.__init__",
        distribution="vllm-ascend", versions=">=0.18,<0.24",
        wrapper=_P + "vllm_ascend_pyhccl:loud_when_disabled",
        expects=["group", "device", "library_path"],
        why="a PyHcclCommunicator that cannot load libhccl.so (or HCCL_SO_PATH) disables itself without an "
        "error, and each broadcast then does nothing: Trinity's HCCL weight sync would leave the rollout "
        "on its old weights. Such a communicator of more than one rank is now an error naming the library",
        upstream_fix="vllm-ascend raising where the HCCL library is missing on an NPU host",
        remove_when="the released PyHcclCommunicator fails loudly itself",
    ),
    PatchSpec(
        "vllm_ascend.worker.weight_update_noted",
        "vllm_ascend.worker.worker:NPUWorker.start_weight_update",
        distribution="vllm-ascend", versions=">=0.23,<0.24",
        wrapper=_P + "vllm_ascend_weight_update:note_at_start",
        why="notes the storage of every parameter, buffer and derived tensor when an RL weight update "
        "starts, for vllm_ascend.worker.weight_update_graph_safe (field failure F1)",
        upstream_fix="vllm-ascend's graph-safe weight updates (RFC 'Make live weight updates transactional')",
        remove_when="a vllm-ascend release whose reload keeps every storage the ACL graphs read",
    ),
    PatchSpec(
        "vllm_ascend.worker.weight_update_graph_safe",
        "vllm_ascend.worker.worker:NPUWorker.finish_weight_update",
        distribution="vllm-ascend", versions=">=0.23,<0.24",
        wrapper=_P + "vllm_ascend_weight_update:put_back_at_finish",
        why="an ACL graph replays the memory it was captured with and vllm-ascend cannot capture again: an "
        "update (vLLM's layerwise reload) that re-allocates a tensor would leave the rollout generating from "
        "the old weights (field failure F1). After the update every tensor is back in its storage, and "
        "the log says how many had moved",
        upstream_fix="vllm-ascend's graph-safe weight updates (RFC 'Make live weight updates transactional')",
        remove_when="a vllm-ascend release whose reload keeps every storage the ACL graphs read",
    ),
)  # fmt: skip

# -- torch.compile (rows A26, B29) ---------------------------------------------------------------------
_NO_NPU_COMPILER = _P + "torch_compile:no_npu_compiler"
COMPILE_SPECS = (
    PatchSpec(
        "trinity.verl.config.torch_compile",
        "trinity.trainer.verl.config:_build_actor_config",
        distribution="trinity-rft",
        versions=">=0.6.0,<0.7",
        condition=_NO_NPU_COMPILER,
        wrapper=_P + "torch_compile:actor_config_without_compile",
        why="the actor config turns torch.compile on; inductor has no Ascend backend (row A26). A "
        "use_torch_compile set in trainer_config is merged afterwards and wins",
        remove_when="an Ascend torch.compile backend ships with torch_npu by default",
    ),
    PatchSpec(
        "verl.dp_actor.torch_compile",
        "verl.workers.actor.dp_actor:DataParallelPPOActor.__init__",
        distribution="verl",
        versions=">=0.7.1,<0.8",
        condition=_NO_NPU_COMPILER,
        wrapper=_P + "torch_compile:dp_actor_without_compile",
        why="verl compiles entropy_from_logits unless use_torch_compile is False; Trinity's configs "
        "have no such key (row B29, and trinity 0.6's legacy trainer). An explicit value is kept",
        remove_when="an Ascend torch.compile backend ships with torch_npu by default",
    ),
)

# -- Trinity-RFT, both releases ------------------------------------------------------------------------
_TRINITY = "trinity-rft"
_NO_NATIVE = _P + "trinity_common:no_native_npu"
TRINITY_SPECS = (
    PatchSpec(
        "trinity.config_validator.npu_count",
        "trinity.common.config_validator:ray",
        distribution=_TRINITY,
        versions=">=0.5.2,<0.7",
        condition=_NO_NATIVE,
        replacement=_P + "ray_resources:ray_counting_npus",
        why="the cluster validator sizes gpu_per_node from each node's 'GPU' resource: 0 on an NPU cluster, "
        "and the run stops in validation (rows A1, B1)",
        upstream_fix="Trinity's merged NPU support counts the detected device's resource",
        remove_when="a trinity-rft release with trinity.utils.device",
    ),
    PatchSpec(
        "trinity.distributed.init_process_group",
        "trinity.utils.distributed:init_process_group",
        distribution=_TRINITY,
        versions=">=0.5.2,<0.7",
        condition=_NO_NATIVE,
        replacement=_P + "trinity_distributed:hccl_init_process_group",
        copies=[
            "trinity.common.models.vllm_worker",
            "trinity.trainer.verl.fsdp_workers",
            "trinity.trainer.verl.megatron_workers",
        ],
        expects=["backend", "device_id"],
        why="asserts backend == 'nccl' and is_nccl_available(): the weight-sync group cannot form over HCCL "
        "(rows A16, B15)",
        upstream_fix="Trinity's merged NPU support (trinity.utils.device) picks the backend per device",
        remove_when="a trinity-rft release with trinity.utils.device",
    ),
)

_NATIVE_RELEASE = "a trinity-rft release with trinity.utils.device"
_CFG = _P + "trinity_config:"
_VIEW = _P + "torch_view:torch_for_npu"
_VIEW_WHY = "calls torch.cuda.{calls} on {where}: 'Torch not compiled with CUDA enabled' on Ascend"


def _torch_view(spec_id: str, module: str, versions: str, calls: str, where: str, rows: str) -> PatchSpec:
    """A scoped torch.cuda -> torch.npu view for one upstream module; ``rows`` are its break-map rows."""
    cited = f" (row{'s' if ',' in rows else ''} {rows})"
    return PatchSpec(
        spec_id, f"{module}:torch", distribution=_TRINITY, versions=versions, condition=_NO_NATIVE,
        replacement=_VIEW, why=_VIEW_WHY.format(calls=calls, where=where) + cited,
        upstream_fix="Trinity's merged NPU support calls the device module of the detected device",
        remove_when="a trinity-rft release with trinity.utils.device",
    )  # fmt: skip


# -- Trinity-RFT 0.6.0 ---------------------------------------------------------------------------------
_T06 = ">=0.6.0,<0.7"
_NO_NATIVE_HCCL = _P + "trinity_vllm:has_hccl_engine"
TRINITY_060_SPECS = (
    PatchSpec(
        "trinity.vllm.worker_cls", "trinity.common.models.vllm_worker:TrinityGPUWorker",
        distribution=_TRINITY, versions=_T06, condition=_P + "trinity_vllm:has_npu_worker",
        replacement=_P + "trinity_vllm:npu_worker_class",
        why="worker_cls names a subclass of vLLM's CUDA Worker; vllm-ascend only swaps in NPUWorker for "
        "worker_cls='auto' (rows A9/A12)",
        upstream_fix="Trinity's merged NPU support picks the platform's worker class",
        remove_when="a trinity-rft release with trinity.utils.device",
    ),
    PatchSpec(
        "trinity.distributed.vllm_weight_transfer", "trinity.utils.distributed:VLLMWeightTransferEngine",
        distribution=_TRINITY, versions=_T06, condition=_NO_NATIVE_HCCL,
        replacement=_P + "trinity_vllm:hccl_weight_transfer_engine",
        why="the trainer side of nccl weight sync calls vLLM's NCCLWeightTransferEngine directly and "
        "destroy()s a communicator PyHcclCommunicator does not have (row A17)",
        upstream_fix="Trinity's merged NPU support uses vllm-ascend's HCCL engine",
        remove_when="a trinity-rft release with trinity.utils.device",
    ),
    PatchSpec(
        "trinity.verl.trainer.device_name", "trinity.trainer.verl.trainer:VERLTrainer._init_workers",
        distribution=_TRINITY, versions=_T06, condition=_NO_NATIVE, wrapper=_CFG + "npu_device_name",
        why="VERLTrainer hard-codes device_name='cuda' for verl's RayWorkerGroup: GPU bundles hang (row A20)",
        upstream_fix="Trinity's merged NPU support passes the detected device", remove_when=_NATIVE_RELEASE,
    ),
    PatchSpec(
        "trinity.verl_legacy.trainer_device", "trinity.trainer.verl_legacy.verl_config:Trainer.__init__",
        distribution=_TRINITY, versions=_T06, condition=_NO_NATIVE, wrapper=_CFG + "npu_default_device",
        why="trainer.device defaults to 'cuda': verl asks Ray for GPU bundles and num_gpus workers (row A28)",
        upstream_fix="verl's auto_set_device, which Trinity bypasses", remove_when=_NATIVE_RELEASE,
    ),
    PatchSpec(
        "trinity.vllm_extension.hccl_group", "trinity.common.models.vllm_extension:NCCLWeightTransferEngine",
        distribution=_TRINITY, versions=_T06, condition=_NO_NATIVE_HCCL,
        replacement=_P + "trinity_vllm:hccl_engine_class",
        why="checkpoint/memory weight sync builds its rollout-side group with vLLM's NCCL engine "
        "(PyNcclCommunicator), in every sync mode (row A13)",
        upstream_fix="Trinity's merged NPU support uses vllm-ascend's HCCL engine",
        remove_when=_NATIVE_RELEASE,
    ),
    *(
        PatchSpec(
            f"trinity.vllm_extension.{name.strip('_')}.cuda_literals",
            f"trinity.common.models.vllm_extension:CheckpointWeightTransferEngine.{name}",
            distribution=_TRINITY, versions=_T06, condition=_NO_NATIVE,
            replacement=_P + "device_literals:npu_literals",
            why=f"{name} moves weights with .to('cuda') / torch.empty(device='cuda') and compares "
            "device.type with 'cuda' (row A14): those exact constants read 'npu'",
            upstream_fix="Trinity's merged NPU support uses the detected device", remove_when=_NATIVE_RELEASE,
        )
        for name in ("_produce_checkpoint_weights", "_consume_checkpoint_weights")
    ),
    _torch_view("trinity.vllm_extension.cuda", "trinity.common.models.vllm_extension", _T06,
                "current_stream", "the rollout side of checkpoint/memory weight sync", "A14"),
    _torch_view("trinity.verl.workers.cuda", "trinity.trainer.verl.workers", _T06,
                "current_device/synchronize", "the trainer's LoRA save and NCCL weight sync", "A21, A22"),
    _torch_view("trinity.verl.fsdp_engine.cuda", "trinity.trainer.verl.fsdp_engine", _T06,
                "synchronize", "the FSDP engine's weight helpers", "A23"),
    _torch_view("trinity.verl.monkey_patch.cuda", "trinity.trainer.verl.monkey_patch", _T06,
                "get_device_capability", "every model build", "A24"),
    _torch_view("trinity.verl_legacy.fsdp_workers.cuda", "trinity.trainer.verl_legacy.fsdp_workers", _T06,
                "get_device_capability/synchronize/empty_cache", "the legacy FSDP workers", "A29, A30"),
)  # fmt: skip

# -- Trinity-RFT 0.5.2 ---------------------------------------------------------------------------------
_T052 = ">=0.5.2,<0.6"
TRINITY_052_SPECS = (
    PatchSpec(
        "trinity.verl.trainer_device", "trinity.trainer.verl.verl_config:Trainer.__init__",
        distribution=_TRINITY, versions=_T052, condition=_NO_NATIVE, wrapper=_CFG + "npu_default_device",
        why="trainer.device defaults to 'cuda': verl asks Ray for {'CPU': 3, 'GPU': 1} bundles (row B16)",
        upstream_fix="verl's auto_set_device, which Trinity bypasses", remove_when=_NATIVE_RELEASE,
    ),
    _torch_view("trinity.verl.fsdp_workers.cuda", "trinity.trainer.verl.fsdp_workers", _T052,
                "empty_cache/synchronize", "the FSDP workers' offload and weight sync", "B20, B22, B25"),
    _torch_view("trinity.vllm_worker.cuda", "trinity.common.models.vllm_worker", _T052,
                "synchronize/empty_cache", "the rollout side of weight sync", "B14"),
)  # fmt: skip

# -- Trinity-RFT, both releases: device settings that silently do the CUDA thing (WRONG rows) ----------
# 0.6.0: A2, A3, A7, A35; 0.5.2: B2, B3, B9, B32 -- the same code in both releases.
TRINITY_DEVICE_SETTINGS_SPECS: "tuple[PatchSpec, ...]" = (
    PatchSpec(
        "trinity.vllm_model.visible_devices", "trinity.common.models.vllm_model:vLLMRolloutModel.__init__",
        distribution=_TRINITY, versions=">=0.5.2,<0.7", condition=_NO_NATIVE,
        wrapper=_P + "trinity_devices:ascend_visible_devices", expects=["config"],
        why="exports config.cuda_visible_devices (colocate mode: '0', set by ExplorerConfigValidator) as "
        "CUDA_VISIBLE_DEVICES, which Ascend ignores: it becomes ASCEND_RT_VISIBLE_DEVICES "
        "(rows A7, A2, B9, B2)",
        upstream_fix="Trinity's merged NPU support exports the detected device's visible-devices variable",
        remove_when=_NATIVE_RELEASE,
    ),
    PatchSpec(
        "trinity.vllm_model.weights_not_nz", "trinity.common.models.vllm_model:vLLMRolloutModel.__init__",
        distribution=_TRINITY, versions=">=0.5.2,<0.7", condition=_P + "trinity_vllm:has_npu_worker",
        wrapper=_P + "trinity_vllm:weights_not_nz",
        why="vllm-ascend's VLLM_ASCEND_ENABLE_NZ defaults to 1, and its NPUWorker then refuses the RL weight "
        "update ('FRACTAL_NZ mode is enabled', row N1): the rollout's vLLM engine gets 0 unless the user "
        "set it, as verl's own vLLM rollout does on NPU",
        upstream_fix="Trinity's merged NPU support sets it like verl (VLLM_ASCEND_REQUIRED_ENV_VARS)",
        remove_when=_NATIVE_RELEASE,
    ),
    PatchSpec(
        "trinity.vllm_worker.graph_safe_sync",
        "trinity.common.models.vllm_worker:WorkerExtension.update_weight",
        distribution=_TRINITY, versions=">=0.5.2,<0.6", condition=_P + "trinity_vllm:has_npu_worker",
        wrapper=_P + "trinity_vllm:graph_safe_sync",
        why="an ACL graph replays the memory it was captured with and vllm-ascend cannot capture again: a "
        "sync whose loader re-allocates a parameter leaves the rollout generating from the old weights "
        "(field failure F1). Every parameter, buffer and derived tensor keeps its storage across the sync",
        upstream_fix="vllm-ascend's graph-safe weight updates (RFC 'Make live weight updates transactional')",
        remove_when="a vllm-ascend release whose reload keeps every storage, or Trinity syncing through it",
    ),
    PatchSpec(
        "trinity.config_validator.npu_memory_check",
        "trinity.common.config_validator:GPUMemoryValidator.validate_trainer_memory_usage",
        distribution=_TRINITY, versions=">=0.5.2,<0.7", condition=_NO_NATIVE,
        wrapper=_P + "trinity_devices:npu_memory_check", expects=["config"],
        why="the trainer memory check asks torch.cuda.is_available() (False on Ascend), logs 'NO GPU "
        "DETECTED' and skips: it runs against torch.npu.get_device_properties(0) (rows A3, B3)",
        upstream_fix="Trinity's merged NPU support asks the detected device module",
        remove_when=_NATIVE_RELEASE,
    ),
    PatchSpec(
        "trinity.config_validator.npu_alloc_conf",
        "trinity.common.config_validator:GPUMemoryValidator._check_max_memory_in_fsdp_training",
        distribution=_TRINITY, versions=">=0.5.2,<0.7", condition=_NO_NATIVE,
        wrapper=_P + "trinity_devices:npu_alloc_conf", expects=["module_name"],
        why="the FSDP memory threshold and advice follow PYTORCH_CUDA_ALLOC_CONF; torch_npu reads "
        "PYTORCH_NPU_ALLOC_CONF (rows A3, B3; with trinity 0.6 reached with verl < 0.8)",
        upstream_fix="Trinity's merged NPU support reads the detected device's allocator variable",
        remove_when=_NATIVE_RELEASE,
    ),
    PatchSpec(
        "trinity.lora_utils.empty_cache", "trinity.utils.lora_utils:create_dummy_lora",
        distribution=_TRINITY, versions=">=0.5.2,<0.7", condition=_NO_NATIVE,
        wrapper=_P + "trinity_devices:npu_empty_cache", copies=["trinity.common.config_validator"],
        why="create_dummy_lora frees the dummy model with torch.cuda.empty_cache(), a no-op on Ascend: "
        "torch.npu.empty_cache() runs after it (rows A35, B32)",
        upstream_fix="Trinity's merged NPU support empties the detected device's cache",
        remove_when=_NATIVE_RELEASE,
    ),
)  # fmt: skip

SPECS: "tuple[PatchSpec, ...]" = (
    *TORCH_SPECS, *RAY_SPECS, *VLLM_SPECS, *VLLM_ASCEND_SPECS, *COMPILE_SPECS,
    *TRINITY_SPECS, *TRINITY_060_SPECS, *TRINITY_052_SPECS, *TRINITY_DEVICE_SETTINGS_SPECS,
)  # fmt: skip

# -- Process seams -------------------------------------------------------------------------------------
# Not a CUDA assumption but a reach: code that breaks on Ascend runs in Ray workers
# started by raylets, which a patch applied only in the driver never reaches.
SEAM_SPECS: "tuple[PatchSpec, ...]" = (
    PatchSpec(
        "ray.worker_setup_hook",
        "ray._private.worker:init",
        distribution="ray",
        # 2.58.0 and 2.60.0 checked (same ray.init keywords, setup-hook loading and
        # job-runtime_env merge); trinity-rft needs ray>=2.50.
        versions=">=2.58,<2.61",
        wrapper="npu_compat.patches.ray_seam:carry_into_workers",
        copies=["ray:init"],
        expects=["runtime_env", "job_config"],
        why=(
            "Ray workers inherit the environment of `ray start`, not of the driver: without this, a "
            "raylet started without npu-compat runs every actor (Explorer, Trainer, vLLM and verl "
            "workers) unpatched. ray.init now adds npu-compat's worker_process_setup_hook (chained "
            "with the job's own) and the NPU_COMPAT_* variables to the job's runtime_env."
        ),
        upstream_fix="none needed: worker_process_setup_hook is Ray's own per-job seam",
        remove_when="never while npu-compat patches code that runs in Ray workers",
    ),
    PatchSpec(
        "ray.actor_report",
        "ray._private.function_manager:FunctionActorManager.load_actor_class",
        distribution="ray",
        versions=">=2.58,<2.61",  # checked as for ray.worker_setup_hook
        wrapper="npu_compat.patches.ray_seam:name_actor_in_report",
        expects=["job_id", "actor_creation_function_descriptor"],
        why=(
            "Only with NPU_COMPAT_REPORT_DIR set: names the actor a Ray worker became (its name and "
            "class) in that worker's report file, so `doctor --reports` shows which patches applied "
            "in the Explorer, the Trainer, each model actor. Nothing changes otherwise."
        ),
        upstream_fix="none needed: reporting only",
        remove_when="never while per-process reports are written",
    ),
)
SPECS += SEAM_SPECS
