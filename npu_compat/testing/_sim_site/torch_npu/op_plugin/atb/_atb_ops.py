# Mirrors upstream code as it is (unannotated); torch_npu ships no stubs for mypy here.
# mypy: disable-error-code="no-untyped-def,no-untyped-call,misc"
"""SIMULATED torch_npu.op_plugin.atb._atb_ops (npu_compat.testing): the real module's, on a simulated library.

The real module loads ``lib/libop_plugin_atb.so`` (NNAL's ATB operators, registered as ``torch.ops.atb.*``),
binds every name of :data:`API_LIST` on ``torch_npu`` to a function that registers the extension on its
first call, and :func:`_register_atb_extensions` then rebinds them to the ``torch.ops.atb`` ops.  Here the
library is the simulation's: ``npu_compat.testing._npu_ops`` registers the ``atb`` ops it computes (as
real ``torch.library`` ops, with fake implementations); the other names of the list are the compute boundary.
"""

import sys
import types
from functools import lru_cache, wraps

import torch

import torch_npu  # type: ignore[import-not-found]

API_LIST = [
    "_npu_matmul_add_fp32",
    "_npu_quant_rms_norm",
    "_npu_group_topk",
    "_npu_paged_attention",
    "_npu_paged_attention_mla",
    "_npu_paged_attention_quant",
    "_npu_quantize_per_tensor",
    "_npu_reshape_and_cache",
    "_npu_reshape_and_cache_siso",
    "_npu_rotary_embedding",
    "_npu_flash_attention",
    "_npu_flash_attention_v3",
    "_npu_flash_attention_unpad",
    "_npu_flash_attention_unpad_v2",
    "_npu_paged_attention_splitfuse",
    "_npu_paged_attention_splitfuse_v2",
    "_npu_flash_attention_qlens",
    "_npu_paged_attention_get_workspace",
]

ATB_API_LIST = [
    "npu_paged_cache_load",
    "npu_multi_head_latent_attention",
    "_npu_multi_head_latent_attention_get_workspace",
    "_npu_paged_attention_v2",
    "_npu_paged_attention_v2_get_workspace",
    "_npu_flash_attention_v2",
    "_npu_flash_attention_prefix_v2",
    "npu_fused_add_topk_div",
    "npu_ring_mla",
    "npu_self_attention_prefix_encoder",
    "npu_mla_preprocess",
]

ATB_MODULE_NAME = "atb"
ATB_MODULE = types.ModuleType(ATB_MODULE_NAME)


def _add_atb_module():
    setattr(torch_npu, ATB_MODULE_NAME, ATB_MODULE)
    sys.modules[f"torch_npu.{ATB_MODULE_NAME}"] = ATB_MODULE


_add_atb_module()


def _atb_op(api_name):
    """``torch.ops.atb.<api_name>`` where the simulation computes it, else the compute boundary."""
    from npu_compat.testing import _npu_ops
    from npu_compat.testing._torch_sim import compute_boundary

    _npu_ops.register()
    if _npu_ops.has_atb(api_name):
        return getattr(torch.ops.atb, api_name)
    return compute_boundary(f"torch.ops.atb.{api_name}")


@lru_cache(None)
def _register_atb_extensions():
    _patch_atb_ops()


def lazy_load_atb_so(api_func):
    @wraps(api_func)
    def wrapper(*args, **kwargs):
        _register_atb_extensions()
        return api_func(*args, **kwargs)

    return wrapper


def create_lazy_atb_function(api_name):
    @lazy_load_atb_so
    def generated_function(*args, **kwargs):
        return _atb_op(api_name)(*args, **kwargs)

    generated_function.__name__ = api_name
    return generated_function


def generate_atb_lazy_function():
    for api_name in API_LIST + ATB_API_LIST:
        globals()[api_name] = create_lazy_atb_function(api_name)


generate_atb_lazy_function()


def _patch_atb_ops():
    for api_name in API_LIST:
        setattr(torch_npu, api_name, _atb_op(api_name))
    for api_name in ATB_API_LIST:
        setattr(ATB_MODULE, api_name, _atb_op(api_name))


def _patch_atb_and_loadso():
    for api_name in API_LIST:
        setattr(torch_npu, api_name, globals().get(api_name))
    for api_name in ATB_API_LIST:
        setattr(ATB_MODULE, api_name, globals().get(api_name))
