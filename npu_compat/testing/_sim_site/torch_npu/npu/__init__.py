"""SIMULATED torch_npu.npu (npu_compat.testing): the simulated ``torch.npu`` plus ``mstx`` and SoC queries."""

import types as _types

from npu_compat.testing import _torch_sim as _sim

globals().update({k: v for k, v in vars(_sim.npu).items() if not k.startswith("__")})

#: An Ascend 910B3 reports SoC version 222 (torch_npu's ``get_soc_version``).
SOC_VERSION = 222


def get_soc_version() -> int:
    return SOC_VERSION


def _no_op(*args: object, **kwargs: object) -> int:
    return 0


#: Profiler markers; nothing to mark on a simulated device.
mstx = _types.SimpleNamespace(range_start=_no_op, range_end=_no_op, mark=_no_op)
