"""SIMULATED vllm_ascend.worker (npu_compat.testing).

Mirrors the package of vllm-ascend 0.23.0.post1 / 0.18.0.
"""
