"""A user's own whole ``trinity run`` on the simulated Ascend, as a user's CI job runs it.

In a fresh venv with the built wheel (``tests/user/conftest.py``), with a config, data set and tiny
model made here (not the project's e2e files), the recipe of the README: start the cluster from the
shell with ``--env-file``, read the file, ``python -m npu_compat trinity run --config mine.yaml``.
GRPO, mode ``both``, two steps: the command exits 0 after the second train step.

The rollout is left at Trinity's defaults (eager off, prefix caching, bfloat16, 90 % of the device, eight
workflow runners), as a user's config leaves it.  What the user can read of the run is checked too: each
weight sync's digests in the logs (the rollout holds what the trainer sent), and the per-process reports of
``--report-dir`` (each process activated, each patch applied where its code runs).  This is CI's whole run
on stack a; ``tests/e2e/test_trinity_run.py`` runs the bundled config with its stage-by-stage checks.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from npu_compat.doctor.reports import read_reports
from npu_compat.tools import timeline
from tests.e2e.scenario import applied_by_process
from tests.user.conftest import dotenv, user_env

pytestmark = [
    pytest.mark.many_processes,
    pytest.mark.skipif(
        (importlib.metadata.version("trinity-rft"), importlib.metadata.version("verl")[:3])
        != ("0.6.0", "0.8"),
        reason="CI runs a user's whole run on stack a; the other stacks' whole runs are beyond CI's time "
        "(docs/findings/shapes.md, the matrix)",
    ),
]

MODEL = """
import sys
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1]
words = ["<pad>", "<unk>", "<eos>", "<bos>", "user", "assistant", "system", ":", "?", "=", "+", "answer", "is",
         "what", "the", "\\\\boxed", "{", "}", *map(str, range(10))]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(True)])
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>",
                               bos_token="<bos>")
fast.chat_template = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
                      "{% if add_generation_prompt %}assistant : {% endif %}")
fast.save_pretrained(out)
torch.manual_seed(1)
config = LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                     eos_token_id=2, pad_token_id=0, bos_token_id=3, torch_dtype="float32",
                     architectures=["LlamaForCausalLM"])
LlamaForCausalLM(config).save_pretrained(out)
GenerationConfig(eos_token_id=2, pad_token_id=0, bos_token_id=3).save_pretrained(out)
"""

CONFIG = """
mode: both
project: my-project
name: my-grpo
checkpoint_root_dir: {root}/checkpoints
algorithm:
  algorithm_type: grpo
  repeat_times: 2
model:
  model_path: {root}/model
  max_prompt_tokens: 80
  max_response_tokens: 6
cluster:
  ray_address: auto
buffer:
  total_epochs: 1
  total_steps: 2
  batch_size: 2
  explorer_input:
    taskset:
      name: sums
      storage_type: file
      path: {root}/data
      format:
        prompt_key: question
        response_key: answer
      default_workflow_type: math_workflow
      default_reward_fn_type: math_reward
  trainer_input:
    experience_buffer:
      name: experiences
      storage_type: queue
explorer:
  rollout_model:
    engine_num: 1
    tensor_parallel_size: 1
synchronizer:
  sync_method: nccl
  sync_interval: 1
trainer:
  save_interval: 0
