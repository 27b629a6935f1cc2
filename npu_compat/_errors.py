"""The exception and warning types of npu-compat (one warning category for the package),
and :func:`warn`, the one way it warns."""


class NpuCompatWarning(UserWarning):
    """A patch was skipped or failed in a way the user should know about."""


class PatchError(RuntimeError):
    """A patch failed and strict mode (``NPU_COMPAT_STRICT=1`` / ``strict=True``) is on."""


class ConfigError(ValueError):
    """An ``NPU_COMPAT_*`` setting has a value npu-compat does not understand."""


def warn(message: str) -> None:
    """An :class:`NpuCompatWarning` attributed to the caller of npu-compat's caller."""
    import warnings  # not loaded at start-up in a plain venv

    warnings.warn(message, NpuCompatWarning, stacklevel=3)
