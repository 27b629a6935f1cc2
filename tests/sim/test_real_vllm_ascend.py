"""The released vllm-ascend's own Python on the simulated Ascend.

The stack sessions lay out the release paired with the stack's vLLM (``python -m npu_compat.testing
vllm-ascend``: 0.23.0.post1 with vLLM 0.23, 0.18.0 with vLLM 0.18), from the registry and checked against
its pinned SHA-256.  A simulated process then imports that package; what it needs below its Python (torch_npu's core and ops, pyACL, torchair, the compiled ``vllm_ascend_C``) is the
simulation's.  These tests read what a user of the simulation would see: the package that is imported, its
worker and model runner, and what an engine on it generates.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path
from typing import Any

import pytest

from npu_compat.testing import _sites, _vllm_ascend_release
from tests.conftest import beyond_ci_where, run_py
from tests.sim.npu_backend import free_port, needs_backend, sim_env

VLLM = _sites.installed_vllm()
RELEASE = _sites.vllm_ascend_release(VLLM) if VLLM else None

pytestmark = [
    pytest.mark.skipif(VLLM is None, reason="needs vllm (installed by the upstream stack sessions)"),
    pytest.mark.skipif(
        RELEASE is not None and not _vllm_ascend_release.is_laid_out(RELEASE),
        reason=f"vllm-ascend {RELEASE} is not laid out here (the stack sessions run "
        "`python -m npu_compat.testing vllm-ascend`)",
    ),
]


def real_run_proc(code: str, timeout: float = 300, devices: int = 1, **extra: str) -> Any:
    """Run ``code`` on a simulated Ascend host that runs the real vllm-ascend."""
    env = sim_env(devices, **{"VLLM_ASCEND_ENABLE_NZ": "0", **extra})
    return run_py(code, env=env, pythonpath=[str(p) for p in _sites.sites(env)], timeout=timeout)


def real_run(code: str, timeout: float = 300, devices: int = 1, **extra: str) -> Any:
    """Run ``code`` on a simulated Ascend host that runs the real vllm-ascend; what it printed last, as JSON."""
    return last_result(real_run_proc(code, timeout, devices, **extra))


def last_result(proc: Any) -> Any:
    """What a run's code printed last, as JSON."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]  # vLLM logs after it
    assert lines, f"no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(lines[-1])


def test_the_laid_out_release_is_the_pinned_one_without_its_compiled_files() -> None:
    assert RELEASE is not None
    where = _vllm_ascend_release.layout_dir(RELEASE)
    dist = importlib.metadata.Distribution.at(where / f"vllm_ascend-{RELEASE}.dist-info")
    assert dist.version == RELEASE
    groups = {ep.group for ep in dist.entry_points}
    assert {"vllm.platform_plugins", "vllm.general_plugins"} <= groups
    assert [ep.value for ep in dist.entry_points.select(group="vllm.platform_plugins")] == [
        "vllm_ascend:register"
    ]
    compiled = [p for p in (where / "vllm_ascend").rglob("*") if p.suffix == ".so"]
    assert compiled == []
    assert (where / "vllm_ascend" / "_build_info.py").read_text().rstrip().endswith("__device_type__ = 'A2'")
    # the release's own Python, not a copy of ours: the simulation's marker is not in it
    assert "SIMULATED" not in (where / "vllm_ascend" / "__init__.py").read_text()


WEIGHT_UPDATE = """
import json, logging, os, types
import torch
import npu_compat
if os.environ["ACTIVE"] == "1":
    npu_compat.activate()
from vllm_ascend.worker.worker import NPUWorker
from npu_compat.patches.trinity_vllm import GraphUnsafeSync

logging.basicConfig(level=logging.INFO, format="%(message)s")
out = {"patched": [npu_compat.is_patched(NPUWorker.start_weight_update),
                   npu_compat.is_patched(NPUWorker.finish_weight_update)]}
model = torch.nn.Sequential(torch.nn.Linear(4, 3)).to("npu:0")
# derived at load, held as plain attributes (vllm-ascend's ops/linear.py weight_fp32): on the device, and on the host
model[0].weight_fp32 = model[0].weight.detach().to(torch.float64)
model[0].host_table = torch.zeros(2)
worker = object.__new__(NPUWorker)  # the state the update's three methods read: no device, no engine
worker.weight_transfer_engine = object()
worker._weight_update_active = False
worker.model_runner = types.SimpleNamespace(model=model)
mode = types.SimpleNamespace(name="FULL_AND_PIECEWISE")
worker.vllm_config = types.SimpleNamespace(compilation_config=types.SimpleNamespace(cudagraph_mode=mode))

def update(load):
    NPUWorker.start_weight_update(worker, is_checkpoint_format=False)
    load()
    NPUWorker.finish_weight_update(worker)

def storages():
    return [t.untyped_storage().data_ptr() for t in (model[0].weight, model[0].weight_fp32)]
before = storages()
new = torch.randn(3, 4)
def reallocating():  # a loader that binds new memory: param.data = processed(...), layer.derived = f(param)
    model[0].weight.data = new.to("npu:0")
    model[0].weight_fp32 = model[0].weight.detach().to(torch.float64)
    model[0].host_table = torch.ones(2)
update(reallocating)
out["kept"] = storages() == before
out["values"] = torch.equal(model[0].weight.cpu(), new) and torch.equal(model[0].weight_fp32.cpu(), new.double())
def reshaping():
    model[0].weight.data = torch.randn(4, 3, device="npu:0")
try:
    update(reshaping)
    out["reshaped"] = "updated"
except GraphUnsafeSync as e:
    out["reshaped"] = str(e)
print(json.dumps(out))
"""


