"""``python -m npu_compat doctor``: will npu-compat work here, and if not, why -- and ``python -m
npu_compat check``: which of its patches a release keeps, moves or breaks.  Diagnostics, not the
product: nothing of the product imports this package, and nothing here imports a patch target.

* :mod:`.checks` -- this environment: the device decision, automatic activation, the Ascend setup;
* :mod:`.ray_auth` -- Ray's token authentication rules;
* :mod:`.plan` -- each target distribution's version and each patch's plan, taken from the engine's
  own rules (:mod:`npu_compat._register`, :mod:`npu_compat._versions`);
* :mod:`.reports` -- a run's per-process reports (``--reports DIR``);
* :mod:`.findings`, :mod:`.render`, :mod:`.cli` -- what was found, its text, the command line;
* :mod:`.check` -- the catalogue against a release's files (``check``);
* :mod:`.source` -- the one reader of upstream source, never imported; :mod:`.upstream` -- what
  npu-compat knows of upstream besides its patches.

Every problem that would break a run is an ``error`` with the fix in its message, and makes the exit
status 1; ``warning`` and ``note`` lines never do.
"""

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .cli import diagnose, main

__all__ = ["diagnose", "main"]


def __getattr__(name: str) -> object:
    # diagnose and main are the command line's, loaded on first use: importing one part of the
    # package (``check``, ``source``) runs this file first, and must not load every other part
    if name not in __all__:
        raise AttributeError(f"module 'npu_compat.doctor' has no attribute {name!r}")
    __import__("npu_compat.doctor.cli")
    return getattr(sys.modules["npu_compat.doctor.cli"], name)
