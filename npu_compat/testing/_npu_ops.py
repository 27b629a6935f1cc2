"""The kernels vllm-ascend's eager path of a dense model calls, as real ``torch.library`` operators.

vllm-ascend reaches these through ``torch.ops`` (``torch_npu.npu_add_rms_norm`` *is*
``torch.ops.npu.npu_add_rms_norm``; torch_npu's ATB functions are rebound to ``torch.ops.atb.*``;
vllm-ascend's own kernels are ``torch.ops._C_ascend.*``), and its compiled and captured paths look at
the operator, its overloads and its schema.  So here each one is a ``torch.library`` operator with
the real schema, registered in the real namespace: a plain-torch kernel for the ``CPU`` and
``PrivateUse1`` keys (``npu`` tensors of the simulation are host memory, so the same code serves
both) and a fake (meta) implementation for ``FakeTensorMode``, dynamo and AOT.  :func:`register`
registers them once per process; :func:`torch_npu_names` maps each ``torch_npu`` attribute to its
operator packet for the simulated ``torch_npu``.

Where each schema (and each fake implementation's shapes) was read:

* ``npu::npu_add_rms_norm``, ``npu::npu_fused_infer_attention_score`` (``.default`` and ``.out``),
  ``npu::_npu_fused_infer_attention_score_get_max_workspace``, ``npu::npu_top_k_top_p``: torch_npu
  2.13.0 ``csrc/aten/npu_native_functions_by_codegen.yaml``; output shapes from
  ``op_plugin/meta/_meta_registrations.py`` (``npu_add_rms_norm_meta``,
  ``npu_fused_infer_attention_score_forward`` with ``infer_attention_out_shape``/
  ``infer_lse_out_shape``, ``npu_top_k_top_p_meta``); semantics from ``_op_plugin_docs.py``.
* ``atb::_npu_rotary_embedding``, ``atb::_npu_reshape_and_cache``, ``atb::_npu_matmul_add_fp32``:
  the schema strings registered by torch_npu 2.13.0 ``lib/libop_plugin_atb.so`` (op-plugin's
  ``op_plugin/ops/atb/`` sources, which ``op_plugin/atb/_atb_ops.py`` binds as ``torch_npu._npu_*``).
* ``npu::npu_dynamic_quant``, ``npu::npu_add_rms_norm_quant``, ``npu::npu_add_rms_norm_dynamic_quant``,
  ``npu::npu_quantize``:
  the same yaml; shapes from ``_meta_registrations.py``, formulas from ``_op_plugin_docs.py`` (int8
  outputs only).  A quantized model runs them; vllm-ascend's norm-quant fusion pass also runs them on
  example tensors whenever a model compiles in bfloat16 or float16.
* ``_C_ascend::npu_add_rms_norm_bias``: vllm-ascend 0.23.0.post1 ``csrc/torch_binding.cpp``, shapes
  from ``csrc/torch_binding_meta.cpp``, rounding from
  ``csrc/moe/add_rms_norm_bias/op_kernel/add_rms_norm_bias.h``.
* ``_C_ascend::npu_apply_top_k_top_p``: the schema string in vllm-ascend 0.18.0's
  ``vllm_ascend/vllm_ascend_C*.so`` (it wraps ``aclnnApplyTopKTopPCustom``, the same computation
  as ``npu_top_k_top_p``).
* ``_C_ascend::get_masked_input_and_mask``, ``bgmv_shrink``/``bgmv_expand``, ``sgmv_shrink``/
  ``sgmv_expand``: the schema strings of 0.18.0's ``vllm_ascend_C*.so``, the same in 0.23.0.post1's
  ``csrc/torch_binding.cpp`` (vllm-ascend's ``meta_registration`` registers their meta kernels once
  ``vllm_ascend_C`` is importable); the first computes as vLLM's own ``get_masked_input_and_mask``.
  The punica LoRA kernels compute as vllm-ascend v0.23.0 (tag commit 5cb98caaad; the files are the
  same on ``releases/v0.23.0``, the branch of 0.23.0.post1) writes them: the bindings and their
  ``TORCH_CHECK`` s in ``csrc/torch_binding.cpp`` (``bgmv_shrink`` ... ``sgmv_expand``), the AscendC
  kernels ``csrc/kernels/bgmv_shrink.cpp``, ``bgmv_expand.cpp``, ``sgmv_shrink.cpp``,
  ``sgmv_expand.cpp``, and the meta kernels (the fake implementations) in
  ``csrc/torch_binding_meta.cpp``; 0.23.0.post1's ``vllm_ascend/lora/lora_ops.py`` is how
  ``PunicaWrapperNPU`` calls them.

Computed:

* ``npu_add_rms_norm``/``npu_add_rms_norm_bias`` -- ``x = x1 + x2``, ``rstd = 1/sqrt(mean(x^2) +
  epsilon)`` over the last ``gamma.dim()`` dims (float32), ``y = x * rstd * gamma (+ beta)``; fp16
  adds in fp16, bf16 in fp32, as the kernel source does.
* ``npu_fused_infer_attention_score`` -- ``input_layout`` ``TND`` (cumulative
  ``actual_seq_lengths``; key/value either current ``[T, Nkv, D]`` tensors with cumulative
  ``actual_seq_lengths_kv``, or, with ``block_table``, a paged cache ``[num_blocks, block_size,
  Nkv*D]`` or ``[num_blocks, Nkv, block_size, D]`` with per-request ``actual_seq_lengths_kv``), and
  ``BSH``/``BSND``/``BNSD`` without ``actual_seq_lengths``/``block_table``; GQA; ``scale``;
  ``sparse_mode`` 0 (no mask: everything; a full mask for the dense layouts, with the
  ``pre_tokens``/``next_tokens`` band from the top left), 1 (full mask, dense layouts), 2
  (top-left causal), 3 (bottom-right causal: query i of a request with q and kv lengths ``sq``,
  ``skv`` sees kv j <= skv - sq + i) and 4 (the band ``[i + skv - sq - pre_tokens, i + skv - sq +
  next_tokens]``), the last three with the compressed 2048x2048 ``triu(1)`` mask (with a single
  query row the dense layouts ignore the sparse mode and the band, as the documented incremental
  branch does).  fp16/bf16 accumulate in float32.  ``softmax_lse`` is the per-row log-sum-exp
  (float32, ``[T, N, 1]`` for TND, ``[B, N, S, 1]`` otherwise) with ``softmax_lse_flag``, else an
  empty ``[0]`` float32 tensor (the meta registration's and op-plugin's shape;
  ``_op_plugin_docs.py`` says ``[1]``).  ``.out`` writes the same into ``attention_out`` (and
  ``softmax_lse`` with the flag); ``workspace`` is not needed, and
  ``_npu_fused_infer_attention_score_get_max_workspace`` returns an empty tensor of query's dtype.
* ``npu_top_k_top_p``/``npu_apply_top_k_top_p`` -- the documented algorithm: stable ascending sort,
  top-k keeps values >= the k-th largest, softmax, ascending cumulative sum, top-p drops positions
  whose cumulative probability is <= 1 - p (always keeping the largest); dropped logits are -inf.
* ``_npu_rotary_embedding`` -- in place on ``query``/``key`` (``[T, N*head_size]``): cos/sin are the
  halves of ``cos_sin_cache`` rows at ``positions``; neox style rotates the halves of each head,
  GPT-J style the interleaved pairs.  (The real kernel keeps the first ``cos_sin_cache`` it is given
  for the rest of the process; here each call uses the cache it is passed.)
* ``_npu_reshape_and_cache`` -- ``key_cache[slot // block_size, slot % block_size] = key[t]`` (and
  value), in place.
* ``_npu_matmul_add_fp32`` -- ``C += x^T @ weight`` in float32, in place on ``C``.
* ``bgmv_shrink``/``sgmv_shrink`` -- LoRA A: ``y[t] = scale * x[t] @ weight[lora(t)]^T`` over ``y``'s row
  (written, not added), ``x`` and ``weight`` fp16/bf16 cast to float32, products and sums in float32, ``y``
  float32 ``[T, rank]``; ``bgmv_expand``/``sgmv_expand`` -- LoRA B: ``y[t, slice_offset:slice_offset +
  slice_size] += x[t] @ weight[lora(t)]^T`` with ``x`` float32 ``[T, rank]``, the sum in float32 rounded
  once (``CAST_RINT``) to ``y``'s fp16/bf16, always added (``lora_ops.py`` does not pass ``add_inputs`` on),
  returning ``y`` itself (the meta kernel, and so the fake, returns ``empty_like(y)``).  ``weight`` is
  ``[num_loras, out, in]`` or ``[num_loras, 1, out, in]``.  ``lora(t)`` is ``indices[t]`` for bgmv; for sgmv
  the adapter ``lora_indices[i]`` of the first sequence ``i`` with ``t < seq_len[0] + ... + seq_len[i]``.
  A token whose adapter is negative (-1, no LoRA) or, for sgmv, past the last sequence is skipped: its row of
  ``y`` stays as it was.  The bindings' ``TORCH_CHECK`` s are ``RuntimeError`` s with their messages.

Compute boundaries (:class:`SimulatedComputeBoundary`, naming the argument): in
``npu_fused_infer_attention_score`` every quantization, prefix, padding, ``pse_shift`` and MLA rope
argument, int8/int4 inputs, ``sparse_mode`` 5-9, the other ``input_layout`` values, the NZ (5-dim)
cache, a paged cache outside ``TND``, ``actual_seq_lengths``/``actual_seq_lengths_kv`` with the dense
layouts, and a full ``atten_mask`` (sparse modes 0/1) with ``TND``; a ``cos_sin_cache`` narrower or
wider than ``head_size`` in ``_npu_rotary_embedding``; negative ``slot_indices`` in
``_npu_reshape_and_cache``; in the punica LoRA kernels, what would make the kernel read other bytes than the
tensors' elements (an argument of another dtype than the kernel's ``X_T``/``W_T``/``Y_T``/``int64_t``, a
non-contiguous one, a weight not ``[num_loras, (1,) out, in]``, an adapter index past the weight, fewer
``lora_indices`` than ``seq_len`` entries, more rows of ``x`` than of ``y``) and what v0.23.0's kernels
compute wrong: rows that are no whole 32-byte ``DataCopy`` blocks (``hidden_in`` of fp16/bf16 not a multiple
of 16, a shrink rank not a multiple of 8, an expand ``slice_size`` not a multiple of 16) and an expand rank
other than 8, 16, 32 or 64 (``Compute`` has no branch for it).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import torch

from . import _npu_kernels
from ._boundary import needs_npu
from ._npu_kernels import (
    _COMPRESSED_MASK,
    _MAX_TOKENS,
    _attend,
    _band,
    _check_compressed_mask,
    _from_bnsd,
    _to_bnsd,
)

__all__ = [
    "ATB_NAMES",
    "OPERATORS",
    "SCHEMAS",
    "has_atb",
    "register",
    "torch_npu_names",
]

# --------------------------------------------------------------------------- the schemas

#: The arguments of ``npu_fused_infer_attention_score`` (torch_npu 2.13.0's yaml), shared by its
#: overloads and by ``_npu_fused_infer_attention_score_get_max_workspace``.
_FIA_ARGUMENTS = (
    "Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, Tensor? atten_mask=None, "
    "SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, "
    "Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, "
    "Tensor? quant_offset2=None, Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, "
    "Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
    "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
    "Tensor? query_padding_size=None, "
    "Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, "
    "SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, "
    "Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, int pre_tokens=2147483647, "
    'int next_tokens=2147483647, str input_layout="BSH", int num_key_value_heads=0, int sparse_mode=0, '
    "int inner_precise=0, int block_size=0, int antiquant_mode=0, int key_antiquant_mode=0, "
    "int value_antiquant_mode=0, bool softmax_lse_flag=False"
)

#: ``namespace::name[.overload]`` -> the schema it is defined with (the real one).
SCHEMAS: dict[str, str] = {
    "npu::npu_add_rms_norm": (
        "npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) "
        "-> (Tensor, Tensor, Tensor)"
    ),
    "npu::npu_fused_infer_attention_score": (
        f"npu_fused_infer_attention_score({_FIA_ARGUMENTS}) -> (Tensor, Tensor)"
    ),
    "npu::npu_fused_infer_attention_score.out": (
        f"npu_fused_infer_attention_score.out({_FIA_ARGUMENTS}, Tensor? workspace=None, "
        "Tensor(a!) attention_out, Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))"
    ),
    "npu::_npu_fused_infer_attention_score_get_max_workspace": (
        f"_npu_fused_infer_attention_score_get_max_workspace({_FIA_ARGUMENTS}) -> Tensor"
    ),
    "npu::npu_top_k_top_p": "npu_top_k_top_p(Tensor logits, Tensor? p=None, Tensor? k=None) -> Tensor",
    "npu::npu_dynamic_quant": (
        "npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, "
        'int? dst_type=None, str quant_mode="pertoken", float dst_type_max=0.0) -> (Tensor, Tensor)'
    ),
    "npu::npu_add_rms_norm_quant": (
        "npu_add_rms_norm_quant(Tensor x1, Tensor x2, Tensor gamma, Tensor scales1, Tensor? zero_points1, "
        "Tensor? beta=None, Tensor? scales2=None, Tensor? zero_points2=None, *, int axis=-1, "
        "float epsilon=1e-06, bool div_mode=True, int? dst_type=None) -> (Tensor, Tensor, Tensor)"
    ),
    "npu::npu_quantize": (
        "npu_quantize(Tensor self, Tensor scales, Tensor? zero_points, int dtype, int axis=1, "
        "bool div_mode=True) -> Tensor"
    ),
    "npu::npu_add_rms_norm_dynamic_quant": (
        "npu_add_rms_norm_dynamic_quant(Tensor x1, Tensor x2, Tensor gamma, *, Tensor? smooth_scale1=None, "
        "Tensor? smooth_scale2=None, Tensor? beta=None, float epsilon=1e-6, bool[2]? output_mask=None, "
        "int? y_dtype=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
    ),
    "atb::_npu_rotary_embedding": (
        "_npu_rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox_style) -> ()"
    ),
    "atb::_npu_reshape_and_cache": (
        "_npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_indices) -> ()"
    ),
    "atb::_npu_matmul_add_fp32": "_npu_matmul_add_fp32(Tensor x, Tensor weight, Tensor(a!) C) -> ()",
    "_C_ascend::npu_add_rms_norm_bias": (
        "npu_add_rms_norm_bias(Tensor x1, Tensor x2, Tensor gamma, Tensor? beta=None, float epsilon=1e-6) "
        "-> (Tensor y, Tensor rstd, Tensor x)"
    ),
    "_C_ascend::npu_apply_top_k_top_p": (
        "npu_apply_top_k_top_p(Tensor logits, Tensor? p=None, Tensor? k=None) -> Tensor"
    ),
    "_C_ascend::get_masked_input_and_mask": (
        "get_masked_input_and_mask(Tensor input, int org_vocab_start_index, int org_vocab_end_index, "
        "int num_org_vocab_padding, int added_vocab_start_index, int added_vocab_end_index) "
        "-> (Tensor masked_input, Tensor mask)"
    ),
    "_C_ascend::bgmv_shrink": (
        "bgmv_shrink(Tensor! x, Tensor! weight, Tensor! indices, Tensor! y, float scale) -> ()"
    ),
    "_C_ascend::bgmv_expand": (
        "bgmv_expand(Tensor! x, Tensor! weight, Tensor! indices, Tensor! y, "
        "int slice_offset, int slice_size) -> Tensor"
    ),
    "_C_ascend::sgmv_shrink": (
        "sgmv_shrink(Tensor! x, Tensor! weight, Tensor! lora_indices, Tensor! seq_len, Tensor! y, "
        "float scale) -> ()"
    ),
    "_C_ascend::sgmv_expand": (
        "sgmv_expand(Tensor! x, Tensor! weight, Tensor! lora_indices, Tensor! seq_len, Tensor! y, "
        "int slice_offset, int slice_size) -> Tensor"
    ),
}

SCHEMAS.update(_npu_kernels.SCHEMAS)  # transformers' and verl's kernels, and their backward kernels

#: The names of torch_npu's ``API_LIST`` (``op_plugin/atb/_atb_ops.py``) that are computed here.
ATB_NAMES = frozenset({"_npu_rotary_embedding", "_npu_reshape_and_cache", "_npu_matmul_add_fp32"})

#: ``torch_npu`` attribute -> the namespace of its operator.
_TORCH_NPU = {
    "npu_add_rms_norm": "npu",
    "npu_fused_infer_attention_score": "npu",
    "_npu_fused_infer_attention_score_get_max_workspace": "npu",
    "npu_top_k_top_p": "npu",
    "npu_dynamic_quant": "npu",
    "npu_add_rms_norm_quant": "npu",
    "npu_quantize": "npu",
    "npu_add_rms_norm_dynamic_quant": "npu",
    "_npu_rotary_embedding": "atb",
    "_npu_reshape_and_cache": "atb",
    "_npu_matmul_add_fp32": "atb",
    **{name: "npu" for name in _npu_kernels.KERNELS},
}


def _boundary(what: str) -> Exception:
    return needs_npu(what, "not computed by the simulation")


# --------------------------------------------------------------------------- add + RMS norm


def _rstd_shape(x1: torch.Tensor, gamma: torch.Tensor) -> list[Any]:
    """``x1``'s leading dims with the last ``gamma.dim()`` dims as 1 (all 1 if gamma has as many); the
    sizes as they are (a symbolic size under dynamo stays symbolic, not specialized)."""
    lead = x1.dim() - gamma.dim()
    if lead <= 0:
        return [1] * x1.dim()
    return [*x1.shape[:lead], *([1] * gamma.dim())]


def _add_rms_norm(
    x1: torch.Tensor,
    x2: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor | None,
    epsilon: float,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x1.shape != x2.shape:
        raise ValueError(f"{name}: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} differ in shape")
    if gamma.dim() > x1.dim() or tuple(x1.shape[x1.dim() - gamma.dim() :]) != tuple(gamma.shape):
        raise ValueError(
            f"{name}: gamma {tuple(gamma.shape)} is not the trailing shape of x1 {tuple(x1.shape)}"
        )
    if beta is not None and beta.shape != gamma.shape:
        raise ValueError(f"{name}: beta {tuple(beta.shape)} differs from gamma {tuple(gamma.shape)}")
    dtype = x1.dtype
    compute = torch.promote_types(dtype, torch.float32)
    if dtype == torch.float16:  # the kernel adds in fp16, then normalizes the rounded sum in fp32
        x = x1 + x2.to(dtype)
        xf = x.to(compute)
    else:  # bf16 (and fp32): the sum in fp32, rounded only for the output x
        xf = x1.to(compute) + x2.to(compute)
        x = xf.to(dtype)
    dims = tuple(range(x1.dim() - gamma.dim(), x1.dim()))
    rstd = (
        torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
        if dims
        else torch.rsqrt(xf.pow(2) + epsilon)
    )
    normed = (xf * rstd).to(dtype).to(compute)  # the normalized x is rounded before gamma is applied
    y = normed * gamma.to(compute)
    if beta is not None:
        y = y + beta.to(compute)
    return y.to(dtype), rstd.float().reshape(_rstd_shape(x1, gamma)), x


def npu_add_rms_norm(
    x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, rstd, x)``: ``x = x1 + x2``, ``y = rmsnorm(x) * gamma`` in x1's dtype, rstd float32."""
    return _add_rms_norm(x1, x2, gamma, None, epsilon, "npu_add_rms_norm")


