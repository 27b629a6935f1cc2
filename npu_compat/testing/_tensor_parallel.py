# torch is not installed where mypy runs (the lint session): its classes are Any there.
# mypy: disable-error-code="misc"
"""Tensor parallelism for the simulated ``NPUModelRunner``: a transformers decoder sharded as vLLM shards it.

With ``tensor_parallel_size`` T, vLLM starts one worker per rank (its multiprocess executor, one
``NPUWorker`` per NPU), forms the TP group over the device backend (``hccl``, simulated), and
loads each rank's *shard* of the weights.  The stand-in runner computes with a transformers
model, not vLLM's model classes; :func:`shard_model` makes that model tensor parallel in place,
with vLLM's partitioning of the Llama family (Qwen2, Llama, Mistral):

* column parallel (``ColumnParallelLinear`` / ``QKVParallelLinear`` / ``MergedColumnParallelLinear``):
  ``q_proj`` by query heads, ``k_proj``/``v_proj`` by KV heads -- replicated as vLLM replicates them
  when T exceeds the KV heads (rank r holds head ``r // (T / kv_heads)``) -- and ``gate_proj``/``up_proj``
  by rows: each rank computes its heads and its slice of the MLP;
* row parallel (``RowParallelLinear``): ``o_proj`` and ``down_proj`` by input columns, their outputs
  summed over the TP group with ``all_reduce`` (then the bias, once);
* ``VocabParallelEmbedding``: the vocabulary padded to a multiple of 64 and split in T ranges; a
  rank embeds the ids in its range, zero elsewhere, and the group sums;
* ``ParallelLMHead``: the same vocabulary split (the embedding's own shard where the two are tied);
  logits are gathered over the group.  vLLM gathers them to rank 0 only; here every rank gets them
  (``all_gather``), so every rank samples alike.

Each sharded parameter carries a ``weight_loader(param, full_tensor)`` that copies its rank's slice
of the full (Hugging Face named) tensor, as vLLM's parallel layers' loaders do; so the stand-in's
``load_weights``, vLLM's layerwise reload and a trainer's weight sync of full tensors all load
shards.  :func:`shard_of` is that slice, for a digest of what a rank should hold.

The collectives are vLLM's ``get_tp_group()`` (``GroupCoordinator.all_reduce`` / ``all_gather``
over the device communicator on the simulated ``hccl`` process group): what runs over HCCL in a
forward pass of the real one runs here too.  What is not real: vLLM's model classes, fused QKV and
gate/up parameters (the Hugging Face names are kept), the attention backend and paged KV cache
(see ``model_runner_v1``), sequence-parallel and pipeline parallel layers.  Another architecture
at T > 1 is the compute boundary, by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from npu_compat.testing._boundary import needs_npu

#: vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``: the vocabulary is padded to a multiple of it before the split.
VOCAB_PADDING = 64

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def _tp_group() -> Any:
    from vllm.distributed import get_tp_group

    return get_tp_group()


class _Sharded(nn.Module):
    """A layer holding one rank's shard; ``weight_loader`` takes the full tensor and keeps the slice."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        take: Callable[[torch.Tensor, int], torch.Tensor],
    ):
        super().__init__()
        self.take = take  # (full tensor, dim of the weight it applies to) -> this rank's slice
        self.weight = nn.Parameter(take(weight, 0).clone(), requires_grad=False)
        self.bias = (
            None if bias is None else nn.Parameter(self._bias_slice(bias).clone(), requires_grad=False)
        )
        for param in self.parameters():
            param.weight_loader = self._load

    def _bias_slice(self, bias: torch.Tensor) -> torch.Tensor:
        return self.take(bias, 0)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        part = self._bias_slice(loaded) if param.dim() == 1 else self.take(loaded, 0)
        if part.shape != param.shape:
            raise ValueError(
                f"tensor parallel load: a slice {tuple(part.shape)} for a shard {tuple(param.shape)}"
            )
        param.data.copy_(part)


class ColumnParallel(_Sharded):
    """Output rows split over the ranks; the output stays split (the next row-parallel layer sums)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallel(_Sharded):
    """Input columns split over the ranks; the partial outputs are summed over the TP group, then the bias."""

    def _bias_slice(self, bias: torch.Tensor) -> torch.Tensor:
        return bias  # the bias is the whole output's: added once, after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _tp_group().all_reduce(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(_Sharded):
    """Rows ``[start, end)`` of the padded vocabulary; ids outside embed to zero, and the group sums."""

    def __init__(
        self, weight: torch.Tensor, take: Callable[[torch.Tensor, int], torch.Tensor], start: int, end: int
    ):
        super().__init__(weight, None, take)
        self.start, self.end = start, end

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        inside = (ids >= self.start) & (ids < self.end)
        local = F.embedding((ids - self.start) * inside, self.weight)
        local = local * inside.unsqueeze(-1).to(local.dtype)
        return _tp_group().all_reduce(local)


class ParallelLMHead(nn.Module):
    """The output embedding over the split vocabulary: local logits, gathered, cut to the real vocabulary.

    ``embedding`` holds the shard (the input embedding itself where the two are tied)."""

    def __init__(self, embedding: VocabParallelEmbedding, vocab_size: int) -> None:
        super().__init__()
        self.weight = embedding.weight
        self.take = embedding.take
        self.vocab_size = vocab_size

    def _bias_slice(self, bias: torch.Tensor) -> torch.Tensor:
        return bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = _tp_group().all_gather(F.linear(hidden, self.weight), dim=-1)
        return logits[..., : self.vocab_size]


def _rows(rank: int, size: int) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """Rank ``rank``'s equal part of dimension ``dim`` (or of the first, for a bias) among ``size``."""

    def take(full: torch.Tensor, dim: int) -> torch.Tensor:
        if full.shape[dim] % size:
            raise needs_npu(
                "NPUModelRunner (tensor parallel)", f"{full.shape[dim]} rows do not split in {size}"
            )
        part = full.shape[dim] // size
        return full.narrow(dim, rank * part, part)

    return take


