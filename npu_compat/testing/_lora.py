# torch is not installed where mypy runs (the lint session): its classes are Any there.
# mypy: disable-error-code="misc"
"""LoRA for the simulated ``NPUModelRunner``: PEFT adapters on a transformers model, one request at a time.

vLLM's GPU runner keeps adapters in its ``LRUCacheWorkerLoRAManager`` and computes every adapted
layer as ``base(x) + scaling * B(A(x))`` with its punica kernels, for a whole batch at once, each
token with its request's adapter.  The stand-in runner computes requests one at a time, so here an
adapter is applied to one request's forward pass with forward hooks on the adapted ``nn.Linear``
modules of the transformers model, removed again once that pass is done; a request without a
``lora_request`` runs the base model.  The arithmetic is vLLM's: ``scaling`` is ``lora_alpha / r``
(``lora_alpha / sqrt(r)`` with ``use_rslora``), the adapter's tensors are held in vLLM's
``lora_dtype`` (the model's dtype for ``auto``) on the runner's device.

What :class:`LoraAdapters` does, as vLLM's worker-side manager does it:

* reads a PEFT adapter directory: ``adapter_config.json`` through vLLM's own ``PEFTHelper`` (so the
  same checks and messages: ``r`` against ``max_lora_rank``, no DoRA, no ``modules_to_save``, no
  bias) and ``adapter_model.safetensors``, else ``adapter_model.bin``; a directory with neither is
  vLLM's ``LoRAAdapterNotFoundError``.  Each tensor must be ``[base_model.model.]<module>.lora_A.weight``
  or ``.lora_B.weight`` of an ``nn.Linear`` of the model other than its output embedding (vLLM has no
  LoRA on ``lm_head`` or the embeddings), with ``A`` ``[r, in_features]`` and ``B`` ``[out_features, r]``;
  anything else is a ``ValueError`` naming it;
* keeps adapters by ``lora_int_id`` in vLLM's ``LRUCache`` of ``max_cpu_loras`` entries:
  ``add`` loads (a new id, or ``load_inplace``) -- first, then evicts the least recently used unpinned
  adapter if the cache is full -- or touches a loaded one, and answers True; ``remove`` answers
  whether the id was loaded; ``pin`` keeps a loaded adapter from eviction (an id not loaded is
  vLLM's ``ValueError``); ``ids`` is ``list_loras``;
* before each step, :meth:`activate` loads the adapters the step's requests name that are not loaded
  (vLLM loads a request's adapter from its ``lora_path`` on first use: Trinity never calls
  ``add_lora`` for the adapter it starts with), refusing more distinct adapters than ``max_loras``
  as vLLM does.

Each adapter as loaded is logged with digests (``npu_compat.testing._digest``), each by PEFT name:
``simulated weight sync (rollout lora <id> loaded): <n> tensors, sha256 <digest>`` over its tensors in the
file's dtype -- equal to ``digest_of`` over the adapter file.  Where the runner holds them in that dtype,
``loaded`` is computed from what it holds; where ``lora_dtype`` is another (a bfloat16 rollout, a float32
adapter), ``loaded`` is of the tensors as read, and two more lines say what the runner should hold
(``rollout lora <id> expected``: the file's tensors in ``lora_dtype``) and what it holds (``... holds``).

Not simulated (``SimulatedComputeBoundary``, by name, from the runner): LoRA at tensor parallel size
> 1 and vLLM's ``target_modules`` restriction of the adapted layers.  Not done: adapters from the
Hugging Face Hub or a tensorizer (the path must be a local directory), per-module ``rank_pattern`` /
``alpha_pattern`` (vLLM ignores them too: one scaling per adapter), ``lm_head``/embedding adapters.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from npu_compat.testing._digest import LINE, WeightsDigest

#: PEFT's prefix of a causal LM's tensors (``PeftModel.base_model.model``), and its two LoRA tensors.
PEFT_PREFIX = "base_model.model."
_PARTS = {".lora_A.weight": 0, ".lora_B.weight": 1}
#: The adapter weight files vLLM reads, in its order of preference.
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


@dataclass
class Adapter:
    """One loaded adapter: its ``(A, B)`` per adapted module, and its tensors' PEFT names and saved dtypes."""

    lora_int_id: int
    lora_name: str
    lora_path: str
    rank: int
    scaling: float
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]]
    #: PEFT tensor name -> (module, 0 for A / 1 for B, the dtype the file holds it in)
    names: dict[str, tuple[str, int, torch.dtype]]
    #: digests of the tensors as read, in the file's dtype and in ``lora_dtype`` (what it should hold)
    read: tuple[WeightsDigest, WeightsDigest]

    def digest(self, dtype: torch.dtype | None = None) -> WeightsDigest:
        """What this adapter holds, by PEFT name, in ``dtype`` (default: each tensor's dtype in the file)."""
        digest = WeightsDigest()
        for name, (module, part, saved) in self.names.items():
            digest.update(name, self.modules[module][part].to(dtype or saved))
        return digest


