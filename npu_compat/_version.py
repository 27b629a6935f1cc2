"""npu-compat's own version (``pyproject.toml`` gives the same; a test keeps them equal)."""

__version__ = "0.1.0"
