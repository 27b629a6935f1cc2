# Mirrors upstream signatures as they are (some unannotated); vLLM ships no stubs for mypy here.
# mypy: disable-error-code="import-not-found,misc,no-any-return,no-untyped-def,type-arg,no-untyped-call"
# mypy: disable-error-code="untyped-decorator"
"""SIMULATED vllm_ascend.worker.worker (npu_compat.testing) -- not Huawei's vllm-ascend.

Mirrors ``NPUWorker`` of ``vllm_ascend/worker/worker.py`` in vllm-ascend 0.23.0.post1
(installed vLLM >= 0.23) or 0.18.0 (older vLLM): a subclass of vLLM's
``vllm.v1.worker.worker_base.WorkerBase`` (not of vLLM's GPU ``Worker``) with the real
constructor ``(vllm_config, local_rank, rank, distributed_init_method,
is_driver_worker=False, **kwargs)`` and the real release's methods, by name and signature
(0.18.0 lacks the weight-transfer methods, ``shutdown``, ``log_memory_stats`` and
``profile_prefill_latency``; its ``compile_or_warm_up_model`` returns a float).  Like the
real module it imports ``torch_npu`` first thing, so it imports only on an Ascend host --
here, a simulated one.

What runs (on the CPU): the constructor's bookkeeping (``WorkerBase.__init__``, cache
dtype, profiler config, sleep-mode buffers, weight-update state, the removal of
``UnquantizedLinearMethod`` from vLLM's ``WEIGHT_LOADER_V2_SUPPORTED``), the configuration
checks that raise before any NPU work (``VLLM_ASCEND_ENABLE_NZ`` / ``weight_nz_mode`` in
``wake_up`` and ``start_weight_update``, the profiler config in ``profile``), and in the
0.23.0.post1 flavour the whole weight-update state machine: ``load_model`` creates the
weight-transfer engine through vLLM's ``WeightTransferEngineFactory``, and
``init_weight_transfer_engine`` / ``start_weight_update`` / ``update_weights`` /
``finish_weight_update`` / ``shutdown`` run as in the real worker, with the worker's
``npu:N`` device mapped to the CPU.  Delegations to ``self.model_runner`` are kept.

``init_device`` sets the device, checks the (simulated) free memory, and forms the world and
model-parallel groups on the ``hccl`` backend (Gloo underneath) as the real one does, then
builds the stand-in ``NPUModelRunner`` (``model_runner_v1``), which generates for real: from
there ``load_model``, ``get_kv_cache_spec``, ``determine_available_memory`` (on ``torch.npu``'s
memory statistics), ``initialize_from_config``, ``compile_or_warm_up_model`` (an eager warm-up
whatever ``enforce_eager`` says: ACL graph capture is not simulated, and one log line says so),
``execute_model`` / ``sample_tokens``, ``execute_dummy_batch``, ``profile_prefill_latency``,
the weight updates (both formats, vLLM's layerwise reload for the checkpoint format) and
``sleep`` / ``wake_up`` (levels 1 and 2, the runner freeing and restoring its tensors instead of
vllm-ascend's CaMemAllocator) run on the CPU, or on ``npu`` tensors once they can be allocated.
What the runner does not simulate is listed in its module.

Where it stops (``SimulatedComputeBoundary``, "simulated Ascend: <method> needs a real NPU"):
``load_model`` before ``init_device`` (no model runner), ``_warm_up_atb`` (an ATB matmul), the
torch_npu profiler, static kernels, and the runner's own boundaries (LoRA at TP > 1, speculative
decoding, pipeline/data/context parallelism, ...).  Tensor parallelism computes: one worker per
rank, each with its shard (see ``model_runner_v1``).
Not simulated at all: ``adapt_patch()`` (vllm-ascend's patches to vLLM), custom-op and ATB
registration, the Ascend config and SoC checks, CPU binding, static-kernel signal handlers.
"""

import gc
import importlib
import logging
import os

import torch
import torch.nn as nn
import vllm.envs as envs_vllm
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
from vllm.distributed.kv_transfer import (
    get_kv_transfer_group,
    has_kv_transfer_group,
)
from vllm.distributed.parallel_state import get_pp_group, get_tp_group
from vllm.logger import logger
from vllm.lora.request import LoRARequest
from vllm.tasks import SupportedTask
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE, set_random_seed
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import (
    AsyncModelRunnerOutput,
    DraftTokenIds,
    ModelRunnerOutput,
)
from vllm.v1.worker.worker_base import WorkerBase

