"""The rollout in the shapes Trinity's users run, as whole ``trinity run``s on a simulated Ascend cluster.

Each test edits the bundled ``examples/e2e/trinity_tiny.yaml`` into one shape (``scenario.run``'s ``edit``)
and runs it through ``python -m npu_compat`` on an NPU-only cluster of the size the shape needs.  What
each proves is read from the logs of every process: the stages, the trainer's steps, and the weight
digests both sides log (``npu_compat.testing._digest``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import trinity_or_skip
from tests.e2e import scenario

TRINITY = trinity_or_skip(("0.6.",), "the shapes are checked with trinity-rft 0.6 (stacks a, b)")

#: each run is a Ray cluster of some 30 processes: it runs with no other test beside it (noxfile)
pytestmark = pytest.mark.many_processes


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario.make_model(tmp_path_factory.mktemp("shapes") / "tiny-model")


def _replace(pairs: list[tuple[str, str]]) -> Any:
    return lambda text: scenario.replaced(text, pairs)


#: Two engines of TP 2 for the rollout (four NPUs) and two NPUs for the trainer, on one node of six.
TP2_X2 = _replace([
    ("    engine_num: 1\n", "    engine_num: 2\n"),
    ("    tensor_parallel_size: 1\n", "    tensor_parallel_size: 2\n"),
])  # fmt: skip


@pytest.mark.beyond_ci
def test_two_engines_of_tp2_and_two_trainer_npus_sync_every_shard(tmp_path: Path, tiny_model: Path) -> None:
    out = tmp_path / "tp2x2"
    result = scenario.run(
        "compat", out, timeout=1500, model=tiny_model, npus=6, edit=TP2_X2, name="tp2x2", progress=print
    )
    print(json.dumps(result))
    assert result["rc"] == 0, result["first_error"]
    assert "second_train_step_finished" in result["stages"]
    assert "rollout_on_weight_version_2" in result["stages"]
    assert [s["step"] for s in scenario.train_steps(out)] == [1, 2]
    sent = scenario.trainer_sent(out)
    assert len(sent) == 3, sent  # before step 1, after each of the two steps
    loads = scenario.converted_loads(out)
    # 2 engines x 2 ranks, each loading every sync: 12 updates, each rank its own process
    assert len(loads) == 3 * 4, loads
    assert len({load["process"] for load in loads}) == 4
    for i, digest in enumerate(sent):
        this_sync = [load for load in loads if load["update"] == str(i)]
        assert sorted(load["rank"] for load in this_sync) == ["0", "0", "1", "1"]
        for load in this_sync:
            assert load["received"] == digest  # every rank of every engine got the trainer's full tensors
            assert load["holds"] == load["expected"]  # and holds exactly its slice of them
        # the two ranks of an engine hold different shards
        assert len({load["holds"] for load in this_sync}) == 2
    # every engine generated, on both of its ranks, the same requests: each rank's runner, a vLLM worker of
    # its engine's vLLMRolloutModel actor, logs its count of requests
    most = scenario.served_per_rank(out)
    engines = {engine for engine, _rank in most}
    assert len(engines) == 2 and sorted(most) == sorted((e, r) for e in engines for r in "01"), most
    assert all(most[e, "0"] == most[e, "1"] > 0 for e in engines), most
