"""Every built-in patch, as data (read by the engine, by ``report()`` and by ``doctor``).

Listing this catalogue imports no upstream module.  Specs are grouped by target; within
one target they apply in the order listed (a later spec wraps an earlier one).
"""

from ._spec import PatchSpec

_P = "npu_compat.patches."

# -- torch.distributed (issue 5) -------------------------------------------------------------------
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

# -- Ray (issue 5) -----------------------------------------------------------------------------------
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
)

# -- Trinity-RFT, both releases (issues 5-7) ---------------------------------------------------------
_TRINITY = "trinity-rft"
_NO_NATIVE = _P + "trinity_common:no_native_npu"
TRINITY_SPECS = (
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
        why="asserts backend == 'nccl' and is_nccl_available(): the weight-sync group cannot form over HCCL",
        upstream_fix="Trinity's merged NPU support (trinity.utils.device) picks the backend per device",
        remove_when="a trinity-rft release with trinity.utils.device",
    ),
)

SPECS: "tuple[PatchSpec, ...]" = (*TORCH_SPECS, *RAY_SPECS, *TRINITY_SPECS)
