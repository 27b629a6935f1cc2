"""Every upstream module docs/break-map.md names imports on the installed stack (on torch's CPU build)."""

from __future__ import annotations

import pytest

from tests.conftest import run_py, upstream_versions

#: exercises verl: stack-b (stack-a with another verl) runs it (noxfile)
pytestmark = pytest.mark.uses_verl

TRINITY, VERL = upstream_versions("trinity-rft", "verl")

COMMON = [
    "vllm",
    "vllm.distributed.utils:StatelessProcessGroup",
    "vllm.distributed.device_communicators.pynccl:PyNcclCommunicator",
    "vllm.distributed.weight_transfer.nccl_engine:NCCLWeightTransferEngine",
    "vllm.distributed.weight_transfer.factory:WeightTransferEngineFactory",
    "ray",
    "verl",
    "verl.single_controller.ray.base:RayWorkerGroup",
    "transformers",
    "trinity.common.config_validator",
    "trinity.common.models.vllm_model",
    "trinity.common.models.vllm_worker",
    "trinity.utils.distributed",
    "trinity.utils.lora_utils",
    "trinity.cli.launcher:main",
]
TRINITY_060 = ["trinity.common.models.allocator:Allocator", "trinity.common.models.vllm_extension"]
VERL_08 = [
    "trinity.trainer.verl.trainer:VERLTrainer",
    "trinity.trainer.verl.workers",
    "trinity.trainer.verl.fsdp_engine",
    "trinity.trainer.verl.monkey_patch",
    "trinity.trainer.verl.config",
]
VERL_LEGACY = [
    "trinity.trainer.verl_legacy.verl_config",
    "trinity.trainer.verl_legacy.fsdp_workers",
    "trinity.trainer.verl_legacy.fsdp_checkpoint_manager",
    "trinity.trainer.verl_legacy.monkey_patch",
]
TRINITY_052 = [
    "trinity.common.models:_BundleAllocator",
    "trinity.common.models:create_vllm_inference_models",
    "trinity.trainer.verl.verl_config",
    "trinity.trainer.verl.fsdp_workers",
    "trinity.trainer.verl.dp_actor",
]


def _modules() -> list[str]:
    if TRINITY.startswith("0.5."):
        return COMMON + TRINITY_052
    legacy = tuple(int(p) for p in VERL.split(".")[:2]) < (0, 8)
    return COMMON + TRINITY_060 + (VERL_LEGACY if legacy else VERL_08)


def test_every_mapped_module_imports() -> None:
    """One interpreter, stock (npu-compat off): the stack itself must be sound before anything is patched."""
    proc = run_py(
        f"""
        import importlib, json
        failed = {{}}
        for ref in {_modules()!r}:
            module, _, attr = ref.partition(":")
            try:
                obj = importlib.import_module(module)
                if attr:
                    getattr(obj, attr)
            except Exception as exc:
                failed[ref] = f"{{type(exc).__name__}}: {{exc}}"
        print(json.dumps(failed))
        """,
        env={"NPU_COMPAT": "0"},
        timeout=600,
    )
    assert proc.stdout.strip().splitlines()[-1] == "{}", proc.stdout[-3000:]
