"""Probes: each drives one piece of real upstream code the way a user's run reaches it.

A probe asserts what a user on an Ascend host needs (a placement group that becomes
ready, a process group that answers a collective, a worker class built on
vllm-ascend's NPUWorker, a method that gets past its device calls) and raises when that
does not happen.  Waits on Ray are bounded: what never becomes ready is reported as
``pending``.

Run in a fresh interpreter on a simulated Ascend host::

    python -m tests.catalogue.probes [--activate] ROW [ROW ...]

prints one JSON object ``{row: {"status": "ok"|"error"|"pending", "error": ..., "detail": ...}}``.
Rows that need Ray read the cluster address from ``RAY_ADDRESS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
import time
import traceback
import types
import uuid
from collections.abc import Callable
from typing import Any

from npu_compat.testing._ray import _free_port

PENDING_AFTER_S = float(os.environ.get("PROBE_PENDING_AFTER_S", "8"))
SCHEDULE_TIMEOUT_S = 120.0  # an actor that *is* schedulable still has to import vLLM
#: this run's Ray namespace: the three modes run side by side on one cluster, and Trinity's named actors
#: must not meet another run's
NAMESPACE = f"probe-{uuid.uuid4().hex[:8]}"


class Pending(Exception):
    """A Ray request that did not become ready within the bound."""


def _ray() -> Any:
    import ray

    if not ray.is_initialized():
        ray.init(address=os.environ["RAY_ADDRESS"], namespace=NAMESPACE, log_to_driver=False)
    return ray


def _in_thread(fn: Callable[[], Any], timeout: float) -> Any:
    """Run a call that may block forever (``ray.get(pg.ready())``); Pending if it does."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - carried to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise Pending(f"still blocked after {timeout:.0f}s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _pg_state(pg: Any) -> dict[str, Any]:
    from ray.util.placement_group import placement_group_table

    table = placement_group_table(pg)
    return {"state": table["state"], "bundles": [dict(sorted(b.items())) for b in table["bundles"].values()]}


def _actor_resources(actor: Any, timeout: float) -> dict[str, Any]:
    ray = _ray()

    def look(self: Any) -> dict[str, Any]:
        import os

        import ray

        return {
            "assigned": ray.get_runtime_context().get_assigned_resources(),
            "ASCEND_RT_VISIBLE_DEVICES": os.environ.get("ASCEND_RT_VISIBLE_DEVICES"),
        }

    ref = actor.__ray_call__.remote(look)
    ready, _ = ray.wait([ref], timeout=timeout)
    if not ready:
        raise Pending(f"actor not scheduled after {timeout:.0f}s")
    return dict(ray.get(ref))


# -- trinity-rft 0.6.0 -------------------------------------------------------------------------


def _sampling_defaults(model: Any) -> Any:
    """What Trinity's config validator fills in before a model actor is created."""
    for name, value in {
        "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": 0, "max_response_tokens": 16,
        "min_response_tokens": 0, "max_prompt_tokens": 16, "ignore_eos": False,
    }.items():  # fmt: skip
        if getattr(model, name, None) is None:
            setattr(model, name, value)
    return model


def _explorer_config() -> Any:
    from trinity.common.config import ExplorerConfig

    cfg = ExplorerConfig()
    cfg.name = f"probe_{uuid.uuid4().hex[:6]}"
    model = cfg.rollout_model
    model.engine_num, model.gpu_per_engine, model.nnodes, model.tensor_parallel_size = 1, 1, 1, 1
    model.ray_namespace = NAMESPACE
    _sampling_defaults(model)
    return cfg


