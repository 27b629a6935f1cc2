"""vLLM's weight-transfer factory on Ascend: a request for ``nccl`` gets the HCCL engine.

Trinity 0.6.0 asks vLLM for ``WeightTransferConfig(backend="nccl")`` when a user's YAML says
``sync_method: nccl`` (row A8).  vllm-ascend registers its ``hccl`` engine with vLLM's
``WeightTransferEngineFactory`` (and, through a global platform patch, also remaps the name
``nccl``); the factory is where the choice is made, so a ``nccl`` request is served by
``hccl`` whenever that engine is registered -- also where vllm-ascend's remap is absent.
Without a registered ``hccl`` engine nothing changes.
"""

from __future__ import annotations

import copy
from typing import Any


def hccl_for_nccl(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # WeightTransferEngineFactory.create_engine(config, parallel_config[, model]): a classmethod,
    # so ``instance`` is the factory class.
    config: Any = kwargs.get("config", args[0] if args else None)
    registry = getattr(instance, "_registry", {})
    if getattr(config, "backend", None) == "nccl" and "hccl" in registry:
        config = copy.copy(config)
        config.backend = "hccl"
        if "config" in kwargs:
            kwargs["config"] = config
        else:
            args = (config, *args[1:])
    return wrapped(*args, **kwargs)
