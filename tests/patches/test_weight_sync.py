"""Collective weight sync over HCCL across two processes: Trinity's trainer side -> vLLM's rollout side.

Rank 0 is trinity-rft 0.6.0's own ``WeightTransferEngine.create("vllm", ...)`` as the trainer
calls it (``sync_method: nccl``); rank 1 is the engine a vLLM worker builds from Trinity's
``WeightTransferConfig(backend="nccl")`` through vLLM's factory, with vllm-ascend's engines
registered.  Both run on the simulated Ascend with npu-compat active; the tensors must arrive
intact.  Without npu-compat the trainer side already crashes (catalogue row A17).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
from typing import Any

import pytest

from npu_compat.testing import simulation_env
from tests.conftest import REPO, SIM_PATH, clean_env, free_port

try:
    if not md.version("trinity-rft").startswith("0.6."):
        pytest.skip("the vLLM weight-transfer path is trinity-rft 0.6's", allow_module_level=True)
except md.PackageNotFoundError:
    pytest.skip("needs trinity-rft (installed by the upstream stack sessions)", allow_module_level=True)

COMMON = """
import json, sys
import npu_compat
DEVICE = npu_compat.activate()
import torch
PORT = int(sys.argv[1])

def make_weights():
    g = torch.Generator().manual_seed(7)
    # vLLM's packed protocol views each tensor in place inside one uint8 buffer, so each one's
    # byte offset must be a multiple of its element size (true of real checkpoints; kept here).
    return {"embed.weight": torch.randn(4, 4, generator=g), "lm_head.bias": torch.arange(4, dtype=torch.bfloat16),
            "step": torch.tensor([3], dtype=torch.int64)}
"""

TRAINER = (
    COMMON
    + """
from trinity.utils.distributed import WeightTransferEngine
torch.npu.set_device(0)  # the trainer's NPU; its weights are on it
engine = WeightTransferEngine.create("vllm", "127.0.0.1", PORT, 2, "weight_sync")
group = type(engine._model_update_group).__name__
engine.sync_weight(iter({name: t.to("npu") for name, t in make_weights().items()}.items()))
engine._model_update_group.all_reduce(torch.zeros(1, device="npu"))  # wait until the receiver has loaded them
engine.teardown()
print(json.dumps({"device": DEVICE, "group": group,
                  "patched": npu_compat.is_patched(__import__("trinity.utils.distributed",
                                                              fromlist=["x"]).VLLMWeightTransferEngine)}))
"""
)

ROLLOUT = (
    COMMON
    + """
import vllm_ascend
from vllm.config import ParallelConfig, WeightTransferConfig
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
vllm_ascend.register_connector()            # vLLM runs vllm-ascend's general plugins in each worker
torch.npu.set_device(1)                     # the rollout worker's NPU
config = WeightTransferConfig(backend="nccl")  # what trinity's vLLMRolloutModel.prepare asks for
engine = WeightTransferEngineFactory.create_engine(config, ParallelConfig(), None)
engine.init_transfer_engine(engine.parse_init_info(
    dict(master_address="127.0.0.1", master_port=PORT, rank_offset=1, world_size=2)))
want = make_weights()
got = {}
engine.receive_weights(
    engine.parse_update_info({"names": list(want), "dtype_names": [str(t.dtype).split(".")[-1] for t in want.values()],
                              "shapes": [list(t.shape) for t in want.values()], "packed": True}),
    load_weights=lambda ws: got.update({n: t for n, t in ws}))
engine.model_update_group.all_reduce(torch.zeros(1, device="npu"))
devices = sorted({str(t.device) for t in got.values()})
got = {n: t.cpu() for n, t in got.items()}
intact = list(got) == list(want) and all(got[n].dtype == want[n].dtype and torch.equal(got[n], want[n]) for n in want)
print(json.dumps({"device": DEVICE, "engine": type(engine).__name__, "intact": intact, "names": list(got),
                  "devices": devices}))