@pytest.mark.skipif(RELEASE != "0.23.0.post1", reason="vLLM's weight-transfer API on NPUWorker: 0.23.0.post1")
@pytest.mark.parametrize(
    "active", [pytest.param(False, marks=pytest.mark.beyond_ci), True]
)  # stock by hand (35 s): CI's time goes to the graph test below
def test_a_weight_update_leaves_every_tensor_in_its_storage(active: bool) -> None:
    """vllm-ascend's ``NPUWorker.start_weight_update``/``finish_weight_update`` (Trinity 0.6.0's sync, vLLM's
    weight-transfer API) around a loader that re-allocates a parameter and a tensor derived from it (a plain
    attribute, as vllm-ascend's w8a8 ``aclnn_input_scale_reciprocal``): stock leaves them in new memory, which
    the captured ACL graphs do not read; with npu-compat each is back in its storage with the new values, and
    the log says so.  A parameter whose shape changed cannot be kept: with graphs, the update fails naming it."""
    proc = real_run_proc(WEIGHT_UPDATE, ACTIVE=str(int(active)))
    seen = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert seen["patched"] == [active, active]
    assert seen["values"] is True
    assert seen["kept"] is active
    if active:
        # the weight and the tensor derived from it on the device; the host's plain attribute is no graph's
        assert (
            "weight update: 1 of 3 tensors kept their storage, 2 re-allocated and put back in place (0.weight, 0.weight_fp32)"
            in (proc.stdout + proc.stderr)
        )
        assert seen["reshaped"].startswith(
            "the weight sync re-allocated 1 tensor(s) the rollout's ACL graphs read, and npu-compat cannot put "
            "them back in place: 0.weight (torch.float32 [3, 4] -> torch.float32 [4, 3])."
        )
    else:
        assert seen["reshaped"] == "updated"


def test_a_simulated_process_imports_the_real_worker_and_model_runner() -> None:
    seen = real_run(
        """
        import json
        import vllm_ascend
        from vllm_ascend.worker.worker import NPUWorker
        from vllm_ascend.worker.model_runner_v1 import NPUModelRunner
        from vllm_ascend.worker.npu_input_batch import NPUInputBatch
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        from vllm.v1.worker.gpu_input_batch import InputBatch
        from vllm.platforms import current_platform
        import importlib.metadata, inspect
        print(json.dumps({
            "file": vllm_ascend.__file__,
            "simulated": hasattr(vllm_ascend, "SIMULATED"),
            "version": importlib.metadata.version("vllm-ascend"),
            "runner_is_gpu_runner": issubclass(NPUModelRunner, GPUModelRunner),
            "input_batch_is_input_batch": issubclass(NPUInputBatch, InputBatch),
            "prompt_logprobs_field": "in_progress_prompt_logprobs_cpu" in inspect.getsource(NPUInputBatch.__init__),
            "platform": type(current_platform).__module__ + "." + type(current_platform).__name__,
            "worker_module": NPUWorker.__module__,
        }))
        """
    )
    assert RELEASE is not None
    assert Path(seen["file"]).is_relative_to(_vllm_ascend_release.layout_dir(RELEASE))
    assert seen["simulated"] is False
    assert seen["version"] == RELEASE
    assert seen["runner_is_gpu_runner"] and seen["input_batch_is_input_batch"]
    assert seen["prompt_logprobs_field"]
    assert seen["platform"] == "vllm_ascend.platform.NPUPlatform"
    assert seen["worker_module"] == "vllm_ascend.worker.worker"


def test_without_the_layout_the_simulation_says_how_to_lay_it_out(tmp_path: Path) -> None:
    """A simulated process with vLLM, where the released vllm-ascend is not laid out, stops, naming the command."""
    proc = run_py(
        """
        import sys
        from npu_compat.testing import _vllm_ascend_release, simulation_env
        _vllm_ascend_release.layout_dir = lambda version, prefix=None: __import__("pathlib").Path(sys.argv[-1])
        try:
            simulation_env(1)
        except RuntimeError as exc:
            print(exc)
        """.replace("sys.argv[-1]", repr(str(tmp_path / "none"))),
        env=sim_env(1),
        check=True,
    )
    assert "python -m npu_compat.testing vllm-ascend" in proc.stdout
    assert f"vllm-ascend {RELEASE}" in proc.stdout


