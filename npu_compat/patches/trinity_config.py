"""Trinity-RFT's trainer device on Ascend: verl builds its worker groups for ``npu``.

* ``Trainer.device`` (0.5.2 row B16; 0.6.0 legacy trainer row A28): the dataclass defaults
  to ``"cuda"``; verl's ``RayPPOTrainer`` takes it as its device name and asks Ray for
  ``{"CPU": n, "GPU": 1}`` STRICT_PACK bundles and ``num_gpus`` workers.  Trinity bypasses
  verl's own ``auto_set_device``.  The default becomes ``"npu"`` -- only the default: a
  ``trainer.device`` the user set in YAML reaches ``__init__`` as an argument and is kept.
  Both ``veRLConfig()`` and ``OmegaConf.structured(veRLConfig)`` build the nested
  ``Trainer`` through its ``__init__`` (``default_factory=Trainer``), so this is the seam.
* ``VERLTrainer`` (0.6.0 with verl >= 0.8, row A20): ``__init__`` hard-codes
  ``self.device_name = "cuda"`` ("we only support cuda for now") and then, still inside
  ``__init__``, calls ``_init_workers``, which hands it to verl's ``RayWorkerGroup``.  It becomes
  ``"npu"`` as ``_init_workers`` starts (found by the end-to-end run: after ``__init__`` was too late).
"""

from __future__ import annotations

import dataclasses
from typing import Any


def npu_default_device(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # wrapt binds the dataclass-generated __init__: ``instance`` is the new Trainer, and
    # ``args`` are the fields in declaration order.
    if "device" not in kwargs and instance is not None:
        names = [f.name for f in dataclasses.fields(type(instance)) if f.init]
        if "device" in names and len(args) <= names.index("device"):
            kwargs["device"] = "npu"
    return wrapped(*args, **kwargs)


def npu_device_name(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if getattr(instance, "device_name", None) == "cuda":
        instance.device_name = "npu"
    return wrapped(*args, **kwargs)
