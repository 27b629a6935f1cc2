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
print(json.dumps({"backend": dist.get_backend(), "npu": npu, "cpu": cpu,
                  "barrier_on": str(torch.npu.current_device())}))
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
