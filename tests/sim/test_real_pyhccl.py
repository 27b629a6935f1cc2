"""vllm-ascend's own ``PyHcclCommunicator`` over the simulated Ascend's ``libhccl.so``.

The released ``pyhccl.py`` and ``pyhccl_wrapper.py`` (0.18.0 on stack c, 0.23.0.post1 on stack a) load the
HCCL library with ctypes -- ``libhccl.so`` by name, which the simulated torch_npu has loaded as the real
one's libraries load CANN's -- and call HCCL's C entry points.  Two ranks, each its own process on its own
simulated NPU, as Trinity's trainer and a rollout worker are.  Where the library cannot be loaded the real
communicator disables itself and its broadcasts do nothing: stock's silence, and npu-compat's error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.sim.npu_backend import free_port, needs_backend
from tests.sim.test_real_vllm_ascend import RELEASE, real_run

pytestmark = [needs_backend, pytest.mark.many_processes]

#: Two ranks in spawned processes (as vLLM's and Ray's are), each on its own NPU, over a vLLM
#: StatelessProcessGroup as vllm-ascend's HCCLWeightTransferEngine builds one; rank 0 prints the result.
TWO_RANKS = """
import json, multiprocessing as mp, sys

def communicator(rank, port):
    from vllm.distributed.utils import StatelessProcessGroup
    from vllm_ascend.distributed.device_communicators.pyhccl import PyHcclCommunicator

    return PyHcclCommunicator(StatelessProcessGroup.create("127.0.0.1", port, rank, 2), device=rank)

def rank_main(rank, port, queue):
    try:
        import torch

        torch.npu.set_device(rank)
        queue.put((rank, BODY(torch, rank, port)))
    except BaseException as exc:
        queue.put((rank, {"error": f"{type(exc).__name__}: {exc}"}))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ranks = [ctx.Process(target=rank_main, args=(r, PORT, queue)) for r in range(2)]
    for p in ranks:
        p.start()
    results = dict(queue.get(timeout=240) for _ in ranks)
    for p in ranks:
        p.join(60)
    print(json.dumps({str(k): v for k, v in sorted(results.items())}))
"""


def two_ranks(body: str, where: Path, **env: str) -> dict[str, Any]:
    """``body`` (a ``BODY(torch, rank, port)``) on both ranks; each rank's result by rank."""
    script = where / "two_ranks.py"  # a file: spawned children import their target from __main__'s file
    script.write_text(body + TWO_RANKS.replace("PORT", str(free_port())))
    code = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    out: dict[str, Any] = real_run(code, timeout=300, devices=2, **env)
    return out


COLLECTIVES = """
def BODY(torch, rank, port):
    comm = communicator(rank, port)
    device = f"npu:{rank}"
    weight = torch.arange(6, dtype=torch.bfloat16, device=device) * (7 if rank == 0 else 0)
    where = weight.data_ptr()
    comm.broadcast(weight, src=0)
    summed = comm.all_reduce(torch.full((3,), float(rank + 1), device=device))
    biggest = comm.all_reduce(torch.tensor([rank, 10 - rank], dtype=torch.int64, device=device),
                              op=torch.distributed.ReduceOp.MAX)
    loaded = [line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith("libhccl.so")]
    return {
        "disabled": comm.disabled,
        "cann": torch.version.cann,
        "weight": weight.float().cpu().tolist(),
        "same_storage": weight.data_ptr() == where,
        "weight_device": str(weight.device),
        "summed": summed.cpu().tolist(),
        "summed_device": str(summed.device),
        "max": biggest.cpu().tolist(),
        "library": sorted(set(loaded)),
    }
"""


@pytest.mark.skipif(
    RELEASE != "0.18.0",
    reason="0.23.0.post1's pyhccl.py and pyhccl_wrapper.py differ from 0.18.0's in a no-op branch and a log line; "
    "its HCCLWeightTransferEngine test broadcasts through them",
)
def test_the_real_communicator_broadcasts_and_reduces_between_two_npus_over_the_simulated_libhccl(
    tmp_path: Path,
) -> None:
    out = two_ranks(COLLECTIVES, tmp_path)
    for rank in ("0", "1"):
        got = out[rank]
        assert "error" not in got, got
        assert got["disabled"] is False
        assert got["cann"] == "not known"  # torch_npu's value where ASCEND_HOME_PATH has no install info
        assert got["weight"] == [0.0, 7.0, 14.0, 21.0, 28.0, 35.0]  # rank 0's, in place on both
        assert got["same_storage"] and got["weight_device"] == f"npu:{rank}"
        assert got["summed"] == [3.0, 3.0, 3.0] and got["summed_device"] == f"npu:{rank}"
        assert got["max"] == [1, 10]
        [library] = got["library"]
        assert library.endswith("/libhccl.so") and "libhccl-py" in library  # the stand-in, by its SONAME