def read_tensors(path: str) -> dict[str, torch.Tensor]:
    """The tensors of the adapter directory ``path`` (``adapter_model.safetensors``, else ``.bin``)."""
    for file in WEIGHT_FILES:
        full = os.path.join(path, file)
        if os.path.isfile(full):
            if file.endswith(".safetensors"):
                from safetensors.torch import load_file  # type: ignore[import-not-found,unused-ignore]

                tensors: dict[str, torch.Tensor] = load_file(full, device="cpu")
                return tensors
            state = torch.load(full, map_location="cpu", weights_only=True)
            return dict(state)
    raise FileNotFoundError(f"no {' or '.join(WEIGHT_FILES)} in {path}")


def adaptable_modules(model: nn.Module) -> dict[str, nn.Linear]:
    """The modules an adapter may adapt: every ``nn.Linear`` of ``model`` but its output embedding."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and module is not output
    }


def _lora_hook(a: torch.Tensor, b: torch.Tensor, scaling: float) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        delta = F.linear(F.linear(args[0].to(a.dtype), a), b)
        return output + (scaling * delta).to(output.dtype)

    return hook


class LoraAdapters:
    """The runner's adapters, kept and applied as vLLM's worker keeps and applies them (module docstring)."""

    def __init__(self, lora_config: Any, model_dtype: torch.dtype, device: torch.device) -> None:
        from vllm.utils.cache import LRUCache

        self.lora_config = lora_config
        dtype = lora_config.lora_dtype
        if dtype in (None, "auto"):
            dtype = model_dtype
        elif isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        self.dtype: torch.dtype = dtype
        self.device = device
        self.max_loras: int = lora_config.max_loras
        capacity = lora_config.max_cpu_loras or lora_config.max_loras
        self._cache: Any = LRUCache(capacity)  # lora_int_id -> Adapter

    # -- vLLM's add_lora / remove_lora / pin_lora / list_loras ------------------------------------

    def add(self, lora_request: Any, model: nn.Module) -> bool:
        lora_id = lora_request.lora_int_id
        if lora_id not in self._cache or lora_request.load_inplace:
            adapter = self.read(lora_request, model)  # read first: a bad adapter evicts nothing
            self._cache.pop(lora_id, None)
            if len(self._cache) + 1 > self._cache.capacity:
                self._cache.remove_oldest()
            self._cache.put(lora_id, adapter)
            self._log_loaded(adapter)
        else:
            self._cache.touch(lora_id)
        return True

    def remove(self, lora_id: int) -> bool:
        return self._cache.pop(lora_id, None) is not None

    def pin(self, lora_id: int) -> bool:
        try:
            self._cache.pin(lora_id)
        except ValueError as err:
            raise ValueError(f"Pinning failed. LoRA {lora_id} is not registered.") from err
        return True

    def ids(self) -> set[int]:
        return set(self._cache.cache)

    def get(self, lora_id: int) -> Adapter | None:
        adapter: Adapter | None = self._cache.get(lora_id)
        return adapter

    # -- a step -----------------------------------------------------------------------------------

    def activate(self, lora_requests: Sequence[Any], model: nn.Module) -> None:
        """Before a step: load what its requests' adapters need (vLLM's ``_apply_adapters``)."""
        wanted = {r.lora_int_id: r for r in lora_requests if r is not None}
        if len(wanted) > self.max_loras:
            raise RuntimeError(
                f"Number of requested LoRAs ({len(wanted)}) is greater than the number of GPU LoRA "
                f"slots ({self.max_loras})."
            )
        for request in wanted.values():
            self.add(request, model)

    @contextlib.contextmanager
    def applied(self, lora_request: Any, model: nn.Module) -> Iterator[None]:
        """One request's forward pass with its adapter (none: the base model)."""
        if lora_request is None:
            yield
            return
        adapter = self._cache.get(lora_request.lora_int_id)
        if adapter is None:  # activate() loaded it for this step
            raise RuntimeError(f"LoRA {lora_request.lora_int_id} is not loaded")
        handles = []
        try:
            for name, (a, b) in adapter.modules.items():
                hook = _lora_hook(a, b, adapter.scaling)
                handles.append(model.get_submodule(name).register_forward_hook(hook))
            yield
        finally:
            for handle in handles:
                handle.remove()

    # -- reading an adapter -------------------------------------------------------------------------

    def read(self, lora_request: Any, model: nn.Module) -> Adapter:
        """The adapter of ``lora_request.lora_path``, checked against vLLM's LoRA config and ``model``."""
        from vllm.exceptions import LoRAAdapterNotFoundError
        from vllm.lora.peft_helper import PEFTHelper

        if getattr(lora_request, "tensorizer_config_dict", None):
            raise ValueError(
                "the simulated runner reads LoRA adapters from a local directory, not a tensorizer"
            )
        path = os.path.abspath(os.path.expanduser(lora_request.lora_path))
        try:
            peft = PEFTHelper.from_local_dir(path, None)
            tensors = read_tensors(path)
        except FileNotFoundError as e:
            raise LoRAAdapterNotFoundError(lora_request.lora_name, lora_request.lora_path) from e
        peft.validate_legal(self.lora_config)

        linears = adaptable_modules(model)
        pairs: dict[str, list[torch.Tensor | None]] = {}
        names: dict[str, tuple[str, int, torch.dtype]] = {}
        unexpected = []
        for name, tensor in tensors.items():
            stem = name[len(PEFT_PREFIX) :] if name.startswith(PEFT_PREFIX) else name
            part = next((i for suffix, i in _PARTS.items() if stem.endswith(suffix)), None)
            module = stem.rsplit(".", 2)[0] if part is not None else stem
            if part is None or module not in linears:
                unexpected.append(name)
                continue
            pairs.setdefault(module, [None, None])[part] = tensor
            names[name] = (module, part, tensor.dtype)
        if unexpected:
            raise ValueError(
                f"While loading {path}, expected LoRA tensors '<module>.lora_A.weight' / '.lora_B.weight' "
                f"of the model's linear layers (no lm_head or embeddings), but received {sorted(unexpected)}."
            )
        read, expected = WeightsDigest(), WeightsDigest()
        for name in names:
            read.update(name, tensors[name])
            expected.update(name, tensors[name].to(self.dtype))
        modules: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for module, (a, b) in sorted(pairs.items()):
            linear = linears[module]
            if a is None or b is None:
                raise ValueError(f"While loading {path}: {module} has only one of lora_A and lora_B")
            rank = a.shape[0]
            if (
                a.dim() != 2 or b.dim() != 2 or b.shape[1] != rank
                or a.shape[1] != linear.in_features or b.shape[0] != linear.out_features
            ):  # fmt: skip
                raise ValueError(
                    f"While loading {path}: {module} is a Linear({linear.in_features}, "
                    f"{linear.out_features}), its lora_A is {tuple(a.shape)} and lora_B {tuple(b.shape)}"
                )
            if rank > self.lora_config.max_lora_rank:
                raise ValueError(
                    f"LoRA rank {rank} of {module} is greater than max_lora_rank "
                    f"{self.lora_config.max_lora_rank}."
                )
            modules[module] = (
                a.to(device=self.device, dtype=self.dtype, copy=True),
                b.to(device=self.device, dtype=self.dtype, copy=True),
            )
        scaling = float(peft.vllm_lora_scaling_factor)  # lora_alpha / r, or / sqrt(r) with use_rslora
        return Adapter(
            lora_int_id=lora_request.lora_int_id,
            lora_name=lora_request.lora_name,
            lora_path=path,
            rank=peft.r,
            scaling=scaling,
            modules=modules,
            names=names,
            read=(read, expected),
        )

    def _log_loaded(self, adapter: Adapter) -> None:
        from vllm.logger import logger

        logger.info(
            "simulated Ascend: LoRA %d (%s) loaded from %s: r=%d, scaling %g, %d modules (%s)",
            adapter.lora_int_id,
            adapter.lora_name,
            adapter.lora_path,
            adapter.rank,
            adapter.scaling,
            len(adapter.modules),
            ", ".join(sorted({m.rsplit(".", 1)[-1] for m in adapter.modules})),
        )
        side = f"rollout lora {adapter.lora_int_id}"
        if all(dtype == self.dtype for _, _, dtype in adapter.names.values()):
            held = adapter.digest()  # held in the file's dtype: what it holds is what was read
            logger.info(LINE, f"{side} loaded", held.count, held.hexdigest())
            return
        read, expected = adapter.read  # held in another dtype: what was read, then the conversion
        holds = adapter.digest(self.dtype)
        logger.info(LINE, f"{side} loaded", read.count, read.hexdigest())
        logger.info(LINE, f"{side} expected", expected.count, expected.hexdigest())
        logger.info(LINE, f"{side} holds", holds.count, holds.hexdigest())


__all__ = ["PEFT_PREFIX", "Adapter", "LoraAdapters", "adaptable_modules", "read_tensors"]
