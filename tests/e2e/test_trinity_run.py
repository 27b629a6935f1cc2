"""The real ``trinity run`` on a simulated Ascend Ray cluster, with and without npu-compat.

Each run starts one simulated Ascend cluster (``{"NPU": 2}``, no GPU), runs the bundled
``examples/e2e/trinity_tiny.yaml`` (a tiny random Qwen2 made at run time) with a bounded
timeout, and reads the stages reached from the logs of every process (``tests/e2e/scenario.py``).
What each stop means is in ``docs/findings/shapes.md``.  The config's keys are read alike by
trinity-rft 0.6.0 and 0.5.2, so the same scenario runs on all three stacks; what differs by
release (the error stock stops with, which patches apply where, 0.5.2 logging less) is below.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from npu_compat.tools.timeline import Row, render_text
from tests.conftest import beyond_ci_where, trinity_or_skip
from tests.e2e import scenario

TRINITY = trinity_or_skip(("0.5.", "0.6."), "the bundled config is for trinity-rft 0.5/0.6")

#: a run is a Ray cluster of some 25 processes: it runs with no other test beside it (noxfile)
pytestmark = pytest.mark.many_processes

#: trinity-rft 0.5.2 (stack c): its own trainer module, vLLM 0.18 with Trinity's worker *extension*
REL_052 = TRINITY.startswith("0.5.")
# verl 0.8 runs Trinity 0.6's new engine trainer (trinity.trainer.verl); verl 0.7.1 its legacy one (stack b)
LEGACY = Version(md.version("verl")) < Version("0.8")
if REL_052:
    TRAINER_DEVICE, WORKER_CUDA_VIEW = "trinity.verl.trainer_device", "trinity.verl.fsdp_workers.cuda"
elif LEGACY:
    TRAINER_DEVICE, WORKER_CUDA_VIEW = (
        "trinity.verl_legacy.trainer_device",
        "trinity.verl_legacy.fsdp_workers.cuda",
    )
else:
    TRAINER_DEVICE, WORKER_CUDA_VIEW = "trinity.verl.trainer.device_name", "trinity.verl.monkey_patch.cuda"

TRAINER_SIDE = [
    "config_validated",
    "explorer_actor",
    "trainer_actor",
    "verl_pg_ready",
    "verl_workers_started",
]
# 0.5.2 logs nothing when its rollout placement group is ready; its actor scheduled in the NPU bundle shows it
ROLLOUT_SIDE = [
    "config_validated",
    "explorer_actor",
    *([] if REL_052 else ["rollout_pg_ready"]),
    "rollout_actor_scheduled",
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny model for every run of this module (a run only reads it; making it takes some 20 s)."""
    return scenario.make_model(tmp_path_factory.mktemp("e2e") / "tiny-model")


def _run(
    tmp_path: Path, model: Path, mode: str, cluster: str, timeout: float, **kw: Any
) -> dict[str, object]:
    out = tmp_path / f"{mode}-{cluster}"
    result = scenario.run(mode, out, timeout=timeout, cluster=cluster, model=model, **kw)
    print(json.dumps(result))
    return result


# The stock runs carry no ``uses_verl``: stack-b (stack-a with verl 0.7.1) does not run them.  The first stops
# in Trinity's config validation, before verl is imported; the second at the GPU bundles of verl's resource pool,
# whose request on the legacy trainer's path is the catalogue's row A28, red on stack-b.


# by hand, for CI's time: the catalogue's rows A1 and B1 (the same count, by a probe) are red in CI
@pytest.mark.beyond_ci
def test_stock_stops_at_trinitys_own_gpu_count(tmp_path: Path, tiny_model: Path) -> None:
    """Stock Trinity counts the cluster's "GPU" resources (0 here): config validation divides by zero
    (0.6.0), or finds no GPU left for the trainer (0.5.2)."""
    result = _run(tmp_path, tiny_model, "stock", "auto", 120)
    assert result["stages"] == [], result
    if REL_052:
        assert str(result["first_error"]).startswith("ValueError: Not enough GPUs for trainer."), result
    else:
        assert result["first_error"] == "ZeroDivisionError: integer modulo by zero", result


#: Since the simulation's ``npu`` tensors compute, the compat runs go to the end on trinity 0.6.0, on either trainer
#: path (stacks a and b); trinity 0.5.2 (stack c) has its own test below (docs/findings/shapes.md).
ESTABLISHED = not REL_052
SYNC_SETUP = "weight_sync_setup_started"
needs_established = pytest.mark.skipif(
    not ESTABLISHED,
    reason="trinity-rft 0.5.2 syncs through its own WorkerExtension: test_compat_052_... (docs/findings/stacks.md)",
)
#: the patch that turns torch.compile off in the trainer's workers: verl 0.8's engine config, or the legacy
#: dp_actor's
WORKER_COMPILE = "verl.dp_actor.torch_compile" if LEGACY else "trinity.verl.config.torch_compile"


