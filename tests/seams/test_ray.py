"""The Ray seam, on real local clusters (one at a time, every wait bounded).

* a cluster started through ``python -m npu_compat ray start --head``: an actor's process
  is activated although the driver is not;
* a cluster started plainly, with only the driver activated: ``ray.init`` carries
  npu-compat into the job's workers through ``worker_process_setup_hook`` (chained with
  the job's own hook, an import path or a callable);
* ``NPU_COMPAT=0`` in a job leaves its workers untouched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from npu_compat.patches import ray_seam

from .conftest import REPO, child_env, last_json, py, report_for

pytest.importorskip("ray", reason="needs ray (installed by the upstream stack sessions)")

from npu_compat.testing._ray import npu_ray_cluster

#: torch and Ray alone, pinned alike in every stack: stack-a runs these (noxfile.SHARED_PINS)
pytestmark = pytest.mark.same_on_every_stack

DRIVER = """
import json, os, sys
ACTIVATE = {activate}
if ACTIVATE:
    import npu_compat
    assert npu_compat.activate() == "npu"
import ray

def callable_hook():
    import os, sys
    e = sys.modules.get("npu_compat._activation")
    os.environ["USER_HOOK_RAN"] = "after-activation" if e and e._state.active else "before-activation"

hook = {hook}
runtime_env = {runtime_env}
if hook == "callable":
    runtime_env["worker_process_setup_hook"] = callable_hook
elif hook:
    runtime_env["worker_process_setup_hook"] = hook
ray.init(address={address!r}, runtime_env=runtime_env or None, log_to_driver=False)

@ray.remote(resources={{"NPU": 1}})
class Probe:
    def look(self):
        e = sys.modules.get("npu_compat._activation")
        return {{"pid": os.getpid(), "active": bool(e and e._state.active),
                 "loaded": sorted(m for m in sys.modules if m.startswith("npu_compat")),
                 "hook": os.environ.get("USER_HOOK_RAN"),
                 "env": sorted(k for k in os.environ if k.startswith("NPU_COMPAT"))}}

@ray.remote(num_cpus=0)
class Holder:
    def hold(self, handles):  # deserialising a handle loads the other actor's class here
        return os.getpid(), handles[0]

