"""Entry points other programs call in their own processes: Ray's worker setup hook, vLLM's plugin.

* :func:`ray_worker_setup` -- the ``worker_process_setup_hook`` that an activated Ray
  driver adds to its job (:mod:`npu_compat.patches.ray_seam`), so every worker of
  the job activates even when its raylet was started without npu-compat.  It runs
  the job's own hook afterwards: an import path passed on in
  ``NPU_COMPAT_RAY_SETUP_HOOK``, or a callable carried by :class:`ChainedSetupHook`.
* :func:`vllm_plugin` -- the ``vllm.general_plugins`` entry point: vLLM calls it in
  its engine process and in every worker process it spawns.

On a CUDA or CPU host both cost an import of this small module and a no-op decision.
"""

import os

from . import _env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

#: The import path Ray loads in each worker (Ray's ``load_class`` form, ``module.attr``).
RAY_HOOK = "npu_compat._seams.ray_worker_setup"


def ray_worker_setup() -> None:
    """Activate npu-compat in this Ray worker, then run the job's own setup hook, if any."""
    _start("ray-setup-hook")
    hook = os.environ.get(_env.RAY_SETUP_HOOK)
    if hook:
        _load(hook)()


class ChainedSetupHook:
    """A job's own setup hook (a callable), run after npu-compat's activation in each worker.

    Ray pickles this object into the job; the job's callable travels inside it as
    bytes and is unpickled only after activation, so that whatever it imports is
    imported with the patches in place.
    """

    def __init__(self, hook: "Callable[[], object]") -> None:
        import ray.cloudpickle

        self.__name__ = f"npu_compat+{getattr(hook, '__name__', type(hook).__name__)}"
        self._hook = ray.cloudpickle.dumps(hook)

    def __call__(self) -> object:
        import ray.cloudpickle

        _start("ray-setup-hook")
        return ray.cloudpickle.loads(self._hook)()

    def __repr__(self) -> str:
        return f"<{self.__name__}>"


def vllm_plugin() -> None:
    """vLLM's general plugin: activate npu-compat in this vLLM process (engine or worker)."""
    if _start("vllm-plugin") != "off" and os.environ.get(_env.REPORT_DIR):
        import multiprocessing

        from . import _reportfile

        _reportfile.set_role(f"vllm ({multiprocessing.current_process().name})")


def _start(via: str) -> str:
    from . import _autostart

    return _autostart.start(via)


def _load(path: str) -> "Callable[[], object]":
    import importlib

    module, _, attr = path.rpartition(".")
    if ":" in path:
        module, _, attr = path.partition(":")
    if not module:
        raise ValueError(
            f"{_env.RAY_SETUP_HOOK}={path!r} is not an import path like 'package.module.function'"
        )
    hook: Callable[[], object] = getattr(importlib.import_module(module), attr)
    return hook
