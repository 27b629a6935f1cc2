"""torch.compile on Ascend: off by default unless Inductor has an NPU backend.

Inductor has no Ascend backend in torch itself; torch_npu's ``_inductor`` (torch_npu 2.13 ships it,
loaded at the first compile) registers one for ``npu`` when it is imported.  verl compiles its entropy
helpers with torch.compile's default backend, Inductor, so without that one they fail at the first
training step.
``torchair`` does not count: it is a backend of its own (``torchair.get_npu_backend()``), used only
by code that names it, and torch_npu installs it whether or not Inductor can compile for ``npu``.
The report says which way it went: the patches below are ``applied`` (compile off) or ``skipped``
with the backend found.

* trinity-rft 0.6.0 with verl >= 0.8 (row A26): ``_build_actor_config`` writes
  ``use_torch_compile: True``, and its FSDP engine config (``fsdp_config``) leaves verl's
  ``FSDPEngineConfig.use_torch_compile`` at its default True -- the one verl 0.8's FSDP engine
  reads when it compiles ``entropy_from_logits`` (found by the whole run); both become False.
  The user's ``trainer_config`` overrides are merged after this function, so a
  ``use_torch_compile`` set there still wins.
* verl 0.7.1 (trinity 0.5.2 row B29, and trinity 0.6.0's legacy trainer): ``DataParallelPPOActor``
  compiles ``entropy_from_logits`` (and ``calculate_sum_pi_squared_from_logits``) unless its
  config says ``use_torch_compile: False``; Trinity's configs have no such key.  When the key is
  absent the plain functions are used; an explicit value is left alone.
"""

from __future__ import annotations

import importlib
from typing import Any

from .trinity_common import findable

_INDUCTOR_NPU = "torch_npu._inductor"


def no_npu_compiler() -> str | None:
    """Condition: stand down (keep torch.compile on) when Inductor has an NPU backend -- torch_npu's
    ``_inductor``, once imported, has registered code generation for ``npu`` with Inductor.  It is imported
    here, in the process that builds the trainer's config (torch is loaded there), as Inductor's first compile
    would; where it does not import or registers nothing, the backend is missing and compile goes off."""
    if not findable(_INDUCTOR_NPU):
        return None
    try:
        importlib.import_module(_INDUCTOR_NPU)
        from torch._inductor.codegen.common import get_scheduling_for_device
    except Exception:  # noqa: BLE001 -- a backend that cannot load is no backend
        return None
    if get_scheduling_for_device("npu") is not None:
        return f"Inductor has an NPU backend (registered by {_INDUCTOR_NPU}): torch.compile stays on"
    return None


def actor_config_without_compile(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    actor = wrapped(*args, **kwargs)
    if isinstance(actor, dict) and actor.get("use_torch_compile"):
        actor["use_torch_compile"] = False
    # verl 0.8's FSDP engine reads its own config (FSDPEngineConfig.use_torch_compile, default True)
    engine = actor.get("fsdp_config") if isinstance(actor, dict) else None
    if isinstance(engine, dict) and engine.get("use_torch_compile", True):
        engine["use_torch_compile"] = False
    return actor


def _uncompiled(fn: Any) -> Any:
    return getattr(fn, "_torchdynamo_orig_callable", fn)


def dp_actor_without_compile(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    result = wrapped(*args, **kwargs)
    get = getattr(getattr(instance, "config", None), "get", None)
    explicit = get is not None and get("use_torch_compile", None) is not None
    if not explicit:
        for name in ("compute_entropy_from_logits", "calculate_sum_pi_squared_from_logits"):
            if hasattr(instance, name):
                setattr(instance, name, _uncompiled(getattr(instance, name)))
    return result