def _cluster_count(module: str) -> dict[str, Any]:
    ray = _ray()
    from trinity.common.config import Config
    from trinity.common.config_validator import RayClusterConfigValidator

    assert module == RayClusterConfigValidator.__module__
    config = Config()
    config.cluster.ray_address = os.environ["RAY_ADDRESS"]
    RayClusterConfigValidator()._set_cluster_info(config)
    npus = int(ray.cluster_resources().get("NPU", 0))
    if config.cluster.gpu_per_node != npus:
        raise AssertionError(
            f"Trinity counted {config.cluster.gpu_per_node} accelerators per node on a node with {npus} NPUs"
        )
    return {"node_num": config.cluster.node_num, "gpu_per_node": config.cluster.gpu_per_node}


def probe_A1() -> dict[str, Any]:
    """The cluster validator must count the node's NPUs as its accelerators."""
    return _cluster_count("trinity.common.config_validator")


def probe_A5() -> dict[str, Any]:
    """Allocator.create_all_models: its placement group must become ready on an NPU-only cluster."""
    _ray()
    from trinity.common.models.allocator import Allocator

    allocator = Allocator(_explorer_config())

    async def create() -> None:
        # Past the placement group it goes on to start vLLM engines: not this row's concern.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(allocator.create_all_models(), PENDING_AFTER_S)

    asyncio.run(create())
    state = _pg_state(allocator.pg)
    if state["state"] != "CREATED":
        raise Pending(
            f"placement group {state['state']} after {PENDING_AFTER_S:.0f}s, bundles {state['bundles']}"
        )
    # end to end: the rollout actor create_all_models went on to start sits in an NPU bundle
    ray = _ray()
    actor = ray.get_actor(allocator.get_actor_name("rollout", 0, 0), namespace=NAMESPACE)
    try:
        state["rollout_actor"] = _actor_resources(actor, SCHEDULE_TIMEOUT_S)
    finally:
        ray.kill(actor)
    return state


def probe_A6() -> dict[str, Any]:
    """get_model_wrapper: the rollout actor must be scheduled into an NPU bundle."""
    ray = _ray()
    from ray.util.placement_group import placement_group
    from trinity.common.models.allocator import get_model_wrapper
    from trinity.common.models.vllm_model import vLLMRolloutModel

    cfg = _explorer_config().rollout_model
    pg = placement_group([{"NPU": 1.0, "CPU": 1.0}], strategy="PACK")  # what an NPU-aware A5 yields
    ray.get(pg.ready(), timeout=60)
    name = f"probe_rollout_{uuid.uuid4().hex[:6]}"

    async def create() -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(get_model_wrapper(vLLMRolloutModel, cfg, pg, [(name, 0)]), 1)

    asyncio.run(create())
    actor = ray.get_actor(name, namespace=cfg.ray_namespace)
    try:
        return _actor_resources(actor, SCHEDULE_TIMEOUT_S if _activated() else PENDING_AFTER_S)
    finally:
        ray.kill(actor)


def probe_A12() -> dict[str, Any]:
    """The worker_cls Trinity hands vLLM must be a worker for the NPU (vllm-ascend's NPUWorker)."""
    from vllm.utils.import_utils import resolve_obj_by_qualname

    cls = resolve_obj_by_qualname("trinity.common.models.vllm_worker.TrinityGPUWorker")
    mro = [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__]
    if "vllm_ascend.worker.worker.NPUWorker" not in mro:
        raise AssertionError(f"GPU worker class chosen on an NPU host: {mro[:3]}")
    return {"mro": mro[:3], "has_apply_patches": hasattr(cls, "apply_patches")}


def probe_A16() -> dict[str, Any]:
    """trinity.utils.distributed.init_process_group(backend="nccl") must give a working group."""
    import torch
    import torch.distributed as dist
    from trinity.utils.distributed import init_process_group

    group = init_process_group(
        host="127.0.0.1", port=_free_port(), group_name="probe", backend="nccl", world_size=1, rank=0
    )
    t = torch.ones(3)
    dist.all_reduce(t, group=group)
    return {"backend": str(dist.get_backend(group)), "sum": t.tolist()}


