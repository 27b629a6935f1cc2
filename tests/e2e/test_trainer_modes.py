"""Issue 25 item 3: SFT and DPO as Trinity's users run them -- ``mode: train`` on expert data.

Each test is one ``python -m npu_compat trinity run`` of a config shipped with the examples
(``examples/e2e/trinity_tiny_sft.yaml``, ``trinity_tiny_dpo.yaml``: Trinity's defaults but for the tiny
model's lengths, two steps and a save interval) on a simulated NPU-only cluster of two NPUs: the trainer
alone, FSDP2 at world size 2, no rollout.  It asserts what a user sees: the command exits 0, the
Trainer's monitor logged steps 1 and 2 with the loss of the algorithm (finite), and the Hugging Face
checkpoint Trinity saves last (its default ``save_hf_checkpoint: last``) loads in plain transformers on
CPU, npu-compat off, holding weights that training changed.
"""

from __future__ import annotations

import functools
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import trinity_or_skip
from tests.e2e import scenario

TRINITY = trinity_or_skip(("0.6.",), "the SFT and DPO configs use trinity-rft 0.6's keys (stacks a, b)")

pytestmark = [pytest.mark.many_processes]

EXAMPLES = scenario.REPO / "examples" / "e2e"

#: the config, and the metric that is its loss in the Trainer's monitor
MODES = {
    "sft": (EXAMPLES / "trinity_tiny_sft.yaml", "actor/sft_loss"),
    "dpo": (EXAMPLES / "trinity_tiny_dpo.yaml", "actor/dpo_loss"),
}


#: Loads a Hugging Face model directory on CPU with plain transformers; prints its parameters' count and
#: how many of its tensors differ from those of another directory (the model before training).
_LOAD_ON_CPU = """
import json, sys
from transformers import AutoModelForCausalLM
trained, initial = (AutoModelForCausalLM.from_pretrained(p) for p in sys.argv[1:3])
before = initial.state_dict()
after = trained.state_dict()
print(json.dumps({
    "device": str(next(trained.parameters()).device),
    "parameters": sum(t.numel() for t in trained.parameters()),
    "tensors": len(after),
    "changed": sum(not after[k].float().equal(before[k].float()) for k in after),
}))
"""


def on_cpu(script: str, *models: Path) -> dict[str, Any]:
    """What ``script`` prints last (JSON) about Hugging Face model directories it loads with plain
    transformers on CPU, in a process of its own with npu-compat off."""
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, models)],
        env={**scenario.inherited_env(), "NPU_COMPAT": "0"}, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def hf_checkpoints(out: Path) -> list[Path]:
    """The actor's Hugging Face model directories a run saved under its checkpoint root, by step (a PPO run
    saves its critic's too, under ``critic/``)."""
    found = (out / "work" / "checkpoints").rglob("actor/huggingface/config.json")
    return sorted((path.parent for path in found), key=lambda path: int(path.parents[1].name.split("_")[-1]))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario.make_model(tmp_path_factory.mktemp("modes") / "tiny-model")


@pytest.mark.parametrize("algorithm", sorted(MODES))
def test_compat_trains_two_steps_of_an_offline_algorithm_on_its_expert_data(
    algorithm: str, tmp_path: Path, tiny_model: Path
) -> None:
    config, loss = MODES[algorithm]
    out = tmp_path / algorithm
    result = scenario.run(
        "compat",
        out,
        timeout=900,
        model=tiny_model,
        npus=2,
        cpus=8,
        config=config,
        name=algorithm,
        stuck_after=120,
        progress=print,
    )
    print(result)
    assert result["rc"] == 0, result
    metrics = scenario.trainer_metrics(out)
    print({step: {k: v for k, v in values.items() if "loss" in k} for step, values in metrics.items()})
    assert sorted(metrics) == [1, 2], metrics
    for step in (1, 2):
        value = metrics[step].get(loss)
        assert isinstance(value, float) and math.isfinite(value), (step, metrics[step])
    saved = hf_checkpoints(out)
    print(saved)
    assert saved, "no Hugging Face checkpoint was saved (save_hf_checkpoint: last)"
    loaded = on_cpu(_LOAD_ON_CPU, saved[-1], tiny_model)
    print(loaded)
    assert loaded["device"] == "cpu" and loaded["tensors"], loaded
    assert loaded["changed"], f"the saved weights are the initial ones: {loaded}"


def _one_conversation(directory: Path) -> Path:
    """A data set of the shipped SFT data's first conversation, eight times: every batch alike."""
    directory.mkdir(parents=True)
    first = (EXAMPLES / "sft_data" / "train.jsonl").read_text().splitlines()[0]
    (directory / "train.jsonl").write_text((first + "\n") * 8)
    return directory


