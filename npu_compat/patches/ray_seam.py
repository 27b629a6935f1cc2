"""The Ray seam: an activated driver's ``ray.init`` carries npu-compat into every worker of its job.

Ray workers are started by raylets and inherit the environment of ``ray start``,
not of the driver; a patch applied only in the driver reaches none of them.  So the
job's ``runtime_env`` gains

* ``worker_process_setup_hook`` = :data:`npu_compat._seams.RAY_HOOK`, which activates
  npu-compat in each worker before it runs any task, chained with the job's own hook
  (an import path is passed on in ``NPU_COMPAT_RAY_SETUP_HOOK``; a callable is wrapped
  in :class:`npu_compat._seams.ChainedSetupHook`);
* the driver's ``NPU_COMPAT*`` variables in ``env_vars`` (the job's own values win), and
  ``NPU_COMPAT_DEVICE`` when the driver's decision came from ``activate(device=...)``.

The caller's dicts are copied, never changed.  Under ``ray job submit`` the driver's
runtime_env is merged with the submitted one, and Ray refuses a field or variable
that both set: what the submitted job already sets (a setup hook, a variable) is
left to it.

A second wrapper, on ``FunctionActorManager.load_actor_class``, only names the actor
a worker became in that worker's report file.
"""

import os
import sys

from .. import _env
from .._seams import RAY_HOOK, ChainedSetupHook

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# Ray's internal names (Ray 2.58-2.60), read from Ray when it has them.
_RAY_HOOK_VAR = ("ray._private.ray_constants", "WORKER_PROCESS_SETUP_HOOK_ENV_VAR")
_RAY_JOB_CONFIG_VAR = ("ray._private.runtime_env.constants", "RAY_JOB_CONFIG_JSON_ENV_VAR")
_RAY_DEFAULTS = {
    _RAY_HOOK_VAR: "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR",
    _RAY_JOB_CONFIG_VAR: "RAY_JOB_CONFIG_JSON_ENV_VAR",
}


def carry_into_workers(wrapped, instance, args, kwargs):  # type: ignore[no-untyped-def]
    """Wrapper for ``ray._private.worker.init`` (``ray.init``): extend the job's runtime_env."""
    job_config = kwargs.get("job_config")
    runtime_env = kwargs.get("runtime_env")
    if runtime_env is None and job_config is not None:
        runtime_env = getattr(job_config, "runtime_env", None) or None
    kwargs["runtime_env"] = extend_runtime_env(runtime_env)
    context = wrapped(*args, **kwargs)
    _report_driver()
    return context


def extend_runtime_env(
    runtime_env: "Mapping[str, object] | None", environ: "Mapping[str, str] | None" = None
) -> "dict[str, object]":
    """A copy of ``runtime_env`` that activates npu-compat in every worker of the job."""
    env = os.environ if environ is None else environ
    out: dict[str, object] = dict(runtime_env or {})
    env_vars = {str(k): str(v) for k, v in dict(out.get("env_vars") or {}).items()}  # type: ignore[call-overload]
    submitted = _submitted_runtime_env(env)
    submitted_vars = submitted.get("env_vars")
    if not isinstance(submitted_vars, dict):
        submitted_vars = {}
    for name, value in _settings(env).items():
        if name not in submitted_vars:
            env_vars.setdefault(name, value)
    hook = out.get("worker_process_setup_hook")
    if _ray_name(_RAY_HOOK_VAR) in env_vars or "worker_process_setup_hook" in submitted or _is_ours(hook):
        pass  # already ours, or a hook Ray would refuse to see replaced
    elif hook is None:
        out["worker_process_setup_hook"] = RAY_HOOK
    elif isinstance(hook, str):
        env_vars.setdefault(_env.RAY_SETUP_HOOK, hook)
        out["worker_process_setup_hook"] = RAY_HOOK
    elif callable(hook):
        out["worker_process_setup_hook"] = ChainedSetupHook(hook)
    out["env_vars"] = env_vars
    return out


def _settings(env: "Mapping[str, str]") -> "dict[str, str]":
    settings = {k: v for k, v in env.items() if k.startswith(_env.PREFIX) and k != _env.RAY_SETUP_HOOK}
    decision = _env.LAST
    if decision is not None and decision.source == "activate(device=...)":
        settings.setdefault(_env.DEVICE, decision.device)
    return settings


def _is_ours(hook: object) -> bool:
    return hook == RAY_HOOK or isinstance(hook, ChainedSetupHook)


def _ray_name(where: "tuple[str, str]") -> str:
    return str(getattr(sys.modules.get(where[0]), where[1], _RAY_DEFAULTS[where]))


def _submitted_runtime_env(env: "Mapping[str, str]") -> "dict[str, object]":
    """The runtime_env of the job as submitted (``ray job submit``), which Ray merges with ours."""
    raw = env.get(_ray_name(_RAY_JOB_CONFIG_VAR))
    if not raw:
        return {}
    import json

    try:
        submitted = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return {}
    return submitted if isinstance(submitted, dict) else {}


def name_actor_in_report(wrapped, instance, args, kwargs):  # type: ignore[no-untyped-def]
    """Wrapper for ``FunctionActorManager.load_actor_class``: the report names the actor this worker became.

    Called once a Ray worker has been chosen to host an actor (its id and name are
    known by then); costs one environment lookup when no report is written.
    """
    actor_class = wrapped(*args, **kwargs)
    if os.environ.get(_env.REPORT_DIR) and _is_actor_worker(instance):
        from .. import _reportfile

        # Deserialising a handle to another actor loads that actor's class too (a synchronizer
        # holding the trainer's handle): the first class loaded in an actor worker is its own.
        _reportfile.set_role("ray-actor", actor_class=getattr(actor_class, "__name__", None), first=True)
    return actor_class


def _is_actor_worker(function_manager: object) -> bool:
    """A Ray worker process (not the driver, which loads classes when it deserialises handles)."""
    try:
        from ray._private import worker as worker_mod

        worker = getattr(function_manager, "_worker", None) or worker_mod.global_worker
        return bool(worker.mode == worker_mod.WORKER_MODE)
    except Exception:  # noqa: BLE001 - reporting only: never break Ray
        return False


def _report_driver() -> None:
    if os.environ.get(_env.REPORT_DIR):
        from .. import _reportfile

        _reportfile.set_role("ray-driver", keep=True)
