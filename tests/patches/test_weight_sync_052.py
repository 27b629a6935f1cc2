"""trinity-rft 0.5.2's collective weight sync (``sync_method: nccl``) over HCCL, across two processes.

The trainer process runs the real ``ActorRolloutRefWorker.setup_weight_sync_group`` and
``sync_weight`` (``trinity.trainer.verl.fsdp_workers``, rows B20, B22, B23, B25) on a real FSDP module;
the rollout process runs the real ``Explorer.setup_weight_sync_group`` -> ``vLLMRolloutModel.
init_process_group`` -> ``WorkerExtension.init_process_group`` (rows B12, B13, B15) and then
``Explorer._nccl_weights_update`` -> ``vLLMRolloutModel.sync_model`` -> ``WorkerExtension.update_weight``
(row B14).  They meet as upstream has them meet: rank 0 (trainer) and rank 1 (the vLLM worker, rank 0 of
its engine plus ``rank_offset`` 1) form the group ``rollout_weight_sync`` at the address and port the
trainer picked; the trainer's ``state_dict_meta`` (name, dtype, shape, in its FSDP walk order) reaches the
worker with them; the trainer broadcasts each parameter from rank 0, the worker receives each into a
fresh tensor and hands it to ``model_runner.model.load_weights``; a barrier closes the round.

Harness, not upstream: each process's own one-rank world (built as ``ActorRolloutRefWorker.__init__``
/ vLLM build theirs); the Ray messaging -- Trinity's Synchronizer actor carries the address, port and
metadata from the trainer to the explorer (here a pickle file), ``ray.get`` on its reply, the model actor
handle, vLLM's ``collective_rpc`` into the one TP worker; the FSDP module lives on the CPU, and the
worker's ``torch.empty(..., device="npu:0")`` is served on the host (``npu_on_host``): the simulation
holds no NPU memory.  With ``NPU_COMPAT=0`` both processes stop at ``assert is_nccl_available()``.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from npu_compat.testing import simulation_env
from tests.conftest import REPO, SIM_PATH, clean_env

#: exercises verl: stack-b (stack-a with another verl) runs it (noxfile)
pytestmark = pytest.mark.uses_verl

try:
    if not md.version("trinity-rft").startswith("0.5."):
        pytest.skip("WorkerExtension.update_weight is trinity-rft 0.5's weight sync", allow_module_level=True)
except md.PackageNotFoundError:
    pytest.skip("needs trinity-rft (installed by the upstream stack sessions)", allow_module_level=True)

DEADLINE_S = 300  # both processes; each imports verl/vLLM/trinity on a busy 2-core machine
SYNC_TIMEOUT_S = 60  # synchronizer.sync_timeout: bounds the group's rendezvous and every collective

COMMON = f"""
import json, os, pickle, sys, time
from types import SimpleNamespace as NS
import npu_compat
DEVICE = npu_compat.activate()
import torch
import torch.distributed as dist
HANDOFF = sys.argv[1]
SYNC_TIMEOUT = {SYNC_TIMEOUT_S}

def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def actor_model():
    '''The trainer's actor (seeded: the rollout side rebuilds it to know what must arrive).'''
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 6)
    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)
            self.layers = torch.nn.ModuleList([Block()])
            self.norm = torch.nn.LayerNorm(6)
    model = TinyLM()
    g = torch.Generator().manual_seed(52)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return model

def npu_calls():
    return {{n: torch.npu.call_count(n) for n in ("synchronize", "empty_cache")}}

def since(before):
    return {{n: c - before[n] for n, c in npu_calls().items()}}

def say_applied():
    ids = sorted(r["id"] for r in npu_compat.report() if r["status"] == "applied")
    print("APPLIED " + json.dumps({{"device": DEVICE, "applied": ids}}), flush=True)
"""

TRAINER = (
    COMMON
    + """
from unittest import mock
import ray
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from verl.utils.device import get_device_name, get_nccl_backend
from trinity.common.constants import SyncMethod
from trinity.trainer.verl import fsdp_workers
from trinity.utils.log import get_logger
say_applied()

# harness: the trainer's one-rank world, with the backend ActorRolloutRefWorker.__init__ asks for
dist.init_process_group(backend=f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}",
                        init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
os.environ["WG_BACKEND"] = "ray"  # set by verl's RayWorkerGroup: the worker finds its node address via Ray
model = actor_model()
model.layers[0] = FSDP(model.layers[0], device_id=torch.device("cpu"))  # a nested FSDP unit, as wrap policies make

worker = fsdp_workers.ActorRolloutRefWorker.__new__(fsdp_workers.ActorRolloutRefWorker)
worker.config = NS(actor=NS(strategy="fsdp"), synchronizer=NS(
    sync_method=SyncMethod.NCCL, explorer_world_size=1, ray_namespace="weight_sync_052", sync_timeout=SYNC_TIMEOUT))
worker.actor_module_fsdp = FSDP(model, device_id=torch.device("cpu"))
worker._is_offload_param = False
worker.logger = get_logger("trainer")

SENT = object()

