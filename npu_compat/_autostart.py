"""Activation that nobody called ``activate()`` for: at interpreter start, once the
pre-check (``_npu_compat_precheck``) found something to do, and from the seams other
programs call (:mod:`._seams`: Ray's worker setup hook, vLLM's plugin).

Makes the real device decision (``npu_compat.activate()`` with the environment's
settings), switches on the simulated Ascend first when ``NPU_COMPAT_SIMULATE`` asks
for it (a Ray worker or vLLM child whose ``PYTHONPATH`` was reset still sees it), and
starts the per-process report file when ``NPU_COMPAT_REPORT_DIR`` is set.  A bad
setting is one line on stderr, never a failed interpreter start.  A process is started
at most once, whichever way reaches it first (:data:`VIA`).
"""

import os
import sys

from . import _env

#: How this interpreter was activated: ``.pth``, ``sitecustomize``, ``launcher``,
#: ``ray-setup-hook``, ``vllm-plugin``; None when nothing activated it automatically.
VIA: "str | None" = None


def start(via: str) -> str:
    """Activate for ``via`` and return the device decided (``"error"`` for a bad setting)."""
    global VIA
    if VIA is not None:
        return _env.LAST.device if _env.LAST is not None else "error"
    VIA = via
    reports = bool(os.environ.get(_env.REPORT_DIR))
    if reports:
        from . import _reportfile

        _reportfile.set_activated_by(via)  # before activation writes the first report
    if _env.is_true(os.environ.get(_env.SIMULATE)):
        _simulate()
    import npu_compat

    try:
        device = npu_compat.activate()
    except Exception as exc:
        from ._errors import PatchError

        if isinstance(exc, PatchError):
            raise
        sys.stderr.write(f"npu_compat: {exc}; this process runs without npu-compat\n")
        return "error"
    if device not in ("off", "npu") and reports:
        _reportfile.attach()  # an npu activation has attached it already (npu_compat.activate())
    return device


def _simulate() -> None:
    from .testing._host import put_sites_first
    from .testing._sites import all_sites

    if all_sites().isdisjoint(sys.path):  # PYTHONPATH was reset; else simulation_env chose them already
        put_sites_first(os.environ)
