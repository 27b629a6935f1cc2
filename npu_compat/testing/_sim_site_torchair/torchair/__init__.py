# Mirrors upstream code as it is (unannotated); torch_npu ships no stubs for mypy here.
# mypy: disable-error-code="no-untyped-def,no-untyped-call,misc"
"""SIMULATED torchair (npu_compat.testing): the names vllm-ascend imports; GE compilation is the boundary.

The real torchair ships inside torch_npu (``torch_npu/dynamo/torchair``, importable as ``torchair``): a
torch.compile backend that lowers FX graphs to CANN's graph engine (GE), through compiled modules
(``core/_torchair.so``, ``_npu_graph_executor.so``) that cannot load here.  vllm-ascend 0.18.0 imports it at
module level and patches ``core._concrete_graph.ValuePack``, ``npu_fx_compiler`` and ``fx_summary``
(``patch/worker/patch_npugraph_ex_triton.py``), and its fusion passes register their patterns with
:func:`register_replacement` (``patterns/pattern_pass_manager.py``, torch_npu 2.13.0's as it is); those
modules' Python that it touches is torch_npu 2.13.0's.  Compiling a graph for the device
(:func:`get_npu_backend`) is the compute boundary.  It is on the path of a simulated process that runs the
real vllm-ascend only (``npu_compat.testing._sites``).
"""

from npu_compat.testing._boundary import needs_npu

from . import core, fx_summary, npu_fx_compiler
from .patterns.pattern_pass_manager import register_replacement

_WHY = (
    "torchair compiles for CANN's graph engine, and its npugraph_ex mode captures ACL graphs through "
    "compiled modules: run the engine with enforce_eager"
)


class _Options:
    """A group of torchair options (``debug``, ``experimental_config``, ``aclgraph`` ...): it takes whatever
    the caller sets, and only :func:`get_npu_backend` would read them."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        group = _Options()
        setattr(self, name, group)
        return group


class CompilerConfig(_Options):
    """``torchair.CompilerConfig``: options the caller sets before :func:`get_npu_backend` (vllm-ascend's
    npugraph_ex sets ``mode``, ``debug.run_eagerly``, ``debug.aclgraph.*`` and
    ``experimental_config.aclgraph.*``)."""

    def __init__(self) -> None:
        self.mode = "max-autotune"


def get_npu_backend(*, compiler_config=None):
    raise needs_npu("torchair.get_npu_backend", _WHY)


__all__ = [
    "CompilerConfig",
    "core",
    "fx_summary",
    "get_npu_backend",
    "npu_fx_compiler",
    "register_replacement",
]
