"""What patches change besides the attributes they replace: environment variables they set and
answers they keep, recorded so that ``deactivate()`` undoes them too.

A wrapper that must set a variable for the processes its call starts (vLLM's engine reads
``VLLM_ASCEND_ENABLE_NZ`` at start-up) calls :func:`setenv`; one that asks the cluster a
question once calls :func:`remember`.  :func:`undo` (from ``deactivate()``) puts every
variable back as it was before the first change, last first, and forgets every answer.  The
lock here is held only around dictionary updates; it is renewed in a forked child.
"""

import _thread
import os

#: name -> the value before npu-compat first set it (None: it was unset), in the order set
_saved: "dict[str, str | None]" = {}
_answers: "dict[str, object]" = {}
_lock = _thread.allocate_lock()


def setenv(name: str, value: str, *, keep: bool = False) -> str:
    """Set ``os.environ[name] = value`` (with ``keep``: only when unset, as ``setdefault``), remembering
    what it was; returns the value in force."""
    with _lock:
        before = os.environ.get(name)
        if keep and before is not None:
            return before
        _saved.setdefault(name, before)
        os.environ[name] = value
    return value


def remember(key: str, answer: object) -> object:
    """Keep ``answer`` under ``key`` until deactivation; returns it."""
    with _lock:
        _answers[key] = answer
    return answer


def recall(key: str, default: object = None) -> object:
    """The answer kept under ``key``, or ``default``."""
    return _answers.get(key, default)


def undo() -> None:
    """Every variable back to its value before npu-compat changed it (unset if it was), last first;
    every answer forgotten."""
    with _lock:
        for name, before in reversed(list(_saved.items())):
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before
        _saved.clear()
        _answers.clear()


def _forked() -> None:
    global _lock
    _lock = _thread.allocate_lock()  # another thread of the parent may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
