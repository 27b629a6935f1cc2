# Mirrors upstream signatures as they are (some unannotated); vLLM ships no stubs for mypy here.
# mypy: disable-error-code="import-not-found,misc,no-any-return,no-untyped-def,type-arg,no-untyped-call"
# mypy: disable-error-code="untyped-decorator"
"""SIMULATED vllm_ascend.worker.model_runner_v1 (npu_compat.testing) -- not Huawei's vllm-ascend.

``NPUModelRunner`` with the real constructor ``(vllm_config, device)`` and the methods that
vllm-ascend's ``NPUWorker`` and vLLM's engine core call on a model runner.  It generates for
real, with a model that transformers loads, instead of vLLM's model classes and the Ascend
attention kernels.

What it does:

* ``load_model`` loads ``model_config.model`` with ``AutoModelForCausalLM`` (any causal LM that
  transformers loads; ``trust_remote_code`` and ``dtype`` from the model config) and places it
  on :func:`placement_device` -- the worker's ``npu:N`` once ``npu`` tensors can be allocated,
  the host until then.  The model gets vLLM's ``load_weights`` protocol (an iterable of
  ``(name, tensor)`` with Hugging Face state-dict names, each copied through the parameter's
  ``weight_loader`` or vLLM's ``default_weight_loader``) and ``compute_logits``; its metadata
  is recorded for vLLM's layerwise reload, as vLLM's model loader does.
* ``get_kv_cache_spec``: one vLLM ``FullAttentionSpec`` per decoder layer, from the Hugging Face
  config (KV heads, head size, the KV-cache dtype, the cache block size).
* ``initialize_kv_cache`` allocates the KV-cache tensors the engine's ``KVCacheConfig`` asks
  for, on the placement device, so that the device's memory statistics count them -- the whole
  budget ``NPUWorker.determine_available_memory`` gives (``gpu_memory_utilization`` of the
  device, less the weights and the profile run's peak), as on a real Ascend.  The simulated
  device backs large allocations with host pages only where they are touched, and the model
  never reads or writes the cache (below), so it costs the host next to nothing.
* ``execute_model`` / ``sample_tokens`` on vLLM's ``SchedulerOutput``: requests are tracked
  across steps from ``scheduled_new_reqs``, ``scheduled_cached_reqs`` (resumed ones included)
  and ``finished_req_ids``, with the tokens each request has sampled kept here (as the GPU
  runner does, so async scheduling works).  Each scheduled request's sequence is recomputed
  in full -- prompt and output so far, up to what the step schedules -- in one forward pass
  without a KV cache.  Sampling is vLLM's own ``Sampler`` on a ``SamplingMetadata`` built for
  the step: temperature (0 = greedy), ``top_p``, ``top_k``, the penalties, a per-request
  ``torch.Generator`` for ``seed``, ``logprobs`` in the model config's ``logprobs_mode``; and
  ``min_tokens`` (stop tokens masked until then, as vLLM's built-in processor does).  Prompt
  logprobs go through ``_get_prompt_logprobs_dict(hidden_states, num_scheduled_tokens)`` with
  the GPU runner's inputs (``requests``, ``input_batch.req_id_to_index``, ``query_start_loc``,
  ``model.compute_logits``, ``sampler``), so a patch of that method (Trinity's) applies.
  ``n``, ``max_tokens`` and stop tokens/strings are the engine's: it fans ``n`` out into
  child requests and finishes requests; the runner samples one token per request and step.
  The output is vLLM's ``ModelRunnerOutput``.
* ``_sleep`` / ``_wake_up`` (what ``NPUWorker.sleep``/``wake_up`` call): level 1 copies the
  weights to host memory and frees them and the KV cache on the device; level 2 keeps no copy
  (the next weight update brings them, as with vLLM's sleep mode); ``wake_up`` re-allocates
  (and for level 1 restores) the weights and/or the KV cache by tag.

* Tensor parallelism: with ``tensor_parallel_size`` T > 1, each rank's worker loads the whole
  model and keeps its shard (``npu_compat.testing._tensor_parallel``: vLLM's column/row/vocab
  partitioning of the Llama family, each parameter with a ``weight_loader`` that takes its slice of
  a full tensor), and a forward pass sums and gathers over vLLM's TP group on the simulated
  ``hccl``.  Every rank samples from the same gathered logits.

* LoRA (``enable_lora``), at tensor parallel size 1 (``npu_compat.testing._lora``): ``add_lora`` reads a
  PEFT adapter directory (``adapter_config.json`` through vLLM's ``PEFTHelper``, so ``r`` is checked
  against ``max_lora_rank``; ``adapter_model.safetensors`` or ``.bin``), maps PEFT's
  ``base_model.model.<module>.lora_A/B.weight`` to the transformers model's ``nn.Linear`` modules and
  keeps it by ``lora_int_id`` in vLLM's LRU cache of ``max_cpu_loras``; ``remove_lora``, ``pin_lora``
  and ``list_loras`` as vLLM's worker answers them.  A step loads the adapters its requests name that
  are not loaded yet (from their ``lora_path``, as vLLM does; more distinct adapters than ``max_loras``
  in one step is vLLM's error), and each request's forward pass runs with its own adapter -- forward
  hooks adding ``scaling * B(A(x))`` to each adapted layer, on for that request only -- or the base
  model.  Each adapter as loaded is logged with its digest (``rollout lora <id> loaded``).  LoRA at
  TP > 1 and vLLM's ``target_modules`` restriction are boundaries; adapters stay on the device through
  sleep.

Not simulated: vLLM's model classes, attention backends and paged KV cache (the cache is
allocated but unused; every step recomputes the whole sequence, fine for tiny models, slow for
large ones); pipeline, data and context parallelism; CUDA/ACL graph capture and
``torch.compile`` (the model runs eager whatever ``enforce_eager`` says, and the worker says so in
one log line); speculative decoding, LoRA at TP > 1,
multimodal inputs, prompt embeddings, pooling models, structured output (grammar bitmasks),
``min_p``, ``logit_bias``, ``allowed_token_ids``, ``bad_words`` and custom logits processors,
KV connectors, quantisation.  Each of these raises ``SimulatedComputeBoundary`` naming it.
Logits come from the transformers model's forward (its own post-processing included), hidden
states from its last hidden layer; ``compute_logits`` applies the output embedding (and
``final_logit_softcapping`` where the config has one).
"""

