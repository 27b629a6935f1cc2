"""SIMULATED ``torch_npu._inductor`` (npu_compat.testing) -- not Huawei's.

The real module registers Inductor's code generation for ``npu`` (Triton kernels compiled by
triton-ascend); vllm-ascend's worker imports it where Triton is found.  The simulated host registers
none: its Triton kernels run in Triton's interpreter, and Inductor has no ``npu`` backend here, so
``torch.compile`` with Inductor on ``npu`` tensors stops with Inductor's own error for an unknown device.
"""