#: Greedy tokens of a tiny ``$ARCH`` (Qwen2 or Llama) through vLLM's engine (eager) on ``$EXECUTOR`` at tensor
#: parallel ``$TP``, and
#: transformers' on the same weights: prefill, decode, a prompt prefilled in chunks (130 tokens, 64 a step),
#: and one that shares a cached prefix with an earlier one.  Each worker's device and host memory, too.
GENERATE = """
import json, os, tempfile
import torch
from tests.e2e.tiny_model import make_tiny_model

def memory(worker):
    import torch
    status = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in open("/proc/self/status")
              if l.startswith(("VmRSS:", "VmHWM:"))}
    return {"allocated": torch.npu.memory_allocated(), "total": torch.npu.mem_get_info()[1], **status}

def main():
    tiny = make_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"), initializer_range=0.5,
                           arch=os.environ["ARCH"])
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc(memory): a function, pickled
    from vllm import LLM, SamplingParams
    llm = LLM(model=str(tiny), enforce_eager=True, dtype="float32", max_model_len=256, seed=0,
              distributed_executor_backend=os.environ["EXECUTOR"], enable_prefix_caching=True,
              max_num_batched_tokens=64,  # a longer prompt is prefilled in chunks
              tensor_parallel_size=int(os.environ["TP"]))
    prompts = [[5, 6, 7, 8], [11, 12, 13], [20, 21, 22, 23, 24, 25]]
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = [list(r.outputs[0].token_ids) for r in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)]
    # a prompt whose first 128 tokens (a whole KV block: vllm-ascend's block size) were computed
    # before: a prefix-cache hit
    shared = [4 + i % 40 for i in range(130)]
    llm.generate([{"prompt_token_ids": shared + [30]}], greedy, use_tqdm=False)
    hit = llm.generate([{"prompt_token_ids": shared + [31, 32]}], greedy, use_tqdm=False)[0]
    prompts.append(shared + [31, 32])
    out.append(list(hit.outputs[0].token_ids))
    workers = llm.collective_rpc(memory)
    utilization = llm.llm_engine.vllm_config.cache_config.gpu_memory_utilization
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # vLLM's ignore_eos: past the end-of-text token
    ref = [hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                       max_new_tokens=8, do_sample=False)[0, len(p):].tolist() for p in prompts]
    print(json.dumps({"vllm": out, "transformers": ref, "cached": hit.num_cached_tokens, "workers": workers,
                      "utilization": utilization}))

if __name__ == "__main__":
    main()
"""

GiB = 1 << 30


def assert_generated(seen: dict[str, Any], tp: int) -> None:
    """transformers' tokens, a prefix-cache hit, and on each worker a KV cache at vLLM's default
    ``gpu_memory_utilization`` of the 64 GiB NPU (0.9 in vLLM 0.18, 0.92 in 0.23: some 58 GiB, 4.8e8 tokens of
    the tiny model, made with ``torch.zeros``), which the simulated device counts in full and the host backs
    only where the model wrote."""
    assert seen["vllm"] == seen["transformers"]
    assert seen["cached"] >= 128
    assert len(seen["workers"]) == tp, seen["workers"]
    for worker in seen["workers"]:
        # the cache, the weights and the runner's buffers (some MiB past the 0.9 the cache was sized by)
        share = worker["allocated"] / worker["total"]
        assert seen["utilization"] - 0.05 < share < seen["utilization"] + 0.01, (seen["utilization"], worker)
        assert worker["VmHWM"] < 2 * GiB, worker  # torch, vLLM and vllm-ascend (0.8 GB): nothing of the cache


#: The executor of Trinity's TP 2 rollout: vLLM 0.18's Ray executor (Trinity 0.5.2), vLLM 0.23's multiprocess
#: executor inside the rollout actor (Trinity 0.6.0).  CI runs TP 2 on that one; the other runs by hand.
TRINITYS_TP2_EXECUTOR = "mp" if RELEASE == "0.23.0.post1" else "ray"


@needs_backend
@pytest.mark.many_processes
# TP 1 by hand for CI's time (85 s): the prompt-logprob and graph tests run the release's runner at TP 1
@pytest.mark.parametrize(
    "arch, tp",
    [
        pytest.param("qwen2", 1, marks=pytest.mark.beyond_ci),
        pytest.param("llama", 1, marks=pytest.mark.beyond_ci),
        pytest.param("qwen2", 2, marks=[] if TRINITYS_TP2_EXECUTOR == "mp" else pytest.mark.beyond_ci),
        pytest.param("llama", 2, marks=[] if TRINITYS_TP2_EXECUTOR == "mp" else pytest.mark.beyond_ci),
    ],
)
def test_an_engine_on_the_real_vllm_ascend_generates_what_transformers_generates(arch: str, tp: int) -> None:
    """``GENERATE`` on vLLM's multiprocess executor: one worker per simulated NPU, the TP group on the
    simulated hccl.  Each rank's runner counts the requests it took (``npu_compat.testing._requests_served``),
    what a whole run's tests read to know every engine and rank generated."""
    proc = real_run_proc(
        GENERATE,
        timeout=900,
        devices=tp,
        TP=str(tp),
        ARCH=arch,
        EXECUTOR="mp",
        VLLM_WORKER_MULTIPROC_METHOD="spawn",
        VLLM_PORT=str(free_port()),
    )
    assert_generated(last_result(proc), tp)
    served = re.findall(
        r"NPUModelRunner on npu:(\d+) served (\d+) requests \(tensor parallel rank (\d+) of (\d+)\)",
        proc.stdout + proc.stderr,
    )
    most: dict[tuple[str, str, str], int] = {}
    for device, count, rank, size in served:
        most[device, rank, size] = max(most.get((device, rank, size), 0), int(count))
    # every rank took every request (GENERATE's prompts, at least one power of two of them), on its own device
    assert sorted(most) == [(str(r), str(r), str(tp)) for r in range(tp)], served
    assert len(set(most.values())) == 1 and min(most.values()) >= 2, served


