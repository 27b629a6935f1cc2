"""The simulated Ascend itself: what upstream code will see, in this process and in children."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from npu_compat.testing import simulation_env
from npu_compat.testing._ray import _active_nodes
from tests.conftest import SIM_PATH, clean_env, last_json, run_py

#: torch and Ray alone, pinned alike in every stack: stack-a runs these (noxfile.SHARED_PINS)
pytestmark = pytest.mark.same_on_every_stack

pytest.importorskip("torch", reason="needs torch (installed by the upstream stack sessions)")


def sim(devices: int = 2, **extra: str) -> dict[str, str]:
    env = simulation_env(devices, {})
    env.update(extra)
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}


def sim_child(code: str, devices: int = 2, **kw: Any) -> Any:
    return last_json(run_py(code, env=sim(devices), pythonpath=SIM_PATH, **kw))


def test_torch_sees_an_ascend_host_and_cuda_stays_false() -> None:
    out = sim_child(
        """
        import json, importlib.metadata as md
        import torch            # auto-loads torch_npu through the torch.backends entry point, as on a real host
        import torch_npu
        d = torch.device("npu:1")
        torch.npu.set_device(1)
        torch.npu.synchronize(); torch.npu.empty_cache()
        print(json.dumps({
            "available": torch.npu.is_available(), "count": torch.npu.device_count(),
            "device": [d.type, d.index], "current": torch.npu.current_device(),
            "cuda": torch.cuda.is_available(), "simulated": torch_npu.SIMULATED,
            "version": md.version("torch_npu"), "capability": torch.npu.get_device_capability(),
            "props": torch.npu.get_device_properties(0).total_memory, "mem": torch.npu.mem_get_info(),
            "calls": [c[0] for c in torch.npu.calls],
            "stream": type(torch.npu.current_stream()).__name__,
            "allocated": [torch.npu.memory_allocated(), torch.npu.max_memory_allocated(0)],
        }))
        """
    )
    assert out["available"] and out["count"] == 2 and out["current"] == 1
    assert out["device"] == ["npu", 1]
    assert out["cuda"] is False
    assert out["simulated"] and out["version"] == "2.13.0+sim"
    assert out["capability"] is None  # what torch_npu answers
    assert out["props"] == 64 << 30 and out["mem"][1] == 64 << 30
    assert {"set_device", "synchronize", "empty_cache"} <= set(out["calls"])
    assert out["stream"] == "Stream"
    assert out["allocated"] == [0, 0]  # verl's log_gpu_memory_usage calls these without a device


def test_npu_on_host_serves_npu_devices_and_indices_on_the_cpu_and_leaves_cuda_alone() -> None:
    out = sim_child(
        """
        import json
        import torch
        from npu_compat.testing._boundary import npu_on_host
        errors = []
        with npu_on_host() as requests:
            a = torch.ones(2, device="npu:1")
            b = torch.nn.Linear(2, 2).to(torch.npu.current_device())  # upstream's FSDP1 LoRA save
            c = torch.zeros(1, device=0)
            try:
                torch.ones(1, device="cuda")
            except Exception as exc:
                errors.append(type(exc).__name__)
        print(json.dumps({
            "devices": [a.device.type, b.weight.device.type, c.device.type],
            "requests": requests, "index": str(torch.device(0)), "cuda": errors,
        }))
        """
    )
    assert out["index"] == "npu:0"  # torch reads a bare index as the current accelerator's
    assert out["devices"] == ["cpu", "cpu", "cpu"]
    assert out["requests"][0] == "npu:1" and set(out["requests"][1:]) == {"npu:0"}
    assert out["cuda"] and out["cuda"][0] in {"AssertionError", "RuntimeError"}


def test_npu_compat_decides_npu_under_the_simulation() -> None:
    out = sim_child(
        """
        import json, npu_compat
        print(json.dumps({"device": npu_compat.activate(), "evidence": npu_compat.report().decision["evidence"]}))
        """
    )
    assert out["device"] == "npu"
    assert "ASCEND_RT_VISIBLE_DEVICES=0,1" in out["evidence"]
    assert "torch_npu is importable" in out["evidence"]


SPAWN_SCRIPT = """
import json, multiprocessing as mp, subprocess, sys


