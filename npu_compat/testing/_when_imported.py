"""A post-import hook for one module of the simulated host, apart from npu-compat's patch list.

The simulated host hooks a few upstream modules of its own (triton-ascend's driver when ``triton`` is
imported, the weight-sync observer when vllm-ascend's HCCL engine is): :class:`WhenImported` runs a callback
once, at once if the module is imported already, else right after its first import, through
:func:`npu_compat._importhook.wrap_spec`.  Its finders are the host's, not npu-compat's: the engine's stress
harness tells them apart by this module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from .._importhook import wrap_spec


class WhenImported:
    """Runs ``fire(module)`` once: at :meth:`install` if module ``name`` is imported already, else right after
    its first import.  Then it leaves ``sys.meta_path``.  For one module a caller watches on its own,
    apart from the patch list (the simulation's hooks into triton and vllm-ascend)."""

    def __init__(self, name: str, fire: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.fire = fire

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        return wrap_spec(self, fullname, path, target, self._fired)

    def install(self) -> None:
        module = sys.modules.get(self.name)
        if module is not None:
            self._fired(module)
        elif self not in sys.meta_path:
            sys.meta_path = [self, *sys.meta_path]  # a new list: see _activation.PostImportFinder.install

    def _fired(self, module: ModuleType) -> None:
        if self in sys.meta_path:
            sys.meta_path = [f for f in sys.meta_path if f is not self]
        self.fire(module)
