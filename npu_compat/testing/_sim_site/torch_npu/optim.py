"""SIMULATED torch_npu.optim (npu_compat.testing): fused optimisers exist by name; using one is the
compute boundary."""

from npu_compat.testing._boundary import needs_npu


class NpuFusedAdamW:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise needs_npu("torch_npu.optim.NpuFusedAdamW")
