"""npu-compat: run unmodified Trinity-RFT on Ascend NPUs; do nothing anywhere else.

Public API::

    npu_compat.activate(device=None, *, strict=None) -> str   # "npu", "cuda", "cpu" or "off"
    npu_compat.deactivate()
    npu_compat.report()            # one record per patch, and .decision
    npu_compat.is_patched(obj)
    npu_compat.get_original(obj)

Importing this package, and activating it anywhere but on an Ascend host, imports
only its own start-up module (``_env``).  The engine (see :mod:`._activation`), wrapt and
packaging are loaded on the NPU path only, and upstream packages are patched when
(and only if) they are imported.
"""

import os
import sys

TYPE_CHECKING = False  # typing is not imported on the start-up path
if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._activation import deactivate, get_original, is_patched, report
    from ._errors import ConfigError, NpuCompatWarning, PatchError
    from ._report import Report as Report
    from ._spec import PatchSpec
    from ._version import __version__

__all__ = [
    "ConfigError",
    "NpuCompatWarning",
    "PatchError",
    "PatchSpec",
    "__version__",
    "activate",
    "deactivate",
    "get_original",
    "is_patched",
    "report",
]

_LAZY = {
    "deactivate": "_activation",
    "report": "_activation",
    "is_patched": "_activation",
    "get_original": "_activation",
    "Report": "_report",
    "ConfigError": "_errors",
    "NpuCompatWarning": "_errors",
    "PatchError": "_errors",
    "PatchSpec": "_spec",
    "__version__": "_version",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'npu_compat' has no attribute {name!r}")
    qualified = f"npu_compat.{module}"
    __import__(qualified)  # not importlib.import_module: importing importlib costs ~6% of a bare start
    return getattr(sys.modules[qualified], name)


def activate(
    device: "str | None" = None, *, strict: "bool | None" = None, specs: "Iterable[PatchSpec] | None" = None
) -> str:
    """Activate npu-compat in this process and return the device decided.

    Idempotent and thread-safe.  Only on ``"npu"`` is anything registered: post-import
    hooks for every patch target, and patches applied at once to targets already
    imported.  ``specs`` replaces the built-in catalogue (tests, extensions).
    Raises :class:`ConfigError` for an unknown device name.
    """
    from . import _env

    decision = None
    if "npu_compat._activation" not in sys.modules:
        decision = _env.decide(device)
        if not decision.is_npu:
            # The no-op path: record the decision for report() and load nothing else.
            _env.LAST = decision
            return decision.device
    from . import _activation

    try:
        return _activation.activate(device, strict=strict, specs=specs, decision=decision)
    finally:
        if os.environ.get(_env.REPORT_DIR):
            from . import _reportfile

            _reportfile.attach_active()  # the per-process report file: it listens from now on


# An activation at interpreter start that waits for the first import of a target package
# (see _npu_compat_precheck) is finished by importing the package too: report(), doctor and an
# explicit activate() then see the process as auto-activation left it.
_start = sys.modules.get("_npu_compat_precheck")
if _start is not None and getattr(_start, "PENDING", None) is not None:
    _start.complete(wait=False)  # a start under way in another thread is importing this package
del _start
