"""The digests of each LoRA adapter the released vllm-ascend's worker loads, as read and as held.

Trinity's LoRA mode syncs the rollout by adapter files: the trainer saves ``adapter_model.safetensors`` after
each step and the rollout's vLLM loads it (``remove_lora`` + ``add_lora``, or the first request's
``lora_path``).  vLLM logs nothing of what it loaded.  In every simulated process this module observes
vLLM's own loader -- ``WorkerLoRAManager._load_adapter``, which reads the file through
``LoRAModel.from_local_checkpoint`` and ``LoRAModel.from_lora_tensors`` -- and logs:

* ``simulated Ascend: LoRA <id> (<name>) loaded from <path>: r=<r>, scaling <s>, <n> modules (<kinds>)``;
* ``simulated weight sync (rollout lora <id> loaded): <n> tensors, sha256 <digest>``, over the tensors
  ``from_lora_tensors`` was handed (by PEFT name, as read from the file: equal to ``digest_of`` over the file)
  where the adapter is held in the file's dtype, computed from what the ``LoRAModel`` holds;
* where vLLM holds it in another dtype (``lora_dtype``: a bfloat16 rollout, a float32 adapter), two more:
  ``rollout lora <id> expected`` (the file's tensors in that dtype) and ``... holds`` (each PEFT name's
  ``lora_a``/``lora_b`` of the ``LoRAModel``, as vLLM's ``parse_fine_tuned_lora_name`` maps it).

What is checked is the ``LoRAModel`` vLLM's LRU cache keeps on the host, the source of every activation of the
adapter on the device; that the device computes with it is the punica kernels' part (``_npu_ops``).  It reads,
after the fact, and changes nothing; only on the simulated host.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ._digest import LINE, digest_pairs
from ._when_imported import WhenImported

WORKER = "vllm.lora.worker_manager"

#: vLLM's namespace: its handler prints INFO in every process that imported vLLM
logger = logging.getLogger("vllm.npu_compat.lora")

#: What the last ``from_lora_tensors`` of this process was handed and made: its arguments and the LoRAModel
_last: dict[str, Any] = {}


def install() -> None:
    """Observe this process's adapter loads: now if vLLM's LoRA worker manager is imported, else when
    it is."""
    WhenImported(WORKER, _observe).install()


def _observe(module: ModuleType) -> None:
    manager = module.WorkerLoRAManager
    if getattr(manager._load_adapter, "_npu_compat_observed", False):
        return
    from vllm.lora.lora_model import LoRAModel

    LoRAModel.from_lora_tensors = classmethod(_recorded(LoRAModel.from_lora_tensors.__func__))
    manager._load_adapter = _logged(manager._load_adapter)


def _recorded(make: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(make)

    @functools.wraps(make)
    def from_lora_tensors(cls: Any, *args: Any, **kwargs: Any) -> Any:
        lora = make(cls, *args, **kwargs)
        bound = signature.bind(cls, *args, **kwargs)
        _last.update(bound.arguments, lora=lora)
        return lora

    return from_lora_tensors


def _logged(load: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load)
    def _load_adapter(self: Any, lora_request: Any) -> Any:
        _last.clear()
        lora = load(self, lora_request)
        if _last.get("lora") is lora:  # read from a file (not a tensorizer's, nor a cached dummy)
            _log(lora_request, lora, dict(_last))
        _last.clear()
        return lora

    _load_adapter._npu_compat_observed = True  # type: ignore[attr-defined]
    return _load_adapter


def _log(request: Any, lora: Any, call: dict[str, Any]) -> None:
    from vllm.lora.utils import parse_fine_tuned_lora_name

    tensors: dict[str, Any] = call["tensors"]
    dtype = call.get("dtype")
    held: dict[str, Any] = {}
    for name in tensors:
        try:
            module, is_a = parse_fine_tuned_lora_name(name, call.get("weights_mapper"))
        except ValueError:
            continue
        weights = lora.loras.get(module)
        if weights is not None:
            held[name] = weights.lora_a if is_a else weights.lora_b
    scaling = next((float(w.scaling) for w in lora.loras.values()), 1.0)
    logger.info(
        "simulated Ascend: LoRA %d (%s) loaded from %s: r=%d, scaling %g, %d modules (%s)",
        request.lora_int_id, request.lora_name, request.lora_path, lora.rank, scaling, len(lora.loras),
        ", ".join(sorted({m.rsplit(".", 1)[-1] for m in lora.loras})),
    )  # fmt: skip
    side = f"rollout lora {request.lora_int_id}"
    holds = digest_pairs(held.items())
    if dtype is None or all(t.dtype == dtype for t in tensors.values()):
        logger.info(LINE, f"{side} loaded", holds.count, holds.hexdigest())  # held as read
        return
    read = digest_pairs(tensors.items())
    expected = digest_pairs((name, t.to(dtype)) for name, t in tensors.items())
    logger.info(LINE, f"{side} loaded", read.count, read.hexdigest())
    logger.info(LINE, f"{side} expected", expected.count, expected.hexdigest())
    logger.info(LINE, f"{side} holds", holds.count, holds.hexdigest())
