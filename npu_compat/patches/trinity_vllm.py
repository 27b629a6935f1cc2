"""Trinity-RFT's vLLM side on Ascend: the worker class, its weight sync, and the trainer's weight-sync engine.

* ``TrinityGPUWorker`` (A9/A12): Trinity hands vLLM ``worker_cls=
  "trinity.common.models.vllm_worker.TrinityGPUWorker"``, a subclass of vLLM's CUDA
  ``Worker``; vllm-ascend only substitutes its ``NPUWorker`` for ``worker_cls="auto"``, so
  the GPU worker would run on the NPU host.  The replacement is the same class name, at
  the same import path, with Trinity's two methods on top of vllm-ascend's ``NPUWorker``.
  vLLM resolves the path inside each worker process it spawns, where the bootstrap
  (the ``.pth`` line or the vLLM plugin) has already activated npu-compat.
* ``vLLMRolloutModel.__init__`` (N1): vllm-ascend's ``NPUWorker`` refuses RL weight updates
  while ``VLLM_ASCEND_ENABLE_NZ`` is its default ``1``; verl sets ``0`` for its own vLLM rollout on
  NPU, Trinity does not.  The rollout actor's environment gets ``0`` (unless the user set it)
  before it builds the engine, whose processes inherit it.
* ``VLLMWeightTransferEngine`` (A17): the trainer side of ``sync_method: nccl`` calls
  vLLM's ``NCCLWeightTransferEngine`` directly (so vllm-ascend's factory remap of "nccl"
  does not reach it) and tears down with ``destroy()``, which ``PyHcclCommunicator`` lacks.
  The replacement uses vllm-ascend's ``HCCLWeightTransferEngine`` with the same calls.
* ``WorkerExtension.update_weight`` (0.5.2's sync, every sync method): an ACL graph replays the
  memory it was captured with, and vllm-ascend, unlike vLLM's CUDA path, cannot capture again.  A
  sync whose loader re-allocates a parameter or buffer (``layer.weight.data = f(...)``, as vllm-ascend's
  ``.contiguous()`` and ``npu_format_cast`` reassignments do) leaves the graphs reading the old
  memory.  Around each sync every parameter and buffer, and every tensor a layer derived from them and holds
  as a plain attribute, keeps its storage: a moved one is copied
  back into its old storage and bound to it again.  One whose shape, dtype or strides changed
  cannot be kept; with graphs captured the sync then fails naming it, instead of a rollout that
  generates from stale weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from .. import _effects, _env

logger = logging.getLogger(__name__)


def npu_worker_class(original: Any) -> Any:
    """Replacement factory for ``trinity.common.models.vllm_worker:TrinityGPUWorker``."""
    from vllm_ascend.worker.worker import NPUWorker

    class TrinityGPUWorker(NPUWorker):  # type: ignore[misc]
        # Trinity's own method needs nothing of the CUDA worker: reuse it as it is.
        apply_patches = original.__dict__["apply_patches"]

        def load_model(self, *args: Any, **kwargs: Any) -> None:
            """Register Trinity's weight-transfer engines, then load as vllm-ascend does."""
            from trinity.common.models.vllm_extension import register_checkpoint_weight_transfer_engine

            register_checkpoint_weight_transfer_engine()
            # NPUWorker.load_model takes no arguments (vLLM's CUDA Worker takes load_dummy_weights)
            return super().load_model()  # type: ignore[no-any-return]

    TrinityGPUWorker.__module__ = original.__module__
    TrinityGPUWorker.__qualname__ = original.__qualname__
    TrinityGPUWorker.__doc__ = (
        f"Trinity's worker on vllm-ascend's NPUWorker (npu-compat). {original.__doc__ or ''}"
    )
    return TrinityGPUWorker