SILENT = """
def BODY(torch, rank, port):
    comm = communicator(rank, port)
    device = f"npu:{rank}"
    weight = torch.full((4,), 5.0 if rank == 0 else -1.0, device=device)
    comm.broadcast(weight, src=0)
    return {"disabled": comm.disabled, "weight": weight.cpu().tolist()}
"""


@pytest.mark.skipif(
    RELEASE != "0.23.0.post1",
    reason="Trinity's weight sync reaches PyHcclCommunicator on 0.6 with vllm-ascend 0.23 (stack a); 0.18.0's "
    "constructor disables itself the same way (it ran here once)",
)
def test_a_communicator_without_its_library_moves_nothing_stock_and_is_an_error_with_npu_compat(
    tmp_path: Path,
) -> None:
    """``HCCL_SO_PATH`` naming a library that is not there (as a host without CANN's ``set_env.sh`` misses
    ``libhccl.so``): the real communicator disables itself, and rank 1 keeps its own values after a
    broadcast from rank 0.  With npu-compat, activated at start-up in each rank as an installed one is, the
    constructor raises, naming the library and the fix."""
    missing = str(tmp_path / "cann" / "libhccl.so")
    stock = two_ranks(SILENT, tmp_path, HCCL_SO_PATH=missing, NPU_COMPAT="0")
    assert stock["0"] == {"disabled": True, "weight": [5.0] * 4}
    assert stock["1"] == {"disabled": True, "weight": [-1.0] * 4}  # the weight never arrived
    compat = two_ranks(SILENT, tmp_path, HCCL_SO_PATH=missing, NPU_COMPAT_AUTO="1")  # the .pth activates
    for rank in ("0", "1"):
        error = compat[rank]["error"]
        assert error.startswith("HcclLibraryUnavailable: vllm-ascend's PyHcclCommunicator"), error
        assert f"rank {rank} of 2" in error and missing in error and "No such file" in error
        assert "point HCCL_SO_PATH at CANN's libhccl.so" in error


ENGINE = """
import hashlib

def digest(tensors):
    sha = hashlib.sha256()
    for name, tensor in tensors:
        sha.update(name.encode() + tensor.detach().cpu().contiguous().view(-1).view(torch_.uint8).numpy().tobytes())
    return sha.hexdigest()

def BODY(torch, rank, port):
    global torch_
    torch_ = torch
    from vllm_ascend.distributed.weight_transfer.hccl_engine import (
        HCCLTrainerSendWeightsArgs, HCCLWeightTransferEngine, HCCLWeightTransferUpdateInfo,
    )

    generator = torch.Generator().manual_seed(7)
    weights = [
        ("model.embed_tokens.weight", torch.randn(64, 16, generator=generator).to(torch.bfloat16)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(32, 16, generator=generator)),
        ("model.norm.weight", torch.ones(16, dtype=torch.bfloat16)),
    ]
    if rank == 0:  # the trainer, as Trinity's VLLMWeightTransferEngine (npu-compat's) drives it
        group = HCCLWeightTransferEngine.trainer_init(dict(master_address="127.0.0.1", master_port=port, world_size=2))
        on_npu = [(name, t.to(f"npu:{rank}")) for name, t in weights]
        HCCLWeightTransferEngine.trainer_send_weights(
            iterator=iter(on_npu), trainer_args=HCCLTrainerSendWeightsArgs(group=group, packed=True)
        )
        return {"digest": digest(weights), "disabled": group.disabled}
    engine = object.__new__(HCCLWeightTransferEngine)  # its constructor only keeps vLLM's configs
    engine.model_update_group = HCCLWeightTransferEngine._stateless_init_process_group(
        "127.0.0.1", port, 1, 2, device=rank
    )
    received = []
    engine.receive_weights(
        HCCLWeightTransferUpdateInfo(
            names=[n for n, _ in weights],
            dtype_names=[str(t.dtype).removeprefix("torch.") for _, t in weights],
            shapes=[list(t.shape) for _, t in weights],
            packed=True,
        ),
        load_weights=lambda batch: received.extend((n, t.clone()) for n, t in batch),
    )
    return {
        "digest": digest(received),
        "devices": sorted({str(t.device) for _, t in received}),
        "names": [n for n, _ in received],
    }
"""


