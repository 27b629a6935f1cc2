"""The weights digest that both sides of a simulated weight sync log.

A weight sync is proven by what each side holds, not by a number handed in: the trainer side
of vllm-ascend's HCCL engine digests every ``(name, tensor)`` it broadcasts, and the rollout
side digests the same names read back from its model *after* the update has been loaded
(:mod:`._weight_sync_digests` observes both).
Equal digests mean the rollout's model holds, byte for byte, what the trainer sent.  Both are
logged on one line of a fixed form (:data:`LINE`), which a test or a user's CI reads back from
the processes' logs.

The digest is of the *mapping* name -> tensor, not of the order the tensors came in: each pair
(name, dtype, shape, the tensor's bytes, contiguous on the host) is hashed on its own, and the digest is a
SHA-256 over those hashes sorted by name.  So any producer of the weights -- the HCCL sender, the
checkpoint the trainer saved (:func:`digest_of`), the synchronizer's state dict -- can be compared
with what the rollout holds.  A tensor is compared in the dtype that was sent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

#: ``simulated weight sync (<side>): <n> tensors, sha256 <16 hex digits>``
LINE = "simulated weight sync (%s): %d tensors, sha256 %s"


class WeightsDigest:
    """A SHA-256 over a set of ``(name, tensor)`` pairs, whatever order they are added in."""

    def __init__(self) -> None:
        self._pairs: dict[str, bytes] = {}

    @property
    def count(self) -> int:
        return len(self._pairs)

    def update(self, name: str, tensor: Any) -> None:
        import torch  # only where tensors are digested: the module imports without torch

        data = tensor.detach().reshape(-1).contiguous().cpu()
        pair = hashlib.sha256(name.encode())
        pair.update(f"{data.dtype}{tuple(tensor.shape)}".encode())
        pair.update(data.view(dtype=torch.uint8).numpy().tobytes())
        self._pairs[name] = pair.digest()

    def hexdigest(self) -> str:
        whole = hashlib.sha256()
        for name in sorted(self._pairs):
            whole.update(self._pairs[name])
        return whole.hexdigest()[:16]


def digest_pairs(pairs: Iterable[tuple[str, Any]]) -> WeightsDigest:
    """The :class:`WeightsDigest` of ``(name, tensor)`` pairs."""
    digest = WeightsDigest()
    for name, tensor in pairs:
        digest.update(name, tensor)
    return digest


def digest_of(pairs: Iterable[tuple[str, Any]]) -> str:
    """``"<n> tensors, sha256 <digest>"`` of ``(name, tensor)`` pairs: the form :data:`LINE` logs."""
    digest = digest_pairs(pairs)
    return f"{digest.count} tensors, sha256 {digest.hexdigest()}"
