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

from .cli import diagnose, main

__all__ = ["diagnose", "main"]
