"""SIMULATED pyACL (npu_compat.testing): the ``acl`` module of CANN's toolkit, as far as vllm-ascend uses it.

The real ``acl`` is a compiled module shipped with the CANN toolkit (``python/site-packages``); on a
simulated host device memory is host memory, so :func:`acl.rt.memcpy` copies bytes on the host.
"""

from . import rt

__all__ = ["rt"]
