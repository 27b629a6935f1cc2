# Mirrors upstream code as it is (unannotated); torch_npu ships no stubs for mypy here.
# mypy: disable-error-code="no-untyped-def,no-untyped-call,misc"
"""SIMULATED torchair.npu_fx_compiler (npu_compat.testing): the unpacking helpers vllm-ascend replaces, as
torch_npu 2.13.0's; the converter that builds a GE graph is never run on a simulated host."""

from torch.fx import Interpreter

from .core._concrete_graph import ValuePack


def _unpack_meta_list(args):
    return [(arg.meta if (isinstance(arg, ValuePack)) else arg) for arg in args]


def _unpack_meta(args, kwargs):
    def _get_meta_part(arg):
        if isinstance(arg, ValuePack):
            return _get_meta_part(arg.meta)
        if isinstance(arg, tuple):
            return tuple(_get_meta_part(value) for value in arg)
        if isinstance(arg, list):
            return [_get_meta_part(value) for value in arg]
        if isinstance(arg, dict):
            return {key: _get_meta_part(value) for key, value in arg.items()}
        return arg

    return [_get_meta_part(arg) for arg in args], {
        key: _get_meta_part(value) for key, value in kwargs.items()
    }


class _NpuGraphConverter(Interpreter):
    """Collects an FX graph's metadata for the GE graph (the real converter); unused on a simulated host."""

    def _unpack_npu(self, args, kwargs):
        return list(args), dict(kwargs)
