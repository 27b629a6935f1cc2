"""LoRA that computes: the stand-in ``NPUModelRunner`` with PEFT adapters under vLLM's own engine.

Two PEFT adapters are made here with PEFT itself (random, non-zero ``lora_A``/``lora_B``): ``qv``
(``r=4``, ``q_proj``/``v_proj``, ``adapter_model.safetensors``) and ``all`` (``r=8``, ``all-linear``,
rsLoRA, ``adapter_model.bin``), and one of a rank past the engine's ``max_lora_rank``.  One child on a
simulated Ascend host starts ``LLM(enable_lora=True, max_lora_rank=8, max_loras=2)`` (the engine core
and the worker each in its own process, async scheduling, as Trinity runs it) and generates with and
without them; what it reports is checked here against transformers computing on the same model with
the adapter merged into its weights (``W + scaling * B @ A``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from tests.sim.npu_backend import vllm_engine_run
from tests.sim.test_vllm_ascend_standins import V023, VLLM_VERSION

pytestmark = [
    pytest.mark.skipif(VLLM_VERSION is None, reason="needs vllm (installed by the upstream stack sessions)"),
    pytest.mark.skipif(not V023, reason="the runner is checked with vLLM 0.23 (stacks a and b) only"),
    pytest.mark.many_processes,  # vLLM's engine core and its worker processes (npu_backend.vllm_engine_run)
    # the stand-in's LoRA (2-3 minutes, mostly its engine's start), by hand for CI's time, like Trinity's
    # LoRA run (tests/e2e/test_lora.py)
    pytest.mark.beyond_ci,
]

PROMPTS = [[5, 6, 7, 8], [11, 12, 13], [20, 21, 22, 23, 24, 25]]
TOKENS = 10

ENGINE = r"""
import json
from types import SimpleNamespace as NS
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest

args = json.loads(ARGS)  # set above this script by the fixture
paths, prompts = args["paths"], args["prompts"]
llm = LLM(model=paths["tiny"], enforce_eager=True, dtype="float32", max_model_len=64, seed=0,
          gpu_memory_utilization=0.3, distributed_executor_backend="mp", async_scheduling=True,
          enable_lora=True, max_lora_rank=8, max_loras=2)
engine = llm.llm_engine
QV = LoRARequest("qv", 1, paths["qv"])
ALL = LoRARequest("all", 2, paths["all"])
greedy = SamplingParams(temperature=0, max_tokens=args["tokens"], ignore_eos=True)

def generate(lora):
    return [list(r.outputs[0].token_ids) for r in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], greedy, lora_request=lora, use_tqdm=False)]

def error(call, *args):
    try:
        call(*args)
    except Exception as e:  # what the caller of vLLM's engine sees
        return f"{type(e).__name__}: {e}"
    return None

out = {"loras_at_start": sorted(engine.list_loras())}
out["base"] = generate(None)
out["qv"] = generate(QV)                      # never added: loaded from its path on first use, as vLLM does
out["loras_after_first_use"] = sorted(engine.list_loras())
out["mixed"] = generate([QV, None, ALL])      # one adapter per request, in one batch
out["all"] = generate(ALL)
out["loras"] = sorted(engine.list_loras())
out["remove_qv"] = engine.remove_lora(1)
out["remove_qv_again"] = engine.remove_lora(1)
out["loras_after_remove"] = sorted(engine.list_loras())
out["base_after_remove"] = generate(None)
out["add_qv"] = engine.add_lora(QV)           # Trinity's sync: remove_lora, then add_lora of the new path
out["qv_after_add"] = generate(QV)
out["pin_all"] = engine.pin_lora(2)
out["pin_unknown"] = error(engine.pin_lora, 7)
# a third adapter in a cache of max_cpu_loras = 2: the least recently used unpinned one (qv) goes
out["add_third"] = engine.add_lora(LoRARequest("qv-again", 3, paths["qv"]))
out["loras_after_third"] = sorted(engine.list_loras())
out["too_large"] = error(engine.add_lora, LoRARequest("large", 4, paths["large"]))
out["loras_after_too_large"] = sorted(engine.list_loras())
out["missing"] = error(engine.add_lora, LoRARequest("missing", 5, paths["missing"]))

# LoRA at TP > 1 stays a boundary, by name
from vllm_ascend.worker.model_runner_v1 import NPUModelRunner
config = NS(parallel_config=NS(pipeline_parallel_size=1, tensor_parallel_size=2), speculative_config=None,
            lora_config=NS(target_modules=None), model_config=NS(runner_type="generate"))
