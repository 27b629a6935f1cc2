"""The digests of a weight sync on the simulated host: what the trainer sent, what the rollout holds.

The released vllm-ascend logs nothing of what a sync moved.  In every simulated process this module
observes both sides of a sync and logs one line each (:data:`._digest.LINE`), on vLLM's logger so that they
show among the process's own:

* ``trainer sent``: ``HCCLWeightTransferEngine.trainer_send_weights`` (the trainer side of ``sync_method:
  nccl``; Trinity 0.6.0 calls it through npu-compat's ``trinity.distributed.vllm_weight_transfer``).  Each
  ``(name, tensor)`` of its iterator is digested as it goes to the broadcast; the line is logged once the
  iterator is spent.
* ``rollout loaded``: the names and dtypes that ``HCCLWeightTransferEngine.receive_weights`` handed to the
  model's loader, read back from the model at the end of vLLM's ``finalize_layerwise_reload``, which
  ``NPUWorker.finish_weight_update`` runs (every layer's tensors are then back in place), each in the dtype
  it arrived in.  A name the model holds packed (vLLM's ``packed_modules_mapping``: ``q_proj`` in
  ``qkv_proj``, ``gate_proj`` in ``gate_up_proj``) is read as its rows of the packed tensor, by the layer's
  ``output_sizes``; a vocabulary padded to a multiple of 64 rows (vLLM's ``VocabParallelEmbedding``) is
  read as the rows that were loaded.

Trinity 0.5 syncs without the engine: its trainer (``ActorRolloutRefWorker.sync_weight``) and each rollout
worker (``WorkerExtension.update_weight``) broadcast the weights one tensor at a time with
``torch.distributed.broadcast`` over their weight-sync group, then meet at the group's barrier.  There the
same lines are logged from ``torch.distributed``'s ``broadcast`` and ``barrier``, read only where those two
functions called them (by the caller's module and function name): each tensor as broadcast, under the name
the loop holds, and after the barrier what the rollout's model holds.  Every other call passes through as it
is.

Where the rollout's model holds another dtype than arrived (a bfloat16 rollout, a float32 trainer), or shards,
the rank logs ``received``, ``expected`` and ``holds`` (below) instead of ``rollout loaded``.

Equal lines mean the rollout's model holds, byte for byte, what the trainer sent.  With them the rollout
side logs ``simulated weight sync (rollout storages)``: how many parameters and buffers are at the device
address they had when the reload started (``initialize_layerwise_reload``), and which moved.  That is what
the release's reload left where a captured ACL graph reads, before npu-compat's guard (after the worker's
finish) puts anything back.

Under tensor parallelism each rank holds slices, so each rank logs instead
of ``rollout loaded``: ``rollout tp rank R/T received`` (the full tensors handed to the loader, equal to
``trainer sent``), ``... expected`` (its slice of each, in the dtype its model holds, cut by the partition
that vLLM's layer states: a ``VocabParallelEmbedding``'s ``shard_indices`` with its padding rows zero, a
``RowParallelLinear``'s input columns, a ``QKVParallelLinear``'s query heads and its replicated KV heads, a
``MergedColumnParallelLinear``'s or ``ColumnParallelLinear``'s output rows; anything else whole) and
``... holds`` (what the rank's model holds under each name after the reload, equal to ``expected``).  The
slices are read from the layers' own partition attributes, not from their weight loaders, so the loaders and
vLLM's reload are what the line checks.  Nothing here changes what is sent, received or held: it reads,
after the fact, and only on the simulated host.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from ._digest import LINE, WeightsDigest
from ._when_imported import WhenImported

ENGINE = "vllm_ascend.distributed.weight_transfer.hccl_engine"
#: vLLM's layerwise reload: its end (``finalize_layerwise_reload``) is the end of an NPUWorker's update
RELOAD = "vllm.model_executor.model_loader.reload"

#: Trinity 0.5's own sync: the module and the function of each side that broadcasts the weights one tensor at
#: a time over the weight-sync group (``torch.distributed.broadcast``), then meets the group's barrier
OWN_SYNC = {
    "trinity.trainer.verl.fsdp_workers": "sync_weight",
    "trinity.common.models.vllm_worker": "update_weight",
}
_TRAINER_SIDE = "trinity.trainer.verl.fsdp_workers"

#: vLLM's namespace: its handler prints INFO in every process that imported vLLM (npu_compat's own does not)
logger = logging.getLogger("vllm.npu_compat.weight_sync")

#: This process's rollout side: each name the loader was handed since the last update finished, and its dtype
_received: dict[str, Any] = {}
#: ... and the address of each parameter and buffer when vLLM's layerwise reload started
_addresses: dict[str, int] = {}


def install() -> None:
    """Observe this process's syncs: now where the engine's (or Trinity 0.5's) module is imported, else when
    it is."""
    WhenImported(ENGINE, _observe).install()
    for module in OWN_SYNC:
        WhenImported(module, _observe_own_sync).install()


def _observe(engine_module: ModuleType) -> None:
    """Wrap the engine's send, its receive and its rollout-side start."""
    engine = engine_module.HCCLWeightTransferEngine
    if getattr(engine.receive_weights, "_npu_compat_observed", False):
        return
    engine.trainer_send_weights = staticmethod(_observed(_sending, engine.trainer_send_weights))
    engine.receive_weights = _observed(_receiving, engine.receive_weights)
    engine.init_transfer_engine = _observed(_initialised, engine.init_transfer_engine)


def _initialised(init: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The rollout side's engine is set up: observe the end of vLLM's layerwise reload in this process, which
    ``NPUWorker.finish_weight_update`` runs (it imports the function when it calls it)."""
    result = init(*args, **kwargs)
    reload: Any = importlib.import_module(RELOAD)
    finalize = reload.finalize_layerwise_reload
    if not getattr(finalize, "_npu_compat_observed", False):
        reload.initialize_layerwise_reload = _observed(_initializing, reload.initialize_layerwise_reload)
        reload.finalize_layerwise_reload = _observed(_finalized, finalize)
    return result


def _initializing(initialize: Callable[..., Any], model: Any, *args: Any, **kwargs: Any) -> Any:
    _addresses.clear()
    _addresses.update(_weight_addresses(model))
    return initialize(model, *args, **kwargs)


def _weight_addresses(model: Any) -> dict[str, int]:
    """The device address each parameter and buffer of ``model`` reads from: what a graph captured."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return {name: tensor.untyped_storage().data_ptr() for name, tensor in tensors}


def _observed(around: Callable[..., Any], wrapped: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(wrapped)
    def observed(*args: Any, **kwargs: Any) -> Any:
        return around(wrapped, *args, **kwargs)

    observed._npu_compat_observed = True  # type: ignore[attr-defined]
    return observed


def _observe_own_sync(_module: ModuleType) -> None:
    """Trinity 0.5's sync broadcasts with ``torch.distributed`` itself: observe its broadcasts and barriers
    (each call passes through; only those made by :data:`OWN_SYNC`'s functions are read)."""
    import torch.distributed as dist

    if getattr(dist.broadcast, "_npu_compat_observed", False):
        return
    dist.broadcast = _observed(_broadcast, dist.broadcast)
    dist.barrier = _observed(_barrier, dist.barrier)


#: The trainer side of Trinity 0.5's sync in this process, since its last barrier
_own_sent = WeightsDigest()


def _own_sync_caller() -> Any:
    """The frame of the :data:`OWN_SYNC` function that called ``torch.distributed``, or None: the caller of
    :func:`_observed`'s wrapper, two frames above the observer."""
    try:
        frame = sys._getframe(3)
    except ValueError:  # called from near the top of a thread's stack: no sync function
        return None
    return frame if OWN_SYNC.get(frame.f_globals.get("__name__", "")) == frame.f_code.co_name else None


def _broadcast(broadcast: Callable[..., Any], tensor: Any, *args: Any, **kwargs: Any) -> Any:
    result = broadcast(tensor, *args, **kwargs)
    frame = _own_sync_caller()
    if frame is None:
        return result
    name = frame.f_locals.get("name")
    prefix = frame.f_locals.get("name_prefix")  # the trainer's FSDP1 path: names within each FSDP module
    if isinstance(name, str) and isinstance(prefix, str):
        name = prefix[len(frame.f_globals.get("FSDP_PREFIX", "")) :] + "." + name
    if not isinstance(name, str):
        return result
    if frame.f_globals["__name__"] == _TRAINER_SIDE:
        _own_sent.update(name, tensor)
        return result
    model = _runner_model(frame.f_locals.get("self"))
    if model is not None:  # each tensor as the rollout received it, before Trinity converts it to its dtype
        try:
            _received[name] = tensor.dtype
            _sharded.full.update(name, tensor)
            expected = _slice(model, _named_tensors(model), name, tensor)
            if expected is not None:
                _sharded.expected.update(name, expected)
        except Exception as exc:  # noqa: BLE001 -- an observer never breaks the sync it reads
            logger.warning("simulated weight sync (rollout): %s not digested (%s)", name, exc)
    return result


def _barrier(barrier: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    global _own_sent
    result = barrier(*args, **kwargs)
    frame = _own_sync_caller()
    if frame is None:
        return result
    if frame.f_globals["__name__"] == _TRAINER_SIDE:
        if _own_sent.count:
            logger.info(LINE, "trainer sent", _own_sent.count, _own_sent.hexdigest())
        _own_sent = WeightsDigest()
        return result
    model = _runner_model(frame.f_locals.get("self"))
    received = dict(_received)
    _received.clear()
    if model is not None and received:  # every tensor is loaded: the model holds the sync
        try:
            _log_held(model, received)
        except Exception as exc:  # noqa: BLE001 -- an observer never breaks the sync it reads
            logger.warning("simulated weight sync (rollout): not digested (%s)", exc)
    return result


def _runner_model(worker: Any) -> Any:
    """The model of a vLLM worker (Trinity's ``WorkerExtension`` is mixed into it), or None."""
    return getattr(getattr(worker, "model_runner", None), "model", None)


def _sending(send: Callable[..., Any], iterator: Iterator[Any], trainer_args: Any) -> Any:
    return send(_digested(iterator), trainer_args)


def _digested(iterator: Iterator[Any]) -> Iterator[Any]:
    """The trainer's ``(name, tensor)`` pairs as they are, each digested before it is sent."""
    digest = WeightsDigest()
    for item in iterator:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            digest.update(item[0], item[1])
        yield item
    logger.info(LINE, "trainer sent", digest.count, digest.hexdigest())


def _receiving(receive: Callable[..., Any], self: Any, update_info: Any, load_weights: Any) -> Any:
    model = getattr(load_weights, "__self__", None)  # the worker hands ``model.load_weights``

    def load(weights: Any) -> Any:
        weights = list(weights)
        _received.update((name, tensor.dtype) for name, tensor in weights)
        if model is not None:
            tensors = _named_tensors(model)
            for name, tensor in weights:
                _sharded.full.update(name, tensor)
                expected = _slice(model, tensors, name, tensor)
                if expected is not None:
                    _sharded.expected.update(name, expected)
        return load_weights(weights)

    return receive(self, update_info, load_weights=load)


class _Shards:
    """This rank since its last update finished: the full tensors received, and its slices of them."""

    def __init__(self) -> None:
        self.full = WeightsDigest()
        self.expected = WeightsDigest()


_sharded = _Shards()


def tensor_parallel() -> tuple[int, int]:
    """This process's tensor parallel rank and size; (0, 1) where vLLM's groups are not set up (a model
    driven outside vLLM's worker, as a test drives Trinity's extension)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
    except Exception:  # noqa: BLE001 -- no groups: one rank of one
        return 0, 1


def _finalized(finalize: Callable[..., Any], model: Any, *args: Any, **kwargs: Any) -> Any:
    result = finalize(model, *args, **kwargs)
    if _addresses:
        now = _weight_addresses(model)
        moved = sorted(name for name, address in _addresses.items() if now.get(name) != address)
        logger.info(
            "simulated weight sync (rollout storages): %d of %d parameters and buffers at the address they "
            "had before the update%s",
            len(_addresses) - len(moved),
            len(_addresses),
            f"; moved: {', '.join(moved)}" if moved else "",
        )
        _addresses.clear()
    received = dict(_received)
    _received.clear()
    if received:
        _log_held(model, received)
    return result


def _log_held(model: Any, received: dict[str, Any]) -> None:
    """``rollout loaded``: what ``model`` holds under each received name, in the dtype it arrived in; under
    tensor parallelism, or where the model holds another dtype than arrived, the rank's ``received``,
    ``expected`` and ``holds`` (its slices, in its dtype)."""
    global _sharded
    rank, size = tensor_parallel()
    tensors = _named_tensors(model)
    found = {name: _held(model, tensors, name, size) for name in received}
    missing = [name for name, held in found.items() if held is None]
    held_here = {name: held for name, held in found.items() if held is not None}
    converted = any(held.dtype != received[name] for name, held in held_here.items())
    digest = WeightsDigest()
    for name, held in held_here.items():
        digest.update(
            name, held if size > 1 or converted else _unpadded(model, name, held).to(received[name])
        )
    if missing:
        logger.warning(
            "simulated weight sync (rollout): the model holds no tensor for %s", ", ".join(missing)
        )
    sharded, _sharded = _sharded, _Shards()
    if size == 1 and not converted:
        logger.info(LINE, "rollout loaded", digest.count, digest.hexdigest())
        return
    who = f"rollout tp rank {rank}/{size}"
    logger.info(LINE, f"{who} received", sharded.full.count, sharded.full.hexdigest())
    logger.info(LINE, f"{who} expected", sharded.expected.count, sharded.expected.hexdigest())
    logger.info(LINE, f"{who} holds", digest.count, digest.hexdigest())


def _held(model: Any, tensors: dict[str, Any], name: str, tp_size: int = 1) -> Any:
    """The tensor ``model`` holds for the loader's ``name``: its own, or its rows of a packed one (each part's
    rows a rank holds: the layer's ``output_sizes`` over the tensor parallel size)."""
    found = _packed(model, tensors, name)
    if found is None:
        return tensors.get(name)
    packed_name, index, sizes = found
    sizes = [size // tp_size for size in sizes]
    return tensors[packed_name].narrow(0, sum(sizes[:index]), sizes[index])


def _unpadded(model: Any, name: str, held: Any) -> Any:
    """At tensor parallel size 1, the rows of ``held`` that were loaded: a ``VocabParallelEmbedding`` (the
    embedding, the LM head) pads its vocabulary to a multiple of 64 rows, which its loader fills with
    zeros."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    layer_name = name.rpartition(".")[0]
    try:
        layer = model.get_submodule(layer_name) if layer_name else model
    except AttributeError:
        return held
    if not isinstance(layer, VocabParallelEmbedding):
        return held
    shard = layer.shard_indices
    return held.narrow(0, 0, shard.org_vocab_end_index - shard.org_vocab_start_index)


def _packed(model: Any, tensors: dict[str, Any], name: str) -> tuple[str, int, list[int]] | None:
    """Where the model packs the loader's ``name``: the packed tensor's name, the part's index and the layer's
    ``output_sizes``; None for a name the model holds as it is (or packs in a layer without them)."""
    if name in tensors:
        return None
    for packed, parts in (getattr(model, "packed_modules_mapping", None) or {}).items():
        for index, part in enumerate(parts):
            packed_name = f".{name}".replace(f".{part}.", f".{packed}.", 1)[1:]
            if packed_name == name or packed_name not in tensors:
                continue
            sizes = getattr(model.get_submodule(packed_name.rpartition(".")[0]), "output_sizes", None)
            if sizes is None or len(sizes) != len(parts):
                return None
            return packed_name, index, list(sizes)
    return None


def _named_tensors(model: Any) -> dict[str, Any]:
    """Every parameter and buffer of ``model`` by name, tied ones under each of their names."""
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    return tensors


def _slice(model: Any, tensors: dict[str, Any], name: str, full: Any) -> Any:
    """This rank's slice of the ``full`` tensor sent as ``name``, in the dtype the model holds it in, cut as
    the vLLM layer that holds it partitions it (module docstring); None where the model holds no such name."""
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    found = _packed(model, tensors, name)
    held_name, index = (found[0], found[1]) if found else (name, 0)
    if held_name not in tensors:
        return None
    layer_name, _, leaf = held_name.rpartition(".")
    layer = model.get_submodule(layer_name) if layer_name else model
    dtype = tensors[held_name].dtype
    rank, size = tensor_parallel()
    # a layer of a group of its own (vllm-ascend's o_proj or lm_head TP) states its own rank and size
    rank, size = getattr(layer, "tp_rank", rank), getattr(layer, "tp_size", size)
    if isinstance(layer, VocabParallelEmbedding):
        shard = layer.shard_indices
        rows = full.narrow(
            0, shard.org_vocab_start_index, shard.org_vocab_end_index - shard.org_vocab_start_index
        )
        padded = full.new_zeros((layer.num_embeddings_per_partition, *full.shape[1:]))
        padded[: rows.shape[0]] = rows
        return padded.to(dtype)
    if isinstance(layer, RowParallelLinear):
        width = layer.input_size_per_partition
        return (full.narrow(1, rank * width, width) if leaf == "weight" else full).to(dtype)
    if isinstance(layer, QKVParallelLinear):
        heads, head_size = (
            (layer.num_heads, layer.head_size) if index == 0
            else (layer.num_kv_heads, layer.v_head_size if index == 2 else layer.head_size)
        )  # fmt: skip
        shard_rank = rank if index == 0 else rank // layer.num_kv_head_replicas
        rows = heads * head_size
        return full.narrow(0, shard_rank * rows, rows).to(dtype)
    if isinstance(layer, MergedColumnParallelLinear):
        rows = layer.output_sizes[index] // size
        return full.narrow(0, rank * rows, rows).to(dtype)
    if isinstance(layer, ColumnParallelLinear):
        rows = layer.output_size_per_partition
        return full.narrow(0, rank * rows, rows).to(dtype)
    return full.to(dtype)