@needs_established
@pytest.mark.uses_verl  # the whole run on verl's trainer: stack-b (stack-a with verl 0.7.1) too
# by hand for CI's time (5 min; 7 on stack b's legacy trainer): CI's whole run on stack a is the user's own
# (tests/user/test_user_trinity_run.py), which checks the syncs' digests and every process's patches too
@pytest.mark.beyond_ci
def test_compat_both_runs_two_grpo_steps_syncing_weights_over_hccl(tmp_path: Path, tiny_model: Path) -> None:
    """The bundled config as it is (mode ``both``, ``total_steps: 2``, ``sync_method: nccl``, the rollout at
    Trinity's defaults) runs to the end: npu-compat counts the NPUs, the verl worker group is up on NPU bundles, FSDP2 trains on
    (simulated) ``npu`` tensors, the vLLM engine runs on vllm-ascend's ``NPUWorker``, the weight-sync
    group forms over HCCL between trainer rank 0 and the rollout worker, and each sync -- before step 1,
    after each train step -- leaves the rollout's model holding what the trainer sent: the digest both
    processes log (``npu_compat.testing._digest``).  The driver exits 0 with weight version 2."""
    result = _run(tmp_path, tiny_model, "compat", "auto", 900)
    out = tmp_path / "compat-auto"
    assert result["rc"] == 0, result
    assert result["stages"] == [
        "npus_counted", *TRAINER_SIDE, "verl_models_built", "trainer_ready",
        *ROLLOUT_SIDE[2:], "rollout_models_ready", SYNC_SETUP, "weight_sync_group_formed",
        "explore_step_started", "train_step_started", "train_step_finished", "second_train_step_finished",
        "rollout_on_weight_version_2",
    ], result  # fmt: skip
    assert result["boundaries"] == [], result
    text = scenario.all_logs(out)
    assert "Error in Trainer" not in text, result["first_error"]  # Trinity logs a trainer crash and exits 0
    assert re.search(r"> Explorer \(\w+\) finished\.", text) and "> Trainer finished." in text
    # the syncs: step 0 (before training) and after each train step; the rollout holds what was sent
    syncs = scenario.weight_syncs(out)
    assert len(syncs) == 3, syncs
    assert all(sync["sent"] == sync["loaded"] for sync in syncs), syncs
    assert len({sync["sent"] for sync in syncs}) == 3, syncs  # each train step changed the weights
    steps = scenario.train_steps(out)
    assert [step["step"] for step in steps] == [1, 2], steps
    assert all(step["reward_mean"] is not None and step["pg_loss"] is not None for step in steps), steps
    # the rollout at Trinity's defaults (the bundled config sets none of them): enforce_eager false, so the
    # release captures ACL graphs (PIECEWISE, and FULL for decode); bfloat16; a KV cache of 0.9 of the
    # 64 GiB device less the weights
    assert "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%" in text
    assert "Capturing CUDA graphs (decode, FULL): 100%" in text
    assert "dtype=torch.bfloat16" in text
    kv = re.findall(r"Available KV cache memory: ([\d.]+) GiB", text)
    assert kv and all(abs(float(gib) - 0.9 * 64) < 0.01 for gib in kv), kv
    # the prompts reach the rollout and it generates (over max_prompt_tokens Trinity would skip them)
    served = [int(n) for n in re.findall(r"NPUModelRunner on npu:\d+ served (\d+) requests", text)]
    assert served and all(served), served
    assert "Prompt was truncated" not in text
    print("host memory the run added at its peak:", result["host_memory_peak_gib"], "GiB")
    # the timeline (doctor --timeline): every process's report places it -- started, then npu-compat
    # active, then its last change -- the driver, Ray's processes, the actors and vLLM's among them
    timeline = result["timeline"]
    print("\n".join(render_text([Row(**row) for row in timeline])))
    assert {"ray-driver", "ray-actor"} <= {row["role"] for row in timeline}, timeline
    for row in timeline:
        assert None not in (row["started"], row["activated"], row["updated"]), row
        assert row["started"] <= row["activated"] + 0.02 and row["activated"] <= row["updated"], row
        # its import log places its imports' end, up to its role, in every Ray actor and vLLM process
        if row["role"] == "ray-actor" or row["role"].startswith("vllm ("):
            assert row["imported"] is not None and row["modules"] > 100, row
            assert row["started"] <= row["imported"] <= row["role_known"], row
    # each patch is reported applied in the process where its code runs
    _assert_applied(
        result,
        {
            "ray-driver": ["trinity.config_validator.npu_count"],
            "Trainer": [TRAINER_DEVICE, "ray.placement_group"],
            "WorkerDict": [WORKER_CUDA_VIEW, "torch.distributed.init_process_group",
                           "trinity.distributed.vllm_weight_transfer", WORKER_COMPILE],
            "vLLMRolloutModel": ["trinity.vllm_model.weights_not_nz", "vllm.weight_transfer.nccl_is_hccl"],
            "vllm (VllmWorker-0)": ["trinity.vllm.worker_cls", "vllm.weight_transfer.nccl_is_hccl"],
        },
    )  # fmt: skip


