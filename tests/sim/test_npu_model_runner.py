"""The vllm-ascend stand-in's ``NPUModelRunner`` generating under vLLM's own engine, on a simulated Ascend.

One vLLM engine (``LLM(model=<tiny Qwen2>, enforce_eager=True)``, the engine core and the
worker each in its own process, with async scheduling, as Trinity runs it) is started once for
the module, in a fresh interpreter on a simulated
Ascend host whose vLLM platform plugin is the stand-in ``vllm_ascend`` (declared by its simulated
distribution, as the real wheel declares it).  The child prints what it saw; each
test checks one part against transformers computing on the same model directory.
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
    # the stand-in runner's own checks (2-4 minutes, mostly its engine's start), by hand for CI's time: in CI
    # stack a's whole run generates on it, syncs weights with equal digests and logs its KV cache, and stack
    # c's real-package tests check generation, logprobs and sleep on the release's own runner
    pytest.mark.beyond_ci,
]


ENGINE = r"""
import json, os, sys, tempfile
import torch
from tests.e2e.tiny_model import make_tiny_model

work = tempfile.mkdtemp()
tiny = make_tiny_model(os.path.join(work, "tiny"))

# New weights for the update: the same architecture, another seed and a wider initialisation (the
# tiny model's own weights are so small that greedy decoding repeats the last token), as a state dict.
from transformers import AutoConfig, Qwen2ForCausalLM
config = AutoConfig.from_pretrained(tiny)
config.initializer_range = 0.5
torch.manual_seed(1)
updated = Qwen2ForCausalLM(config).eval()
new_weights = os.path.join(work, "new_weights.pt")
torch.save(updated.state_dict(), new_weights)

from vllm import LLM, SamplingParams
# the multiprocess executor with async scheduling, as Trinity runs vLLM (worker in its own process)
llm = LLM(model=str(tiny), enforce_eager=True, dtype="float32", max_model_len=64, seed=0,
          gpu_memory_utilization=0.3, enable_sleep_mode=True, distributed_executor_backend="mp",
          async_scheduling=True)
prompts = [[5, 6, 7, 8], [11, 12, 13], [20, 21, 22, 23, 24, 25]]
out = {"prompts": prompts}

def generate(params):
    return [[list(c.token_ids) for c in r.outputs] for r in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]

out["greedy"] = generate(SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))

res = llm.generate([{"prompt_token_ids": prompts[0]}], SamplingParams(
    temperature=0, max_tokens=4, ignore_eos=True, logprobs=3, prompt_logprobs=2), use_tqdm=False)[0]
out["logprobs"] = [{str(t): lp.logprob for t, lp in step.items()} for step in res.outputs[0].logprobs]
out["logprob_tokens"] = list(res.outputs[0].token_ids)
out["prompt_logprobs"] = [None if s is None else {str(t): lp.logprob for t, lp in s.items()}
                          for s in res.prompt_logprobs]

sampled = SamplingParams(n=2, temperature=1.0, top_p=0.9, top_k=20, seed=1234, max_tokens=12, ignore_eos=True)
out["n2_first"] = generate(sampled)
out["n2_again"] = generate(sampled)
out["n2_other_seed"] = generate(SamplingParams(n=2, temperature=1.0, top_p=0.9, top_k=20, seed=99,
                                               max_tokens=12, ignore_eos=True))

def param_numel(worker):
    return sum(p.numel() for p in worker.model_runner.model.parameters())

out["numel"] = llm.collective_rpc(param_numel)[0]
llm.sleep(level=1)
out["numel_asleep"] = llm.collective_rpc(param_numel)[0]
llm.wake_up()
out["greedy_after_sleep1"] = generate(SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))

class FileEngine:  # transport harness: hands the worker the (name, tensor) pairs of a saved state dict
    def parse_update_info(self, info):
        return info
    def receive_weights(self, update_info, load_weights):
        load_weights(list(torch.load(update_info["path"]).items()))
    def shutdown(self):
        pass

