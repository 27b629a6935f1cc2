"""Where the simulated Ascend host's "installed" packages live, and which of them a process gets.

A simulated process has these directories first on ``sys.path`` (and its children on ``PYTHONPATH``):

* the released vllm-ascend that the installed vLLM pairs with -- 0.23.0.post1 from vLLM 0.23 on, 0.18.0
  before -- laid out in this environment (:mod:`._vllm_ascend_release`: its own ``vllm_ascend`` package and
  distribution, with the real wheel's entry points: ``vllm.platform_plugins: ascend``, so vLLM's platform
  detection finds the NPU platform, and its ``vllm.general_plugins``, which vLLM runs in every one of its
  processes);
* :data:`SIM_SITE` (``_sim_site``): the stand-ins for what the release needs below its Python --
  ``torch_npu`` (with its distribution, whose ``torch.backends`` entry point makes ``import torch`` load it,
  as the real wheel's does) and ``acl`` (CANN's pyACL);
* :data:`TORCHAIR_SITE` (``torchair``, which vllm-ascend 0.18.0 imports).

Without vLLM there is only :data:`SIM_SITE`: the real vllm-ascend cannot be imported without it either.

``importlib.metadata`` then sees ``torch_npu`` and ``vllm-ascend`` installed, each with its version.
``NPU_COMPAT_SIMULATE_VLLM_PLATFORM=0`` (``simulation_env(vllm_platform=False)``) leaves the
vllm-ascend distribution out: vLLM finds no platform plugin --
vLLM on the simulated host as on a host without vllm-ascend installed.

Decided from installed metadata and the environment only; nothing here imports vLLM or torch.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from pathlib import Path

from .. import _env
from ._vllm_ascend_release import RELEASES, is_laid_out, layout_dir, torch_defaults

#: The stand-ins' import packages and torch_npu's distribution.
SIM_SITE = Path(__file__).resolve().with_name("_sim_site")
#: ``torchair`` as far as the real vllm-ascend needs it, on the path of a process that runs that package only.
#: On a real host torch_npu itself installs ``torchair`` (it ships inside it) when torch is imported; here it
#: holds only the names vllm-ascend 0.18.0 reaches, so it is kept to the processes that run that package.
TORCHAIR_SITE = Path(__file__).resolve().with_name("_sim_site_torchair")
#: The vllm-ascend release that pairs with a vLLM older than 0.23, and from 0.23 on.
VLLM_ASCEND_BEFORE_0_23 = "0.18.0"
VLLM_ASCEND_FROM_0_23 = "0.23.0.post1"


def installed_vllm() -> str | None:
    """The installed vLLM's version (from its metadata), or None when vLLM is not installed."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def pairs_with_vllm_0_23(vllm_version: str) -> bool:
    match = re.match(r"(\d+)\.(\d+)", vllm_version)
    return (int(match.group(1)), int(match.group(2))) >= (0, 23) if match else False


def vllm_ascend_release(vllm_version: str) -> str:
    """The vllm-ascend release that pairs with ``vllm_version``."""
    return VLLM_ASCEND_FROM_0_23 if pairs_with_vllm_0_23(vllm_version) else VLLM_ASCEND_BEFORE_0_23


def vllm_platform_on(environ: Mapping[str, str]) -> bool:
    """False when ``NPU_COMPAT_SIMULATE_VLLM_PLATFORM`` is off in ``environ`` (``0``, ``false``, ``no``,
    ``off``: as every on/off variable of ours)."""
    return not _env.is_false(environ.get(_env.SIMULATE_VLLM_PLATFORM))


def paired_torch_defaults() -> dict[str, str]:
    """What a process that runs the real vllm-ascend sets by default so that vLLM behaves as with the torch
    that release pins (:func:`._vllm_ascend_release.torch_defaults`); empty without vLLM."""
    vllm = installed_vllm()
    return torch_defaults(vllm_ascend_release(vllm)) if vllm else {}


def sites(environ: Mapping[str, str]) -> list[Path]:
    """The directories a simulated process puts first on its path, in order.

    With vLLM, the laid-out vllm-ascend release comes first (its ``vllm_ascend`` and its distribution),
    then the simulation's site, whose ``torch_npu`` and ``acl`` stand in for what the release needs below
    its Python, then ``torchair`` (:data:`TORCHAIR_SITE`).  Raises :class:`RuntimeError` when that release
    is not laid out in this environment, saying how to lay it out."""
    vllm = installed_vllm() if vllm_platform_on(environ) else None
    if vllm is None:
        return [SIM_SITE]
    release = vllm_ascend_release(vllm)
    if not is_laid_out(release):
        raise RuntimeError(
            f"the simulated host runs the released vllm-ascend, and vllm-ascend {release} (the release vLLM "
            f"{vllm} pairs with) is not laid out in this environment ({layout_dir(release)}): run "
            "`python -m npu_compat.testing vllm-ascend` once"
        )
    return [layout_dir(release), SIM_SITE, TORCHAIR_SITE]


def all_sites() -> set[str]:
    """Every directory :func:`sites` can return, as strings: what a fresh choice replaces."""
    return {str(SIM_SITE), str(TORCHAIR_SITE), *(str(layout_dir(version)) for version in RELEASES)}