#: the stages of a whole run whose weight sync is not ``nccl``: no weight-sync group between trainer and rollout
WHOLE_RUN_WITHOUT_GROUP = [
    "npus_counted", *TRAINER_SIDE, "verl_models_built", "trainer_ready", *ROLLOUT_SIDE[2:],
    "rollout_models_ready", "explore_step_started", "train_step_started", "train_step_finished",
    "second_train_step_finished", "rollout_on_weight_version_2",
]  # fmt: skip


def _rollout_loads_after_two_train_steps(out: Path) -> list[str]:
    """Two train steps with a loss, and the rollout loaded new weights after each (versions 1 and 2):
    the digests of what its worker received, in order."""
    text = scenario.all_logs(out)
    assert "Error in Trainer" not in text, scenario.first_error(out)
    steps = scenario.train_steps(out)
    assert [step["step"] for step in steps] == [1, 2], steps
    assert all(step["pg_loss"] is not None for step in steps), steps
    loads = scenario.rollout_loads(out)
    # where the rollout holds another dtype than was sent (bf16, the default, from a float32 state dict),
    # what it received is the full tensors' digest, and it holds exactly their conversion
    converted = scenario.converted_loads(out)
    if converted:
        assert len(converted) == len(loads), converted
        assert all(load["holds"] == load["expected"] for load in converted), converted
        loads = [load["received"] for load in converted]
    assert len(loads) == 2 and loads[0] != loads[1], loads
    return loads


@needs_established
@pytest.mark.uses_verl
@pytest.mark.beyond_ci  # 6 min each: the nccl run above (by hand too) and the user's whole run (CI) sync over HCCL
@pytest.mark.parametrize("sync_method", ["checkpoint", "memory"])
def test_compat_both_syncs_weights_by_checkpoint_and_by_memory(
    tmp_path: Path, tiny_model: Path, sync_method: str
) -> None:
    """Trinity 0.6.0's two other weight syncs in mode ``both``: ``checkpoint`` (the trainer saves, the
    rollout's worker reads the file through Trinity's checkpoint weight-transfer engine) and ``memory``
    (the trainer uploads its state dict to the Synchronizer actor, the worker pulls it from Ray).

    After the last sync the rollout holds what the trainer produced, its final checkpoint
    (global_step_2): for ``checkpoint`` as Trinity's loader reads it back (bfloat16: what the rollout is
    sent), for ``memory`` the trainer's FSDP shard as saved (float32: the state dict it uploads)."""
    result = _run(tmp_path, tiny_model, "compat", "auto", 900, sync_method=sync_method)
    assert result["rc"] == 0, result
    assert result["stages"] == WHOLE_RUN_WITHOUT_GROUP, result
    assert result["boundaries"] == [], result
    loads = _rollout_loads_after_two_train_steps(tmp_path / "compat-auto")
    how = "loader" if sync_method == "checkpoint" else "shard"
    assert scenario.trainer_checkpoint(tmp_path / "compat-auto", how) == (2, loads[-1]), loads