def hccl_weight_transfer_engine(original: Any) -> Any:
    """Replacement factory for ``trinity.utils.distributed:VLLMWeightTransferEngine``."""

    class VLLMWeightTransferEngine(original):  # type: ignore[misc]
        def __init__(self, master_address: str, master_port: int, world_size: int, group_name: str) -> None:
            from vllm_ascend.distributed.weight_transfer.hccl_engine import HCCLWeightTransferEngine

            del group_name  # as upstream: vLLM's engines need no group name
            self._model_update_group = HCCLWeightTransferEngine.trainer_init(
                dict(master_address=master_address, master_port=master_port, world_size=world_size)
            )

        def sync_weight(self, iterator: Iterator[tuple[str, Any]]) -> None:
            from vllm_ascend.distributed.weight_transfer.hccl_engine import (
                HCCLTrainerSendWeightsArgs,
                HCCLWeightTransferEngine,
            )

            HCCLWeightTransferEngine.trainer_send_weights(
                iterator=iterator,
                trainer_args=HCCLTrainerSendWeightsArgs(group=self._model_update_group, packed=True),
            )

        def teardown(self) -> None:
            # PyHcclCommunicator has no destroy(); dropping it releases the communicator.
            destroy = getattr(self._model_update_group, "destroy", None)
            if destroy is not None:
                destroy()
            self._model_update_group = None

    VLLMWeightTransferEngine.__module__ = original.__module__
    VLLMWeightTransferEngine.__qualname__ = original.__qualname__
    VLLMWeightTransferEngine.__doc__ = "vLLM weight sync over HCCL (vllm-ascend's engine; npu-compat)."
    return VLLMWeightTransferEngine


def hccl_engine_class(original: Any) -> Any:
    """Replacement for ``trinity.common.models.vllm_extension:NCCLWeightTransferEngine`` (A13).

    Trinity's ``CheckpointWeightTransferEngine`` (checkpoint and memory sync, which the explorer
    sets up in every sync mode) builds its rollout-side group with
    ``NCCLWeightTransferEngine._stateless_init_process_group(addr, port, rank, world, device=)``,
    a ``PyNcclCommunicator``.  vllm-ascend's ``HCCLWeightTransferEngine`` has the same static
    method with the same arguments, returning a ``PyHcclCommunicator`` with the same
    ``rank`` / ``group.broadcast_obj`` / ``broadcast(tensor, src, stream=)`` surface.  The module
    uses the name for nothing else.
    """
    del original
    from vllm_ascend.distributed.weight_transfer.hccl_engine import HCCLWeightTransferEngine

    return HCCLWeightTransferEngine


