"""SIMULATED vllm_ascend.envs (npu_compat.testing) -- not Huawei's vllm-ascend.

Mirrors ``vllm_ascend/envs.py`` of vllm-ascend 0.23.0.post1 and 0.18.0 (same definitions
in both) for the variables the simulated worker reads, with the real defaults: read
lazily through the module's ``__getattr__``, like the real module.  Note the real default
``VLLM_ASCEND_ENABLE_NZ=1``: the real ``NPUWorker`` refuses RL weight updates (0.23.0.post1
``start_weight_update``, both releases' ``wake_up``) unless it is set to ``0``.
"""

import os
from collections.abc import Callable
from typing import Any

env_variables: dict[str, Callable[[], Any]] = {
    # Whether custom kernels were compiled (the real default: True).
    "COMPILE_CUSTOM_KERNELS": lambda: bool(int(os.getenv("COMPILE_CUSTOM_KERNELS", "1"))),
    # Weight FRACTAL_NZ format; 0 disabled, 1 quantised weights only (the real default), 2 all.
    "VLLM_ASCEND_ENABLE_NZ": lambda: int(os.getenv("VLLM_ASCEND_ENABLE_NZ", 1)),
}


def __getattr__(name: str) -> Any:
    # lazy evaluation of environment variables
    if name in env_variables:
        return env_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return list(env_variables.keys())
