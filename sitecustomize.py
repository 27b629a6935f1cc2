"""npu-compat's ``sitecustomize``, shipped at the top of the wheel: a stub for ``_npu_compat_precheck``.

Activates npu-compat and then runs the environment's own ``sitecustomize`` -- the next
one on ``sys.path`` -- exactly once.  Installed, ``npu_compat.pth`` has already loaded
``_npu_compat_precheck`` (beside this file) by the time this runs, so this stays small; a
``sitecustomize`` earlier on ``sys.path`` shadows this one, and the ``.pth`` covers that.
"""

import sys

_precheck = sys.modules.get("_npu_compat_precheck")
if _precheck is None:  # no .pth ran: a checkout on PYTHONPATH, or an editable install
    import os

    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, _here)  # this file's own directory, never a relative entry
    try:
        import _npu_compat_precheck as _precheck
    finally:
        if sys.path and sys.path[0] == _here:
            del sys.path[0]
_precheck.from_sitecustomize(__file__, "sitecustomize")  # type: ignore[union-attr]
