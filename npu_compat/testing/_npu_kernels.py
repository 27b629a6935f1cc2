"""The torch_npu fused kernels that transformers and verl call on Ascend, computed in plain torch.

Each function here has the name, the signature (argument names, order and defaults), the
conventions and the return structure of the ``torch_npu`` 2.13.0 kernel it stands for, as
read from that wheel's op schema (``csrc/aten/npu_native_functions_by_codegen.yaml``), its
docstrings (``_op_plugin_docs.py``) and its meta registrations
(``op_plugin/meta/_meta_registrations.py``, which give the output shapes).  They are made of
ordinary torch operators, so they run on whatever tensors they get (on the device and in the
dtype of their input; fp16/bf16 attention and norms accumulate in float32 as the real
kernels do) and autograd differentiates them.

:data:`KERNELS` maps each ``torch_npu`` name to its function; the simulated ``torch_npu``
serves these and keeps every other ``npu_*`` name a compute boundary.

Computed:

* ``npu_fusion_attention`` -- layouts BSH, SBH, BSND, BNSD and TND (variable length, with the
  cumulative ``actual_seq_qlen``/``actual_seq_kvlen``); GQA; ``scale``; ``pse`` (non-varlen,
  uncompressed); ``atten_mask`` (True = masked out); ``sparse_mode`` 0 (with the
  ``pre_tockens``/``next_tockens`` band), 1, 2 (top-left causal), 3 (bottom-right causal) and
  4 (bottom-right band), the last three with the compressed 2048x2048 upper-triangular mask;
  ``keep_prob`` 1.0.  ``softmax_max``/``softmax_sum`` are the real per-row maximum of the
  scaled, masked scores and the sum of their exponentials, repeated over the 8 slots of the
  real layout.  Rows with every key masked give zeros (and max -inf, sum 0).
* ``npu_rms_norm``, ``npu_rotary_mul`` (modes ``half`` and ``interleave``, with and without
  ``rotate``), ``npu_swiglu``, ``npu_cross_entropy_loss`` (without z-loss).

Still boundaries (:class:`SimulatedComputeBoundary`, naming the kernel and the argument):
dropout (``keep_prob`` < 1: the Philox mask of the device cannot be reproduced), ``sink``,
``prefix`` and ``sparse_mode`` 5-8, a compressed (alibi) or varlen ``pse``, and the z-loss of
``npu_cross_entropy_loss``.  Every other ``torch_npu.npu_*`` kernel stays a boundary.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ._boundary import needs_npu

__all__ = [
    "KERNELS",
    "VARIANTS",
    "npu_cross_entropy_loss",
    "npu_fusion_attention",
    "npu_rms_norm",
    "npu_rotary_mul",
    "npu_swiglu",
]

_MAX_TOKENS = 2147483647
#: The side of the compressed causal mask that sparse modes 2, 3 and 4 take.
_COMPRESSED_MASK = 2048
_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")


def _boundary(what: str) -> Exception:
    return needs_npu(f"torch_npu.{what}", "not computed by the simulation")


# --------------------------------------------------------------------------- npu_fusion_attention


def _to_bnsd(x: torch.Tensor, layout: str, heads: int | None, head_dim: int | None) -> torch.Tensor:
    """``x`` in ``layout`` as [B, N, S, D]; the H layouts need ``heads`` or ``head_dim``."""
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout in ("BSH", "SBH"):
        if layout == "SBH":
            x = x.transpose(0, 1)
        b, s, h = x.shape
        n = heads if heads is not None else h // int(head_dim or 1)
        return x.reshape(b, s, n, h // n).transpose(1, 2)
    raise ValueError(f"npu_fusion_attention: unknown input_layout {layout!r}")


def _from_bnsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    b, n, s, d = x.shape
    bsh = x.transpose(1, 2).reshape(b, s, n * d)
    return bsh if layout == "BSH" else bsh.transpose(0, 1)


#: Compressed masks already checked: id -> (a weak reference to the mask, its version counter).
#: Callers build the mask once and pass it to every layer (transformers caches it per device);
#: checking 4M elements each call would cost more than the attention itself.
_CHECKED_MASKS: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}


def _check_compressed_mask(mask: torch.Tensor, sparse_mode: int) -> None:
    """Sparse modes 2, 3 and 4 take the optimized 2048x2048 upper-triangular mask (True above the
    diagonal) and derive the real mask from it; anything else would compute wrong on the NPU."""
    # An inference tensor (made under torch.inference_mode, as vLLM's engine makes vllm-ascend's mask) has
    # no version counter: it is taken as unchanged while it lives at the same address.
    version = -mask.data_ptr() - 1 if mask.is_inference() else mask._version
    checked = _CHECKED_MASKS.get(id(mask))
    if checked is not None and checked[1] == version and checked[0]() is mask:
        return
    side = _COMPRESSED_MASK
    if tuple(mask.shape) != (side, side):
        raise ValueError(
            f"npu_fusion_attention: sparse_mode={sparse_mode} takes the compressed {side}x{side} "
            f"lower-triangular mask (True above the diagonal), got shape {tuple(mask.shape)}"
        )
    expected = torch.ones(side, side, dtype=torch.bool, device=mask.device).triu(1)
    if not torch.equal(mask.bool(), expected):
        raise ValueError(
            f"npu_fusion_attention: sparse_mode={sparse_mode} takes torch.triu(ones(2048, 2048), 1) "
            "as atten_mask (True = masked out); the mask given differs from it"
        )
    for key, (ref, _) in list(_CHECKED_MASKS.items()):
        if ref() is None:
            del _CHECKED_MASKS[key]
    _CHECKED_MASKS[id(mask)] = (weakref.ref(mask), version)


def _band(sq: int, skv: int, pre: int, nxt: int, shift: int, device: torch.device) -> torch.Tensor:
    """True where key j lies outside [i + shift - pre, i + shift + next] for query i (masked out)."""
    i = torch.arange(sq, device=device).unsqueeze(-1)
    j = torch.arange(skv, device=device).unsqueeze(0)
    rel = j - i - shift
    return (rel > nxt) | (rel < -pre)


def _block_mask(
    atten_mask: torch.Tensor | None,
    sparse_mode: int,
    pre: int,
    nxt: int,
    sq: int,
    skv: int,
    device: torch.device,
    varlen: bool,
) -> torch.Tensor | None:
    """The boolean mask (True = masked out) of one [Sq, Skv] attention block, broadcastable to
    [B, N, Sq, Skv]; None when everything is computed."""
    if atten_mask is None:
        return None  # torch_npu: without atten_mask, sparse_mode/pre/next do not apply
    if sparse_mode in (2, 3, 4):
        _check_compressed_mask(atten_mask, sparse_mode)
        if sparse_mode == 2:  # leftUpCausal
            return _band(sq, skv, _MAX_TOKENS, 0, 0, device)
        if sparse_mode == 3:  # rightDownCausal
            return _band(sq, skv, _MAX_TOKENS, 0, skv - sq, device)
        return _band(sq, skv, pre, nxt, skv - sq, device)  # band, origin bottom-right
    mask = atten_mask.bool()
    mask = mask[..., :sq, :skv] if varlen else mask
    if mask.shape[-2:] != (sq, skv):
        raise ValueError(
            f"npu_fusion_attention: atten_mask of shape {tuple(atten_mask.shape)} does not fit "
            f"Sq={sq}, Skv={skv} (BNSS, B1SS, 11SS or SS)"
        )
    if sparse_mode == 0 and (pre < _MAX_TOKENS or nxt < _MAX_TOKENS):
        mask = mask | _band(sq, skv, pre, nxt, 0, device)  # defaultMask: band from the top left
    return mask


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    pse: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of [B, N, Sq, D] queries on [B, Nkv, Skv, D] keys/values (GQA when Nkv < N):
    the output [B, N, Sq, Dv] in q's dtype, and the float32 row max and sum [B, N, Sq]."""
    b, n, sq, d = q.shape
    nkv, skv = k.shape[1], k.shape[2]
    if skv == 0:  # no key to attend to: an all-masked row
        empty = torch.zeros(b, n, sq, device=q.device)
        return q.new_zeros(b, n, sq, v.shape[-1]), empty - float("inf"), empty
    if n % nkv:
        raise ValueError(f"npu_fusion_attention: {n} query heads are no multiple of {nkv} key/value heads")
    group = n // nkv
    compute = torch.promote_types(q.dtype, torch.float32)
    # [B, Nkv, G, Sq, D] against [B, Nkv, 1, Skv, D]: query head h reads kv head h // G
    qg = q.reshape(b, nkv, group, sq, d).to(compute)
    scores = torch.matmul(qg, k.unsqueeze(2).to(compute).transpose(-1, -2))
    scores = scores.reshape(b, n, sq, skv)
    if pse is not None:
        scores = scores + pse.to(compute)
    scores = scores * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True).detach()
    safe_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - safe_max)
    row_sum = weights.sum(dim=-1, keepdim=True)
    probs = weights / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
    out = torch.matmul(probs.reshape(b, nkv, group, sq, skv), v.unsqueeze(2).to(compute))
    out = out.reshape(b, n, sq, v.shape[-1]).to(q.dtype)
    return out, row_max.squeeze(-1).float(), row_sum.detach().squeeze(-1).float()


