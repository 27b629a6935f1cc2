"""torch.distributed on Ascend: NCCL requests become HCCL, ``cuda`` devices become ``npu``.

torch_npu registers the ``hccl`` backend for device ``npu``; upstream code asks for
``nccl`` (or ``cpu:gloo,cuda:nccl``) and passes ``cuda:N`` device ids.  Only exact
tokens are rewritten -- ``nccl`` -> ``hccl`` and ``cuda`` -> ``npu`` as a whole backend
name, device type or ``device:backend`` pair -- never a substring, so an init method or
a path that happens to contain "cuda" or "nccl" passes through untouched.
"""

from __future__ import annotations

from typing import Any

_BACKENDS = {"nccl": "hccl"}
_DEVICES = {"cuda": "npu"}


def npu_backend(backend: Any) -> Any:
    """``nccl`` -> ``hccl``; ``cpu:gloo,cuda:nccl`` -> ``cpu:gloo,npu:hccl``; anything else unchanged."""
    if not isinstance(backend, str):
        return backend
    text = backend.strip()
    if text.lower() in _BACKENDS:
        return _BACKENDS[text.lower()]
    if ":" not in text:
        return backend
    pairs = []
    for pair in text.split(","):
        device, sep, name = pair.strip().partition(":")
        if not sep:
            return backend  # not a device:backend list
        pairs.append(f"{_DEVICES.get(device.lower(), device)}:{_BACKENDS.get(name.lower(), name)}")
    rewritten = ",".join(pairs)
    return rewritten if rewritten != ",".join(p.strip() for p in text.split(",")) else backend


def npu_device(device: Any) -> Any:
    """``cuda``/``cuda:N`` (string or ``torch.device``) -> the same on ``npu``; anything else unchanged."""
    if isinstance(device, str):
        kind, sep, index = device.strip().partition(":")
        if kind == "cuda" and (not sep or index.isdigit()):
            return "npu" + (f":{index}" if sep else "")
        return device
    if type(device).__name__ == "device" and getattr(device, "type", None) == "cuda":
        import torch

        return torch.device("npu", device.index) if device.index is not None else torch.device("npu")
    return device


def _rewrite(
    args: tuple[Any, ...], kwargs: dict[str, Any], name: str, position: int, fix: Any
) -> tuple[Any, ...]:
    if name in kwargs:
        kwargs[name] = fix(kwargs[name])
    elif len(args) > position:
        args = (*args[:position], fix(args[position]), *args[position + 1 :])
    return args


def init_process_group(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
    #                    store=None, group_name="", pg_options=None, device_id=None)
    args = _rewrite(args, kwargs, "backend", 0, npu_backend)
    args = _rewrite(args, kwargs, "device_id", 8, npu_device)
    return wrapped(*args, **kwargs)


def new_group(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # new_group(ranks=None, timeout=None, backend=None, pg_options=None,
    #           use_local_synchronization=False, group_desc=None, device_id=None)
    args = _rewrite(args, kwargs, "backend", 2, npu_backend)
    args = _rewrite(args, kwargs, "device_id", 6, npu_device)
    return wrapped(*args, **kwargs)


def device_type_first(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``init_device_mesh(device_type, ...)`` and ``DeviceMesh(device_type, ...)``: ``cuda`` -> ``npu``."""
    args = _rewrite(args, kwargs, "device_type", 0, npu_device)
    return wrapped(*args, **kwargs)
