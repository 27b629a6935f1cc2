"""The torch_npu fused kernels the simulation computes, against references computed independently.

The kernels (``npu_compat.testing._npu_kernels``) are checked in this process against torch's own
``scaled_dot_product_attention`` and formulas written out here; the simulated ``torch_npu`` and
the callers -- transformers' ``flash_attention_2`` on Ascend, verl's NPU patches -- are checked in
fresh simulated-Ascend interpreters (transformers decides ``is_torch_npu_available()`` once).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.sim.npu_backend import sim_json, sim_run

#: exercises verl: stack-b (stack-a with another verl) runs it (noxfile)
pytestmark = pytest.mark.uses_verl

torch = pytest.importorskip("torch", reason="needs torch (installed by the upstream stack sessions)")
F = torch.nn.functional

from npu_compat.testing._boundary import SimulatedComputeBoundary  # noqa: E402
from npu_compat.testing._npu_kernels import (  # noqa: E402
    KERNELS,
    npu_cross_entropy_loss,
    npu_fusion_attention,
    npu_rms_norm,
    npu_rotary_mul,
    npu_swiglu,
)

CAUSAL_2048 = torch.triu(torch.ones(2048, 2048), diagonal=1).bool()  # transformers' get_attn_mask_npu


def qkv(b: int, sq: int, skv: int, n: int, nkv: int, d: int, grad: bool = False) -> tuple[Any, Any, Any]:
    gen = torch.Generator().manual_seed(b * 1000 + sq * 100 + skv * 10 + n)
    make = lambda s, h: torch.randn(b, h, s, d, generator=gen, dtype=torch.float64, requires_grad=grad)  # noqa: E731
    return make(sq, n), make(skv, nkv), make(skv, nkv)  # BNSD, float64


def sdpa(q: Any, k: Any, v: Any, scale: float, keep: Any = None, causal: bool = False) -> Any:
    """The reference: torch's SDPA on BNSD, kv heads repeated for GQA; ``keep`` True = attend."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal, scale=scale)


def positions(sq: int, skv: int) -> tuple[Any, Any]:
    return torch.arange(sq).unsqueeze(-1), torch.arange(skv).unsqueeze(0)


# --------------------------------------------------------------------------- npu_fusion_attention


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "SBH"])
def test_fusion_attention_layouts_with_gqa_equal_sdpa(layout: str) -> None:
    b, s, n, nkv, d = 2, 6, 4, 2, 8
    q, k, v = qkv(b, s, s, n, nkv, d)
    to = {
        "BNSD": lambda x: x,
        "BSND": lambda x: x.transpose(1, 2),
        "BSH": lambda x: x.transpose(1, 2).flatten(2),
        "SBH": lambda x: x.transpose(1, 2).flatten(2).transpose(0, 1),
    }[layout]
    out, smax, ssum, sout, seed, offset, numels = npu_fusion_attention(
        to(q), to(k), to(v), n, layout, scale=0.3
    )
    assert out.shape == to(q).shape and out.dtype == q.dtype
    torch.testing.assert_close(out, to(sdpa(q, k, v, 0.3)))
    assert smax.shape == ssum.shape == (b, n, s, 8) and smax.dtype == torch.float32
    assert sout.numel() == 0 and (seed, offset, numels) == (0, 0, 0)


@pytest.mark.parametrize(("sq", "skv"), [(5, 5), (3, 7), (7, 3)])
def test_fusion_attention_causal_sparse_modes_2_and_3(sq: int, skv: int) -> None:
    q, k, v = qkv(1, sq, skv, 2, 1, 4)
    i, j = positions(sq, skv)
    for mode, keep in ((2, j <= i), (3, j <= i + (skv - sq))):
        out = npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=CAUSAL_2048, scale=0.5, sparse_mode=mode)[0]
        rows = keep.any(-1)  # rows with no key (mode 3, Sq > Skv) give zeros, as flash attention
        torch.testing.assert_close(out[:, :, rows], sdpa(q, k, v, 0.5, keep)[:, :, rows])
        assert torch.equal(out[:, :, ~rows], torch.zeros_like(out[:, :, ~rows]))
    if sq == skv:  # both are torch's is_causal when the sequences are equally long
        ref = sdpa(q, k, v, 0.5, causal=True)
        torch.testing.assert_close(
            npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=CAUSAL_2048, scale=0.5, sparse_mode=3)[0], ref
        )


