"""The vllm-ascend kernels registered as ``torch.library`` operators, against references written here.

``npu_compat.testing._npu_ops`` defines them in the real namespaces (``npu``, ``atb``, ``_C_ascend``)
with the real schemas.  Each one is checked on CPU tensors against a plain-torch reference computed
independently in this file (attention as an explicit softmax over the keys gathered per request,
rotary embedding through complex numbers, the caches through a Python loop), and under
``FakeTensorMode``, ``torch.library.opcheck`` and ``torch.compile``.  The punica LoRA kernels are called as
vllm-ascend's released ``lora_ops.py`` calls them and checked against vLLM's plain-torch
``vllm.lora.ops.torch_ops``, and once on ``npu`` tensors of a simulated Ascend through the released
``PunicaWrapperNPU`` against vLLM's ``PunicaWrapperCPU``.
"""

from __future__ import annotations

import importlib.util
import json
import math
from typing import Any

import pytest

pytestmark = pytest.mark.same_on_every_stack
torch = pytest.importorskip("torch", reason="needs torch (installed by the upstream stack sessions)")
F = torch.nn.functional

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from npu_compat.testing import _npu_ops, _sites, _vllm_ascend_release  # noqa: E402
from npu_compat.testing._boundary import SimulatedComputeBoundary  # noqa: E402
from tests.conftest import run_py  # noqa: E402
from tests.sim.npu_backend import needs_backend, sim_env  # noqa: E402

_npu_ops.register()
npu, atb, c_ascend = torch.ops.npu, torch.ops.atb, torch.ops._C_ascend

#: vllm-ascend's ``get_splitfuse_attn_mask``: the compressed causal mask, int8.
MASK = torch.triu(torch.ones(2048, 2048), diagonal=1).to(torch.int8)
MAX = 2147483647

#: The schemas as the released packages spell them (torch_npu 2.13.0's yaml and libop_plugin_atb.so,
#: vllm-ascend 0.23.0.post1 csrc/torch_binding.cpp, vllm-ascend 0.18.0's vllm_ascend_C.so).
FIA_ARGS = 'Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout="BSH", int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, bool softmax_lse_flag=False'
REAL_SCHEMAS = {
    (
        "npu",
        "npu_add_rms_norm",
        "default",
    ): "npu::npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)",
    (
        "npu",
        "npu_fused_infer_attention_score",
        "default",
    ): f"npu::npu_fused_infer_attention_score({FIA_ARGS}) -> (Tensor, Tensor)",
    (
        "npu",
        "npu_fused_infer_attention_score",
        "out",
    ): f"npu::npu_fused_infer_attention_score.out({FIA_ARGS}, Tensor? workspace=None, Tensor(a!) attention_out, Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))",
    (
        "npu",
        "_npu_fused_infer_attention_score_get_max_workspace",
        "default",
    ): f"npu::_npu_fused_infer_attention_score_get_max_workspace({FIA_ARGS}) -> Tensor",
    (
        "npu",
        "npu_top_k_top_p",
        "default",
    ): "npu::npu_top_k_top_p(Tensor logits, Tensor? p=None, Tensor? k=None) -> Tensor",
    (
        "npu",
        "npu_dynamic_quant",
        "default",
    ): 'npu::npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, int? dst_type=None, str quant_mode="pertoken", float dst_type_max=0.0) -> (Tensor, Tensor)',
    (
        "npu",
        "npu_add_rms_norm_quant",
        "default",
    ): "npu::npu_add_rms_norm_quant(Tensor x1, Tensor x2, Tensor gamma, Tensor scales1, Tensor? zero_points1, Tensor? beta=None, Tensor? scales2=None, Tensor? zero_points2=None, *, int axis=-1, float epsilon=1e-06, bool div_mode=True, int? dst_type=None) -> (Tensor, Tensor, Tensor)",
    (
        "npu",
        "npu_quantize",
        "default",
    ): "npu::npu_quantize(Tensor self, Tensor scales, Tensor? zero_points, int dtype, int axis=1, bool div_mode=True) -> Tensor",
    (
        "npu",
        "npu_add_rms_norm_dynamic_quant",
        "default",
    ): "npu::npu_add_rms_norm_dynamic_quant(Tensor x1, Tensor x2, Tensor gamma, *, Tensor? smooth_scale1=None, Tensor? smooth_scale2=None, Tensor? beta=None, float epsilon=1e-6, bool[2]? output_mask=None, int? y_dtype=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    (
        "atb",
        "_npu_rotary_embedding",
        "default",
    ): "atb::_npu_rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, Tensor cos_sin_cache, bool is_neox_style) -> ()",
    (
        "atb",
        "_npu_reshape_and_cache",
        "default",
    ): "atb::_npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_indices) -> ()",
    (
        "atb",
        "_npu_matmul_add_fp32",
        "default",
    ): "atb::_npu_matmul_add_fp32(Tensor x, Tensor weight, Tensor(a!) C) -> ()",
    (
        "_C_ascend",
        "npu_add_rms_norm_bias",
        "default",
    ): "_C_ascend::npu_add_rms_norm_bias(Tensor x1, Tensor x2, Tensor gamma, Tensor? beta=None, float epsilon=1e-6)-> (Tensor y ,Tensor rstd, Tensor x)",
    (
        "_C_ascend",
        "npu_apply_top_k_top_p",
        "default",
    ): "_C_ascend::npu_apply_top_k_top_p(Tensor logits, Tensor? p=None, Tensor? k=None) -> Tensor",
    # vllm-ascend v0.23.0 csrc/torch_binding.cpp, the punica LoRA kernels
    (
        "_C_ascend",
        "bgmv_shrink",
        "default",
    ): "_C_ascend::bgmv_shrink(Tensor! x, Tensor! weight, Tensor! indices, Tensor! y, float scale) -> ()",
    (
        "_C_ascend",
        "bgmv_expand",
        "default",
    ): "_C_ascend::bgmv_expand(Tensor! x, Tensor! weight, Tensor! indices, Tensor! y,            int slice_offset, int slice_size) -> Tensor",
    (
        "_C_ascend",
        "sgmv_shrink",
        "default",
    ): "_C_ascend::sgmv_shrink(Tensor! x, Tensor! weight, Tensor! lora_indices, Tensor! seq_len, Tensor! y, float scale) -> ()",
    (
        "_C_ascend",
        "sgmv_expand",
        "default",
    ): "_C_ascend::sgmv_expand(Tensor! x, Tensor! weight, Tensor! lora_indices, Tensor! seq_len, Tensor! y,            int slice_offset, int slice_size) -> Tensor",
    # torch_npu's kernels of transformers and verl, and the backward kernels of their autograd formulas
    (
        "npu",
        "npu_rms_norm",
        "default",
    ): "npu::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    (
        "npu",
        "npu_rms_norm_backward",
        "default",
    ): "npu::npu_rms_norm_backward(Tensor dy, Tensor self, Tensor gamma, Tensor rstd) -> (Tensor, Tensor)",
    (
        "npu",
        "npu_rotary_mul",
        "default",
    ): "npu::npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor",
    (
        "npu",
        "npu_rotary_mul_backward",
        "default",
    ): "npu::npu_rotary_mul_backward(Tensor grad, Tensor self, Tensor r1, Tensor r2, str rotary_mode='half') -> (Tensor, Tensor, Tensor)",
    ("npu", "npu_swiglu", "default"): "npu::npu_swiglu(Tensor self, int dim=-1) -> Tensor",
    (
        "npu",
        "npu_swiglu_backward",
        "default",
    ): "npu::npu_swiglu_backward(Tensor grad_output, Tensor self, int dim=-1) -> Tensor",
    (
        "npu",
        "npu_cross_entropy_loss",
        "default",
    ): "npu::npu_cross_entropy_loss(Tensor input, Tensor target, Tensor? weight=None, str reduction='mean', int ignore_index=-100, float label_smoothing=0.0, float lse_square_scale_for_zloss=0.0, bool return_zloss=False) -> (Tensor, Tensor, Tensor, Tensor)",
    (
        "npu",
        "npu_cross_entropy_loss_backward",
        "default",
    ): "npu::npu_cross_entropy_loss_backward(Tensor grad_loss, Tensor log_prob, Tensor target, Tensor? weight=None, Tensor? grad_zloss=None, Tensor? lse_for_zloss=None, str reduction='mean', int ignore_index=-100, float label_smoothing=0.0, float lse_square_scale_for_zloss=0.0) -> Tensor",
    (
        "npu",
        "npu_fusion_attention",
        "default",
    ): 'npu::npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, str softmax_layout="", Tensor? sink=None, Tensor? dropout_mask=None, int seed=0, int offset=0) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)',
    (
        "npu",
        "npu_fusion_attention_grad",
        "default",
    ): 'npu::npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, str input_layout, *, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, Tensor? attention_in=None, float scale_value=1., float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, int seed=0, int offset=0, int numels=0, int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, bool gen_mask_parallel=True, bool sync=False, str softmax_layout="", Tensor? sink=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)',
}


def gen(seed: int) -> Any:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int, dtype: Any = torch.float32) -> Any:
    return torch.randn(*shape, generator=gen(seed)).to(dtype)


# --------------------------------------------------------------------------- registration


def test_register_is_idempotent_and_defines_the_real_schemas() -> None:
    _npu_ops.register()
    _npu_ops.register()
    for (ns, name, overload), schema in REAL_SCHEMAS.items():
        op = getattr(getattr(getattr(torch.ops, ns), name), overload)
        assert op._schema == torch._C.parse_schema(schema), (ns, name, overload)
    assert sorted(npu.npu_fused_infer_attention_score.overloads()) == ["default", "out"]


