"""Trinity's math workflow, recording what the rollout generated and on which weight version, and rewarding
responses so that GRPO's advantages are not all 0.

Test harness for ``tests/e2e/test_trinity_run.py``'s greedy check of graph mode after weight syncs, never part
of ``npu_compat``.  Trinity imports it in its ``WorkflowRunner`` actors from the config's
``default_workflow_type: tests.e2e.greedy_probe.RecordingMathWorkflow`` (a dotted path; the scenario puts the
repository on every process's ``PYTHONPATH``), for the training taskset and the evaluation taskset alike.

* **Which weights.**  Each task records the rollout model's weight version (``ModelWrapper.model_version``)
  before it generates.  The explorer waits for an evaluation to finish before it syncs weights, so an
  evaluation task's version is the one its tokens were generated on.
* **What it generated.**  Each response's prompt and response token ids, appended as one JSON line to
  ``$E2E_WORKDIR/greedy_probe.jsonl``.
* **Each task's own arguments.**  See :meth:`RecordingMathWorkflow.reset`.
* **A reward that tells the responses apart.**  A random tiny model earns every response the same math
  reward, so GRPO's advantages, its loss and its gradients are 0, and the weights move only by AdamW's weight
  decay: too little for a greedy token to change, and then a check of greedy tokens could not fail.  Training
  responses are rewarded by their mean token id instead; two sampled responses almost never tie.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trinity.common.workflows.workflow import MathWorkflow

#: the file, under ``$E2E_WORKDIR``, the records are appended to
RECORDS = "greedy_probe.jsonl"


class RecordingMathWorkflow(MathWorkflow):
    """``math_workflow``, recording each response's tokens and weight version; training rewards that differ."""

    def reset(self, task: Any) -> None:
        # Trinity 0.6.0's WorkflowRunner reuses one workflow for the next task of the same class through
        # ``reset``, which SimpleWorkflow implements without ``self.task = task``: its ``rollout_args`` and
        # ``is_eval`` would stay the first task's (an evaluation after a training task would sample at the
        # training temperature).  Here each task is its own.
        self.task = task
        super().reset(task)

    def run(self) -> list[Any]:
        version = self.model.model_version
        responses = super().run()
        records = []
        for response in responses:
            tokens = [int(t) for t in response.tokens.tolist()]
            prompt, generated = tokens[: response.prompt_length], tokens[response.prompt_length :]
            if not self.task.is_eval:
                response.reward = sum(generated) / max(1, len(generated))
            records.append(
                {"eval": self.task.is_eval, "version": version, "prompt": prompt, "response": generated}
            )
        with (Path(os.environ["E2E_WORKDIR"]) / RECORDS).open("a") as out:
            out.writelines(json.dumps(record) + "\n" for record in records)
        return responses
