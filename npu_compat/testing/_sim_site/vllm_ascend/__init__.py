# Mirrors upstream signatures as they are (some unannotated); vLLM ships no stubs for mypy here.
# mypy: disable-error-code="no-untyped-def,no-untyped-call"
"""SIMULATED vllm_ascend (npu_compat.testing) -- not Huawei's vllm-ascend.

Mirrors ``vllm_ascend/__init__.py`` of vllm-ascend 0.23.0.post1 when the installed vLLM is
0.23 or newer, else of vllm-ascend 0.18.0 (see ``vllm_ascend._version``).  It exists only
on a simulated Ascend host (``NPU_COMPAT_SIMULATE=1``, ``_sim_site`` on ``sys.path``).

A vLLM plugin, as the real package: the simulated host has vllm-ascend's distribution of the
flavour in use (``npu_compat.testing._sites``) with the real wheel's entry points,
``vllm.platform_plugins: ascend = vllm_ascend:register`` and ``vllm.general_plugins``
(``register_connector``, ``register_model_loader``, ``register_service_profiling``, and in
0.23.0.post1 ``register_model``), so vLLM builds on the NPU platform and runs these functions in
each of its processes.  ``NPU_COMPAT_SIMULATE_VLLM_PLATFORM=0`` leaves the distribution out.
:func:`register` returns the platform's class path like the real one.

The general-plugin functions are no-ops where the real ones register KV connectors, model
loaders, profiling configs and models, or apply vllm-ascend's global patches to vLLM
(``vllm_ascend.patch.platform``, which among other things remaps the weight-transfer
factory's ``nccl``/``ipc`` names to the HCCL/NPU-IPC engines): none of that is simulated.
In the 0.23.0.post1 flavour :func:`register_connector` does what the real one does for
weight transfer: it calls ``vllm_ascend.distributed.weight_transfer.register_engine()``.
"""

from ._version import PAIRS_WITH_VLLM_0_23, __version__

SIMULATED = True


def register():
    """Register the NPU platform."""

    return "vllm_ascend.platform.NPUPlatform"


if PAIRS_WITH_VLLM_0_23:
    _GLOBAL_PATCH_APPLIED = False

    def _ensure_global_patch():
        """No-op: the real one applies ``vllm_ascend.patch.platform`` (not simulated) once."""
        global _GLOBAL_PATCH_APPLIED
        if _GLOBAL_PATCH_APPLIED:
            return
        _GLOBAL_PATCH_APPLIED = True

    def register_connector():
        """Registers the weight-transfer engines, as the real one does (KV connectors: not simulated)."""
        _ensure_global_patch()

        from .distributed.weight_transfer import register_engine

        register_engine()

    def register_model_loader():
        """No-op: the real one registers the netloader and rfork model loaders."""
        _ensure_global_patch()

    def register_service_profiling():
        """No-op: the real one writes a service-profiling config."""
        _ensure_global_patch()

    def register_model():
        """No-op: the real one registers vllm-ascend's model classes with vLLM."""

else:

    def register_connector():
        """No-op: the real one registers vllm-ascend's KV connectors."""

    def register_model_loader():
        """No-op: the real one registers the netloader and rfork model loaders."""

    def register_service_profiling():
        """No-op: the real one writes a service-profiling config."""


__all__ = [
    "SIMULATED",
    "__version__",
    "register",
    "register_connector",
    "register_model_loader",
    "register_service_profiling",
]
