# Mirrors upstream code as it is (unannotated); torch_npu ships no stubs for mypy here.
# mypy: disable-error-code="no-untyped-def,no-untyped-call,misc"
"""SIMULATED torchair (npu_compat.testing): the names vllm-ascend imports, and npugraph_ex run eagerly.

The real torchair ships inside torch_npu (``torch_npu/dynamo/torchair``, importable as ``torchair``): a
torch.compile backend that lowers FX graphs to CANN's graph engine (GE), through compiled modules
(``core/_torchair.so``, ``_npu_graph_executor.so``) that cannot load here.  vllm-ascend 0.18.0 imports it at
module level and patches ``core._concrete_graph.ValuePack``, ``npu_fx_compiler`` and ``fx_summary``
(``patch/worker/patch_npugraph_ex_triton.py``), and its fusion passes register their patterns with
:func:`register_replacement` (``patterns/pattern_pass_manager.py``, torch_npu 2.13.0's as it is); those
modules' Python that it touches is torch_npu 2.13.0's.  It is on the path of a simulated process that runs the
real vllm-ascend only (``npu_compat.testing._sites``).

:func:`get_npu_backend` serves the one configuration vllm-ascend compiles with (``npugraph_ex_compile``:
mode ``reduce-overhead`` with ``debug.run_eagerly``), as torchair's ``_npu_backend`` does it: AOT autograd
functionalizes the graph (input mutations kept, torchair's own decompositions, which are collectives only),
and with ``run_eagerly`` the compiled graph is the FX graph itself, run eagerly on each call -- torchair
captures no ACL graph there (``npu_fx_compiler._gen_compiled_gm`` returns ``graph.fx_graph``); vLLM's
``ACLGraphWrapper`` around it does.  torchair's own graph optimisations (no-op and view rewrites, fused
patterns, the attention ops' ``.out`` forms with a workspace) compute the same and are not run.  Every other
mode compiles for CANN's graph engine or captures torchair's own ACL graphs: the compute boundary.
"""

from npu_compat.testing._boundary import needs_npu

from . import core, fx_summary, npu_fx_compiler
from .patterns.pattern_pass_manager import register_replacement

_WHY = (
    "torchair compiles for CANN's graph engine (max-autotune), and captures its own ACL graphs in "
    "reduce-overhead mode unless debug.run_eagerly is set (as vllm-ascend's npugraph_ex sets it): run the "
    "engine with enforce_eager"
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


def _option(group, name, default):
    """An option the caller set on ``group``, else ``default`` (an unset one reads as a new group)."""
    return vars(group).get(name, default)


def _npu_backend(gm, example_inputs):
    """torchair's ``_npu_backend`` for ``reduce-overhead`` with ``run_eagerly``: ``aot_module_simplified``
    with input mutations kept, each compiled graph run eagerly."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

    def run_eagerly(graph, inputs):
        return make_boxed_func(graph.forward)

    return aot_module_simplified(
        gm, example_inputs, fw_compiler=run_eagerly, inference_compiler=run_eagerly,
        decompositions={}, keep_inference_input_mutations=True,
    )  # fmt: skip


def get_npu_backend(*, compiler_config=None):
    config = compiler_config if compiler_config is not None else CompilerConfig()
    mode = _option(config, "mode", "max-autotune")
    if mode != "reduce-overhead" or not _option(config.debug, "run_eagerly", False):
        raise needs_npu(f"torchair.get_npu_backend (mode {mode!r})", _WHY)
    return _npu_backend  # the config holds nothing more that this mode reads


__all__ = [
    "CompilerConfig",
    "core",
    "fx_summary",
    "get_npu_backend",
    "npu_fx_compiler",
    "register_replacement",
]
