"""SIMULATED vllm_ascend.distributed.device_communicators (npu_compat.testing): mirrors the package of
vllm-ascend 0.23.0.post1 / 0.18.0 (only ``pyhccl`` is simulated)."""