def update_weights(worker, path):
    # the worker's own weight-update path (vllm-ascend 0.23.0.post1), checkpoint format: vLLM's layerwise reload
    worker = worker.worker  # the NPUWorker inside vLLM's WorkerWrapperBase
    worker.weight_transfer_engine = FileEngine()
    worker.start_weight_update(is_checkpoint_format=True)
    worker.update_weights({"path": path})
    worker.finish_weight_update()
    return param_numel(worker)

llm.sleep(level=2)   # level 2 keeps no copy: the update brings the weights
llm.wake_up()
out["numel_after_update"] = llm.collective_rpc(update_weights, args=(new_weights,))[0]
out["greedy_updated"] = generate(SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
out["new_weights"] = new_weights
out["tiny"] = str(tiny)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def engine() -> dict[str, Any]:
    result: dict[str, Any] = vllm_engine_json(ENGINE, timeout=900)
    return result


def _hf(path: str, state_dict_path: str | None = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if state_dict_path is not None:
        model.load_state_dict(torch.load(state_dict_path))
    return model


def _hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """``generate(do_sample=False)`` for ``n`` tokens, past the end-of-text token (vLLM's ``ignore_eos``)."""
    import torch

    model.generation_config.eos_token_id = None  # the model directory's generation config names one
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
    assert out.shape[1] == len(prompt) + n
    return [int(t) for t in out[0, len(prompt) :]]


def test_greedy_output_equals_transformers_generate(engine: dict[str, Any]) -> None:
    model = _hf(engine["tiny"])
    expected = [[_hf_greedy(model, p, 10)] for p in engine["prompts"]]
    assert engine["greedy"] == expected


def test_logprobs_are_log_softmax_of_the_models_logits(engine: dict[str, Any]) -> None:
    import torch

    model = _hf(engine["tiny"])
    prompt, tokens = engine["prompts"][0], engine["logprob_tokens"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    assert len(engine["logprobs"]) == len(tokens) == 4
    for step, (token, got) in enumerate(zip(tokens, engine["logprobs"], strict=True)):
        row = logprobs[len(prompt) - 1 + step]
        top3 = {int(t) for t in row.topk(3).indices}
        assert {int(t) for t in got} >= top3 and int(token) in {int(t) for t in got}
        for t, value in got.items():
            assert value == pytest.approx(float(row[int(t)]), rel=1e-4, abs=1e-6)
    # prompt logprobs: none for the first token, then each prompt token under the preceding logits
    assert engine["prompt_logprobs"][0] is None
    for i, got in enumerate(engine["prompt_logprobs"][1:], start=1):
        assert str(prompt[i]) in got
        for t, value in got.items():
            assert value == pytest.approx(float(logprobs[i - 1][int(t)]), rel=1e-4, abs=1e-6)


def test_n_samples_with_a_seed_are_reproducible(engine: dict[str, Any]) -> None:
    first = engine["n2_first"]
    assert all(len(samples) == 2 and all(len(s) == 12 for s in samples) for samples in first)
    assert engine["n2_again"] == first  # same seed, same samples
    # the children get different seeds (seed + index): their samples differ somewhere
    assert any(samples[0] != samples[1] for samples in first)
    assert engine["n2_other_seed"] != first


def test_sleep_releases_the_weights_and_wake_up_restores_them(engine: dict[str, Any]) -> None:
    assert engine["numel"] > 0 and engine["numel_asleep"] == 0
    assert engine["greedy_after_sleep1"] == engine["greedy"]


def test_a_weight_update_through_the_worker_changes_the_output_to_the_new_weights(
    engine: dict[str, Any],
) -> None:
    model = _hf(engine["tiny"], engine["new_weights"])
    expected = [[_hf_greedy(model, p, 10)] for p in engine["prompts"]]
    assert engine["numel_after_update"] == engine["numel"]
    assert engine["greedy_updated"] == expected
    assert engine["greedy_updated"] != engine["greedy"]
