"""SIMULATED ``acl.rt`` (npu_compat.testing): the runtime calls vllm-ascend makes.

``memcpy(dst, dest_max, src, count, kind)`` returns an ACL error code (0 on success), as pyACL does.
Simulated device memory is host memory, so every kind of copy (host/device to host/device) is a host copy.
"""

from __future__ import annotations

import ctypes

#: ``aclrtMemcpyKind``
ACL_MEMCPY_HOST_TO_HOST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
#: ``ACL_ERROR_INVALID_PARAM``
ACL_ERROR_INVALID_PARAM = 100000
ACL_SUCCESS = 0


def memcpy(dst: int, dest_max: int, src: int, count: int, kind: int) -> int:
    """``aclrtMemcpy``: copy ``count`` bytes from ``src`` to ``dst`` (a buffer of ``dest_max`` bytes)."""
    if count > dest_max or kind not in (0, 1, 2, 3) or count < 0:
        return ACL_ERROR_INVALID_PARAM
    if count:
        ctypes.memmove(dst, src, count)
    return ACL_SUCCESS
