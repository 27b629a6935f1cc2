# Mirrors upstream code as it is (unannotated); torch_npu ships no stubs for mypy here.
# mypy: disable-error-code="no-untyped-def,no-untyped-call,misc"
"""SIMULATED torchair.core._concrete_graph (npu_compat.testing): ``ValuePack`` and ``_is_symlist`` as
torch_npu 2.13.0's (a graph value's meta and device parts, and whether a list holds symbolic sizes)."""

from collections.abc import Mapping

import torch


class ValuePack:
    def __init__(self, meta, npu_meta=None) -> None:
        self._meta = meta
        self._npu_meta = meta if npu_meta is None else npu_meta

    @property
    def meta(self):
        return self._meta

    @property
    def npu(self):
        return self._npu_meta

    def __getitem__(self, key):
        if isinstance(self._meta, Mapping):
            return ValuePack(self._meta[key], self._npu_meta[key])
        raise ValueError(
            f"Unsupported meta type for ValuePack __getitem__, key:{key}, type: {type(self._meta)}"
        )


def _is_symlist(arg):
    if not isinstance(arg, (list, tuple)) or len(arg) == 0:
        return False
    has_symbol = False
    for v in arg:
        if isinstance(v, ValuePack):
            if not isinstance(v.meta, (int, torch.SymInt)):
                return False
            has_symbol = True
            continue
        if not isinstance(v, int):
            return False
    return has_symbol
