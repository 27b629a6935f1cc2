# Mirrors upstream signatures as they are (some unannotated); vLLM ships no stubs for mypy here.
# mypy: disable-error-code="import-not-found,no-untyped-def"
"""SIMULATED vllm_ascend.distributed.weight_transfer (npu_compat.testing).

Mirrors ``vllm_ascend/distributed/weight_transfer/__init__.py`` of vllm-ascend
0.23.0.post1: :func:`register_engine` registers the ``hccl`` and ``npu_ipc`` engines
(lazily, by module path) in vLLM's ``WeightTransferEngineFactory``, exactly as the real
one does -- so, like the real one, a second call raises ``ValueError`` (name taken).

vllm-ascend 0.18.0 has no such package: in that flavour (vLLM older than 0.23) importing
it raises ``ModuleNotFoundError``, as a missing module would.
"""

from ..._version import PAIRS_WITH_VLLM_0_23, VLLM_VERSION

if not PAIRS_WITH_VLLM_0_23:
    raise ModuleNotFoundError(
        f"No module named {__name__!r} (simulated vllm-ascend 0.18.0, paired with vLLM {VLLM_VERSION}: "
        "the package first ships in vllm-ascend 0.23.0.post1)",
        name=__name__,
    )

from vllm.distributed.weight_transfer.factory import (
    WeightTransferEngineFactory,
)


def register_engine():
    """Register Ascend weight transfer engines as vLLM plugins."""
    WeightTransferEngineFactory.register_engine(
        "hccl",
        "vllm_ascend.distributed.weight_transfer.hccl_engine",
        "HCCLWeightTransferEngine",
    )
    WeightTransferEngineFactory.register_engine(
        "npu_ipc",
        "vllm_ascend.distributed.weight_transfer.npu_ipc_engine",
        "NPUIPCWeightTransferEngine",
    )