"""
)


def test_trainer_broadcast_arrives_intact_in_the_rollout_worker() -> None:
    port = str(free_port())
    env = clean_env({k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}, SIM_PATH)
    procs = {
        role: subprocess.Popen([sys.executable, "-c", code, port], env=env, cwd=str(REPO),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for role, code in (("trainer", TRAINER), ("rollout", ROLLOUT))
    }  # fmt: skip
    out = {}
    try:
        for role, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=240)
            assert proc.returncode == 0, f"{role} failed:\n{stderr[-4000:]}"
            out[role] = json.loads(stdout.strip().splitlines()[-1])
    finally:
        for proc in procs.values():
            proc.kill()
    assert out["trainer"] == {"device": "npu", "group": "PyHcclCommunicator", "patched": True}
    assert out["rollout"]["engine"] == "HCCLWeightTransferEngine"
    assert out["rollout"]["intact"], out["rollout"]
    assert out["rollout"]["names"] == ["embed.weight", "lm_head.bias", "step"]
    assert out["rollout"]["devices"] == ["npu:1"]  # received into the rollout's own NPU


# -- checkpoint / memory sync (rows A13, A14): vLLM worker rank 0 reads, broadcasts to its peers --------

CHECKPOINT_RANK = """
import json, sys
import npu_compat
DEVICE = npu_compat.activate()
import torch
from tests.catalogue.probes import checkpoint_engine, checkpoint_weights, init_info, receive_checkpoint
RANK, PORT, DIRECTORY = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.npu.set_device(RANK)            # each TP rank's worker on its own NPU
engine = checkpoint_engine(RANK, 2)   # a TP-2 vLLM worker's engine, as vLLM's factory builds it
engine.init_transfer_engine(init_info(PORT, 2))
got = receive_checkpoint(engine, DIRECTORY)
want = checkpoint_weights()
intact = sorted(got["loaded"]) == sorted(want) and all(
    got["loaded"][n].dtype == want[n].dtype and torch.equal(got["loaded"][n], want[n]) for n in want)
engine.model_update_group.all_reduce(torch.zeros(1, device="npu"))  # rank 0 keeps the store up until both loaded
print(json.dumps({"device": DEVICE, "group": type(engine.model_update_group).__name__, "intact": intact,
                  "devices": got["devices"],
                  "patches": {r["id"]: r["status"] for r in npu_compat.report() if "vllm_extension" in r["id"]}}))
"""


def test_checkpoint_sync_reaches_every_rollout_rank(tmp_path: Any) -> None:
    """Both TP ranks of a vLLM engine load the checkpoint rank 0 read, over HCCL, with npu tensors."""
    from tests.catalogue.probes import save_checkpoint

    save_checkpoint(str(tmp_path))
    port = str(free_port())
    env = clean_env({k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}, SIM_PATH)
    procs = [
        subprocess.Popen([sys.executable, "-c", CHECKPOINT_RANK, str(rank), port, str(tmp_path)], env=env,
                         cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)
    ]  # fmt: skip
    out = []
    try:
        for rank, proc in enumerate(procs):
            stdout, stderr = proc.communicate(timeout=240)
            assert proc.returncode == 0, f"rank {rank} failed:\n{stderr[-4000:]}"
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
    applied = dict.fromkeys(
        [
            "trinity.vllm_extension.hccl_group",
            "trinity.vllm_extension.produce_checkpoint_weights.cuda_literals",
            "trinity.vllm_extension.consume_checkpoint_weights.cuda_literals",
            "trinity.vllm_extension.cuda",
        ],
        "applied",
    )
    for i, rank in enumerate(out):
        assert rank["device"] == "npu" and rank["group"] == "PyHcclCommunicator", rank
        assert rank["intact"], rank
        assert rank["devices"] == [f"npu:{i}"], rank  # rank 0 moves to its npu, rank 1 receives into its own
        assert rank["patches"] == applied, rank