@needs_backend
@pytest.mark.many_processes
@beyond_ci_where(TRINITYS_TP2_EXECUTOR != "ray")
def test_tensor_parallel_2_on_vllms_ray_executor_generates_what_transformers_generates(
    tmp_path: Path,
) -> None:
    """``GENERATE`` at TP 2 on vLLM's Ray executor.  It gives each worker actor the whole node's
    ``ASCEND_RT_VISIBLE_DEVICES`` after the actor imported torch; the real ``NPUWorker`` then sets its local
    rank's device.  The runtime counts devices at that first use, so both workers start."""
    import os
    import subprocess
    import sys

    from npu_compat.testing import npu_ray_cluster

    env = dict(os.environ, **sim_env(2, VLLM_ASCEND_ENABLE_NZ="0"))
    driver = tmp_path / "driver.py"
    driver.write_text(GENERATE)
    with npu_ray_cluster(1, 2, 4, env=env) as cluster:
        client = dict(cluster.env, RAY_ADDRESS=cluster.address, TP="2", EXECUTOR="ray", ARCH="qwen2")
        repo = str(Path(__file__).resolve().parents[2])
        client["PYTHONPATH"] = os.pathsep.join([client["PYTHONPATH"], repo])
        proc = subprocess.run(
            [sys.executable, str(driver)], env=client, cwd=repo, capture_output=True, text=True, timeout=900
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert_generated(json.loads(lines[-1]), 2)


@needs_backend
def test_vllm_ascends_camem_allocator_keeps_addresses_and_gives_memory_back() -> None:
    """vllm-ascend's ``CaMemAllocator`` (``device_allocator/camem.py``, unchanged) over the ``vllm_ascend_C``
    stand-in: allocations under ``use_memory_pool(tag)`` go through ``my_malloc`` (an address range reserved,
    physical memory mapped on it, counted on the device); ``sleep`` backs up the offloaded tags with
    ``acl.rt.memcpy`` and unmaps everything; ``wake_up`` maps fresh memory at the same addresses and copies
    the backups back.  What was not offloaded reads as zeros after it."""
    seen = real_run(
        """
        import json
        import torch
        torch.npu.set_device(0)
        from vllm_ascend.device_allocator.camem import CaMemAllocator, camem_available
        MiB = 1 << 20
        alloc = CaMemAllocator.get_instance()
        free = lambda: torch.npu.mem_get_info()[0]
        out = {"available": camem_available}
        before = free()
        with alloc.use_memory_pool(tag="weights"):
            w = torch.arange(1 << 20, dtype=torch.float32, device="npu")  # computed, then the pool's
        with alloc.use_memory_pool(tag="kv_cache"):
            kv = torch.zeros(256 * MiB, dtype=torch.uint8, device="npu")
            kv[:100] = 5
        out["tags"] = sorted((d.tag, d.handle[1] // MiB) for d in alloc.pointer_to_data.values())
        used, address = free(), w.data_ptr()
        out["used"] = (before - used) // MiB
        alloc.sleep(offload_tags=("weights",))
        out["freed"] = (free() - used) // MiB
        alloc.wake_up()
        out["taken_back"] = (free() - used) // MiB
        out["same_address"] = w.data_ptr() == address
        out["weights_kept"] = torch.equal(w.cpu(), torch.arange(1 << 20, dtype=torch.float32))
        out["kv_after"] = int(kv[:100].sum())
        alloc.sleep(offload_tags=())  # nothing offloaded
        alloc.wake_up()
        out["weights_after_discard"] = float(w.abs().sum())
        del w, kv
        out["after_free"] = (before - free()) // MiB
        print(json.dumps(out))
        """,
    )
    assert seen["available"] is True
    assert seen["tags"] == [["kv_cache", 256], ["weights", 4]]
    assert seen["used"] == 260 and seen["freed"] == 260 and seen["taken_back"] == 0
    assert seen["same_address"] and seen["weights_kept"] and seen["kv_after"] == 0
    assert seen["weights_after_discard"] == 0.0
    assert seen["after_free"] == 0


@needs_backend
@pytest.mark.many_processes
# 0.23.0.post1's by hand for CI's time (85 s): CI runs 0.18.0's (stack c)
@beyond_ci_where(RELEASE == "0.23.0.post1")
def test_sleep_mode_frees_the_device_and_level_2_without_a_reload_generates_garbage() -> None:
    """``LLM(enable_sleep_mode=True)`` on the real ``NPUWorker``: level 1 offloads the weights and frees the
    device (vLLM's log says how much), and the engine generates the same tokens after ``wake_up``; level 2
    keeps no weights, so a ``wake_up`` without a reload generates from zeroed weights -- the field failure of
    RL frameworks that wake the rollout at level 2 before the trainer's weights arrive.  With NZ at its default
    the wake is refused, and the sleep-mode allocator refuses expandable segments (field failures F2, F4)."""
    seen = real_run(
        """
        import json, os, re, tempfile
        from tests.e2e.tiny_model import make_tiny_model

        def main():
            tiny = make_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"), initializer_range=0.5)
            from vllm import LLM, SamplingParams
            # vLLM's profile run prefills max_num_batched_tokens (default 8192) through Triton's rope, which
            # the simulation interprets: the batch of a 256-token model
            llm = LLM(model=str(tiny), enforce_eager=True, dtype="float32", max_model_len=256, seed=0,
                      enable_sleep_mode=True, max_num_batched_tokens=256)
            prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [11, 12, 13]}]
            greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
            gen = lambda: [list(r.outputs[0].token_ids) for r in llm.generate(prompts, greedy, use_tqdm=False)]
            out = {"before": gen()}
            llm.sleep(level=1)
            llm.wake_up()
            out["level1"] = gen()
            llm.sleep(level=2)
            llm.wake_up()
            out["level2"] = gen()
            # expandable segments, which vllm-ascend's platform itself sets for an engine without sleep mode: the
            # sleep-mode allocator of a new engine refuses them
            from vllm_ascend.device_allocator.camem import CaMemAllocator
            os.environ["PYTORCH_NPU_ALLOC_CONF"] = "expandable_segments:True"
            CaMemAllocator.instance = None
            try:
                CaMemAllocator.get_instance()
            except AssertionError as e:
                out["expandable"] = str(e)
            print(json.dumps(out))

        if __name__ == "__main__":
            main()
        """,
        timeout=600,
        VLLM_ENABLE_V1_MULTIPROCESSING="0",  # the engine in this process: it reads this os.environ
        VLLM_PORT=str(free_port()),
    )
    assert seen["level1"] == seen["before"]
    assert seen["level2"] != seen["before"]
    assert seen["expandable"].startswith("Expandable segments are not compatible with memory pool.")
    # an engine at vllm-ascend's default NZ setting: its NPUWorker refuses the wake (0.18.0 reads the variable
    # at the wake, 0.23.0.post1 its weight_nz_mode, from the variable, at the engine's start)
    seen = real_run(
        """
        import json, os, tempfile
        from tests.e2e.tiny_model import make_tiny_model

        def main():
            tiny = make_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"))
            from vllm import LLM
            llm = LLM(model=str(tiny), enforce_eager=True, dtype="float32", max_model_len=256, enable_sleep_mode=True,
                      max_num_batched_tokens=256)
            llm.sleep(level=1)
            try:
                llm.wake_up()
                print(json.dumps({"nz_wake": "woke"}))
            except Exception as e:
                print(json.dumps({"nz_wake": f"{type(e).__name__}: {e}"}))

        if __name__ == "__main__":
            main()
        """,
        timeout=600,
        VLLM_ASCEND_ENABLE_NZ="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_PORT=str(free_port()),
    )
    assert seen["nz_wake"].startswith("ValueError: FRACTAL_NZ mode is enabled."), seen


@needs_backend
@pytest.mark.parametrize("own", [None, "1"])
def test_a_process_on_the_real_vllm_ascend_compiles_as_with_the_torch_it_pins(own: str | None) -> None:
    """Defaults torch 2.13 changes against the torch the release pins (2.9.0 for 0.18.0, 2.10.0 for
    0.23.0.post1), as a user's CI (``CI`` set) meets them.  vLLM compiles ahead of time from torch 2.10 on
    (``VLLM_USE_AOT_COMPILE``): off under 0.18.0; under 0.23.0.post1 on, but without AOTAutograd's cache, which
    torch 2.13's AOT compile forces on for vllm-ascend's compiler and 2.10.0 does not.  AOTAutograd raises on a
    custom operator whose output aliases its input (``vllm::maybe_pad_and_reduce`` at one rank), a check
    neither pinned torch has: off.  A user's own setting stands."""
    names = (
        "VLLM_USE_AOT_COMPILE",
        "TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING",
        "TORCHINDUCTOR_AUTOGRAD_CACHE",
    )
    seen = real_run(
        "import json, os, torch, torch_npu\n"
        "import torch._functorch.config as aot\n"
        "from vllm import envs\n"
        "print(json.dumps({'aot': envs.VLLM_USE_AOT_COMPILE, 'alias': aot.error_on_custom_op_aliasing,\n"
        "                  'cache': aot.enable_autograd_cache}))\n",
        CI="1",
        **(dict.fromkeys(names, own) if own else {}),
    )
    if own:
        assert seen == {"aot": True, "alias": True, "cache": True}
    elif RELEASE == "0.18.0":
        assert seen == {"aot": False, "alias": False, "cache": True}
    else:
        assert seen == {"aot": True, "alias": False, "cache": False}


GRAPH_MODE = """
import json, os, tempfile
import torch
from tests.e2e.tiny_model import make_tiny_model

def load_in_place(self, path):
    \"\"\"Trinity's sync (``vllm_worker.update_weight``): ``model.load_weights``; how many storages moved.\"\"\"
    model = self.model_runner.model
    before = {n: p.untyped_storage().data_ptr() for n, p in model.named_parameters()}
    model.load_weights(weights=list(torch.load(path).items()))
    return sum(p.untyped_storage().data_ptr() != before[n] for n, p in model.named_parameters())

def reallocate(self, keep_old):
    \"\"\"What a reload that re-allocates does to each parameter (``layer.weight.data = f(layer.weight.data)``,
    as vllm-ascend's ``.contiguous()``/``npu_format_cast`` reassignments): same values, new memory.\"\"\"
    old = []
    for p in self.model_runner.model.parameters():
        old.append(p.data)
        p.data = p.data.clone()
    self.kept_old = old if keep_old else None
    return len(old)

def guarded(self, path):
    \"\"\"The same re-allocating reload, through npu-compat's sync guard (``trinity.vllm_worker.graph_safe_sync``,
    which wraps Trinity's ``update_weight``); how many storages moved.\"\"\"
    from npu_compat.patches.trinity_vllm import graph_safe_sync
    model = self.model_runner.model
    before = {n: p.untyped_storage().data_ptr() for n, p in model.named_parameters()}
    def sync():
        reallocate(self, keep_old=False)
        model.load_weights(weights=list(torch.load(path).items()))
    graph_safe_sync(sync, self, (), {})
    return sum(p.untyped_storage().data_ptr() != before[n] for n, p in model.named_parameters())

def npugraph_ex(self):
    \"\"\"Whether the engine core compiles through torchair's npugraph_ex (its vllm-ascend config).\"\"\"
    from vllm_ascend.ascend_config import get_ascend_config
    return get_ascend_config().ascend_compilation_config.enable_npugraph_ex

def main():
    tiny = make_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"), initializer_range=0.5)
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    original = {k: v.clone() for k, v in hf.state_dict().items()}
    gen = torch.Generator().manual_seed(7)
    # each parameter once: the tiny model ties its output layer to the embedding, as vLLM's load_weights does
    params = {k: v.detach() for k, v in hf.named_parameters()}
    weights = [{k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in params.items()} for _ in range(4)]
    paths = []
    for i, sd in enumerate(weights):
        paths.append(os.path.join(tempfile.mkdtemp(), f"w{i}.pt"))
        torch.save(sd, paths[-1])
    prompts = [[5, 6, 7, 8], [11, 12, 13], [20, 21, 22, 23, 24, 25]]

    def reference(sd):
        hf.load_state_dict(sd, strict=False)
        return [hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                            max_new_tokens=8, do_sample=False)[0, len(p):].tolist() for p in prompts]

    from vllm import LLM, SamplingParams
    # Trinity's rollout default: enforce_eager False (vLLM's graph mode, on vllm-ascend ACL graphs)
    llm = LLM(model=str(tiny), enforce_eager=False, dtype="float32", max_model_len=256, seed=0,
              distributed_executor_backend=os.environ["EXECUTOR"])
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def generate():
        llm.reset_prefix_cache()  # as Trinity does after a sync: no KV of the old weights is reused
        return [list(r.outputs[0].token_ids) for r in llm.generate(
            [{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)]

    out = {"mode": llm.llm_engine.vllm_config.compilation_config.cudagraph_mode.name,
           "npugraph_ex": llm.collective_rpc(npugraph_ex)[0]}
    out["start"], out["start_ref"] = generate(), reference(original)
    out["moved_in_place"] = llm.collective_rpc(load_in_place, args=(paths[0],))[0]
    out["in_place"], out["in_place_ref"] = generate(), reference(weights[0])
    out["moved_guarded"] = llm.collective_rpc(guarded, args=(paths[1],))[0]
    out["guarded"], out["guarded_ref"] = generate(), reference(weights[1])
    out["reallocated"] = llm.collective_rpc(reallocate, args=(True,))[0]
    llm.collective_rpc(load_in_place, args=(paths[2],))
    out["stale"], out["stale_ref"] = generate(), reference(weights[2])
    # what the stale graphs compute: the decoder on the weights of before (the memory they captured), the
    # logits -- computed outside the graphs, by the output layer tied to the embedding -- on the new ones
    hf.load_state_dict(weights[1], strict=False)
    hf.lm_head.weight = torch.nn.Parameter(weights[2]["model.embed_tokens.weight"].clone())
    out["stale_mixed_ref"] = reference({})
    llm.collective_rpc(reallocate, args=(False,))
    llm.collective_rpc(load_in_place, args=(paths[3],))
    try:
        out["freed"] = generate()
    except Exception as e:
        out["freed"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))

if __name__ == "__main__":
    main()
"""


@needs_backend
@pytest.mark.many_processes
@pytest.mark.parametrize(
    "executor",
    [
        pytest.param("uni", marks=[] if RELEASE == "0.23.0.post1" else pytest.mark.beyond_ci),
        pytest.param("mp", marks=pytest.mark.beyond_ci),
    ],
)  # CI: 0.23.0.post1's FULL and PIECEWISE graphs with the worker in the engine's process, as Trinity's TP 1 rollout
# runs it (2.3 min); by hand: the worker in a process of its own (2.9 min: what it adds is its rebuilt config) and
# 0.18.0's PIECEWISE graphs through npugraph_ex (stack c, 2 min)
def test_acl_graphs_replay_what_they_captured_across_weight_syncs(executor: str) -> None:
    """The real engine at Trinity's rollout defaults: ``enforce_eager`` False, vLLM's FULL_AND_PIECEWISE, its
    engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as Trinity sets it).

    0.18.0 runs it as PIECEWISE ACL graphs.  Its worker either in this process too (``uni``, Trinity's at TP 1),
    where vllm-ascend's platform has turned torchair's npugraph_ex off and each piece is compiled by inductor
    with vllm-ascend's fusion passes; or a spawned process of its own (``mp``; Trinity's TP 2 workers are Ray
    actors alike), whose ``NPUWorker`` rebuilds vllm-ascend's config from the options the platform copied
    before it turned npugraph_ex off, and so compiles each piece with torchair's npugraph_ex (run eagerly: the
    pieces' ACL graphs are vLLM's ``ACLGraphWrapper``'s either way).

    0.23.0.post1 captures both: PIECEWISE graphs for mixed batches, and FULL graphs of the whole model for
    decode, where each attention layer is an ACL task group behind an ``ExternalEvent``, given each step's
    sequence lengths from an update stream after the replay is issued (``update_full_graph_params``).

    Its graphs generate what transformers generates.  Trinity's sync (``model.load_weights``) writes every
    parameter in place -- no storage moves -- and the next replay generates what the new weights generate.  A
    reload that re-allocates the parameters, through npu-compat's sync guard, keeps every storage and the replay
    generates the new weights' tokens.  Without the guard it leaves the graphs on the old memory: while that memory is still
    held, the replay reads the weights of before (stale); once nothing but the graph holds it, the replay
    fails naming the parameter (on the device: garbage, or ERR99999)."""
    seen = real_run(
        GRAPH_MODE, timeout=600, EXECUTOR=executor, VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_WORKER_MULTIPROC_METHOD="spawn", VLLM_ALLOW_INSECURE_SERIALIZATION="1", VLLM_PORT=str(free_port()),
    )  # fmt: skip
    # 0.23.0.post1 writes npugraph_ex off into the options a spawned worker rebuilds its config from, too
    assert seen["npugraph_ex"] is (executor == "mp" and RELEASE == "0.18.0")
    assert seen["mode"] == ("FULL_AND_PIECEWISE" if RELEASE == "0.23.0.post1" else "PIECEWISE")
    assert seen["start"] == seen["start_ref"]
    assert seen["moved_in_place"] == 0
    assert seen["in_place"] == seen["in_place_ref"] != seen["start"]
    assert seen["moved_guarded"] == 0
    assert seen["guarded"] == seen["guarded_ref"] != seen["in_place"]
    assert seen["reallocated"] > 0
    assert seen["stale"] == seen["stale_mixed_ref"]
    assert seen["stale"] != seen["stale_ref"]
    # raised in the worker: the mp executor hands it on as its own RuntimeError, with the words
    assert seen["freed"].startswith(("GraphReplayError: ", "RuntimeError: Worker failed with error ")), seen
    assert "simulated npu: ACL graph replay reads memory that only the graph still holds -- " in seen["freed"]
    assert "a Parameter float32[" in seen["freed"]


def _trinity() -> str | None:
    try:
        return importlib.metadata.version("trinity-rft")
    except importlib.metadata.PackageNotFoundError:
        return None


@needs_backend
@pytest.mark.many_processes
@pytest.mark.uses_verl  # Trinity's WorkerExtension.apply_patches imports verl's vLLM patch
@pytest.mark.skipif(
    not (_trinity() or "").startswith("0.5.") or RELEASE != "0.18.0",
    reason="Trinity 0.5's prompt-logprob patch (vLLM 0.10.2 to 0.19) on vllm-ascend 0.18.0: stack c",
)
def test_trinitys_prompt_logprob_patch_runs_on_the_real_model_runner() -> None:
    """Trinity 0.5.2's ``WorkerExtension.apply_patches`` rebinds the model runner's
    ``_get_prompt_logprobs_dict`` (``vllm_patch/worker_patch.py``), reading the real ``NPUInputBatch``'s
    ``in_progress_prompt_logprobs_cpu`` and ``req_id_to_index``, and divides the logits by the request's
    temperature: the prompt logprobs are then transformers' log-softmax of logits / temperature."""
    seen = real_run(
        """
        import json, os, tempfile
        import torch
        from tests.e2e.tiny_model import make_tiny_model

        def main():
            tiny = make_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"), initializer_range=0.5)
            from vllm import LLM, SamplingParams
            llm = LLM(model=str(tiny), enforce_eager=True, dtype="float32", max_model_len=64, seed=0,
                      distributed_executor_backend="mp", max_num_batched_tokens=64,
                      worker_extension_cls="trinity.common.models.vllm_worker.WorkerExtension")
            llm.collective_rpc("apply_patches")
            prompt = [5, 6, 7, 8, 9, 10, 11]
            res = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
                temperature=0.5, max_tokens=2, prompt_logprobs=0, ignore_eos=True), use_tqdm=False)[0]
            got = [None if s is None else s[prompt[i]].logprob for i, s in enumerate(res.prompt_logprobs)]
            from transformers import AutoModelForCausalLM
            hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
            with torch.no_grad():
                logits = hf(torch.tensor([prompt])).logits[0, :-1]
            scaled = torch.log_softmax(logits / 0.5, -1)
            plain = torch.log_softmax(logits, -1)
            targets = torch.tensor(prompt[1:])
            print(json.dumps({"vllm": got,
                              "scaled": scaled[torch.arange(len(targets)), targets].tolist(),
                              "plain": plain[torch.arange(len(targets)), targets].tolist()}))

        if __name__ == "__main__":
            main()
        """,
        timeout=900,
        VLLM_WORKER_MULTIPROC_METHOD="spawn",
        VLLM_PORT=str(free_port()),
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",
    )
    assert seen["vllm"][0] is None
    assert seen["vllm"][1:] == pytest.approx(seen["scaled"], abs=1e-4)
    assert seen["vllm"][1:] != pytest.approx(seen["plain"], abs=1e-4)  # Trinity's temperature, not vLLM's own


#: Greedy tokens of a tiny Qwen2 with a LoRA adapter (PEFT's, rank 8, every linear layer, A and B of spread 0.5) through
#: vLLM's engine (eager, TP 1, bfloat16) on the release's punica wrapper, and transformers' with PEFT on the same
#: weights in the same dtype; and without the adapter, in the same batch of requests.
LORA = """
import json, os, tempfile
import torch
from tests.e2e.tiny_model import make_tiny_model

def main():
    directory = tempfile.mkdtemp()
    tiny = make_tiny_model(os.path.join(directory, "tiny"), initializer_range=0.5)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    # in the engine's dtype: in float32 the base model's greedy tokens of the first prompt tip at its 5th
    hf = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.bfloat16).eval()
    hf.generation_config.eos_token_id = None  # vLLM's ignore_eos
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    peft = get_peft_model(hf, config).eval()
    with torch.no_grad():  # an adapter that moves the logits as much as the weights do
        for name, param in peft.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.5)
    adapter = os.path.join(directory, "adapter")
    peft.save_pretrained(adapter)
    prompts = [[5, 6, 7, 8], [11, 12, 13], [20, 21, 22, 23, 24, 25]]
    def reference(model):
        return [model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               max_new_tokens=8, do_sample=False)[0, len(p):].tolist() for p in prompts]
    with torch.no_grad():
        ref_lora = reference(peft)
        with peft.disable_adapter():
            ref_base = reference(peft)
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    # bfloat16: the kernels take half and bf16 only ("only support half and bf16", as on the device)
    llm = LLM(model=str(tiny), enforce_eager=True, dtype="bfloat16", max_model_len=128, seed=0,
              distributed_executor_backend="mp", enable_lora=True, max_lora_rank=8, max_loras=1)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    lora = LoRARequest("tiny-lora", 1, adapter)
    requests = [{"prompt_token_ids": p} for p in prompts]
    # one batch: each prompt with and without the adapter (a token whose LoRA index is -1 takes none)
    outputs = llm.generate(requests * 2, greedy, lora_request=[lora] * 3 + [None] * 3, use_tqdm=False)
    tokens = [list(r.outputs[0].token_ids) for r in outputs]
    from safetensors.torch import load_file
    from npu_compat.testing._digest import digest_of
    on_disk = digest_of(load_file(os.path.join(adapter, "adapter_model.safetensors")).items())
    print(json.dumps({"lora": tokens[:3], "base": tokens[3:], "ref_lora": ref_lora, "ref_base": ref_base,
                      "adapter": adapter, "on_disk": on_disk}))

if __name__ == "__main__":
    main()
"""


@needs_backend
@pytest.mark.many_processes
@beyond_ci_where(RELEASE != "0.23.0.post1")  # 2 min: CI on stack a, 0.18.0's by hand
def test_lora_on_the_real_punica_wrapper_generates_what_peft_generates() -> None:
    """vllm-ascend's ``PunicaWrapperNPU`` runs the adapter through ``torch.ops._C_ascend``'s ``sgmv_*`` (prefill)
    and ``bgmv_*`` (decode) kernels: with the adapter the engine generates PEFT's greedy tokens, without it (in
    the same batch) the base model's, and the adapter changes them.  vLLM's loader read the adapter file as it
    is on disk, and holds it in bfloat16 (``npu_compat.testing._lora_digests``: the lines the stand-in logged)."""
    proc = real_run_proc(
        LORA, timeout=900, VLLM_WORKER_MULTIPROC_METHOD="spawn", VLLM_PORT=str(free_port()),
    )  # fmt: skip
    seen = last_result(proc)
    print(json.dumps(seen))
    assert seen["ref_lora"] != seen["ref_base"]  # the adapter matters: a check that can fail
    assert seen["lora"] == seen["ref_lora"]
    assert seen["base"] == seen["ref_base"]
    text = proc.stdout + proc.stderr
    loaded = re.findall(
        r"simulated Ascend: LoRA 1 \(tiny-lora\) loaded from (\S+): r=8, scaling 2, (\d+) modules", text
    )
    assert loaded == [(seen["adapter"], "7")], loaded  # q k v o gate up down
    sides = dict(
        re.findall(r"simulated weight sync \(rollout lora 1 (\w+)\): (\d+ tensors, sha256 \w+)", text)
    )
    # PEFT saved the adapter in float32; vLLM holds it in the model's bfloat16
    assert sides["loaded"] == seen["on_disk"] and sides["holds"] == sides["expected"] != sides["loaded"], (
        sides
    )
