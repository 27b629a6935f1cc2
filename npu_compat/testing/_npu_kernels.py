"""The torch_npu fused kernels that transformers and verl call on Ascend, computed in plain torch.

Each function here has the name, the signature (argument names, order and defaults), the
conventions and the return structure of the ``torch_npu`` 2.13.0 kernel it stands for, as
read from that wheel's op schema (``csrc/aten/npu_native_functions_by_codegen.yaml``), its
docstrings (``_op_plugin_docs.py``) and its meta registrations
(``op_plugin/meta/_meta_registrations.py``, which give the output shapes).  They are made of
ordinary torch operators, so they run on whatever tensors they get (on the device and in the
dtype of their input; fp16/bf16 attention and norms accumulate in float32 as the real
kernels do).

:data:`KERNELS` maps each ``torch_npu`` name to its function.  Each is registered (by
``_npu_ops.register``) as an ``npu::`` operator with torch_npu's schema (:data:`SCHEMAS`), a fake
implementation (:data:`OPERATORS`) and an autograd formula (:data:`AUTOGRAD`) that calls the backward kernel
torch_npu's own formula names (``npu_*_backward``, ``npu_fusion_attention_grad``); the simulated
``torch_npu`` serves the operators and keeps every other ``npu_*`` name a compute boundary.

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
        out = _from_bnsd(out_bnsd, input_layout).contiguous()  # a fresh tensor, as the kernel writes
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


# --------------------------------------------------------------------------- the backward kernels
#
# torch_npu differentiates each of these kernels with a backward kernel of its own (``npu_*_backward``,
# ``npu_fusion_attention_grad``), named in its autograd formulas.  Here each backward kernel computes the
# gradient of the plain-torch forward above: autograd's, through a recomputation, or (RMS norm, whose
# backward schema has ``rstd`` and no ``epsilon``) the closed form from ``rstd``.


def _grads(
    forward: Callable[..., Any], inputs: Sequence[torch.Tensor | None], grads: Sequence[torch.Tensor | None]
) -> list[torch.Tensor | None]:
    """The gradients of ``forward(*leaves)``'s outputs, weighted by ``grads``, with respect to each of
    ``inputs`` (None for an input that is None)."""
    with torch.enable_grad():
        leaves = [None if t is None else t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
        outputs = forward(*leaves)
        outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        weighted = zip(outputs, grads, strict=False)
        pairs = [(o, g) for o, g in weighted if g is not None and isinstance(o, torch.Tensor)]
        wrt = [t for t in leaves if t is not None and t.requires_grad]
        found = torch.autograd.grad(
            [o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True, materialize_grads=True
        )
    by_leaf = iter(found)
    return [
        None if t is None else (next(by_leaf) if t.requires_grad else torch.zeros_like(t)) for t in leaves
    ]


def npu_rms_norm_backward(
    dy: torch.Tensor, self: torch.Tensor, gamma: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dgamma)`` of ``y = x * rstd * gamma``, rstd a function of x: ``dx = rstd * (dy*gamma -
    xhat * mean(dy*gamma*xhat))`` with ``xhat = x * rstd``, over the last ``gamma.dim()`` dims."""
    dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
    compute = torch.promote_types(self.dtype, torch.float32)
    x, r = self.to(compute), rstd.to(compute)
    xhat = x * r
    dxhat = dy.to(compute) * gamma.to(compute)
    dx = r * (dxhat - xhat * (dxhat * xhat).mean(dim=dims, keepdim=True))
    lead = tuple(range(self.dim() - gamma.dim()))
    dgamma = (dy.to(compute) * xhat).sum(dim=lead) if lead else dy.to(compute) * xhat
    return dx.to(self.dtype), dgamma.to(gamma.dtype)


def npu_rotary_mul_backward(
    grad: torch.Tensor, self: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dr1, dr2)`` of :func:`npu_rotary_mul` (without ``rotate``, as the real backward)."""
    dx, dr1, dr2 = _grads(lambda x, a, b: npu_rotary_mul(x, a, b, rotary_mode), (self, r1, r2), (grad,))
    assert dx is not None and dr1 is not None and dr2 is not None
    return dx, dr1, dr2


def npu_swiglu_backward(grad_output: torch.Tensor, self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``dx`` of :func:`npu_swiglu`."""
    (dx,) = _grads(lambda x: npu_swiglu(x, dim), (self,), (grad_output,))
    assert dx is not None
    return dx