def probe_A17() -> dict[str, Any]:
    """The trainer side of collective weight sync: create the engine and send one tensor."""
    import torch
    from trinity.utils.distributed import WeightTransferEngine

    engine = WeightTransferEngine.create("vllm", "127.0.0.1", _free_port(), 1, "probe")
    group = type(engine._model_update_group).__name__
    engine.sync_weight(iter([("w", torch.arange(4.0))]))
    engine.teardown()
    return {"group": group}


def _stub(**attrs: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**attrs)


def probe_A22() -> dict[str, Any]:
    """TrinityActorRolloutRefWorker.sync_weight_nccl on trainer rank 0 must get past its device sync."""
    import torch.distributed as dist
    from trinity.trainer.verl.workers import TrinityActorRolloutRefWorker

    _single_rank_group()
    sent: list[str] = []
    worker = _stub(
        actor=_stub(engine=_stub(get_per_tensor_param=lambda: (iter([]), None))),
        _rank0_iterator_wrapper=lambda it: it,
        logger=_stub(info=lambda *a, **k: None),
        weight_transfer_engine=_stub(sync_weight=lambda iterator: sent.append("sent")),
    )
    TrinityActorRolloutRefWorker.sync_weight_nccl(worker)
    return {"sent": sent, "rank": dist.get_rank()}


def probe_A23() -> dict[str, Any]:
    """fsdp_engine.fsdp_sync_weight_nccl (FSDP2 path) on rank 0: broadcast, then get past its device sync.

    Nothing in trinity-rft 0.6.0 calls this helper yet (its callers moved to workers.py); it is driven
    directly, as the next caller would reach it.
    """
    import torch
    from trinity.trainer.verl.fsdp_engine import fsdp_sync_weight_nccl

    _single_rank_group()
    params = [("w", torch.arange(3.0))]
    engine = _stub(_strategy="fsdp2", get_per_tensor_param=lambda: (iter(params), None))
    fsdp_sync_weight_nccl(engine, model_update_group=None)  # the default (one-rank) group
    return {"broadcast": [name for name, _ in params]}


def probe_A21() -> dict[str, Any]:
    """TrinityActorRolloutRefWorker._save_lora on an FSDP1-wrapped PEFT model must write the adapter.

    Upstream catches the error of its device move and only logs it, so a failed save is seen
    by the user as a missing ``lora_adapter`` (the Explorer cannot reload LoRA weights); the
    probe turns that log line into the failure.  Tensors moved to the NPU live on the host
    (``npu_on_host``).
    """
    import tempfile

    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel
    from transformers import Qwen2ForCausalLM
    from trinity.trainer.verl.workers import TrinityActorRolloutRefWorker

    from npu_compat.testing._boundary import npu_on_host

    _single_rank_group()
    lora = LoraConfig(r=2, target_modules=["q_proj"], task_type=TaskType.CAUSAL_LM)
    model = get_peft_model(Qwen2ForCausalLM(_tiny_hf_config()), lora)
    fsdp = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
    errors: list[str] = []
    worker = _stub(
        actor=_stub(engine=_stub(module=fsdp)),
        logger=_stub(info=lambda *a, **k: None, error=lambda msg, *a, **k: errors.append(str(msg))),
    )
    with tempfile.TemporaryDirectory() as directory, npu_on_host() as requests:
        TrinityActorRolloutRefWorker._save_lora(worker, directory)
        written = sorted(os.listdir(os.path.join(directory, "lora_adapter")))
    if errors or "adapter_model.safetensors" not in written:
        raise RuntimeError(f"LoRA adapter not saved: {'; '.join(errors) or written}")
    return {"written": written, "npu_requests": sorted(set(requests))}


def _single_rank_group() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)


def _tiny_hf_config() -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        architectures=["Qwen2ForCausalLM"],
    )  # fmt: skip


