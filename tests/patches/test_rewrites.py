"""The exact-token rewrites behind the generic patches (pure functions: no upstream needed)."""

from __future__ import annotations

import pytest

from npu_compat.patches.device_literals import cuda_literals, npu_literals
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


_SCALE = 3


def _moves(tensor: object, target: str = "cuda:1", *, note: str = "see cuda docs") -> tuple[object, ...]:
    """Stands for an upstream function that spells its devices as constants."""

    def post_iter(item: object) -> tuple[object, ...]:  # a nested function, as upstream's post_iter_func
        return (item, "cuda", "cuda_graph", _SCALE)

    return ("cuda", "cuda:0", "CUDA", "cuda-node", "/opt/cuda/lib", target, note, post_iter(tensor))


def test_device_literals_rewrites_exact_constants_only() -> None:
    assert sorted(cuda_literals(_moves)) == ["cuda", "cuda", "cuda:0"]  # defaults are not code
    rewritten = npu_literals(_moves)
    # the default "cuda:1" is an argument, not code: it stays as the caller would see it
    assert rewritten("t") == (
        "npu", "npu:0", "CUDA", "cuda-node", "/opt/cuda/lib", "cuda:1", "see cuda docs",
        ("t", "npu", "cuda_graph", 3),
    )  # fmt: skip
    assert rewritten("t", "npu:1", note="n")[5:7] == ("npu:1", "n")
    assert (rewritten.__name__, rewritten.__qualname__, rewritten.__doc__) == (
        _moves.__name__, _moves.__qualname__, _moves.__doc__,
    )  # fmt: skip
    assert rewritten.__globals__ is _moves.__globals__ and rewritten.__wrapped__ is _moves  # type: ignore[attr-defined]
    assert _moves("t")[0] == "cuda"  # the original is left as it was


def test_device_literals_refuses_what_it_cannot_rewrite() -> None:
    def no_device() -> str:
        return "cpu"

    with pytest.raises(ValueError, match="no longer holds"):
        npu_literals(no_device)
    with pytest.raises(TypeError, match="plain function"):
        npu_literals(len)


def test_the_backend_translation_passes_the_callers_timeout_and_options_through_unchanged() -> None:
    """HCCL honours the group's ``timeout`` (as ``HCCL_EXEC_TIMEOUT``): npu-compat may change the
    backend and the device, and nothing else -- the very objects the caller gave, positional or not."""
    from npu_compat.patches.torch_distributed import init_process_group, new_group

    timeout, options, store = object(), object(), object()
    seen: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def real(*args: object, **kwargs: object) -> str:
        seen.append((args, kwargs))
        return "group"

    given = ("nccl", "tcp://h:1", timeout, 2, 0, store, "g", options, "cuda:1")
    assert init_process_group(real, None, given, {}) == "group"
    args, kwargs = seen[-1]
    assert args[0] == "hccl" and args[8] == "npu:1" and kwargs == {}
    assert all(a is b for a, b in zip(args[1:8], given[1:8], strict=True))
    init_process_group(
        real, None, (), {"backend": "cpu:gloo,cuda:nccl", "timeout": timeout, "pg_options": options}
    )
    args, kwargs = seen[-1]
    assert args == () and kwargs["backend"] == "cpu:gloo,npu:hccl"
    assert kwargs["timeout"] is timeout and kwargs["pg_options"] is options
    new_group(real, None, ([0, 1], timeout, "nccl", options), {"device_id": "cuda:0"})
    args, kwargs = seen[-1]
    assert args[0] == [0, 1] and args[1] is timeout and args[2] == "hccl" and args[3] is options
    assert kwargs == {"device_id": "npu:0"}
