# Mirrors upstream signatures as they are (some unannotated); vLLM ships no stubs for mypy here.
# mypy: disable-error-code="import-not-found,misc,no-untyped-def"
"""SIMULATED vllm_ascend.platform (npu_compat.testing) -- not Huawei's vllm-ascend.

Mirrors the class attributes of ``NPUPlatform`` in ``vllm_ascend/platform.py`` of
vllm-ascend 0.23.0.post1 (and of 0.18.0, which lacks ``ray_noset_device_env_vars`` and
inherits vLLM's empty default).  Like the real class it subclasses vLLM's ``Platform``
with ``_enum = PlatformEnum.OOT``; subclassing registers nothing, and this stand-in is no
platform plugin (see ``vllm_ascend``), so vLLM's ``current_platform`` never becomes it.
Of the real class methods four are mirrored: in 0.23.0.post1 ``manual_seed_all`` (a no-op there
too, and what vLLM's ``set_random_seed`` calls in a worker's ``init_device``),
``is_sleep_mode_available`` (True, so that vLLM accepts ``enable_sleep_mode``) and ``set_device``
(``torch.npu.set_device``, what vLLM's multiprocess executor calls in its output thread); and, of
``check_and_update_config``, the worker selection (``worker_cls="auto"`` becomes vllm-ascend's
``NPUWorker``; the 310P and Xlite workers are not simulated) and the KV-cache block size of
``refresh_block_size`` (128 tokens).  The rest (config
checks and updates, attention backends, device communicator) is not simulated.
"""

from typing import TYPE_CHECKING

import torch
from vllm.platforms import Platform, PlatformEnum

from ._version import PAIRS_WITH_VLLM_0_23

if TYPE_CHECKING:
    from vllm.config import VllmConfig
else:  # as the real module: vllm.config imports the platform while it initialises
    VllmConfig = None


def _refresh_block_size(vllm_config) -> None:
    """``vllm_ascend.utils.refresh_block_size``: Ascend's KV-cache block is 128 tokens.

    128 where none is set, and where prefix caching or chunked prefill is on (hybrid attention+mamba
    models keep their own sizing).  The real one also caps it for the xlite graph mode (not simulated).
    """
    cache_config = vllm_config.cache_config
    scheduler_config = vllm_config.scheduler_config
    model_config = vllm_config.model_config
    if not cache_config:
        return
    if cache_config.block_size is None:
        cache_config.block_size = 128
    if not scheduler_config or not model_config or model_config.is_hybrid:
        return
    if cache_config.block_size != 128 and (
        cache_config.enable_prefix_caching or scheduler_config.enable_chunked_prefill
    ):
        cache_config.block_size = 128


class NPUPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "npu"
    device_type: str = "npu"
    simple_compile_backend: str = "eager"  # Disable torch.compile()
    ray_device_key: str = "NPU"
    device_control_env_var: str = "ASCEND_RT_VISIBLE_DEVICES"
    if PAIRS_WITH_VLLM_0_23:
        ray_noset_device_env_vars: list[str] = [
            "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
        ]
    dispatch_key: str = "PrivateUse1"

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        parallel_config = vllm_config.parallel_config
        if parallel_config and parallel_config.worker_cls == "auto":
            parallel_config.worker_cls = "vllm_ascend.worker.worker.NPUWorker"
        _refresh_block_size(vllm_config)

    if PAIRS_WITH_VLLM_0_23:

        @classmethod
        def manual_seed_all(cls, seed: int) -> None:
            pass

        def is_sleep_mode_available(self) -> bool:
            return True

        @classmethod
        def set_device(cls, device: torch.device):
            torch.npu.set_device(device)

    #: Not in the real class: marks the stand-in.
    SIMULATED = True
