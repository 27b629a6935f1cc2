"""Ray on Ascend: the NPUs Ray shows a worker, in the ascending order CANN requires.

Ray shows an actor or task the NPUs it was given by setting ``ASCEND_RT_VISIBLE_DEVICES`` in the worker
(``NPUAcceleratorManager.set_current_process_visible_accelerator_ids``), joining the ids in the order Ray
assigned them: an actor of a placement-group bundle with two NPUs may get ``2,1``.  CANN's runtime refuses
ids that do not ascend (EE1001, "it must be configured in ascending order"), and torch_npu then counts no
device: the worker's first ``set_device`` fails, and ``torch.npu.is_available()`` is False.  CUDA takes
any order, which is why upstream code never sorts.  The ids are set in ascending numeric order, the order
vLLM's own Ray executor gives each node's devices; Ray's record of the ids (``get_accelerator_ids``) is
not changed.  Ids that are not plain numbers are passed through as given.
"""

from __future__ import annotations

from typing import Any


def visible_devices_ascending(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``set_current_process_visible_accelerator_ids(visible_npu_devices)``, the ids sorted by number."""
    if args:
        ids, rest = args[0], args[1:]
    elif "visible_npu_devices" in kwargs:
        kwargs = dict(kwargs)
        ids, rest = kwargs.pop("visible_npu_devices"), ()
    else:
        return wrapped(*args, **kwargs)
    try:
        ordered = sorted(ids, key=int)
    except (TypeError, ValueError):
        ordered = ids
    return wrapped(ordered, *rest, **kwargs)