def hand_to_explorer(master_address, master_port, state_dict_meta):
    # harness: the Synchronizer actor passes these on to Explorer.setup_weight_sync_group
    with open(HANDOFF + ".tmp", "wb") as f:
        pickle.dump((master_address, master_port, state_dict_meta), f)
    os.replace(HANDOFF + ".tmp", HANDOFF)
    return SENT

def ray_get(ref, *args, **kwargs):  # the reply of the stand-in above; the group's barrier already met the explorer
    assert ref is SENT, ref
    return None

synchronizer = NS(get_actor=lambda namespace=None, config=None: NS(
    setup_weight_sync_group=NS(remote=hand_to_explorer)))
before = npu_calls()
with mock.patch.object(fsdp_workers, "Synchronizer", synchronizer), mock.patch.object(ray, "get", ray_get):
    worker.setup_weight_sync_group()
setup_calls, before = since(before), npu_calls()
worker.sync_weight()
sync_calls = since(before)
group = worker._model_update_group
print(json.dumps({"device": DEVICE, "backend": str(dist.get_backend(group)), "rank": group.rank(),
                  "size": group.size(), "meta": [list(m) for m in worker.state_dict_meta],
                  "npu_calls": {"setup": setup_calls, "sync": sync_calls}}))
"""
)

ROLLOUT = (
    COMMON
    + """
import asyncio
from unittest import mock
from trinity.common.constants import SyncMethod
from trinity.common.models import vllm_worker
from trinity.common.models.vllm_model import vLLMRolloutModel
from trinity.explorer.explorer import Explorer
from trinity.utils.log import get_logger
from npu_compat.testing._boundary import npu_on_host
say_applied()

# harness: the vLLM worker's own world (TP=1), with the backend vllm-ascend's platform gives it
dist.init_process_group(backend="hccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)

class LoadedModel:
    def __init__(self):
        self.loaded = []
    def load_weights(self, weights):
        self.loaded.extend((name, tensor.clone()) for name, tensor in weights)

class Worker(vllm_worker.WorkerExtension):  # vLLM mixes worker_extension_cls into its worker class
    def __init__(self):
        self.device = torch.device("npu:0")  # vllm-ascend's NPUWorker
        self.model_config = NS(dtype=torch.float32)
        self.model_runner = NS(model=LoadedModel())

worker = Worker()

class AsyncLLM:  # harness: vLLM's engine runs a collective_rpc in each worker of the engine (here one)
    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return [getattr(worker, method)(*args, **(kwargs or {}))]
    async def reset_prefix_cache(self):
        pass

model = vLLMRolloutModel.__new__(vLLMRolloutModel)
model.use_v1, model.async_llm, model.enable_lora, model.model_version = True, AsyncLLM(), False, 0
model.ray_namespace, model.logger = "weight_sync_052", get_logger("rollout")

class ActorHandle:  # harness: a Ray handle on the model actor (method.remote(...) -> an awaitable)
    def __getattr__(self, name):
        return NS(remote=getattr(model, name))

async def ready_to_nccl_sync(role, version):  # harness: the Synchronizer says the trainer is ready
    return version + 1

explorer = Explorer.__new__(Explorer)
explorer.config = NS(explorer=NS(name="explorer", rollout_model=NS(tensor_parallel_size=1)),
                     synchronizer=NS(sync_method=SyncMethod.NCCL, sync_timeout=SYNC_TIMEOUT))
explorer.use_nccl_sync = explorer.config.synchronizer.sync_method == SyncMethod.NCCL  # as Explorer.__init__
explorer.models, explorer.model_version, explorer.logger = [ActorHandle()], 0, get_logger("explorer")
explorer.synchronizer = NS(ready_to_nccl_sync=NS(remote=ready_to_nccl_sync))

deadline = time.monotonic() + 240
while not os.path.exists(HANDOFF):  # harness: what Synchronizer.setup_weight_sync_group carries
    if time.monotonic() > deadline:
        sys.exit("the trainer never set up its weight-sync group")
    time.sleep(0.2)
with open(HANDOFF, "rb") as f:
    master_address, master_port, state_dict_meta = pickle.load(f)

async def explore():
    await explorer.setup_weight_sync_group(master_address, master_port, state_dict_meta)
    before = npu_calls()
    with npu_on_host() as requests:
        await explorer._nccl_weights_update()
    return requests, since(before)

with mock.patch.object(vllm_worker, "Synchronizer", NS(get_actor=lambda namespace=None: NS())):
    requests, update_calls = asyncio.run(explore())
group = worker._model_update_group
want = actor_model().state_dict()
got = worker.model_runner.model.loaded
intact = sorted(n for n, _ in got) == sorted(want) and all(
    t.dtype == want[n].dtype and torch.equal(t, want[n]) for n, t in got)
print(json.dumps({"device": DEVICE, "backend": str(dist.get_backend(group)), "rank": group.rank(),
                  "size": group.size(), "names": [n for n, _ in got], "intact": intact,
                  "npu_requests": sorted(set(requests)), "npu_calls": update_calls,
                  "versions": [explorer.model_version, model.model_version]}))
"""
)


def _run_pair(tmp_path: Path, extra_env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Start trainer and rollout together; wait for both within one deadline, then kill whatever is left."""
    env = clean_env({k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}, SIM_PATH)
    env.update(extra_env)
    handoff = str(tmp_path / "handoff.pkl")
    procs: dict[str, tuple[subprocess.Popen[str], Path, Path]] = {}
    for role, code in (("trainer", TRAINER), ("rollout", ROLLOUT)):
        out, err = tmp_path / f"{role}.out", tmp_path / f"{role}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen([sys.executable, "-c", code, handoff], env=env, cwd=str(REPO),
                                    stdout=stdout, stderr=stderr, text=True)  # fmt: skip
        procs[role] = (proc, out, err)
    start = time.monotonic()
    took: dict[str, float] = {}
    try:
        while len(took) < len(procs) and time.monotonic() - start < DEADLINE_S:
            for role, (proc, _, _) in procs.items():
                if role not in took and proc.poll() is not None:
                    took[role] = round(time.monotonic() - start, 1)
            time.sleep(0.5)
    finally:
        for proc, _, _ in procs.values():  # a peer still waiting on the group must not outlive the test
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return {
        role: {"rc": proc.returncode if role in took else None, "took_s": took.get(role),
               "stdout": out.read_text(), "stderr": err.read_text()}
        for role, (proc, out, err) in procs.items()
    }  # fmt: skip