def test_fusion_attention_explicit_mask_and_bands() -> None:
    b, sq, skv, n = 2, 6, 8, 2
    q, k, v = qkv(b, sq, skv, n, n, 4)
    gen = torch.Generator().manual_seed(7)
    masked = torch.rand(b, 1, sq, skv, generator=gen) < 0.4
    masked[..., 0] = False  # every row keeps a key
    for mode in (0, 1):  # B1SS mask, True = masked out
        out = npu_fusion_attention(q, k, v, n, "BNSD", atten_mask=masked, scale=0.25, sparse_mode=mode)[0]
        torch.testing.assert_close(out, sdpa(q, k, v, 0.25, ~masked))
    i, j = positions(sq, skv)
    no_mask = torch.zeros(sq, skv, dtype=torch.bool)
    # sparse_mode 0: the band [i - pre, i + next] from the top left, on top of atten_mask
    out = npu_fusion_attention(
        q, k, v, n, "BNSD", atten_mask=no_mask, scale=0.25, pre_tockens=2, next_tockens=1
    )[0]
    torch.testing.assert_close(out, sdpa(q, k, v, 0.25, (j - i <= 1) & (i - j <= 2)))
    # sparse_mode 4: the band counted from the bottom right, with the compressed mask
    shift = skv - sq
    out = npu_fusion_attention(
        q, k, v, n, "BNSD", atten_mask=CAUSAL_2048, scale=0.25, pre_tockens=3, next_tockens=0, sparse_mode=4
    )[0]
    torch.testing.assert_close(out, sdpa(q, k, v, 0.25, (j - i - shift <= 0) & (i + shift - j <= 3)))
    # without atten_mask torch_npu computes everything, whatever sparse_mode says
    out = npu_fusion_attention(q, k, v, n, "BNSD", scale=0.25, sparse_mode=3)[0]
    torch.testing.assert_close(out, sdpa(q, k, v, 0.25))


def test_fusion_attention_pse_is_added_before_the_scale() -> None:
    q, k, v = qkv(1, 4, 4, 2, 2, 4)
    pse = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    scores = (q @ k.transpose(-1, -2) + pse) * 0.5  # the documented scale * (pse + q k^T)
    ref = torch.softmax(scores, -1) @ v
    torch.testing.assert_close(npu_fusion_attention(q, k, v, 2, "BNSD", pse=pse, scale=0.5)[0], ref)


def test_fusion_attention_softmax_max_and_sum_are_the_rows_statistics() -> None:
    q, k, v = qkv(2, 5, 5, 4, 2, 8)
    _, smax, ssum, *_ = npu_fusion_attention(
        q, k, v, 4, "BNSD", atten_mask=CAUSAL_2048, scale=0.2, sparse_mode=2
    )
    scores = 0.2 * q @ k.repeat_interleave(2, 1).transpose(-1, -2)
    scores = scores.masked_fill(torch.triu(torch.ones(5, 5, dtype=torch.bool), 1), float("-inf"))
    assert torch.equal(smax, smax[..., :1].expand_as(smax))  # the 8 slots repeat one value
    torch.testing.assert_close(smax[..., 0], scores.amax(-1).float())
    # torch_npu's own conversion (its context-parallel attention): lse = max + log(sum)
    lse = smax[..., 0] + torch.log(ssum[..., 0])
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1).float())