@pytest.mark.beyond_ci
def test_compat_sft_resumes_from_its_step_1_checkpoint_with_the_uninterrupted_runs_step_2_loss(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Issue 25 item 6: a run saves at step 1 (``save_interval: 1``) and ends (``total_steps: 1``); a second
    run of the same config in the same checkpoint directory, with Trinity's default
    ``continue_from_checkpoint: true``, loads the saved ``npu`` tensors (model, optimizer, RNG, scheduler)
    and trains on from step 2, and its losses equal the uninterrupted run's: at step 2, and at step 3
    where both runs reach it.

    Every batch of the data is the same conversation, so that the loss depends on the restored tensors
    alone: Trinity's reader resumes at the offset it saved after sampling for a step it did not train
    (FINDINGS), so with the shipped data the two runs' step 2 would read different samples.  The learning
    rate is the bundled GRPO config's 1e-3, so that each step moves the loss (at Trinity's 1e-6 the printed
    loss stays the same, and a resume that loaded nothing would look alike): step 2's loss is the model's
    after step 1, step 3's also depends on the optimizer's state after step 2."""
    config, loss = MODES["sft"]
    data = _one_conversation(tmp_path / "one-conversation")

    def on(steps: int) -> Callable[[str], str]:
        return lambda text: scenario.replaced(
            text,
            [
                ("  total_steps: 2\n", f"  total_steps: {steps}\n"),
                ("${oc.env:E2E_DATA}/../sft_data", str(data)),
                ("  algorithm_type: sft\n", "  algorithm_type: sft\n  optimizer:\n    lr: 1.0e-3\n"),
            ],
        )

    run = functools.partial(
        scenario.run, "compat", timeout=900, model=tiny_model, npus=2, cpus=8, config=config, stuck_after=120,
        progress=print,
    )  # fmt: skip
    whole = run(tmp_path / "whole", edit=on(3), name="sft-3-steps")
    assert whole["rc"] == 0, whole
    uninterrupted = {
        step: values.get(loss) for step, values in scenario.trainer_metrics(tmp_path / "whole").items()
    }

    out = tmp_path / "resumed"
    first = run(out, edit=on(1), name="sft-1-step")
    assert first["rc"] == 0, first
    before = {step: values.get(loss) for step, values in scenario.trainer_metrics(out).items()}
    (out / "driver.log").rename(out / "driver.first.log")
    second = run(out, edit=on(3), name="sft-3-steps")
    assert second["rc"] == 0, second
    resumed = {step: values.get(loss) for step, values in scenario.trainer_metrics(out).items()}
    print({"uninterrupted": uninterrupted, "first run": before, "resumed": resumed})
    assert re.search(r"Loaded model from \S+/global_step_1/actor/", scenario.all_logs(out)), (
        "no checkpoint loaded"
    )
    assert sorted(before) == [1] and before[1] == uninterrupted[1], (before, uninterrupted)
    moved = uninterrupted.get(1) != uninterrupted.get(2) != uninterrupted.get(3)
    assert moved, f"training did not move the loss: {uninterrupted}"
    assert resumed and min(resumed) == 2, f"the second run did not resume at step 2: {resumed}"
    compared = [step for step in (2, 3) if step == 2 or (step in resumed and step in uninterrupted)]
    print("compared at steps", compared)
    for step in compared:
        got, expected = resumed.get(step), uninterrupted.get(step)
        assert isinstance(got, float) and isinstance(expected, float), (step, resumed, uninterrupted)
        assert math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9), (step, resumed, uninterrupted)


def _fsdp1(text: str) -> str:
    return scenario.replaced(text, [("  trainer_strategy: fsdp2\n", "  trainer_strategy: fsdp\n")])


@pytest.mark.uses_verl  # verl 0.8's engine on stack a, Trinity's legacy fsdp_workers on verl 0.7.1 (stack b)
@pytest.mark.beyond_ci
def test_compat_both_trains_two_grpo_steps_with_fsdp1(tmp_path: Path, tiny_model: Path) -> None:
    """Issue 25 item 5: the bundled GRPO run with ``trainer_strategy: fsdp`` (FSDP1, Trinity's test
    template's strategy) instead of ``fsdp2``: two steps with a loss, and each weight sync leaves the
    rollout holding what the trainer sent (in the rollout's dtype)."""
    out = tmp_path / "fsdp1"
    result = scenario.run(
        "compat", out, timeout=900, model=tiny_model, edit=_fsdp1, name="fsdp1", progress=print
    )
    print(result)
    assert result["rc"] == 0, result
    text = scenario.all_logs(out)
    assert "Error in Trainer" not in text, result["first_error"]  # Trinity logs a trainer crash and exits 0
    steps = scenario.train_steps(out)
    print(steps)
    assert [step["step"] for step in steps] == [1, 2], steps
    assert all(step["pg_loss"] is not None and step["grad_norm"] is not None for step in steps), steps
    syncs = scenario.weight_syncs(out)
    assert len(syncs) == 3, syncs
    # FSDP1 sends float32 (FSDP2 sends its bfloat16 parameters): the rollout, bfloat16 at Trinity's
    # defaults, received exactly what was sent and holds exactly its conversion
    converted = scenario.converted_loads(out)
    print(converted)
    if converted:
        assert [load["received"] for load in converted] == [sync["sent"] for sync in syncs], (
            converted,
            syncs,
        )
        assert all(load["holds"] == load["expected"] for load in converted), converted
    else:
        assert all(sync["sent"] == sync["loaded"] for sync in syncs), syncs


def _ppo(engines: int) -> Callable[[str], str]:
    """PPO (its critic, GAE, and Trinity's default KL loss to the reference model; one response per task, PPO's
    default and what vLLM's greedy sampling allows) with greedy rollouts -- the same responses, so the same
    batch, whatever the engines -- on ``engines`` rollout engines, the trainer on as many
    NPUs again, and the last weights saved as a Hugging Face checkpoint."""
    return lambda text: scenario.replaced(
        text,
        [
            ("  algorithm_type: grpo\n  repeat_times: 2\n", "  algorithm_type: ppo\n  repeat_times: 1\n"),
            ("        temperature: 1.0\n", "        temperature: 0.0\n"),
            ("    engine_num: 1\n", f"    engine_num: {engines}\n"),
            ("  save_hf_checkpoint: never\n", "  save_hf_checkpoint: last\n"),
        ],
    )


#: The Trainer's metrics compared between data-parallel sizes, and the relative tolerance: the two runs
#: compute the same float32 batch, split over one rank or two, so they differ only in the order of the sums
#: (the all-reduce of the gradients, the per-rank means); 1e-4 is far above that and far below any change
#: one step makes.
DP_METRICS = ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "actor/kl_loss")
DP_TOLERANCE = 1e-4


@pytest.mark.beyond_ci
def test_compat_ppo_with_a_critic_computes_the_same_at_data_parallel_size_2_as_at_1(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Issue 25 items 1 and 2: PPO with its critic (``critic/vf_loss``) and KL to the reference model, the
    trainer at FSDP2 world size 1 (2 NPUs: rollout 1, trainer 1) and at world size 2 (4 NPUs: 2 rollout engines,
    trainer 2), on the same batch (greedy rollouts).  Each step's losses and gradient norms, and the weights
    after step 2 (the Hugging Face checkpoints, loaded on CPU), are equal within ``DP_TOLERANCE``.  They are
    not yet (measured 2026-12-04, FINDINGS): where they differ, the test reports an expected failure with the
    values, and any other failure of the runs fails it."""
    runs = {}
    for size in (1, 2):
        out = tmp_path / f"dp{size}"
        result = scenario.run(
            "compat", out, timeout=900, model=tiny_model, npus=2 * size, cpus=4 + 4 * size, edit=_ppo(size),
            name=f"ppo-dp{size}", stuck_after=120, progress=print,
        )  # fmt: skip
        assert result["rc"] == 0, result
        assert "Error in Trainer" not in scenario.all_logs(out), result["first_error"]
        runs[size] = scenario.trainer_metrics(out)
        print(size, {step: {k: values.get(k) for k in DP_METRICS} for step, values in runs[size].items()})
    assert sorted(runs[1]) == sorted(runs[2]) == [1, 2], runs
    mismatches = []
    for step in (1, 2):
        assert isinstance(runs[1][step].get("critic/vf_loss"), float), runs[1][step]
        for key in DP_METRICS:
            one, two = runs[1][step].get(key), runs[2][step].get(key)
            assert isinstance(one, (int, float)) and isinstance(two, (int, float)), (step, key, one, two)
            if not math.isclose(one, two, rel_tol=DP_TOLERANCE, abs_tol=1e-7):
                mismatches.append((step, key, one, two))
    saved = {size: hf_checkpoints(tmp_path / f"dp{size}")[-1] for size in (1, 2)}
    difference = on_cpu(_MAX_DIFFERENCE, saved[1], saved[2])
    print("weights after step 2, world size 1 against 2:", difference, "mismatches:", mismatches)
    assert difference["tensors"], difference
    if mismatches or difference["max_relative"] > DP_TOLERANCE:
        # measured 2026-12-04: equal rewards, returns and response lengths, and an equal actor/kl_loss at step 2,
        # but critic/vf_loss 0.045 at world size 1 against 0.0015 at 2 (step 1) -- the cause is not found yet
        # (the critic's freshly initialised value head is the first suspect): issue 25 item 1 stays open
        pytest.xfail(f"world size 1 and 2 differ: {mismatches}, weights {difference}")


#: The largest difference between two Hugging Face model directories' tensors, relative to the tensor's size.
_MAX_DIFFERENCE = """
import json, sys
from transformers import AutoModelForCausalLM
a, b = (AutoModelForCausalLM.from_pretrained(p).state_dict() for p in sys.argv[1:3])
worst = max(float((a[k].float() - b[k].float()).abs().max() / a[k].float().abs().max().clamp_min(1e-12)) for k in a)
print(json.dumps({"tensors": len(a), "max_relative": worst}))
"""