def probe(q):
    import torch
    q.put([torch.npu.is_available(), torch.npu.device_count(), torch.cuda.is_available()])


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=probe, args=(q,))
    p.start()
    spawned = q.get(timeout=120)
    p.join(30)
    code = "import torch, json; print(json.dumps([torch.npu.is_available(), torch.npu.device_count()]))"
    sub = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    print(json.dumps({"spawned": spawned, "sub": json.loads(sub.stdout)}))
"""


def test_spawned_and_subprocess_children_see_the_same_ascend(tmp_path: Path) -> None:
    script = tmp_path / "spawner.py"
    script.write_text(SPAWN_SCRIPT)
    out = sim_child(
        f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", devices=4, timeout=240
    )
    assert out == {"spawned": [True, 4, False], "sub": [True, 4]}


def test_devices_are_counted_at_their_first_use_as_torch_npu_counts_them() -> None:
    """torch_npu does not fix its device count before the device's first use: a launcher (vLLM's Ray
    executor) may still set ``ASCEND_RT_VISIBLE_DEVICES`` after ``import torch``.  From the first use
    on, the count is the runtime's, whatever the variable says later."""
    out = sim_child(
        """
        import json, os
        os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "0"
        import torch
        seen = {"imported": [torch.npu.device_count(), torch.npu.is_initialized()]}
        os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "2,3"
        seen["changed"] = [torch.npu.device_count(), torch.npu.is_initialized()]
        torch.npu.set_device(1)
        x = torch.ones(2, device="npu:1") * 3
        seen["used"] = [torch.npu.device_count(), torch.npu.is_initialized(), len(torch.npu.default_generators),
                        x.cpu().tolist()]
        os.environ["ASCEND_RT_VISIBLE_DEVICES"] = "0,1,2,3"
        seen["after"] = torch.npu.device_count()
        try:
            torch.ones(1, device="npu:2")
        except RuntimeError as exc:
            seen["third"] = str(exc).splitlines()[0]
        print(json.dumps(seen))
        """,
        devices=4,
    )
    assert out["imported"] == [1, False]
    assert out["changed"] == [2, False]
    assert out["used"] == [2, True, 2, [3.0, 3.0]]
    assert out["after"] == 2
    assert "invalid device npu:2 (2 visible)" in out["third"]


def test_torch_npu_imported_before_torch_registers_npu_as_when_torch_comes_first() -> None:
    """Ascend scripts often begin with ``import torch_npu``: torch_npu turns torch's backend autoload off
    while it imports torch (its ``__init__``), registers ``npu`` itself, and restores the switch."""
    out = sim_child(
        """
        import json, os
        import torch_npu
        import torch
        print(json.dumps([torch.npu.device_count(), str(torch.ones(1, device="npu").device),
                          os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")]))
        """,
    )
    assert out == [2, "npu:0", "1"]


VISIBLE = [None, "", "0", "0,1", "1,0", "0,,1", "0,1x,2", "3,4,5", "0,5", "abc", "2,3", "1,1"]


def test_the_visible_devices_read_as_torch_npu_reads_them_before_and_after_the_first_use() -> None:
    """``ASCEND_RT_VISIBLE_DEVICES`` on a host of 4 NPUs: torch_npu's own reading before the first use
    (``_parse_visible_devices``, ``_device_count_ascend_hal``), and the backend's at it, agree."""
    out = sim_child(
        f"""
        import json
        import torch
        from npu_compat.testing import _torch_sim
        print(json.dumps([[_torch_sim.visible_device_count(v, 4), _torch_sim.NATIVE.visible_count(v, 4)]
                          for v in {VISIBLE!r}]))
        """,
        devices=4,
    )
    assert [python for python, _ in out] == [4, 0, 1, 2, 0, 1, 2, 1, 1, 0, 2, 0]
    assert [native for _, native in out] == [python for python, _ in out]