def probe_A24() -> dict[str, Any]:
    """Trinity's FSDP engine _build_module must build the model (FSDP2 meta-init on ranks > 0)."""
    from trinity.trainer.verl.monkey_patch import _build_module

    engine = _stub(
        engine_config=_stub(model_dtype="fp32", forward_only=False, strategy="fsdp2"),
        rank=1,
        device_mesh=None,
        model_config=_stub(
            model_type="language_model", hf_config=_tiny_hf_config(), trust_remote_code=False,
            local_path="", use_liger=False, fused_kernel_options=None, use_fused_kernels=False,
            enable_gradient_checkpointing=False,
        ),
        use_remove_padding=False,
        ulysses_sequence_parallel_size=1,
    )  # fmt: skip
    module = _build_module(engine)
    return {"module": type(module).__name__, "param_device": str(next(module.parameters()).device)}


def checkpoint_weights() -> dict[str, Any]:
    """A small checkpoint's tensors (each one's bytes aligned, as vLLM's packed protocol needs)."""
    import torch

    g = torch.Generator().manual_seed(11)
    return {
        "embed.weight": torch.randn(4, 4, generator=g),
        "norm.weight": torch.arange(8, dtype=torch.bfloat16),
        "step": torch.tensor([5], dtype=torch.int64),
    }


def save_checkpoint(directory: str) -> None:
    """Write :func:`checkpoint_weights` where Trinity's checkpoint sync reads it (``model.safetensors``)."""
    from safetensors.torch import save_file

    save_file(checkpoint_weights(), os.path.join(directory, "model.safetensors"))


def checkpoint_engine(rank: int, world_size: int) -> Any:
    """Trinity's CheckpointWeightTransferEngine as a vLLM worker of a TP group of ``world_size`` builds it."""
    import torch
    from trinity.common.models.vllm_extension import CheckpointWeightTransferEngine
    from vllm.config.parallel import ParallelConfig
    from vllm.config.weight_transfer import WeightTransferConfig

    parallel = ParallelConfig(tensor_parallel_size=world_size)
    parallel.rank = rank
    return CheckpointWeightTransferEngine(
        WeightTransferConfig(backend="checkpoint"), parallel, torch.nn.Linear(2, 2)
    )


def init_info(port: int, world_size: int) -> Any:
    from trinity.common.models.vllm_extension import CheckpointWeightTransferInitInfo

    return CheckpointWeightTransferInitInfo(
        master_address="127.0.0.1", master_port=port, rank_offset=0, world_size=world_size,
        sync_method="checkpoint", namespace=NAMESPACE,
    )  # fmt: skip


def receive_checkpoint(engine: Any, directory: str) -> dict[str, Any]:
    """Run one checkpoint sync on ``engine`` (rank 0 reads ``directory``); what ``load_weights`` got, on the
    host, and the devices it got it on."""
    from trinity.common.models.vllm_extension import CheckpointWeightTransferUpdateInfo

    loaded: dict[str, Any] = {}
    devices: set[str] = set()

    def load_weights(weights: Any) -> None:
        for name, tensor in weights:
            devices.add(str(tensor.device))
            loaded[name] = tensor.cpu()

    engine.receive_weights(CheckpointWeightTransferUpdateInfo(checkpoint_path=directory), load_weights)
    return {"loaded": loaded, "devices": sorted(devices)}


def _rank_device(rank: int) -> None:
    """This thread's current device, as a vLLM worker of local rank ``rank`` sets it (``npu:rank``; the
    device index is per thread, as CUDA's)."""
    import torch

    if hasattr(torch, "npu") and torch.npu.is_available():
        torch.npu.set_device(rank)