def npu_cross_entropy_loss_backward(
    grad_loss: torch.Tensor,
    log_prob: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    grad_zloss: torch.Tensor | None = None,
    lse_for_zloss: torch.Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    lse_square_scale_for_zloss: float = 0.0,
) -> torch.Tensor:
    """``d loss / d input`` from the forward's ``log_prob``: the loss of the logits ``log_prob`` has
    the same gradient as the loss of ``input``, whose per-row shift ``log_softmax`` removed."""
    if lse_square_scale_for_zloss != 0.0:
        raise _boundary("npu_cross_entropy_loss_backward(lse_square_scale_for_zloss)")

    def loss(logits: torch.Tensor) -> torch.Tensor:
        out = F.cross_entropy(
            logits,
            target,
            weight=weight.to(logits.dtype) if weight is not None else None,
            reduction=reduction,
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
        )
        return out if reduction == "none" else out.reshape(1)

    (dx,) = _grads(loss, (log_prob,), (grad_loss,))
    assert dx is not None
    return dx


def npu_fusion_attention_grad(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dy: torch.Tensor,
    head_num: int,
    input_layout: str,
    *,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    softmax_max: torch.Tensor | None = None,
    softmax_sum: torch.Tensor | None = None,
    softmax_in: torch.Tensor | None = None,
    attention_in: torch.Tensor | None = None,
    scale_value: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = 2147483647,
    next_tockens: int = 2147483647,
    inner_precise: int = 0,
    seed: int = 0,
    offset: int = 0,
    numels: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    softmax_layout: str = "",
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv, dpse, dsink)`` of :func:`npu_fusion_attention` with these options (``dpse`` and
    ``dsink`` empty where there is no ``pse``/``sink``)."""

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: torch.Tensor | None) -> Any:
        return npu_fusion_attention(
            q, k, v, head_num, input_layout, pse=p, padding_mask=padding_mask, atten_mask=atten_mask,
            scale=scale_value, keep_prob=keep_prob, pre_tockens=pre_tockens, next_tockens=next_tockens,
            inner_precise=inner_precise, prefix=prefix, actual_seq_qlen=actual_seq_qlen,
            actual_seq_kvlen=actual_seq_kvlen, sparse_mode=sparse_mode, softmax_layout=softmax_layout,
            sink=sink,
        )[0]  # fmt: skip

    dq, dk, dv, dpse = _grads(forward, (query, key, value, pse), (dy,))
    assert dq is not None and dk is not None and dv is not None
    empty = query.new_empty([0])
    return dq, dk, dv, empty if dpse is None else dpse, empty.clone()


# --------------------------------------------------------------------------- as torch.library operators

#: torch_npu 2.13.0's schemas of these kernels and their backward kernels
#: (``csrc/aten/npu_native_functions_by_codegen.yaml``), all in the ``npu`` namespace.
_FA_OPTIONS = "int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0"
SCHEMAS: dict[str, str] = {
    "npu::npu_rms_norm": "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    "npu::npu_rms_norm_backward": (
        "npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor, Tensor)"
    ),
    "npu::npu_rotary_mul": (
        "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) "
        "-> Tensor"
    ),
    "npu::npu_rotary_mul_backward": (
        "npu_rotary_mul_backward(Tensor grad, Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') "
        "-> (Tensor, Tensor, Tensor)"
    ),
    "npu::npu_swiglu": "npu_swiglu(Tensor self, int dim=-1) -> Tensor",
    "npu::npu_swiglu_backward": "npu_swiglu_backward(Tensor grad_output, Tensor self, int dim=-1) -> Tensor",
    "npu::npu_cross_entropy_loss": (
        "npu_cross_entropy_loss(Tensor input, Tensor target, Tensor? weight=None, str reduction='mean', "
        "int ignore_index=-100, float label_smoothing=0.0, float lse_square_scale_for_zloss=0.0, "
        "bool return_zloss=False) -> (Tensor, Tensor, Tensor, Tensor)"
    ),
    "npu::npu_cross_entropy_loss_backward": (
        "npu_cross_entropy_loss_backward(Tensor grad_loss, Tensor log_prob, Tensor target, "
        "Tensor? weight=None, Tensor? grad_zloss=None, Tensor? lse_for_zloss=None, str reduction='mean', "
        "int ignore_index=-100, "
        "float label_smoothing=0.0, float lse_square_scale_for_zloss=0.0) -> Tensor"
    ),
    "npu::npu_fusion_attention": (
        "npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
        "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., "
        f"float keep_prob=1., {_FA_OPTIONS}, int[]? prefix=None, int[]? actual_seq_qlen=None, "
        "int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, "
        'str softmax_layout="", Tensor? sink=None, Tensor? dropout_mask=None, int seed=0, int offset=0) '
        "-> (Tensor, Tensor, Tensor, Tensor, int, int, int)"
    ),
    "npu::npu_fusion_attention_grad": (
        "npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, "
        "str input_layout, *, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, "
        "Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, "
        "Tensor? attention_in=None, float scale_value=1., float keep_prob=1., "
        f"{_FA_OPTIONS}, int seed=0, int offset=0, int numels=0, int[]? prefix=None, "
        "int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
        'bool gen_mask_parallel=True, bool sync=False, str softmax_layout="", Tensor? sink=None) '
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)"
    ),
}


def _rms_norm_fake(self: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06) -> Any:
    dims = self.dim() - gamma.dim()
    return torch.empty_like(self), self.new_empty(
        [*self.shape[:dims], *([1] * gamma.dim())], dtype=torch.float32
    )


def _swiglu_fake(self: torch.Tensor, dim: int = -1) -> torch.Tensor:
    shape = list(self.shape)
    shape[dim] //= 2
    return self.new_empty(shape)


def _cross_entropy_fake(input: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    reduction = kwargs.get("reduction", args[1] if len(args) > 1 else "mean")
    loss = input.new_empty([input.shape[0]] if reduction == "none" else [1])
    return loss, torch.empty_like(input), input.new_empty([0]), input.new_empty([0])


def _fusion_attention_fake(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int, input_layout: str,
    *args: Any, **kwargs: Any,
) -> Any:  # fmt: skip
    out = query.new_empty([*query.shape[:-1], query.shape[-1] // key.shape[-1] * value.shape[-1]])
    if input_layout == "TND":
        rows = [query.shape[0], head_num]
    else:
        q = _to_bnsd(query, input_layout, head_num, None)
        rows = [q.shape[0], head_num, q.shape[2]]
    stats = query.new_empty([*rows, 8], dtype=torch.float32)
    return out, stats, torch.empty_like(stats), query.new_empty([0]), 0, 0, 0


def _fusion_attention_grad_fake(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dy: torch.Tensor, *args: Any, **kwargs: Any
) -> Any:
    pse = kwargs.get("pse")
    empty = query.new_empty([0])
    dpse = empty if pse is None else torch.empty_like(pse)
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), dpse, query.new_empty([0])


def _like_inputs(*which: int) -> Callable[..., Any]:
    def fake(*args: Any, **kwargs: Any) -> Any:
        outs = tuple(torch.empty_like(args[i]) for i in which)
        return outs if len(outs) > 1 else outs[0]

    return fake


#: ``npu::<name>`` -> (the plain-torch kernel, its fake implementation).
OPERATORS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "npu::npu_rms_norm": (npu_rms_norm, _rms_norm_fake),
    "npu::npu_rms_norm_backward": (npu_rms_norm_backward, _like_inputs(1, 2)),
    "npu::npu_rotary_mul": (npu_rotary_mul, _like_inputs(0)),
    "npu::npu_rotary_mul_backward": (npu_rotary_mul_backward, _like_inputs(1, 2, 3)),
    "npu::npu_swiglu": (npu_swiglu, _swiglu_fake),
    "npu::npu_swiglu_backward": (npu_swiglu_backward, _like_inputs(1)),
    "npu::npu_cross_entropy_loss": (npu_cross_entropy_loss, _cross_entropy_fake),
    "npu::npu_cross_entropy_loss_backward": (npu_cross_entropy_loss_backward, _like_inputs(1)),
    "npu::npu_fusion_attention": (npu_fusion_attention, _fusion_attention_fake),
    "npu::npu_fusion_attention_grad": (npu_fusion_attention_grad, _fusion_attention_grad_fake),
}


# --------------------------------------------------------------------------- their autograd formulas
#
# As torch_npu's: each forward saves what its backward kernel takes, and the backward calls that kernel
# through its operator.  ``inputs`` are the operator's arguments in schema order.


def _keep(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.inputs = inputs
    ctx.output = output


def _rms_norm_grad(ctx: Any, dy: torch.Tensor, _drstd: torch.Tensor | None) -> tuple[Any, ...]:
    x, gamma, _eps = ctx.inputs
    dx, dgamma = torch.ops.npu.npu_rms_norm_backward(dy, x, gamma, ctx.output[1])
    return dx, dgamma, None


def _rotary_mul_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, r1, r2, mode, rotate = ctx.inputs
    if rotate is not None:
        raise _boundary("npu_rotary_mul backward with rotate=...")
    dx, dr1, dr2 = torch.ops.npu.npu_rotary_mul_backward(grad, x, r1, r2, mode)
    return dx, dr1, dr2, None, None


def _swiglu_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, dim = ctx.inputs
    return torch.ops.npu.npu_swiglu_backward(grad, x, dim), None


def _cross_entropy_grad(ctx: Any, grad_loss: torch.Tensor, *_: Any) -> tuple[Any, ...]:
    _input, target, weight, reduction, ignore_index, smoothing, zloss_scale, _ = ctx.inputs
    dx = torch.ops.npu.npu_cross_entropy_loss_backward(
        grad_loss, ctx.output[1], target, weight, None, None, reduction, ignore_index, smoothing, zloss_scale
    )
    return (dx, *([None] * 7))


def _fusion_attention_backward(ctx: Any, dy: torch.Tensor, *_: Any) -> tuple[Any, ...]:
    q, k, v, head_num, layout, pse, padding_mask, atten_mask, scale, keep_prob, *rest = ctx.inputs
    pre, nxt, inner, prefix, qlen, kvlen, sparse_mode, gen_mask_parallel, sync, layout_of_softmax, sink = (
        rest[:11]
    )
    out, softmax_max, softmax_sum, softmax_in, seed, offset, numels = ctx.output
    dq, dk, dv, dpse, _dsink = torch.ops.npu.npu_fusion_attention_grad(
        q, k, v, dy, head_num, layout, pse=pse, padding_mask=padding_mask, atten_mask=atten_mask,
        softmax_max=softmax_max, softmax_sum=softmax_sum, softmax_in=softmax_in, attention_in=out,
        scale_value=scale, keep_prob=keep_prob, pre_tockens=pre, next_tockens=nxt, inner_precise=inner,
        seed=seed, offset=offset, numels=numels, prefix=prefix, actual_seq_qlen=qlen, actual_seq_kvlen=kvlen,
        sparse_mode=sparse_mode, gen_mask_parallel=gen_mask_parallel, sync=sync,
        softmax_layout=layout_of_softmax, sink=sink,
    )  # fmt: skip
    return (dq, dk, dv, None, None, dpse if pse is not None else None, *([None] * 18))


#: ``npu::<name>`` -> its backward, for ``torch.library.register_autograd`` (``setup_context`` keeps
#: the inputs and outputs).
AUTOGRAD: dict[str, tuple[Callable[..., None], Callable[..., Any]]] = {
    "npu::npu_rms_norm": (_keep, _rms_norm_grad),
    "npu::npu_rotary_mul": (_keep, _rotary_mul_grad),
    "npu::npu_swiglu": (_keep, _swiglu_grad),
    "npu::npu_cross_entropy_loss": (_keep, _cross_entropy_grad),
    "npu::npu_fusion_attention": (_keep, _fusion_attention_backward),
}