probe = Probe.options(name="probe-{tag}").remote()
out = ray.get(probe.look.remote(), timeout=120)
holder = Holder.options(name="holder-{tag}").remote()
out["holder_pid"], _handle = ray.get(holder.hold.remote([probe]), timeout=120)  # and in the driver
out["driver_pid"] = os.getpid()
ray.kill(holder)
ray.kill(probe)
print(json.dumps(out))
"""


def drive(cluster: Any, env: dict[str, str], *, activate: bool, tag: str, hook: str | None = None,
          runtime_env: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    code = DRIVER.format(
        activate=activate,
        hook=repr(hook),
        runtime_env=repr(runtime_env or {}),
        address=cluster.address,
        tag=tag,
    )
    return last_json(py(code, env, timeout=240))  # type: ignore[return-value]


def test_a_cluster_started_through_the_launcher_activates_its_workers(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    base = child_env(auto=False)  # the launcher drops NPU_COMPAT_AUTO for the cluster it starts
    launcher = [sys.executable, "-m", "npu_compat", "--report-dir", str(reports)]
    with npu_ray_cluster(npus_per_node=2, cpus_per_node=2, env=base, command_prefix=launcher) as cluster:
        driver_env = dict(cluster.env)  # still NPU_COMPAT_AUTO=0: the driver is not activated
        out = drive(cluster, driver_env, activate=False, tag="launcher")
        off = drive(
            cluster, driver_env, activate=False, tag="off", runtime_env={"env_vars": {"NPU_COMPAT": "0"}}
        )
    assert out["active"]
    rep = report_for(reports, out["pid"])
    assert rep is not None, sorted(p.name for p in reports.iterdir())
    assert rep["activated_by"] in {"launcher", ".pth"}
    assert rep["decision"]["device"] == "npu"  # type: ignore[index]
    assert rep["role"] == "ray-actor" and rep["ray"]["actor_name"] == "probe-launcher"  # type: ignore[index]
    statuses = {p["id"]: p["status"] for p in rep["patches"]}  # type: ignore[union-attr]
    assert statuses["ray.actor_report"] == "applied"
    # NPU_COMPAT=0 for a job: its workers are untouched, and write nothing
    assert off["loaded"] == [] and not off["active"]
    assert report_for(reports, off["pid"]) is None, json.dumps(report_for(reports, off["pid"]), indent=1)[
        :3000
    ]


def test_an_activated_driver_carries_npu_compat_into_a_plain_clusters_workers(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    base = child_env(auto=False)  # neither the raylet nor its workers activate at interpreter start
    hooks = {"none": None, "path": "tests.seams.ray_hooks.mark", "callable": "callable"}
    with npu_ray_cluster(npus_per_node=2, cpus_per_node=2, env=base) as cluster:
        driver_env = {**cluster.env, "NPU_COMPAT_REPORT_DIR": str(reports)}
        outs = {
            tag: drive(cluster, driver_env, activate=True, tag=tag, hook=hook) for tag, hook in hooks.items()
        }
        plain = drive(cluster, dict(cluster.env), activate=False, tag="unactivated")
    for tag, out in outs.items():
        assert out["active"], tag
        assert "NPU_COMPAT_REPORT_DIR" in out["env"] and "NPU_COMPAT_SIMULATE" in out["env"]
        rep = report_for(reports, out["pid"])
        assert rep is not None, tag
        assert rep["activated_by"] == "ray-setup-hook"
        assert rep["role"] == "ray-actor" and rep["ray"]["actor_name"] == f"probe-{tag}"  # type: ignore[index]
        assert rep["ray"]["actor_class"] == "Probe"  # type: ignore[index]
        # an actor holding another's handle is still itself; the driver still the driver
        holder = report_for(reports, out["holder_pid"])
        assert holder is not None and holder["ray"]["actor_class"] == "Holder", holder  # type: ignore[index]
        driver = report_for(reports, out["driver_pid"])
        assert driver is not None and driver["role"] == "ray-driver", driver
        # one node: the actor's report names the driver's node (Ray's 28-byte node id, in hex)
        node = driver["ray"]["node_id"]  # type: ignore[index]
        assert rep["ray"]["node_id"] == node and len(node) == 56, (rep["ray"], driver["ray"])  # type: ignore[index]
        # the job's own hook still runs, after ours
        assert out["hook"] == (None if tag == "none" else "after-activation"), tag
    # the same raylet, a driver that is not activated: its workers are not either
    assert not plain["active"] and plain["loaded"] == []
    roles = [json.loads(r.read_text())["role"] for r in reports.glob("*.json")]
    assert roles.count("ray-driver") == len(hooks)


# -- extend_runtime_env, without a cluster -------------------------------------------------------------


def test_the_runtime_env_gains_our_hook_and_variables_and_the_callers_is_unchanged() -> None:
    theirs = {"env_vars": {"A": "1", "NPU_COMPAT_STRICT": "0"}, "pip": ["x"]}
    env = {"NPU_COMPAT_STRICT": "1", "NPU_COMPAT_REPORT_DIR": "/r", "HOME": "/root", "SECRET": "s"}
    out = ray_seam.extend_runtime_env(theirs, env)
    assert theirs == {"env_vars": {"A": "1", "NPU_COMPAT_STRICT": "0"}, "pip": ["x"]}
    assert out["worker_process_setup_hook"] == "npu_compat._seams.ray_worker_setup"
    assert out["env_vars"] == {"A": "1", "NPU_COMPAT_STRICT": "0", "NPU_COMPAT_REPORT_DIR": "/r"}
    assert out["pip"] == ["x"]


def test_a_string_hook_is_chained_through_a_variable() -> None:
    out = ray_seam.extend_runtime_env({"worker_process_setup_hook": "pkg.mod.setup"}, {})
    assert out["worker_process_setup_hook"] == "npu_compat._seams.ray_worker_setup"
    assert out["env_vars"] == {"NPU_COMPAT_RAY_SETUP_HOOK": "pkg.mod.setup"}
    again = ray_seam.extend_runtime_env(out, {})
    assert again == out


def test_a_callable_hook_is_wrapped() -> None:
    from npu_compat._seams import ChainedSetupHook

    def mine() -> str:
        return "ran"

    out = ray_seam.extend_runtime_env({"worker_process_setup_hook": mine}, {})
    hook = out["worker_process_setup_hook"]
    assert isinstance(hook, ChainedSetupHook) and hook.__name__ == "npu_compat+mine"
    assert ray_seam.extend_runtime_env(out, {})["worker_process_setup_hook"] is hook


def test_a_submitted_job_keeps_what_it_already_sets() -> None:
    submitted = json.dumps(
        {"runtime_env": {"worker_process_setup_hook": "x.y", "env_vars": {"NPU_COMPAT_STRICT": "1"}}}
    )
    env = {"RAY_JOB_CONFIG_JSON_ENV_VAR": submitted, "NPU_COMPAT_STRICT": "1", "NPU_COMPAT_DEVICE": "npu"}
    out = ray_seam.extend_runtime_env(None, env)
    assert "worker_process_setup_hook" not in out
    assert out["env_vars"] == {"NPU_COMPAT_DEVICE": "npu"}


def test_the_hook_runs_in_a_worker_like_process_and_chains(tmp_path: Path) -> None:
    out = last_json(
        py(
            """
            import json, os, sys
            os.environ["NPU_COMPAT_RAY_SETUP_HOOK"] = "tests.seams.ray_hooks.mark"
            from npu_compat import _seams
            _seams.ray_worker_setup()
            print(json.dumps([sys.modules["npu_compat._autostart"].VIA, os.environ["USER_HOOK_RAN"]]))
            """,
            child_env({"NPU_COMPAT_DEVICE": "npu"}, pythonpath=[str(REPO)], auto=False),
        )
    )
    assert out == ["ray-setup-hook", "after-activation"]