from npu_compat.testing._boundary import host_device, needs_npu
from npu_compat.testing._digest import LINE, WeightsDigest

from .. import envs as envs_ascend
from .._version import PAIRS_WITH_VLLM_0_23, VLLM_VERSION
from .model_runner_v1 import NPUModelRunner

# The real module imports torch_npu (and its ATB extensions and profiler) at the top.
torch_npu = importlib.import_module("torch_npu")

if PAIRS_WITH_VLLM_0_23:
    from vllm.distributed import get_pcp_group
    from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorHandshakeMetadata,
    )
    from vllm.v1.worker.worker_base import CompilationTimes


_NZ_MESSAGE = (
    "FRACTAL_NZ mode is enabled. This may cause model parameter precision issues "
    "in the RL scenarios. Please set {fix}."
)


class _Received:
    """Simulation only (``_digest``): what one weight update brought, for the digests logged after it.

    ``dtypes``: each name and the dtype it arrived in.  Where the model's parameters are not the full
    tensors as sent -- shards under tensor parallelism (``model.tensor_parallel``, set by
    ``_tensor_parallel.shard_model``), or another dtype (bf16 weights loaded from a float32 trainer) --
    also the digest of the full tensors as received (``full``) and of what this rank's parameters must
    hold once loaded (``expected``: its slice of each, ``shard_of``, in the parameter's dtype).
    """

    def __init__(self) -> None:
        self.dtypes: dict[str, torch.dtype] = {}
        self.full = WeightsDigest()
        self.expected = WeightsDigest()
        self.converted = False


def _noting(received: _Received, load_weights, model: nn.Module):
    """``load_weights`` that also notes what arrived (simulation only, :class:`_Received`)."""
    from npu_compat.testing._tensor_parallel import shard_of

    sharded = getattr(model, "tensor_parallel", None) is not None
    dtypes = {n: p.dtype for n, p in model.named_parameters(remove_duplicate=False)}
    dtypes.update((n, b.dtype) for n, b in model.named_buffers(remove_duplicate=False))

    def load(weights):
        weights = list(weights)
        for name, tensor in weights:
            received.dtypes[name] = tensor.dtype
            received.full.update(name, tensor)
            received.expected.update(name, shard_of(model, name, tensor).to(dtypes[name]))
            received.converted |= sharded or dtypes[name] != tensor.dtype
        return load_weights(weights)

    return load


def _log_weights_digest(model: nn.Module, received: _Received) -> None:
    """Simulation only: digest what the model holds now under the names just received (``_digest``).

    ``rollout loaded``: the parameters in the dtype they were sent in, which must equal the trainer's
    ``trainer sent`` where the model holds the tensors as sent.  Where it holds shards or another dtype
    (:class:`_Received`), three lines more per rank, ``rollout tp rank R/T ...``: the full tensors it
    ``received`` (= ``trainer sent``), the ``expected`` shards (its slice, in its dtype), and what it
    ``holds`` (= ``expected``).
    """
    if not received.dtypes:
        return
    params = dict(model.named_parameters(remove_duplicate=False))
    params.update(model.named_buffers(remove_duplicate=False))
    digest = WeightsDigest()
    for name, dtype in received.dtypes.items():
        digest.update(name, params[name].to(dtype))
    logger.info(LINE, "rollout loaded", digest.count, digest.hexdigest())
    if not received.converted:
        return
    holds = WeightsDigest()
    for name in received.dtypes:
        holds.update(name, params[name])
    rank = "rollout tp rank {}/{}".format(*(getattr(model, "tensor_parallel", None) or (0, 1)))
    logger.info(LINE, f"{rank} received", received.full.count, received.full.hexdigest())
    logger.info(LINE, f"{rank} expected", received.expected.count, received.expected.hexdigest())
    logger.info(LINE, f"{rank} holds", holds.count, holds.hexdigest())


def _weight_nz_mode(vllm_config: VllmConfig) -> object:
    """``AscendConfig.weight_nz_mode`` of 0.23.0.post1: ``additional_config`` first, then the env."""
    additional_config = getattr(vllm_config, "additional_config", None) or {}
    if "weight_nz_mode" in additional_config:
        return additional_config["weight_nz_mode"]
    return envs_ascend.VLLM_ASCEND_ENABLE_NZ


