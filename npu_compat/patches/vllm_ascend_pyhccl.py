"""vllm-ascend's ``PyHcclCommunicator``: a communicator that could not load the HCCL library is an error.

Where ``ctypes`` cannot load ``libhccl.so`` (or ``HCCL_SO_PATH``), the real constructor (0.18.0 and
0.23.0.post1, ``pyhccl.py``) catches the error, sets ``disabled = True`` and returns; each ``broadcast`` then
returns at once.  Its one user on the rollout side is vllm-ascend's ``HCCLWeightTransferEngine``, Trinity's
``sync_method: nccl`` on Ascend: the trainer sends every weight and the rollout receives none, with no
error anywhere.  After the constructor, a communicator of more than one rank that disabled itself raises
:class:`HcclLibraryUnavailable`, naming the library, the loader's reason and the fix.
"""

from __future__ import annotations

from typing import Any

from .. import _hccl_library


class HcclLibraryUnavailable(RuntimeError):
    """vllm-ascend's HCCL communicator could not load the HCCL library, so it would move no data."""


def loud_when_disabled(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``PyHcclCommunicator.__init__``: the real constructor, then refuse a silently disabled communicator."""
    result = wrapped(*args, **kwargs)
    size = getattr(instance, "world_size", 1)
    if getattr(instance, "disabled", False) and size > 1:
        path = kwargs.get("library_path", args[2] if len(args) > 2 else None) or _hccl_library.library()
        problem = (
            _hccl_library.load_problem(path) or "it loads now, but did not when the communicator was built"
        )
        raise HcclLibraryUnavailable(
            f"vllm-ascend's PyHcclCommunicator (rank {getattr(instance, 'rank', '?')} of {size}) could not "
            f"load the HCCL library {path!r} ({problem}) and disabled itself: each of its broadcasts would "
            "do nothing, so a weight sync over it would leave the rollout on its old weights, silently. "
            f"Fix: {_hccl_library.how_to_fix()}. `python -m npu_compat doctor` checks it"
        )
    return result