def _two_ranks(work: Callable[[int], Any], timeout: float = 60.0) -> list[Any]:
    """Run ``work(rank)`` for ranks 0 and 1 in two threads (a TP-2 pair of vLLM workers), each on its own
    device.

    Each rank's result is kept until both are done: it holds the rank's group, and rank 0's
    group hosts the store rank 1 still reads from.
    """
    boxes: list[dict[str, Any]] = [{}, {}]

    def run(i: int) -> None:
        try:
            _rank_device(i)
            boxes[i]["result"] = work(i)
        except BaseException as exc:  # noqa: BLE001 - carried to the caller
            boxes[i]["error"] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in (0, 1)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    # a rank that fails leaves its peer blocked on the group for good: report the failure at once
    while any(t.is_alive() for t in threads) and not any("error" in b for b in boxes):
        if time.monotonic() > deadline:
            raise Pending(f"a rank is still blocked after {timeout:.0f}s")
        threads[0].join(0.05)
    for box in boxes:
        if "error" in box:
            raise box["error"]
    return [box["result"] for box in boxes]


def probe_A13() -> dict[str, Any]:
    """Checkpoint/memory sync: two vLLM workers form their weight-sync group and it answers a collective."""
    import torch

    port = _free_port()

    def join(rank: int) -> Any:
        engine = checkpoint_engine(rank, 2)
        engine.init_transfer_engine(init_info(port, 2))
        group = engine.model_update_group
        ones = torch.ones(2, device=torch.accelerator.current_accelerator())
        total = group.all_reduce(ones * (rank + 1))
        return {"group": type(group).__name__, "sum": None if total is None else total.tolist()}, engine

    ranks = [result for result, _engine in _two_ranks(join)]
    if ranks[0]["sum"] != [3.0, 3.0]:
        raise AssertionError(f"the weight-sync group did not reduce: {ranks}")
    return {"ranks": ranks}


def probe_A14() -> dict[str, Any]:
    """Checkpoint sync's data path: rank 0 reads the checkpoint and broadcasts it, both ranks load it.

    The group comes from vllm-ascend's HCCL engine directly (harness), so only the data path is probed.
    """
    import tempfile

    import torch
    from vllm_ascend.distributed.weight_transfer.hccl_engine import HCCLWeightTransferEngine

    port = _free_port()
    with tempfile.TemporaryDirectory() as directory:
        save_checkpoint(directory)

        def sync(rank: int) -> Any:
            engine = checkpoint_engine(rank, 2)
            engine.model_update_group = HCCLWeightTransferEngine._stateless_init_process_group(
                "127.0.0.1", port, rank, 2, torch.accelerator.current_device_index()
            )
            engine._sync_method, engine._namespace, engine._synchronizer = "checkpoint", NAMESPACE, None
            return receive_checkpoint(engine, directory), engine

        ranks = [result for result, _engine in _two_ranks(sync)]
    expected = checkpoint_weights()
    for got in ranks:
        if sorted(got["loaded"]) != sorted(expected) or not all(
            torch.equal(got["loaded"][name], tensor) for name, tensor in expected.items()
        ):
            raise AssertionError(f"weights did not arrive intact: {sorted(got['loaded'])}")
    devices = [got["devices"] for got in ranks]
    if devices != [["npu:0"], ["npu:1"]]:  # each rank loads on its own device
        raise AssertionError(f"the ranks loaded the weights on {devices}")
    return {"devices": devices}


# -- trinity-rft 0.6.0 on verl < 0.8 (trinity.trainer.verl_legacy) -------------------------------


def _trainer_device_placement(module: str, colocate: int) -> dict[str, Any]:
    """verl's resource pool, given the trainer device Trinity's config defaults to, must get NPU bundles."""
    _ray()
    import importlib

    from verl.single_controller.ray.base import RayResourcePool

    device = importlib.import_module(module).veRLConfig().trainer.device
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=colocate)
    pgs = _in_thread(lambda: pool.get_placement_groups(device_name=device), PENDING_AFTER_S)
    return {"device": device, **_pg_state(pgs[0])}


def probe_A28() -> dict[str, Any]:
    """The legacy trainer's default device must give verl NPU placement groups that become ready."""
    return _trainer_device_placement("trinity.trainer.verl_legacy.verl_config", colocate=1)


