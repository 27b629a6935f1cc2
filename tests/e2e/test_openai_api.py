"""The OpenAI-compatible server on the rollout, as Trinity's workflows use it, in a whole run.

``explorer.rollout_model.enable_openai_api: true`` makes Trinity 0.6's ``vLLMRolloutModel`` actor serve vLLM's
OpenAI API (``trinity/common/models/vllm_patch/api_patch_v17.py``: vLLM's FastAPI app on the actor's event
loop, over the actor's ``AsyncLLM``); ``enable_history: true`` makes ``ModelWrapper``'s OpenAI clients ask it
for token ids (``extra_body.return_token_ids``) and logprobs and record every call as an experience.  The
workflow (``tests/e2e/openai_workflow.py``, loaded by Trinity from a dotted ``default_workflow_type``) talks
to the rollout through both clients -- async with ``n``, then sync -- with ``temperature``, ``max_tokens``
and ``logprobs``/``top_logprobs``, and trains on that history: the bundled GRPO config (mode ``both``, two
NPUs, two steps), on the simulated Ascend, through ``python -m npu_compat``.  Stock stops before the server
exists (docs/findings/shapes.md, "OpenAI API server").
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import trinity_or_skip
from tests.e2e import scenario

TRINITY = trinity_or_skip(("0.6.",), "Trinity 0.6's OpenAI API server and history")

#: a run is a Ray cluster of some 25 processes: 8-9 minutes on a shared 2-core machine
pytestmark = [pytest.mark.many_processes, pytest.mark.beyond_ci]

WORKFLOW = "tests.e2e.openai_workflow.OpenAIChatWorkflow"
#: what the workflow asks for (the config's ``rollout_args``): below the model's 8 response tokens, 2 alternatives
MAX_TOKENS, TOP_LOGPROBS, REPEAT = 6, 2, 2
#: two turns (async with n, then sync per answer) for each of the batch's 2 tasks
EXPERIENCES_PER_STEP = 2 * REPEAT * 2


def openai_config(text: str) -> str:
    """The bundled config with the rollout's OpenAI API server and history on, and the workflow of this test.

    The follow-up turn's prompt holds the first turn, so the prompt and model lengths grow; the trainer's
    batch is every experience of an explore step (2 tasks x 2 answers x 2 turns)."""
    for old, new in [
        ("  max_model_len: 104\n", "  max_model_len: 128\n"),
        ("  batch_size: 2\n", f"  batch_size: 2\n  train_batch_size: {EXPERIENCES_PER_STEP}\n"),
        ("        temperature: 1.0\n",
         f"        temperature: 1.0\n        max_tokens: {MAX_TOKENS}\n        logprobs: {TOP_LOGPROBS}\n"),
        ("      default_workflow_type: math_workflow\n", f"      default_workflow_type: {WORKFLOW}\n"),
        ("    engine_type: vllm\n", "    engine_type: vllm\n    enable_openai_api: true\n    enable_history: true\n"),
    ]:  # fmt: skip
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario.make_model(tmp_path_factory.mktemp("openai") / "tiny-model")


def _records(out: Path) -> list[dict[str, Any]]:
    """What the workflow wrote: one record per call and one per task's history (``openai_workflow``)."""
    path = out / "work" / "openai_calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_compat_trains_two_grpo_steps_on_the_openai_api_history(tmp_path: Path, tiny_model: Path) -> None:
    """The rollout actor serves the OpenAI API on the (simulated) Ascend; the workflow's async and sync
    clients get ``n`` answers of at most ``max_tokens`` with token ids and ``top_logprobs`` logprobs; Trinity's
    history turns every call into an experience; GRPO trains two steps on them, syncing weights over HCCL."""
    out = tmp_path / "compat"
    result = scenario.run(
        "compat", out, timeout=900, model=tiny_model, edit=openai_config, name="openai", progress=print
    )
    print(json.dumps(result))
    assert result["rc"] == 0, result
    text = scenario.all_logs(out)
    assert "Error in Trainer" not in text, result["first_error"]
    assert re.search(r"Starting vLLM API server \d+ on http://", text), (
        "the rollout's API server never started"
    )
    assert "second_train_step_finished" in list(result["stages"]), result  # type: ignore[call-overload]
    steps = scenario.train_steps(out)
    assert [step["step"] for step in steps] == [1, 2], steps
    assert all(step["pg_loss"] is not None for step in steps), steps

    records = _records(out)
    calls = [r for r in records if r["kind"] == "call"]
    histories = [r for r in records if r["kind"] == "history"]
    # every explore step (Trinity's batch id) ran the batch's two tasks, each with a non-empty history
    by_step: dict[str, list[int]] = defaultdict(list)
    for history in histories:
        by_step[history["batch"]].append(history["experiences"])
    assert {"1", "2"} <= set(by_step), by_step
    for batch in ("1", "2"):
        assert by_step[batch] == [2 * REPEAT, 2 * REPEAT], (batch, by_step)
    for history in histories:  # each experience: prompt and response tokens, a logprob per response token
        assert all(p > 0 for p in history["prompt_length"]), history
        responses = [t - p for t, p in zip(history["tokens"], history["prompt_length"], strict=True)]
        assert responses == history["logprobs"], history
        assert all(n > 0 for n in history["logprobs"]), history
    # what each train step trained on is that explore step's history (the trainer's batch metrics)
    metrics = scenario.trainer_metrics(out)
    for step in (1, 2):
        lengths = [
            (p, t - p)
            for h in histories
            if h["batch"] == str(step)
            for t, p in zip(h["tokens"], h["prompt_length"], strict=True)
        ]
        assert metrics[step]["prompt_length/mean"] == pytest.approx(
            sum(p for p, _ in lengths) / len(lengths)
        ), step
        assert metrics[step]["response_length/mean"] == pytest.approx(
            sum(r for _, r in lengths) / len(lengths)
        ), step
    # the responses: n answers, at most max_tokens, each token with its id, logprob and top_logprobs
    assert {c["client"] for c in calls} == {"async", "sync"}, calls
    for call in calls:
        n = REPEAT if call["client"] == "async" else 1
        assert call["request"] == {
            "n": n, "temperature": 1.0, "max_tokens": MAX_TOKENS, "logprobs": True, "top_logprobs": TOP_LOGPROBS
        }, call  # fmt: skip
        assert call["choices"] == n and call["prompt_token_ids"] > 0, call
        assert all(0 < n <= MAX_TOKENS for n in call["token_ids"]), call
        assert call["logprobs"] == call["token_ids"], call
        assert all(k >= TOP_LOGPROBS for k in call["top_logprobs"]), call


def test_stock_stops_before_the_api_server(tmp_path: Path, tiny_model: Path) -> None:
    """Stock Trinity on the same NPU-only cluster and config: its config validation counts no GPU and divides
    by zero, long before a rollout actor (and its API server) exists."""
    result = scenario.run(
        "stock", tmp_path / "stock", timeout=300, model=tiny_model, edit=openai_config, name="openai"
    )
    print(json.dumps(result))
    assert result["stages"] == [], result
    assert result["first_error"] == "ZeroDivisionError: integer modulo by zero", result
