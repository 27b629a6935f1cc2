"""Conditions shared by the patch sets."""

from __future__ import annotations

import importlib.util


def findable(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it (its parent packages are)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def no_native_npu() -> str | None:
    """Stand down once Trinity ships its own NPU support (``trinity.utils.device``, merged after 0.6.0)."""
    if findable("trinity.utils.device"):
        return "trinity-rft has native NPU support (trinity.utils.device exists); npu-compat stands down"
    return None