out["tp2"] = error(NPUModelRunner._refuse_unsimulated, config)

# an adapter held in another dtype than its file's (lora_dtype bfloat16, a float32 adapter): the digests say so
import logging
import torch
from transformers import AutoModelForCausalLM
from npu_compat.testing._lora import LoraAdapters

lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
logging.getLogger("vllm").addHandler(handler)
adapters = LoraAdapters(NS(lora_dtype="bfloat16", max_loras=1, max_cpu_loras=1, max_lora_rank=8),
                        torch.float32, torch.device("npu:0"))
adapters.add(LoRARequest("qv", 1, paths["qv"]), AutoModelForCausalLM.from_pretrained(paths["tiny"]))
out["bf16_digests"] = [line for line in lines if "rollout lora 1 " in line]
out["bf16_held"] = sorted({str(t.dtype) for pair in adapters.get(1).modules.values() for t in pair})
print(json.dumps(out))
"""


def _make_adapter(tiny: Path, directory: Path, seed: int, safetensors: bool, **config: Any) -> Path:
    """A PEFT adapter of the tiny model, saved by PEFT, with random non-zero ``lora_A`` and ``lora_B``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    peft.save_pretrained(directory, safe_serialization=safetensors)
    return directory


def _adapter_tensors(path: str) -> dict[str, Any]:
    import torch

    file = Path(path) / "adapter_model.safetensors"
    if file.exists():
        from safetensors.torch import load_file

        return load_file(file)
    return dict(torch.load(Path(path) / "adapter_model.bin", weights_only=True))