def test_torch_npu_names_map_to_the_operator_packets() -> None:
    names = _npu_ops.torch_npu_names()
    assert names == {
        "npu_add_rms_norm": npu.npu_add_rms_norm,
        "npu_fused_infer_attention_score": npu.npu_fused_infer_attention_score,
        "_npu_fused_infer_attention_score_get_max_workspace": npu._npu_fused_infer_attention_score_get_max_workspace,
        "npu_top_k_top_p": npu.npu_top_k_top_p,
        "npu_dynamic_quant": npu.npu_dynamic_quant,
        "npu_add_rms_norm_quant": npu.npu_add_rms_norm_quant,
        "npu_quantize": npu.npu_quantize,
        "npu_add_rms_norm_dynamic_quant": npu.npu_add_rms_norm_dynamic_quant,
        "_npu_rotary_embedding": atb._npu_rotary_embedding,
        "_npu_reshape_and_cache": atb._npu_reshape_and_cache,
        "_npu_matmul_add_fp32": atb._npu_matmul_add_fp32,
        "npu_rms_norm": npu.npu_rms_norm,
        "npu_rotary_mul": npu.npu_rotary_mul,
        "npu_swiglu": npu.npu_swiglu,
        "npu_cross_entropy_loss": npu.npu_cross_entropy_loss,
        "npu_fusion_attention": npu.npu_fusion_attention,
    }
    assert all(isinstance(op, torch._ops.OpOverloadPacket) for op in names.values())
    assert _npu_ops.has_atb("_npu_rotary_embedding") and not _npu_ops.has_atb("_npu_paged_attention")


def test_the_quantization_kernels_have_torch_npus_meta_shapes() -> None:
    """vllm-ascend's norm-quant fusion pass traces these whenever a model compiles in bfloat16."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    _npu_ops.register()
    with FakeTensorMode():
        x = torch.empty(3, 5, 8, dtype=torch.bfloat16)
        gamma = torch.empty(8, dtype=torch.bfloat16)
        y, scale = npu.npu_dynamic_quant(x)
        assert (y.dtype, tuple(y.shape), scale.dtype, tuple(scale.shape)) == (
            torch.int8,
            (3, 5, 8),
            torch.float32,
            (3, 5),
        )
        outs = npu.npu_add_rms_norm_dynamic_quant(x, x, gamma, epsilon=1e-6, output_mask=[True, False])
        assert [(o.dtype, tuple(o.shape)) for o in outs] == [
            (torch.int8, (3, 5, 8)), (torch.int8, (0,)), (torch.bfloat16, (3, 5, 8)),
            (torch.float32, (3, 5)), (torch.float32, (0,)),
        ]  # fmt: skip
        outs = npu.npu_add_rms_norm_quant(x, x, gamma, gamma, None, epsilon=1e-6)
        assert [o.dtype for o in outs] == [torch.int8, torch.int8, torch.bfloat16]


def quant_reference(y: Any, smooth: Any = None) -> tuple[Any, Any]:
    """torch_npu's documented per-token formula, written out: scale = rowMax(|y*s|)/127, round(y*s/scale)."""
    ys = y.float() * (smooth.float() if smooth is not None else 1)
    scale = ys.abs().max(dim=-1).values / 127
    return torch.round(ys / scale[..., None]).clamp(-128, 127).to(torch.int8), scale


def test_the_quantization_kernels_equal_the_documented_formulas() -> None:
    _npu_ops.register()
    x1, x2 = randn(4, 16, seed=1, dtype=torch.bfloat16), randn(4, 16, seed=2, dtype=torch.bfloat16)
    gamma, beta = randn(16, seed=3, dtype=torch.bfloat16), randn(16, seed=4, dtype=torch.bfloat16)
    smooth = randn(16, seed=5, dtype=torch.bfloat16).abs() + 0.5
    y, scale = npu.npu_dynamic_quant(x1, smooth_scales=smooth)
    want = quant_reference(x1, smooth)
    assert torch.equal(y, want[0]) and torch.allclose(scale, want[1])
    assert y.abs().max() == 127  # the largest element of each row maps to the int8 maximum
    normed, _, summed = npu.npu_add_rms_norm(x1, x2, gamma, 1e-6)
    # the fused kernel is the unfused pair: add + RMS norm with beta (vllm-ascend's npu_add_rms_norm_bias), then
    # the per-token formula
    normed_b = torch.ops._C_ascend.npu_add_rms_norm_bias(x1, x2, gamma, beta, 1e-6)[0]
    y1, y2, x, s1, s2 = npu.npu_add_rms_norm_dynamic_quant(
        x1, x2, gamma, smooth_scale1=smooth, beta=beta, output_mask=[True, False]
    )
    want = quant_reference(normed_b, smooth)
    assert torch.equal(y1, want[0]) and torch.allclose(s1, want[1]) and torch.equal(x, summed)
    assert y2.numel() == 0 and s2.numel() == 0
    scales, zero = randn(16, seed=6).abs() + 0.01, torch.randint(-3, 3, (16,), dtype=torch.int32)
    q1, q2, x = npu.npu_add_rms_norm_quant(x1, x2, gamma, scales, zero, epsilon=1e-6)
    assert torch.equal(q1, torch.round(normed.float() / scales + zero).clamp(-128, 127).to(torch.int8))
    assert torch.equal(q2, torch.zeros_like(q1)) and torch.equal(x, summed)
    q1, _, _ = npu.npu_add_rms_norm_quant(x1, x2, gamma, scales, None, epsilon=1e-6, div_mode=False)
    assert torch.equal(q1, torch.round(normed.float() * scales).clamp(-128, 127).to(torch.int8))
    # vllm-ascend's vllm::quantize: npu_quantize(x, 1 / scale, offset, torch.qint8, -1, False)
    offset = torch.tensor([2.0] * 16)
    q = npu.npu_quantize(x1, 1 / scales, offset, torch.qint8, -1, False)
    assert torch.equal(q, torch.round(x1.float() * (1 / scales) + offset).clamp(-128, 127).to(torch.int8))
    per_row = randn(4, seed=7).abs() + 0.01
    q = npu.npu_quantize(
        x1.float() * 300, per_row, None, torch.quint8, 0
    )  # div_mode, along axis 0, saturating
    assert q.dtype == torch.uint8
    assert torch.equal(q, torch.round(x1.float() * 300 / per_row[:, None]).clamp(0, 255).to(torch.uint8))


# --------------------------------------------------------------------------- add + RMS norm


def rms_reference(x1: Any, x2: Any, gamma: Any, eps: float, beta: Any = None) -> tuple[Any, Any, Any]:
    x = x1.double() + x2.double()
    dims = list(range(x.dim() - gamma.dim(), x.dim()))
    rstd = 1.0 / torch.sqrt((x * x).mean(dim=dims, keepdim=True) + eps)
    y = x * rstd * gamma.double()
    return (y if beta is None else y + beta.double()), rstd, x


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_add_rms_norm_equals_the_formula(dtype: Any, tol: float) -> None:
    x1, x2, gamma = (
        randn(5, 16, seed=1, dtype=dtype),
        randn(5, 16, seed=2, dtype=dtype),
        randn(16, seed=3, dtype=dtype),
    )
    y, rstd, x = npu.npu_add_rms_norm(x1, x2, gamma, 1e-5)
    ref_y, ref_rstd, ref_x = rms_reference(x1, x2, gamma, 1e-5)
    assert y.dtype == x.dtype == dtype and rstd.dtype == torch.float32
    assert rstd.shape == (5, 1) and y.shape == x.shape == (5, 16)
    torch.testing.assert_close(y.double(), ref_y, rtol=tol, atol=tol)
    torch.testing.assert_close(x.double(), ref_x, rtol=tol, atol=tol)
    torch.testing.assert_close(rstd.double(), ref_rstd, rtol=tol, atol=tol)