def _segments(cumulative: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) of each sequence from torch_npu's cumulative lengths; a length of 0 is kept,
    and trailing zeros (batches that do not take part) end the list."""
    bounds: list[tuple[int, int]] = []
    start = 0
    for end in (int(c) for c in cumulative):
        if end < start:  # the trailing zeros of "[2, 5, 9, 0, 0]"
            break
        bounds.append((start, end))
        start = end
    return bounds


def _cumulative(value: Any, name: str) -> list[int]:
    if value is None:
        raise ValueError(f"npu_fusion_attention: input_layout 'TND' needs {name}")
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.tolist()]
    return [int(v) for v in value]


def _varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    actual_seq_qlen: Any,
    actual_seq_kvlen: Any,
    scale: float,
    atten_mask: torch.Tensor | None,
    sparse_mode: int,
    pre: int,
    nxt: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TND: [T, N, D] queries, each sequence attending only to its own keys."""
    q_segments = _segments(_cumulative(actual_seq_qlen, "actual_seq_qlen"))
    kv_segments = _segments(_cumulative(actual_seq_kvlen, "actual_seq_kvlen"))
    if len(q_segments) != len(kv_segments):
        raise ValueError(
            f"npu_fusion_attention: actual_seq_qlen has {len(q_segments)} sequences, "
            f"actual_seq_kvlen {len(kv_segments)}"
        )
    t, n = query.shape[0], query.shape[1]
    outs: list[torch.Tensor] = []
    maxes: list[torch.Tensor] = []
    sums: list[torch.Tensor] = []
    covered = 0
    for (q0, q1), (k0, k1) in zip(q_segments, kv_segments, strict=True):
        sq, skv = q1 - q0, k1 - k0
        if sq == 0:
            continue
        q = query[q0:q1].transpose(0, 1).unsqueeze(0)  # [1, N, Sq, D]
        k = key[k0:k1].transpose(0, 1).unsqueeze(0)
        v = value[k0:k1].transpose(0, 1).unsqueeze(0)
        mask = _block_mask(atten_mask, sparse_mode, pre, nxt, sq, skv, query.device, varlen=True)
        out, row_max, row_sum = _attend(q, k, v, scale, None, mask)
        outs.append(out[0].transpose(0, 1))  # [Sq, N, Dv]
        maxes.append(row_max[0].transpose(0, 1))  # [Sq, N]
        sums.append(row_sum[0].transpose(0, 1))
        covered = q1
    if covered < t:  # tokens after the last sequence take part in nothing: zeros
        outs.append(query.new_zeros(t - covered, n, value.shape[-1]))
        maxes.append(torch.full((t - covered, n), float("-inf"), device=query.device))
        sums.append(torch.zeros(t - covered, n, device=query.device))
    return torch.cat(outs), torch.cat(maxes), torch.cat(sums)


