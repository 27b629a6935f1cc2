"""triton-ascend on the simulated Ascend host: its own NPU driver decides it is active, and the real kernels
of vLLM and vllm-ascend compute on ``npu`` tensors in Triton's interpreter what plain torch computes."""

from __future__ import annotations

import importlib.util

import pytest

from npu_compat.testing import _sites, _vllm_ascend_release
from tests.conftest import last_json, run_py
from tests.sim.npu_backend import needs_backend, sim_env

VLLM = _sites.installed_vllm()
RELEASE = _sites.vllm_ascend_release(VLLM) if VLLM else None

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None,
        reason="needs triton-ascend (installed by the stack sessions, npu_compat/stacks/ascend-host)",
    ),
    pytest.mark.skipif(VLLM is None, reason="needs vllm (installed by the upstream stack sessions)"),
    pytest.mark.skipif(
        RELEASE is not None and not _vllm_ascend_release.is_laid_out(RELEASE),
        reason=f"vllm-ascend {RELEASE} is not laid out here (`python -m npu_compat.testing vllm-ascend`)",
    ),
]

KERNELS = """
import json, shutil, subprocess
import torch
from vllm.triton_utils import HAS_TRITON
import triton
from triton.runtime import driver
target = driver.active.get_current_target()
out = {"has_triton": HAS_TRITON, "target": [target.backend, target.arch],
       "properties": driver.active.utils.get_device_properties(0)}
compile_ = subprocess.run([shutil.which("bisheng"), "-c", "kernel.cpp"], capture_output=True, text=True)
out["compile"] = [compile_.returncode, compile_.stderr]

# vLLM's slot mapping (v1/worker/block_table.py, from vLLM 0.23), which vllm-ascend's runner launches every step
try:
    from vllm.v1.worker.block_table import _compute_slot_mapping_kernel
except ImportError:  # vLLM 0.18 computes it in torch
    _compute_slot_mapping_kernel = None
out["slots"] = None
dev, block = "npu:0", 16
if _compute_slot_mapping_kernel is not None:
    starts = torch.tensor([0, 5, 6, 20], dtype=torch.int32, device=dev)
    positions = torch.cat([torch.arange(0, 5), torch.arange(30, 31), torch.arange(2, 16)]).to(dev)
    table = torch.randint(0, 100, (8, 10), dtype=torch.int32).to(dev)
    slots = torch.full((64,), 7, dtype=torch.int64, device=dev)
    _compute_slot_mapping_kernel[(4,)](20, 64, starts, positions, table, table.stride(0), block, slots,
        TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024)
    request = torch.repeat_interleave(torch.arange(3), torch.tensor([5, 1, 14]))
    p = positions.cpu()
    reference = table.cpu()[request, p // block].long() * block + p % block
    out["slots"] = [slots.device.type, torch.equal(slots[:20].cpu(), reference),
                    bool((slots[20:].cpu() == -1).all())]

# vllm-ascend's rotary embedding (ops/triton/rope.py, AscendRotaryEmbedding's path where Triton is found), NeoX
from vllm_ascend.ops.triton.triton_utils import init_device_properties_triton
from vllm_ascend.ops.triton.rope import rope_forward_triton
init_device_properties_triton()
tokens, heads, kv_heads, dim = 5, 4, 2, 64
q = torch.randn(tokens, heads, dim, device=dev)
k = torch.randn(tokens, kv_heads, dim, device=dev)
cache = torch.randn(100, dim, device=dev)
where = torch.tensor([0, 3, 7, 50, 99], device=dev)
q_ref, k_ref = q.cpu(), k.cpu()
q_out, k_out = rope_forward_triton(q, k, cos_sin_cache=cache, positions=where, rope_dim=dim, is_neox_style=True)
cos, sin = cache.cpu()[where.cpu()].chunk(2, -1)
def rotated(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * cos[:, None] - x2 * sin[:, None], x2 * cos[:, None] + x1 * sin[:, None]], -1)
out["rope"] = [q_out.device.type, torch.allclose(q_out.cpu(), rotated(q_ref), atol=1e-5),
               torch.allclose(k_out.cpu(), rotated(k_ref), atol=1e-5)]

# the same kernel captured in an ACL graph (vllm-ascend's graph mode): a replay reruns it on what the captured
# memory now holds, as the device reruns a kernel's launch
graph = torch.npu.NPUGraph()
with torch.npu.graph(graph):
    rope_forward_triton(q, k, cos_sin_cache=cache, positions=where, rope_dim=dim, is_neox_style=True)
q_ref, k_ref = torch.randn(tokens, heads, dim), torch.randn(tokens, kv_heads, dim)
q.copy_(q_ref)
k.copy_(k_ref)
graph.replay()
out["graph"] = [[t.name for t in graph._recording.tasks if "triton" in t.name],
                torch.allclose(q.cpu(), rotated(q_ref), atol=1e-5), torch.allclose(k.cpu(), rotated(k_ref), atol=1e-5)]
print(json.dumps(out))
"""


@needs_backend
def test_the_real_kernels_run_in_the_interpreter_on_npu_tensors() -> None:
    env = sim_env(1)
    seen = last_json(run_py(KERNELS, env=env, pythonpath=[str(p) for p in _sites.sites(env)], timeout=300))
    # triton-ascend's NPUDriver is active (the simulated toolkit's bisheng answers its probe), and vLLM finds Triton
    assert seen["has_triton"] is True
    assert seen["target"] == ["npu", "Ascend910B3"]
    # 20 AI cores for a 910B3, and triton-ascend's own NPUUtils makes twice as many vector cores of them
    assert seen["properties"] == {"max_shared_mem": 1, "num_aicore": 20, "num_vectorcore": 40}
    assert seen["compile"][0] == 1 and "SimulatedComputeBoundary" in seen["compile"][1]
    assert seen["slots"] == (["npu", True, True] if RELEASE == "0.23.0.post1" else None)
    assert seen["rope"] == ["npu", True, True]
    # captured, the launch is one task of the graph, and the replay rotates the new q and k
    assert seen["graph"] == [["triton kernel _triton_rope"], True, True]


def test_outside_the_simulation_triton_ascend_has_no_active_driver() -> None:
    """A host without CANN's compiler (a CPU or CUDA machine with triton-ascend installed): its driver is not
    active and vLLM goes without Triton, as it did before."""
    code = "import json; from vllm.triton_utils import HAS_TRITON; print(json.dumps(HAS_TRITON))"
    assert last_json(run_py(code, timeout=120)) is False
