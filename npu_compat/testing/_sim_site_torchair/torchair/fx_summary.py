"""SIMULATED torchair.fx_summary (npu_compat.testing): imported (and reloaded) by vllm-ascend 0.18.0; the
summary of an FX graph's operators that the real module writes is for GE compilation, not simulated."""

from .core._concrete_graph import ValuePack

__all__ = ["ValuePack"]
