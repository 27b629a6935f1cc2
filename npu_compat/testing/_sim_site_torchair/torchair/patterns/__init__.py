"""SIMULATED torchair.patterns (npu_compat.testing)."""
