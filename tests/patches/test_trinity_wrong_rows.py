"""The WRONG rows of both releases with the real upstream code on the simulated Ascend.

trinity-rft 0.6.0's rows A2, A7, A3, A35 are 0.5.2's rows B2, B9, B3, B32: the same code, patched by the
same specs (their version range covers both releases), so one module drives whichever release is
installed.  Nothing here crashes on stock Trinity: it does the CUDA thing silently.  Each child
interpreter runs what a user's ``trinity run`` runs -- Trinity's own config validators on a real
``Config`` and a tiny local model, and the real ``vLLMRolloutModel.__init__`` -- and reports what the
user would see: the visible-devices variables the rollout engine starts with, the memory check's
capacity, threshold and advice (and, in the logs, "NO GPU DETECTED"), and the ``torch.npu`` calls the
simulation recorded.

0.5.2's ``vLLMRolloutModel.__init__`` builds the vLLM engine itself (``vllm.AsyncLLMEngine.from_engine_args``),
which a CPU host cannot run; there the child puts a recorder that notes the environment the engine
would start with, so the whole of Trinity's ``__init__`` runs.

Three runs: npu-compat on an NPU decision, stock (``NPU_COMPAT=0``), and the CUDA decision (every
patched object identical, and the same behaviour as stock); where the memory check reaches the FSDP
estimate, a fourth on an NPU decision with ``PYTORCH_NPU_ALLOC_CONF`` set.
"""

from __future__ import annotations

import functools
import json
import tempfile
from typing import Any

import pytest

from npu_compat.patches.trinity_devices import CUDA_ADVICE, NPU_ADVICE
from npu_compat.testing import simulation_env
from tests.conftest import SIM_PATH, last_json, run_py, upstream_versions

#: exercises verl: stack-b (stack-a with another verl) runs it (noxfile)
pytestmark = pytest.mark.uses_verl

TRINITY, VERL = upstream_versions("trinity-rft", "verl")
if not TRINITY.startswith(("0.5.", "0.6.")):
    pytest.skip(f"the rows are trinity-rft 0.5's and 0.6's; {TRINITY} is installed", allow_module_level=True)

#: 0.5.2 builds its vLLM engine inside ``vLLMRolloutModel.__init__``; 0.6.0 later, in ``prepare``.
ENGINE_IN_INIT = TRINITY.startswith("0.5.")
#: The memory check reaches the FSDP estimate (which reads the allocator variable) on 0.5.2, and on
#: 0.6.0 with verl < 0.8 (its legacy trainer); 0.6.0 with verl >= 0.8 stops before it.
FSDP_ESTIMATE = ENGINE_IN_INIT or tuple(int(p) for p in VERL.split(".")[:2]) < (0, 8)
IDS = (
    "trinity.vllm_model.visible_devices",
    "trinity.config_validator.npu_memory_check",
    "trinity.config_validator.npu_alloc_conf",
    "trinity.lora_utils.empty_cache",
)