def npu_fusion_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
    sink: torch.Tensor | None = None,
    dropout_mask: torch.Tensor | None = None,
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """``softmax(mask(scale * (query @ key^T + pse), atten_mask)) @ value``, as torch_npu's.

    Returns ``(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)``:
    ``attention_out`` in ``input_layout`` and query's dtype; ``softmax_max``/``softmax_sum``
    float32 of shape [B, N, Sq, 8] ([T, N, 8] for TND, as the wheel's meta registration);
    ``softmax_out`` an empty tensor (reserved in torch_npu); and ``0, 0, 0`` for the dropout
    generator's seed, offset and mask length (no dropout is drawn at ``keep_prob`` 1).
    """
    if input_layout not in _LAYOUTS:
        raise ValueError(
            f"npu_fusion_attention: input_layout must be one of {_LAYOUTS}, got {input_layout!r}"
        )
    if not 0.0 < keep_prob <= 1.0:
        raise ValueError(f"npu_fusion_attention: keep_prob must lie in (0, 1], got {keep_prob}")
    if keep_prob < 1.0:
        raise _boundary(f"npu_fusion_attention(keep_prob={keep_prob})")
    if sink is not None:
        raise _boundary("npu_fusion_attention(sink=...)")
    if prefix is not None or sparse_mode in (5, 6, 7, 8):
        raise _boundary(f"npu_fusion_attention(sparse_mode={sparse_mode}, prefix=...)")
    if sparse_mode not in (0, 1, 2, 3, 4):
        raise ValueError(f"npu_fusion_attention: sparse_mode must lie in 0..8, got {sparse_mode}")
    if padding_mask is not None:
        raise ValueError("npu_fusion_attention: padding_mask is not supported (nor by torch_npu)")
    if softmax_layout not in ("", "TND") or (softmax_layout == "TND" and input_layout != "TND"):
        raise ValueError(
            "npu_fusion_attention: softmax_layout is '' or, for input_layout 'TND' only, 'TND'; "
            f"got {softmax_layout!r}"
        )
    pre, nxt = int(pre_tockens), int(next_tockens)

    if input_layout == "TND":
        if pse is not None:
            raise _boundary("npu_fusion_attention(input_layout='TND', pse=...)")
        if query.shape[1] != head_num:
            raise ValueError(
                f"npu_fusion_attention: head_num={head_num} but query has {query.shape[1]} heads"
            )
        out, row_max, row_sum = _varlen_attention(
            query, key, value, actual_seq_qlen, actual_seq_kvlen, scale, atten_mask, sparse_mode, pre, nxt
        )
        softmax_max = row_max.unsqueeze(-1).expand(*row_max.shape, 8).contiguous()
        softmax_sum = row_sum.unsqueeze(-1).expand(*row_sum.shape, 8).contiguous()
    else:
        q = _to_bnsd(query, input_layout, head_num, None)
        head_dim = q.shape[-1]
        k = _to_bnsd(key, input_layout, None, head_dim)
        nkv = k.shape[1]
        v = _to_bnsd(value, input_layout, nkv, None)
        if q.shape[1] != head_num:
            raise ValueError(f"npu_fusion_attention: head_num={head_num} but query has {q.shape[1]} heads")
        sq, skv = q.shape[2], k.shape[2]
        if pse is not None and pse.shape[-2] not in (1, sq):
            raise _boundary("npu_fusion_attention(pse=<alibi-compressed>)")
        mask = _block_mask(atten_mask, sparse_mode, pre, nxt, sq, skv, query.device, varlen=False)
        out_bnsd, row_max, row_sum = _attend(q, k, v, scale, pse, mask)
        out = _from_bnsd(out_bnsd, input_layout)
        softmax_max = row_max.unsqueeze(-1).expand(*row_max.shape, 8).contiguous()
        softmax_sum = row_sum.unsqueeze(-1).expand(*row_sum.shape, 8).contiguous()
    softmax_out = query.new_empty([0])
    return out, softmax_max, softmax_sum, softmax_out, 0, 0, 0