import dataclasses
import gc
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from vllm.config import VllmConfig
from vllm.logger import logger
from vllm.sampling_params import SamplingParams, SamplingType
from vllm.sequence import IntermediateTensors
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import AsyncModelRunnerOutput, DraftTokenIds, LogprobsTensors, ModelRunnerOutput
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler

from npu_compat.testing._boundary import host_device, needs_npu
from npu_compat.testing._lora import LoraAdapters
from npu_compat.testing._tensor_parallel import shard_model


def placement_device(device: torch.device) -> torch.device:
    """The device the runner puts the model, its inputs and its KV cache on, for the worker's ``device``.

    ``device`` itself where a tensor can be allocated on it (real ``npu`` tensors, once the
    simulated device computes), else :func:`host_device` (the host).  The one place that choice
    is made.
    """
    try:
        torch.empty(1, device=device)
    except (RuntimeError, NotImplementedError):
        return host_device(device)
    return device


@dataclasses.dataclass
class CachedRequestState:
    """One request the runner tracks across steps (the fields of vLLM's GPU runner's state it uses)."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    generator: torch.Generator | None
    num_computed_tokens: int
    output_token_ids: list[int]
    in_progress_prompt_logprobs_cpu: LogprobsTensors | None = None
    lora_request: Any = None  # vLLM's LoRARequest, or None for the base model

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


@dataclasses.dataclass
class _StepBatch:
    """The requests of the running step, in row order (the GPU runner's ``input_batch`` names)."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    vocab_size: int


class _HostArray:
    """A numpy view with the GPU runner's ``CpuGpuBuffer.np`` name (``query_start_loc.np``)."""

    def __init__(self, values: list[int]) -> None:
        self.np = np.asarray(values, dtype=np.int64)


class _MinTokens:
    """vLLM's built-in ``min_tokens`` rule: stop tokens are masked until a request has that many outputs."""

    def __init__(self, rows: dict[int, list[int]]) -> None:
        self.rows = rows

    def is_argmax_invariant(self) -> bool:
        return False

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, token_ids in self.rows.items():
            logits[row, token_ids] = float("-inf")
        return logits


class VllmWeightsMixin:
    """What vLLM asks of a model beyond ``nn.Module``, on a transformers causal LM."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """vLLM's loading protocol: copy each ``(name, tensor)`` (state-dict names) into the model.

        Looks each name up at call time (vLLM's layerwise reload swaps the parameters), and copies
        through the parameter's ``weight_loader`` where vLLM put one, else ``default_weight_loader``.
        """
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        assert isinstance(self, nn.Module)
        params = dict(self.named_parameters(remove_duplicate=False))
        buffers = dict(self.named_buffers(remove_duplicate=False))
        loaded: set[str] = set()
        with torch.no_grad():
            for name, tensor in weights:
                if name in params:
                    param = params[name]
                    getattr(param, "weight_loader", default_weight_loader)(param, tensor)
                elif name in buffers:
                    buffers[name].copy_(tensor)
                else:
                    raise ValueError(f"load_weights: {type(self).__name__} has no parameter {name!r}")
                loaded.add(name)
        return loaded

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Logits of the last hidden states: the output embedding, as the model's forward applies it."""
        assert isinstance(self, nn.Module)
        logits = self.get_output_embeddings()(hidden_states)
        softcap = getattr(self.config, "final_logit_softcapping", None)
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return logits


_VLLM_CLASSES: dict[type, type] = {}


def _with_vllm_methods(model: nn.Module) -> nn.Module:
    """Give a loaded transformers model vLLM's model methods (a subclass; names stay the state dict's)."""
    cls = type(model)
    if cls not in _VLLM_CLASSES:
        _VLLM_CLASSES[cls] = type(cls.__name__, (VllmWeightsMixin, cls), {"__module__": cls.__module__})
    model.__class__ = _VLLM_CLASSES[cls]
    return model


class NPUModelRunner:
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.scheduler_config = vllm_config.scheduler_config
        self.parallel_config = vllm_config.parallel_config
        self.device = device
        self.placement = placement_device(device)
        self._refuse_unsimulated(vllm_config)
        self.dtype = self.model_config.dtype
        if self.cache_config.cache_dtype == "auto":
            self.kv_cache_dtype = self.dtype
        else:
            from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

            self.kv_cache_dtype = STR_DTYPE_TO_TORCH_DTYPE[self.cache_config.cache_dtype]
        self.max_model_len = self.model_config.max_model_len
        self.max_num_reqs = self.scheduler_config.max_num_seqs
        self.decode_token_per_req = 1
        self.model: Any = None  # the transformers model, with VllmWeightsMixin
        self.model_memory_usage = 0
        self.sampler = Sampler(logprobs_mode=self.model_config.logprobs_mode)
        self.requests: dict[str, CachedRequestState] = {}
        self.num_prompt_logprobs: dict[str, int] = {}
        self.input_batch = _StepBatch([], {}, self.model_config.get_vocab_size())
        self.query_start_loc = _HostArray([0])
        self.kv_cache_config: KVCacheConfig | None = None
        self.kv_caches: dict[str, torch.Tensor] = {}
        self.execute_model_state: tuple | None = None
        self._host_weights: dict[str, torch.Tensor] | None = None
        self._asleep: set[str] = set()
        self.requests_served = 0  # simulation only: new requests scheduled here, logged at shutdown
        self.loras = (  # the PEFT adapters (npu_compat.testing._lora), where vLLM's LoRA is on
            None
            if vllm_config.lora_config is None
            else LoraAdapters(vllm_config.lora_config, self.dtype, self.placement)
        )

    @staticmethod
    def _refuse_unsimulated(vllm_config: VllmConfig) -> None:
        parallel = vllm_config.parallel_config
        if parallel.pipeline_parallel_size > 1:
            raise needs_npu(
                "NPUModelRunner (pipeline parallel)", "the simulated runner runs tensor parallel only"
            )
        for name in ("data_parallel_size", "prefill_context_parallel_size", "decode_context_parallel_size"):
            if getattr(parallel, name, 1) > 1:
                raise needs_npu(
                    f"NPUModelRunner ({name} > 1)", "the simulated runner runs tensor parallel only"
                )
        if vllm_config.speculative_config is not None:
            raise needs_npu("NPUModelRunner (speculative decoding)", "not simulated")
        lora = vllm_config.lora_config
        if lora is not None and parallel.tensor_parallel_size > 1:
            raise needs_npu("NPUModelRunner (LoRA with tensor parallel)", "LoRA is simulated at TP 1 only")
        if lora is not None and getattr(lora, "target_modules", None):
            raise needs_npu("NPUModelRunner (LoRA target_modules restriction)", "not simulated")
        if vllm_config.model_config.runner_type == "pooling":
            raise needs_npu("NPUModelRunner (pooling models)", "not simulated")

    # -- the model --------------------------------------------------------------------------

    def load_model(self) -> None:
        from transformers import AutoModelForCausalLM
        from vllm.model_executor.model_loader.reload import record_metadata_for_reloading

        started = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(
            self.model_config.model,
            revision=self.model_config.revision,
            trust_remote_code=self.model_config.trust_remote_code,
            dtype=self.dtype,
        )
        model = _with_vllm_methods(model)
        tp_size = self.parallel_config.tensor_parallel_size
        if tp_size > 1:
            from vllm.distributed import get_tp_group

            shard_model(model, get_tp_group().rank_in_group, tp_size)
        model = model.to(self.placement).eval()
        model.requires_grad_(False)
        with torch.device(self.placement):
            record_metadata_for_reloading(model)
        self.model = model
        self.model_memory_usage = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        logger.info(
            "Model loading took %.4f GiB and %.2f s (simulated Ascend: transformers %s on %s%s)",
            self.model_memory_usage / (1 << 30),
            time.perf_counter() - started,
            type(model).__name__,
            self.placement,
            "" if tp_size == 1 else f", tensor parallel rank {model.tensor_parallel[0]} of {tp_size}",
        )

    def get_model(self) -> nn.Module:
        assert self.model is not None, "load_model() first"
        return self.model

    def update_max_model_len(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def get_supported_pooling_tasks(self) -> list[str]:
        return []

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        return None

    def reset_mm_cache(self) -> None:
        pass

    def reset_encoder_cache(self) -> None:
        pass

    def _lora_enabled(self) -> LoraAdapters:
        if self.loras is None:  # vLLM's GPU runner says the same
            raise RuntimeError("LoRA is not enabled. Use --enable-lora to enable LoRA.")
        return self.loras

    def add_lora(self, lora_request) -> bool:
        return self._lora_enabled().add(lora_request, self.model)

    def remove_lora(self, lora_id: int) -> bool:
        return self._lora_enabled().remove(lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        return self._lora_enabled().pin(lora_id)

    def list_loras(self) -> set[int]:
        return self._lora_enabled().ids()

    def shutdown(self) -> None:
        self.requests.clear()
        # simulation only: which engine (and rank) generated how much, for a run's logs
        logger.info(
            "simulated Ascend: NPUModelRunner on %s served %d requests (tensor parallel rank %d of %d)",
            self.placement,
            self.requests_served,
            *(getattr(self.model, "tensor_parallel", None) or (0, 1)),
        )

    # -- the KV cache -------------------------------------------------------------------------

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        config = self.model_config.hf_text_config
        num_heads = config.num_attention_heads
        head_size = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        # this rank's KV heads: split over the TP ranks, or one replicated head (vLLM's QKVParallelLinear)
        num_kv_heads = max(1, num_kv_heads // self.parallel_config.tensor_parallel_size)
        block_size = self.cache_config.block_size or 128  # vllm-ascend's default block size
        spec = FullAttentionSpec(
            block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size, dtype=self.kv_cache_dtype
        )
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(config.num_hidden_layers)}

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        self.kv_cache_config = kv_cache_config
        self._allocate_kv_cache()

    def may_reinitialize_input_batch(self, kv_cache_config: KVCacheConfig) -> None:
        """Nothing to do: the runner's per-step batch is rebuilt every step."""

    def _allocate_kv_cache(self) -> None:
        self.kv_caches = {}
        if self.kv_cache_config is None:
            return
        for tensor in self.kv_cache_config.kv_cache_tensors:
            buffer = torch.empty(tensor.size, dtype=torch.int8, device=self.placement)
            for name in tensor.shared_by:
                self.kv_caches[name] = buffer

    # -- execution ----------------------------------------------------------------------------

    def profile_run(self) -> None:
        self._dummy_run(min(self.max_model_len, 16))

    def _dummy_run(self, num_tokens: int = 1, **kwargs) -> None:
        assert self.model is not None
        ids = torch.zeros(1, max(1, num_tokens), dtype=torch.long, device=self.placement)
        with torch.inference_mode():
            self.model(input_ids=ids)

    def capture_model(self) -> int:
        """No ACL graphs are captured: 0 bytes (the model runs eager, see ``compile_or_warm_up_model``)."""
        return 0

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            self.num_prompt_logprobs.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            self._refuse_request(new)
            self.requests_served += 1
            params = new.sampling_params
            generator = None
            if params.sampling_type == SamplingType.RANDOM_SEED:
                generator = torch.Generator(device=self.placement)
                generator.manual_seed(params.seed)
            self.requests[new.req_id] = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=list(new.prompt_token_ids),
                sampling_params=params,
                generator=generator,
                num_computed_tokens=new.num_computed_tokens,
                output_token_ids=[],
                lora_request=new.lora_request,
            )
            if params.prompt_logprobs is not None:
                self.num_prompt_logprobs[new.req_id] = (
                    self.input_batch.vocab_size if params.prompt_logprobs == -1 else params.prompt_logprobs
                )
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            num_output_tokens = cached.num_output_tokens[i]
            if req_id in cached.resumed_req_ids and req_id in cached.all_token_ids:
                # resumed after preemption: the scheduler's view of the tokens is the reference
                state.output_token_ids = list(cached.all_token_ids[req_id][state.num_prompt_tokens :])
            elif num_output_tokens < len(state.output_token_ids):
                del state.output_token_ids[num_output_tokens:]

    @staticmethod
    def _refuse_request(new) -> None:
        if new.prompt_token_ids is None or new.prompt_embeds is not None:
            raise needs_npu("NPUModelRunner (prompt embeddings)", "not simulated")
        if new.mm_features:
            raise needs_npu("NPUModelRunner (multimodal inputs)", "not simulated")
        params = new.sampling_params
        if params is None:
            raise needs_npu("NPUModelRunner (pooling requests)", "not simulated")
        for name, unset in (("min_p", 0.0), ("logit_bias", None), ("allowed_token_ids", None)):
            if getattr(params, name, unset) not in (unset, {}, []):
                raise needs_npu(f"NPUModelRunner (sampling parameter {name})", "not simulated")
        if getattr(params, "bad_words_token_ids", None) or getattr(params, "structured_outputs", None):
            raise needs_npu("NPUModelRunner (bad_words / structured outputs)", "not simulated")
        if getattr(params, "logits_processors", None):
            raise needs_npu("NPUModelRunner (custom logits processors)", "not simulated")

    @torch.inference_mode()
    def execute_model(
        self,
        scheduler_output: "SchedulerOutput",
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> ModelRunnerOutput | IntermediateTensors | None:
        if self.execute_model_state is not None:
            raise RuntimeError(
                "State error: sample_tokens() must be called after execute_model() returns None."
            )
        if self._asleep:
            raise RuntimeError(f"execute_model while asleep ({sorted(self._asleep)} released)")
        self._update_states(scheduler_output)
        num_scheduled = scheduler_output.num_scheduled_tokens
        req_ids = [r for r in num_scheduled if num_scheduled[r] > 0]
        if not req_ids:
            return ModelRunnerOutput(req_ids=[], req_id_to_index={})
        if scheduler_output.scheduled_spec_decode_tokens:
            raise needs_npu("NPUModelRunner (speculative decoding)", "not simulated")
        assert self.model is not None
        loras = [self.requests[r].lora_request for r in req_ids]
        if any(loras):
            self._lora_enabled().activate(loras, self.model)  # loads a request's adapter on first use
        hidden, logits, starts, samples = [], [], [0], []
        for req_id in req_ids:
            state = self.requests[req_id]
            tokens = state.prompt_token_ids + state.output_token_ids
            end = min(state.num_computed_tokens + num_scheduled[req_id], len(tokens))
            ids = torch.tensor([tokens[:end]], dtype=torch.long, device=self.placement)
            if state.lora_request is None:
                out = self.model(input_ids=ids, output_hidden_states=True, use_cache=False)
            else:
                with self._lora_enabled().applied(state.lora_request, self.model):
                    out = self.model(input_ids=ids, output_hidden_states=True, use_cache=False)
            hidden.append(out.hidden_states[-1][0, state.num_computed_tokens : end])
            logits.append(out.logits[0, end - 1])
            starts.append(starts[-1] + end - state.num_computed_tokens)
            samples.append(end >= len(tokens))  # a partial prefill chunk samples nothing
        self.input_batch = _StepBatch(
            req_ids, {r: i for i, r in enumerate(req_ids)}, self.input_batch.vocab_size
        )
        self.query_start_loc = _HostArray(starts)
        self.execute_model_state = (scheduler_output, torch.stack(logits), torch.cat(hidden), samples)
        return None

    @torch.inference_mode()
    def sample_tokens(
        self, grammar_output: "GrammarOutput | None"
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | IntermediateTensors:
        if self.execute_model_state is None:
            return ModelRunnerOutput(req_ids=[], req_id_to_index={})
        scheduler_output, logits, hidden_states, samples = self.execute_model_state
        self.execute_model_state = None
        if grammar_output is not None:
            raise needs_npu("NPUModelRunner.sample_tokens (structured output)", "not simulated")
        batch = self.input_batch
        sampler_output = self.sampler(
            logits=logits.float(), sampling_metadata=self._sampling_metadata(samples)
        )
        sampled = sampler_output.sampled_token_ids.view(-1).tolist()
        valid: list[list[int]] = []
        for i, req_id in enumerate(batch.req_ids):
            if samples[i]:
                self.requests[req_id].output_token_ids.append(sampled[i])
                valid.append([sampled[i]])
            else:
                valid.append([])
        logprobs = sampler_output.logprobs_tensors
        prompt_logprobs = self._get_prompt_logprobs_dict(hidden_states, scheduler_output.num_scheduled_tokens)
        return ModelRunnerOutput(
            req_ids=list(batch.req_ids),
            req_id_to_index=dict(batch.req_id_to_index),
            sampled_token_ids=valid,
            logprobs=logprobs.tolists() if logprobs is not None else None,
            prompt_logprobs_dict=prompt_logprobs,
        )

    def _sampling_metadata(self, samples: list[bool]) -> SamplingMetadata:
        states = [self.requests[r] for r in self.input_batch.req_ids]
        params = [s.sampling_params for s in states]
        vocab = self.input_batch.vocab_size
        on = {"device": self.placement}
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, **on)
        greedy = [p.sampling_type == SamplingType.GREEDY for p in params]
        top_p = [p.top_p for p in params]
        top_k = [p.top_k if p.top_k and p.top_k > 0 else vocab for p in params]
        logprobs = [p.logprobs for p in params if p.logprobs is not None]
        no_penalties = all(
            p.presence_penalty == 0 and p.frequency_penalty == 0 and p.repetition_penalty == 1 for p in params
        )
        prompt_ids = None
        if not no_penalties:
            longest = max(s.num_prompt_tokens for s in states)
            prompt_ids = torch.tensor(
                [s.prompt_token_ids + [vocab] * (longest - s.num_prompt_tokens) for s in states], **on
            )
        min_tokens = {
            i: sorted(p.all_stop_token_ids)
            for i, (s, p) in enumerate(zip(states, params, strict=True))
            if p.min_tokens and len(s.output_token_ids) < p.min_tokens and p.all_stop_token_ids
        }
        return SamplingMetadata(
            temperature=None if all(greedy) else temperature,
            all_greedy=all(greedy),
            all_random=not any(greedy),
            top_p=None if all(v == 1.0 for v in top_p) else torch.tensor(top_p, dtype=torch.float32, **on),
            top_k=None if all(v == vocab for v in top_k) else torch.tensor(top_k, dtype=torch.int32, **on),
            # a row whose token is discarded (partial prefill) must not advance its request's generator
            generators={
                i: s.generator for i, s in enumerate(states) if s.generator is not None and samples[i]
            },
            max_num_logprobs=max(logprobs) if logprobs else None,
            no_penalties=no_penalties,
            prompt_token_ids=prompt_ids,
            frequency_penalties=torch.tensor(
                [p.frequency_penalty for p in params], dtype=torch.float32, **on
            ),
            presence_penalties=torch.tensor([p.presence_penalty for p in params], dtype=torch.float32, **on),
            repetition_penalties=torch.tensor(
                [p.repetition_penalty for p in params], dtype=torch.float32, **on
            ),
            output_token_ids=[s.output_token_ids for s in states],
            allowed_token_ids_mask=None,
            bad_words_token_ids={},
            logitsprocs=LogitsProcessors([_MinTokens(min_tokens)] if min_tokens else None),
        )

    def _get_prompt_logprobs_dict(
        self, hidden_states: torch.Tensor, num_scheduled_tokens: dict[str, int]
    ) -> dict[str, LogprobsTensors | None]:
        """The GPU runner's prompt-logprobs step, on the same inputs: one ``LogprobsTensors`` per
        request once its whole prompt has been scheduled (rows ``0 .. prompt_len - 2``)."""
        if not self.num_prompt_logprobs:
            return {}
        assert self.model is not None
        result: dict[str, LogprobsTensors | None] = {}
        completed = []
        for req_id, num_logprobs in self.num_prompt_logprobs.items():
            num_tokens = num_scheduled_tokens.get(req_id)
            if num_tokens is None:
                continue
            request = self.requests[req_id]
            num_prompt_tokens = request.num_prompt_tokens
            tensors = request.in_progress_prompt_logprobs_cpu
            if tensors is None:
                tensors = LogprobsTensors.empty_cpu(num_prompt_tokens - 1, num_logprobs + 1)
                request.in_progress_prompt_logprobs_cpu = tensors
            start = request.num_computed_tokens
            remaining = num_prompt_tokens - (start + 1)
            if num_tokens <= remaining:
                num_logits = num_tokens
            else:
                num_logits = remaining
                completed.append(req_id)
                result[req_id] = tensors
            if num_logits <= 0:
                continue
            offset = int(self.query_start_loc.np[self.input_batch.req_id_to_index[req_id]])
            logits = self.model.compute_logits(hidden_states[offset : offset + num_logits]).float()
            targets = torch.tensor(
                request.prompt_token_ids[start + 1 : start + 1 + num_logits], device=logits.device
            )
            ids, values, ranks, *_ = self.sampler.gather_logprobs(
                self.sampler.compute_logprobs(logits), num_logprobs, targets
            )
            rows = slice(start, start + num_logits)
            tensors.logprob_token_ids[rows].copy_(ids)
            tensors.logprobs[rows].copy_(values)
            tensors.selected_token_ranks[rows].copy_(ranks)
        for req_id in completed:
            del self.num_prompt_logprobs[req_id]
            self.requests[req_id].in_progress_prompt_logprobs_cpu = None
        return result

    def _sync_device(self) -> None:
        """The GPU runner's device sync (a patched ``_get_prompt_logprobs_dict`` calls it)."""
        if self.placement.type == "npu":
            torch.npu.synchronize(self.placement)

    # -- sleep mode ---------------------------------------------------------------------------

    def _sleep(self, level: int) -> None:
        """Free the device memory of the weights and the KV cache; level 1 keeps a host copy of weights."""
        assert self.model is not None
        if "weights" not in self._asleep:
            self._host_weights = (
                {n: p.detach().to("cpu", copy=True) for n, p in self.model.named_parameters()}
                if level == 1
                else None
            )
            self._shapes = {n: (p.shape, p.dtype) for n, p in self.model.named_parameters()}
            for param in self.model.parameters():
                param.data = torch.empty(0, dtype=param.dtype, device=self.placement)
        self.kv_caches = {}
        self._asleep = {"weights", "kv_cache"}
        gc.collect()

    def _wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate what ``tags`` names (default: both), restoring the weights from a kept host copy."""
        assert self.model is not None
        tags = ["weights", "kv_cache"] if tags is None else tags
        if "weights" in tags and "weights" in self._asleep:
            for name, param in self.model.named_parameters():
                shape, dtype = self._shapes[name]
                if self._host_weights is not None:
                    param.data = self._host_weights[name].to(self.placement, copy=True)
                else:
                    param.data = torch.empty(shape, dtype=dtype, device=self.placement)
            self._host_weights = None
            self._asleep.discard("weights")
        if "kv_cache" in tags and "kv_cache" in self._asleep:
            self._allocate_kv_cache()
            self._asleep.discard("kv_cache")

    def is_asleep(self) -> bool:
        return bool(self._asleep)


__all__ = ["NPUModelRunner", "placement_device"]
