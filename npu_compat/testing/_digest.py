"""The weights digest that both sides of a simulated weight sync log.

A weight sync is proven by what each side holds, not by a number handed in: the trainer side
of the simulated HCCL engine digests every ``(name, tensor)`` it broadcasts, in the order it
sends them, and the rollout side digests the same names read back from its model *after* the
update has been loaded.  Equal digests mean the rollout's model holds, byte for byte, what the
trainer sent.  Both are logged on one line of a fixed form (:data:`LINE`), which a test or a
user's CI reads back from the processes' logs.

The digest is a SHA-256 over each name and the tensor's bytes (contiguous, on the host), in
order; a tensor is compared in the dtype that was sent.
"""

from __future__ import annotations

import hashlib
from typing import Any

#: ``simulated weight sync (<side>): <n> tensors, sha256 <16 hex digits>``
LINE = "simulated weight sync (%s): %d tensors, sha256 %s"


class WeightsDigest:
    """A running SHA-256 over ``(name, tensor)`` pairs."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.count = 0

    def update(self, name: str, tensor: Any) -> None:
        import torch  # only where tensors are digested: the module imports without torch

        data = tensor.detach().reshape(-1).contiguous().cpu()
        self._hash.update(name.encode())
        self._hash.update(str(data.dtype).encode())
        self._hash.update(data.view(dtype=torch.uint8).numpy().tobytes())
        self.count += 1

    def hexdigest(self) -> str:
        return self._hash.hexdigest()[:16]
