"""How many requests each released ``NPUModelRunner`` took, logged on the simulated host.

A whole run's tests check that every rollout engine, and every tensor-parallel rank of it, generated.  The
released vllm-ascend logs nothing of the kind, and its workers are not always shut down before a run ends
(vLLM 0.18's Ray executor kills them).  So in every simulated process this module counts the new requests of
each ``NPUModelRunner._update_states`` (the scheduler's ``scheduled_new_reqs``, what the runner adds to its
input batch) and logs ``simulated Ascend: NPUModelRunner on npu:N served K requests (tensor parallel rank R
of T)`` each time the count reaches a power of two: 1, 2, 4, ... -- a few lines per engine however long the
run, the last a lower bound of its total.  A reader takes the largest count per process and rank.  It reads,
and changes nothing the runner does; only on the simulated host.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ._weight_sync_digests import tensor_parallel
from ._when_imported import WhenImported

RUNNER = "vllm_ascend.worker.model_runner_v1"

#: one runner's count, on its device and tensor-parallel rank
LINE = "simulated Ascend: NPUModelRunner on %s served %d requests (tensor parallel rank %d of %d)"
#: vLLM's namespace: its handler prints INFO in every process that imported vLLM
logger = logging.getLogger("vllm.npu_compat.requests_served")


def install() -> None:
    """Count this process's runners' requests: now if the runner's module is imported, else when it is."""
    WhenImported(RUNNER, _observe).install()


def _observe(module: ModuleType) -> None:
    runner = module.NPUModelRunner
    update = runner._update_states
    if getattr(update, "_npu_compat_observed", False):
        return
    runner._update_states = _counted(update)


def _counted(update: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(update)
    def _update_states(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        new = len(getattr(scheduler_output, "scheduled_new_reqs", ()) or ())
        if new:
            before = getattr(self, "_npu_compat_requests_served", 0)
            served = before + new
            self._npu_compat_requests_served = served
            if served.bit_length() > before.bit_length():  # a power of two reached or passed
                rank, size = tensor_parallel()
                device = getattr(self, "device", "npu")
                logger.info(LINE, device, served, rank, size)
        return update(self, scheduler_output, *args, **kwargs)

    _update_states._npu_compat_observed = True  # type: ignore[attr-defined]
    return _update_states
