"""The exception and warning types of npu-compat (one warning category for the package)."""

from __future__ import annotations


class NpuCompatWarning(UserWarning):
    """A patch was skipped or failed in a way the user should know about."""


class PatchError(RuntimeError):
    """A patch failed and strict mode (``NPU_COMPAT_STRICT=1`` / ``strict=True``) is on."""


class ConfigError(ValueError):
    """An ``NPU_COMPAT_*`` setting has a value npu-compat does not understand."""
