"""Trinity's ``mode: bench`` and ``mode: serve`` through ``python -m npu_compat trinity run``.

``bench`` evaluates the checkpoints a finished run saved (``Explorer.benchmark``: each ``global_step_N`` loaded
into the rollout's vLLM engine, the config's eval taskset run on it, ``bench/...`` metrics per step);
``serve`` starts Trinity's OpenAI-compatible proxy (``ExplorerService``) in front of the rollout's vLLM API
server and serves until stopped.  Both on the simulated 2-NPU Ascend cluster (``tests/e2e/serve_bench.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import trinity_or_skip
from tests.e2e import scenario, serve_bench

TRINITY = trinity_or_skip(("0.6.",), "Trinity 0.6's bench and serve modes")

#: each run is a Ray cluster of some 10-25 processes: several minutes on a shared 2-core machine
pytestmark = [pytest.mark.many_processes, pytest.mark.beyond_ci]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario.make_model(tmp_path_factory.mktemp("serve-bench") / "tiny-model")


def test_compat_serves_a_chat_completion_through_the_proxy(tmp_path: Path, tiny_model: Path) -> None:
    """``mode: serve`` logs its service URL; one chat completion through the proxy gets an answer with
    content; SIGTERM to the driver's group stops it, and the cluster goes away."""
    result = serve_bench.retrying_start(
        lambda: serve_bench.run_serve(tmp_path / "serve", tiny_model, timeout=900, progress=print)
    )
    print(json.dumps(result, default=str))
    assert result.get("url"), result
    response = result["response"]
    assert isinstance(response, dict), result
    choices = response["choices"]
    assert choices and isinstance(choices[0]["message"]["content"], str), response
    assert choices[0]["message"]["content"] or choices[0].get("token_ids"), response
    assert result["cluster_gone"], result


def test_compat_benches_the_checkpoints_of_a_finished_run(tmp_path: Path, tiny_model: Path) -> None:
    """A two-step run saving a checkpoint each step, then ``mode: bench`` over its checkpoint directory:
    exit 0, and an eval score logged for each saved checkpoint."""
    trained = tmp_path / "train"
    result = serve_bench.retrying_start(
        lambda: scenario.run(
            "compat",
            trained,
            timeout=900,
            model=tiny_model,
            edit=serve_bench.train_config,
            name="save",
            progress=print,
        )
    )
    print(json.dumps(result))
    assert result["rc"] == 0, result
    root = trained / "work" / "checkpoints"
    saved = sorted(p.parent.name for p in root.glob("*/*/global_step_*/actor"))
    assert saved == ["global_step_1", "global_step_2"], saved

    bench = tmp_path / "bench"
    edit = serve_bench.bench_config(root)
    result = serve_bench.retrying_start(
        lambda: scenario.run(
            "compat", bench, timeout=900, model=tiny_model, edit=edit, name="bench", progress=print
        )
    )
    print(json.dumps(result))
    assert result["rc"] == 0, result
    text = (bench / "driver.log").read_text(errors="replace")
    assert "Benchmark finished." in text, result["first_error"]
    metrics = serve_bench.bench_metrics(bench)
    print(json.dumps(metrics))
    assert sorted(metrics) == [1, 2], metrics
    for step, values in metrics.items():
        scores = {k: v for k, v in values.items() if k.startswith(f"bench/{serve_bench.EVAL_TASKSET}/")}
        assert scores, (step, values)
