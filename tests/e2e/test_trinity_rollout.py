"""Trinity's rollout as Trinity's own code drives it, on the released vllm-ascend.

The Explorer builds its rollout engines and Trinity's workflows talk to them through ``ModelWrapper``.  Here a Ray
driver (``tests/e2e/rollout_driver.py``, through ``python -m npu_compat``) does the same on an NPU-only cluster of
four simulated NPUs, with the bundled config at two engines of tensor parallel 2 and the OpenAI API server on:
Trinity 0.6's ``Allocator`` (vLLM's multiprocess executor in each rollout actor), Trinity 0.5's
``create_explorer_models`` (vLLM's Ray executor).  Every engine then answers ``generate``, ``chat``, ``logprobs``
(prompt logprobs, through Trinity's own vLLM patch where it has one), ``convert_messages_to_experience`` and the
OpenAI API through the wrapper's sync and async clients; the rollout runs the released vllm-ascend paired with the
stack's vLLM, at Trinity's rollout defaults otherwise (bfloat16, graph
mode, prefix caching).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from npu_compat.testing import npu_ray_cluster
from tests.conftest import trinity_or_skip
from tests.e2e import scenario
from tests.e2e.rollout_driver import MESSAGES, PROMPT
from tests.e2e.test_trinity_run import on_the_real_vllm_ascend

TRINITY = trinity_or_skip(("0.5.", "0.6."), "Trinity's rollout engines and ModelWrapper")

pytestmark = [pytest.mark.many_processes, pytest.mark.beyond_ci]

#: the Explorer's side alone (mode ``explore``: every NPU is the rollout's), two engines of TP 2 (four NPUs), the
#: OpenAI API server on each, and ModelWrapper's history of its calls
ROLLOUT = [
    ("\nmode: both\n", "\nmode: explore\n"),
    ("  sync_method: nccl\n", "  sync_method: checkpoint\n"),
    ("    engine_num: 1\n", "    engine_num: 2\n"),
    ("    tensor_parallel_size: 1\n",
     "    tensor_parallel_size: 2\n    enable_openai_api: true\n    enable_history: true\n"),
]  # fmt: skip


def _drive(tmp_path: Path, model: Path) -> dict[str, Any]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    config = workdir / "rollout.yaml"
    config.write_text(scenario.replaced(scenario.CONFIG.read_text(), ROLLOUT))
    env = scenario._env("compat", workdir, model)
    prefix = [sys.executable, "-m", "npu_compat"]
    out = tmp_path / "seen.json"
    with npu_ray_cluster(1, npus_per_node=4, cpus_per_node=8, env=env, command_prefix=prefix) as cluster:
        driver_env = {**cluster.env, "RAY_ADDRESS": cluster.address}
        argv = [*prefix, sys.executable, "-m", "tests.e2e.rollout_driver", str(config), str(out)]
        with (tmp_path / "driver.log").open("wb") as log:
            rc = subprocess.run(
                argv, env=driver_env, cwd=scenario.REPO, stdout=log, stderr=subprocess.STDOUT, timeout=1500
            ).returncode
    text = (tmp_path / "driver.log").read_text(errors="replace")
    assert rc == 0, text[-6000:]
    return json.loads(out.read_text())


class _Transformers:
    """What transformers computes on CPU for the tiny model, in the rollout's dtype (Trinity's default bfloat16):
    greedy tokens, and the logprob of each token after the first of logits / temperature."""

    def __init__(self, model: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).eval()

    def greedy(self, prompt: list[int], tokens: int = 8) -> list[int]:
        ids = self.torch.tensor([prompt])
        out = self.hf.generate(
            ids,
            attention_mask=self.torch.ones_like(ids),
            max_new_tokens=tokens,
            do_sample=False,
            eos_token_id=None,
        )
        return [int(t) for t in out[0, len(prompt) :]]

    def logprobs(self, tokens: list[int], temperature: float) -> list[float]:
        torch = self.torch
        with torch.no_grad():
            logits = self.hf(torch.tensor([tokens])).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits / temperature, -1)
        return [float(v) for v in logprobs[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]]


#: how far a logprob of the bfloat16 rollout may be from transformers' in bfloat16 (see the test)
BF16 = 0.25


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario.make_model(tmp_path_factory.mktemp("rollout") / "tiny-model", 0.5)


@on_the_real_vllm_ascend()
def test_trinitys_rollout_at_tp2_x2_answers_every_modelwrapper_call(tmp_path: Path, tiny_model: Path) -> None:
    """Both engines generate transformers' greedy tokens for ``generate`` (the prompt as it is) and ``chat`` (the
    model's chat template); ``logprobs`` -- vLLM's prompt logprobs, at temperature 1 and 2 -- are transformers'
    log-softmax of logits / temperature; the sampler's logprobs of the chat's response are the same numbers;
    ``convert_messages_to_experience`` of the chat's messages and answer holds the same prompt and
    transformers' logprobs of the answer; the OpenAI API, through the sync and the async client, answers what ``chat`` answered, and
    the wrapper records that call as an experience of the same tokens."""
    seen = _drive(tmp_path, tiny_model)
    print(json.dumps(seen))
    assert_answers(seen, tiny_model)


def assert_answers(seen: dict[str, Any], tiny_model: Path) -> None:
    """What the test asserts of the driver's results (``seen``) for ``tiny_model``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompt = list(
        tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    )
    reference = _Transformers(tiny_model)
    assert len(seen["engines"]) == 2
    for engine in seen["engines"]:
        generated = engine["generate"]
        plain = generated["tokens"][: generated["prompt_length"]]
        assert plain == tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
        assert generated["tokens"][len(plain) :] == reference.greedy(plain)
        chat = engine["chat"]
        assert chat["tokens"][: chat["prompt_length"]] == prompt
        assert chat["tokens"][len(prompt) :] == reference.greedy(prompt)
        # logprobs(): Trinity's prompt logprobs of the chat's tokens (bfloat16 against transformers' bfloat16)
        # within 0.25 nats: bfloat16 logits of 16 to 32 are 0.125 apart, and two ranks sum in another order
        assert engine["logprobs"] == pytest.approx(reference.logprobs(chat["tokens"], 1.0), abs=BF16)
        assert engine["logprobs_t2"] == pytest.approx(reference.logprobs(chat["tokens"], 2.0), abs=BF16)
        assert engine["logprobs_t2"] != pytest.approx(engine["logprobs"], abs=BF16)  # the temperature applied
        # the sampler's logprobs of the greedy response are the prompt logprobs of the same tokens
        assert chat["logprobs"] == pytest.approx(engine["logprobs"][len(prompt) - 1 :], abs=0.05)
        # convert_messages_to_experience: the chat's prompt, and the answer's tokens (its text tokenized again, as
        # Trinity does: not always the tokens generated) with transformers' logprobs
        converted = engine["converted"]
        assert converted["tokens"][: converted["prompt_length"]] == prompt
        expected = reference.logprobs(converted["tokens"], 1.0)[len(prompt) - 1 :]
        assert converted["logprobs"] == pytest.approx(expected, abs=BF16)
        # the OpenAI API (sync, then async) answers as chat does, and the wrapper records it
        for call in ("openai", "openai_async"):
            assert engine[call]["text"] == engine["answer"]
            (recorded,) = engine[call]["history"]
            assert recorded["tokens"] == chat["tokens"]
    # the two engines hold the same weights: the same greedy tokens
    assert seen["engines"][0]["chat"]["tokens"] == seen["engines"][1]["chat"]["tokens"]
