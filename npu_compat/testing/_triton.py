"""triton-ascend on the simulated Ascend host: its NPU driver, with what CANN would answer, and kernels
that run in Triton's interpreter.

A real Ascend host has triton-ascend installed (vllm-ascend pins it) and CANN's compiler ``bisheng`` on
``PATH``.  triton-ascend's ``NPUDriver`` is active where ``bisheng -print-targets`` names ``hiipu64``; its
first use compiles ``npu_utils.cpp`` against CANN's runtime, and every kernel is compiled by ``bisheng``
and launched through a compiled launcher.  On the simulated host:

* ``bisheng`` is the simulated toolkit's (``Ascend/compiler/ccec_compiler/bin``, put on ``PATH`` by
  :func:`._host.simulation_env`): it answers the probe and compiles nothing.  So the real
  ``NPUDriver.is_active`` and vLLM's ``HAS_TRITON`` decide as on the hardware.
* The active driver is the real ``NPUDriver`` of the installed triton-ascend, Python and all; only what
  ``npu_utils.cpp`` compiles to is simulated (:class:`SimulatedNpuUtils`): the SoC name and AI core count
  CANN's runtime reports for an Ascend 910B3 (``rtGetSocVersion``, ``rtGetAiCoreCount``).  triton-ascend's
  own ``NPUUtils`` derives the vector cores from them.  Loading a compiled kernel is the compute boundary.
* Kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, in the simulation's environment): each
  launch copies its tensors to the host, runs the kernel there with numpy, and copies them back -- on the
  simulated device, host memory to host memory.  The launch options of triton-ascend's compiler (its
  ``NPUOptions``: ``multibuffer`` and the like, which the compiled launcher takes and the interpreter does
  not know) are dropped at launch, as the interpreter drops CUDA's ``num_warps``.  Inside an ACL graph
  capture a launch is one task of the graph (:func:`._npu_graphs.launch`), rerun on replay.

:func:`install` arranges all of it in a process: at once if ``triton`` is imported, else when it is.  A
``triton`` without the Ascend backend (a CUDA build) is left alone.
"""

from __future__ import annotations

import dataclasses
import functools
from types import ModuleType
from typing import Any

from .. import _env
from ._boundary import needs_npu
from ._when_imported import WhenImported

#: What CANN's runtime reports on the simulated SoC, an Ascend 910B3 (``_env.SIMULATED_SOC``,
#: ``rtGetSocVersion``'s name): ``rtGetAiCoreCount``'s 20 AI cores (Project-HAMi/HAMi, ``charts/hami/
#: templates/scheduler/device-configmap.yaml``: chip 910B3, ``aiCore: 20``, 65536 MiB).  triton-ascend
#: 3.2.0's ``NPUUtils`` reports twice as many vector cores (``get_device_properties``).
AI_CORES = 20


class SimulatedNpuUtils:
    """What triton-ascend builds from ``npu_utils.cpp`` against CANN's runtime, answered as on the simulated
    host."""

    @staticmethod
    def get_arch() -> str:
        return _env.SIMULATED_SOC

    @staticmethod
    def get_aicore_num() -> int:
        return AI_CORES

    @staticmethod
    def load_kernel_binary(name: str, *args: object) -> Any:
        raise needs_npu(
            f"triton-ascend: loading the compiled kernel {name}", "kernels run in Triton's interpreter here"
        )

    @staticmethod
    def set_device_limit(device: int, kind: str, value: int) -> None:
        """A device limit for compiled kernels (stack sizes, low-power timeout): none run here."""


def install() -> None:
    """triton-ascend's driver and the interpreter's launch options, now or when ``triton`` is imported."""
    WhenImported("triton", _set_driver).install()


def _set_driver(triton: ModuleType) -> None:
    from triton.backends import backends  # type: ignore[import-not-found]

    ascend = backends.get("ascend")
    if ascend is None or ascend.driver is None:
        return  # not triton-ascend
    driver_class = ascend.driver
    if not driver_class.is_active():  # the real probe: the simulated toolkit's bisheng
        return
    from triton.runtime import driver, interpreter  # type: ignore[import-not-found]

    if isinstance(driver.active, driver_class):  # set already (the default is a lazy proxy, not a driver)
        return
    driver.set_active(_npu_driver(driver_class))
    npu_options = ascend.compiler.__init__.__globals__.get("NPUOptions")  # the backend's compiler module
    if dataclasses.is_dataclass(npu_options):
        reserved = interpreter.RESERVED_KWS
        reserved.extend(f.name for f in dataclasses.fields(npu_options) if f.name not in reserved)
    _launch_as_one_task(interpreter.GridExecutor)


def _launch_as_one_task(executor: Any) -> None:
    """An interpreted launch inside an ACL graph capture is one task of the graph, as a compiled kernel's
    launch is (``_npu_graphs.launch``): not the host copies the interpreter makes of its tensors."""
    interpreted = executor.__call__
    if getattr(interpreted, "_npu_graph_launch", False):
        return

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        from . import _npu_graphs  # torch is imported by now

        name = f"triton kernel {getattr(self.fn, '__name__', self.fn)}"
        return _npu_graphs.launch(functools.partial(interpreted, self), args, kwargs, name)

    __call__._npu_graph_launch = True  # type: ignore[attr-defined]
    executor.__call__ = __call__


def _npu_driver(driver_class: Any) -> Any:
    """An instance of triton-ascend's own ``NPUDriver``, its ``utils`` module :class:`SimulatedNpuUtils`."""
    utils_class = driver_class.__init__.__globals__["NPUUtils"]
    base = driver_class.__mro__[1]  # triton's DriverBase

    class SimulatedNPUUtils(utils_class):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:  # the real one compiles npu_utils.cpp here
            self.npu_utils_mod = SimulatedNpuUtils

    class SimulatedNPUDriver(driver_class):  # type: ignore[misc]
        def __init__(self) -> None:
            self.utils = SimulatedNPUUtils()
            self.launcher_cls = _no_launcher
            base.__init__(self)

    return SimulatedNPUDriver()


def _no_launcher(src: object, metadata: object) -> Any:
    raise needs_npu("triton-ascend: launching a compiled kernel", "kernels run in Triton's interpreter here")
