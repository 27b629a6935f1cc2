"""SIMULATED torch_npu.profiler (npu_compat.testing): names exist; profiling is the compute boundary."""

from npu_compat.testing._torch_sim import compute_boundary


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    return compute_boundary(f"torch_npu.profiler.{name}")
