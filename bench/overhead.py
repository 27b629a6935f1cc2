"""What npu-compat's patches cost at call time, measured side by side in one run.

Run in an environment with torch (a stack venv): ``python bench/overhead.py [rounds]``.

1. Per-call cost of each kind of wrapper the catalogue installs (the real wrapper functions
   from ``npu_compat.patches``, installed as the engine installs them: a plain-function shim
   for a plain function or method, wrapt's ``FunctionWrapper`` otherwise) around a no-op
   callable with the arguments upstream passes, against the bare callable.
   Goal: <= 1 us added per patched call.
2. Hot loop in a module whose ``torch`` global is the scoped TorchView (``torch.add`` on a
   small tensor), interleaved with the same loop in an unpatched copy.  Goal: ratio <= 1.01.
3. How many torch callables npu-compat wraps process-wide once torch and torch.distributed
   are imported on an NPU decision.  Goal: none on per-tensor paths.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import textwrap
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_compat.testing import enable  # noqa: E402

enable(2)
os.environ["NPU_COMPAT_DEVICE"] = "npu"

import torch  # noqa: E402

import npu_compat  # noqa: E402
from npu_compat import PatchSpec  # noqa: E402

HOT = textwrap.dedent(
    """
    import torch

    def hot(n, x):
        for _ in range(n):
            x = torch.add(x, 1)
        return x

    def noop(*args, **kwargs):
        return None

    class Remote:
        def _remote(self, args=None, kwargs=None, **options):
            return None
    """
)

WRAPPERS = [
    # (label, wrapper, how upstream calls the patched function)
    ("(cheapest: device_type_first on an int)", "torch_distributed:device_type_first", "f(0)"),
    ("torch.distributed.init_process_group", "torch_distributed:init_process_group",
     "f('nccl', init_method='tcp://127.0.0.1:1', rank=0, world_size=1)"),
    ("torch.distributed.new_group", "torch_distributed:new_group", "f([0, 1], backend='nccl')"),
    ("ray.placement_group", "ray_resources:placement_group_bundles",
     "f([{'GPU': 1, 'CPU': 1}], strategy='PACK')"),
    ("ray ActorClass._remote", "ray_resources:remote_options", "f(args=(), kwargs={}, num_gpus=1, name='a')"),
    ("ray guard (no GPU asked)", "ray_resources:guard_remote", "f(args=(), kwargs={}, num_cpus=1)"),
]  # fmt: skip


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    site = Path(tempfile.mkdtemp(prefix="npu-compat-bench-"))
    (site / "bench_patched.py").write_text(HOT)
    (site / "bench_plain.py").write_text(HOT)
    sys.path.insert(0, str(site))
    view = PatchSpec("bench.view", "bench_patched:torch", distribution="torch", versions=">=2",
                     replacement="npu_compat.patches.torch_view:torch_for_npu", why="bench")  # fmt: skip
    npu_compat.deactivate()
    npu_compat.activate("npu", specs=[view])
    import bench_patched
    import bench_plain

    from npu_compat._apply import build
    from npu_compat._ledger import Record

    print("1. per-call cost of a patched callable (real wrappers, as the engine installs them)")
    import wrapt

    floor = wrapt.FunctionWrapper(bench_plain.noop, lambda wrapped, instance, a, k: wrapped(*a, **k))
    n = 20000
    plain = min(timeit.repeat("f(0)", globals={"f": bench_plain.noop}, number=n, repeat=7)) / n
    passthrough = min(timeit.repeat("f(0)", globals={"f": floor}, number=n, repeat=7)) / n
    print(f"   {'(floor: bare wrapt pass-through)':40s} +{(passthrough - plain) * 1e6:5.2f} us/call")
    for label, wrapper, call in WRAPPERS:
        spec = PatchSpec("bench.one", "bench_plain:noop", distribution="torch", versions=">=2",
                         wrapper="npu_compat.patches." + wrapper, why="bench")  # fmt: skip
        record = Record(spec)
        record.live = True
        if "Remote" in label:  # a method: the patch sits in the class, the call goes through an instance
            plain_cls = bench_plain.Remote
            shim = build(record, plain_cls._remote, method=True)
            patched_cls = type("Remote", (), {"_remote": shim})
            target, wrapped = plain_cls()._remote, patched_cls()._remote
        else:
            target = bench_plain.noop
            wrapped = build(record, target)
        n = 20000
        plain = min(timeit.repeat(call, globals={"f": target}, number=n, repeat=7)) / n
        patched = min(timeit.repeat(call, globals={"f": wrapped}, number=n, repeat=7)) / n
        added, before, after = (patched - plain) * 1e6, plain * 1e6, patched * 1e6
        print(f"   {label:40s} +{added:5.2f} us/call  ({before:.2f} -> {after:.2f} us)")

    print(f"2. hot loop (torch.add on a 4-element tensor, {rounds} interleaved rounds)")
    x = torch.zeros(4)
    n = 20000
    ratios = []
    for _ in range(rounds):
        t_plain = timeit.timeit(lambda: bench_plain.hot(n, x), number=1)
        t_patched = timeit.timeit(lambda: bench_patched.hot(n, x), number=1)
        ratios.append(t_patched / t_plain)
    low, mid, high = min(ratios), statistics.median(ratios), max(ratios)
    print(f"   patched/plain median ratio {mid:.4f} (min {low:.4f}, max {high:.4f})")
    assert npu_compat.is_patched(bench_patched.torch) and bench_plain.torch is torch

    print("3. torch callables wrapped process-wide on an NPU decision")
    npu_compat.deactivate()
    npu_compat.activate("npu")
    __import__("torch.distributed.device_mesh")

    wrapped_torch = [
        r["target"]
        for r in npu_compat.report()
        if r["status"] == "applied" and r["target"].startswith("torch")
    ]
    print(f"   {len(wrapped_torch)}: {', '.join(wrapped_torch)}")
    per_tensor = [t for t in wrapped_torch if not t.startswith("torch.distributed")]
    print(f"   on per-tensor paths: {len(per_tensor)}")


if __name__ == "__main__":
    main()