def _columns(rank: int, size: int) -> Callable[[torch.Tensor, int], torch.Tensor]:
    rows = _rows(rank, size)
    return lambda full, dim: rows(full, 1) if full.dim() == 2 else full


def _kv_heads(
    rank: int, size: int, kv_heads: int, head_dim: int
) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """vLLM's ``QKVParallelLinear`` split of K or V: by heads, or a head on ``size / kv_heads`` ranks each."""
    if kv_heads >= size:
        if kv_heads % size:
            raise needs_npu("NPUModelRunner (tensor parallel)", f"{kv_heads} KV heads do not split in {size}")
        return _rows(rank, size)
    if size % kv_heads:
        raise needs_npu(
            "NPUModelRunner (tensor parallel)", f"{size} ranks do not replicate {kv_heads} KV heads"
        )
    head = rank // (size // kv_heads)
    return lambda full, dim: full.narrow(0, head * head_dim, head_dim)


def _padded(weight: torch.Tensor, rows: int) -> torch.Tensor:
    if weight.shape[0] == rows:
        return weight
    return torch.cat([weight, weight.new_zeros(rows - weight.shape[0], *weight.shape[1:])])


def _vocab(rank: int, size: int, vocab: int) -> tuple[Callable[[torch.Tensor, int], torch.Tensor], int, int]:
    padded = -(-vocab // VOCAB_PADDING) * VOCAB_PADDING
    if padded % size:
        raise needs_npu(
            "NPUModelRunner (tensor parallel)", f"a vocabulary of {padded} does not split in {size}"
        )
    part = padded // size
    start = rank * part
    return (lambda full, dim: _padded(full, padded).narrow(0, start, part)), start, start + part


def shard_model(model: nn.Module, rank: int, size: int) -> nn.Module:
    """Make a transformers causal LM of the Llama family tensor parallel in place: rank ``rank`` of ``size``.

    Returns the model.
    """
    config = model.config
    decoder: Any = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") and hasattr(layer, "mlp") for layer in layers):
        raise needs_npu(
            f"NPUModelRunner (tensor parallel for {type(model).__name__})", "Llama-family decoders only"
        )
    num_heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    if num_heads % size:
        raise needs_npu(
            "NPUModelRunner (tensor parallel)", f"{num_heads} attention heads do not split in {size}"
        )
    rows, columns = _rows(rank, size), _columns(rank, size)
    kv = _kv_heads(rank, size, kv_heads, head_dim)
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not all(hasattr(attn, n) for n in _ATTENTION) or not all(hasattr(mlp, n) for n in _MLP):
            raise needs_npu(
                f"NPUModelRunner (tensor parallel for {type(model).__name__})",
                "q/k/v/o and gate/up/down projections",
            )
        for module, name, take, cls in (
            (attn, "q_proj", rows, ColumnParallel),
            (attn, "k_proj", kv, ColumnParallel),
            (attn, "v_proj", kv, ColumnParallel),
            (attn, "o_proj", columns, RowParallel),
            (mlp, "gate_proj", rows, ColumnParallel),
            (mlp, "up_proj", rows, ColumnParallel),
            (mlp, "down_proj", columns, RowParallel),
        ):
            linear = getattr(module, name)
            bias = None if linear.bias is None else linear.bias.data
            setattr(module, name, cls(linear.weight.data, bias, take))
        # the attention of this rank: its query heads over its KV heads (transformers' repeat_kv ratio)
        attn.num_key_value_groups = (num_heads // size) // max(1, kv_heads // size)
    vocab = config.vocab_size
    take, start, end = _vocab(rank, size, vocab)
    embed = decoder.embed_tokens
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is embed.weight
    decoder.embed_tokens = VocabParallelEmbedding(embed.weight.data, take, start, end)
    head = model.get_output_embeddings()
    if head is not None:
        if getattr(head, "bias", None) is not None:
            raise needs_npu("NPUModelRunner (tensor parallel)", "an output embedding with a bias")
        sharded = decoder.embed_tokens if tied else VocabParallelEmbedding(head.weight.data, take, start, end)
        model.lm_head = ParallelLMHead(sharded, vocab)
    model.tensor_parallel = (rank, size)
    return model


def shard_of(model: nn.Module, name: str, full: torch.Tensor) -> torch.Tensor:
    """The slice of the full tensor ``name`` that this rank's parameter holds (all of an unsharded one)."""
    module_name = name.rpartition(".")[0]
    module = model.get_submodule(module_name) if module_name else model
    if isinstance(module, _Sharded | ParallelLMHead):
        return module._bias_slice(full) if full.dim() == 1 else module.take(full, 0)
    return full
