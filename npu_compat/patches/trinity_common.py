"""Conditions shared by the Trinity-RFT patch sets."""

from __future__ import annotations

import importlib.util


def no_native_npu() -> str | None:
    """Stand down once Trinity ships its own NPU support (``trinity.utils.device``, merged after 0.6.0)."""
    try:
        native = importlib.util.find_spec("trinity.utils.device") is not None
    except (ImportError, ValueError):
        native = False
    if native:
        return "trinity-rft has native NPU support (trinity.utils.device exists); npu-compat stands down"
    return None