def tnd(lengths: list[int], n: int, d: int, grad: bool = False, seed: int = 3) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(sum(lengths), n, d, generator=gen, dtype=torch.float64, requires_grad=grad)


@pytest.mark.parametrize("causal", [False, True])
def test_fusion_attention_varlen_tnd_equals_sdpa_per_sequence(causal: bool) -> None:
    lengths = [3, 1, 5, 0, 4]  # a sequence of length 0 is allowed
    n, nkv, d = 4, 2, 8
    q, k, v = tnd(lengths, n, d, seed=1), tnd(lengths, nkv, d, seed=2), tnd(lengths, nkv, d, seed=3)
    cum = torch.tensor(lengths).cumsum(0).tolist()
    kwargs: dict[str, Any] = {"atten_mask": CAUSAL_2048, "sparse_mode": 3} if causal else {}
    out, smax, ssum, *_ = npu_fusion_attention(
        q,
        k,
        v,
        n,
        input_layout="TND",
        scale=0.3,
        actual_seq_qlen=tuple(cum),
        actual_seq_kvlen=tuple(cum),
        **kwargs,
    )
    assert out.shape == q.shape and smax.shape == ssum.shape == (sum(lengths), n, 8)
    start = 0
    for length in lengths:
        if length:
            q_, k_, v_ = (x[start : start + length].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            ref = sdpa(q_, k_, v_, 0.3, causal=causal)[0].transpose(0, 1)
            torch.testing.assert_close(out[start : start + length], ref)
        start += length


def test_fusion_attention_varlen_trailing_batches_and_kv_longer_than_q() -> None:
    # torch_npu: trailing zeros in actual_seq_qlen/kvlen are batches that do not take part
    q, k, v = tnd([2, 3], 2, 4, seed=1), tnd([4, 3], 2, 4, seed=2), tnd([4, 3], 2, 4, seed=3)
    out = npu_fusion_attention(
        q, k, v, 2, "TND", atten_mask=CAUSAL_2048, scale=0.5,
        actual_seq_qlen=[2, 5, 0, 0], actual_seq_kvlen=[4, 7, 0, 0], sparse_mode=3,
    )[0]  # fmt: skip
    i, j = positions(2, 4)
    first = sdpa(
        q[:2].transpose(0, 1)[None], k[:4].transpose(0, 1)[None], v[:4].transpose(0, 1)[None], 0.5, j <= i + 2
    )
    torch.testing.assert_close(out[:2], first[0].transpose(0, 1))
    second = sdpa(
        q[2:].transpose(0, 1)[None],
        k[4:].transpose(0, 1)[None],
        v[4:].transpose(0, 1)[None],
        0.5,
        causal=True,
    )
    torch.testing.assert_close(out[2:], second[0].transpose(0, 1))


def test_fusion_attention_gradients_equal_sdpa() -> None:
    q, k, v = qkv(2, 6, 6, 4, 2, 8, grad=True)
    dy = torch.randn(2, 6, 4, 8, dtype=torch.float64)
    out = npu_fusion_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 4, "BSND",
        atten_mask=CAUSAL_2048, scale=0.35, sparse_mode=3,
    )[0]  # fmt: skip
    mine = torch.autograd.grad(out, (q, k, v), dy)
    ref = torch.autograd.grad(sdpa(q, k, v, 0.35, causal=True).transpose(1, 2), (q, k, v), dy)
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a, b)
    # and through the varlen path
    lengths = [2, 4]
    q, k, v = tnd(lengths, 2, 4, True, 1), tnd(lengths, 1, 4, True, 2), tnd(lengths, 1, 4, True, 3)
    out = npu_fusion_attention(q, k, v, 2, "TND", atten_mask=CAUSAL_2048, scale=0.5,
                               actual_seq_qlen=[2, 6], actual_seq_kvlen=[2, 6], sparse_mode=3)[0]  # fmt: skip
    mine = torch.autograd.grad(out.square().sum(), (q, k, v))
    refs = [
        sdpa(
            x[a:b].transpose(0, 1)[None],
            y[a:b].transpose(0, 1)[None],
            z[a:b].transpose(0, 1)[None],
            0.5,
            causal=True,
        )
        for x, y, z, (a, b) in [(q, k, v, (0, 2)), (q, k, v, (2, 6))]
    ]
    ref = torch.autograd.grad(sum(r.square().sum() for r in refs), (q, k, v))
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a, b)