def npu_add_rms_norm_bias(
    x1: torch.Tensor,
    x2: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor | None = None,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``npu_add_rms_norm`` with ``y + beta`` when ``beta`` is given."""
    return _add_rms_norm(x1, x2, gamma, beta, epsilon, "npu_add_rms_norm_bias")


def _add_rms_norm_fake(
    x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rstd = x1.new_empty(_rstd_shape(x1, gamma), dtype=torch.float32)
    return torch.empty_like(x1), rstd, torch.empty_like(x1)


# --------------------------------------------------------------------------- fused infer attention

#: Every keyword argument of the FIA schemas with its default.
_FIA_DEFAULTS: dict[str, Any] = {
    "pse_shift": None,
    "atten_mask": None,
    "actual_seq_lengths": None,
    "actual_seq_lengths_kv": None,
    "dequant_scale1": None,
    "quant_scale1": None,
    "dequant_scale2": None,
    "quant_scale2": None,
    "quant_offset2": None,
    "antiquant_scale": None,
    "antiquant_offset": None,
    "key_antiquant_scale": None,
    "key_antiquant_offset": None,
    "value_antiquant_scale": None,
    "value_antiquant_offset": None,
    "block_table": None,
    "query_padding_size": None,
    "kv_padding_size": None,
    "key_shared_prefix": None,
    "value_shared_prefix": None,
    "actual_shared_prefix_len": None,
    "query_rope": None,
    "key_rope": None,
    "key_rope_antiquant_scale": None,
    "num_heads": 1,
    "scale": 1.0,
    "pre_tokens": _MAX_TOKENS,
    "next_tokens": _MAX_TOKENS,
    "input_layout": "BSH",
    "num_key_value_heads": 0,
    "sparse_mode": 0,
    "inner_precise": 0,
    "block_size": 0,
    "antiquant_mode": 0,
    "key_antiquant_mode": 0,
    "value_antiquant_mode": 0,
    "softmax_lse_flag": False,
}

#: Arguments whose use (anything but None) is a compute boundary: quantization, prefix, padding,
#: position encodings and MLA.
_FIA_NOT_COMPUTED = (
    "pse_shift",
    "dequant_scale1",
    "quant_scale1",
    "dequant_scale2",
    "quant_scale2",
    "quant_offset2",
    "antiquant_scale",
    "antiquant_offset",
    "key_antiquant_scale",
    "key_antiquant_offset",
    "value_antiquant_scale",
    "value_antiquant_offset",
    "query_padding_size",
    "kv_padding_size",
    "key_shared_prefix",
    "value_shared_prefix",
    "actual_shared_prefix_len",
    "query_rope",
    "key_rope",
    "key_rope_antiquant_scale",
)

#: torch_npu's layouts (``get_query_and_attention_out_layout``): the query's layout and dims.
_FIA_LAYOUTS = {
    "BSH": ("BSH", "BSH", 3),
    "BSND": ("BSND", "BSND", 4),
    "BNSD": ("BNSD", "BNSD", 4),
    "TND": ("TND", "TND", 3),
    "NTD": ("NTD", "NTD", 3),
    "BNSD_BSND": ("BNSD", "BSND", 4),
    "BSH_BNSD": ("BSH", "BNSD", 3),
    "BSND_BNSD": ("BSND", "BNSD", 4),
    "NTD_TND": ("NTD", "TND", 3),
    "BSH_NBSD": ("BSH", "NBSD", 3),
    "BSND_NBSD": ("BSND", "NBSD", 4),
    "BNSD_NBSD": ("BNSD", "NBSD", 4),
    "TND_NTD": ("TND", "NTD", 3),
    "NSD": ("NSD", "NSD", 3),
}
_FIA_COMPUTED_LAYOUTS = ("TND", "BSH", "BSND", "BNSD")
_FIA = "torch_npu.npu_fused_infer_attention_score"


def _fia_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(kwargs) - set(_FIA_DEFAULTS))
    if unknown:
        raise TypeError(f"npu_fused_infer_attention_score: unexpected arguments {unknown}")
    return {**_FIA_DEFAULTS, **kwargs}


def _kv_heads(o: dict[str, Any]) -> int:
    return int(o["num_key_value_heads"]) or int(o["num_heads"])


def _fia_check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, o: dict[str, Any]) -> None:
    """Raise for what is not computed (the boundary) or not valid (ValueError), before computing."""
    for name in _FIA_NOT_COMPUTED:
        if o[name] is not None:
            raise _boundary(f"{_FIA}({name}=...)")
    if (
        query.dtype == torch.int8
        or key.dtype in (torch.int8, torch.int32)
        or value.dtype in (torch.int8, torch.int32)
    ):
        raise _boundary(f"{_FIA}(int8/int4 query, key or value)")
    layout = o["input_layout"]
    if layout not in _FIA_LAYOUTS:
        raise ValueError(f"npu_fused_infer_attention_score: input_layout {layout!r} is not supported")
    if layout not in _FIA_COMPUTED_LAYOUTS:
        raise _boundary(f"{_FIA}(input_layout={layout!r})")
    if query.dim() != _FIA_LAYOUTS[layout][2]:
        raise ValueError(
            f"npu_fused_infer_attention_score: layout {layout} takes a {_FIA_LAYOUTS[layout][2]}-dim query, "
            f"got {query.dim()} dims"
        )
    sparse_mode = int(o["sparse_mode"])
    if sparse_mode in (5, 6, 7, 8, 9):
        raise _boundary(f"{_FIA}(sparse_mode={sparse_mode})")
    if sparse_mode not in (0, 1, 2, 3, 4):
        raise ValueError(f"npu_fused_infer_attention_score: sparse_mode must be 0-4 or 9, got {sparse_mode}")
    if int(o["inner_precise"]) not in (0, 1, 2, 3):
        raise ValueError(
            f"npu_fused_infer_attention_score: inner_precise must be 0-3, got {o['inner_precise']}"
        )
    num_heads = int(o["num_heads"])
    if num_heads <= 0:
        raise ValueError(f"npu_fused_infer_attention_score: num_heads must be > 0, got {num_heads}")
    nkv = _kv_heads(o)
    if num_heads % nkv:
        raise ValueError(
            f"npu_fused_infer_attention_score: num_heads={num_heads} is no multiple of "
            f"num_key_value_heads={nkv}"
        )
    if o["block_table"] is not None:
        if layout != "TND":
            raise _boundary(f"{_FIA}(block_table=..., input_layout={layout!r})")
        if key.dim() == 5:
            raise _boundary(f"{_FIA}(key/value as the NZ [blocknum, KV_N, D/16, blockSize, 16] cache)")
        if key.dim() not in (3, 4):
            raise ValueError(
                f"npu_fused_infer_attention_score: with block_table, key/value are 3/4/5-dim, got {key.dim()}"
            )
    elif key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError("npu_fused_infer_attention_score: without block_table, key/value have query's dims")
    if layout != "TND" and (o["actual_seq_lengths"] is not None or o["actual_seq_lengths_kv"] is not None):
        raise _boundary(f"{_FIA}(actual_seq_lengths/actual_seq_lengths_kv with input_layout={layout!r})")
    if layout == "TND" and o["atten_mask"] is not None and sparse_mode in (0, 1):
        raise _boundary(f"{_FIA}(atten_mask with sparse_mode={sparse_mode}, input_layout='TND')")


def _ints(value: Any, name: str) -> list[int]:
    if value is None:
        raise ValueError(f"npu_fused_infer_attention_score: input_layout 'TND' needs {name}")
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    return [int(v) for v in value]


def _compressed(mask: torch.Tensor | None, sparse_mode: int) -> None:
    """Sparse modes 2-4 take the 2048x2048 ``triu(1)`` mask (or it with leading 1 dims)."""
    if mask is None:
        raise ValueError(
            f"npu_fused_infer_attention_score: sparse_mode={sparse_mode} needs the compressed "
            f"{_COMPRESSED_MASK}x{_COMPRESSED_MASK} atten_mask"
        )
    while mask.dim() > 2 and mask.shape[0] == 1:
        mask = mask[0]
    _check_compressed_mask(mask, sparse_mode)


def _causal_band(o: dict[str, Any], sq: int, skv: int, device: torch.device) -> torch.Tensor:
    """The mask (True = masked out) of sparse modes 2, 3 and 4 for one [sq, skv] block."""
    mode = int(o["sparse_mode"])
    if mode == 2:  # leftUpCausal
        return _band(sq, skv, _MAX_TOKENS, 0, 0, device)
    if mode == 3:  # rightDownCausal
        return _band(sq, skv, _MAX_TOKENS, 0, skv - sq, device)
    return _band(sq, skv, int(o["pre_tokens"]), int(o["next_tokens"]), skv - sq, device)  # band, bottom-right


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, N, Sq, D] queries on [B, Nkv, Skv, D] keys/values (query head h reads kv head h // (N/Nkv)):
    the output [B, N, Sq, Dv] in q's dtype and the float32 log-sum-exp [B, N, Sq]; fully masked rows
    give zeros (and -inf).  The attention of ``npu_fusion_attention``, whose row max and sum make the
    log-sum-exp."""
    out, row_max, row_sum = _attend(q, k, v, scale, None, mask)
    return out, row_max + torch.log(row_sum)


def _paged(
    cache: torch.Tensor, row: torch.Tensor, length: int, block_size: int, nkv: int, name: str
) -> torch.Tensor:
    """The first ``length`` tokens of one request in a paged cache, as [length, Nkv, D]."""
    blocks = -(-length // block_size)
    if blocks > row.numel():
        raise ValueError(
            f"npu_fused_infer_attention_score: a kv length of {length} needs {blocks} blocks of "
            f"{block_size}, block_table has {row.numel()} per request"
        )
    ids = row[:blocks].long().to(cache.device)
    if blocks and (int(ids.min()) < 0 or int(ids.max()) >= cache.shape[0]):
        raise ValueError(f"npu_fused_infer_attention_score: block_table names blocks outside {name}")
    picked = cache.index_select(0, ids)
    if cache.dim() == 3:  # [blocks, block_size, Nkv*D]
        tokens = picked.reshape(blocks * block_size, nkv, cache.shape[2] // nkv)
    else:  # [blocks, Nkv, block_size, D]
        tokens = picked.transpose(1, 2).reshape(blocks * block_size, nkv, cache.shape[3])
    return tokens[:length]


def _tnd(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, o: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    t, n, _ = query.shape
    if n != int(o["num_heads"]):
        raise ValueError(
            f"npu_fused_infer_attention_score: num_heads={o['num_heads']} but query has {n} heads"
        )
    nkv, mode = _kv_heads(o), int(o["sparse_mode"])
    if mode in (2, 3, 4):
        _compressed(o["atten_mask"], mode)
    q_ends = _ints(o["actual_seq_lengths"], "actual_seq_lengths")
    kv_lens = _ints(o["actual_seq_lengths_kv"], "actual_seq_lengths_kv")
    if len(kv_lens) != len(q_ends):
        raise ValueError(
            f"npu_fused_infer_attention_score: actual_seq_lengths has {len(q_ends)} requests, "
            f"actual_seq_lengths_kv {len(kv_lens)}"
        )
    if any(b < a for a, b in zip([0, *q_ends], q_ends, strict=False)) or (q_ends and q_ends[-1] > t):
        raise ValueError(
            f"npu_fused_infer_attention_score: actual_seq_lengths {q_ends} is no non-decreasing cumulative "
            f"length within the {t} query tokens"
        )
    table = o["block_table"]
    if table is None:  # current key/value [T_kv, Nkv, D]: cumulative lengths
        if key.shape[1] != nkv:
            raise ValueError(f"npu_fused_infer_attention_score: key has {key.shape[1]} heads, expected {nkv}")
        if any(b < a for a, b in zip([0, *kv_lens], kv_lens, strict=False)) or (
            kv_lens and kv_lens[-1] > key.shape[0]
        ):
            raise ValueError(
                f"npu_fused_infer_attention_score: actual_seq_lengths_kv {kv_lens} is no non-decreasing "
                f"cumulative length within the {key.shape[0]} key tokens"
            )
        kv_bounds = list(zip([0, *kv_lens[:-1]], kv_lens, strict=True))
    else:  # a paged cache: per-request lengths
        block_size = key.shape[1] if key.dim() == 3 else key.shape[2]
        if int(o["block_size"]) != block_size:
            raise ValueError(
                f"npu_fused_infer_attention_score: block_size={o['block_size']} but the cache has blocks of "
                f"{block_size}"
            )
        if key.dim() == 3 and (key.shape[2] % nkv or value.shape[2] % nkv):
            raise ValueError(f"npu_fused_infer_attention_score: the cache's H is no multiple of {nkv} heads")
        if key.dim() == 4 and key.shape[1] != nkv:
            raise ValueError(
                f"npu_fused_infer_attention_score: the cache has {key.shape[1]} heads, expected {nkv}"
            )
        if table.dim() != 2 or table.shape[0] < len(q_ends):
            raise ValueError(
                f"npu_fused_infer_attention_score: block_table must be [B, max_blocks] for {len(q_ends)} "
                f"requests, got {tuple(table.shape)}"
            )
    outs: list[torch.Tensor] = []
    lses: list[torch.Tensor] = []
    start = 0
    for b, end in enumerate(q_ends):
        sq = end - start
        if sq == 0:
            continue
        if table is None:
            k0, k1 = kv_bounds[b]
            k_b, v_b = key[k0:k1], value[k0:k1]
        else:
            k_b = _paged(key, table[b], kv_lens[b], block_size, nkv, "key")
            v_b = _paged(value, table[b], kv_lens[b], block_size, nkv, "value")
        skv = k_b.shape[0]
        mask = _causal_band(o, sq, skv, query.device) if mode in (2, 3, 4) else None
        out, lse = _attention(
            query[start:end].transpose(0, 1).unsqueeze(0),
            k_b.transpose(0, 1).unsqueeze(0),
            v_b.transpose(0, 1).unsqueeze(0),
            float(o["scale"]),
            mask,
        )
        outs.append(out[0].transpose(0, 1))  # [sq, N, Dv]
        lses.append(lse[0].transpose(0, 1))  # [sq, N]
        start = end
    dv = value.shape[-1] if table is None or value.dim() == 4 else value.shape[-1] // nkv
    if start < t:  # tokens after the last request take part in nothing
        outs.append(query.new_zeros(t - start, n, dv))
        lses.append(torch.full((t - start, n), -math.inf, device=query.device))
    if not outs:
        return query.new_zeros(0, n, dv), torch.zeros(0, n, 1, device=query.device)
    return torch.cat(outs).contiguous(), torch.cat(lses).unsqueeze(-1).contiguous()


def _dense(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, o: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    layout, n, nkv = o["input_layout"], int(o["num_heads"]), _kv_heads(o)
    q, k, v = (_to_bnsd(x, layout, heads, None) for x, heads in ((query, n), (key, nkv), (value, nkv)))
    if q.shape[1] != n or k.shape[1] != nkv:
        raise ValueError(
            f"npu_fused_infer_attention_score: query/key have {q.shape[1]}/{k.shape[1]} heads, "
            f"num_heads={n}, num_key_value_heads={nkv}"
        )
    b, sq, skv, mode, mask = q.shape[0], q.shape[2], k.shape[2], int(o["sparse_mode"]), o["atten_mask"]
    block: torch.Tensor | None = None
    if mode in (2, 3, 4):
        _compressed(mask, mode)
        if sq > 1:  # with a single query row (the incremental branch) the sparse mode does not apply
            block = _causal_band(o, sq, skv, query.device)
    elif mask is not None:
        full = mask.bool()
        if sq == 1 and full.numel() in (skv, b * skv):  # (B, KV_S) and its 4-dim forms
            block = full.reshape(-1, 1, 1, skv)
        elif full.shape[-2:] == (sq, skv) and full.dim() <= 4:
            block = full
        else:
            raise ValueError(
                f"npu_fused_infer_attention_score: atten_mask of shape {tuple(mask.shape)} does not fit "
                f"Q_S={sq}, KV_S={skv}"
            )
        pre, nxt = int(o["pre_tokens"]), int(o["next_tokens"])
        if mode == 0 and sq > 1 and (pre < _MAX_TOKENS or nxt < _MAX_TOKENS):
            # defaultMask: the band from the top left
            block = block | _band(sq, skv, pre, nxt, 0, query.device)
    elif mode == 1:
        raise ValueError("npu_fused_infer_attention_score: sparse_mode=1 needs the full atten_mask")
    out, lse = _attention(q, k, v, float(o["scale"]), block)
    return _from_bnsd(out, layout).contiguous(), lse.unsqueeze(-1).contiguous()


def _fia_compute(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, o: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    _fia_check(query, key, value, o)
    if o["input_layout"] == "TND":
        return _tnd(query, key, value, o)
    return _dense(query, key, value, o)


def npu_fused_infer_attention_score(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **options: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(attention_out, softmax_lse)`` of ``softmax(scale * query @ key^T + mask) @ value``."""
    o = _fia_options(options)
    out, lse = _fia_compute(query, key, value, o)
    if not o["softmax_lse_flag"]:
        lse = torch.empty([0], dtype=torch.float32, device=query.device)
    return out, lse


def npu_fused_infer_attention_score_out(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    attention_out: torch.Tensor,
    softmax_lse: torch.Tensor,
    workspace: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``.out`` overload: the same, written into ``attention_out`` (and ``softmax_lse`` with the
    flag; without it ``softmax_lse`` is left as it is).  ``workspace`` is not needed here."""
    o = _fia_options(options)
    out, lse = _fia_compute(query, key, value, o)
    pairs = [("attention_out", attention_out, out)]
    if o["softmax_lse_flag"]:
        pairs.append(("softmax_lse", softmax_lse, lse))
    for name, target, result in pairs:
        if target.numel() != result.numel():
            raise ValueError(
                f"npu_fused_infer_attention_score.out: {name} has shape {tuple(target.shape)}, "
                f"the result {tuple(result.shape)}"
            )
        target.copy_(result.reshape(target.shape))
    return attention_out, softmax_lse


def _npu_fused_infer_attention_score_get_max_workspace(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **options: Any
) -> torch.Tensor:
    """The workspace for ``.out``: the simulation needs none, so an empty tensor of query's dtype
    (after the same argument checks as the computation)."""
    _fia_check(query, key, value, _fia_options(options))
    return query.new_zeros([0])


def _fia_out_shapes(
    query: torch.Tensor, value: torch.Tensor, o: dict[str, Any]
) -> tuple[list[int], torch.dtype, list[int]]:
    """torch_npu's meta registration: the output's shape and dtype, and softmax_lse's shape."""
    num_heads = int(o["num_heads"])
    torch._check(num_heads > 0, lambda: f"numHeads should be greater than 0, but got {num_heads}")
    nkv = _kv_heads(o)
    layout = o["input_layout"]
    torch._check(layout in _FIA_LAYOUTS, lambda: f"Layout {layout} is not supported!")
    q_layout, out_layout, q_dims = _FIA_LAYOUTS[layout]
    torch._check(query.dim() == q_dims, lambda: f"Layout {q_layout}, queryDims must be {q_dims}!")
    if o["block_table"] is not None:
        torch._check(value.dim() in (3, 4, 5), lambda: f"value's dim should be 3/4/5, got {value.dim()}")
        if value.dim() == 3:
            vd = value.size(2) // nkv
        elif value.dim() == 4:
            vd = value.size(3)
        else:
            vd = value.size(2) * value.size(4)
    elif q_layout == "BSH":
        vd = value.size(2) // nkv
    elif q_layout in ("BNSD", "BSND"):
        vd = value.size(3)
    else:
        vd = value.size(2)
    if value.dtype == torch.int32:  # int4 packed in int32
        vd = vd * 8
    b = s1 = t = 0
    if q_layout == "TND":
        t, n1, d1 = query.size(0), query.size(1), query.size(2)
    elif q_layout == "NTD":
        t, n1, d1 = query.size(1), query.size(0), query.size(2)
    elif q_layout == "BSH":
        b, s1, n1, d1 = query.size(0), query.size(1), num_heads, query.size(2) // num_heads
    elif q_layout == "BSND":
        b, s1, n1, d1 = query.size(0), query.size(1), query.size(2), query.size(3)
    elif q_layout == "BNSD":
        b, s1, n1, d1 = query.size(0), query.size(2), query.size(1), query.size(3)
    else:  # NSD
        b, s1, n1, d1 = 1, query.size(1), query.size(0), query.size(2)
    out_d = d1 if vd == 0 or d1 == 0 else vd
    shapes = {
        "BSH": [b, s1, query.size(2) if n1 * vd == 0 or query.size(2) == 0 else n1 * vd],
        "BSND": [b, s1, n1, out_d],
        "BNSD": [b, n1, s1, out_d],
        "NBSD": [n1, b, s1, out_d],
        "TND": [t, n1, out_d],
        "NTD": [n1, t, out_d],
        "NSD": [n1, s1, out_d],
    }
    if o["quant_scale2"] is not None:
        dtype = torch.int8
    elif query.dtype == torch.int8:
        dtype = o["query_rope"].dtype if o["query_rope"] is not None else torch.float16
    else:
        dtype = query.dtype
    lse = [t, n1, 1] if layout in ("TND", "NTD", "TND_NTD", "NTD_TND") else [b, n1, s1, 1]
    return shapes[out_layout], dtype, lse


def _fia_fake(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **options: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    o = _fia_options(options)
    shape, dtype, lse = _fia_out_shapes(query, value, o)
    out = query.new_empty(shape, dtype=dtype)
    return out, query.new_empty(lse if o["softmax_lse_flag"] else [0], dtype=torch.float32)


def _fia_out_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    attention_out: torch.Tensor,
    softmax_lse: torch.Tensor,
    workspace: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    _fia_options(options)
    return attention_out, softmax_lse


def _workspace_fake(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **options: Any
) -> torch.Tensor:
    _fia_options(options)
    return query.new_empty([0])


# --------------------------------------------------------------------------- top-k / top-p


def _top_k_top_p(
    logits: torch.Tensor, p: torch.Tensor | None, k: torch.Tensor | None, name: str
) -> torch.Tensor:
    if p is None and k is None:
        raise ValueError(f"{name}: p and k cannot be None at the same time")
    if logits.dim() != 2:
        raise ValueError(f"{name}: logits must be 2-dim [batch, vocab], got {tuple(logits.shape)}")
    batch, vocab = logits.shape
    for arg, t in (("p", p), ("k", k)):
        if t is not None and tuple(t.shape) != (batch,):
            raise ValueError(f"{name}: {arg} must have shape ({batch},), got {tuple(t.shape)}")
    values, order = torch.sort(logits.float(), dim=-1, stable=True)  # ascending
    drop = torch.zeros_like(values, dtype=torch.bool)
    if k is not None:
        kk = k.to(device=logits.device, dtype=torch.long)
        if batch and (int(kk.min()) < 1 or int(kk.max()) > vocab):
            raise ValueError(f"{name}: k must lie in [1, {vocab}], got {kk.tolist()}")
        threshold = values.gather(-1, (vocab - kk).unsqueeze(-1))  # the k-th largest
        drop = values < threshold
        values = values.masked_fill(drop, -math.inf)
    if p is not None:
        cumulative = torch.cumsum(torch.softmax(values, dim=-1), dim=-1)
        top_p = cumulative <= (1 - p.to(device=logits.device, dtype=torch.float32)).unsqueeze(-1)
        top_p[:, -1] = False  # the largest always stays
        drop = drop | top_p
    dropped = torch.zeros_like(drop).scatter_(-1, order, drop)  # back to the vocabulary order
    return logits.masked_fill(dropped, -math.inf)


def npu_top_k_top_p(
    logits: torch.Tensor, p: torch.Tensor | None = None, k: torch.Tensor | None = None
) -> torch.Tensor:
    """``logits`` with everything outside the top-k and then the top-p set at -inf."""
    return _top_k_top_p(logits, p, k, "npu_top_k_top_p")


def npu_apply_top_k_top_p(
    logits: torch.Tensor, p: torch.Tensor | None = None, k: torch.Tensor | None = None
) -> torch.Tensor:
    """vllm-ascend's ``ApplyTopKTopPCustom``: the same as ``npu_top_k_top_p``."""
    return _top_k_top_p(logits, p, k, "npu_apply_top_k_top_p")


def _top_k_top_p_fake(
    logits: torch.Tensor, p: torch.Tensor | None = None, k: torch.Tensor | None = None
) -> torch.Tensor:
    return torch.empty_like(logits)


# --------------------------------------------------------------------------- the ATB kernels


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    """x [T, N, D] rotated by cos/sin [T, D/2] (float)."""
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    if neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)


def _npu_rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox_style: bool,
) -> None:
    """Rotates ``query`` and ``key`` ([T, N*head_size]) in place at ``positions``."""
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[-1] != head_size:
        raise _boundary(
            f"torch_npu._npu_rotary_embedding(cos_sin_cache of shape {tuple(cos_sin_cache.shape)}, "
            f"head_size={head_size}): the kernel rotates whole heads, cos||sin of width head_size"
        )
    if head_size % 2:
        raise ValueError(f"_npu_rotary_embedding: head_size {head_size} is odd")
    flat = positions.flatten().long().to(cos_sin_cache.device)
    tokens = flat.numel()
    compute = torch.promote_types(query.dtype, torch.float32)
    cos, sin = cos_sin_cache.index_select(0, flat).to(compute).chunk(2, dim=-1)
    for name, x in (("query", query), ("key", key)):
        if x.numel() % (tokens * head_size):
            raise ValueError(
                f"_npu_rotary_embedding: {name} of shape {tuple(x.shape)} is no [{tokens}, N*{head_size}]"
            )
        heads = x.reshape(tokens, -1, head_size).to(compute)
        x.copy_(_rotate(heads, cos.to(x.device), sin.to(x.device), is_neox_style).reshape(x.shape))


def _npu_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_indices: torch.Tensor,
) -> None:
    """``key_cache[slot // block_size, slot % block_size] = key[t]`` for every token t (and value) whose slot
    is not negative: ATB's kernel skips a token with a negative slot (``reshape_and_cache_nd.cpp``,
    ``if (slotValue < 0) continue;``), the padding vllm-ascend gives tokens past a batch's end
    (``PAD_ID``)."""
    slots = slot_indices.flatten().long()
    for name, src, cache in (("key", key, key_cache), ("value", value, value_cache)):
        if cache.dim() != 4:
            raise ValueError(f"_npu_reshape_and_cache: {name}_cache must be [num_blocks, block_size, N, D]")
        if src.dtype != cache.dtype:
            raise ValueError(f"_npu_reshape_and_cache: {name} is {src.dtype}, {name}_cache {cache.dtype}")
        if (
            src.dim() == 0
            or src.shape[0] != slots.numel()
            or src.numel() != slots.numel() * cache[0, 0].numel()
        ):
            raise ValueError(
                f"_npu_reshape_and_cache: {name} {tuple(src.shape)} does not fit {slots.numel()} slots of "
                f"{tuple(cache.shape[2:])}"
            )
        blocks, block_size = cache.shape[0], cache.shape[1]
        if slots.numel() and int(slots.max()) >= blocks * block_size:
            raise ValueError(
                f"_npu_reshape_and_cache: a slot lies beyond the {blocks * block_size} of {name}_cache"
            )
        kept = (slots >= 0).to(cache.device)
        idx = slots.to(cache.device)[kept]
        rows = src.reshape(-1, *cache.shape[2:]).to(cache.device)[kept]
        cache.index_put_((idx // block_size, idx % block_size), rows)


def _npu_matmul_add_fp32(x: torch.Tensor, weight: torch.Tensor, C: torch.Tensor) -> None:
    """``C += x^T @ weight`` in float32, in place."""
    if C.dtype != torch.float32:
        raise ValueError(f"_npu_matmul_add_fp32: C must be float32, got {C.dtype}")
    C.add_(torch.matmul(x.float().transpose(-1, -2), weight.float()))


def _mutating_fake(*args: Any, **kwargs: Any) -> None:
    return None


# ------------------------------------------------------------------ vocabulary-parallel embedding, LoRA


def get_masked_input_and_mask(
    input: torch.Tensor,
    org_vocab_start_index: int,
    org_vocab_end_index: int,
    num_org_vocab_padding: int,
    added_vocab_start_index: int,
    added_vocab_end_index: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vllm-ascend's kernel: vLLM's ``get_masked_input_and_mask`` (``vocab_parallel_embedding.py``).
    Token ids of this rank's base and added vocabulary become indices into its shard; ``mask`` is true
    where an id is neither (its embedding row is zeroed)."""
    if input.dim() < 1:
        raise RuntimeError("input must have at least 1 dimension")
    org = (input >= org_vocab_start_index) & (input < org_vocab_end_index)
    added = (input >= added_vocab_start_index) & (input < added_vocab_end_index)
    added_offset = (
        added_vocab_start_index - (org_vocab_end_index - org_vocab_start_index) - num_org_vocab_padding
    )
    valid_offset = org_vocab_start_index * org + added_offset * added
    vocab = org | added
    return vocab * (input - valid_offset), ~vocab


def _masked_input_fake(input: torch.Tensor, *args: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(input), torch.empty_like(input, dtype=torch.bool)


# ------------------------------------------------------------------ punica LoRA kernels
# vllm-ascend v0.23.0 (tag commit 5cb98caaad; the files are the same on releases/v0.23.0, the branch of
# 0.23.0.post1): the bindings in ``csrc/torch_binding.cpp``, the AscendC kernels in
# ``csrc/kernels/{b,s}gmv_{shrink,expand}.cpp``, the meta kernels in ``csrc/torch_binding_meta.cpp``.

_PUNICA = "torch.ops._C_ascend"
#: The only ranks the expand kernels reduce over (``SUPPORTED_RANKS``; ``Compute`` has a branch for each).
_EXPAND_RANKS = (8, 16, 32, 64)
#: The bytes the kernels' ``DataCopy`` moves at a time (a length that is no multiple of it is cut short).
_BLOCK_BYTES = 32


def _torch_check(ok: bool, message: str) -> None:
    """The binding's ``TORCH_CHECK``: a ``RuntimeError`` with its message."""
    if not ok:
        raise RuntimeError(message)


def _punica_checks(
    scalar_type: torch.dtype,
    x: torch.Tensor,
    weight: torch.Tensor,
    y: torch.Tensor,
    indices: torch.Tensor | None = None,
) -> None:
    """The ``TORCH_CHECK`` s the four bindings share, in their order (``indices``: the bgmv ones')."""
    _torch_check(scalar_type in (torch.float16, torch.bfloat16), "only support half and bf16")
    _torch_check(x.dim() == 2, "x should be [batch_size, hidden_in]")
    _torch_check(
        weight.dim() in (3, 4),
        "weight should be [num_loras, hidden_out, hidden_in] or [num_loras, 1, hidden_out, hidden_in]",
    )
    _torch_check(y.dim() == 2, "y should be [batch_size, hidden_out]")
    if indices is not None:
        _torch_check(indices.dim() == 1, "indices should be [batch_size]")
        _torch_check(
            x.size(0) == y.size(0) and x.size(0) == indices.size(0),
            "the first dimension of x, y, indices should be same",
        )


def _expand_checks(x: torch.Tensor, y: torch.Tensor, slice_offset: int, slice_size: int) -> None:
    _torch_check(x.size(1) <= slice_size, "hidden in should be smaller than hidden out")
    _torch_check(slice_offset >= 0, "slice offset should be no smaller than 0")
    _torch_check(
        slice_size + slice_offset <= y.size(1),
        "slice_size + slice_offset should be smaller than the second dimension of y",
    )


def _punica_memory(
    name: str,
    reads: dict[str, tuple[torch.Tensor, torch.dtype]],
    weight: torch.Tensor,
    out: int,
    inner: int,
) -> torch.Tensor:
    """The weight as the kernel reads it, ``[num_loras, out, inner]``.  The kernel takes each argument's
    ``data_ptr()`` as a dense row-major array of the element type it declares (``X_T``, ``W_T``, ``Y_T``,
    ``int64_t`` indices) and strides the weight by ``singleLoRAWeightLen_ = out * inner``; an argument of
    another dtype, a non-contiguous one, or a weight of another shape would have it read other bytes than
    the tensor's elements: not modelled."""
    for arg, (tensor, dtype) in reads.items():
        if tensor.dtype != dtype:
            raise _boundary(f"{_PUNICA}.{name}({arg} of {tensor.dtype}: the kernel reads it as {dtype})")
        if not tensor.is_contiguous():
            raise _boundary(f"{_PUNICA}.{name}(a non-contiguous {arg}: the kernel reads it as a dense array)")
    if tuple(weight.shape[-2:]) != (out, inner) or (weight.dim() == 4 and weight.size(1) != 1):
        raise _boundary(
            f"{_PUNICA}.{name}(weight of shape {tuple(weight.shape)}: the kernel strides it as "
            f"[num_loras, {out}, {inner}])"
        )
    return weight.reshape(weight.size(0), out, inner)


def _whole_blocks(name: str, what: str, count: int, element_size: int) -> None:
    """``DataCopy`` moves ``count * element_size / 32`` whole blocks: a row that is no whole number of
    them is cut short (vllm-ascend fixed it for the shrink output after v0.23.0 with ``DataCopyPad``)."""
    if count * element_size % _BLOCK_BYTES:
        raise _boundary(
            f"{_PUNICA}.{name}({what} of {count} x {element_size} bytes: the kernel's DataCopy moves whole "
            f"{_BLOCK_BYTES}-byte blocks)"
        )


def _shrink_weights(
    name: str, x: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, indices: dict[str, torch.Tensor]
) -> torch.Tensor:
    """``X_T = W_T = scalar_t``, ``Y_T = float``; the weight ``[num_loras, rank = y.size(1), hidden_in]``."""
    rank, hidden = y.size(1), x.size(1)
    reads = {"x": (x, x.dtype), "weight": (weight, x.dtype), "y": (y, torch.float32)}
    reads.update({arg: (tensor, torch.int64) for arg, tensor in indices.items()})
    weights = _punica_memory(name, reads, weight, rank, hidden)
    _whole_blocks(name, "x and weight rows", hidden, x.element_size())
    _whole_blocks(name, "the float32 rows of y", rank, 4)
    return weights


def _expand_weights(
    name: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    y: torch.Tensor,
    slice_size: int,
    indices: dict[str, torch.Tensor],
) -> torch.Tensor:
    """``X_T = float``, ``W_T = Y_T = scalar_t``; the weight ``[num_loras, slice_size, rank = x.size(1)]``."""
    rank = x.size(1)
    reads = {"x": (x, torch.float32), "weight": (weight, y.dtype), "y": (y, y.dtype)}
    reads.update({arg: (tensor, torch.int64) for arg, tensor in indices.items()})
    weights = _punica_memory(name, reads, weight, slice_size, rank)
    if rank not in _EXPAND_RANKS:
        raise _boundary(f"{_PUNICA}.{name}(rank {rank}: the kernel reduces ranks {_EXPAND_RANKS} only)")
    _whole_blocks(name, "the y slice", slice_size, y.element_size())
    return weights


def _sgmv_rows(name: str, lora_indices: torch.Tensor, seq_len: torch.Tensor, tokens: int) -> torch.Tensor:
    """Each token's adapter as the sgmv kernels' ``CopyInIndex`` finds it: token ``t`` belongs to the first
    sequence ``i`` with ``t < seq_len[0] + ... + seq_len[i]`` and takes ``lora_indices[i]``; a token past
    the last sequence gets -1."""
    sequences = seq_len.size(0)  # seqLenSize
    lora_indices.size(0)  # the binding reads it (loraIndicesSize): a 0-dim tensor fails there
    rows = torch.full((tokens,), -1, dtype=torch.int64, device=seq_len.device)
    if sequences == 0 or tokens == 0:
        return rows
    ends = torch.cumsum(seq_len.reshape(-1)[:sequences], 0)
    before_end = ends.unsqueeze(0) > torch.arange(tokens, device=seq_len.device).unsqueeze(1)
    found = before_end.any(1)
    if not bool(found.any()):
        return rows
    sequence = before_end.to(torch.int32).argmax(1)  # the first one
    if int(sequence[found].max()) >= lora_indices.numel():
        raise _boundary(f"{_PUNICA}.{name}(lora_indices shorter than seq_len: the kernel reads past it)")
    rows[found] = lora_indices.reshape(-1)[sequence[found]]
    return rows


def _adapters(
    name: str, rows: torch.Tensor, y: torch.Tensor, num_loras: int
) -> list[tuple[int, torch.Tensor]]:
    """``(adapter, its tokens)`` for each adapter some token uses; a token whose index is negative is skipped
    (``if (reqLoRAIndex_ < 0) continue;``): its row of ``y`` is not written."""
    kept = rows >= 0
    if not bool(kept.any()):
        return []
    used = torch.unique(rows[kept])
    if int(used.max()) >= num_loras:
        raise _boundary(
            f"{_PUNICA}.{name}(lora index {int(used.max())} of {num_loras}: the kernel reads past weight)"
        )
    tokens = kept.nonzero().flatten()
    if int(tokens.max()) >= y.size(0):
        raise _boundary(f"{_PUNICA}.{name}(x has more rows than y: the kernel writes past y)")
    return [(lora, (rows == lora).nonzero().flatten()) for lora in used.tolist()]


def _shrink(
    name: str, x: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor, y: torch.Tensor, scale: float
) -> None:
    """``y[t] = scale * (x[t] @ weights[lora(t)]^T)``, float32 products and sums (x and the weight cast with
    ``CAST_NONE``, ``Mul``, ``ReduceSum``, ``Muls``), written over ``y``'s row."""
    for lora, tokens in _adapters(name, rows, y, weights.size(0)):
        lora_a = weights[lora].to(torch.float32)
        y.index_copy_(
            0, tokens, torch.matmul(x.index_select(0, tokens).to(torch.float32), lora_a.t()) * scale
        )


def _expand(
    name: str,
    x: torch.Tensor,
    weights: torch.Tensor,
    rows: torch.Tensor,
    y: torch.Tensor,
    slice_offset: int,
    slice_size: int,
) -> torch.Tensor:
    """``y[t, slice] = rint(y[t, slice] + x[t] @ weights[lora(t)]^T)``: float32 products and sums, added to
    ``y``'s slice cast to float32, the sum cast back with ``CAST_RINT`` (round half to even) -- always added,
    whatever ``add_inputs`` the Python wrapper was given.  Returns ``y`` itself (``at::Tensor y_out = y``)."""
    window = y.narrow(1, slice_offset, slice_size)
    for lora, tokens in _adapters(name, rows, y, weights.size(0)):
        lora_b = weights[lora].to(torch.float32)
        delta = torch.matmul(x.index_select(0, tokens), lora_b.t())
        window.index_copy_(0, tokens, (window.index_select(0, tokens).to(torch.float32) + delta).to(y.dtype))
    return y


def bgmv_shrink(
    x: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor, y: torch.Tensor, scale: float
) -> None:
    """LoRA A for decode: ``y[t] = scale * x[t] @ weight[indices[t]]^T`` (``x`` fp16/bf16 ``[T, hidden_in]``,
    ``weight`` ``[num_loras, (1,) rank, hidden_in]`` of ``x``'s dtype, ``y`` float32 ``[T, rank]``), over
    ``y``'s rows; a token with a negative index keeps its row."""
    _punica_checks(x.dtype, x, weight, y, indices)
    _torch_check(x.size(1) > y.size(1), "hidden in should be greater than hidden out")
    weights = _shrink_weights("bgmv_shrink", x, weight, y, {"indices": indices})
    _shrink("bgmv_shrink", x, weights, indices, y, scale)


def bgmv_expand(
    x: torch.Tensor,
    weight: torch.Tensor,
    indices: torch.Tensor,
    y: torch.Tensor,
    slice_offset: int,
    slice_size: int,
) -> torch.Tensor:
    """LoRA B for decode: ``y[t, slice_offset:slice_offset+slice_size] += x[t] @ weight[indices[t]]^T`` (``x``
    float32 ``[T, rank]``, ``weight`` ``[num_loras, (1,) slice_size, rank]`` of ``y``'s dtype, ``y`` fp16/bf16
    ``[T, hidden_out]``); a token with a negative index keeps its row.  Returns ``y``."""
    _punica_checks(y.dtype, x, weight, y, indices)
    _expand_checks(x, y, slice_offset, slice_size)
    weights = _expand_weights("bgmv_expand", x, weight, y, slice_size, {"indices": indices})
    return _expand("bgmv_expand", x, weights, indices, y, slice_offset, slice_size)


def sgmv_shrink(
    x: torch.Tensor,
    weight: torch.Tensor,
    lora_indices: torch.Tensor,
    seq_len: torch.Tensor,
    y: torch.Tensor,
    scale: float,
) -> None:
    """``bgmv_shrink`` for prefill: the tokens of sequence ``i`` (``seq_len[i]`` of them, in order) take
    adapter ``lora_indices[i]``; tokens past the sequences keep their rows."""
    _punica_checks(x.dtype, x, weight, y)
    _torch_check(x.size(1) > y.size(1), "hidden in should be greater than hidden out")
    indices = {"lora_indices": lora_indices, "seq_len": seq_len}
    weights = _shrink_weights("sgmv_shrink", x, weight, y, indices)
    _shrink("sgmv_shrink", x, weights, _sgmv_rows("sgmv_shrink", lora_indices, seq_len, x.size(0)), y, scale)


def sgmv_expand(
    x: torch.Tensor,
    weight: torch.Tensor,
    lora_indices: torch.Tensor,
    seq_len: torch.Tensor,
    y: torch.Tensor,
    slice_offset: int,
    slice_size: int,
) -> torch.Tensor:
    """``bgmv_expand`` for prefill, the tokens' adapters as in ``sgmv_shrink``.  Returns ``y``."""
    _punica_checks(y.dtype, x, weight, y)
    _expand_checks(x, y, slice_offset, slice_size)
    indices = {"lora_indices": lora_indices, "seq_len": seq_len}
    weights = _expand_weights("sgmv_expand", x, weight, y, slice_size, indices)
    rows = _sgmv_rows("sgmv_expand", lora_indices, seq_len, x.size(0))
    return _expand("sgmv_expand", x, weights, rows, y, slice_offset, slice_size)


def _lora_expand_fake(x: torch.Tensor, weight: torch.Tensor, *args: Any) -> torch.Tensor:
    """``torch_binding_meta.cpp``'s ``bgmv_expand_meta``/``sgmv_expand_meta``: ``at::empty_like(y)`` (the
    real kernel returns ``y`` itself)."""
    y = args[-3]
    return torch.empty_like(y)


# --------------------------------------------------------------------------- int8 quantization
# vllm-ascend's norm-quant fusion pass (``compilation/passes/norm_quant_fusion_pass.py``) registers patterns
# with these whenever a model compiles in bfloat16 or float16; Inductor's pattern matcher traces each
# pattern by running it on small example tensors, so the kernels run even for a model that is not
# quantized.  Computed as torch_npu 2.13.0's ``_op_plugin_docs.py`` gives them, int8 outputs only
# (``round`` is round-half-to-even, the device's rint; results saturate at the int8 range).

_INT8_MAX = 127.0


def _int8_only(name: str, dtype: int | None) -> None:
    """torch_npu defaults to int8 (dtype enum 1); int4, fp8 and hifloat8 outputs are not modelled."""
    if dtype not in (None, 1):
        raise _boundary(f"torch_npu.{name}(dtype enum {dtype}: only int8 outputs are modelled)")


def _saturate(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x).clamp(-128, 127).to(torch.int8)


def _per_token(x: torch.Tensor, smooth: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``scale = rowMax(|x * smooth|) / 127``, ``y = round(x * smooth / scale)``."""
    xf = x.float() * (smooth.float() if smooth is not None else 1.0)
    scale = xf.abs().amax(dim=-1) / _INT8_MAX
    return _saturate(xf / scale.unsqueeze(-1)), scale


def npu_dynamic_quant(
    input: torch.Tensor,
    *,
    smooth_scales: torch.Tensor | None = None,
    group_index: torch.Tensor | None = None,
    dst_type: int | None = None,
    quant_mode: str = "pertoken",
    dst_type_max: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y int8, scale float32)``: per-token symmetric dynamic quantization."""
    _int8_only("npu_dynamic_quant", dst_type)
    if group_index is not None or quant_mode != "pertoken":
        raise _boundary(f"torch_npu.npu_dynamic_quant(group_index=..., quant_mode={quant_mode!r})")
    return _per_token(input, smooth_scales)


def _dynamic_quant_outputs(
    output_mask: list[bool] | None, smooth_scale1: torch.Tensor | None, smooth_scale2: torch.Tensor | None
) -> tuple[bool, bool]:
    """Which of y1, y2 ``npu_add_rms_norm_dynamic_quant`` outputs (torch_npu's meta): ``output_mask``, or
    without one y1, and y2 when both smooth scales are given."""
    if output_mask is None:
        return True, smooth_scale1 is not None and smooth_scale2 is not None
    return output_mask[0], output_mask[1]


def npu_add_rms_norm_dynamic_quant(
    x1: torch.Tensor,
    x2: torch.Tensor,
    gamma: torch.Tensor,
    *,
    smooth_scale1: torch.Tensor | None = None,
    smooth_scale2: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    epsilon: float = 1e-6,
    output_mask: list[bool] | None = None,
    y_dtype: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """``(y1, y2, x, scale1, scale2)``: add + RMS norm (+ beta), then up to two per-token quantizations
    of the normalized output (an output not asked for is empty, as torch_npu's meta has it)."""
    _int8_only("npu_add_rms_norm_dynamic_quant", y_dtype)
    y, _, x = _add_rms_norm(x1, x2, gamma, beta, epsilon, "npu_add_rms_norm_dynamic_quant")
    out1, out2 = _dynamic_quant_outputs(output_mask, smooth_scale1, smooth_scale2)
    empty_y, empty_scale = x1.new_empty([0], dtype=torch.int8), x1.new_empty([0], dtype=torch.float32)
    y1, scale1 = _per_token(y, smooth_scale1) if out1 else (empty_y, empty_scale)
    y2, scale2 = _per_token(y, smooth_scale2) if out2 else (empty_y.clone(), empty_scale.clone())
    return y1, y2, x, scale1, scale2


def npu_add_rms_norm_quant(
    x1: torch.Tensor,
    x2: torch.Tensor,
    gamma: torch.Tensor,
    scales1: torch.Tensor,
    zero_points1: torch.Tensor | None,
    beta: torch.Tensor | None = None,
    scales2: torch.Tensor | None = None,
    zero_points2: torch.Tensor | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-06,
    div_mode: bool = True,
    dst_type: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y1, y2, x)``: add + RMS norm (+ beta), then static quantization of the normalized output,
    ``round(y / scales + zero_points)`` (``div_mode``) or ``round(y * scales + zero_points)``; y2 is
    zeros without ``scales2`` (torch_npu: "no meaning" then)."""
    _int8_only("npu_add_rms_norm_quant", dst_type)
    if axis != -1:
        raise ValueError(f"npu_add_rms_norm_quant: axis should be -1, but got {axis}")
    y, _, x = _add_rms_norm(x1, x2, gamma, beta, epsilon, "npu_add_rms_norm_quant")

    def quantize(scales: torch.Tensor, zero_points: torch.Tensor | None) -> torch.Tensor:
        scaled = y.float() / scales.float() if div_mode else y.float() * scales.float()
        return _saturate(scaled + (zero_points.float() if zero_points is not None else 0.0))

    y1 = quantize(scales1, zero_points1)
    y2 = quantize(scales2, zero_points2) if scales2 is not None else torch.zeros_like(y1)
    return y1, y2, x


#: ``npu_quantize``'s ``dtype`` (ScalarType enum values, as torch_npu's metas map them) -> the integer
#: output (dtype, lowest, highest): qint8/int8, quint8/uint8, qint32/int32.
_QUANTIZE_DTYPES = {
    12: (torch.int8, -128, 127),
    1: (torch.int8, -128, 127),
    13: (torch.uint8, 0, 255),
    0: (torch.uint8, 0, 255),
    14: (torch.int32, -(2**31), 2**31 - 1),
    3: (torch.int32, -(2**31), 2**31 - 1),
}


def _quantize_dtype(dtype: int) -> tuple[torch.dtype, int, int]:
    if dtype not in _QUANTIZE_DTYPES:
        raise _boundary(
            f"torch_npu.npu_quantize(dtype enum {dtype}: int4, fp8 and hifloat8 are not modelled)"
        )
    return _QUANTIZE_DTYPES[dtype]


def npu_quantize(
    self: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    dtype: int,
    axis: int = 1,
    div_mode: bool = True,
) -> torch.Tensor:
    """``round(self / scales + zero_points)`` (``div_mode``) or ``round(self * scales + zero_points)``,
    saturated to ``dtype``; a 1-D ``scales``/``zero_points`` runs along ``axis`` (with ``div_mode`` False, the
    second-to-last axis for -2 and the last for any other)."""
    out, low, high = _quantize_dtype(dtype)
    if div_mode:
        ax = axis % self.dim()
    else:
        ax = self.dim() - 2 if axis == -2 else self.dim() - 1

    def along(t: torch.Tensor) -> torch.Tensor:
        if t.dim() != 1 or self.dim() == 1:
            return t.float()
        shape = [1] * self.dim()
        shape[ax] = t.shape[0]
        return t.float().reshape(shape)

    x = self.float()
    scaled = x / along(scales) if div_mode else x * along(scales)
    if zero_points is not None:
        scaled = scaled + along(zero_points)
    return torch.round(scaled).clamp(low, high).to(out)


def _quantize_fake(self: torch.Tensor, scales: torch.Tensor, zero_points: Any, dtype: int, *args: Any) -> Any:
    """torch_npu 2.13.0 ``npu_quantize`` meta: the input's shape in the integer dtype."""
    return torch.empty_like(self, dtype=_quantize_dtype(dtype)[0])


def _dynamic_quant_fake(
    input: torch.Tensor,
    *,
    smooth_scales: torch.Tensor | None = None,
    group_index: torch.Tensor | None = None,
    dst_type: int | None = None,
    quant_mode: str = "pertoken",
    dst_type_max: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch_npu 2.13.0 ``npu_dynamic_quant`` meta: int8 like ``input``; one float32 scale per token (per
    channel: per last-dim element; per tensor: one)."""
    _int8_only("npu_dynamic_quant", dst_type)
    shape = [*input.shape[:-2], input.shape[-1] if quant_mode == "perchannel" else input.shape[-2]]
    if quant_mode == "pertensor":
        shape = [1]
    return torch.empty_like(input, dtype=torch.int8), input.new_empty(shape, dtype=torch.float32)


def _add_rms_norm_quant_fake(x1: torch.Tensor, *args: Any, dst_type: int | None = None, **kwargs: Any) -> Any:
    """torch_npu 2.13.0 ``npu_add_rms_norm_quant`` meta: y1, y2 int8 like ``x1``, and the sum ``x``."""
    _int8_only("npu_add_rms_norm_quant", dst_type)
    return (
        torch.empty_like(x1, dtype=torch.int8),
        torch.empty_like(x1, dtype=torch.int8),
        torch.empty_like(x1),
    )


def _add_rms_norm_dynamic_quant_fake(
    x1: torch.Tensor,
    x2: torch.Tensor,
    gamma: torch.Tensor,
    *,
    smooth_scale1: torch.Tensor | None = None,
    smooth_scale2: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    epsilon: float = 1e-6,
    output_mask: list[bool] | None = None,
    y_dtype: int | None = None,
) -> tuple[torch.Tensor, ...]:
    """torch_npu 2.13.0 ``npu_add_rms_norm_dynamic_quant`` meta: y1, y2 (int8, or empty where not output),
    the sum ``x``, and a float32 scale per token for each output y."""
    _int8_only("npu_add_rms_norm_dynamic_quant", y_dtype)
    out1, out2 = _dynamic_quant_outputs(output_mask, smooth_scale1, smooth_scale2)
    leading = list(x1.shape[:-1])
    return (
        x1.new_empty(list(x1.shape) if out1 else [0], dtype=torch.int8),
        x1.new_empty(list(x1.shape) if out2 else [0], dtype=torch.int8),
        torch.empty_like(x1),
        x1.new_empty(leading if out1 else [0], dtype=torch.float32),
        x1.new_empty(leading if out2 else [0], dtype=torch.float32),
    )


# --------------------------------------------------------------------------- registration

#: ``namespace::name[.overload]`` -> (the plain-torch kernel, the fake implementation).
OPERATORS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "npu::npu_add_rms_norm": (npu_add_rms_norm, _add_rms_norm_fake),
    "npu::npu_fused_infer_attention_score": (npu_fused_infer_attention_score, _fia_fake),
    "npu::npu_fused_infer_attention_score.out": (npu_fused_infer_attention_score_out, _fia_out_fake),
    "npu::_npu_fused_infer_attention_score_get_max_workspace": (
        _npu_fused_infer_attention_score_get_max_workspace,
        _workspace_fake,
    ),
    "npu::npu_top_k_top_p": (npu_top_k_top_p, _top_k_top_p_fake),
    "npu::npu_dynamic_quant": (npu_dynamic_quant, _dynamic_quant_fake),
    "npu::npu_add_rms_norm_quant": (npu_add_rms_norm_quant, _add_rms_norm_quant_fake),
    "npu::npu_quantize": (npu_quantize, _quantize_fake),
    "npu::npu_add_rms_norm_dynamic_quant": (npu_add_rms_norm_dynamic_quant, _add_rms_norm_dynamic_quant_fake),
    "atb::_npu_rotary_embedding": (_npu_rotary_embedding, _mutating_fake),
    "atb::_npu_reshape_and_cache": (_npu_reshape_and_cache, _mutating_fake),
    "atb::_npu_matmul_add_fp32": (_npu_matmul_add_fp32, _mutating_fake),
    "_C_ascend::npu_add_rms_norm_bias": (npu_add_rms_norm_bias, _add_rms_norm_fake),
    "_C_ascend::npu_apply_top_k_top_p": (npu_apply_top_k_top_p, _top_k_top_p_fake),
    "_C_ascend::get_masked_input_and_mask": (get_masked_input_and_mask, _masked_input_fake),
    "_C_ascend::bgmv_shrink": (bgmv_shrink, _mutating_fake),
    "_C_ascend::bgmv_expand": (bgmv_expand, _lora_expand_fake),
    "_C_ascend::sgmv_shrink": (sgmv_shrink, _mutating_fake),
    "_C_ascend::sgmv_expand": (sgmv_expand, _lora_expand_fake),
    **_npu_kernels.OPERATORS,
}

_LOCK = threading.Lock()
#: The libraries holding the registrations (a registration lives as long as its library); kept
#: across a reload of this module, whose new copy then finds the operators defined.
_LIBRARIES: list[Any] = globals().get("_LIBRARIES", [])
_REGISTERED = False


def _defined(qualname: str) -> bool:
    name, _, overload = qualname.partition(".")
    try:
        torch._C._dispatch_find_schema_or_throw(name, overload)
    except RuntimeError:
        return False
    return True


def _kernel(qualname: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    """The kernel registered for ``qualname``: those of transformers' and verl's kernels count their calls
    (``torch.npu.call_count("torch_npu.<name>")``), inside the kernel, where dynamo does not trace."""
    name = qualname.partition("::")[2]
    if name not in _npu_kernels.KERNELS:
        return kernel
    from ._torch_sim import counted

    return counted(f"torch_npu.{name}", kernel, _npu_kernels.VARIANTS.get(name))


def register() -> None:
    """Define every operator of :data:`SCHEMAS` with its kernel (``CPU``, ``PrivateUse1``), fake
    implementation and, for the kernels of :mod:`._npu_kernels`, autograd formula.  Idempotent; an
    operator this process already has is left as it is."""
    global _REGISTERED
    if _REGISTERED:
        return
    with _LOCK:
        if _REGISTERED:
            return
        libraries: dict[str, Any] = {}
        for qualname, schema in SCHEMAS.items():
            if _defined(qualname):
                continue
            namespace, _, name = qualname.partition("::")
            if namespace not in libraries:
                libraries[namespace] = torch.library.Library(namespace, "FRAGMENT")
            library = libraries[namespace]
            library.define(schema)
            kernel, fake = OPERATORS[qualname]
            for dispatch_key in ("CPU", "PrivateUse1"):
                library.impl(name, _kernel(qualname, kernel), dispatch_key)
            torch.library.register_fake(qualname, fake, lib=library)
            if qualname in _npu_kernels.AUTOGRAD:
                setup_context, backward = _npu_kernels.AUTOGRAD[qualname]
                torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=library)
        _LIBRARIES.extend(libraries.values())
        _REGISTERED = True


#: The ``torch_npu`` attributes that are these operators.
TORCH_NPU_NAMES = frozenset(_TORCH_NPU)


def torch_npu_names() -> dict[str, object]:
    """``torch_npu`` attribute name -> its operator packet (``torch.ops.<namespace>.<name>``)."""
    register()
    names = {name: getattr(getattr(torch.ops, namespace), name) for name, namespace in _TORCH_NPU.items()}
    for packet in names.values():
        if "out" in packet.overloads() and type(packet.out) is torch._ops.OpOverload:
            packet.out.__class__ = _OutListOverload  # the same object: the dispatcher's, fake kernels' alike
    return names


class _OutListOverload(torch._ops.OpOverload):  # type: ignore[misc]
    """An ``.out`` overload that also takes its out arguments as one ``out=[...]`` list, in order, as
    torch_npu's Python binding does (``npu_fused_infer_attention_score.out(..., out=[output, lse])`` in
    torch_npu's own ``test_aclgraph_update.py`` and in vllm-ascend)."""

    def __call__(self, /, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        if out is not None:
            names = [a.name for a in self._schema.arguments if a.is_out]
            outs = [out] if isinstance(out, torch.Tensor) else list(out)
            if len(outs) != len(names):
                raise TypeError(f"{self}: out= takes {len(names)} tensors, got {len(outs)}")
            kwargs.update(zip(names, outs, strict=True))
        return super().__call__(*args, **kwargs)


def has_atb(api_name: str) -> bool:
    """Whether ``torch.ops.atb.<api_name>`` is one of the ATB operators computed here."""
    return api_name in ATB_NAMES