def test_add_rms_norm_rstd_keeps_the_leading_dims() -> None:
    x1, x2 = randn(2, 3, 8, seed=4), randn(2, 3, 8, seed=5)
    assert npu.npu_add_rms_norm(x1, x2, randn(8, seed=6))[1].shape == (2, 3, 1)
    y, rstd, _ = npu.npu_add_rms_norm(x1, x2, randn(3, 8, seed=7))  # normalized over the last two dims
    assert rstd.shape == (2, 1, 1)
    torch.testing.assert_close(
        y.double(), rms_reference(x1, x2, randn(3, 8, seed=7), 1e-6)[0], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("with_beta", [True, False])
def test_add_rms_norm_bias_adds_beta(with_beta: bool) -> None:
    x1, x2, gamma, beta = randn(4, 12, seed=8), randn(4, 12, seed=9), randn(12, seed=10), randn(12, seed=11)
    y, rstd, x = c_ascend.npu_add_rms_norm_bias(x1, x2, gamma, beta if with_beta else None, 1e-6)
    ref_y, ref_rstd, ref_x = rms_reference(x1, x2, gamma, 1e-6, beta if with_beta else None)
    torch.testing.assert_close(y.double(), ref_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.double(), ref_x)
    torch.testing.assert_close(rstd.double(), ref_rstd, rtol=1e-5, atol=1e-5)
    assert rstd.shape == (4, 1) and rstd.dtype == torch.float32


# --------------------------------------------------------------------------- fused infer attention


def ref_attention(q: Any, k: Any, v: Any, scale: float, allowed: Any) -> tuple[Any, Any]:
    """One request: q [sq, N, D], k/v [skv, Nkv, D]; ``allowed`` [sq, skv] True = attend.  Float64
    softmax, head by head (query head h reads kv head h // (N / Nkv)); the output and the lse [sq, N]."""
    sq, n, _ = q.shape
    nkv, dv = k.shape[1], v.shape[2]
    out = torch.zeros(sq, n, dv, dtype=torch.float64)
    lse = torch.full((sq, n), -math.inf, dtype=torch.float64)
    for h in range(n):
        kv_head = h // (n // nkv)
        scores = (q[:, h].double() @ k[:, kv_head].double().T) * scale
        scores = scores.masked_fill(~allowed, -math.inf)
        for i in range(sq):
            if allowed[i].any():
                lse[i, h] = torch.logsumexp(scores[i], dim=0)
                out[i, h] = torch.softmax(scores[i], dim=0) @ v[:, kv_head].double()
    return out, lse


def causal(sq: int, skv: int) -> Any:
    """Bottom-right causal: query i sees kv j <= skv - sq + i."""
    return torch.tensor([[j <= skv - sq + i for j in range(skv)] for i in range(sq)], dtype=torch.bool)


def window(sq: int, skv: int, pre: int, nxt: int) -> Any:
    return torch.tensor(
        [[skv - sq + i - pre <= j <= skv - sq + i + nxt for j in range(skv)] for i in range(sq)],
        dtype=torch.bool,
    )


def paged(
    seqs: list[Any], block_size: int, num_blocks: int, seed: int, bnsd: bool = False
) -> tuple[Any, Any]:
    """A cache [num_blocks, block_size, Nkv, D] (or [num_blocks, Nkv, block_size, D]) holding each
    sequence [len, Nkv, D] in shuffled blocks, and the int32 block table."""
    nkv, d = seqs[0].shape[1], seqs[0].shape[2]
    # random everywhere: a read of a wrong block or past the length shows
    cache = torch.randn(num_blocks, block_size, nkv, d, generator=gen(seed)).to(seqs[0].dtype)
    free = torch.randperm(num_blocks, generator=gen(seed + 1)).tolist()
    widest = max(-(-s.shape[0] // block_size) for s in seqs)
    table = torch.full((len(seqs), widest + 1), num_blocks - 1, dtype=torch.int32)  # spare columns
    for r, seq in enumerate(seqs):
        for blk in range(-(-seq.shape[0] // block_size)):
            b = free.pop()
            table[r, blk] = b
            chunk = seq[blk * block_size : (blk + 1) * block_size]
            cache[b, : chunk.shape[0]] = chunk
    return (cache.transpose(1, 2).contiguous() if bnsd else cache), table


def fia(q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
    return npu.npu_fused_infer_attention_score(q, k, v, **kwargs)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_fia_prefill_no_cache_is_causal_per_request_with_gqa(dtype: Any, tol: float) -> None:
    lens, n, nkv, d, scale = [3, 5, 4], 4, 2, 8, 0.35
    t = sum(lens)
    q, k, v = (
        randn(t, n, d, seed=20, dtype=dtype),
        randn(t, nkv, d, seed=21, dtype=dtype),
        randn(t, nkv, d, seed=22, dtype=dtype),
    )
    ends = [3, 8, 12]
    out, lse = fia(
        q, k, v, atten_mask=MASK, actual_seq_lengths=ends, actual_seq_lengths_kv=ends, num_heads=n,
        num_key_value_heads=nkv, input_layout="TND", sparse_mode=3, scale=scale, block_size=128,
    )  # fmt: skip
    assert out.shape == (t, n, d) and out.dtype == dtype
    assert lse.shape == (0,) and lse.dtype == torch.float32  # no softmax_lse_flag
    start = 0
    for end in ends:
        s = end - start
        ref, _ = ref_attention(q[start:end], k[start:end], v[start:end], scale, causal(s, s))
        torch.testing.assert_close(out[start:end].double(), ref, rtol=tol, atol=tol)
        start = end


@pytest.mark.parametrize("bnsd_cache", [False, True])
def test_fia_decode_reads_a_paged_cache_through_a_shuffled_block_table(bnsd_cache: bool) -> None:
    kv_lens, n, nkv, d, bs, scale = [5, 9, 1], 4, 2, 8, 4, 0.5
    seqs_k = [randn(length, nkv, d, seed=30 + i) for i, length in enumerate(kv_lens)]
    seqs_v = [randn(length, nkv, d, seed=40 + i) for i, length in enumerate(kv_lens)]
    k_cache, table = paged(seqs_k, bs, 12, seed=50, bnsd=bnsd_cache)
    v_cache, table_v = paged(seqs_v, bs, 12, seed=50, bnsd=bnsd_cache)
    assert torch.equal(table, table_v)
    q = randn(3, n, d, seed=51)
    # vllm-ascend's view of its cache: [blocks, block_size, Nkv*D]
    key = k_cache if bnsd_cache else k_cache.view(12, bs, -1)
    value = v_cache if bnsd_cache else v_cache.view(12, bs, -1)
    out, _ = fia(
        q, key, value, atten_mask=MASK, block_table=table, actual_seq_lengths=[1, 2, 3], actual_seq_lengths_kv=kv_lens,
        num_heads=n, num_key_value_heads=nkv, input_layout="TND", sparse_mode=3, scale=scale, block_size=bs,
    )  # fmt: skip
    for r, length in enumerate(kv_lens):
        ref, _ = ref_attention(q[r : r + 1], seqs_k[r], seqs_v[r], scale, causal(1, length))
        torch.testing.assert_close(out[r : r + 1].double(), ref, rtol=1e-5, atol=1e-5)


def test_fia_chunked_prefill_attends_to_the_cached_prefix() -> None:
    q_lens, kv_lens, n, nkv, d, bs, scale = [3, 1, 4], [7, 4, 4], 4, 2, 8, 2, 0.3
    seqs_k = [randn(length, nkv, d, seed=60 + i) for i, length in enumerate(kv_lens)]
    seqs_v = [randn(length, nkv, d, seed=70 + i) for i, length in enumerate(kv_lens)]
    k_cache, table = paged(seqs_k, bs, 16, seed=80)
    v_cache, _ = paged(seqs_v, bs, 16, seed=80)
    q = randn(sum(q_lens), n, d, seed=81)
    ends = [3, 4, 8]
    out, lse = fia(
        q, k_cache.view(16, bs, -1), v_cache.view(16, bs, -1), atten_mask=MASK, block_table=table,
        actual_seq_lengths=ends, actual_seq_lengths_kv=kv_lens, num_heads=n, num_key_value_heads=nkv,
        input_layout="TND", sparse_mode=3, scale=scale, block_size=bs, softmax_lse_flag=True,
    )  # fmt: skip
    assert lse.shape == (8, n, 1) and lse.dtype == torch.float32
    start = 0
    for r, end in enumerate(ends):
        ref, ref_lse = ref_attention(
            q[start:end], seqs_k[r], seqs_v[r], scale, causal(end - start, kv_lens[r])
        )
        torch.testing.assert_close(out[start:end].double(), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse[start:end, :, 0].double(), ref_lse, rtol=1e-5, atol=1e-5)
        start = end


def test_fia_sparse_mode_0_without_a_mask_attends_everywhere() -> None:
    q, k, v = randn(6, 2, 4, seed=90), randn(6, 2, 4, seed=91), randn(6, 2, 4, seed=92)
    out, _ = fia(
        q, k, v, actual_seq_lengths=[2, 6], actual_seq_lengths_kv=[2, 6], num_heads=2, input_layout="TND",
        sparse_mode=0, scale=0.5, pre_tokens=0, next_tokens=0,  # ignored without a mask
    )  # fmt: skip
    full = torch.ones(4, 4, dtype=torch.bool)
    torch.testing.assert_close(out[2:].double(), ref_attention(q[2:], k[2:], v[2:], 0.5, full)[0])
    torch.testing.assert_close(out[:2].double(), ref_attention(q[:2], k[:2], v[:2], 0.5, full[:2, :2])[0])


def test_fia_band_mode_is_a_sliding_window_from_the_bottom_right() -> None:
    kv_lens, bs = [6, 5], 2  # queries: 3 and 1 tokens
    seqs_k = [randn(length, 1, 4, seed=100 + i) for i, length in enumerate(kv_lens)]
    seqs_v = [randn(length, 1, 4, seed=110 + i) for i, length in enumerate(kv_lens)]
    k_cache, table = paged(seqs_k, bs, 8, seed=120)
    v_cache, _ = paged(seqs_v, bs, 8, seed=120)
    q = randn(4, 2, 4, seed=121)
    out, _ = fia(
        q, k_cache.view(8, bs, -1), v_cache.view(8, bs, -1), atten_mask=MASK, block_table=table,
        actual_seq_lengths=[3, 4], actual_seq_lengths_kv=kv_lens, num_heads=2, num_key_value_heads=1,
        input_layout="TND", sparse_mode=4, pre_tokens=2, next_tokens=0, scale=1.0, block_size=bs,
    )  # fmt: skip
    ref0, _ = ref_attention(q[:3], seqs_k[0], seqs_v[0], 1.0, window(3, 6, 2, 0))
    ref1, _ = ref_attention(q[3:], seqs_k[1], seqs_v[1], 1.0, window(1, 5, 2, 0))
    torch.testing.assert_close(out[:3].double(), ref0, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[3:].double(), ref1, rtol=1e-5, atol=1e-5)


def test_fia_out_overload_writes_the_buffers() -> None:
    q, k, v = randn(5, 2, 4, seed=130), randn(5, 2, 4, seed=131), randn(5, 2, 4, seed=132)
    kwargs: dict[str, Any] = dict(
        atten_mask=MASK, actual_seq_lengths=[5], actual_seq_lengths_kv=[5], num_heads=2, input_layout="TND",
        sparse_mode=3, scale=0.5,
    )  # fmt: skip
    expected, expected_lse = fia(q, k, v, softmax_lse_flag=True, **kwargs)
    output, lse_buffer = torch.zeros(5, 2, 4), torch.full((1,), 7.0)  # vllm-ascend: torch.empty(1)
    workspace = npu._npu_fused_infer_attention_score_get_max_workspace(q, k, v, **kwargs)
    result = npu.npu_fused_infer_attention_score.out(
        q, k, v, workspace=workspace, attention_out=output, softmax_lse=lse_buffer, **kwargs
    )
    assert result[0] is output and result[1] is lse_buffer
    torch.testing.assert_close(output, expected)
    assert lse_buffer.item() == 7.0  # without softmax_lse_flag the buffer is left alone
    lse_out = torch.empty(5, 2, 1)
    npu.npu_fused_infer_attention_score.out(
        q, k, v, softmax_lse_flag=True, attention_out=output, softmax_lse=lse_out, **kwargs
    )
    torch.testing.assert_close(lse_out, expected_lse)


def test_fia_workspace_is_a_tensor_of_the_query_dtype() -> None:
    q = randn(3, 2, 4, seed=140, dtype=torch.bfloat16)
    ws = npu._npu_fused_infer_attention_score_get_max_workspace(
        q, q, q, actual_seq_lengths=[3], actual_seq_lengths_kv=[3], num_heads=2, input_layout="TND"
    )
    assert ws.dim() == 1 and ws.dtype == torch.bfloat16
    with pytest.raises(SimulatedComputeBoundary, match="pse_shift"):
        npu._npu_fused_infer_attention_score_get_max_workspace(
            q, q, q, pse_shift=q, num_heads=2, input_layout="TND"
        )


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH"])
@pytest.mark.parametrize("mode", [0, 3])
def test_fia_dense_layouts_equal_sdpa(layout: str, mode: int) -> None:
    b, s, n, nkv, d = 2, 5, 4, 2, 8
    q, k, v = randn(b, n, s, d, seed=150), randn(b, nkv, s, d, seed=151), randn(b, nkv, s, d, seed=152)
    to = {
        "BNSD": lambda x: x,
        "BSND": lambda x: x.transpose(1, 2),
        "BSH": lambda x: x.transpose(1, 2).flatten(2),
    }[layout]
    out, lse = fia(
        to(q), to(k), to(v), num_heads=n, num_key_value_heads=nkv, input_layout=layout, scale=0.25,
        sparse_mode=mode, atten_mask=MASK if mode == 3 else None, softmax_lse_flag=True,
    )  # fmt: skip
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(n // nkv, 1), v.repeat_interleave(n // nkv, 1), is_causal=mode == 3, scale=0.25
    )
    torch.testing.assert_close(out, to(expected).contiguous())
    assert lse.shape == (b, n, s, 1)


BOUNDARIES = [
    ({"pse_shift": torch.zeros(1, 2, 3, 3)}, "pse_shift"),
    ({"quant_scale2": torch.ones(1)}, "quant_scale2"),
    ({"antiquant_scale": torch.ones(2)}, "antiquant_scale"),
    ({"key_antiquant_scale": torch.ones(2)}, "key_antiquant_scale"),
    ({"query_rope": torch.zeros(3, 2, 4), "key_rope": torch.zeros(3, 2, 4)}, "query_rope"),
    ({"key_shared_prefix": torch.zeros(1, 2, 4)}, "key_shared_prefix"),
    ({"query_padding_size": torch.zeros(1, dtype=torch.int64)}, "query_padding_size"),
    ({"sparse_mode": 6}, "sparse_mode=6"),
    ({"input_layout": "NTD"}, "input_layout='NTD'"),
    ({"atten_mask": torch.zeros(3, 3, dtype=torch.bool), "sparse_mode": 1}, "atten_mask"),
]


@pytest.mark.parametrize(("extra", "named"), BOUNDARIES, ids=[n for _, n in BOUNDARIES])
def test_fia_raises_the_compute_boundary_naming_the_argument(extra: dict[str, Any], named: str) -> None:
    q = randn(3, 2, 4, seed=160)
    kwargs = {"actual_seq_lengths": [3], "actual_seq_lengths_kv": [3], "num_heads": 2, "input_layout": "TND"}
    with pytest.raises(SimulatedComputeBoundary, match=named.replace("(", r"\(").replace("[", r"\[")):
        fia(q, q, q, **{**kwargs, **extra})


def test_fia_boundaries_of_inputs() -> None:
    q = randn(3, 2, 4, seed=161)
    with pytest.raises(SimulatedComputeBoundary, match="int8"):
        fia(
            q,
            q.to(torch.int8),
            q.to(torch.int8),
            actual_seq_lengths=[3],
            actual_seq_lengths_kv=[3],
            num_heads=2,
            input_layout="TND",
        )
    nz = torch.zeros(4, 2, 1, 16, 16)
    with pytest.raises(SimulatedComputeBoundary, match="NZ"):
        fia(
            q,
            nz,
            nz,
            block_table=torch.zeros(1, 1, dtype=torch.int32),
            actual_seq_lengths=[3],
            actual_seq_lengths_kv=[3],
            num_heads=2,
            input_layout="TND",
            block_size=16,
        )


def test_fia_rejects_what_the_real_kernel_rejects() -> None:
    q = randn(4, 2, 4, seed=170)
    base = {"actual_seq_lengths": [4], "actual_seq_lengths_kv": [4], "num_heads": 2, "input_layout": "TND"}
    with pytest.raises(ValueError, match="sparse_mode=3 needs"):
        fia(q, q, q, sparse_mode=3, **base)
    with pytest.raises(ValueError, match="differs"):  # a mask that is not triu(ones(2048, 2048), 1)
        fia(q, q, q, sparse_mode=3, atten_mask=torch.tril(torch.ones(2048, 2048)), **base)
    with pytest.raises(ValueError, match="needs actual_seq_lengths"):
        fia(q, q, q, num_heads=2, input_layout="TND")
    cache = torch.zeros(4, 8, 8)
    with pytest.raises(ValueError, match="block_size=16"):
        fia(q, cache, cache, block_table=torch.zeros(1, 2, dtype=torch.int32), block_size=16, **base)


# --------------------------------------------------------------------------- top-k / top-p


def topkp_reference(logits: Any, p: Any, k: Any) -> Any:
    """Row by row: keep the k largest, then, largest first, every value whose larger ones hold less
    than p of the (top-k) probability; -inf elsewhere."""
    out = torch.full_like(logits, -math.inf)
    for r in range(logits.shape[0]):
        row = logits[r].double()
        order = sorted(range(row.numel()), key=lambda i: -row[i].item())
        if k is not None:
            order = order[: int(k[r])]
        if p is not None:
            probs = torch.softmax(row[order], dim=0)
            kept, above = [], 0.0
            for j, i in enumerate(order):
                if j == 0 or above < float(p[r]):
                    kept.append(i)
                above += probs[j].item()
            order = kept
        out[r, order] = logits[r, order]
    return out


@pytest.mark.parametrize("op", ["npu_top_k_top_p", "npu_apply_top_k_top_p"])
@pytest.mark.parametrize("which", ["k", "p", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_k_top_p_equals_the_reference(op: str, which: str, dtype: Any) -> None:
    fn = getattr(npu, op) if op == "npu_top_k_top_p" else getattr(c_ascend, op)
    logits = (torch.randn(4, 50, generator=gen(200)) * 3).to(dtype)
    p = torch.tensor([0.5, 0.9, 0.05, 1.0]).to(dtype) if which != "k" else None
    k = torch.tensor([3, 50, 1, 10], dtype=torch.int32) if which != "p" else None
    out = fn(logits, p, k)  # positional: (logits, p, k)
    assert out.dtype == dtype and out.shape == logits.shape
    torch.testing.assert_close(out, topkp_reference(logits, p, k))
    torch.testing.assert_close(fn(logits, k=k, p=p), out)


@pytest.mark.parametrize("op", ["npu_top_k_top_p", "npu_apply_top_k_top_p"])
def test_top_k_top_p_ties_and_edges_follow_the_documented_algorithm(op: str) -> None:
    """The stable ascending sort ranks equal logits by index; top-k keeps every value equal to the
    k-th largest; top-p drops cumulative probabilities <= 1 - p, but never the largest."""
    fn = getattr(npu, op) if op == "npu_top_k_top_p" else getattr(c_ascend, op)
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 3.0, 1.0, 2.0], [2.0, 2.0, 1.0, 0.0]])
    p, k = torch.tensor([0.5, 0.0, 1.0]), torch.tensor([4, 4, 1], dtype=torch.int32)
    inf = math.inf
    expected = torch.tensor([[-inf, -inf, 1.0, 1.0], [-inf, 3.0, -inf, -inf], [2.0, 2.0, -inf, -inf]])
    torch.testing.assert_close(fn(logits, p, k), expected)


def test_top_k_top_p_needs_p_or_k() -> None:
    with pytest.raises(ValueError, match="cannot be None"):
        npu.npu_top_k_top_p(torch.zeros(2, 4))


# --------------------------------------------------------------------------- rotary embedding


def cos_sin_cache(max_pos: int, rot: int) -> Any:
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()


def rope_reference(x: Any, positions: Any, cache: Any, head: int, neox: bool) -> Any:
    """x [T, N*head] rotated through complex numbers: pair (a, b) -> (a + ib) * (cos + i sin)."""
    t = x.shape[0]
    heads = x.double().view(t, -1, head)
    cos, sin = cache[positions].double().chunk(2, dim=-1)
    rot = torch.complex(cos, sin)[:, None, :]
    if neox:
        pairs = torch.complex(heads[..., : head // 2], heads[..., head // 2 :]) * rot
        return torch.cat((pairs.real, pairs.imag), dim=-1).view(t, -1)
    pairs = torch.view_as_complex(heads.reshape(t, -1, head // 2, 2).contiguous()) * rot
    return torch.view_as_real(pairs).reshape(t, -1)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_rotary_embedding_rotates_query_and_key_in_place(neox: bool, dtype: Any, tol: float) -> None:
    head, t = 8, 5
    cache = cos_sin_cache(32, head)
    positions = torch.tensor([0, 7, 3, 31, 12])
    query, key = randn(t, 4 * head, seed=210, dtype=dtype), randn(t, 2 * head, seed=211, dtype=dtype)
    q0, k0 = query.clone(), key.clone()
    assert atb._npu_rotary_embedding(positions, query, key, head, cache, neox) is None
    torch.testing.assert_close(
        query.double(), rope_reference(q0, positions, cache, head, neox), rtol=tol, atol=tol
    )
    torch.testing.assert_close(
        key.double(), rope_reference(k0, positions, cache, head, neox), rtol=tol, atol=tol
    )
    assert not torch.equal(query, q0)


def test_rotary_embedding_rotates_whole_heads_only() -> None:
    query, key = torch.zeros(2, 16), torch.zeros(2, 16)
    with pytest.raises(SimulatedComputeBoundary, match="cos_sin_cache"):
        atb._npu_rotary_embedding(torch.tensor([0, 1]), query, key, 8, cos_sin_cache(4, 4), True)


# --------------------------------------------------------------------------- reshape and cache, matmul add


def test_reshape_and_cache_writes_each_token_to_its_slot() -> None:
    blocks, bs, nkv, dk, dv, t = 5, 4, 2, 8, 6, 7
    key, value = randn(t, nkv, dk, seed=220), randn(t, nkv, dv, seed=221)
    key_cache, value_cache = randn(blocks, bs, nkv, dk, seed=222), randn(blocks, bs, nkv, dv, seed=223)
    slots = torch.randperm(blocks * bs, generator=gen(224))[:t].to(torch.int32)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    for i, slot in enumerate(slots.tolist()):
        expected_k[slot // bs, slot % bs] = key[i]
        expected_v[slot // bs, slot % bs] = value[i]
    atb._npu_reshape_and_cache(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)


def test_reshape_and_cache_skips_a_token_whose_slot_is_negative() -> None:
    """ATB's kernel skips it (``if (slotValue < 0) continue;``): the padding of a captured batch."""
    key = torch.arange(1.0, 3.0).reshape(2, 1, 1).expand(2, 1, 4).contiguous()
    cache = torch.zeros(2, 2, 1, 4)
    value_cache = cache.clone()
    atb._npu_reshape_and_cache(key, key, cache, value_cache, torch.tensor([1, -1], dtype=torch.int32))
    expected = torch.zeros(2, 2, 1, 4)
    expected[0, 1] = 1.0
    assert torch.equal(cache, expected) and torch.equal(value_cache, expected)


def test_matmul_add_fp32_accumulates_x_transposed_times_weight() -> None:
    x, weight = randn(3, 4, seed=230, dtype=torch.float16), randn(3, 5, seed=231, dtype=torch.float16)
    c = randn(4, 5, seed=232)
    expected = c.double() + sum(x[i].double()[:, None] * weight[i].double()[None, :] for i in range(3))
    atb._npu_matmul_add_fp32(x, weight, c)
    torch.testing.assert_close(c.double(), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="float32"):
        atb._npu_matmul_add_fp32(x, weight, c.half())


# --------------------------------------------------------------------------- fake tensors, opcheck, compile


def test_every_op_runs_under_fake_tensor_mode_with_the_meta_shapes() -> None:
    with FakeTensorMode():
        x = torch.empty(6, 32, dtype=torch.bfloat16)
        y, rstd, s = npu.npu_add_rms_norm(x, x, torch.empty(32, dtype=torch.bfloat16))
        assert (y.shape, rstd.shape, rstd.dtype, s.shape, s.dtype) == (
            (6, 32),
            (6, 1),
            torch.float32,
            (6, 32),
            torch.bfloat16,
        )
        y, rstd, s = c_ascend.npu_add_rms_norm_bias(x, x, torch.empty(32, dtype=torch.bfloat16), None, 1e-6)
        assert (y.shape, rstd.shape, rstd.dtype) == ((6, 32), (6, 1), torch.float32)

        q, cache = torch.empty(6, 4, 16, dtype=torch.bfloat16), torch.empty(10, 128, 32, dtype=torch.bfloat16)
        table = torch.empty(2, 4, dtype=torch.int32)
        kwargs: dict[str, Any] = dict(
            atten_mask=torch.empty(2048, 2048, dtype=torch.int8), block_table=table, actual_seq_lengths=[3, 6],
            actual_seq_lengths_kv=[100, 300], num_heads=4, num_key_value_heads=2, input_layout="TND",
            sparse_mode=3, block_size=128,
        )  # fmt: skip
        out, lse = npu.npu_fused_infer_attention_score(q, cache, cache, **kwargs)
        assert (out.shape, out.dtype, lse.shape, lse.dtype) == (
            (6, 4, 16),
            torch.bfloat16,
            (0,),
            torch.float32,
        )
        out, lse = npu.npu_fused_infer_attention_score(q, cache, cache, softmax_lse_flag=True, **kwargs)
        assert lse.shape == (6, 4, 1)
        ws = npu._npu_fused_infer_attention_score_get_max_workspace(q, cache, cache, **kwargs)
        assert ws.dim() == 1 and ws.dtype == torch.bfloat16
        buf, lse_buf = torch.empty(6, 4, 16, dtype=torch.bfloat16), torch.empty(1, dtype=torch.bfloat16)
        res = npu.npu_fused_infer_attention_score.out(
            q, cache, cache, workspace=ws, attention_out=buf, softmax_lse=lse_buf, **kwargs
        )
        assert res[0] is buf and res[1] is lse_buf
        dense = npu.npu_fused_infer_attention_score(
            torch.empty(2, 5, 64),
            torch.empty(2, 7, 32),
            torch.empty(2, 7, 32),
            num_heads=4,
            num_key_value_heads=2,
        )
        assert dense[0].shape == (2, 5, 64)  # BSH

        logits = torch.empty(3, 100, dtype=torch.bfloat16)
        for op in (npu.npu_top_k_top_p, c_ascend.npu_apply_top_k_top_p):
            filtered = op(logits, torch.empty(3, dtype=torch.bfloat16), torch.empty(3, dtype=torch.int32))
            assert filtered.shape == (3, 100) and filtered.dtype == torch.bfloat16

        query, key = torch.empty(6, 64), torch.empty(6, 32)
        assert (
            atb._npu_rotary_embedding(
                torch.empty(6, dtype=torch.int64), query, key, 16, torch.empty(50, 16), True
            )
            is None
        )
        k_cache = torch.empty(10, 128, 2, 16)
        slots = torch.empty(6, dtype=torch.int32)
        assert (
            atb._npu_reshape_and_cache(
                torch.empty(6, 2, 16), torch.empty(6, 2, 16), k_cache, k_cache.clone(), slots
            )
            is None
        )
        assert (
            atb._npu_matmul_add_fp32(torch.empty(2, 4).half(), torch.empty(2, 4).half(), torch.empty(4, 4))
            is None
        )


def opcheck_cases() -> list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]]:
    q, kv = randn(5, 4, 8, seed=240), randn(5, 2, 8, seed=241)
    k_cache, table = paged([randn(6, 2, 8, seed=242)], 4, 4, seed=243)
    fia_kwargs: dict[str, Any] = dict(
        atten_mask=MASK, actual_seq_lengths=[2, 5], actual_seq_lengths_kv=[2, 5], num_heads=4, num_key_value_heads=2,
        input_layout="TND", sparse_mode=3, scale=0.3, softmax_lse_flag=True,
    )  # fmt: skip
    paged_kwargs: dict[str, Any] = dict(
        atten_mask=MASK, block_table=table, actual_seq_lengths=[2], actual_seq_lengths_kv=[6], num_heads=4,
        num_key_value_heads=2, input_layout="TND", sparse_mode=3, block_size=4,
    )  # fmt: skip
    x = randn(3, 16, seed=244)
    logits = randn(3, 20, seed=245)
    lora_x, lora_a = (
        randn(3, 32, seed=254, dtype=torch.bfloat16),
        randn(2, 1, 8, 32, seed=255, dtype=torch.bfloat16),
    )
    return [
        ("add_rms_norm", npu.npu_add_rms_norm.default, (x, x.flip(0), randn(16, seed=246)), {}),
        (
            "add_rms_norm_bias",
            c_ascend.npu_add_rms_norm_bias.default,
            (x, x.flip(0), randn(16, seed=246), randn(16, seed=247)),
            {},
        ),
        ("fia", npu.npu_fused_infer_attention_score.default, (q, kv, kv.flip(0)), fia_kwargs),
        (
            "fia_paged",
            npu.npu_fused_infer_attention_score.default,
            (q[:2], k_cache.view(4, 4, -1), k_cache.view(4, 4, -1)),
            paged_kwargs,
        ),
        (
            "workspace",
            npu._npu_fused_infer_attention_score_get_max_workspace.default,
            (q, kv, kv),
            fia_kwargs,
        ),
        (
            "top_k_top_p",
            npu.npu_top_k_top_p.default,
            (logits, torch.full((3,), 0.8), torch.tensor([2, 5, 20], dtype=torch.int32)),
            {},
        ),
        (
            "apply_top_k_top_p",
            c_ascend.npu_apply_top_k_top_p.default,
            (logits, None, torch.tensor([2, 5, 20], dtype=torch.int32)),
            {},
        ),
        (
            "rotary",
            atb._npu_rotary_embedding.default,
            (
                torch.tensor([0, 3, 1]),
                randn(3, 32, seed=248),
                randn(3, 16, seed=249),
                8,
                cos_sin_cache(8, 8),
                True,
            ),
            {},
        ),
        (
            "reshape_and_cache",
            atb._npu_reshape_and_cache.default,
            (
                randn(3, 2, 4, seed=250),
                randn(3, 2, 4, seed=251),
                torch.zeros(3, 2, 2, 4),
                torch.zeros(3, 2, 2, 4),
                torch.tensor([5, 0, 2], dtype=torch.int32),
            ),
            {},
        ),
        (
            "matmul_add",
            atb._npu_matmul_add_fp32.default,
            (randn(2, 3, seed=252), randn(2, 4, seed=253), torch.zeros(3, 4)),
            {},
        ),
        (
            "bgmv_shrink",
            c_ascend.bgmv_shrink.default,
            (lora_x, lora_a, torch.tensor([1, -1, 0]), torch.zeros(3, 8), 0.5),
            {},
        ),
        (
            "sgmv_shrink",
            c_ascend.sgmv_shrink.default,
            (lora_x, lora_a, torch.tensor([1, 0]), torch.tensor([2, 1]), torch.zeros(3, 8), 0.5),
            {},
        ),
    ]


@pytest.mark.parametrize("case", opcheck_cases(), ids=lambda c: c[0])
def test_opcheck_schema_fake_and_aot(case: tuple[str, Any, tuple[Any, ...], dict[str, Any]]) -> None:
    _, op, args, kwargs = case
    result = torch.library.opcheck(op, args, kwargs)
    assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_out_overload() -> None:
    """``.out`` returns its aliased buffers (the real schema), which AOT cannot functionalize: the schema
    and fake checks only."""
    q, kv = randn(5, 2, 8, seed=260), randn(5, 2, 8, seed=261)
    kwargs = dict(
        atten_mask=MASK, actual_seq_lengths=[5], actual_seq_lengths_kv=[5], num_heads=2, input_layout="TND",
        sparse_mode=3, attention_out=torch.zeros(5, 2, 8), softmax_lse=torch.zeros(1),
    )  # fmt: skip
    result = torch.library.opcheck(
        npu.npu_fused_infer_attention_score.out,
        (q, kv, kv),
        kwargs,
        test_utils=("test_schema", "test_faketensor"),
    )
    assert set(result.values()) == {"SUCCESS"}, result


def test_a_compiled_decoder_step_equals_eager() -> None:
    """dynamo traces the ops (fullgraph), functionalizes the in-place ones and runs them."""
    head, n, nkv, bs = 8, 4, 2, 4
    cache = cos_sin_cache(16, head)

    def step(
        positions: Any, q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, slots: Any, table: Any
    ) -> Any:
        atb._npu_rotary_embedding(positions, q, k, head, cache, True)
        atb._npu_reshape_and_cache(k.view(-1, nkv, head), v.view(-1, nkv, head), k_cache, v_cache, slots)
        out, _ = npu.npu_fused_infer_attention_score(
            q.view(-1, n, head), k_cache.view(3, bs, -1), v_cache.view(3, bs, -1), atten_mask=MASK, block_table=table,
            actual_seq_lengths=[3], actual_seq_lengths_kv=[3], num_heads=n, num_key_value_heads=nkv,
            input_layout="TND", sparse_mode=3, block_size=bs, scale=0.5,
        )  # fmt: skip
        return npu.npu_add_rms_norm(out.view(3, -1), q, torch.ones(n * head))[0]

    def inputs() -> list[Any]:
        return [
            torch.tensor([0, 1, 2]), randn(3, n * head, seed=270), randn(3, nkv * head, seed=271),
            randn(3, nkv * head, seed=272), torch.zeros(3, bs, nkv, head), torch.zeros(3, bs, nkv, head),
            torch.tensor([8, 9, 10], dtype=torch.int32), torch.tensor([[2, 0]], dtype=torch.int32),
        ]  # fmt: skip

    eager_in, compiled_in = inputs(), inputs()
    expected = step(*eager_in)
    torch._dynamo.reset()
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(*compiled_in)
    torch.testing.assert_close(got, expected)
    for a, b in zip(compiled_in, eager_in, strict=True):  # the in-place updates happened alike
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------ the kernels of transformers and verl, with autograd


def training_cases(dtype: Any = torch.float32) -> list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]]:
    """Each kernel with inputs that require grad; ``npu_fusion_attention`` packed (TND, causal) and BSND."""
    leaf = lambda *shape, seed: randn(*shape, seed=seed, dtype=dtype).requires_grad_()  # noqa: E731
    q, k, v = leaf(5, 4, 8, seed=280), leaf(5, 2, 8, seed=281), leaf(5, 2, 8, seed=282)
    cos, sin = randn(1, 3, 1, 8, seed=283, dtype=dtype), randn(1, 3, 1, 8, seed=284, dtype=dtype)
    causal = torch.triu(torch.ones(2048, 2048), diagonal=1).bool()
    return [
        ("rms_norm", npu.npu_rms_norm.default, (leaf(3, 16, seed=285), leaf(16, seed=286)), {"epsilon": 1e-5}),
        ("rotary_mul", npu.npu_rotary_mul.default, (leaf(2, 3, 4, 8, seed=287), cos, sin), {}),
        ("rotary_mul_interleave", npu.npu_rotary_mul.default, (leaf(2, 3, 4, 8, seed=288), cos, sin, "interleave"), {}),
        ("swiglu", npu.npu_swiglu.default, (leaf(3, 4, 10, seed=289),), {"dim": 1}),
        (
            "cross_entropy",
            npu.npu_cross_entropy_loss.default,
            (leaf(6, 11, seed=290), torch.tensor([1, 0, -100, 10, 3, 3])),
            {"reduction": "sum", "label_smoothing": 0.1},
        ),
        (
            "fusion_attention_tnd",
            npu.npu_fusion_attention.default,
            (q, k, v, 4, "TND"),
            dict(atten_mask=causal, scale=0.3, actual_seq_qlen=[2, 5], actual_seq_kvlen=[2, 5], sparse_mode=3),
        ),
        (
            "fusion_attention_bsnd",
            npu.npu_fusion_attention.default,
            (q[None].detach().requires_grad_(), k[None].detach().requires_grad_(), v[None].detach().requires_grad_(),
             4, "BSND"),
            {"scale": 0.3},
        ),
    ]  # fmt: skip


@pytest.mark.parametrize("case", training_cases(), ids=lambda c: c[0])
def test_opcheck_of_the_training_kernels_with_their_autograd(
    case: tuple[str, Any, tuple[Any, ...], dict[str, Any]],
) -> None:
    """Schema, fake implementation, autograd registration and AOT dispatch, torch's own checks."""
    _, op, args, kwargs = case
    result = torch.library.opcheck(op, args, kwargs)
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("case", training_cases(torch.float64), ids=lambda c: c[0])
def test_the_backward_kernels_pass_gradcheck(case: tuple[str, Any, tuple[Any, ...], dict[str, Any]]) -> None:
    """The gradient through each operator's backward kernel (``npu_*_backward``, ``npu_fusion_attention_grad``)
    equals the numerical gradient of its forward, in float64, for every input that requires grad."""
    _, op, args, kwargs = case
    grads = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]

    def first_output(*tensors: Any) -> Any:
        it = iter(tensors)
        call = [next(it) if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args]
        out = op(*call, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    assert torch.autograd.gradcheck(first_output, grads, eps=1e-6, atol=1e-5)


def test_dynamo_sees_the_training_kernels_as_operators() -> None:
    """A Qwen2 MLP block as verl's NPU patches write it, compiled whole (``fullgraph``): the kernels are
    single operators in the graph (their call counting happens inside the kernel), forward and backward
    equal eager."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def block(x: Any, w: Any, up: Any) -> Any:
        normed = npu.npu_rms_norm(x, w, 1e-6)[0]
        return npu.npu_swiglu(normed @ up, -1).sum()

    inputs = [
        randn(4, 8, seed=295).requires_grad_(),
        randn(8, seed=296).requires_grad_(),
        randn(8, 12, seed=297),
    ]
    eager = torch.autograd.grad(block(*inputs), inputs[:2])
    torch._dynamo.reset()
    backend = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    got = torch.autograd.grad(compiled(*inputs), inputs[:2])
    for a, b in zip(got, eager, strict=True):
        torch.testing.assert_close(a, b)
    targets = {str(node.target) for graph in backend.graphs for node in graph.graph.nodes}
    assert {"npu.npu_rms_norm", "npu.npu_swiglu"} <= targets, targets


def test_masked_input_and_mask_equals_vllms_own() -> None:
    """``_C_ascend::get_masked_input_and_mask`` against vLLM's Python reference, for TP 2 rank 1 of a vocabulary
    of 1010 (padded to 1024) with 16 added tokens (padded to 64): base ids, added ids and ids of neither."""
    vocab = pytest.importorskip("vllm.model_executor.layers.vocab_parallel_embedding", reason="needs vllm")
    ids = torch.tensor([0, 511, 512, 700, 1009, 1010, 1015, 1016, 2000])
    args = (512, 1010, 14, 1018, 1026)
    got = torch.ops._C_ascend.get_masked_input_and_mask(ids, *args)
    want = vocab.get_masked_input_and_mask(ids, *args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --------------------------------------------------------------------------- the punica LoRA kernels
# ``_C_ascend::{b,s}gmv_{shrink,expand}``, called as vllm-ascend's ``vllm_ascend/lora/lora_ops.py`` calls them
# (``PunicaWrapperNPU`` calls nothing else), against vLLM's plain-torch ``vllm.lora.ops.torch_ops``.


class LoraOpsMapping:
    """vllm-ascend 0.23.0.post1's ``vllm_ascend/lora/lora_ops.py``, where the laid-out release is not at hand:
    vLLM's argument order mapped onto the operators' (``add_inputs`` is not passed on)."""

    @staticmethod
    def bgmv_shrink(x: Any, w: Any, y: Any, indices: Any, scaling: float = 1.0) -> Any:
        return c_ascend.bgmv_shrink(x, w, indices, y, scaling)

    @staticmethod
    def bgmv_expand(x: Any, w: Any, y: Any, indices: Any, add_inputs: bool = True) -> Any:
        return c_ascend.bgmv_expand(x, w, indices, y, 0, y.size(1))

    @staticmethod
    def bgmv_expand_slice(
        x: Any, w: Any, y: Any, indices: Any, offset: int, size: int, add_inputs: bool = True
    ) -> Any:
        return c_ascend.bgmv_expand(x, w, indices, y, offset, size)

    @staticmethod
    def sgmv_shrink(x: Any, w: Any, y: Any, starts: Any, seq_len: Any, lora: Any, *meta: Any) -> Any:
        return c_ascend.sgmv_shrink(x, w, lora, seq_len, y, meta[-1])  # meta: batches, max, tokens, scaling

    @staticmethod
    def sgmv_expand(x: Any, w: Any, y: Any, starts: Any, seq_len: Any, lora: Any, *meta: Any) -> Any:
        return c_ascend.sgmv_expand(x, w, lora, seq_len, y, 0, y.size(1))

    @staticmethod
    def sgmv_expand_slice(x: Any, w: Any, y: Any, starts: Any, seq_len: Any, lora: Any, *meta: Any) -> Any:
        offset, size = meta[3], meta[4]
        return c_ascend.sgmv_expand(x, w, lora, seq_len, y, offset, size)


VLLM = _sites.installed_vllm()
#: The vllm-ascend release paired with the installed vLLM, where the stack sessions laid it out.
RELEASE = _sites.vllm_ascend_release(VLLM) if VLLM else None
LAID_OUT = RELEASE is not None and _vllm_ascend_release.is_laid_out(RELEASE)


def lora_ops_module() -> Any:
    """The released ``vllm_ascend/lora/lora_ops.py`` (it imports torch alone), loaded from the laid-out release;
    :class:`LoraOpsMapping` where none is laid out."""
    if RELEASE is None or not LAID_OUT:
        return LoraOpsMapping
    path = _vllm_ascend_release.layout_dir(RELEASE) / "vllm_ascend" / "lora" / "lora_ops.py"
    spec = importlib.util.spec_from_file_location("_released_vllm_ascend_lora_ops", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LORA_OPS = lora_ops_module()

#: Seven tokens, three adapters, -1 for a token without one (``PunicaWrapperBase.token_lora_indices``); the
#: same tokens as five sequences for sgmv (``compute_meta``'s ``unique_consecutive``, -1 sequences too).
TOKEN_LORAS = [2, 2, -1, 0, 1, 1, -1]
SEQ_LEN, SEQ_LORAS = [2, 1, 1, 2, 1], [2, -1, 0, 1, -1]
#: ``prefill_metadata``: seq_start_locs (unused by lora_ops.py), lengths, adapters, batches, max length, tokens.
SEQ_META = (None, torch.tensor(SEQ_LEN), torch.tensor(SEQ_LORAS), 5, 2, 7)
T, HIDDEN, RANK, LORAS = 7, 64, 16, 3


def torch_ops() -> Any:
    return pytest.importorskip(
        "vllm.lora.ops.torch_ops", reason="needs vllm (installed by the upstream stack sessions)"
    )


def zero_slot(weights: Any) -> Any:
    """The stack with a zero adapter appended: vLLM's torch ops index it with -1, which picks the last adapter
    (vLLM's Triton kernels and vllm-ascend's skip the token), so there the zero adapter stands for no LoRA."""
    return torch.cat([weights, torch.zeros_like(weights[:1])])


def lora_call(op: str, x: Any, w: Any, y: Any, *args: Any) -> Any:
    """``op`` of :data:`LORA_OPS` (``bgmv_*``: per-token indices; ``sgmv_*``: the sequences' metadata)."""
    if op.startswith("sgmv"):
        return getattr(LORA_OPS, op)(x, w, y, *SEQ_META, *args)
    return getattr(LORA_OPS, op)(x, w, y, torch.tensor(TOKEN_LORAS), *args)


def reference_call(op: str, x: Any, w: Any, y: Any, *args: Any) -> None:
    ref = torch_ops()
    if op.startswith("sgmv"):
        getattr(ref, op)(x, zero_slot(w), y, *SEQ_META, *args)
    else:
        getattr(ref, op)(x, zero_slot(w), y, torch.tensor(TOKEN_LORAS), *args)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["bgmv_shrink", "sgmv_shrink"])
@pytest.mark.parametrize("weight_dims", [4, 3])
def test_lora_shrink_equals_vllms_torch_ops(op: str, dtype: Any, weight_dims: int) -> None:
    """``y = scale * x @ lora_a[lora]^T`` in float32 over the zeroed float32 buffer ``PunicaWrapperNPU`` passes,
    with the adapter stack as vLLM holds it (``[max_loras, 1, rank, hidden]``) or without its 1."""
    x = randn(T, HIDDEN, seed=300, dtype=dtype)
    lora_a = randn(LORAS, 1, RANK, HIDDEN, seed=301, dtype=dtype)
    if weight_dims == 3:
        lora_a = lora_a[:, 0]
    got, want = torch.zeros(T, RANK), torch.zeros(T, RANK)
    assert lora_call(op, x, lora_a, got, 0.25) is None
    reference_call(op, x, lora_a, want, 0.25)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got[[2, 6]].eq(0).all() and got[[0, 1, 3, 4, 5]].ne(0).all()


EXPAND_CASES = [
    ("bgmv_expand", ()),
    ("bgmv_expand_slice", (40, 48)),
    ("sgmv_expand", ()),
    ("sgmv_expand_slice", (40, 48)),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("op", "window"), EXPAND_CASES, ids=[case[0] for case in EXPAND_CASES])
def test_lora_expand_adds_into_y_as_vllms_torch_ops(op: str, window: tuple[int, ...], dtype: Any) -> None:
    """``y[:, offset:offset+size] += x @ lora_b[lora]^T``: ``x`` the float32 shrink buffer, the sum in float32
    rounded once to ``y``'s dtype; the rest of ``y`` and the rows of tokens without LoRA are left as they were;
    the operator returns ``y`` itself (``at::Tensor y_out = y``)."""
    offset, size = window or (0, 48)
    x = randn(T, RANK, seed=310) * 2
    lora_b = randn(LORAS, 1, size, RANK, seed=311, dtype=dtype)
    y = randn(T, 96 if window else size, seed=312, dtype=dtype)
    got, want = y.clone(), y.clone()
    returned = lora_call(op, x, lora_b, got, *window, True)
    reference_call(op, x, lora_b, want, *window, True)
    assert returned is got
    # vLLM's torch ops round x and the product to y's dtype first: a few ulps apart
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=0.25)
    rows = torch.tensor(TOKEN_LORAS)
    exact = y.double()
    exact[:, offset : offset + size] += torch.einsum(
        "tr,tor->to", x.double(), lora_b[rows.clamp(min=0), 0].double()
    )
    exact[rows < 0] = y[rows < 0].double()
    torch.testing.assert_close(got, exact.to(dtype))  # rounded once: within dtype's default tolerance
    assert torch.equal(got[:, :offset], y[:, :offset]) and torch.equal(
        got[:, offset + size :], y[:, offset + size :]
    )
    assert torch.equal(got[rows < 0], y[rows < 0])


def test_lora_kernels_write_only_the_rows_of_tokens_with_an_adapter() -> None:
    """The kernels skip a token whose index is negative (``if (reqLoRAIndex_ < 0) continue;``) and, for sgmv, one
    past the last sequence (``CopyInIndex`` gives it -1); a sequence of length 0 takes no token.  Shrink writes
    over a row (it does not add); expand always adds, whatever ``add_inputs`` lora_ops.py was given."""
    x = randn(5, 32, seed=320, dtype=torch.bfloat16)
    lora_a = randn(2, 1, 8, 32, seed=321, dtype=torch.bfloat16)
    y = torch.full((5, 8), 7.0)
    c_ascend.bgmv_shrink(x, lora_a, torch.tensor([1, -1, 0, -1, 1]), y, 1.0)
    product = torch.einsum("th,trh->tr", x.float(), lora_a[torch.tensor([1, 0, 0, 0, 1]), 0].float())
    assert torch.equal(y[[1, 3]], torch.full((2, 8), 7.0))
    torch.testing.assert_close(y[[0, 2, 4]], product[[0, 2, 4]])
    # sequences of 2, 0 and 2 tokens with adapters 1, 0 and 0: the second takes no token, the fifth is in none
    y = torch.full((5, 8), 7.0)
    c_ascend.sgmv_shrink(x, lora_a, torch.tensor([1, 0, 0]), torch.tensor([2, 0, 2]), y, 1.0)
    product = torch.einsum("th,trh->tr", x.float(), lora_a[torch.tensor([1, 1, 0, 0, 0]), 0].float())
    torch.testing.assert_close(y[:4], product[:4])
    assert torch.equal(y[4], torch.full((8,), 7.0))

    shrunk = randn(5, 8, seed=322)
    lora_b = randn(2, 1, 16, 8, seed=323, dtype=torch.bfloat16)
    y = randn(5, 16, seed=324, dtype=torch.bfloat16)
    got = y.clone()
    LORA_OPS.sgmv_expand(shrunk, lora_b, got, None, torch.tensor([3]), torch.tensor([0]), 1, 3, 3, False)
    delta = shrunk[:3] @ lora_b[0, 0].float().t()
    torch.testing.assert_close(got[:3], (y[:3].float() + delta).bfloat16())
    assert torch.equal(got[3:], y[3:])


def test_lora_bindings_reject_what_torch_binding_cpp_rejects() -> None:
    """The ``TORCH_CHECK`` s of ``csrc/torch_binding.cpp``: ``RuntimeError`` with their messages."""
    x, lora_a = (
        randn(3, 32, seed=330, dtype=torch.bfloat16),
        randn(2, 1, 8, 32, seed=331, dtype=torch.bfloat16),
    )
    idx, y = torch.tensor([0, 1, -1]), torch.zeros(3, 8)
    with pytest.raises(RuntimeError, match="only support half and bf16"):
        c_ascend.bgmv_shrink(x.float(), lora_a.float(), idx, y, 1.0)
    with pytest.raises(RuntimeError, match="the first dimension of x, y, indices should be same"):
        c_ascend.bgmv_shrink(x, lora_a, idx[:2], y, 1.0)
    with pytest.raises(RuntimeError, match="hidden in should be greater than hidden out"):
        c_ascend.sgmv_shrink(x[:, :8], lora_a[..., :8], idx[:1], torch.tensor([3]), y, 1.0)
    with pytest.raises(RuntimeError, match=r"weight should be \[num_loras"):
        c_ascend.bgmv_shrink(x, lora_a[0, 0], idx, y, 1.0)
    lora_b, out = randn(2, 1, 16, 8, seed=332, dtype=torch.bfloat16), torch.zeros(3, 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="only support half and bf16"):
        c_ascend.bgmv_expand(y, lora_b.float(), idx, out.float(), 0, 16)
    with pytest.raises(RuntimeError, match="hidden in should be smaller than hidden out"):
        c_ascend.bgmv_expand(y, lora_b[..., :4, :], idx, out, 0, 4)
    with pytest.raises(RuntimeError, match="slice_size \\+ slice_offset should be smaller"):
        c_ascend.sgmv_expand(y, lora_b, idx[:1], torch.tensor([3]), out, 24, 16)
    with pytest.raises(RuntimeError, match="slice offset should be no smaller than 0"):
        c_ascend.bgmv_expand(y, lora_b, idx, out, -1, 16)


def test_lora_kernels_name_what_they_do_not_model() -> None:
    """What would make the real kernel read other bytes than the tensors' elements, or that it computes wrong
    (v0.23.0's ``DataCopy`` of rows that are no whole 32-byte blocks; an expand rank without a branch in
    ``Compute``), is a :class:`SimulatedComputeBoundary` naming it."""
    x, lora_a = (
        randn(3, 32, seed=340, dtype=torch.bfloat16),
        randn(2, 1, 8, 32, seed=341, dtype=torch.bfloat16),
    )
    idx, y = torch.tensor([0, 1, -1]), torch.zeros(3, 8)
    lora_b, out = randn(2, 1, 16, 8, seed=342, dtype=torch.bfloat16), torch.zeros(3, 16, dtype=torch.bfloat16)
    cases: list[tuple[str, Any]] = [
        (r"y of torch\.bfloat16: the kernel reads it as torch\.float32", lambda: c_ascend.bgmv_shrink(
            x, lora_a, idx, y.bfloat16(), 1.0)),
        (r"weight of torch\.float16", lambda: c_ascend.bgmv_shrink(x, lora_a.half(), idx, y, 1.0)),
        (r"indices of torch\.int32", lambda: c_ascend.bgmv_shrink(x, lora_a, idx.int(), y, 1.0)),
        (r"a non-contiguous x", lambda: c_ascend.bgmv_shrink(
            randn(32, 3, seed=343, dtype=torch.bfloat16).t(), lora_a, idx, y, 1.0)),
        (r"weight of shape \(2, 1, 8, 48\)", lambda: c_ascend.bgmv_shrink(
            x, randn(2, 1, 8, 48, seed=344, dtype=torch.bfloat16), idx, y, 1.0)),
        (r"lora index 2 of 2", lambda: c_ascend.bgmv_shrink(x, lora_a, torch.tensor([0, 2, 1]), y, 1.0)),
        (r"lora_indices shorter than seq_len", lambda: c_ascend.sgmv_shrink(
            x, lora_a, torch.tensor([0]), torch.tensor([1, 2]), y, 1.0)),
        (r"the float32 rows of y of 4 x 4 bytes", lambda: c_ascend.bgmv_shrink(
            x, lora_a[:, :, :4].contiguous(), idx, torch.zeros(3, 4), 1.0)),
        (r"x and weight rows of 40 x 2 bytes", lambda: c_ascend.bgmv_shrink(
            randn(3, 40, seed=345, dtype=torch.bfloat16), randn(2, 1, 8, 40, seed=346, dtype=torch.bfloat16),
            idx, y, 1.0)),
        (r"x of torch\.bfloat16: the kernel reads it as torch\.float32", lambda: c_ascend.bgmv_expand(
            y.bfloat16(), lora_b, idx, out, 0, 16)),
        (r"rank 4: the kernel reduces ranks \(8, 16, 32, 64\) only", lambda: c_ascend.bgmv_expand(
            torch.zeros(3, 4), lora_b[..., :4].contiguous(), idx, out, 0, 16)),
        (r"the y slice of 24 x 2 bytes", lambda: c_ascend.bgmv_expand(
            y, randn(2, 1, 24, 8, seed=347, dtype=torch.bfloat16), idx, torch.zeros(3, 24, dtype=torch.bfloat16),
            0, 24)),
        (r"x has more rows than y", lambda: c_ascend.sgmv_expand(
            y, lora_b, torch.tensor([0]), torch.tensor([3]), out[:2], 0, 16)),
    ]  # fmt: skip
    for named, call in cases:
        with pytest.raises(SimulatedComputeBoundary, match=named):
            call()


def test_lora_ops_under_fake_tensor_mode_opcheck_and_compile() -> None:
    """The fake implementations are vllm-ascend's meta kernels (``csrc/torch_binding_meta.cpp``): shrink returns
    nothing, expand ``empty_like(y)``.  The real kernel returns ``y`` itself, which the schema does not declare as
    an alias: opcheck's schema and fake-tensor checks say so, its AOT check passes; a compiled LoRA step (the
    in-place ops functionalized) equals eager."""
    x, lora_a = (
        randn(3, 32, seed=350, dtype=torch.bfloat16),
        randn(2, 1, 8, 32, seed=351, dtype=torch.bfloat16),
    )
    lora_b = randn(2, 1, 16, 8, seed=352, dtype=torch.bfloat16)
    idx = torch.tensor([1, -1, 0])
    with FakeTensorMode() as mode:
        fx, fy = mode.from_tensor(x), torch.empty(3, 40, dtype=torch.bfloat16)
        assert (
            c_ascend.bgmv_shrink(fx, mode.from_tensor(lora_a), mode.from_tensor(idx), torch.empty(3, 8), 1.0)
            is None
        )
        out = c_ascend.bgmv_expand(
            torch.empty(3, 8), mode.from_tensor(lora_b), mode.from_tensor(idx), fy, 8, 16
        )
        assert out.shape == (3, 40) and out.dtype == torch.bfloat16 and out is not fy
        out = c_ascend.sgmv_expand(torch.empty(3, 8), mode.from_tensor(lora_b), torch.empty(2, dtype=torch.int64),
                                   torch.empty(2, dtype=torch.int64), fy, 8, 16)  # fmt: skip
        assert out.shape == (3, 40)

    for op, args in (
        (c_ascend.bgmv_expand.default, (randn(3, 8, seed=353), lora_b, idx, torch.zeros(3, 40, dtype=torch.bfloat16), 8, 16)),
        (c_ascend.sgmv_expand.default, (randn(3, 8, seed=353), lora_b, torch.tensor([1, 0]), torch.tensor([2, 1]),
                                        torch.zeros(3, 40, dtype=torch.bfloat16), 8, 16)),
    ):  # fmt: skip
        result = torch.library.opcheck(op, args, raise_exception=False)
        assert result["test_aot_dispatch_dynamic"] == "SUCCESS", result
        assert "Argument y is not defined to alias output but was aliasing" in str(result["test_schema"])
        assert "outputs_alias_inputs" in str(result["test_faketensor"])

    def step(x: Any, y: Any, buffer: Any) -> Any:
        c_ascend.bgmv_shrink(x, lora_a, idx, buffer, 0.5)
        c_ascend.bgmv_expand(buffer, lora_b, idx, y, 8, 16)
        return y * 2

    y = randn(3, 40, seed=354, dtype=torch.bfloat16)
    eager = [x, y.clone(), torch.zeros(3, 8)]
    compiled = [x, y.clone(), torch.zeros(3, 8)]
    expected = step(*eager)
    torch._dynamo.reset()
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(*compiled)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(compiled[1], eager[1])
    torch.testing.assert_close(compiled[2], eager[2])


PUNICA_NPU = """
import json
import torch
from vllm.lora.layers.utils import LoRAMapping
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU
from vllm_ascend.lora import lora_ops
from vllm_ascend.lora.punica_npu import PunicaWrapperNPU

g = torch.Generator().manual_seed(360)
randn = lambda *shape: torch.randn(*shape, generator=g).bfloat16()
tokens, hidden, rank, loras, vocab, slices = 7, 64, 16, 3, 64, (32, 16, 16)
lora_a = tuple(randn(loras, 1, rank, hidden) for _ in slices)
lora_b = tuple(randn(loras, 1, size, rank) for size in slices)
x, y = randn(tokens, hidden), randn(tokens, sum(slices))
emb_x, emb_b, emb_y = randn(tokens, rank), randn(loras, 1, 48, rank), randn(tokens, 48)
logit_x, logit_a, logit_b, logits = randn(4, hidden), randn(loras, 1, rank, hidden), randn(loras, 1, vocab, rank), randn(4, vocab)
zero_slot = lambda w: torch.cat([w, torch.zeros_like(w[:1])])   # vLLM's torch ops take -1 as the last adapter
npu = lambda t: t.to("npu")
seen = {"lora_ops": lora_ops.__file__}
for prefill in (True, False):
    # adapter ids per token (0: none), per request; slots by lora_index_to_id
    mapping = LoRAMapping((1, 1, 0, 3, 3, 3, 2), (1, 0, 3, 2), is_prefill=prefill)
    wrapper = PunicaWrapperNPU(16, 8, "npu")
    wrapper.update_metadata(mapping, [1, 2, 3], loras, vocab)
    reference = PunicaWrapperCPU(16, 8, "cpu")
    reference.update_metadata(mapping, [1, 2, 3, None], loras + 1, vocab)
    got, want = npu(y), y.clone()
    wrapper.add_lora_linear(got, npu(x), tuple(map(npu, lora_a)), tuple(map(npu, lora_b)), 0.5, slices)
    reference.add_lora_linear(want, x, tuple(map(zero_slot, lora_a)), tuple(map(zero_slot, lora_b)), 0.5, slices)
    emb_got, emb_want = npu(emb_y), emb_y.clone()
    wrapper.add_lora_embedding(emb_got, npu(emb_x), npu(emb_b), add_inputs=True)
    reference.add_lora_embedding(emb_want, emb_x, zero_slot(emb_b), add_inputs=True)
    pairs = {"linear": (got, want), "embedding": (emb_got, emb_want)}
    if not prefill:
        logit_got, logit_want = npu(logits), logits.clone()
        wrapper.add_lora_logits(logit_got, npu(logit_x), npu(logit_a), npu(logit_b), 1.0)
        reference.add_lora_logits(logit_want, logit_x, zero_slot(logit_a), zero_slot(logit_b), 1.0)
        pairs["logits"] = (logit_got, logit_want)
    for name, (a, b) in pairs.items():
        seen[f"{name} prefill={prefill}"] = {
            "device": a.device.type,
            "relative": ((a.cpu().float() - b.float()).abs().max() / b.float().abs().max()).item(),
            "changed": (a.cpu() != (y if name == "linear" else emb_y if name == "embedding" else logits)).any(1).tolist(),
        }
print(json.dumps(seen))
"""


@needs_backend
@pytest.mark.skipif(VLLM is None, reason="needs vllm (installed by the upstream stack sessions)")
@pytest.mark.skipif(
    not LAID_OUT,
    reason=f"vllm-ascend {RELEASE} is not laid out here (python -m npu_compat.testing vllm-ascend)",
)
def test_the_released_punica_wrapper_npu_runs_lora_on_npu_tensors() -> None:
    """The released ``PunicaWrapperNPU`` on a simulated Ascend, ``npu`` tensors, through the released
    ``lora_ops.py``: LoRA on a merged linear layer (sgmv in prefill, bgmv in decode, each slice through the
    ``*_expand_slice`` ops), on the embedding (``*_expand``) and on the logits (``bgmv_shrink`` +
    ``bgmv_expand``) equals vLLM's ``PunicaWrapperCPU`` on the torch ops, the token and the request without an
    adapter left as they were."""
    env = sim_env(1, VLLM_ASCEND_ENABLE_NZ="0")
    proc = run_py(PUNICA_NPU, env=env, pythonpath=[str(p) for p in _sites.sites(env)], timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]  # vLLM logs after it
    assert lines, f"no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    seen = json.loads(lines[-1])
    assert RELEASE is not None and seen.pop("lora_ops").startswith(
        str(_vllm_ascend_release.layout_dir(RELEASE))
    )
    assert sorted(seen) == [
        "embedding prefill=False", "embedding prefill=True", "linear prefill=False", "linear prefill=True",
        "logits prefill=False",
    ]  # fmt: skip
    for name, case in seen.items():
        assert case["device"] == "npu", name
        assert case["relative"] < 2e-2, (name, case)  # bfloat16: vLLM's torch ops round more often
        # token 2 (adapter id 0) has no LoRA; for the logits, the second request
        assert case["changed"] == (
            [True, False, True, True] if name.startswith("logits") else [True] * 2 + [False] + [True] * 4
        ), (name, case)