def test_fusion_attention_half_precision_keeps_the_dtype() -> None:
    q, k, v = (x.to(torch.bfloat16) for x in qkv(1, 8, 8, 2, 2, 16))
    out, smax, *_ = npu_fusion_attention(
        q, k, v, 2, "BNSD", atten_mask=CAUSAL_2048, scale=0.25, sparse_mode=2
    )
    assert out.dtype == torch.bfloat16 and smax.dtype == torch.float32
    ref = sdpa(q.double(), k.double(), v.double(), 0.25, causal=True)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_fusion_attention_what_it_does_not_compute_is_named() -> None:
    q, k, v = qkv(1, 4, 4, 2, 2, 4)
    with pytest.raises(SimulatedComputeBoundary, match=r"torch_npu\.npu_fusion_attention\(keep_prob=0\.9\)"):
        npu_fusion_attention(q, k, v, 2, "BNSD", keep_prob=0.9)
    with pytest.raises(SimulatedComputeBoundary, match="sparse_mode=6"):
        npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=CAUSAL_2048, sparse_mode=6)
    # sparse modes 2-4 read the compressed 2048x2048 mask; a full-size causal mask is a caller's error
    with pytest.raises(ValueError, match="2048x2048"):
        npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=torch.ones(4, 4).triu(1).bool(), sparse_mode=3)
    with pytest.raises(ValueError, match="differs"):
        npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=~CAUSAL_2048, sparse_mode=2)
    # a mask checked once is not checked again, unless it changed in place
    mask = CAUSAL_2048.clone()
    npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=mask, sparse_mode=2)
    mask[0, 1] = False
    with pytest.raises(ValueError, match="differs"):
        npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=mask, sparse_mode=2)


# --------------------------------------------------------------------------- rms_norm, rotary, swiglu, cross entropy


def test_rms_norm_equals_the_formula_and_its_rstd() -> None:
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    gamma = torch.randn(16, dtype=torch.float64, requires_grad=True)
    y, rstd = npu_rms_norm(x, gamma, epsilon=1e-5)
    ref_rstd = 1.0 / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(y, x * ref_rstd * gamma)
    assert rstd.shape == (3, 5, 1) and rstd.dtype == torch.float32  # the meta registration's shape
    torch.testing.assert_close(rstd, ref_rstd.float())
    mine = torch.autograd.grad(y.sum(), (x, gamma))
    ref = torch.autograd.grad((x * ref_rstd * gamma).sum(), (x, gamma))
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a, b)
    # gamma of two dims normalises over the last two
    y2, rstd2 = npu_rms_norm(x.detach(), torch.ones(5, 16, dtype=torch.float64))
    assert rstd2.shape == (3, 1, 1)
    torch.testing.assert_close(
        y2, x.detach() / torch.sqrt((x.detach() ** 2).mean((1, 2), keepdim=True) + 1e-6)
    )


def test_rms_norm_equals_transformers_qwen2_rmsnorm() -> None:
    modeling_qwen2 = pytest.importorskip("transformers.models.qwen2.modeling_qwen2")
    norm = modeling_qwen2.Qwen2RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(npu_rms_norm(x, norm.weight, epsilon=1e-6)[0], norm(x))
    xb = x.to(torch.bfloat16)
    yb = npu_rms_norm(xb, norm.weight.to(torch.bfloat16))[0]
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb, norm.to(torch.bfloat16)(xb), atol=3e-2, rtol=3e-2)