def probe_A30() -> dict[str, Any]:
    """Legacy ActorRolloutRefWorker.sync_weight on trainer rank 0 must get past its device sync."""
    from trinity.trainer.verl_legacy import fsdp_workers

    _single_rank_group()
    sent: list[str] = []
    worker = _stub(
        _fsdp_offload_context=contextlib.nullcontext,
        actor_module_fsdp=None,
        named_modules=[],
        config=_stub(actor=_stub(strategy="fsdp2")),
        weight_transfer_engine=_stub(sync_weight=lambda iterator: sent.append("sent")),
        logger=_stub(info=lambda *a, **k: None),
    )
    original = fsdp_workers.iter_fsdp_per_tensor_param
    fsdp_workers.iter_fsdp_per_tensor_param = lambda **kw: iter([])  # no model to walk: harness, not upstream
    try:
        fsdp_workers.ActorRolloutRefWorker.sync_weight(worker)
    finally:
        fsdp_workers.iter_fsdp_per_tensor_param = original
    return {"sent": sent}


class _ModelBuildReached(Exception):
    """Raised by the probe's stand-in for the model class lookup: the model build was reached."""


def probe_A29() -> dict[str, Any]:
    """Legacy ActorRolloutRefWorker._build_model_optimizer on rank 1 (FSDP2) must get past the device
    capability query and build its model on ``meta``, as upstream chose for capability >= 9.

    The real method runs from its start (tokenizer, config, generation config of a tiny local model)
    through ``get_device_capability(0)`` and the meta-init decision; the probe stops it where the model
    class is looked up inside the chosen init context (harness, not upstream) and reports that context.
    """
    import tempfile

    import torch
    from omegaconf import OmegaConf
    from trinity.trainer.verl_legacy import fsdp_workers

    from tests.e2e.tiny_model import make_tiny_model

    reached: list[str] = []

    def model_class(config: Any) -> Any:
        reached.append(torch.empty(0).device.type)  # the init context: "meta" or "cpu"
        raise _ModelBuildReached

    worker = _stub(
        rank=1, device_mesh=None, _is_lora=False, _is_actor=True, ulysses_sequence_parallel_size=1,
        logger=logging.getLogger("npu-compat-probe"),
        config=OmegaConf.create({
            "actor": {"strategy": "fsdp2"},
            "model": {"custom_chat_template": None, "rope_scaling": None, "rope_theta": None},
        }),
    )  # fmt: skip
    fsdp_config = OmegaConf.create({"mixed_precision": None, "dtype": "bf16", "model_dtype": "fp32"})
    original = fsdp_workers.get_hf_auto_model_class
    fsdp_workers.get_hf_auto_model_class = model_class
    try:
        with tempfile.TemporaryDirectory() as directory:
            model = str(make_tiny_model(directory))
            with contextlib.suppress(_ModelBuildReached):
                fsdp_workers.ActorRolloutRefWorker._build_model_optimizer(
                    worker, model, fsdp_config, optim_config=None, override_model_config={},
                    role="actor",
                )  # fmt: skip
    finally:
        fsdp_workers.get_hf_auto_model_class = original
    if reached != ["meta"]:
        raise AssertionError(f"rank 1 of FSDP2 should build its model on meta; init contexts seen: {reached}")
    return {"init_context": reached[0]}


# -- trinity-rft 0.5.2 ---------------------------------------------------------------------------


def probe_B1() -> dict[str, Any]:
    """The cluster validator must count the node's NPUs as its accelerators."""
    return _cluster_count("trinity.common.config_validator")


def probe_B6() -> dict[str, Any]:
    """_BundleAllocator: its placement group must become ready on an NPU-only cluster."""
    _ray()
    from trinity.common.models import _BundleAllocator

    allocator = _in_thread(lambda: _BundleAllocator(num_gpus=1), PENDING_AFTER_S)
    return {"node_bundles": allocator.node_bundle_list, **_pg_state(allocator.pg)}


