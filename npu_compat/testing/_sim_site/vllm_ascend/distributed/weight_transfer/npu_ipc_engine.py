# Mirrors upstream signatures as they are (some unannotated); vLLM ships no stubs for mypy here.
# mypy: disable-error-code="import-not-found,misc"
"""SIMULATED vllm_ascend.distributed.weight_transfer.npu_ipc_engine (npu_compat.testing).

A boundary stand-in for ``vllm_ascend/distributed/weight_transfer/npu_ipc_engine.py`` of
vllm-ascend 0.23.0.post1, present so that the ``npu_ipc`` name that ``register_engine()``
registers resolves to a class.  The NPU IPC engine shares NPU memory between processes
through IPC handles, which the simulation cannot provide: creating the engine, or calling
any of its methods, raises ``SimulatedComputeBoundary``.  The real module's send-args and
update-info dataclasses (subclasses of vLLM's IPC ones) are not simulated.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from vllm.config.parallel import ParallelConfig
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from npu_compat.testing._boundary import needs_npu

_WHY = "NPU IPC weight transfer shares NPU memory through IPC handles"


@dataclass
class NPUIPCWeightTransferInitInfo(WeightTransferInitInfo):
    """Initialization info for the NPU IPC backend (empty, as in the real module)."""


class NPUIPCWeightTransferEngine(WeightTransferEngine[NPUIPCWeightTransferInitInfo, Any]):
    init_info_cls = NPUIPCWeightTransferInitInfo
    update_info_cls = WeightTransferUpdateInfo

    def __init__(
        self,
        config: WeightTransferConfig,
        parallel_config: ParallelConfig,
        model: torch.nn.Module | None = None,
    ) -> None:
        raise needs_npu("NPUIPCWeightTransferEngine", _WHY)

    def init_transfer_engine(self, init_info: NPUIPCWeightTransferInitInfo) -> None:
        raise needs_npu("NPUIPCWeightTransferEngine.init_transfer_engine", _WHY)

    def receive_weights(
        self,
        update_info: Any,
        load_weights: Callable[[list[tuple[str, torch.Tensor]]], None],
    ) -> None:
        raise needs_npu("NPUIPCWeightTransferEngine.receive_weights", _WHY)

    def shutdown(self) -> None:
        raise needs_npu("NPUIPCWeightTransferEngine.shutdown", _WHY)

    @staticmethod
    def trainer_send_weights(
        iterator: Iterator[tuple[str, torch.Tensor]],
        trainer_args: dict[str, Any] | Any,
    ) -> None:
        raise needs_npu("NPUIPCWeightTransferEngine.trainer_send_weights", _WHY)
