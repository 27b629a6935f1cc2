"""The trainer as Trinity's users run it, as whole ``python -m npu_compat trinity run``s.

SFT and DPO (``mode: train`` on expert data) run configs shipped with the examples
(``examples/e2e/trinity_tiny_sft.yaml``, ``trinity_tiny_dpo.yaml``: Trinity's defaults but for the tiny
model's lengths, two steps and a save interval) on a simulated NPU-only cluster of two NPUs: the trainer
alone, FSDP2 at world size 2, no rollout.  They assert what a user sees: the command exits 0, the
Trainer's monitor logged steps 1 and 2 with the loss of the algorithm (finite), and the Hugging Face
checkpoint Trinity saves last (its default ``save_hf_checkpoint: last``) loads in plain transformers on
CPU, npu-compat off, holding weights that training changed.  All of them run by hand (``beyond_ci``), for
CI's time: SFT and DPO themselves, SFT resumed from a checkpoint, FSDP1, PPO with a critic at data-parallel
size 1 and 2, Ulysses sequence parallelism, and two nodes.
"""

from __future__ import annotations

import collections
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

from npu_compat.doctor.reports import read_reports
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


# by hand, for CI's time (SFT 2.5 min, DPO 4): CI trains FSDP2 at world size 2 on two simulated NPUs
# (tests/sim/test_npu_fsdp2.py) and verl's trainer in the user's whole GRPO run (tests/user)
@pytest.mark.beyond_ci
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
    """A run saves at step 1 (``save_interval: 1``) and ends (``total_steps: 1``); a second
    run of the same config in the same checkpoint directory, with Trinity's default
    ``continue_from_checkpoint: true``, loads the saved ``npu`` tensors (model, optimizer, RNG, scheduler)
    and trains on from step 2, and its losses equal the uninterrupted run's: at step 2, and at step 3
    where both runs reach it.

    Every batch of the data is the same conversation, so that the loss depends on the restored tensors
    alone: Trinity's reader resumes at the offset it saved after sampling for a step it did not train
    (docs/findings), so with the shipped data the two runs' step 2 would read different samples.  The learning
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
    """The bundled GRPO run with ``trainer_strategy: fsdp`` (FSDP1, Trinity's test
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
            ("  max_token_len_per_gpu: 256\n", "  max_token_len_per_gpu: 256\n" + SEEDED_FLOAT32),
        ],
    )


#: Two settings through Trinity's ``trainer_config`` that make PPO runs repeat and compare, on any device:
#:
#: * the critic's value head is not in the model's checkpoint: transformers initialises it from torch's global
#:   generator, which torch seeds at random in each process, and Trinity leaves verl's ``full_determinism``
#:   (the only place verl seeds an FSDP engine) off -- so at Trinity's defaults no two PPO runs start from the
#:   same critic.  ``full_determinism`` seeds every rank with verl's seed, 42;
#: * verl computes in bfloat16 (Trinity's engine ``dtype``, FSDP's ``param_dtype``).  The actor's gradient is
#:   a difference of near-equal terms (advantages of opposite signs, whitened), so bfloat16's rounding, which
#:   depends on how the batch is cut over the ranks (and, it seems, ordered), moves it by percents: measured 2026-12-04, step 1's
#:   ``actor/grad_norm`` was 0.116307 and 0.118511 in two runs at world size 1 and 0.107247 at 2, every loss
#:   equal.  In float32 (``param_dtype: fp32``) the same differences are rounding of 1e-7.
SEEDED_FLOAT32 = """\
  trainer_config:
    actor:
      fsdp_config:
        mixed_precision:
          param_dtype: fp32
    ref:
      fsdp_config:
        mixed_precision:
          param_dtype: fp32
    critic:
      fsdp:
        full_determinism: true
        mixed_precision:
          param_dtype: fp32
"""