@needs_established
@pytest.mark.uses_verl
@pytest.mark.beyond_ci  # the two sides of the nccl run above, started apart
def test_compat_explore_and_train_as_two_commands_sharing_a_checkpoint_directory(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The disaggregated run: ``trinity run`` in mode ``explore`` and in mode ``train``, two commands on
    one cluster at once, with one checkpoint directory (the experience buffer in SQLite there; the weight
    sync ``checkpoint``, the only one Trinity allows between two commands).  The trainer trains on what
    the explorer wrote, and the explorer's rollout loads each checkpoint the trainer saves."""
    result = _run(tmp_path, tiny_model, "compat", "split", 900)
    assert result["rc"] == 0, result
    assert result["stages"] == WHOLE_RUN_WITHOUT_GROUP, result
    assert result["boundaries"] == [], result
    out = tmp_path / "compat-split"
    assert re.search(r"> Explorer \(\w+\) finished\.", (out / "driver.explore.log").read_text()), result
    assert "> Trainer finished." in (out / "driver.train.log").read_text(), result
    loads = _rollout_loads_after_two_train_steps(out)
    assert scenario.trainer_checkpoint(out) == (2, loads[-1]), loads


@pytest.mark.skipif(not REL_052, reason="trinity-rft 0.5.2's own weight sync (stack c)")
@pytest.mark.beyond_ci  # 5 min on stack c, over CI's budget: stack a runs the whole run in CI
def test_compat_052_both_runs_two_grpo_steps_syncing_weights_over_hccl(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Trinity 0.5.2 (vLLM 0.18, vllm-ascend 0.18.0) in mode ``both`` runs to the end: its
    weight-sync group -- verl's ``WorkerDict`` (rank 0) and Trinity's ``WorkerExtension`` in vLLM's
    EngineCore, both through ``trinity.distributed.init_process_group`` made ``hccl`` -- forms, the
    trainer syncs after each step and the Explorer reaches model version 2.

    0.5.2 sends the weights itself (``torch.distributed.broadcast`` in the worker, ``load_weights``
    per tensor in the extension), not through vllm-ascend's weight-transfer engine; the simulation digests
    both sides of those broadcasts, and at each sync the rollout holds what the trainer sent, in its dtype."""
    result = _run(tmp_path, tiny_model, "compat", "auto", 900)
    out = tmp_path / "compat-auto"
    assert result["rc"] == 0, result
    assert result["stages"] == [
        "npus_counted", *TRAINER_SIDE, *ROLLOUT_SIDE[2:], "rollout_models_ready", "explore_step_started",
        "train_step_started", "train_step_finished", "second_train_step_finished", "rollout_on_weight_version_2",
    ], result  # fmt: skip
    assert result["boundaries"] == [], result
    text = scenario.all_logs(out)
    assert re.search(r"Trainer init_process_group \S+ \(2\)\.", text), result  # the trainer's side, world 2
    assert re.search(r"\[vllm_worker\.py:\d+\] vLLM init_process_group finished\.", text), result
    assert "> Trainer finished." in text and re.search(r"> Explorer \(\w+\) finished\.", text), result
    # 0.5.2's train loop ends on the queue's StopAsyncIteration, which reaches it as a RuntimeError from
    # Ray (logged "Error in Trainer"), after the two steps: the same on any device
    errors = re.findall(r"Error in Trainer:\n(?:.*\n)*?.*?(\w+Error: .*)", scenario._driver_log(out))
    assert all("StopAsyncIteration" in e for e in errors), errors
    steps = scenario.train_steps(out)
    assert [step["step"] for step in steps][:2] == [1, 2], steps
    _shards_fresh(out, syncs=None, ranks=1)  # a bfloat16 rollout of the trainer's float32 weights
    assert "Prompt was truncated" not in text  # every prompt reached the rollout
    _assert_applied(
        result,
        {
            "ray-driver": ["trinity.config_validator.npu_count"],
            "WorkerDict": [WORKER_CUDA_VIEW, "trinity.distributed.init_process_group", "verl.dp_actor.torch_compile"],
            "vLLMRolloutModel": ["trinity.vllm_model.weights_not_nz", "vllm.weight_transfer.nccl_is_hccl"],
            "vllm (EngineCore)": [
                "trinity.vllm_worker.cuda", "trinity.distributed.init_process_group",
                "trinity.vllm_worker.graph_safe_sync",
            ],
        },
    )  # fmt: skip


def _real_vllm_ascend_laid_out() -> bool:
    from npu_compat.testing import _sites, _vllm_ascend_release

    vllm = _sites.installed_vllm()
    return vllm is not None and _vllm_ascend_release.is_laid_out(_sites.vllm_ascend_release(vllm))


#: The rollout as Ascend users of RL run it today (eager, as vime#157 runs it), at tensor parallel 2.
EAGER_TP2 = ("    tensor_parallel_size: 1\n", "    tensor_parallel_size: 2\n    enforce_eager: true\n")


def on_the_real_vllm_ascend() -> Any:
    """The marks of a whole run on the released vllm-ascend paired with the stack's vLLM (0.23.0.post1 on
    stacks a and b, 0.18.0 on stack c)."""

    def marks(test: Any) -> Any:
        test = pytest.mark.uses_verl(test)
        test = pytest.mark.skipif(
            not _real_vllm_ascend_laid_out(), reason="the real vllm-ascend is not laid out here"
        )(test)
        return test

    return marks


def _real_run_to_the_end(
    tmp_path: Path, tiny_model: Path, name: str, env: dict[str, str] | None = None, **kw: Any
) -> tuple[dict[str, Any], str]:
    """The bundled config on the released vllm-ascend, run to the end: exit 0, the two train steps and the
    rollout on weight version 2, no compute boundary, and the release's own engine.  The summary and every
    process's logs."""
    result = _run(tmp_path, tiny_model, "compat", "auto", 900, name=name, env=env, **kw)
    assert result["rc"] == 0, result
    assert result["stages"][-4:] == [
        "train_step_started", "train_step_finished", "second_train_step_finished", "rollout_on_weight_version_2",
    ], result  # fmt: skip
    assert "rollout_models_ready" in result["stages"] and result["boundaries"] == [], result
    text = scenario.all_logs(tmp_path / "compat-auto")
    assert "vllm_ascend.model_loader.rfork" in text  # the release registers its loaders
    return result, text


@on_the_real_vllm_ascend()
@beyond_ci_where(not REL_052)  # 6 min: CI runs it on stack c, the user's whole run on stack a
def test_compat_runs_on_the_real_vllm_ascend_with_an_eager_tp2_rollout(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The bundled config with the rollout at TP 2 and ``enforce_eager: true``, on the released vllm-ascend
    (0.18.0 for Trinity 0.5.2, 0.23.0.post1 for 0.6.0): Trinity's ``vLLMRolloutModel`` builds vLLM's engine on the real ``NPUWorker``s -- vLLM's executor sets ``ASCEND_RT_VISIBLE_DEVICES``
    after each worker imported torch, the runtime counts the devices at their first use -- and the run goes
    to the end: the trainer syncs after each step over HCCL and the Explorer reaches model version 2.  At each
    sync each rank holds exactly its slice of what the trainer sent, by the digests (0.6.0: the release's HCCL
    engine; 0.5.2: Trinity's own broadcasts).  On 0.6.0
    vLLM's multiprocess workers in the rollout actor see the actor's NPUs because npu-compat has Ray list them
    ascending (``ray.npu.visible_devices_ascending``, field failure F9: Ray gave ``2,1``)."""
    _result, text = _real_run_to_the_end(
        tmp_path, tiny_model, "eager-tp2", npus=3, edit=lambda text: text.replace(*EAGER_TP2)
    )
    assert "tensor_parallel_size=2" in text
    out = tmp_path / "compat-auto"
    errors = re.findall(r"Error in Trainer:\n(?:.*\n)*?.*?(\w+Error: .*)", scenario._driver_log(out))
    assert all("StopAsyncIteration" in e for e in errors), errors  # 0.5.2's loop ends so on any device
    # 0.6.0: the release's HCCL engine; 0.5.2: its own broadcasts (npu_compat.testing._weight_sync_digests)
    _shards_fresh(out, syncs=None if REL_052 else 3, ranks=2)
    # both ranks generated, the same requests (0.5.2: workers of vLLM's Ray executor, whose lines Ray's log
    # deduplication once folded into one); no prompt was over max_prompt_tokens, which Trinity would not send
    most = scenario.served_per_rank(out)
    assert sorted(rank for _engine, rank in most) == ["0", "1"], most
    assert len(set(most.values())) == 1 and min(most.values()) > 0, most
    assert "Prompt was truncated" not in text


@on_the_real_vllm_ascend()
@pytest.mark.beyond_ci  # 5 min per stack: CI runs the same graphs across syncs in tests/sim/test_real_vllm_ascend.py
def test_compat_runs_in_graph_mode_on_the_real_vllm_ascend(tmp_path: Path, tiny_model: Path) -> None:
    """The bundled config as it is -- the rollout at Trinity's defaults, ``enforce_eager`` false -- on the
    released vllm-ascend.  vLLM compiles the model and captures its ACL graphs (the simulation records and
    replays them on the storages they captured): on 0.18.0 (Trinity 0.5.2) PIECEWISE graphs, each piece
    through torchair's npugraph_ex in AsyncLLM's spawned engine core; on 0.23.0.post1 (Trinity 0.6.0) PIECEWISE
    graphs and FULL decode graphs, whose attention layers take each step's lengths through task updates.  The
    run goes to the end through its syncs, each with npu-compat's sync guard around the weight update (0.5.2's
    ``update_weight``; 0.23.0.post1's ``start``/``finish_weight_update`` on the NPUWorker).  Trinity's loads,
    and vLLM's layerwise reload, write every parameter in place; the reload builds vLLM's attention constants
    anew, which the guard puts back.  On 0.23.0.post1 each sync's digests, as the released HCCL engine sent
    the weights and as the rollout's model holds them (``npu_compat.testing._weight_sync_digests``), are equal."""
    result, text = _real_run_to_the_end(tmp_path, tiny_model, "graphs")
    assert "enforce_eager=False" in text
    assert "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%" in text
    if REL_052:
        # AsyncLLM's engine core, a spawned process, makes its own ascend config: npugraph_ex on (run eagerly)
        assert "enable_npugraph_ex is enabled" in text
        # Trinity's sync writes each parameter in place: the guard had nothing to put back
        assert "put back in place" not in text
        _assert_applied(result, {"vllm (EngineCore)": ["trinity.vllm_worker.graph_safe_sync"]})
        return
    assert "Capturing CUDA graphs (decode, FULL): 100%" in text
    # each update through vLLM's layerwise reload left every parameter and buffer in the storage the graphs
    # captured; what it built anew is the attention layers' q/k/v_range (constants, on the device from the first
    # reload on), which npu-compat put back
    updates = _UPDATES.findall(scenario._driver_log(tmp_path / "compat-auto"))
    assert len(updates) == 3 and updates[0][2] == "0", updates
    moved = {name for *_, names in updates for name in names.split(", ") if name}
    assert all(re.fullmatch(r"model\.layers\.\d+\.self_attn\.attn\.[qkv]_range", name) for name in moved), (
        moved
    )
    _syncs_fresh(tmp_path / "compat-auto")
    _assert_applied(
        result,
        {
            "vllm (VllmWorker-0)": [
                "vllm_ascend.worker.weight_update_noted",
                "vllm_ascend.worker.weight_update_graph_safe",
            ]
        },
    )


#: npu-compat's sync guard on 0.23.0.post1's NPUWorker: its two weight-update patches, as ``NPU_COMPAT_DISABLE`` takes them
SYNC_GUARD = "vllm_ascend.worker.weight_update_noted,vllm_ascend.worker.weight_update_graph_safe"
#: npu-compat's line at each weight update: ``(kept, of, put back, names)``
_UPDATES = re.compile(
    r"weight update: (\d+) of (\d+) tensors kept their storage, (\d+) re-allocated and put back in place"
    r"(?: \((.*)\))?\n"
)
#: What the release's layerwise reload left at each update: ``(at their address, of)`` parameters and buffers
_STORAGES = re.compile(
    r"simulated weight sync \(rollout storages\): (\d+) of (\d+) parameters and buffers at the address they had"
)


def _syncs_fresh(out: Path) -> None:
    """Three syncs over the release's HCCL engine (before step 1 and after each train step), each with the
    digests of what the trainer sent and of what the rollout's model holds equal, and vLLM's layerwise reload
    leaving every parameter and buffer at the address the graphs captured
    (``npu_compat.testing._weight_sync_digests``)."""
    syncs = scenario.weight_syncs(out)
    assert len(syncs) == 3, syncs
    assert all(sync["sent"] == sync["loaded"] for sync in syncs), syncs
    assert len({sync["sent"] for sync in syncs}) == 3, syncs  # each train step changed the weights
    storages = _STORAGES.findall(scenario._driver_log(out))
    assert len(storages) == 3 and all(kept == of for kept, of in storages), storages


def _shards_fresh(out: Path, syncs: int | None, ranks: int) -> None:
    """``syncs`` syncs (None: as many as the trainer logged, two at least) over HCCL to a rollout of tensor
    parallel ``ranks``: at each, every rank received the full tensors the trainer sent and holds exactly its
    slice of them (its ``expected``, cut as vLLM's layers partition them), and the ranks hold different
    slices."""
    sent = scenario.trainer_sent(out)
    syncs = max(len(sent), 2) if syncs is None else syncs
    assert len(sent) == syncs and len(set(sent)) == syncs, sent
    loads = scenario.converted_loads(out)
    assert len(loads) == syncs * ranks, loads
    for i, digest in enumerate(sent):
        this_sync = [load for load in loads if load["update"] == str(i)]
        assert sorted(load["rank"] for load in this_sync) == [str(r) for r in range(ranks)], this_sync
        assert all(load["received"] == digest and load["holds"] == load["expected"] for load in this_sync), (
            this_sync
        )
        assert len({load["holds"] for load in this_sync}) == ranks, this_sync


@on_the_real_vllm_ascend()
@pytest.mark.skipif(
    REL_052, reason="vLLM's weight-transfer API, its layerwise reload: Trinity 0.6.0 on 0.23.0.post1"
)
@pytest.mark.beyond_ci  # 7 min, by hand: the guarded run above is the one users get
def test_without_npu_compats_sync_guard_the_dense_run_in_graph_mode_stays_fresh(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The graph-mode run above with npu-compat's two weight-update patches left alone (``NPU_COMPAT_DISABLE``):
    stock's ACL graph handling.  For this dense model it is neither stale nor failing.  vLLM 0.23's layerwise
    reload copies every parameter and buffer back into the storage it had, so each graph replays the new
    weights; what it builds anew (the attention's q/k/v_range constants) no graph reads at these settings.  A
    replay of memory that only a graph still holds would fail the run (the simulation's ``GraphReplayError``);
    the run goes to the end, each sync's digests equal.  Where stock does go stale is recorded in
    ``docs/findings/reload-storages.md`` (plain tensor attributes that a layer derives)."""
    guard = SYNC_GUARD
    result, text = _real_run_to_the_end(tmp_path, tiny_model, "graphs", env={"NPU_COMPAT_DISABLE": guard})
    assert "Capturing CUDA graphs (decode, FULL): 100%" in text
    assert "npu-compat weight update:" not in text  # the guard is off
    _syncs_fresh(tmp_path / "compat-auto")
    applied = result["applied"]
    assert isinstance(applied, dict) and "vllm (VllmWorker-0)" in applied, result
    assert not any(set(guard.split(",")) & set(ids) for ids in applied.values()), applied


#: The workflow that records what the rollout generated, on which weight version (``tests/e2e/greedy_probe.py``)
PROBE = "tests.e2e.greedy_probe.RecordingMathWorkflow"


def greedy_after_syncs(text: str) -> str:
    """The bundled config for three train steps, with a greedy evaluation at every explore step and the trainer's
    weights saved as a Hugging Face checkpoint at every step (Trinity's ``save_hf_checkpoint: always``).  Its
    learning rate is 0.05: each AdamW step moves a weight of the tiny model (spread 0.5) by some 10 %, so that
    two steps change greedy tokens, and a graph that replayed older weights would generate others.

    Trinity's explorer evaluates before it syncs, and waits for the evaluation, so the evaluation at step k
    generates on the weights of the sync before it: the initial ones at step 1, the trainer's step k-1 after.
    The last sync (after step 3) is followed by no generation: Trinity 0.6.0's explore loop ends there ("TODO:
    support eval on last checkpoint"), so the last sync that a generation follows is the one after step 2."""
    return scenario.replaced(text, [
        ("    lr: 1.0e-3\n", "    lr: 5.0e-2\n"),
        ("  total_steps: 2\n", "  total_steps: 3\n"),
        ("      default_workflow_type: math_workflow\n", f"      default_workflow_type: {PROBE}\n"),
        ("  trainer_input:\n", scenario.eval_tasksets("tiny_math_greedy", temperature=0.0, workflow=PROBE)
         + "  trainer_input:\n"),
        ("  eval_interval: 1000\n", "  eval_interval: 1\n"),
        ("  save_interval: 0\n  save_hf_checkpoint: never\n", "  save_interval: 1\n  save_hf_checkpoint: always\n"),
    ])  # fmt: skip


#: An eager engine on the released vllm-ascend, at the rollout's dtype, greedy on the recorded prompts
EAGER_REFERENCE = """
import json, os
from vllm import LLM, SamplingParams
llm = LLM(model=os.environ["MODEL"], tokenizer=os.environ["TOKENIZER"], enforce_eager=True, dtype="bfloat16",
          max_model_len=80, seed=0)
prompts = json.loads(os.environ["PROMPTS"])
greedy = SamplingParams(temperature=0, max_tokens=int(os.environ["MAX_TOKENS"]))
out = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
print(json.dumps({"tokens": [list(r.outputs[0].token_ids) for r in out]}))
"""


def _trainers_checkpoints(out: Path, tiny_model: Path) -> dict[int, Path]:
    """The trainer's weights at each version: the model it started from (version 0, which the first sync sent),
    then the Hugging Face checkpoint Trinity saved after each train step."""
    found = {0: tiny_model}
    for config in (out / "work" / "checkpoints").rglob("actor/huggingface/config.json"):
        step = re.fullmatch(r"global_step_(\d+)", config.parent.parent.parent.name)
        assert step, config
        found[int(step.group(1))] = config.parent
    return found


@on_the_real_vllm_ascend()
@pytest.mark.skipif(REL_052, reason="Trinity 0.6.0's explorer (weight versions, evaluation before each sync)")
@pytest.mark.beyond_ci  # 10 min each, by hand: CI runs the graphs across syncs in tests/sim/test_real_vllm_ascend.py
@pytest.mark.parametrize(
    ("guard", "sync_method"), [("npu-compat", "nccl"), ("stock", "nccl"), ("npu-compat", "checkpoint")]
)
def test_in_graph_mode_the_rollout_generates_after_each_sync_what_an_eager_engine_on_the_trainers_weights_does(
    tmp_path: Path, guard: str, sync_method: str
) -> None:
    """Trinity's whole GRPO run at its rollout defaults, in graph mode, on the released vllm-ascend, three train
    steps: at each explore step a greedy evaluation, whose tokens (``tests/e2e/greedy_probe.py``) equal those of
    an eager engine loaded with the weights the trainer had at that version (its Hugging Face checkpoint of that
    step).  Training rewards that tell the responses apart make the weights move enough that the greedy tokens
    change from version to version, so a stale graph would show.  ``stock`` leaves npu-compat's two
    weight-update patches off (``NPU_COMPAT_DISABLE``): stock's ACL graph handling, fresh too for this dense
    model (see the test above).  ``checkpoint``: Trinity's checkpoint sync, the rollout loading each of the
    trainer's checkpoints through the same weight update (vLLM's layerwise reload), around which the guard runs."""
    from tests.sim.test_real_vllm_ascend import real_run

    env = {"NPU_COMPAT_DISABLE": SYNC_GUARD} if guard == "stock" else {}
    tiny_model = scenario.make_model(tmp_path / "varied-model", initializer_range=0.5)
    _, text = _real_run_to_the_end(
        tmp_path, tiny_model, "greedy", env=env, edit=greedy_after_syncs, sync_method=sync_method
    )
    out = tmp_path / "compat-auto"
    assert "Capturing CUDA graphs (decode, FULL): 100%" in text
    assert ("npu-compat weight update:" in text) == (guard == "npu-compat")
    syncs = scenario.weight_syncs(out)
    if sync_method == "nccl":  # the release's HCCL engine: each sync's digests, as sent and as loaded
        assert len(syncs) == 4 and all(sync["sent"] == sync["loaded"] for sync in syncs), syncs
    else:
        assert syncs == [], syncs
        assert len(_UPDATES.findall(scenario._driver_log(out))) >= 3, text[-3000:]
    records = [json.loads(line) for line in (out / "work" / "greedy_probe.jsonl").read_text().splitlines()]
    generated: dict[int, dict[tuple[int, ...], list[int]]] = {}
    for record in records:
        if record["eval"]:
            generated.setdefault(record["version"], {})[tuple(record["prompt"])] = record["response"]
    assert sorted(generated) == [0, 1, 2], sorted(generated)  # the evaluations of steps 1, 2 and 3
    weights = _trainers_checkpoints(out, tiny_model)
    assert {0, 1, 2} <= weights.keys(), weights
    prompts = sorted(generated[0])
    eager = {}
    for version in (0, 1, 2):
        assert sorted(generated[version]) == prompts, (version, generated)
        seen = real_run(
            EAGER_REFERENCE, timeout=600, MODEL=str(weights[version]), TOKENIZER=str(tiny_model),
            PROMPTS=json.dumps([list(p) for p in prompts]), MAX_TOKENS="8",
        )  # fmt: skip
        eager[version] = seen["tokens"]
        graph = [generated[version][p] for p in prompts]
        print(f"version {version}: graph mode {graph}, eager {eager[version]}")
        assert graph == eager[version], (version, graph, eager[version])
    # the check can fail: the trainer's steps changed what the model generates greedily
    assert eager[2] != eager[0], eager


@beyond_ci_where(REL_052)  # 3.5 min: on stack c by hand, stack a's in CI
def test_stock_both_hangs_on_a_gpu_placement_group(tmp_path: Path, tiny_model: Path) -> None:
    """Stock Trinity's verl worker group asks for {"GPU": 1, "CPU": 3}: pending forever on an NPU-only cluster."""
    # stock never gets past the GPU placement group: once Ray has called the request infeasible the run
    # is watched for 30 s more, then stopped (Ray's verdict is final: no node can ever grant a GPU bundle; the
    # watch shows that nothing goes on meanwhile)
    result = _run(tmp_path, tiny_model, "stock", "explicit", 300, stuck_after=30)
    assert result["rc"] == "stuck", result
    if REL_052:
        # 0.5.2's Explorer waits in its constructor on the rollout allocator's {"GPU": 1} bundles too
        assert result["stages"] == ["config_validated", "trainer_actor"], result
    else:
        assert result["stages"] == ["config_validated", "explorer_actor", "trainer_actor"], result
    text = scenario.all_logs(tmp_path / "stock-explicit")
    assert "No available node types can fulfill resource request" in text
    assert "'GPU': 1.0" in text


@needs_established
@pytest.mark.uses_verl
@pytest.mark.beyond_ci  # the whole run above generates on the same worker, with these patches
def test_compat_explore_generates_on_the_vllm_ascend_worker(tmp_path: Path, tiny_model: Path) -> None:
    """Mode explore: the rollout actor sits in an NPU bundle and vLLM builds its engine on the
    (simulated) Ascend platform; the worker's ``init_device`` forms its HCCL world group, its
    ``load_model`` (0.6.0: npu-compat's Trinity worker on ``NPUWorker``) registers Trinity's checkpoint
    weight-transfer engine -- importing ``vllm_extension``, whose patches apply in that process -- and
    the release's ``NPUModelRunner`` generates: the explore steps run, and the run ends."""
    result = _run(tmp_path, tiny_model, "compat", "explore", 480)
    assert result["stages"] == [*ROLLOUT_SIDE, "rollout_models_ready", "explore_step_started"], result
    assert result["boundaries"] == [], result
    assert result["rc"] == 0, result
    assert re.search(r"> Explorer \(\w+\) finished\.", scenario.all_logs(tmp_path / "compat-explore")), result
    common = {
        "ray-driver": ["trinity.config_validator.npu_count"],
        "Explorer": ["ray.options.actor", "ray.placement_group"],
        "vLLMRolloutModel": ["trinity.vllm_model.visible_devices", "vllm.weight_transfer.nccl_is_hccl"],
    }
    if REL_052:
        # vLLM 0.18 runs the worker inside its EngineCore process; 0.5.2 hands vLLM a worker extension
        # (its weight-sync group and torch.cuda calls), which the NPUWorker loads there
        worker = {"vllm (EngineCore)": ["trinity.vllm_worker.cuda", "trinity.distributed.init_process_group"]}
    else:
        worker = {
            "vllm (VllmWorker-0)": [
                "trinity.vllm.worker_cls",
                "vllm.weight_transfer.nccl_is_hccl",
                "trinity.vllm_extension.hccl_group",
                "trinity.vllm_extension.cuda",
                "trinity.vllm_extension.produce_checkpoint_weights.cuda_literals",
                "trinity.vllm_extension.consume_checkpoint_weights.cuda_literals",
            ]
        }
    _assert_applied(result, {**common, **worker})


def _assert_applied(result: dict[str, object], expected: dict[str, list[str]]) -> None:
    applied = result["applied"]
    assert isinstance(applied, dict), result
    for process, ids in expected.items():
        assert process in applied, f"no report of a {process} process applying a patch: {sorted(applied)}"
        missing = set(ids) - set(applied[process])
        assert not missing, f"{process}: {sorted(missing)} not applied; applied: {applied[process]}"