# --------------------------------------------------------------------------- the elementwise kernels


def npu_rms_norm(
    self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, rstd)``: ``rstd = 1 / sqrt(mean(x^2) + epsilon)`` over the last ``gamma.dim()`` dims
    (float32, those dims kept as 1), ``y = x * rstd * gamma`` in x's dtype."""
    dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
    x = self.to(torch.promote_types(self.dtype, torch.float32))
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = (x * rstd * gamma.to(x.dtype)).to(self.dtype)
    return y, rstd.float()


def npu_rotary_mul(
    self: torch.Tensor,
    r1: torch.Tensor,
    r2: torch.Tensor,
    rotary_mode: str = "half",
    rotate: torch.Tensor | None = None,
) -> torch.Tensor:
    """``r1 * x + r2 * x_new`` in x's dtype, where ``x_new`` is ``cat(-x2, x1)`` of x's two halves
    (``half``), the pairs ``(-x[2i+1], x[2i])`` (``interleave``), or ``x @ rotate`` when given."""
    if rotate is not None:
        rotated = torch.matmul(self, rotate.to(self.dtype))
    elif rotary_mode == "half":
        x1, x2 = torch.chunk(self, 2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
    elif rotary_mode == "interleave":
        x1, x2 = self[..., ::2], self[..., 1::2]
        rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
    else:
        raise ValueError(f"npu_rotary_mul: rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")
    return (r1 * self + r2 * rotated).to(self.dtype)


def npu_swiglu(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``silu(A) * B`` where A, B are the first and second halves of x along ``dim``."""
    if self.shape[dim] % 2:
        raise ValueError(f"npu_swiglu: dim {dim} has odd size {self.shape[dim]}")
    a, b = torch.chunk(self, 2, dim=dim)
    return F.silu(a) * b


def npu_cross_entropy_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    lse_square_scale_for_zloss: float = 0.0,
    return_zloss: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, log_prob, zloss, lse_for_zloss)`` of [N, C] logits and [N] targets: ``loss`` is
    [N] for ``reduction="none"`` and [1] otherwise, ``log_prob`` the [N, C] log-softmax; the two
    z-loss outputs are empty (torch_npu 2.13 has them not enabled either)."""
    if return_zloss or lse_square_scale_for_zloss != 0.0:
        raise _boundary("npu_cross_entropy_loss(return_zloss=True / lse_square_scale_for_zloss)")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(
            f"npu_cross_entropy_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
        )
    log_prob = torch.log_softmax(input, dim=-1)
    loss = F.cross_entropy(
        input,
        target,
        weight=weight.to(input.dtype) if weight is not None else None,
        reduction=reduction,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
    )
    if reduction != "none":
        loss = loss.reshape(1)
    empty = input.new_empty([0])
    return loss, log_prob, empty, empty.clone()


def _input_layout(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return str(kwargs.get("input_layout", args[4] if len(args) > 4 else "?"))


#: How the calls of a kernel are told apart in the counts (``npu_fusion_attention[TND]``): by layout.
VARIANTS: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], str]] = {
    "npu_fusion_attention": _input_layout,
}

#: ``torch_npu`` name -> its plain-torch implementation.
KERNELS: dict[str, Callable[..., Any]] = {
    "npu_fusion_attention": npu_fusion_attention,
    "npu_rms_norm": npu_rms_norm,
    "npu_rotary_mul": npu_rotary_mul,
    "npu_swiglu": npu_swiglu,
    "npu_cross_entropy_loss": npu_cross_entropy_loss,
}
