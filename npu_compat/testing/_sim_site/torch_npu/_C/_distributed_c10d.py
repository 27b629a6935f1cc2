"""SIMULATED torch_npu._C._distributed_c10d (npu_compat.testing): ``ProcessGroupHCCL`` and its ``Options``.

vllm-ascend builds ``ProcessGroupHCCL.Options()`` with an ``hccl_config`` dict for every device group it
creates and passes it to ``torch.distributed.new_group(backend="hccl", pg_options=...)``.  The simulated
``hccl`` backend is a Gloo group; the options' HCCL settings (buffer sizes, algorithms) have nothing to tune
there and are kept as given.
"""

from datetime import timedelta
from typing import Any


class ProcessGroupHCCL:
    class Options:
        def __init__(self, is_high_priority_stream: bool = False) -> None:
            self.is_high_priority_stream = is_high_priority_stream
            self.hccl_config: dict[str, Any] = {}
            self._timeout = timedelta(minutes=30)
            self.global_ranks_in_group: list[int] = []
            self.group_id = ""


__all__ = ["ProcessGroupHCCL"]