def weights_not_nz(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``vLLMRolloutModel.__init__``: ``VLLM_ASCEND_ENABLE_NZ=0`` for the vLLM engine it builds (N1).

    Set in the actor's environment before the engine exists, so its EngineCore and worker
    processes inherit it -- where verl's vLLM rollout sets it too; a value already set is kept.
    ``deactivate()`` unsets it again.
    """
    _effects.setenv(_env.VLLM_ASCEND_ENABLE_NZ, "0", keep=True)
    return wrapped(*args, **kwargs)


class GraphUnsafeSync(RuntimeError):
    """A weight sync moved a tensor that the engine's ACL graphs read, and it could not be put back."""


def _tensors(model: Any) -> Iterator[tuple[str, dict[str, Any], str, Any]]:
    """(qualified name, where the owning module holds it, attribute, tensor) of every parameter and buffer,
    and of every tensor on the device held as a plain attribute, shared ones once.

    A plain attribute is what a layer's ``process_weights_after_loading`` derives from its weights and sets
    without registering it (vllm-ascend's w8a8 ``aclnn_input_scale_reciprocal``, its MoE ``*_scale_fp32``):
    the forward reads it, so the graphs captured its memory, and vLLM's layerwise reload builds it anew."""
    import torch

    seen: set[int] = set()
    for prefix, module in model.named_modules():
        holders = [module._parameters, module._buffers, vars(module)]
        for holder in holders:
            for attr, tensor in list(holder.items()):
                if not isinstance(tensor, torch.Tensor) or id(tensor) in seen:
                    continue
                if holder is holders[2] and tensor.device.type == "cpu":
                    continue  # a graph reads device memory only
                seen.add(id(tensor))
                yield (f"{prefix}.{attr}" if prefix else attr, holder, attr, tensor)


def worker_model(worker: Any) -> Any:
    """The vLLM worker's model (its runner's), or None where it has no torch module."""
    model = getattr(getattr(worker, "model_runner", None), "model", None)
    return model if callable(getattr(model, "named_modules", None)) else None


def runs_graphs(worker: Any) -> bool:
    """Whether the worker's engine replays captured graphs (vLLM's ``cudagraph_mode``, ACL graphs here)."""
    config = getattr(getattr(worker, "vllm_config", None), "compilation_config", None)
    mode = getattr(config, "cudagraph_mode", None)
    return mode is not None and getattr(mode, "name", str(mode)) != "NONE"


#: What :func:`note_storages` notes of each tensor: name, registry, attribute, the tensor, its data.
Noted = list[tuple[str, dict[str, Any], str, Any, Any]]


def note_storages(model: Any) -> Noted:
    """Every tensor of ``model`` that a graph may read (:func:`_tensors`) with the storage it has now, for
    :func:`put_back`."""
    return [(name, registry, attr, tensor, tensor.data) for name, registry, attr, tensor in _tensors(model)]


def put_back(noted: Noted, graphs: bool) -> tuple[int, list[str]]:
    """Bind every noted tensor to the storage it had, copying in what a sync left elsewhere.

    Returns ``(tensors checked, the names of those put back)``.  A tensor whose storage moved, with its
    shape, dtype and strides unchanged, is copied back into the old storage, and the module is bound to the
    old tensor object again (the same ``Parameter``, so the loaders and attributes it carries stay).  Where
    that cannot be done and ``graphs`` is true, :class:`GraphUnsafeSync`.
    """
    import torch

    restored: list[str] = []
    unsafe = []
    with torch.no_grad():
        for name, registry, attr, tensor, kept in noted:
            now = registry.get(attr)
            if now is None:
                unsafe.append(f"{name} (removed)")
                continue
            if not isinstance(now, torch.Tensor):
                unsafe.append(f"{name} (no longer a tensor)")
                continue
            if now.data.untyped_storage().data_ptr() == kept.untyped_storage().data_ptr():
                if now is not tensor:  # a new object over the same memory: keep the original one
                    registry[attr] = tensor
                    tensor.data = now.data
                continue
            if (now.shape, now.dtype, now.stride()) != (kept.shape, kept.dtype, kept.stride()):
                unsafe.append(f"{name} ({kept.dtype} {list(kept.shape)} -> {now.dtype} {list(now.shape)})")
                continue
            kept.copy_(now.data)
            tensor.data = kept
            registry[attr] = tensor
            restored.append(name)
    if unsafe and graphs:
        raise GraphUnsafeSync(
            f"the weight sync re-allocated {len(unsafe)} tensor(s) the rollout's ACL graphs read, and "
            f"npu-compat cannot put them back in place: {', '.join(unsafe[:5])}. The graphs would replay "
            "the old weights; run the rollout engine eagerly (explorer.rollout_model.enforce_eager: true)."
        )
    return (len(noted), restored)


def keep_storages(model: Any, sync: Any, graphs: bool) -> tuple[Any, int, int]:
    """Run ``sync()`` so that every tensor of ``model`` a graph may read keeps the storage it had
    (:func:`put_back`): ``(sync's result, tensors checked, tensors put back)``."""
    noted = note_storages(model)
    result = sync()
    checked, restored = put_back(noted, graphs)
    return (result, checked, len(restored))


def graph_safe_sync(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``WorkerExtension.update_weight``: the sync, each tensor the graphs may read kept in its storage."""
    model = worker_model(instance)
    if model is None:  # no torch module to keep: the sync as it is
        return wrapped(*args, **kwargs)
    (result, checked, restored) = keep_storages(
        model, lambda: wrapped(*args, **kwargs), runs_graphs(instance)
    )
    if restored:
        logger.info(
            "weight sync: %d of %d tensors were re-allocated by the loader and put back in place, "
            "so the ACL graphs read the new weights",
            restored,
            checked,
        )
    return result


def has_hccl_engine() -> str | None:
    """Condition: vllm-ascend's HCCL weight-transfer engine (0.23.0.post1 and later) is installed."""
    from .trinity_common import findable, no_native_npu

    if not findable("vllm_ascend.distributed.weight_transfer.hccl_engine"):
        return (
            "vllm-ascend's HCCL weight-transfer engine is not installed (needs vllm-ascend >= 0.23.0.post1)"
        )
    return no_native_npu()


def has_npu_worker() -> str | None:
    """Condition: vllm-ascend (its NPUWorker) is installed, and Trinity has no NPU support of its own."""
    from .trinity_common import findable, no_native_npu

    if not findable("vllm_ascend.worker.worker"):
        return "vllm-ascend is not installed: there is no NPUWorker to run Trinity's worker on"
    return no_native_npu()