#: The Trainer's metrics compared between data-parallel sizes, and their tolerance.  The two runs compute the
#: same float32 batch, cut over one rank or two: the forward passes differ in how the tokens are packed into
#: matmuls, and the gradients in the order of their sums (the all-reduce), by float32 rounding (1e-7
#: relative).  Relative 1e-4 is far above that and far below what one step changes.  ``actor/pg_loss`` is a
#: mean of per-token terms of size about 1 (whitened advantages times a ratio near 1) that nearly cancel
#: (1e-4), so its rounding is absolute, of the terms' size: 1e-5 absolute (measured: 3e-7).
DP_METRICS = ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "actor/kl_loss")
DP_TOLERANCE = 1e-4
DP_ABSOLUTE = 1e-5
#: The weights after step 2 are compared element by element in the dtype Trinity saves them in (bfloat16),
#: and may differ in at most this fraction of the elements.  Adam's first steps move each element by about
#: lr whatever the size of its gradient (its update is ``m / sqrt(v)``), so an element whose gradient is
#: near 0 takes a step whose size and sign are rounding's: such elements can differ by up to 2 lr between two
#: runs of one world size already.  Measured 2026-12-04: 3 and 11 of 13,472 elements, each a few bfloat16
#: steps apart; in bfloat16 compute 5,573.
DP_WEIGHTS_APART = 0.01


@pytest.mark.beyond_ci
def test_compat_ppo_with_a_critic_computes_the_same_at_data_parallel_size_2_as_at_1(
    tmp_path: Path, tiny_model: Path
) -> None:
    """PPO with its critic (``critic/vf_loss``) and KL to the reference model, the
    trainer at FSDP2 world size 1 (2 NPUs: rollout 1, trainer 1) and at world size 2 (4 NPUs: 2 rollout engines,
    trainer 2), on the same batch (greedy rollouts), seeded and in float32 (:data:`SEEDED_FLOAT32`).  Each
    step's losses and gradient norms are equal within ``DP_TOLERANCE`` / ``DP_ABSOLUTE``, and the weights after
    step 2 (the Hugging Face checkpoints, loaded on CPU) within ``DP_WEIGHTS_APART``."""
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
    for step in (1, 2):
        assert isinstance(runs[1][step].get("critic/vf_loss"), float), runs[1][step]
        assert runs[1][step]["actor/grad_norm"] > 0 and runs[1][step]["critic/grad_norm"] > 0, runs[1][step]
        for key in DP_METRICS:
            one, two = runs[1][step].get(key), runs[2][step].get(key)
            assert isinstance(one, (int, float)) and isinstance(two, (int, float)), (step, key, one, two)
            absolute = DP_ABSOLUTE if key == "actor/pg_loss" else 1e-9
            assert math.isclose(one, two, rel_tol=DP_TOLERANCE, abs_tol=absolute), (step, key, one, two)
    saved = {size: hf_checkpoints(tmp_path / f"dp{size}")[-1] for size in (1, 2)}
    initial = on_cpu(_ROUNDINGS_APART, saved[1], tiny_model)
    difference = on_cpu(_ROUNDINGS_APART, saved[1], saved[2])
    print("weights after step 2, world size 1 against 2:", difference, "against the initial ones:", initial)
    assert initial["differing"] > initial["elements"] // 2, f"training did not move the weights: {initial}"
    assert difference["elements"] == initial["elements"], difference
    assert difference["differing"] <= DP_WEIGHTS_APART * difference["elements"], difference


#: How two Hugging Face model directories' weights differ, in their saved dtype: how many elements differ at
#: all, and the most representable values (1: the next one) between an element and its counterpart.
_ROUNDINGS_APART = """
import json, sys, torch
from transformers import AutoModelForCausalLM
a, b = (AutoModelForCausalLM.from_pretrained(p, dtype="auto").state_dict() for p in sys.argv[1:3])
ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
def ordered(t):  # the bit patterns, ordered as the values are (sign and magnitude to two's complement)
    i = t.contiguous().view(ints[t.element_size()]).long()
    return torch.where(i < 0, -(i & ((1 << (8 * t.element_size() - 1)) - 1)), i)
most = differing = elements = 0
for k in a:
    x, y = a[k], b[k].to(a[k].dtype)
    apart = (ordered(x) - ordered(y)).abs()
    most, differing, elements = max(most, int(apart.max())), differing + int((apart > 0).sum()), elements + x.numel()
print(json.dumps({"dtype": str(next(iter(a.values())).dtype), "elements": elements, "differing": differing, "most": most}))
"""


