"""Developer and benchmark tools: not the product, not a diagnosis.

* :mod:`.timeline` -- a run's timeline, one row per process, from its per-process reports;
* :mod:`.floor` -- a run's start-up against its floor, the same processes replayed as imports alone;
* :mod:`.catalogdoc` -- the patch reference page, ``docs/patches.md``, rendered from the catalogue
  (``python -m npu_compat.tools.catalogdoc > docs/patches.md``).

``doctor --timeline`` and ``doctor --floor`` and ``bench/run_startup.py`` use the first two.  Nothing in
the product imports this package, and it imports nothing of its own here.
"""