COLLECTIVES = """
import json, os, sys, datetime
import torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group(BACKEND, init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
t = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
dist.all_reduce(t)
b = torch.arange(4, dtype=torch.float32) if rank == 0 else torch.zeros(4)
dist.broadcast(b, src=0)
parts = [torch.zeros(2) for _ in range(2)]
dist.all_gather(parts, torch.full((2,), float(rank)))
print(json.dumps({"backend": str(dist.get_backend()), "sum": t.tolist(), "bcast": b.tolist(),
                  "gather": [p.tolist() for p in parts]}))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("backend", ["hccl", "cpu:gloo,npu:hccl"])
def test_hccl_runs_real_collectives_across_two_processes(backend: str) -> None:
    from tests.conftest import clean_env, run_ranks

    outs = run_ranks(f"BACKEND = {backend!r}\n" + COLLECTIVES, clean_env(sim(), SIM_PATH))
    for out in outs:
        assert out["backend"] == backend
        assert out["sum"] == [3.0, 30.0]
        assert out["bcast"] == [0.0, 1.0, 2.0, 3.0]
        assert out["gather"] == [[0.0, 0.0], [1.0, 1.0]]


def test_ray_cluster_advertises_npus_only(npu_ray_cluster: Any) -> None:
    out = last_json(
        run_py(
            f"""
            import json, ray
            ray.init(address={npu_ray_cluster.address!r}, log_to_driver=False)

            @ray.remote(resources={{"NPU": 1}})
            class Probe:
                def look(self):
                    import os, torch
                    return [os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), torch.npu.is_available(),
                            torch.cuda.is_available()]

            probe = Probe.remote()
            seen = ray.get(probe.look.remote(), timeout=90)

            @ray.remote(num_gpus=1)
            def wants_gpu():
                return 1

            ready, _ = ray.wait([wants_gpu.remote()], timeout=3)
            print(json.dumps({{"resources": ray.cluster_resources(), "seen": seen, "gpu_ready": bool(ready)}}))
            """,
            env=sim(),
            timeout=180,
        )
    )
    assert out["resources"]["NPU"] == 2.0 and "GPU" not in out["resources"]
    assert out["seen"][0] in {"0", "1"} and out["seen"][1] is True and out["seen"][2] is False
    assert out["gpu_ready"] is False  # a GPU request on an NPU-only cluster never becomes ready


def test_the_env_command_prints_the_simulation_for_a_shell_and_for_a_dotenv_file() -> None:
    env = clean_env()
    shell = subprocess.run([sys.executable, "-m", "npu_compat.testing", "env", "--devices", "4"], env=env,
                           capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    dotenv = subprocess.run([sys.executable, "-m", "npu_compat.testing", "env", "--devices", "4", "--dotenv"], env=env,
                            capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    pairs = dict(line.split("=", 1) for line in dotenv.splitlines())
    assert pairs["NPU_COMPAT_SIMULATE"] == "1" and pairs["ASCEND_RT_VISIBLE_DEVICES"] == "0,1,2,3"
    assert pairs["PYTHONPATH"].split(os.pathsep)[: len(SIM_PATH)] == SIM_PATH
    assert shell.splitlines() == [f"export {k}={shlex.quote(v)}" for k, v in pairs.items()]


def test_the_env_command_prints_the_simulations_choices_this_shell_has_already() -> None:
    """Sourced elsewhere (a later CI step), the lines alone make the same simulation: the choices are printed
    though this shell has them, the other variables only where they change."""
    env = clean_env({"NPU_COMPAT_SIMULATE": "1", "NPU_COMPAT_SIMULATE_VLLM_PLATFORM": "0"})
    dotenv = subprocess.run([sys.executable, "-m", "npu_compat.testing", "env", "--devices", "2", "--dotenv"], env=env,
                            capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    pairs = dict(line.split("=", 1) for line in dotenv.splitlines())
    assert pairs["NPU_COMPAT_SIMULATE"] == "1" and pairs["NPU_COMPAT_SIMULATE_VLLM_PLATFORM"] == "0"
    assert "HOME" not in pairs


def test_the_cluster_command_refuses_a_shape_without_nodes() -> None:
    proc = subprocess.run([sys.executable, "-m", "npu_compat.testing", "cluster", "--nodes", "0"],
                          env=clean_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "at least one node" in proc.stderr


def test_ray_status_is_read_for_the_nodes_it_lists_as_active() -> None:
    status = (
        "Node status\n----\nActive:\n 1 node_760453789d60f46fa9403681c30908fa2f96bdbcec00d434eb6cce99\n"
        " 1 node_95739529a95af38ca4980a05348f74848692571858996957c795823d\nPending:\n (no pending nodes)\n"
    )
    assert _active_nodes(status) == 2
    assert _active_nodes(status.replace(" 1 node_9573", " x")) == 1
