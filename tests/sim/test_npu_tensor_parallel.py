"""Tensor parallelism that computes: the stand-in ``NPUModelRunner`` at ``tensor_parallel_size=2`` under vLLM's engine.

One child on a simulated Ascend host with two NPUs starts ``LLM(tensor_parallel_size=2)`` -- vLLM's
multiprocess executor with one ``NPUWorker`` per rank on its own ``npu:N``, the TP group over the
simulated ``hccl`` -- and then the same model at TP 1, each with Trinity's rollout defaults
(``enforce_eager`` off, prefix caching and chunked prefill on).  What it reports is checked here:
each rank holds its shard (its slice of the full tensors), collectives ran over HCCL, and the greedy
tokens of TP 2 equal those of TP 1 -- also after a weight update of full tensors, which each rank
loads as its slice.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.sim.npu_backend import vllm_engine_json
from tests.sim.test_vllm_ascend_standins import V023, VLLM_VERSION

pytestmark = [
    pytest.mark.skipif(VLLM_VERSION is None, reason="needs vllm (installed by the upstream stack sessions)"),
    pytest.mark.skipif(not V023, reason="the runner is checked with vLLM 0.23 (stacks a and b) only"),
    pytest.mark.many_processes,  # vLLM's engine core and its worker processes (npu_backend.vllm_engine_run)
    # the stand-in's TP 2 (3 minutes, mostly its engines' start), by hand for CI's time, like the rollout shapes
    # that use it (tests/e2e/test_rollout_shapes.py): CI runs TP 2 on the real vllm-ascend (stack c, vLLM's mp
    # and Ray executors, tokens equal to transformers')
    pytest.mark.beyond_ci,
]

ENGINES = r"""
import gc, json, os, sys, tempfile
import torch
from tests.e2e.tiny_model import make_tiny_model

work = tempfile.mkdtemp()
tiny = make_tiny_model(os.path.join(work, "tiny"), heads=4, kv_heads=2, initializer_range=0.5)
from transformers import AutoConfig, Qwen2ForCausalLM
config = AutoConfig.from_pretrained(tiny)
config.initializer_range = 0.5
torch.manual_seed(1)
new_weights = os.path.join(work, "new_weights.pt")
torch.save(Qwen2ForCausalLM(config).state_dict(), new_weights)

from vllm import LLM, SamplingParams
from vllm.distributed import get_tp_group
from npu_compat.testing._digest import digest_of
from npu_compat.testing._tensor_parallel import shard_of

prompts = [[5, 6, 7, 8], [11, 12, 13], [20, 21, 22, 23, 24, 25]]
greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

def rank_view(worker):
    runner = worker.model_runner
    group = get_tp_group()
    return {
        "rank": group.rank_in_group, "world": group.world_size, "device": str(runner.placement),
        "backend": torch.distributed.get_backend(group.device_group),
        "shapes": {n: list(p.shape) for n, p in runner.model.named_parameters()},
        "kv_heads": next(iter(runner.get_kv_cache_spec().values())).num_kv_heads,
    }

def shard_digests(worker, path):
    model = worker.model_runner.model
    state = torch.load(path)
    params = dict(model.named_parameters(remove_duplicate=False))
    names = [n for n in state if n in params]
    return {"held": digest_of((n, params[n]) for n in names),
            "slice": digest_of((n, shard_of(model, n, state[n])) for n in names)}

class FileEngine:  # transport harness: hands the worker the (name, tensor) pairs of a saved state dict
    def parse_update_info(self, info):
        return info
    def receive_weights(self, update_info, load_weights):
        load_weights(list(torch.load(update_info["path"]).items()))
    def shutdown(self):
        pass

def update_weights(worker, path):
    worker = worker.worker
    worker.weight_transfer_engine = FileEngine()
    worker.start_weight_update(is_checkpoint_format=True)
    worker.update_weights({"path": path})
    worker.finish_weight_update()

def generate(llm):
    return [list(r.outputs[0].token_ids) for r in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)]

out = {}
for tp in (2, 1):
    # Trinity's rollout defaults: enforce_eager off, prefix caching and chunked prefill on
    llm = LLM(model=str(tiny), tensor_parallel_size=tp, dtype="float32", max_model_len=64, seed=0,
              gpu_memory_utilization=0.3, distributed_executor_backend="mp", enforce_eager=False,
              enable_prefix_caching=True, enable_chunked_prefill=True)
    out[f"greedy_tp{tp}"] = generate(llm)
    # the same prompts again: served from the prefix cache, the same tokens
    out[f"greedy_tp{tp}_cached"] = generate(llm)
    if tp == 2:
        out["ranks"] = llm.collective_rpc(rank_view)
        llm.collective_rpc(update_weights, args=(new_weights,))
        out["shards_after_update"] = llm.collective_rpc(shard_digests, args=(new_weights,))
    else:
        llm.collective_rpc(update_weights, args=(new_weights,))
    out[f"updated_tp{tp}"] = generate(llm)
    del llm
    gc.collect()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def engines() -> dict[str, Any]:
    result: dict[str, Any] = vllm_engine_json(ENGINES, timeout=900)
    return result


def test_each_rank_is_a_worker_on_its_own_npu_in_an_hccl_group(engines: dict[str, Any]) -> None:
    ranks = engines["ranks"]
    assert [(r["rank"], r["world"], r["device"], r["backend"]) for r in ranks] == [
        (0, 2, "npu:0", "hccl"),
        (1, 2, "npu:1", "hccl"),
    ]


def test_each_rank_holds_its_shard(engines: dict[str, Any]) -> None:
    shapes = [r["shapes"] for r in engines["ranks"]]
    # 4 query heads of 8 and 2 KV heads: one KV head per rank, half of the MLP, half of the padded vocabulary
    for rank in shapes:
        assert rank["model.layers.0.self_attn.q_proj.weight"] == [16, 32]
        assert rank["model.layers.0.self_attn.k_proj.weight"] == [8, 32]
        assert rank["model.layers.0.self_attn.o_proj.weight"] == [32, 16]
        assert rank["model.layers.0.mlp.up_proj.weight"] == [32, 32]  # 64 of the MLP's rows, halved
        assert rank["model.layers.0.mlp.down_proj.weight"] == [32, 32]  # and its columns
        assert rank["model.embed_tokens.weight"][0] % 32 == 0
    assert [r["kv_heads"] for r in engines["ranks"]] == [1, 1]
    # after a weight update of full tensors, each rank holds exactly its slice of them
    for rank in engines["shards_after_update"]:
        assert rank["held"] == rank["slice"]
    assert engines["shards_after_update"][0]["held"] != engines["shards_after_update"][1]["held"]


def test_greedy_tokens_at_tp2_equal_tp1(engines: dict[str, Any]) -> None:
    assert engines["greedy_tp2"] == engines["greedy_tp1"]
    assert engines["greedy_tp2_cached"] == engines["greedy_tp2"]
    assert len({tuple(t) for t in engines["greedy_tp1"]}) > 1  # the prompts give different answers


def test_a_weight_update_of_full_tensors_gives_tp2_the_tokens_of_tp1(engines: dict[str, Any]) -> None:
    assert engines["updated_tp2"] == engines["updated_tp1"]
    assert engines["updated_tp2"] != engines["greedy_tp2"]
