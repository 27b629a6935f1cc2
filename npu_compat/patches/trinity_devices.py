"""Trinity-RFT's device settings that run but do the wrong thing on Ascend.

Rows A2, A3, A7, A35 (0.6.0) and their 0.5.2 twins B2, B3, B9, B32 of docs/break-map.md: the code is
the same in both releases (names, signatures, the advice line), so one spec (its range covers both)
serves both.
None of these crash: on an Ascend host they pass silently and do the CUDA thing instead.

* ``vLLMRolloutModel.__init__`` (rows A7, A2, B9, B2): ``config.cuda_visible_devices``
  (colocate mode only; ``ExplorerConfigValidator`` sets it to ``"0"``, row A2) is exported as
  ``CUDA_VISIBLE_DEVICES``, which neither torch_npu nor vllm-ascend reads: the rollout engine keeps the
  devices Ray gave the actor.  The same value is exported as ``ASCEND_RT_VISIBLE_DEVICES`` instead,
  before ``__init__`` runs, and ``__init__`` sees no value for the duration of the call, so it exports
  no ``CUDA_VISIBLE_DEVICES`` (the field is restored afterwards; nothing else in ``__init__`` reads it).
  Row A2 needs no change of its own: the validator's ``"0"`` means "the first visible device" on either
  platform, the field is Trinity's config schema (there is no Ascend field to set instead), and this is
  its only reader outside SGLang (out of scope).  0.5.2's ``__init__`` also builds the vLLM engine, after
  the export: the engine starts with ``ASCEND_RT_VISIBLE_DEVICES`` already set.
* ``GPUMemoryValidator.validate_trainer_memory_usage`` (rows A3, B3): asks
  ``torch.cuda.is_available()``, which is False on Ascend (and must stay False), logs "NO GPU DETECTED"
  and skips the trainer memory check.  Where ``torch.npu`` has a device, the method's few lines run
  against it: the capacity comes from ``torch.npu.get_device_properties(0)`` and the FSDP check runs as
  upstream would run it.  The method imports torch locally, so a scoped torch view of the module would
  not reach it.
* ``GPUMemoryValidator._check_max_memory_in_fsdp_training`` (rows A3, B3; reached by 0.6 with
  verl < 0.8 only, by 0.5.2 always): the threshold is 90 % of the device with
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` and 80 % without, and the advice names that
  variable.  torch_npu reads ``PYTORCH_NPU_ALLOC_CONF``.  The flag and the threshold, set by
  ``fsdp_memory_check`` just before, are recomputed from the NPU variable (same test: the whole value
  equals ``expandable_segments:True``) where they are used, and the advice line that names the CUDA
  variable -- matched as the whole line -- names the NPU one.
* ``create_dummy_lora`` (rows A35, B32): frees the dummy model with ``torch.cuda.empty_cache()``, a
  no-op on Ascend; ``torch.npu.empty_cache()`` runs after it.  Again a local ``import torch``.
"""

from __future__ import annotations

import os
from typing import Any

from .. import _effects, _env

#: torch_npu's allocator settings (torch's ``PYTORCH_CUDA_ALLOC_CONF`` is not read on Ascend).
NPU_ALLOC_CONF = "PYTORCH_NPU_ALLOC_CONF"
#: The value Trinity's memory check looks for (compared with the whole variable, as upstream does).
EXPANDABLE = "expandable_segments:True"
#: Trinity's advice line (the same in 0.5.2 and 0.6.0), and what it becomes.
CUDA_ADVICE = "• Set environment variable `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`"
NPU_ADVICE = f"• Set environment variable `{NPU_ALLOC_CONF}={EXPANDABLE}`"


def _npu() -> Any:
    """``torch.npu`` when it has a device, else None (then upstream's own code runs unchanged)."""
    import torch

    npu = getattr(torch, "npu", None)
    return npu if npu is not None and npu.is_available() else None


def _config(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return kwargs["config"] if "config" in kwargs else args[0]


def ascend_visible_devices(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``vLLMRolloutModel.__init__``: export ``cuda_visible_devices`` as ``ASCEND_RT_VISIBLE_DEVICES``."""
    config = _config(args, kwargs)
    devices = getattr(config, "cuda_visible_devices", None)
    if not devices:
        return wrapped(*args, **kwargs)
    _effects.setenv(_env.ASCEND_VISIBLE_DEVICES, devices)  # deactivate() restores it
    config.cuda_visible_devices = None
    try:
        return wrapped(*args, **kwargs)
    finally:
        config.cuda_visible_devices = devices


def npu_memory_check(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``GPUMemoryValidator.validate_trainer_memory_usage`` against ``torch.npu``."""
    npu = _npu()
    if npu is None:
        return wrapped(*args, **kwargs)  # no device at all: upstream's "NO GPU DETECTED" is right
    config = _config(args, kwargs)
    instance.memory_capacity = npu.get_device_properties(0).total_memory
    if config.trainer.trainer_strategy.startswith("fsdp"):
        instance.fsdp_memory_check(config)
    else:
        instance.logger.info("NPU memory check skipped for non-FSDP strategies.")
    return None


def npu_alloc_conf(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``GPUMemoryValidator._check_max_memory_in_fsdp_training`` with ``PYTORCH_NPU_ALLOC_CONF``."""
    flag = os.environ.get(NPU_ALLOC_CONF, "") == EXPANDABLE
    instance.pytorch_env_flag = flag
    instance.memory_threshold = (0.9 if flag else 0.8) * instance.memory_capacity
    suggestions = instance.suggestions
    start = len(suggestions)
    try:
        return wrapped(*args, **kwargs)
    finally:
        for i in range(start, len(suggestions)):
            if suggestions[i] == CUDA_ADVICE:
                suggestions[i] = NPU_ADVICE


def npu_empty_cache(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``create_dummy_lora``: free the dummy model's cached memory on the NPU."""
    result = wrapped(*args, **kwargs)
    npu = _npu()
    if npu is not None:
        npu.empty_cache()
    return result