#: Trinity's own CI shape: 2 nodes x 2 NPUs, stated (``node_num: 2``, ``gpu_per_node: 2``), two rollout engines
#: (2 NPUs) and the trainer on the other two.
TWO_NODES = [
    (
        "  ray_address: auto          # node_num / gpu_per_node left unset: Trinity counts the accelerators itself\n",
        "  ray_address: auto\n  node_num: 2\n  gpu_per_node: 2\n",
    ),
    ("    engine_num: 1\n", "    engine_num: 2\n"),
]


# 7-10 min, by hand: CI keeps the single-node run's HCCL syncs and digests (tests/e2e/test_trinity_run.py)
# and the two-node cluster from the shell (tests/user/test_user_host.py)
@pytest.mark.beyond_ci
def test_compat_both_on_two_nodes_syncs_the_weights_from_one_node_to_the_other(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Two GRPO steps on a simulated cluster of 2 nodes x 2 NPUs, with the trainer's ranks on
    one node and the two rollout engines on the other, so that every weight sync crosses the nodes: each
    engine loads exactly what the trainer sent, and each process uses its own NPU of its node."""
    out = tmp_path / "nodes2"
    result = scenario.run(
        "compat", out, timeout=1200, model=tiny_model, nodes=2, npus=2, cpus=8, name="nodes2", progress=print,
        edit=lambda text: scenario.replaced(text, TWO_NODES),
    )  # fmt: skip
    print(json.dumps(result))
    assert result["rc"] == 0, result["first_error"]
    assert "Error in Trainer" not in scenario.all_logs(out), result["first_error"]
    assert sorted(scenario.trainer_metrics(out)) == [1, 2]
    sent = scenario.trainer_sent(out)
    assert len(sent) == 3, sent  # before step 1, after each of the two steps
    # both engines hold exactly what the trainer sent after each sync (bfloat16 on both sides: no conversion)
    assert len(set(sent)) == 3, sent
    assert collections.Counter(scenario.rollout_loads(out)) == {digest: 2 for digest in sent}
    placed = nodes_of(out / "work" / "reports")
    print("placement:", placed)
    trainer, rollout = placed["WorkerDict"], placed["vLLMRolloutModel"]
    assert len(trainer) == len(rollout) == 2, placed
    assert len({node for node, _ in trainer}) == len({node for node, _ in rollout}) == 1, placed
    assert {node for node, _ in trainer}.isdisjoint(node for node, _ in rollout), placed
    # on each node, each of its processes has an NPU of its own
    assert sorted(device for _, device in trainer) == sorted(device for _, device in rollout) == ["0", "1"], (
        placed
    )


def reports_by_actor_class(reports: Path) -> dict[str, list[dict[str, Any]]]:
    """The run's per-process reports (read as ``doctor`` reads them), by the Ray actor class of the process."""
    found: dict[str, list[dict[str, Any]]] = {}
    for report in read_reports(str(reports)):
        actor_class = (report.get("ray") or {}).get("actor_class")  # type: ignore[attr-defined]
        if actor_class:
            found.setdefault(str(actor_class), []).append(report)
    return found


def nodes_of(reports: Path) -> dict[str, list[tuple[str, str]]]:
    """Ray actor class -> (node id, ``ASCEND_RT_VISIBLE_DEVICES``) of each of its processes, from the
    per-process reports."""
    return {
        actor_class: [
            (report["ray"]["node_id"], report["environment"].get("ASCEND_RT_VISIBLE_DEVICES", ""))
            for report in found
            if report["ray"].get("node_id")
        ]
        for actor_class, found in reports_by_actor_class(reports).items()
    }


def _sequence_parallel(size: int) -> Callable[[str], str]:
    """The shipped SFT config at ``ulysses_sequence_parallel_size: size`` with ``use_remove_padding: true``
    (Trinity's default, stated), and the bundled GRPO config's lr of 1e-3, so that step 2's loss depends on
    step 1's update."""
    return lambda text: scenario.replaced(
        text,
        [
            ("  algorithm_type: sft\n", "  algorithm_type: sft\n  optimizer:\n    lr: 1.0e-3\n"),
            (
                "  max_token_len_per_gpu: 256\n",
                f"  max_token_len_per_gpu: 256\n  use_remove_padding: true\n  ulysses_sequence_parallel_size: {size}\n",
            ),
        ],
    )


#: The relative tolerance between the loss at sequence-parallel size 2 and 1: both runs compute the same tokens
#: with the same weights, but in other pieces (a rank's share of the sequence against a rank's whole
#: conversation) and so other sums, and the forward pass runs in bfloat16 (verl's FSDP ``dtype``), whose
#: rounding step is 2**-8 relative: 1e-3 is a quarter of that.
SP_TOLERANCE = 1e-3


@pytest.mark.beyond_ci
def test_compat_sft_at_sequence_parallel_size_2_computes_the_loss_of_size_1(
    tmp_path: Path, tiny_model: Path
) -> None:
    """SFT with Ulysses sequence parallelism (``ulysses_sequence_parallel_size: 2``,
    ``use_remove_padding: true``) on a 2-NPU trainer, against the same run at size 1 (data parallel 2).  Each
    step's loss is equal within ``SP_TOLERANCE``; the trainer's ranks ran their attention through
    ``npu_fusion_attention`` in its varlen layout (TND), and at size 2 only, their all-to-all over the simulated
    HCCL (both counted in the per-process reports)."""
    config, loss = MODES["sft"]
    losses, counts = {}, {}
    for size in (1, 2):
        out = tmp_path / f"sp{size}"
        result = scenario.run(
            "compat", out, timeout=900, model=tiny_model, npus=2, cpus=8, config=config, edit=_sequence_parallel(size),
            name=f"sft-sp{size}", stuck_after=120, progress=print,
        )  # fmt: skip
        assert result["rc"] == 0, result
        losses[size] = {step: values.get(loss) for step, values in scenario.trainer_metrics(out).items()}
        counts[size] = simulated_counts(out / "work" / "reports", "WorkerDict")
        print(size, losses[size], counts[size])
    assert sorted(losses[1]) == sorted(losses[2]) == [1, 2], losses
    for step in (1, 2):
        one, two = losses[1][step], losses[2][step]
        assert isinstance(one, float) and isinstance(two, float), losses
        assert math.isclose(one, two, rel_tol=SP_TOLERANCE), (step, losses)
    assert losses[1][1] != losses[1][2], f"training did not move the loss: {losses}"
    for size in (1, 2):
        ranks = counts[size]
        assert len(ranks) == 2, ranks
        assert all(rank["kernels"].get("torch_npu.npu_fusion_attention[TND]", 0) > 0 for rank in ranks), ranks
        all_to_all = [
            rank["hccl"].get("alltoall_base", 0) + rank["hccl"].get("alltoall", 0) for rank in ranks
        ]
        assert all(all_to_all) if size == 2 else not any(all_to_all), (size, ranks)


def simulated_counts(reports: Path, actor_class: str) -> list[dict[str, dict[str, int]]]:
    """What the simulated Ascend computed in each process of a Ray actor class (its report's ``simulated``
    section: kernel calls, and collectives over hccl)."""
    found = reports_by_actor_class(reports).get(actor_class, [])
    return [report.get("simulated", {"kernels": {}, "hccl": {}}) for report in found]
