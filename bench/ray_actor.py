"""Time for a Ray actor to become ready, with and without npu-compat, side by side on one cluster.

One local simulated-Ascend cluster (``npu_compat.testing._ray``; its raylet does not
activate at interpreter start).  Each round runs one driver process per variant, in a
shuffled order; each driver creates ``ACTORS`` actors one after another and times
``Actor.remote()`` until its first method returns (a new worker process each time):

* ``without``      -- the driver is not activated; the job has no runtime_env
* ``without+env``  -- not activated, but the job has a runtime_env (one variable): Ray
                      starts its workers through the same runtime-env path as ``with``
* ``with``         -- the driver is activated: ``ray.init`` adds npu-compat's setup hook and
                      variables, and every worker activates (simulated NPU: the patches
                      register; the simulation's torch_npu is not imported)

Goal: with / without <= 1.05x.  Needs ray.  Run: ``python bench/ray_actor.py [rounds] [actors]``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from npu_compat.testing._ray import npu_ray_cluster  # noqa: E402

DRIVER = """
import json, os, sys, time
if {activate}:
    import npu_compat
    npu_compat.activate()
import ray
ray.init(address={address!r}, runtime_env={runtime_env!r} or None, log_to_driver=False)

@ray.remote(num_cpus=0.1)
class Probe:
    def ready(self):
        import sys
        return "npu_compat._activation" in sys.modules

times, active = [], []
for i in range({actors}):
    start = time.perf_counter()
    a = Probe.remote()
    active.append(ray.get(a.ready.remote(), timeout=120))
    times.append(time.perf_counter() - start)
    ray.kill(a)
print(json.dumps({{"times": times, "active": active}}))
"""

VARIANTS = {
    "without": {"activate": False, "runtime_env": {}},
    "without+env": {"activate": False, "runtime_env": {"env_vars": {"BENCH_VARIANT": "1"}}},
    "with": {"activate": True, "runtime_env": {}},
}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    actors = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPU_COMPAT", "ASCEND_", "TRINITY_"))}
    env["PYTHONPATH"] = str(REPO)
    env["NPU_COMPAT_AUTO"] = "0"  # only the Ray seam activates workers
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with npu_ray_cluster(npus_per_node=2, cpus_per_node=4, env=env) as cluster:
        for _ in range(rounds):
            order = list(VARIANTS)
            random.shuffle(order)
            for name in order:
                v = VARIANTS[name]
                code = DRIVER.format(
                    activate=v["activate"],
                    address=cluster.address,
                    runtime_env=v["runtime_env"],
                    actors=actors,
                )
                proc = subprocess.run(
                    [sys.executable, "-c", code], env=cluster.env, capture_output=True, text=True, timeout=600
                )
                if proc.returncode != 0:
                    raise SystemExit(f"driver for {name} failed:\n{proc.stderr[-3000:]}")
                out = json.loads(proc.stdout.strip().splitlines()[-1])
                assert all(out["active"]) == v["activate"], (name, out["active"])
                samples[name].extend(out["times"])
    base = statistics.median(samples["without"])
    print(f"Ray actor ready time, {rounds} rounds x {actors} actors per variant, median")
    for name, values in samples.items():
        med = statistics.median(values)
        print(f"  {name:12s} {med * 1e3:8.1f} ms   ratio {med / base:5.3f}")
    env_base = statistics.median(samples["without+env"])
    ratio = statistics.median(samples["with"]) / env_base
    print(f"  with / without+env (the activation itself): {ratio:5.3f}")


if __name__ == "__main__":
    main()