"""


def _finished_steps(root: Path, driver_out: str) -> set[int]:
    text = driver_out + "".join(p.read_text(errors="replace") for p in root.rglob("*.log") if p.is_file())
    return {int(n) for n in re.findall(r"Training at step (\d+) finished", text)}


def test_a_users_own_config_runs_two_grpo_steps_to_exit_0(user_venv: Path, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    rows = [
        {"question": f"what is {a} + {b} ?", "answer": str(a + b)}
        for a, b in [(1, 2), (3, 4), (2, 2), (5, 1)]
    ]
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "make_model.py").write_text(MODEL)
    subprocess.run([str(user_venv), "make_model.py", str(tmp_path / "model")], cwd=tmp_path,
                   env=user_env(user_venv), check=True, capture_output=True, timeout=300)  # fmt: skip
    (tmp_path / "mine.yaml").write_text(CONFIG.format(root=tmp_path))

    env_file = tmp_path / "ci.env"
    argv = [str(user_venv), "-m", "npu_compat.testing", "cluster", "--env-file", str(env_file)]
    with (tmp_path / "cluster.out").open("wb") as out:
        cluster = subprocess.Popen(
            argv, cwd=tmp_path, env=user_env(user_venv), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 300
        while not env_file.exists() or "RAY_ADDRESS=" not in env_file.read_text():
            assert cluster.poll() is None and time.monotonic() < deadline, (
                tmp_path / "cluster.out"
            ).read_text()
            time.sleep(1)
        env = user_env(user_venv, **dotenv(env_file))
        run = subprocess.run(
            [str(user_venv), "-m", "npu_compat", "--report-dir", "reports", "trinity", "run", "--config", "mine.yaml"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
    finally:
        cluster.send_signal(signal.SIGTERM)
        cluster.wait(timeout=120)
    output = run.stdout + run.stderr
    (tmp_path / "driver.log").write_text(output)
    assert run.returncode == 0, output[-8000:]
    assert _finished_steps(tmp_path, output) >= {1, 2}, output[-8000:]
    logs = output + "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*.log") if p.is_file())
    assert "Error in Trainer" not in logs  # Trinity logs a trainer crash and exits 0
    # the syncs (before step 1 and after each train step): the rollout holds what the trainer sent.  (The
    # tiny model answers no sum, so GRPO's advantages are all zero and a step may leave the weights as
    # they were: the digests need not differ from sync to sync.)
    sent, loaded = (re.findall(rf"simulated weight sync \({side}\): (\d+ tensors, sha256 \w+)", output)
                    for side in ("trainer sent", "rollout loaded"))  # fmt: skip
    assert len(sent) == 3 and sent == loaded, (sent, loaded)
    # the rollout at Trinity's defaults on the released vllm-ascend: enforce_eager false captures ACL graphs
    # (PIECEWISE, and FULL for decode); bfloat16; a KV cache of 0.9 of the 64 GiB device less the weights
    assert "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%" in logs
    assert "Capturing CUDA graphs (decode, FULL): 100%" in logs
    assert "dtype=torch.bfloat16" in logs
    kv = re.findall(r"Available KV cache memory: ([\d.]+) GiB", logs)
    assert kv and all(abs(float(gib) - 0.9 * 64) < 0.01 for gib in kv), kv
    # every prompt (math_workflow's system prompt and a question: 72 tokens here) reached the rollout, whose
    # runner generated for each: Trinity records a masked dummy experience for a prompt over max_prompt_tokens
    assert "Prompt was truncated" not in logs
    served = [int(n) for n in re.findall(r"NPUModelRunner on npu:\d+ served (\d+) requests", logs)]
    assert served and max(served) >= 4, served  # 2 tasks x 2 answers a step, the count logged at 1, 2, 4, ...
    # every process of the run activated (the driver, Ray's actors, vLLM's workers), and each patch is
    # reported applied in the process where its code runs
    reports = tmp_path / "reports"
    table = timeline.rows(read_reports(str(reports)), str(reports))
    assert {"ray-driver", "ray-actor"} <= {row.role for row in table}, table
    assert any(row.role.startswith("vllm (") for row in table), table
    assert all(None not in (row.started, row.activated, row.updated) for row in table), table
    applied = applied_by_process(reports)
    for process, ids in {
        "ray-driver": ["trinity.config_validator.npu_count"],
        "WorkerDict": ["torch.distributed.init_process_group", "trinity.distributed.vllm_weight_transfer"],
        "vLLMRolloutModel": ["trinity.vllm_model.weights_not_nz", "vllm.weight_transfer.nccl_is_hccl"],
        "vllm (VllmWorker-0)": ["trinity.vllm.worker_cls", "vllm.weight_transfer.nccl_is_hccl"],
    }.items():
        assert set(ids) <= set(applied.get(process, ())), (process, applied)