CHILD = r"""
import importlib, json, os, sys, types
WORKDIR, ENV, SCENARIOS, IMPORT_FIRST, ENGINE_IN_INIT = @ARGS@
for key, value in ENV.items():
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
sys.stdin = open(os.devnull)  # the memory check asks on a terminal before it goes on; answer nothing

# where each patched object lives (a class attribute is read raw, as the engine reads it)
PLACES = {
    "vLLMRolloutModel.__init__": ("trinity.common.models.vllm_model", "vLLMRolloutModel", "__init__"),
    "validate_trainer_memory_usage": ("trinity.common.config_validator", "GPUMemoryValidator",
                                      "validate_trainer_memory_usage"),
    "_check_max_memory_in_fsdp_training": ("trinity.common.config_validator", "GPUMemoryValidator",
                                           "_check_max_memory_in_fsdp_training"),
    "lora_utils.create_dummy_lora": ("trinity.utils.lora_utils", None, "create_dummy_lora"),
    "config_validator.create_dummy_lora": ("trinity.common.config_validator", None, "create_dummy_lora"),
}

def snapshot():
    out = {}
    for key, (module, owner, name) in PLACES.items():
        obj = importlib.import_module(module)
        out[key] = obj.__dict__[owner].__dict__[name] if owner else getattr(obj, name)
    return out

before = snapshot() if IMPORT_FIRST else None
import npu_compat
out = {"device": npu_compat.activate()}
after = snapshot()
out["patched"] = {key: npu_compat.is_patched(obj) for key, obj in after.items()}
if before is not None:
    out["identical"] = {key: after[key] is before[key] for key in PLACES}
out["status"] = {r["id"]: r["status"] for r in npu_compat.report()}

import torch
from transformers import Qwen2Config
from trinity.common.config import Config, LoRAConfig
from trinity.common.config_validator import ExplorerConfigValidator, GPUMemoryValidator, TrainerConfigValidator
from trinity.common.models.vllm_model import vLLMRolloutModel

MODEL = os.path.join(WORKDIR, "model")
if not os.path.isdir(MODEL):
    Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=1000).save_pretrained(MODEL)
VARS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")

ENGINE_STARTS = []
if ENGINE_IN_INIT:  # record the environment the vLLM engine would start with instead of building it
    import vllm
    def engine_start(engine_args, *args, **kwargs):
        ENGINE_STARTS.append({k: os.environ.get(k) for k in VARS})
        return types.SimpleNamespace(engine_args=engine_args)
    vllm.AsyncLLMEngine = types.SimpleNamespace(from_engine_args=engine_start)

def npu_calls(name):
    npu = getattr(torch, "npu", None)
    return npu.call_count(name) if npu is not None else 0

def rollout(model_config):
    saved = {k: os.environ.get(k) for k in VARS}
    starts = len(ENGINE_STARTS)
    vLLMRolloutModel(model_config)
    if ENGINE_IN_INIT:
        assert len(ENGINE_STARTS) == starts + 1, "vLLMRolloutModel.__init__ did not start the engine"
    seen = {k: os.environ.get(k) for k in VARS}
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return {"before": saved, "after": seen, "field_after": model_config.cuda_visible_devices,
            "engine": ENGINE_STARTS[-1] if ENGINE_IN_INIT else seen}

if "visible" in SCENARIOS:  # rows A2 + A7 (0.5.2: B2 + B9)
    cfg = Config()
    cfg.mode = "colocate"
    cfg.model.model_path = MODEL
    ExplorerConfigValidator().validate(cfg)
    out["colocate_field"] = cfg.explorer.rollout_model.cuda_visible_devices
    out["colocate"] = rollout(cfg.explorer.rollout_model)
    cfg = Config()
    cfg.model.model_path = MODEL
    ExplorerConfigValidator().validate(cfg)
    out["both_field"] = cfg.explorer.rollout_model.cuda_visible_devices
    out["both"] = rollout(cfg.explorer.rollout_model)
    cfg.explorer.rollout_model.cuda_visible_devices = "1"  # the field set by hand
    out["explicit"] = rollout(cfg.explorer.rollout_model)

if "memory" in SCENARIOS:  # row A3 (0.5.2: B3)
    cfg = Config()
    cfg.mode = "both"
    cfg.model.model_path = cfg.model.critic_model_path = MODEL
    cfg.model.max_model_len = 10**7  # an activation estimate far beyond any device: the check gives advice
    cfg.cluster.trainer_node_num = cfg.cluster.trainer_gpu_num_per_node = cfg.cluster.trainer_gpu_num = 1
    TrainerConfigValidator().validate(cfg)
    validator = GPUMemoryValidator()
    props = npu_calls("get_device_properties")
    validator.validate(cfg)
    out["memory"] = {
        "capacity": getattr(validator, "memory_capacity", None),
        "threshold": getattr(validator, "memory_threshold", None),
        "expandable": getattr(validator, "pytorch_env_flag", None),
        "suggestions": getattr(validator, "suggestions", None),
        "npu_properties_calls": npu_calls("get_device_properties") - props,
    }
    npu = getattr(torch, "npu", None)
    out["npu_total_memory"] = npu.get_device_properties(0).total_memory if npu is not None else None

if "lora" in SCENARIOS:  # row A35 (0.5.2: B32)
    cfg = Config()
    cfg.model.model_path = MODEL
    cfg.checkpoint_job_dir = os.path.join(WORKDIR, "job")
    cfg.model.lora_configs = [LoRAConfig(lora_rank=4, lora_alpha=8)]
    cleared = npu_calls("empty_cache")
    ExplorerConfigValidator().validate(cfg)
    lora = cfg.model.lora_configs[0]
    out["lora"] = {"dummy": bool(lora.is_dummy and os.path.isfile(os.path.join(lora.path, "adapter_config.json"))),
                   "npu_empty_cache_calls": npu_calls("empty_cache") - cleared}
print(json.dumps(out))
"""

ALL = ("visible", "memory", "lora")
#: A CUDA habit a user may carry over; Ascend's allocator does not read it.
CUDA_HABIT = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_NPU_ALLOC_CONF": None}