def _applied(result: dict[str, Any]) -> dict[str, Any]:
    (line,) = [line for line in result["stdout"].splitlines() if line.startswith("APPLIED ")]
    return dict(json.loads(line.removeprefix("APPLIED ")))


def _last_json(result: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(result["stdout"].strip().splitlines()[-1]))


NEEDED = {
    "trainer": {"trinity.distributed.init_process_group", "trinity.verl.fsdp_workers.cuda"},
    "rollout": {"trinity.distributed.init_process_group", "trinity.vllm_worker.cuda"},
}


def test_trainer_broadcast_arrives_intact_in_the_vllm_worker(tmp_path: Path) -> None:
    runs = _run_pair(tmp_path, {})
    for role, result in runs.items():
        assert result["rc"] == 0, f"{role} failed (rc {result['rc']}):\n{result['stderr'][-5000:]}"
        applied = _applied(result)
        assert applied["device"] == "npu", applied
        assert NEEDED[role] <= set(applied["applied"]), (role, applied)
    trainer, rollout = _last_json(runs["trainer"]), _last_json(runs["rollout"])
    # one group, over HCCL: the trainer is rank 0, the vLLM worker rank 0 + rank_offset 1
    assert (trainer["backend"], trainer["rank"], trainer["size"]) == ("hccl", 0, 2), trainer
    assert (rollout["backend"], rollout["rank"], rollout["size"]) == ("hccl", 1, 2), rollout
    # the names the trainer's FSDP walk announced, in its order, are what load_weights received
    names = [name for name, _dtype, _shape in trainer["meta"]]
    assert names == ["embed.weight", "norm.weight", "norm.bias", "layers.0.proj.weight", "layers.0.proj.bias"]
    assert rollout["names"] == names, rollout
    assert rollout["intact"], rollout
    assert rollout["npu_requests"] == ["npu:0"], rollout  # the worker receives into tensors on its NPU
    assert rollout["versions"] == [1, 1], rollout
    # the torch.cuda calls of rows B20, B22, B25 and B14 reached torch.npu
    # setup: one empty_cache per FSDP unit walked (2) and one leaving the offload context
    assert trainer["npu_calls"]["setup"] == {"synchronize": 0, "empty_cache": 3}, trainer
    assert trainer["npu_calls"]["sync"] == {"synchronize": 1, "empty_cache": 1}, trainer
    assert rollout["npu_calls"] == {"synchronize": 1, "empty_cache": 1}, rollout


def test_without_npu_compat_neither_side_forms_the_group(tmp_path: Path) -> None:
    runs = _run_pair(tmp_path, {"NPU_COMPAT": "0"})
    for role, caller in (
        ("trainer", r'trinity/trainer/verl/fsdp_workers\.py", line \d+, in setup_weight_sync_group'),
        ("rollout", r'trinity/common/models/vllm_worker\.py", line \d+, in init_process_group'),
    ):
        result = runs[role]
        assert result["rc"] is not None, (
            f"{role} still running after {DEADLINE_S}s:\n{result['stderr'][-3000:]}"
        )
        assert result["rc"] != 0, f"{role} succeeded without npu-compat:\n{result['stdout'][-3000:]}"
        assert _applied(result) == {"device": "off", "applied": []}
        # what the user sees: Trinity's group helper refuses, called from the weight-sync setup
        lines = [line.removeprefix("[rank0]:").strip() for line in result["stderr"].strip().splitlines()]
        assert lines[-1] == "AssertionError" and lines[-2] == "assert is_nccl_available()", lines[-12:]
        assert lines[-3].startswith('File "') and "trinity/utils/distributed.py" in lines[-3], lines[-12:]
        assert re.search(caller, result["stderr"]), lines[-12:]
