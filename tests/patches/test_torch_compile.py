"""torch.compile on the simulated Ascend: off without an Ascend compiler backend, and the report says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npu_compat.testing import simulation_env
from tests.conftest import SIM_PATH, last_json, run_py

#: exercises verl: stack-b (stack-a with another verl) runs it (noxfile)
pytestmark = pytest.mark.uses_verl

pytest.importorskip("trinity", reason="needs trinity-rft (installed by the upstream stack sessions)")

PROBE = """
import json, socket, importlib, importlib.util, importlib.metadata as md
EXTEND
import npu_compat
ACTIVATE and npu_compat.activate()
import torch
out = {}
if md.version("trinity-rft").startswith("0.6") and not md.version("verl").startswith("0.7"):
    from trinity.common.config import Config
    from trinity.trainer.verl.config import _build_actor_config
    from verl.workers.config.engine import FSDPEngineConfig
    actor = _build_actor_config(Config(), "fsdp2", 10)
    # what verl 0.8's FSDP engine reads (its entropy is compiled when True), as verl builds it
    engine = FSDPEngineConfig(**{k: v for k, v in actor["fsdp_config"].items() if k == "use_torch_compile"})
    out["compiled"] = actor["use_torch_compile"] and engine.use_torch_compile
    out["engine_compiled"] = engine.use_torch_compile
else:
    import torch.distributed as dist
    from omegaconf import OmegaConf
    from verl.workers.actor.dp_actor import DataParallelPPOActor
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    layout = "verl.verl_config" if md.version("trinity-rft").startswith("0.5") else "verl_legacy.verl_config"
    actor_conf = OmegaConf.structured(importlib.import_module("trinity.trainer." + layout).veRLConfig().actor_rollout_ref.actor)
    actor_conf.ulysses_sequence_parallel_size = 1   # the validator fills this in
    actor = DataParallelPPOActor(actor_conf, torch.nn.Linear(2, 2), None)
    out["compiled"] = hasattr(actor.compute_entropy_from_logits, "_torchdynamo_orig_callable")
out["inductor_module"] = importlib.util.find_spec("torch_npu._inductor") is not None
out["report"] = {r["id"]: [r["status"], r["reason"]] for r in npu_compat.report() if "compile" in r["id"]}
print(json.dumps(out))
"""


#: torch_npu's ``_inductor`` as the real one behaves on import: Inductor's code generation registered for ``npu``
#: (here the CPU's classes: nothing is compiled in these tests)
INDUCTOR_NPU = """
from torch._inductor.codegen.common import register_backend_for_device
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen
register_backend_for_device("npu", CppScheduling, PythonWrapperCodegen)
"""


def _run(activate: bool, extra_path: list[str] | None = None, torch_npu_dir: str | None = None) -> Any:
    sim = {k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}
    # torch_npu_dir: a directory whose packages are torch_npu's first (its _inductor, as a real wheel has it)
    extend = f"import torch_npu; torch_npu.__path__.insert(0, {torch_npu_dir!r})" if torch_npu_dir else ""
    code = PROBE.replace("ACTIVATE", str(activate)).replace("EXTEND", extend)
    return last_json(run_py(code, env=sim, pythonpath=[*SIM_PATH, *(extra_path or [])], timeout=300))


def _applied(report: dict[str, list[str]]) -> list[str]:
    return [i for i, (status, _) in report.items() if status == "applied"]


def test_stock_compiles() -> None:
    assert _run(activate=False)["compiled"] is True


def test_off_on_npu_without_a_compiler_backend() -> None:
    out = _run(activate=True)
    assert out["compiled"] is False
    assert out.get("engine_compiled", False) is False  # verl 0.8's FSDP engine: its own key
    assert len(_applied(out["report"])) == 1  # the one patch for this stack's trainer path


def test_stays_on_where_inductor_has_an_npu_backend_and_the_report_says_which(tmp_path: Path) -> None:
    (tmp_path / "_inductor").mkdir()
    (tmp_path / "_inductor" / "__init__.py").write_text(INDUCTOR_NPU)
    out = _run(activate=True, torch_npu_dir=str(tmp_path))
    assert out["compiled"] is True
    assert _applied(out["report"]) == []
    reasons = [reason for status, reason in out["report"].values() if status == "skipped"]
    assert any("torch_npu._inductor" in reason for reason in reasons), out["report"]


def test_an_inductor_module_that_registers_no_backend_does_not_keep_it_on(tmp_path: Path) -> None:
    """The simulated torch_npu's own ``_inductor`` (vllm-ascend's worker imports it where Triton is found)
    registers no code generation for ``npu``: Inductor could not compile there, so compile goes off."""
    out = _run(activate=True)
    assert out["inductor_module"] is True
    assert out["compiled"] is False
    assert len(_applied(out["report"])) == 1


def test_torchair_alone_does_not_keep_it_on(tmp_path: Path) -> None:
    """torchair is a torch.compile backend of its own, which verl does not name: with it alone, verl's
    compile (Inductor's) would still find no NPU backend, so compile goes off."""
    (tmp_path / "torchair").mkdir()
    (tmp_path / "torchair" / "__init__.py").write_text("")
    out = _run(activate=True, extra_path=[str(tmp_path)])
    assert out["compiled"] is False
    assert len(_applied(out["report"])) == 1
