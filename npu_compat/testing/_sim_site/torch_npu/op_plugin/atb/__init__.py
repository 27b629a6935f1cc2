"""SIMULATED torch_npu.op_plugin.atb (npu_compat.testing)."""