@functools.cache
def _run(
    run: str, scenarios: tuple[str, ...] = ALL, alloc: tuple[tuple[str, str | None], ...] = ()
) -> tuple[Any, str]:
    extra = {"NPU_COMPAT": "0"} if run == "stock" else {"NPU_COMPAT_DEVICE": "cuda"} if run == "cuda" else {}
    sim = {k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}
    sim.update(extra, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with tempfile.TemporaryDirectory(prefix="npu-compat-wrong-rows-") as workdir:
        args = json.dumps(
            [workdir, dict(alloc or CUDA_HABIT), list(scenarios), run == "cuda", ENGINE_IN_INIT]
        )
        code = CHILD.replace("@ARGS@", f"json.loads({args!r})")
        proc = run_py(code, env=sim, pythonpath=SIM_PATH, timeout=600)
    return last_json(proc), proc.stdout + proc.stderr  # Trinity logs to stdout


# -- rows A2 + A7 (0.5.2: B2 + B9): the colocated rollout engine's visible devices ---------------------


def test_colocated_rollout_engine_gets_the_ascend_visible_devices() -> None:
    out, _ = _run("npu")
    assert out["device"] == "npu"
    assert out["colocate_field"] == "0"  # Trinity's validator, unchanged (rows A2, B2)
    colocate = out["colocate"]
    assert colocate["before"]["ASCEND_RT_VISIBLE_DEVICES"] != "0"  # the simulated host shows two NPUs
    # 0.5.2's engine, built inside __init__, already starts with the Ascend variable (row B9)
    assert colocate["engine"] == colocate["after"]
    assert colocate["after"] == {"ASCEND_RT_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": None}
    assert colocate["field_after"] == "0"  # the config is left as the validator made it
    explicit = out["explicit"]
    assert (
        explicit["engine"]
        == explicit["after"]
        == {"ASCEND_RT_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": None}
    )
    assert explicit["field_after"] == "1"
    # outside colocate mode there is nothing to export, and nothing is
    assert out["both_field"] is None
    assert out["both"]["engine"] == out["both"]["after"] == out["both"]["before"]


def test_stock_exports_cuda_visible_devices_that_ascend_ignores() -> None:
    out, _ = _run("stock")
    assert out["device"] == "off"
    assert out["colocate_field"] == "0"
    colocate = out["colocate"]
    assert (
        colocate["engine"]
        == colocate["after"]
        == {
            "CUDA_VISIBLE_DEVICES": "0",
            "ASCEND_RT_VISIBLE_DEVICES": colocate["before"]["ASCEND_RT_VISIBLE_DEVICES"],
        }
    )


# -- row A3 (0.5.2: B3): the trainer memory check ----------------------------------------------------------------


def test_memory_check_runs_against_the_npu() -> None:
    out, logs = _run("npu")
    memory = out["memory"]
    assert "NO GPU DETECTED" not in logs
    assert memory["npu_properties_calls"] == 1
    assert memory["capacity"] == out["npu_total_memory"] > 0
    if not FSDP_ESTIMATE:
        return  # trinity 0.6 with verl >= 0.8 stops before the FSDP estimate ("trainer_config is not set")
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is set, and means nothing to torch_npu
    assert memory["expandable"] is False
    assert memory["threshold"] == pytest.approx(0.8 * memory["capacity"])
    assert NPU_ADVICE in memory["suggestions"]
    assert not any("PYTORCH_CUDA_ALLOC_CONF" in line for line in memory["suggestions"])


@pytest.mark.skipif(
    not FSDP_ESTIMATE, reason="trinity 0.6 with verl >= 0.8 skips the FSDP estimate that reads the variable"
)
def test_memory_threshold_and_advice_follow_pytorch_npu_alloc_conf() -> None:
    alloc = (("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True"), ("PYTORCH_CUDA_ALLOC_CONF", None))
    out, _ = _run("npu", ("memory",), alloc)
    memory = out["memory"]
    assert memory["expandable"] is True
    assert memory["threshold"] == pytest.approx(0.9 * memory["capacity"])
    assert memory["suggestions"]  # the estimate still exceeds the device, but the variable is set: no advice
    assert NPU_ADVICE not in memory["suggestions"]
    assert CUDA_ADVICE not in memory["suggestions"]


def test_stock_memory_check_is_skipped_with_no_gpu_detected() -> None:
    out, logs = _run("stock")
    assert "NO GPU DETECTED" in logs
    assert out["memory"]["capacity"] is None and out["memory"]["threshold"] is None
    assert out["memory"]["npu_properties_calls"] == 0


# -- row A35 (0.5.2: B32): the dummy LoRA's cache -------------------------------------------------------------------


def test_dummy_lora_empties_the_npu_cache() -> None:
    out, _ = _run("npu")
    assert out["lora"] == {"dummy": True, "npu_empty_cache_calls": 1}


def test_stock_dummy_lora_leaves_the_npu_cache() -> None:
    out, _ = _run("stock")
    assert out["lora"] == {"dummy": True, "npu_empty_cache_calls": 0}


# -- all rows: applied on NPU, absent on CUDA -------------------------------------------------------------


def test_npu_decision_applies_every_patch() -> None:
    out, _ = _run("npu")
    assert {i: out["status"][i] for i in IDS} == dict.fromkeys(IDS, "applied")
    assert all(out["patched"].values()), out["patched"]  # including the validator's copy of create_dummy_lora


def test_cuda_decision_leaves_every_object_identical_and_behaves_as_stock() -> None:
    out, logs = _run("cuda")
    stock, _ = _run("stock")
    assert out["device"] == "cuda"
    assert all(out["identical"].values()), out["identical"]
    assert not any(out["patched"].values())
    assert "NO GPU DETECTED" in logs
    scenarios = ("colocate_field", "colocate", "both_field", "both", "explicit", "memory", "lora")
    assert {k: out[k] for k in scenarios} == {k: stock[k] for k in scenarios}