@pytest.mark.skipif(RELEASE != "0.23.0.post1", reason="vllm-ascend's HCCLWeightTransferEngine is 0.23's")
def test_the_real_hccl_weight_transfer_engine_delivers_every_weight_with_an_equal_digest(
    tmp_path: Path,
) -> None:
    """Trinity 0.6's ``sync_method: nccl`` on Ascend: vllm-ascend's own engine, packed broadcast from the
    trainer (rank 0) to a rollout worker (rank 1) over the simulated libhccl.so."""
    out = two_ranks(ENGINE, tmp_path)
    trainer, worker = out["0"], out["1"]
    assert "error" not in trainer and "error" not in worker, out
    assert trainer["disabled"] is False
    assert worker["names"] == [
        "model.embed_tokens.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.norm.weight",
    ]
    assert worker["devices"] == ["npu:1"]
    assert worker["digest"] == trainer["digest"]


#: Both ranks take part in a first broadcast; then rank 1 waits for a second one that rank 0 never sends.
#: Rank 0 stays (it holds the group's store) until rank 1 says it is done.
SOURCE_NEVER_SENDS = """
def BODY(torch, rank, port):
    import time
    from vllm.distributed.utils import StatelessProcessGroup
    from vllm_ascend.distributed.device_communicators.pyhccl import PyHcclCommunicator

    group = StatelessProcessGroup.create("127.0.0.1", port, rank, 2, store_timeout=60)
    comm = PyHcclCommunicator(group, device=rank)
    device = f"npu:{rank}"
    first = torch.ones(4, device=device) if rank == 0 else torch.zeros(4, device=device)
    comm.broadcast(first, src=0)
    out = {"first": first.cpu().tolist()}
    if rank == 1:
        started = time.monotonic()
        try:
            comm.broadcast(torch.zeros(4, device=device), src=0)
            out["second"] = "completed"
        except RuntimeError as exc:
            out["second"] = str(exc)
        out["seconds"] = time.monotonic() - started
    group.broadcast_obj("done" if rank == 1 else None, src=1)
    return out
"""


def test_a_broadcast_from_a_source_that_never_sends_fails_at_hccl_exec_timeout(tmp_path: Path) -> None:
    """The receiver of a broadcast waits for its source within ``HCCL_EXEC_TIMEOUT``, as on the device --
    not for the group's store timeout (60 s here) and not for ever -- and the released wrapper raises HCCL's
    result code."""
    out = two_ranks(SOURCE_NEVER_SENDS, tmp_path, HCCL_EXEC_TIMEOUT="3")
    assert out["0"]["first"] == out["1"]["first"] == [1.0] * 4, out
    receiver = out["1"]
    assert receiver["second"] == "HCCL error: HCCL_E_TIMEOUT", receiver
    assert 3.0 <= receiver["seconds"] < 10.0, receiver


@pytest.mark.beyond_ci  # waits CANN's floor for HCCL_CONNECT_TIMEOUT, 120 s, for nothing else
def test_a_rank_that_never_joins_fails_after_hccl_connect_timeout() -> None:
    """Rank 0 of two builds its communicator alone: the simulated library waits ``HCCL_CONNECT_TIMEOUT``
    (120 s, CANN's floor) for the peer, then returns ``HCCL_E_TIMEOUT`` with HCCL's EI0006 words in its log,
    which vllm-ascend's wrapper raises."""
    code = """
import json, time, torch
from vllm_ascend.distributed.device_communicators.pyhccl_wrapper import HCCLLibrary
lib = HCCLLibrary()
root = lib.hcclGetUniqueId()
started = time.monotonic()
try:
    lib.hcclCommInitRank(2, root, 0)
    error = None
except RuntimeError as exc:
    error = str(exc)
print(json.dumps({"error": error, "waited": time.monotonic() - started}))
"""
    out = real_run(code, timeout=400, HCCL_CONNECT_TIMEOUT="120")
    assert out["error"] == "HCCL error: HCCL_E_TIMEOUT"
    assert 120 <= out["waited"] < 180