def test_rotary_mul_half_equals_transformers_apply_rotary_pos_emb() -> None:
    modeling_qwen2 = pytest.importorskip("transformers.models.qwen2.modeling_qwen2")
    b, n, s, d = 2, 3, 5, 8
    q = torch.randn(b, n, s, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, 1, s, d, dtype=torch.float64)
    angle = torch.randn(b, s, d // 2, dtype=torch.float64)
    cos, sin = (
        torch.cat([angle.cos()] * 2, -1),
        torch.cat([angle.sin()] * 2, -1),
    )  # [B, S, D] as Qwen2's rotary
    ref_q, ref_k = modeling_qwen2.apply_rotary_pos_emb(q, k, cos, sin)
    # verl's apply_rotary_pos_emb_npu: cos/sin unsqueezed to B1SD, then npu_rotary_mul
    torch.testing.assert_close(npu_rotary_mul(q, cos.unsqueeze(1), sin.unsqueeze(1)), ref_q)
    torch.testing.assert_close(npu_rotary_mul(k, cos.unsqueeze(1), sin.unsqueeze(1)), ref_k)
    mine = torch.autograd.grad(npu_rotary_mul(q, cos.unsqueeze(1), sin.unsqueeze(1)).sum(), q)[0]
    torch.testing.assert_close(mine, torch.autograd.grad(ref_q.sum(), q)[0])


def test_rotary_mul_interleave_and_rotate_matrix() -> None:
    x = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    angle = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    # interleave: pairs (x[2i], x[2i+1]) rotate as complex numbers by angle i
    cos, sin = angle.cos().repeat_interleave(2, -1), angle.sin().repeat_interleave(2, -1)
    pairs = torch.view_as_complex(x.reshape(2, 3, 4, 4, 2).contiguous())
    ref = torch.view_as_real(pairs * torch.polar(torch.ones_like(angle), angle)).flatten(-2)
    torch.testing.assert_close(npu_rotary_mul(x, cos, sin, "interleave"), ref)
    # the documented rotate matrices (examples 2 and 3) reproduce the two modes
    inter = torch.zeros(8, 8, dtype=torch.float64)
    for i in range(0, 8, 2):
        inter[i, i + 1], inter[i + 1, i] = 1, 1
    half = torch.zeros(8, 8, dtype=torch.float64)
    half[:4, 4:], half[4:, :4] = torch.eye(4), -torch.eye(4)
    r1, r2 = torch.randn(1, 1, 4, 8, dtype=torch.float64), torch.randn(1, 1, 4, 8, dtype=torch.float64)
    torch.testing.assert_close(npu_rotary_mul(x, r1, r2, "half", half), npu_rotary_mul(x, r1, r2, "half"))
    torch.testing.assert_close(npu_rotary_mul(x, r1, r2, "interleave", inter), r1 * x + r2 * (x @ inter))


def test_swiglu_is_silu_of_the_first_half_times_the_second() -> None:
    gate = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    x = torch.cat((gate, up), -1)  # verl's silu_forward_npu: cat(gate_proj, up_proj)
    out = npu_swiglu(x, dim=-1)
    ref = gate * torch.sigmoid(gate) * up
    torch.testing.assert_close(out, ref)
    mine = torch.autograd.grad(out.sum(), (gate, up))
    for a, b in zip(mine, torch.autograd.grad(ref.sum(), (gate, up)), strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(npu_swiglu(torch.cat((gate, up), 1), dim=1), ref)
    assert npu_swiglu(torch.randn(2, 32, 6, 6)).shape == (2, 32, 6, 3)  # the documented example


def test_cross_entropy_loss_equals_the_log_softmax_of_the_target() -> None:
    logits = torch.randn(6, 11, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([0, 3, 10, 5, 5, 1])
    loss, log_prob, zloss, lse = npu_cross_entropy_loss(logits, target, reduction="none")
    ref = -torch.log(torch.softmax(logits, -1).gather(1, target[:, None]))[:, 0]
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(log_prob, torch.log(torch.softmax(logits, -1)))
    assert zloss.numel() == 0 and lse.numel() == 0
    mean = npu_cross_entropy_loss(logits, target)[0]
    assert mean.shape == (1,)
    torch.testing.assert_close(mean[0], ref.mean())
    torch.testing.assert_close(
        torch.autograd.grad(mean.sum(), logits)[0], torch.autograd.grad(ref.mean(), logits)[0]
    )
    with pytest.raises(SimulatedComputeBoundary, match="npu_cross_entropy_loss"):
        npu_cross_entropy_loss(logits, target, return_zloss=True)


# --------------------------------------------------------------------------- the simulated torch_npu and its callers


def test_simulated_torch_npu_serves_the_kernels_counted_and_the_rest_stays_a_boundary() -> None:
    out = sim_json(
        """
        import json, torch, torch_npu
        from torch_npu import npu_rms_norm      # importable by name, as transformers does
        from npu_compat.testing._boundary import SimulatedComputeBoundary
        x = torch.randn(2, 4)
        before = torch.npu.call_count("torch_npu.npu_rms_norm")
        y, rstd = npu_rms_norm(x, torch.ones(4))
        torch_npu.npu_rms_norm(x, torch.ones(4))
        try:
            torch_npu.npu_grouped_matmul([x], [x.T])
            unknown = "computed"
        except SimulatedComputeBoundary as e:
            unknown = str(e)
        print(json.dumps({
            "before": before, "after": torch.npu.call_count("torch_npu.npu_rms_norm"),
            "same": npu_rms_norm is torch_npu.npu_rms_norm, "y": y.tolist(),
            "ref": (x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()).tolist(),
            "unknown": unknown, "present": hasattr(torch_npu, "npu_cross_entropy_loss"),
        }))
        """
    )
    assert out["before"] == 0 and out["after"] == 2 and out["same"]
    torch.testing.assert_close(torch.tensor(out["y"]), torch.tensor(out["ref"]))
    assert out["unknown"] == "simulated Ascend: torch_npu.npu_grouped_matmul needs a real NPU"
    assert out["present"]  # verl's NPU_CROSS_ENTROPY_LOSS_AVAILABLE reads hasattr


def test_set_of_computed_kernels() -> None:
    assert set(KERNELS) == {
        "npu_fusion_attention", "npu_rms_norm", "npu_rotary_mul", "npu_swiglu", "npu_cross_entropy_loss",
    }  # fmt: skip


ATTENTION_PATH = """
import json, tempfile, torch
import transformers
from transformers.utils import is_torch_npu_available
from transformers.integrations import npu_flash_attention as integration
from tests.e2e.tiny_model import make_tiny_model
from transformers import AutoModelForCausalLM

calls = []
stand_in = integration.npu_fusion_attention   # what transformers imported from torch_npu
def spy(*args, **kwargs):
    calls.append([kwargs.get("input_layout", args[4] if len(args) > 4 else None), kwargs.get("sparse_mode", 0)])
    return stand_in(*args, **kwargs)
integration.npu_fusion_attention = spy

directory = make_tiny_model(tempfile.mkdtemp())
# flash_attention_2 on the simulated npu:0, sdpa on the CPU as the reference
fa = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="flash_attention_2", dtype=torch.float32)
fa = fa.to("npu:0")
ref = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="sdpa", dtype=torch.float32)
torch.manual_seed(1)
ids = torch.randint(0, fa.config.vocab_size, (2, 7))
npu = lambda t: t.to("npu:0")
diff = lambda a, b: (a.cpu() - b.cpu()).abs().max().item()
result = {"version": transformers.__version__, "npu": is_torch_npu_available(),
          "impl": fa.config._attn_implementation, "counted_before": torch.npu.call_count("torch_npu.npu_fusion_attention"),
          "on": str(next(fa.parameters()).device)}

a, b = fa(input_ids=npu(ids)).logits, ref(input_ids=ids).logits
result["logits_on"] = str(a.device)
result["plain"] = diff(a, b)
ga = torch.autograd.grad(a.square().mean(), list(fa.parameters()))
gb = torch.autograd.grad(b.square().mean(), list(ref.parameters()))
result["grads"] = max(diff(x, y) for x, y in zip(ga, gb))
result["plain_calls"] = list(calls); calls.clear()

mask = torch.ones(2, 7, dtype=torch.long); mask[0, :3] = 0      # left padding: the varlen path
a, b = fa(input_ids=npu(ids), attention_mask=npu(mask)).logits, ref(input_ids=ids, attention_mask=mask).logits
result["padded"] = diff(a.cpu()[mask.bool()], b[mask.bool()])
result["padded_calls"] = list(calls); calls.clear()

pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])                     # packed sequences (verl's remove-padding)
a = fa(input_ids=npu(ids[:1]), position_ids=npu(pos)).logits
b = torch.cat([ref(input_ids=ids[:1, :4]).logits, ref(input_ids=ids[:1, 4:]).logits], 1)
result["packed"] = diff(a, b)
result["packed_calls"] = list(calls)
result["counted"] = torch.npu.call_count("torch_npu.npu_fusion_attention")
result["by_layout"] = {layout: torch.npu.call_count(f"torch_npu.npu_fusion_attention[{layout}]")
                       for layout in ("BSND", "TND", "BNSD")}
print(json.dumps(result))
"""


def test_transformers_flash_attention_2_goes_through_npu_fusion_attention() -> None:
    pytest.importorskip("transformers", reason="needs transformers (the upstream stack sessions)")
    out = sim_json(ATTENTION_PATH)
    assert out["npu"] and out["impl"] == "flash_attention_2" and out["counted_before"] == 0
    assert out["on"] == "npu:0" and out["logits_on"] == "npu:0"  # the model computes on the simulated NPU
    layer = 1  # the tiny model has one decoder layer: one attention call per forward
    assert out["plain_calls"] == [["BSND", 3]] * layer  # down-right causal, the default NPU_FA2_SPARSE_MODE
    assert out["padded_calls"] == [["TND", 3]] * layer
    assert out["packed_calls"] == [["TND", 3]] * layer
    assert out["counted"] == 3 * layer
    assert out["by_layout"] == {"BSND": layer, "TND": 2 * layer, "BNSD": 0}
    assert out["plain"] <= 1e-5 and out["padded"] <= 1e-5 and out["packed"] <= 1e-5
    assert out["grads"] <= 1e-5


VERL_PATCHES = """
import json, tempfile, torch
from tests.e2e.tiny_model import make_tiny_model
from transformers import AutoModelForCausalLM
directory = make_tiny_model(tempfile.mkdtemp())
model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="sdpa", dtype=torch.float32)
torch.manual_seed(1)
ids = torch.randint(0, model.config.vocab_size, (2, 7))
stock = model(input_ids=ids).logits
stock_grads = torch.autograd.grad(stock.square().mean(), list(model.parameters()))

# verl's FSDP workers' own entry (both 0.7.1 and 0.8.0): imports npu_patch, which patches Qwen2's RMSNorm,
# MLP and RoPE first; on verl 0.7.1 with transformers 5 it then stops at Qwen2.5-VL's renamed RMSNorm and
# verl logs "Failed to apply NPU patches" -- the Qwen2 patches are in place either way
from verl.workers.engine.fsdp.utils import apply_npu_fsdp_patches
apply_npu_fsdp_patches()
from verl.utils import torch_functional
patched = model(input_ids=ids).logits
patched_grads = torch.autograd.grad(patched.square().mean(), list(model.parameters()))
count = lambda name: torch.npu.call_count("torch_npu." + name)
logprobs = torch_functional.logprobs_from_logits(patched, ids)          # verl's NPU branch
reference = torch_functional.logprobs_from_logits_v2(patched, ids)
diff = lambda a, b: (a - b).abs().max().item()
print(json.dumps({
    "logits": diff(stock, patched), "grads": max(diff(a, b) for a, b in zip(stock_grads, patched_grads)),
    "counts": {n: count(n) for n in ("npu_rms_norm", "npu_swiglu", "npu_rotary_mul", "npu_cross_entropy_loss")},
    "npu_ce": torch_functional.NPU_CROSS_ENTROPY_LOSS_AVAILABLE, "logprobs": diff(logprobs, reference),
}))
"""


def test_verl_npu_patches_compute_what_stock_qwen2_computes() -> None:
    pytest.importorskip("verl", reason="needs verl (the upstream stack sessions)")
    out = sim_json(VERL_PATCHES)
    # one decoder layer: two RMSNorms and the final one, one MLP, q and k rotated once each
    assert out["counts"] == {
        "npu_rms_norm": 3,
        "npu_swiglu": 1,
        "npu_rotary_mul": 2,
        "npu_cross_entropy_loss": 1,
    }
    assert out["logits"] <= 1e-5 and out["grads"] <= 1e-5
    assert out["npu_ce"] and out["logprobs"] <= 1e-5


COUNTS_IN_THE_REPORT = """
import json, os, signal, sys, time
import npu_compat
npu_compat.activate()
import torch, torch_npu
q = torch.randn(5, 2, 4, device="npu:0")
for _ in range(2):  # two sequences of 3 and 2 tokens, packed (TND)
    torch_npu.npu_fusion_attention(q, q, q, 2, "TND", scale=0.5, actual_seq_qlen=[3, 5], actual_seq_kvlen=[3, 5])
torch_npu.npu_fusion_attention(q[None], q[None], q[None], 2, input_layout="BSND", scale=0.5)
torch_npu.npu_rms_norm(q, torch.ones(4, device="npu:0"))
time.sleep(2.5)
print(json.dumps({"pid": os.getpid()}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as Ray ends its workers: no atexit
"""


def test_a_processs_report_holds_its_kernel_calls_even_when_it_is_killed(tmp_path: Any) -> None:
    """The report of a simulated process (``NPU_COMPAT_REPORT_DIR``) holds how often each torch_npu kernel
    was called, ``npu_fusion_attention`` also by layout, written while it runs: a SIGKILLed process's too."""
    import json
    import os

    done = sim_run(COUNTS_IN_THE_REPORT, check=False, NPU_COMPAT_REPORT_DIR=str(tmp_path))
    assert done.returncode == -9, done.stderr
    pid = json.loads(done.stdout.strip().splitlines()[-1])["pid"]
    report = json.loads((tmp_path / f"{os.uname().nodename}-{pid}.json").read_text())
    assert report["simulated"]["kernels"] == {
        "torch_npu.npu_fusion_attention": 3,
        "torch_npu.npu_fusion_attention[BSND]": 1,
        "torch_npu.npu_fusion_attention[TND]": 2,
        "torch_npu.npu_rms_norm": 1,
    }, report["simulated"]
    assert report["simulated"]["hccl"] == {}
    # its import log, written while it ran: what it imported, in order, each module once, with sys.path
    from npu_compat.tools import timeline

    log = timeline.read_imports(str(tmp_path), os.uname().nodename, pid)
    names = [name for line in log for name in line["new"]]  # type: ignore[attr-defined]
    assert {"torch", "torch_npu"} <= set(names) and len(names) == len(set(names)), names[-20:]
    assert names.index("torch") < names.index("torch_npu")
    assert isinstance(log[0]["sys_path"], list) and all("sys_path" not in line for line in log[1:])
    times = [line["t"] for line in log]
    assert times == sorted(times) and times[-1] <= report["updated"] + 3
