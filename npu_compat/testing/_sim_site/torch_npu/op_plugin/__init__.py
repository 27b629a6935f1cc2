# Mirrors upstream code as it is (unannotated); torch_npu ships no stubs for mypy here.
# mypy: disable-error-code="no-untyped-def,no-untyped-call,misc"
"""SIMULATED torch_npu.op_plugin (npu_compat.testing): the ATB extension's lazy names, as the real package."""

from .atb._atb_ops import _patch_atb_and_loadso

_patch_atb_and_loadso()
