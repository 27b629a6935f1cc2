"""A Trinity workflow written as an agent application is: it talks to the rollout model only through the
OpenAI-compatible server on the rollout (``explorer.rollout_model.enable_openai_api``), with the clients
Trinity's ``ModelWrapper`` hands out, and builds its experiences from the wrapper's history
(``enable_history``: Trinity records every call, with the token ids and logprobs it asks the server for).

Test harness for ``tests/e2e/test_openai_api.py``, never part of ``npu_compat``.  Trinity imports it in its
``WorkflowRunner`` actors from the config's ``default_workflow_type:
tests.e2e.openai_workflow.OpenAIChatWorkflow`` (its workflow registry takes a dotted path; the scenario puts
the repository on every process's ``PYTHONPATH``).  Unlike ``--plugin-dir``/``TRINITY_PLUGIN_DIRS``, that
leaves the installed Trinity alone: its plugin loader copies each plugin file into ``trinity/plugins`` of
the environment, where every later ``trinity run`` of that environment would load it.

Each task is two turns, for each of the ``repeat_times`` answers:

1. the **async** client (``get_openai_async_client``) asks once with ``n = repeat_times``;
2. for each answer the **sync** client (``get_openai_client``; in a thread, it blocks) asks a follow-up with
   the conversation so far, ``n = 1``;

each call with ``temperature``, ``max_tokens`` and ``logprobs``/``top_logprobs`` from the task's
``rollout_args``.  The experiences are the history Trinity recorded (``extract_experience_from_history``):
``2 x repeat_times`` per task.  What each response and the history held is appended as one JSON line per
call (``"call"``) and per task (``"history"``) to ``$E2E_WORKDIR/openai_calls.jsonl`` and logged with
the prefix :data:`PREFIX`.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from trinity.common.experience import Experience
from trinity.common.workflows.workflow import BaseSimpleWorkflow

#: the prefix of the workflow's log lines (each followed by the JSON record it also writes to the file)
PREFIX = "openai-workflow record: "
#: the file, under ``$E2E_WORKDIR``, the records are appended to
RECORDS = "openai_calls.jsonl"
#: ``top_logprobs`` when the task's ``rollout_args.logprobs`` is unset
TOP_LOGPROBS = 2
FOLLOW_UP = "please reason step by step and put the final answer in a box ."


class OpenAIChatWorkflow(BaseSimpleWorkflow):
    """Two turns over the OpenAI API (async, then sync), experiences from Trinity's history."""

    is_async = True
    can_repeat = True  # one call with n = repeat_times

    def __init__(self, *, task: Any, model: Any, auxiliary_models: Any = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.repeat_times = 1
        self.async_client = model.get_openai_async_client()
        self.sync_client = model.get_openai_client()

    def _request(self) -> dict[str, Any]:
        args = self.task.rollout_args
        return {
            "temperature": 1.0 if args.temperature is None else args.temperature,
            "max_tokens": args.max_tokens or self.model.model_config.max_response_tokens,
            "logprobs": True,
            "top_logprobs": TOP_LOGPROBS if args.logprobs is None else args.logprobs,
        }

    async def run_async(self) -> list[Experience]:
        request = self._request()
        messages = self.format_messages()
        first = await self.async_client.chat.completions.create(
            model=self.async_client.model_path, messages=messages, n=self.repeat_times, **request
        )
        self._record_call("async", 0, first, {"n": self.repeat_times, **request})
        for choice in first.choices:
            follow = [
                *messages,
                {"role": "assistant", "content": choice.message.content or ""},
                {"role": "user", "content": FOLLOW_UP},
            ]
            second = await asyncio.to_thread(
                self.sync_client.chat.completions.create,
                model=self.sync_client.model_path,
                messages=follow,
                n=1,
                **request,
            )
            self._record_call("sync", 1, second, {"n": 1, **request})
        exps = self.model.extract_experience_from_history()
        turns = [0] * len(first.choices) + [1] * len(first.choices)
        runs = list(range(len(first.choices))) * 2
        for exp, turn, run in zip(exps, turns, runs, strict=True):
            reward = self.reward_fn(response=exp.response_text or "", truth=self.truth)
            exp.reward = float(sum(reward.values()))
            exp.metrics = {**(exp.metrics or {}), **reward}
            exp.eid.run = self.run_id_base + run
            exp.eid.step = turn
        self._write({
            "kind": "history",
            **self._where(),
            "experiences": len(exps),
            "tokens": [len(exp.tokens) for exp in exps],
            "prompt_length": [exp.prompt_length for exp in exps],
            "logprobs": [0 if exp.logprobs is None else len(exp.logprobs) for exp in exps],
        })  # fmt: skip
        return list(exps)

    def _where(self) -> dict[str, Any]:
        return {"batch": str(self.task.batch_id), "task": str(self.task.task_id)}

    def _record_call(self, client: str, turn: int, response: Any, request: dict[str, Any]) -> None:
        """What was asked (``request``) and what came back: per choice, the number of token ids, of logprobs
        and the fewest ``top_logprobs`` alternatives of any token; the history's length after the call."""
        choices = list(response.choices)
        self._write({
            "kind": "call",
            **self._where(),
            "client": client,
            "turn": turn,
            "request": request,
            "choices": len(choices),
            "prompt_token_ids": len(getattr(response, "prompt_token_ids", None) or []),
            "token_ids": [len(getattr(c, "token_ids", None) or []) for c in choices],
            "logprobs": [len(c.logprobs.content or []) if c.logprobs else 0 for c in choices],
            "top_logprobs": [
                min((len(t.top_logprobs or []) for t in c.logprobs.content or []), default=0) if c.logprobs else 0
                for c in choices
            ],
            "finish_reason": [c.finish_reason for c in choices],
            "history": len(self.model.history),
        })  # fmt: skip

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record)
        self.logger.info(PREFIX + line)
        workdir = os.environ.get("E2E_WORKDIR")
        if workdir:
            with (Path(workdir) / RECORDS).open("a") as f:
                f.write(line + "\n")
