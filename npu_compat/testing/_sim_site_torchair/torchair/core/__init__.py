"""SIMULATED torchair.core (npu_compat.testing)."""

from . import _concrete_graph

__all__ = ["_concrete_graph"]