def _warm_up(worker: "NPUWorker") -> None:
    """``compile_or_warm_up_model``'s eager warm-up; without ``enforce_eager`` the model still runs eager.

    The real worker captures ACL graphs (and compiles) for the capture sizes; the simulation has
    neither, so it says so in one line and runs the model eagerly, as ``enforce_eager=True`` would --
    what a user's config asks for (Trinity's default ``enforce_eager: false``) runs unchanged.
    """
    if not worker.model_config.enforce_eager:
        logger.info(
            "simulated Ascend: ACL graph capture and torch.compile are not simulated; "
            "the model runs eager (enforce_eager=False asked for graphs of sizes %s)",
            worker.vllm_config.compilation_config.cudagraph_capture_sizes,
        )
    warmup_sizes = (worker.vllm_config.compilation_config.compile_sizes or []).copy()
    for size in sorted((s for s in warmup_sizes if isinstance(s, int)), reverse=True):
        logger.info("Compile and warming up model for size %d", size)
        worker.model_runner._dummy_run(size)
    # The real one then warms up an ATB matmul (_warm_up_atb) and may bind CPUs: not simulated.
    set_random_seed(worker.model_config.seed)


class NPUWorker(WorkerBase):
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
        # Additional parameters for compatibility with vllm
        **kwargs,
    ):
        """Initialize the worker for Ascend (simulated)."""
        if not envs_ascend.COMPILE_CUSTOM_KERNELS:
            logger.warning(
                "COMPILE_CUSTOM_KERNELS is set to False. "
                "In most scenarios, without custom kernels, vllm-ascend will not function correctly."
            )
        # Here the real one calls adapt_patch() (vllm_ascend.patch.worker), registers custom
        # ops and ATB extensions, and initialises the Ascend config and SoC version: not simulated.

        super().__init__(
            vllm_config=vllm_config,
            local_rank=local_rank,
            rank=rank,
            distributed_init_method=distributed_init_method,
            is_driver_worker=is_driver_worker,
        )

        if self.cache_config.cache_dtype == "auto":
            self.cache_dtype = self.model_config.dtype
        else:
            self.cache_dtype = STR_DTYPE_TO_TORCH_DTYPE[self.cache_config.cache_dtype]

        # Profiler is lazily initialized on first profile(is_start=True) call (vllm-project/vllm-ascend#6954)
        self.profiler_config = vllm_config.profiler_config
        self.profiler = None
        if PAIRS_WITH_VLLM_0_23:
            self.npugraph_memory_bytes = 0
        if vllm_config.model_config and vllm_config.model_config.enable_sleep_mode:
            # Buffers saved before sleep
            self._sleep_saved_buffers: dict[str, torch.Tensor] = {}

        if PAIRS_WITH_VLLM_0_23:
            # Weight transfer engine is created in `load_model` once the model
            # is available, since the engine needs a reference to the model.
            self.weight_transfer_engine = None
            self._weight_update_active = False
            self._is_checkpoint_format = True
            self._weights_received = _Received()  # simulation only (_digest)

        # As the real one (a fix for vLLM commit de94289): changes vLLM's weight loading in this process.
        from vllm.model_executor.layers.linear import (
            WEIGHT_LOADER_V2_SUPPORTED,
        )

        if "UnquantizedLinearMethod" in WEIGHT_LOADER_V2_SUPPORTED:
            WEIGHT_LOADER_V2_SUPPORTED.remove("UnquantizedLinearMethod")

        if PAIRS_WITH_VLLM_0_23:
            self.use_v2_model_runner = self.vllm_config.use_v2_model_runner
            if self.use_v2_model_runner and VLLM_VERSION == "0.23.0":
                logger.warning(
                    "VLLM_USE_V2_MODEL_RUNNER is not supported on vllm 0.23.0; "
                    "falling back to v1 model runner."
                )
                self.use_v2_model_runner = False
        else:
            self.use_v2_model_runner = envs_vllm.VLLM_USE_V2_MODEL_RUNNER
        self._pp_send_work: list[object] = []

    def uninstall_static_kernel(self):
        ascend_home_path = os.environ["ASCEND_HOME_PATH"]
        static_kernel_dir_path = os.path.join(ascend_home_path, "opp/static_kernel")
        uninstall_script_path = os.path.join(static_kernel_dir_path, "ai_core/uninstall.sh")
        if not os.path.exists(uninstall_script_path):
            return
        raise needs_npu("uninstall_static_kernel", "static kernels of an Ascend toolkit")

    def sleep(self, level: int = 1) -> None:
        # The real one frees through vllm-ascend's CaMemAllocator (tagged pools); the simulated
        # runner frees and restores its own tensors (see model_runner_v1).
        free_bytes_before_sleep = torch.npu.mem_get_info()[0]
        if level == 2:
            model = self.model_runner.model
            self._sleep_saved_buffers = {name: buffer.cpu().clone() for name, buffer in model.named_buffers()}
        self.model_runner._sleep(level)
        free_bytes_after_sleep, total = torch.npu.mem_get_info()
        freed_bytes = free_bytes_after_sleep - free_bytes_before_sleep
        used_bytes = total - free_bytes_after_sleep
        assert freed_bytes >= 0, "Memory usage increased after sleeping."
        logger.info(
            "Sleep mode (level=%s) freed %.2f GiB memory, %.2f GiB memory is still in use.",
            level,
            freed_bytes / (1 << 30),
            used_bytes / (1 << 30),
        )

    def wake_up(self, tags: list[str] | None = None) -> None:
        if PAIRS_WITH_VLLM_0_23:
            if _weight_nz_mode(self.vllm_config):
                raise ValueError(_NZ_MESSAGE.format(fix="weight_nz_mode=0 via --additional-config"))
        elif envs_ascend.VLLM_ASCEND_ENABLE_NZ:
            raise ValueError(_NZ_MESSAGE.format(fix="VLLM_ASCEND_ENABLE_NZ=0"))
        self.model_runner._wake_up(tags)
        model = self.model_runner.model
        # Restore the buffers after level 2 sleep
        saved = getattr(self, "_sleep_saved_buffers", {})
        if saved and (tags is None or "weights" in tags):
            for name, buffer in model.named_buffers():
                if name in saved:
                    buffer.data.copy_(saved[name].data)
            self._sleep_saved_buffers = {}

    if PAIRS_WITH_VLLM_0_23:

        def _check_weight_transfer_engine(self) -> None:
            if self.weight_transfer_engine is None:
                raise RuntimeError(
                    "Weight transfer not configured. "
                    "Please set weight_transfer_config to enable weight transfer."
                )

        def init_weight_transfer_engine(self, init_info: dict) -> None:
            """Initialize the HCCL weight transfer process group with the trainer."""
            self._check_weight_transfer_engine()
            assert self.weight_transfer_engine is not None
            typed_init_info = self.weight_transfer_engine.parse_init_info(init_info)
            self.weight_transfer_engine.init_transfer_engine(typed_init_info)

        def _check_nz_disabled(self) -> None:
            if envs_ascend.VLLM_ASCEND_ENABLE_NZ:
                raise ValueError(
                    "FRACTAL_NZ mode is enabled. This may cause model parameter "
                    "precision issues in the RL scenarios. Please set "
                    "VLLM_ASCEND_ENABLE_NZ=0."
                )

        def start_weight_update(self, is_checkpoint_format: bool = True) -> None:
            """Begin a new weight update; prepares the model for layerwise reload."""
            self._check_weight_transfer_engine()

            if self._weight_update_active:
                raise RuntimeError(
                    "start_weight_update called while a weight update is already active. "
                    "Call finish_weight_update first."
                )

            self._check_nz_disabled()

            if is_checkpoint_format:
                from vllm.model_executor.model_loader.reload import (
                    initialize_layerwise_reload,
                )

                model = self.model_runner.model
                with torch.device(host_device(self.device)):
                    initialize_layerwise_reload(model)

            self._is_checkpoint_format = is_checkpoint_format
            self._weight_update_active = True
            self._weights_received = _Received()

        def update_weights(self, update_info: dict) -> None:
            """Receive a chunk of weights from the trainer and load them in place."""
            self._check_weight_transfer_engine()
            assert self.weight_transfer_engine is not None

            typed_update_info = self.weight_transfer_engine.parse_update_info(update_info)
            model = self.model_runner.model
            received = self._weights_received  # simulation only: the names, digested after the update

            # state machine driven by start/finish.
            if not self._weight_update_active:
                raise RuntimeError("start_weight_update must be called before update_weights.")

            with torch.device(host_device(self.device)):
                if self._is_checkpoint_format:
                    self.weight_transfer_engine.receive_weights(
                        typed_update_info,
                        load_weights=_noting(received, model.load_weights, model),
                    )
                else:

                    def load_weights_direct(weights: list[tuple[str, torch.Tensor]]) -> None:
                        with torch.no_grad():
                            for name, weight in weights:
                                param = model.get_parameter(name)
                                param.copy_(weight)

                    self.weight_transfer_engine.receive_weights(
                        typed_update_info,
                        load_weights=_noting(received, load_weights_direct, model),
                    )

            # HCCL broadcast / packed paths are asynchronous.
            # Sync so the next step uses the new weights.
            torch.npu.synchronize()

        def finish_weight_update(self) -> None:
            """Finish the current weight update; runs layerwise postprocessing."""
            self._check_weight_transfer_engine()

            if not self._weight_update_active:
                raise RuntimeError("start_weight_update must be called before finish_weight_update.")

            if self._is_checkpoint_format:
                from vllm.model_executor.model_loader.reload import (
                    finalize_layerwise_reload,
                )

                model = self.model_runner.model
                with torch.device(host_device(self.device)):
                    finalize_layerwise_reload(model, self.model_config)

            self._weight_update_active = False
            self._is_checkpoint_format = True
            _log_weights_digest(self.model_runner.model, self._weights_received)
            self._weights_received = _Received()

        def shutdown(self) -> None:
            if ensure_kv_transfer_shutdown is not None:
                ensure_kv_transfer_shutdown()

            if self.profiler is not None:
                self.profiler.shutdown()

            if weight_transfer_engine := getattr(self, "weight_transfer_engine", None):
                weight_transfer_engine.shutdown()

            if model_runner := getattr(self, "model_runner", None):
                shutdown_fn = getattr(model_runner, "shutdown", None)
                if callable(shutdown_fn):
                    shutdown_fn()

    def initialize_cache(self, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        self.cache_config.num_gpu_blocks = num_gpu_blocks
        self.cache_config.num_cpu_blocks = num_cpu_blocks

    def _init_device(self):
        device = torch.device(f"npu:{self.local_rank}")
        torch.npu.set_device(device)
        gc.collect()
        torch.npu.empty_cache()
        # The real worker takes a MemorySnapshot here; the same check on the simulated device's numbers.
        free, total = torch.npu.mem_get_info()
        self.requested_memory = total * self.cache_config.gpu_memory_utilization
        if free < self.requested_memory:
            raise ValueError(
                f"Free memory on device ({free}/{total} bytes) on startup is less than desired GPU memory "
                f"utilization ({self.cache_config.gpu_memory_utilization}, {self.requested_memory} bytes)."
            )
        # Initialize the distributed environment.
        self._init_worker_distributed_environment()
        # Set random seed.
        set_random_seed(self.model_config.seed if self.model_config is not None else None)
        return device

    def _init_worker_distributed_environment(self) -> None:
        """The HCCL world and model-parallel groups, on the simulated ``hccl`` backend (Gloo underneath).

        Not simulated: ``init_batch_invariance``, ``init_ascend_model_parallel`` (vllm-ascend's own
        MC2/expert groups) and ``ensure_ec_transfer_initialized``.
        """
        init_distributed_environment(
            self.parallel_config.world_size, self.rank, self.distributed_init_method, self.local_rank, "hccl"
        )
        ensure_model_parallel_initialized(
            self.parallel_config.tensor_parallel_size,
            self.parallel_config.pipeline_parallel_size,
            self.parallel_config.prefill_context_parallel_size,
            self.parallel_config.decode_context_parallel_size,
        )

    def init_device(self):
        self.device = self._init_device()
        # The real one also initialises vLLM's workspace manager on the NPU: not simulated.
        self.init_free_memory, self.init_total_memory = torch.npu.mem_get_info()
        self.model_runner = NPUModelRunner(self.vllm_config, self.device)

    @torch.inference_mode()
    def determine_available_memory(self) -> int:
        """The real one's budget on the simulated device's numbers (``torch.npu`` memory statistics).

        ``gpu_memory_utilization`` of the device's total, less the weights and the peak that a
        profiling forward pass adds, as vllm-ascend computes it.  The runner allocates a KV cache
        of that size on the device; the simulated device counts it in full but backs only the
        pages that are touched with host memory (large npu allocations are lazy mappings), so a
        cache of 90 % of a 64 GiB device costs the host next to nothing.
        """
        if kv_cache_memory_bytes := self.cache_config.kv_cache_memory_bytes:
            self.model_runner.profile_run()
            return kv_cache_memory_bytes
        torch.npu.reset_peak_memory_stats()
        before = torch.npu.memory_allocated()
        self.model_runner.profile_run()
        peak_increase = max(0, torch.npu.max_memory_allocated() - before)
        non_kv_cache_memory = self.model_runner.model_memory_usage + peak_increase
        available = int(self.requested_memory - non_kv_cache_memory)
        self.available_kv_cache_memory_bytes = available
        logger.info("Available KV cache memory: %.4f GiB (simulated Ascend)", available / (1 << 30))
        return available

    if PAIRS_WITH_VLLM_0_23:

        def log_memory_stats(self) -> None:
            """Profiles the torch reserved memory, torch allocated memory in execute_model()."""
            if not logger.isEnabledFor(logging.DEBUG):
                return
            self.torch_reserved = torch.npu.memory_reserved()
            self.torch_allocated = torch.npu.memory_allocated()
            logger.debug(
                "torch reserved memory: %.2f GiB, torch allocated memory: %.2f GiB",
                self.torch_reserved / (1 << 30),
                self.torch_allocated / (1 << 30),
            )

    def execute_model(
        self,
        scheduler_output: "SchedulerOutput",
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        if PAIRS_WITH_VLLM_0_23:
            self.log_memory_stats()
        # One rank only (the runner refuses pipeline parallelism): no intermediate tensors.
        return self.model_runner.execute_model(scheduler_output, None)

    @torch.inference_mode()
    def sample_tokens(self, grammar_output: "GrammarOutput") -> ModelRunnerOutput | AsyncModelRunnerOutput:
        return self.model_runner.sample_tokens(grammar_output)

    def load_model(self) -> None:
        if getattr(self, "model_runner", None) is None:
            raise needs_npu("load_model", "the NPUModelRunner that loads the weights comes from init_device")

        # The real one loads inside CaMemAllocator's "weights" pool in sleep mode: not simulated
        # (the simulated runner frees and restores its own tensors).
        from contextlib import nullcontext

        with nullcontext(), set_current_vllm_config(self.vllm_config):
            self.model_runner.load_model()

        if PAIRS_WITH_VLLM_0_23 and self.vllm_config.weight_transfer_config is not None:
            from vllm.distributed.weight_transfer.factory import (
                WeightTransferEngineFactory,
            )

            # main: create_engine takes (config, parallel_config, model)
            self.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
                self.vllm_config.weight_transfer_config,
                self.vllm_config.parallel_config,
                self.model_runner.get_model(),
            )

    if PAIRS_WITH_VLLM_0_23:

        def compile_or_warm_up_model(self) -> CompilationTimes:
            _warm_up(self)
            return CompilationTimes(
                language_model=self.vllm_config.compilation_config.compilation_time,
                encoder=getattr(self.vllm_config.compilation_config, "encoder_compilation_time", 0.0),
            )

    else:

        def compile_or_warm_up_model(self) -> float:
            _warm_up(self)
            return self.vllm_config.compilation_config.compilation_time

    def _warm_up_atb(self):
        raise needs_npu("_warm_up_atb", "an ATB matmul")

    def get_model(self) -> nn.Module:
        return self.model_runner.get_model()

    if PAIRS_WITH_VLLM_0_23:

        @torch.inference_mode()
        def profile_prefill_latency(self, num_tokens: int) -> float:
            import time

            num_tokens = max(min(num_tokens, self.scheduler_config.max_num_batched_tokens), 1)
            torch.npu.synchronize()
            start = time.perf_counter()
            self.model_runner._dummy_run(num_tokens=num_tokens, force_attention=True, profile_cpp=True)
            torch.npu.synchronize()
            return (time.perf_counter() - start) * 1000

        def get_kv_connector_handshake_metadata(
            self,
        ) -> dict[tuple[int, ...], KVConnectorHandshakeMetadata] | None:
            """Get KV connector metadata from this worker if available."""
            if not has_kv_transfer_group():
                return None

            connector = get_kv_transfer_group()

            # Return None for connectors that don't need to exchange handshake
            # metadata across workers.
            if (metadata := connector.get_handshake_metadata()) is None:
                return None
            tp_rank = get_tp_group().rank_in_group
            pp_rank = get_pp_group().rank_in_group
            pcp_size = get_pcp_group().world_size
            if pcp_size > 1:
                pcp_rank = get_pcp_group().rank_in_group
                return {(pp_rank, pcp_rank, tp_rank): metadata}
            return {(pp_rank, tp_rank): metadata}

    else:

        def get_kv_connector_handshake_metadata(self) -> dict | None:
            """Get KV connector metadata from this worker if available."""
            if not has_kv_transfer_group():
                return None

            connector = get_kv_transfer_group()

            # Return None for connectors that don't need to exchange handshake
            # metadata across workers.
            if (metadata := connector.get_handshake_metadata()) is None:
                return None
            return {self.rank: metadata}

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return self.model_runner.get_kv_cache_spec()

    def update_max_model_len(self, max_model_len: int) -> None:
        """Update max_model_len after auto-fit to NPU memory."""
        self.model_config.max_model_len = max_model_len
        if self.model_runner is not None:
            self.model_runner.update_max_model_len(max_model_len)
        logger.debug("Updated max_model_len to %s", max_model_len)

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate the (simulated) NPU KV cache with the specified kv_cache_config."""
        from vllm.distributed.kv_transfer import ensure_kv_transfer_initialized

        ensure_kv_transfer_initialized(self.vllm_config, kv_cache_config)
        self.model_runner.initialize_kv_cache(kv_cache_config)

    def profile(self, is_start: bool = True, profile_prefix: str | None = None):
        # Check if profiling is enabled (RFC vllm-project/vllm-ascend#6954 - align with upstream vLLM)
        if self.profiler_config is None or self.profiler_config.profiler is None:
            raise RuntimeError(
                "Profiling is not enabled. Please set --profiler-config to enable "
                "profiling. Example: "
                "'--profiler-config.profiler=torch --profiler-config.torch_profiler_dir"
                "=YOUR_DIR_PATH_TO_DUMP_TRACE'"
            )
        if not is_start and self.profiler is None:
            logger.warning("Profiler was not started, nothing to stop.")
            return
        raise needs_npu("profile", "the torch_npu profiler")

    def add_lora(self, lora_request: LoRARequest) -> bool:
        return self.model_runner.add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self.model_runner.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        return self.model_runner.list_loras()

    def pin_lora(self, lora_id: int) -> bool:
        return self.model_runner.pin_lora(lora_id)

    def reset_encoder_cache(self) -> None:
        self.model_runner.reset_encoder_cache()

    def execute_dummy_batch(self) -> None:
        self.model_runner._dummy_run(num_tokens=self.model_runner.decode_token_per_req, uniform_decode=True)

    if not PAIRS_WITH_VLLM_0_23:

        def _create_profiler(self, trace_name: str):
            raise needs_npu("_create_profiler", "the torch_npu profiler")

    def get_supported_pooling_tasks(self):
        return self.model_runner.get_supported_pooling_tasks()

    def get_supported_tasks(self) -> "tuple[SupportedTask, ...]":
        return self.model_runner.get_supported_tasks()

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        return self.model_runner.take_draft_token_ids()

    def check_health(self) -> None:
        import subprocess

        logger.debug("check_health starting for rank %s...", self.local_rank)
        try:
            result = subprocess.run(
                ["npu-smi", "info", "-i", str(self.local_rank), "-t", "health"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            if result.returncode == 0:
                parse_text_output(result.stdout)
                logger.debug("check_health success for rank %s.", self.local_rank)
            else:
                logger.warning("query NPU card %s fail: %s", self.local_rank, result.stderr)
        except subprocess.TimeoutExpired:
            logger.warning("query NPU card %s timeout.", self.local_rank)
        except FileNotFoundError:
            logger.warning("npu-smi tool not found.")
        except Exception as e:  # noqa: BLE001  (as the real one: a health probe never raises)
            logger.error("query NPU card %s fail: %s", self.local_rank, e)
        return


def parse_text_output(output) -> None:
    lines = output.strip().split("\n")
    for line in lines:
        line = line.strip()
        if "Health" in line:
            if line.split(":")[-1].strip() != "OK":
                raise RuntimeError("NPU card health status is not OK")
    return


__all__ = ["NPUWorker", "parse_text_output"]