def _merged(tiny: str, adapter: str | None) -> Any:
    """The tiny model in transformers, with ``adapter`` merged into its weights: ``W + scaling * B @ A``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    if adapter is None:
        return model
    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    r, alpha = config["r"], config["lora_alpha"]
    scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    tensors = _adapter_tensors(adapter)
    modules = {
        n[len("base_model.model.") : -len(".lora_A.weight")] for n in tensors if n.endswith("lora_A.weight")
    }
    assert modules
    with torch.no_grad():
        for module in modules:
            a = tensors[f"base_model.model.{module}.lora_A.weight"]
            b = tensors[f"base_model.model.{module}.lora_B.weight"]
            model.get_submodule(module).weight += scaling * (b @ a)
    return model


def _greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    import torch

    model.generation_config.eos_token_id = None  # vLLM's ignore_eos
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from tests.e2e.tiny_model import make_tiny_model

    work = tmp_path_factory.mktemp("lora")
    tiny = make_tiny_model(work / "tiny", initializer_range=0.5)
    paths = {
        "tiny": tiny,
        "qv": _make_adapter(
            tiny, work / "qv", 1, True, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]
        ),
        "all": _make_adapter(
            tiny, work / "all", 2, False, r=8, lora_alpha=16, target_modules="all-linear", use_rslora=True
        ),
        "large": _make_adapter(tiny, work / "large", 3, True, r=16, lora_alpha=16, target_modules=["q_proj"]),
        "missing": work / "no-such-adapter",
    }
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def engine(adapters: dict[str, str]) -> dict[str, Any]:
    args = json.dumps({"paths": adapters, "prompts": PROMPTS, "tokens": TOKENS})
    proc = vllm_engine_run(f"ARGS = {args!r}\n{ENGINE}", timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    # the processes' logs (the result line quotes some of them)
    result["log"] = "\n".join(
        line for line in (proc.stdout + proc.stderr).splitlines() if not line.startswith("{")
    )
    return result


def _expected(adapters: dict[str, str], which: str | None) -> list[list[int]]:
    model = _merged(adapters["tiny"], adapters[which] if which else None)
    return [_greedy(model, p, TOKENS) for p in PROMPTS]


def test_the_reference_is_peft_itself(adapters: dict[str, str]) -> None:
    """The merged reference computes what PEFT computes with the adapter (rsLoRA's scaling included)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([PROMPTS[2]])
    for which in ("qv", "all"):
        base = AutoModelForCausalLM.from_pretrained(adapters["tiny"], dtype=torch.float32)
        peft = PeftModel.from_pretrained(base, adapters[which]).eval()
        with torch.no_grad():
            expected = peft(ids).logits
            merged = _merged(adapters["tiny"], adapters[which])(ids).logits
            plain = _merged(adapters["tiny"], None)(ids).logits
        torch.testing.assert_close(merged, expected, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(plain, expected, atol=1e-3)  # and the adapter changes the logits


def test_a_request_with_an_adapter_computes_with_it(adapters: dict[str, str], engine: dict[str, Any]) -> None:
    base, qv, adapter_all = (_expected(adapters, w) for w in (None, "qv", "all"))
    assert engine["base"] == base
    assert engine["qv"] == qv  # loaded on first use, from the request's lora_path
    assert engine["all"] == adapter_all  # safetensors and .bin; plain and rsLoRA scaling
    assert qv != base and adapter_all != base and qv != adapter_all
    # in one batch, each request with its own adapter, or none
    assert engine["mixed"] == [qv[0], base[1], adapter_all[2]]
    assert engine["qv_after_add"] == qv


def test_add_remove_pin_and_list_as_vllm_answers_them(engine: dict[str, Any]) -> None:
    assert engine["loras_at_start"] == []
    assert engine["loras_after_first_use"] == [1]
    assert engine["loras"] == [1, 2]
    assert engine["remove_qv"] is True and engine["remove_qv_again"] is False
    assert engine["loras_after_remove"] == [2]
    assert engine["base_after_remove"] == engine["base"]
    assert engine["add_qv"] is True and engine["pin_all"] is True
    assert "Pinning failed. LoRA 7 is not registered." in engine["pin_unknown"]
    # max_cpu_loras = max_loras = 2: the third adapter evicts the least recently used one not pinned
    assert engine["add_third"] is True and engine["loras_after_third"] == [2, 3]


def test_an_adapter_vllm_would_refuse_is_refused(adapters: dict[str, str], engine: dict[str, Any]) -> None:
    assert "LoRA rank 16 is greater than max_lora_rank 8" in engine["too_large"]
    assert engine["loras_after_too_large"] == [2, 3]  # a refused adapter evicts nothing
    # vLLM's LoRAAdapterNotFoundError, as the engine's caller sees it
    assert "Loading lora missing failed: No adapter found for " in engine["missing"]
    assert engine["missing"].split("No adapter found for ")[1].startswith(str(Path(adapters["missing"])))


def test_lora_at_tp2_is_a_named_boundary(engine: dict[str, Any]) -> None:
    assert engine["tp2"] == (
        "SimulatedComputeBoundary: simulated Ascend: NPUModelRunner (LoRA with tensor parallel) needs a real NPU "
        "(LoRA is simulated at TP 1 only)"
    )


_LOADED = re.compile(r"simulated Ascend: LoRA (\d+) \((\S+)\) loaded from (\S+):")
_DIGEST = re.compile(r"simulated weight sync \(rollout lora (\d+) loaded\): (\d+ tensors, sha256 \w+)")


def test_each_adapter_loaded_is_logged_with_the_digest_of_its_file(
    adapters: dict[str, str], engine: dict[str, Any]
) -> None:
    from npu_compat.testing._digest import digest_of

    loaded = _LOADED.findall(engine["log"])
    digests = _DIGEST.findall(engine["log"])
    # qv on first use, all on first use, qv added again, the third, then qv in bfloat16 outside the engine; the
    # refused ones log nothing
    assert [(i, name) for i, name, _ in loaded] == [
        ("1", "qv"), ("2", "all"), ("1", "qv"), ("3", "qv-again"), ("1", "qv")
    ]  # fmt: skip
    assert [i for i, _ in digests] == ["1", "2", "1", "3", "1"]
    for (_, _, path), (_, digest) in zip(loaded, digests, strict=True):
        assert digest == digest_of(_adapter_tensors(path).items()), path
    assert digests[0][1].startswith("4 tensors")  # q_proj and v_proj of one layer, A and B
    assert digests[1][1].startswith("14 tensors")  # the 7 linear layers of one layer, A and B


def test_an_adapter_held_in_another_dtype_logs_what_was_read_and_what_it_holds(
    adapters: dict[str, str], engine: dict[str, Any]
) -> None:
    import torch

    from npu_compat.testing._digest import digest_of

    tensors = _adapter_tensors(adapters["qv"])
    sides = dict(_SIDE.search(line).groups() for line in engine["bf16_digests"])  # type: ignore[union-attr]
    assert engine["bf16_held"] == ["torch.bfloat16"]
    assert sides["loaded"] == digest_of(tensors.items())  # the file, as read
    assert sides["expected"] == digest_of((n, t.to(torch.bfloat16)) for n, t in tensors.items())
    assert sides["holds"] == sides["expected"]


_SIDE = re.compile(r"rollout lora 1 (loaded|expected|holds)\): (\d+ tensors, sha256 \w+)")
