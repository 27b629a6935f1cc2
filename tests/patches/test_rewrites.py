"""The exact-token rewrites behind the generic patches (pure functions: no upstream needed)."""

from __future__ import annotations

import pytest

from npu_compat.patches.ray_resources import npu_bundle, npu_options
from npu_compat.patches.torch_distributed import npu_backend, npu_device


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("nccl", "hccl"),
        ("NCCL", "hccl"),
        ("cpu:gloo,cuda:nccl", "cpu:gloo,npu:hccl"),
        ("cuda:nccl", "npu:hccl"),
        ("cpu:gloo, cuda:nccl", "cpu:gloo,npu:hccl"),
        # untouched: not an exact token
        ("hccl", "hccl"),
        ("gloo", "gloo"),
        ("cpu:gloo", "cpu:gloo"),
        ("nccl_experimental", "nccl_experimental"),
        ("tcp://cuda-node:29500", "tcp://cuda-node:29500"),
        ("file:///mnt/nccl/cuda/store", "file:///mnt/nccl/cuda/store"),
        (None, None),
    ],
)
def test_backend_tokens(given: str | None, expected: str | None) -> None:
    assert npu_backend(given) == expected


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("cuda", "npu"),
        ("cuda:3", "npu:3"),
        ("cpu", "cpu"),
        ("cuda:x", "cuda:x"),
        ("cudagraph", "cudagraph"),
        ("/data/cuda:1", "/data/cuda:1"),
        (2, 2),
    ],
)
def test_device_tokens(given: object, expected: object) -> None:
    assert npu_device(given) == expected


def test_bundles_and_options_keep_fractions_and_other_resources() -> None:
    assert npu_bundle({"GPU": 1, "CPU": 2}) == {"NPU": 1, "CPU": 2}
    assert npu_bundle({"GPU": 0.25, "NPU": 0.5}) == {"NPU": 0.75}
    assert npu_bundle({"CPU": 1}) == {"CPU": 1}
    options = {"num_gpus": 0.5, "resources": {"custom": 1}, "num_cpus": 1}
    npu_options(options)
    assert options == {"resources": {"custom": 1, "NPU": 0.5}, "num_cpus": 1}
    options = {"num_gpus": 0, "resources": {"GPU": 2}}
    npu_options(options)
    assert options == {"resources": {"NPU": 2}}
    untouched = {"num_cpus": 2}
    npu_options(untouched)
    assert untouched == {"num_cpus": 2}
