"""hccl on npu tensors: every collective FSDP2, verl and Trinity use, equal to Gloo's on CPU tensors."""

from __future__ import annotations

import pytest

from tests.conftest import run_ranks
from tests.sim.npu_backend import child_env, needs_backend, npu_backend_built

#: torch and Ray alone, pinned alike in every stack: stack-a runs these (noxfile.SHARED_PINS)
pytestmark = pytest.mark.same_on_every_stack
pytest.importorskip("torch", reason="needs torch (installed by the upstream stack sessions)")

__all__ = ["npu_backend_built"]

SCRIPT = """
import json, sys, datetime
import torch, torch.distributed as dist
rank = int(sys.argv[1])
torch.npu.set_device(rank)
dist.init_process_group("hccl", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
gloo = dist.new_group(backend="gloo")


def run(device, group):
    out = {}
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(6, generator=g).to(device)
    dist.all_reduce(x, group=group); out["all_reduce"] = x
    y = torch.randn(6, generator=g).to(device)
    work = dist.all_reduce(y, op=dist.ReduceOp.MAX, group=group, async_op=True); work.wait(); out["async_max"] = y
    b = (torch.arange(4.0) * (rank + 1)).to(device)
    dist.broadcast(b, src=1, group=group); out["broadcast"] = b
    gathered = torch.empty(8, device=device)
    dist.all_gather_into_tensor(gathered, torch.full((4,), rank + 0.5, device=device), group=group)
    out["all_gather_into_tensor"] = gathered
    rs = torch.empty(3, device=device)
    dist.reduce_scatter_tensor(rs, torch.arange(6.0, device=device) + rank, group=group)
    out["reduce_scatter_tensor"] = rs
    a2a = torch.empty(4, device=device)
    dist.all_to_all_single(a2a, torch.arange(4.0, device=device) + 10 * rank, group=group)
    out["all_to_all_single"] = a2a
    if rank == 0:
        dist.send(torch.tensor([3.0, 1.0, 4.0], device=device), dst=1, group=group)
        out["p2p"] = torch.zeros(3, device=device)
    else:
        r = torch.zeros(3, device=device); dist.recv(r, src=0, group=group); out["p2p"] = r
    dist.barrier(group=group)
    return {k: [str(v.device), v.cpu().tolist()] for k, v in out.items()}


npu = run(torch.device("npu", rank), None)
cpu = run(torch.device("cpu"), gloo)
from npu_compat.testing._torch_sim import simulated_counts
print(json.dumps({"backend": dist.get_backend(), "npu": npu, "cpu": cpu,
                  "barrier_on": str(torch.npu.current_device()), "counted": simulated_counts()["hccl"]}))
dist.destroy_process_group()
"""


@needs_backend
@pytest.mark.usefixtures("npu_backend_built")
def test_hccl_collectives_on_npu_tensors_equal_gloo_on_cpu() -> None:
    outs = run_ranks(SCRIPT, child_env(), timeout=300)
    for rank, out in enumerate(outs):
        assert out["backend"] == "hccl"
        assert set(out["npu"]) == set(out["cpu"]) and len(out["npu"]) == 7
        for name, (device, values) in out["npu"].items():
            assert device == f"npu:{rank}", name
            assert values == out["cpu"][name][1], name  # bit for bit: the same Gloo arithmetic
    assert outs[0]["npu"]["broadcast"][1] == [0.0, 2.0, 4.0, 6.0]
    assert outs[1]["npu"]["all_gather_into_tensor"][1] == [0.5] * 4 + [1.5] * 4
    assert outs[0]["npu"]["reduce_scatter_tensor"][1] == [1.0, 3.0, 5.0]
    assert outs[1]["npu"]["all_to_all_single"][1] == [2.0, 3.0, 12.0, 13.0]
    assert outs[1]["npu"]["p2p"][1] == [3.0, 1.0, 4.0]
    # each collective of the hccl group counted once by its c10d name (the report's ``simulated`` section),
    # the same ones of the Gloo group not at all
    print(outs[0]["counted"], outs[1]["counted"])
    common = {
        "allreduce": 2,
        "broadcast": 1,
        "_allgather_base": 1,
        "_reduce_scatter_base": 1,
        "alltoall_base": 1,
    }
    for rank, p2p in enumerate(("send", "recv")):
        assert outs[rank]["counted"] == {**common, p2p: 1, "barrier": 1}, outs[rank]["counted"]


TIMEOUT_SCRIPT = """
import datetime, json, os, sys, time
import npu_compat
npu_compat.activate()
import torch, torch.distributed as dist
rank = int(sys.argv[1])
torch.npu.set_device(rank)
# upstream's names: npu-compat turns nccl into hccl, and must keep each group's timeout
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=4))
side = dist.new_group(backend="nccl", timeout=datetime.timedelta(seconds=2))
dist.barrier()
if rank == 1:  # alive, and never joins again: only the group's timeout can end rank 0's wait
    time.sleep(300)
    os._exit(0)
out = {"backends": [dist.get_backend(), dist.get_backend(side)]}
for name, group in (("default", None), ("side", side)):
    x = torch.ones(4, device="npu")
    started = time.monotonic()
    try:
        dist.broadcast(x, src=1, group=group)
        out[name] = ["returned", time.monotonic() - started, ""]
    except Exception as exc:
        out[name] = [type(exc).__name__, time.monotonic() - started, str(exc)[:300]]
print(json.dumps(out), flush=True)
os._exit(0)
"""


@needs_backend
@pytest.mark.usefixtures("npu_backend_built")
def test_a_collective_whose_peer_never_joins_raises_at_the_groups_timeout() -> None:
    """HCCL ends a collective that waits past ``HCCL_EXEC_TIMEOUT``; the simulated ``hccl`` ends it at
    the process group's ``timeout``, which npu-compat carries through from upstream's ``nccl`` call."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO, free_port

    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TIMEOUT_SCRIPT, str(rank), port],
            env=child_env(),
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        stdout, stderr = procs[0].communicate(timeout=180)
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    assert procs[0].returncode == 0, stderr[-3000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["backends"] == ["hccl", "hccl"]
    for name, timeout in (("default", 4), ("side", 2)):
        kind, waited, message = out[name]
        assert kind != "returned", out
        # at the timeout, not before it, and within a margin of 8 s (two loaded cores) after it
        assert timeout - 0.5 <= waited <= timeout + 8, (name, waited, message)
        assert "timed out" in message.lower() or "timeout" in message.lower(), message
