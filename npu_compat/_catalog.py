"""Every built-in patch, as data (read by the engine, by ``report()`` and by ``doctor``).

Listing this catalogue imports no upstream module.  Patch sets for torch, Ray,
vLLM and Trinity-RFT are added here as they land.
"""

from ._spec import PatchSpec

SPECS: "tuple[PatchSpec, ...]" = ()
