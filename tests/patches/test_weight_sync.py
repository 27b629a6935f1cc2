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
import socket
import subprocess
import sys

import pytest

from npu_compat.testing import SIM_SITE, simulation_env
from tests.conftest import REPO, clean_env

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
engine = WeightTransferEngine.create("vllm", "127.0.0.1", PORT, 2, "weight_sync")
group = type(engine._model_update_group).__name__
engine.sync_weight(iter(make_weights().items()))
engine._model_update_group.all_reduce(torch.zeros(1))  # wait until the receiver has loaded them
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
config = WeightTransferConfig(backend="nccl")  # what trinity's vLLMRolloutModel.prepare asks for
engine = WeightTransferEngineFactory.create_engine(config, ParallelConfig(), None)
engine.init_transfer_engine(engine.parse_init_info(
    dict(master_address="127.0.0.1", master_port=PORT, rank_offset=1, world_size=2)))
want = make_weights()
got = {}
engine.receive_weights(
    engine.parse_update_info({"names": list(want), "dtype_names": [str(t.dtype).split(".")[-1] for t in want.values()],
                              "shapes": [list(t.shape) for t in want.values()], "packed": True}),
    load_weights=lambda ws: got.update({n: t.clone() for n, t in ws}))
engine.model_update_group.all_reduce(torch.zeros(1))
intact = list(got) == list(want) and all(got[n].dtype == want[n].dtype and torch.equal(got[n], want[n]) for n in want)
print(json.dumps({"device": DEVICE, "engine": type(engine).__name__, "intact": intact, "names": list(got)}))
"""
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_trainer_broadcast_arrives_intact_in_the_rollout_worker() -> None:
    port = str(_port())
    env = clean_env({k: v for k, v in simulation_env(2, {}).items() if k != "PYTHONPATH"}, [str(SIM_SITE)])
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