def probe_B7() -> dict[str, Any]:
    """create_vllm_inference_models: the TP=1 rollout actor must be scheduled into an NPU bundle."""
    ray = _ray()
    from ray.util.placement_group import placement_group
    from trinity.common.config import InferenceModelConfig
    from trinity.common.models import create_vllm_inference_models

    if _activated():  # the real allocator, as create_explorer_models builds it (its GPU bundles are row B6)
        from trinity.common.models import _BundleAllocator

        allocator: Any = _in_thread(lambda: _BundleAllocator(num_gpus=1), 60)
    else:  # stock would hang in row B6 first: hand it the NPU bundle an NPU-aware row B6 yields
        pg = placement_group([{"NPU": 1.0}], strategy="PACK")
        ray.get(pg.ready(), timeout=60)
        allocator = types.SimpleNamespace(pg=pg, allocate=lambda n: [0])
    cfg = _sampling_defaults(InferenceModelConfig(engine_num=1, tensor_parallel_size=1))
    cfg.ray_namespace = ray.get_runtime_context().namespace
    (actor,) = create_vllm_inference_models(cfg, allocator, f"probe_rollout_{uuid.uuid4().hex[:6]}")
    try:
        return _actor_started(actor, SCHEDULE_TIMEOUT_S if _activated() else PENDING_AFTER_S)
    finally:
        ray.kill(actor)


def _actor_started(actor: Any, timeout: float) -> dict[str, Any]:
    """Wait until Ray has started a worker process for ``actor`` (its constructor ran); Pending if not.

    Read from the GCS actor table, so that an actor whose constructor fails still counts as
    scheduled: 0.5.2's vLLMRolloutModel builds its vLLM engine in ``__init__``, which the probe
    (no model on disk) cannot do -- harness, reported in the detail, not the outcome.
    """
    from ray._private import state

    deadline = time.monotonic() + timeout
    while True:
        info = state.actors(actor_id=actor._actor_id.hex())
        if info and info.get("Pid"):
            cause = info.get("DeathCause")
            failed = cause is not None and cause.HasField("creation_task_failure_context")
            message = cause.creation_task_failure_context.formatted_exception_string if failed else ""
            lines = [line for line in message.splitlines() if line.strip()]
            return {
                "state": info["State"],
                "worker_pid": info["Pid"],
                "constructor": lines[-1][:200]
                if lines
                else ("done" if info["State"] == "ALIVE" else "running"),
            }
        if time.monotonic() > deadline:
            raise Pending(
                f"actor not started after {timeout:.0f}s (state {info.get('State') if info else None})"
            )
        time.sleep(0.5)


def probe_N1() -> dict[str, Any]:
    """Trinity's rollout model, built as its actor builds it, must leave the NPUWorker of the vLLM
    engine it starts (which inherits its environment) able to begin a weight update."""
    from trinity.common.config import InferenceModelConfig
    from trinity.common.models.vllm_model import vLLMRolloutModel
    from vllm_ascend.worker.worker import NPUWorker

    vLLMRolloutModel(_sampling_defaults(InferenceModelConfig(engine_num=1, tensor_parallel_size=1)))
    worker = NPUWorker.__new__(NPUWorker)  # the state load_model() leaves (harness: no engine, no model)
    worker.weight_transfer_engine, worker._weight_update_active = object(), False
    worker.start_weight_update(is_checkpoint_format=False)
    return {"nz": os.environ.get("VLLM_ASCEND_ENABLE_NZ"), "update_active": worker._weight_update_active}


#: 0.5.2's init_process_group is the same function as 0.6.0's (row B15 = A16).
probe_B15 = probe_A16


