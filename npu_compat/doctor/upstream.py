"""What npu-compat knows of upstream besides its patches, for the diagnostics alone (``doctor``'s plan,
:mod:`.plan`, and ``check``, :mod:`.check`; the product never reads it):

* :data:`VIEWS` -- the module globals a view patch redirects, and the one attribute it answers
  differently;
* :data:`SERVED_ELSEWHERE` -- versions of a distribution outside every range its patches support that
  need none of them;
* :data:`CONTRACTS` -- pairs of upstream releases that cannot run together on any device.

Plain data: nothing here imports an upstream module.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Replacements that swap a module global for a view of it, and the one attribute of that global
#: the view answers differently: a module that never names ``<global>.<attribute>`` is not changed.
VIEWS = {"npu_compat.patches.torch_view:torch_for_npu": "cuda"}


def view_attribute(replacement: str | None) -> str | None:
    """The attribute a patch with this ``replacement`` answers differently (:data:`VIEWS`), or None
    where the patch is no view."""
    return VIEWS.get(replacement or "")


@dataclass(frozen=True)
class ServedElsewhere:
    """Versions of a distribution outside every range its patches support that need none of them: the
    code those patches change is gone from these versions, and other patches serve what it did.

    Believed only when this environment confirms it: no module of ``gone`` is in the installed
    distribution's files, and every patch of ``served_by`` exists and supports the installed version
    of its own distribution."""

    distribution: str
    versions: str
    gone: tuple[str, ...]
    served_by: tuple[str, ...]
    how: str


#: What serves the versions that no patch's range covers, checked by a whole run on that stack.
SERVED_ELSEWHERE: tuple[ServedElsewhere, ...] = (
    ServedElsewhere(
        "verl",
        ">=0.8,<0.9",  # 0.8.0: stack a, whose whole `trinity run` finishes on the simulated Ascend
        gone=("verl.workers.actor.dp_actor",),
        served_by=("trinity.verl.config.torch_compile",),
        how="verl 0.8 has no DataParallelPPOActor (what verl.dp_actor.torch_compile patches): trinity-rft "
        "0.6 trains on it through its engine path (trinity.trainer.verl), whose FSDP engine compiles "
        "entropy_from_logits as the actor config's fsdp_config.use_torch_compile says, and "
        "trinity.verl.config.torch_compile turns that off",
    ),
)


@dataclass(frozen=True)
class Contract:
    """What one upstream release needs of another, on every device: not npu-compat's to patch, but a
    pair that cannot run together whatever the device.  ``target`` (``module:Class.member``) must be
    in ``distribution`` wherever ``needed_by`` is at ``needed_by_versions``; read with ast like a patch's
    target, so a new release is judged by its files, not by its version."""

    id: str
    target: str
    distribution: str
    needed_by: str
    needed_by_versions: str
    why: str
    fix: str


#: Upstream pairs found broken on every device (CPU too), each shown by a test on a stack.
CONTRACTS: tuple[Contract, ...] = (
    Contract(
        "trinity-rft.verl.checkpoint_config.mbridge_config",
        "verl.trainer.config.config:CheckpointConfig.mbridge_config",
        distribution="verl",
        needed_by="trinity-rft",
        needed_by_versions=">=0.6.0,<0.7",
        why="trinity-rft 0.6's verl config puts mbridge_config into every checkpoint config "
        "(trinity/trainer/verl/config.py:_build_checkpoint_config), and this verl's CheckpointConfig no "
        "longer accepts it (verl 0.9 moved it to Megatron's McoreCheckpointConfig): the trainer's workers "
        'fail with "TypeError: CheckpointConfig.__init__() got an unexpected keyword argument '
        "'mbridge_config'\" on any device, with or without npu-compat",
        fix="install verl 0.8.0 (what pip resolves for trinity-rft 0.6.0) or 0.7.1",
    ),
)
