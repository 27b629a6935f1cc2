"""vllm-ascend's ``NPUWorker`` weight update: each tensor the ACL graphs may read keeps its storage across it.

From 0.23.0.post1 an RL framework (Trinity 0.6.0) syncs through vLLM's weight-transfer API, which the
``NPUWorker`` implements: ``start_weight_update`` (vLLM's ``initialize_layerwise_reload``),
``update_weights`` (each chunk through the model's ``load_weights``) and ``finish_weight_update``
(``finalize_layerwise_reload``, which reruns ``process_weights_after_loading``).  vLLM's layerwise reload
copies what it processed back into the storages it found (``model_loader/reload/layerwise.py``), so a dense
model's parameters and buffers stay where the ACL graphs captured them.  A tensor that the processing derives
and sets as a plain attribute (vllm-ascend's w8a8 ``aclnn_input_scale_reciprocal``) is neither deleted nor
restored: it is built anew in new memory at every reload.  An ACL graph replays the memory it was captured
with, and vllm-ascend cannot capture again.

Around each update the storages of the parameters, buffers and plain tensor attributes on the device are
noted at its start and, after its finish, every tensor that moved is copied back and bound to its old
storage (:func:`.trinity_vllm.put_back`); with graphs captured, a tensor that cannot be kept (its shape
changed) fails the update by name.  Each update logs, on vLLM's logger among the worker's own lines, how
many tensors kept their storage and how many were put back, so a run shows which case it met.
"""

from __future__ import annotations

import logging
from typing import Any

from .trinity_vllm import note_storages, put_back, runs_graphs, worker_model

#: Under vLLM's logger, whose handler vLLM sets up in every worker: the line shows among the worker's own.
logger = logging.getLogger("vllm.npu_compat.weight_update")

#: The worker attribute holding what :func:`note_at_start` noted, until the update finishes.
_NOTED = "_npu_compat_noted_storages"


def note_at_start(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``NPUWorker.start_weight_update``: note every tensor's storage, then start the update."""
    model = worker_model(instance)
    noted = note_storages(model) if model is not None else None
    result = wrapped(*args, **kwargs)
    setattr(instance, _NOTED, noted)
    return result


def put_back_at_finish(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``NPUWorker.finish_weight_update``: finish the update, then bind every tensor to its old storage."""
    noted = getattr(instance, _NOTED, None)
    result = wrapped(*args, **kwargs)
    if noted is not None:
        setattr(instance, _NOTED, None)
        checked, restored = put_back(noted, runs_graphs(instance))
        logger.info(
            "npu-compat weight update: %d of %d tensors kept their storage, %d re-allocated and put back "
            "in place%s",
            checked - len(restored),
            checked,
            len(restored),
            f" ({', '.join(restored[:8])}{', ...' if len(restored) > 8 else ''})" if restored else "",
        )
    return result