def probe_B13() -> dict[str, Any]:
    """WorkerExtension.init_process_group (the rollout side, name-imported init_process_group)."""
    import torch
    from trinity.common.models.vllm_worker import WorkerExtension

    ray = _ray()
    namespace = ray.get_runtime_context().namespace

    @ray.remote(num_cpus=0)
    class Synchronizer:  # harness stand-in: the row is the group, not Trinity's synchronizer actor
        pass

    stand_in = Synchronizer.options(name="synchronizer", namespace=namespace).remote()
    _single_rank_group()
    worker = _stub(device=torch.device("npu:0"))
    try:
        WorkerExtension.init_process_group(
            worker, "127.0.0.1", _free_port(), 0, 1, "probe_group", timeout=60,
            explorer_name="probe", namespace=namespace,
        )  # fmt: skip
    finally:
        ray.kill(stand_in)
    group = worker._model_update_group
    return {"backend": str(torch.distributed.get_backend(group)), "size": group.size()}


def probe_B16() -> dict[str, Any]:
    """The trainer's default device must give verl NPU placement groups that become ready."""
    return _trainer_device_placement("trinity.trainer.verl.verl_config", colocate=3)


def probe_B25() -> dict[str, Any]:
    """ActorRolloutRefWorker.sync_weight on trainer rank 0 must get past its device sync."""
    import torch.distributed as dist
    from trinity.trainer.verl.fsdp_workers import ActorRolloutRefWorker

    _single_rank_group()
    worker = _stub(
        _fsdp_offload_context=contextlib.nullcontext,
        config=_stub(actor=_stub(strategy="fsdp2")),
        actor_module_fsdp=_stub(named_parameters=lambda: iter([])),
        _model_update_group=dist.group.WORLD,
    )
    ActorRolloutRefWorker.sync_weight(worker)
    return {"rank": dist.get_rank()}


# -- runner --------------------------------------------------------------------------------------


def _row_id(function_name: str) -> str:
    """``probe_A5`` -> ``A5``, ``probe_B6`` -> ``B6``: the row ids of docs/break-map.md."""
    return function_name.removeprefix("probe_")


PROBES: dict[str, Callable[[], dict[str, Any]]] = {
    _row_id(name): fn for name, fn in dict(globals()).items() if name.startswith("probe_") and callable(fn)
}
_ACTIVATED = False


def _activated() -> bool:
    return _ACTIVATED


def _release_placement_groups() -> None:
    """Give back the NPUs a probe's placement groups hold, so the next probe starts from a free cluster."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    job = ray.get_runtime_context().get_job_id()
    for pg_id, info in placement_group_table().items():
        # a placement group id ends with the id of the job that created it
        if info.get("state") != "REMOVED" and pg_id.endswith(job):
            with contextlib.suppress(Exception):
                remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(pg_id))))


def run(rows: list[str], activate: bool) -> dict[str, dict[str, Any]]:
    global _ACTIVATED
    if activate:
        import npu_compat

        _ACTIVATED = npu_compat.activate() == "npu"
    results: dict[str, dict[str, Any]] = {}
    for row in rows:
        try:
            results[row] = {"status": "ok", "error": None, "detail": PROBES[row]()}
        except Pending as exc:
            results[row] = {"status": "pending", "error": str(exc), "detail": None}
        except BaseException as exc:  # noqa: BLE001 - every failure is an outcome
            tb = traceback.extract_tb(exc.__traceback__)
            where = [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno}" for f in tb[-3:]]
            results[row] = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "detail": where}
        _release_placement_groups()
    return results


def main(argv: list[str]) -> None:
    activate = "--activate" in argv
    rows = [a for a in argv if not a.startswith("--")]
    results = run(rows, activate)
    sys.stdout.write("\nPROBE-RESULTS " + json.dumps(results, default=str) + "\n")
    sys.stdout.flush()
    os._exit(0)  # threads blocked forever on Ray (the HANG rows) must not keep the process alive


if __name__ == "__main__":
    main(sys.argv[1:])
