"""SIMULATED vllm_ascend._version (npu_compat.testing) -- not Huawei's vllm-ascend.

Mirrors ``vllm_ascend/_version.py`` of vllm-ascend 0.23.0.post1 and 0.18.0.  Which of the
two releases the stand-ins play is decided here, once, from the installed vLLM (read from
its metadata, without importing it): vLLM >= 0.23 pairs with vllm-ascend 0.23.0.post1,
anything older with 0.18.0 (the release that pairs with vLLM 0.18.0) -- by
``npu_compat.testing._sites``, which also puts that release's distribution on a simulated host.
"""

from __future__ import annotations

from npu_compat.testing._sites import VLLM_ASCEND_FROM_0_23, installed_vllm, pairs_with_vllm_0_23

_vllm = installed_vllm()
if _vllm is None:
    # The real package cannot be imported without vLLM either (vllm_ascend.logger imports it).
    raise ModuleNotFoundError(
        "simulated vllm_ascend needs vLLM installed: No module named 'vllm'", name="vllm"
    )

#: The installed vLLM's version, and whether the stand-ins play the 0.23.0.post1 release.
VLLM_VERSION: str = _vllm
PAIRS_WITH_VLLM_0_23 = pairs_with_vllm_0_23(VLLM_VERSION)

__version__: str
__version_tuple__: tuple[int | str, ...]
version: str
version_tuple: tuple[int | str, ...]

if PAIRS_WITH_VLLM_0_23:
    __version__ = version = VLLM_ASCEND_FROM_0_23
    __version_tuple__ = version_tuple = (0, 23, 0, "post1")
else:
    __version__ = version = "0.18.0"
    __version_tuple__ = version_tuple = (0, 18, 0)

#: The real file records the git commit of the release; the stand-ins are no commit of it.
__commit_id__: str | None = None
commit_id = __commit_id__

__all__ = [
    "__commit_id__",
    "__version__",
    "__version_tuple__",
    "commit_id",
    "version",
    "version_tuple",
]
