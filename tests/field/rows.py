"""The field-failure catalogue as data: what Ascend users of RL post-training report, reproduced here.

A row is a failure reported on real Ascend hosts, with its public sources (``owner/repository#number``), how the
simulated Ascend reproduces it (as far as the sources and the released code describe it, no further), what stock
Trinity meets, what it meets with npu-compat, and the tests that show both.  ``python -m tests.field`` renders
``docs/field-failures.md`` from it; ``tests/field/test_field_catalogue.py`` keeps the page current and every test
it names existing.
"""

from __future__ import annotations

from dataclasses import dataclass

#: how npu-compat meets a row
PATCHED = "patched"  # a patch of the catalogue (``handled_by`` its id) turns stock's outcome green
DOCTOR = "doctor"  # only the environment can fix it: ``python -m npu_compat doctor`` names it
NOT_REACHED = "not reached"  # reproduced, but Trinity's own code never takes the path: nothing to patch
NOT_YET = "not yet reproduced"


@dataclass(frozen=True)
class Source:
    ref: str  # owner/repository#number, or a released package's file
    says: str


@dataclass(frozen=True)
class Row:
    id: str
    failure: str
    sources: tuple[Source, ...]
    reproduced: str  # what the simulation models, and from which released code
    stock: str
    npu_compat: str
    status: str
    handled_by: str = ""  # the patch ids (", "-separated), or the doctor check
    tests: tuple[str, ...] = ()


ROWS: tuple[Row, ...] = (
    Row(
        "F1",
        "ACL graphs replay the old weights after a weight sync",
        (
            Source(
                "vllm-project/vllm-ascend#16322", "RFC: make live weight updates transactional and graph-safe"
            ),
            Source(
                "vllm-project/vime#157",
                "RL on Ascend runs --enforce-eager: ACL graphs keep the weight addresses of capture time, and "
                "after an HCCL weight transfer the replay reads stale memory or fails with ERR99999",
            ),
            Source(
                "verl-project/verl#7087",
                "graph-safe online reload on Ascend needs the runtime parameter storage restored, so that a "
                "captured ACL graph reads the updated storage",
            ),
            Source(
                "vllm-project/vllm-ascend#13012",
                "process_weights_after_loading replaced MoE weights with a new Parameter; the fix writes in place",
            ),
        ),
        "ACL graphs (torch.npu.NPUGraph, torch.npu.graph) record every task on npu memory and replay it on the "
        "storages they captured: an in-place write is seen, a re-allocated tensor is not, and memory only the "
        "graph still holds fails the replay naming the tensor. The real vllm-ascend 0.18.0 engine at Trinity's "
        "rollout default (enforce_eager false: PIECEWISE graphs) runs on it, its worker in the engine's "
        "process (Trinity's at TP 1: each piece compiled by inductor) or in a process of its own (vLLM's mp "
        "executor; Trinity's TP 2 Ray workers alike), which compiles each piece with torchair's npugraph_ex "
        "as vllm-ascend configures it (reduce-overhead, run eagerly: the ACL graphs are vLLM's wrapper's). "
        "Trinity 0.5.2's whole GRPO run with the bundled config, the rollout at Trinity's defaults, runs so to "
        "the end: AsyncLLM's engine core compiles through npugraph_ex, captures 19 sizes of PIECEWISE graphs "
        "and replays them through three syncs. The real vllm-ascend 0.23.0.post1 engine at the same default "
        "captures PIECEWISE graphs and FULL decode graphs, whose attention layers are ACL task groups given each "
        "step's lengths by task updates behind ExternalEvents; Trinity 0.6.0's whole run in graph mode syncs "
        "through vLLM's weight-transfer API (start/update/finish_weight_update, vLLM's layerwise reload)",
        "Trinity 0.5.2's own sync (model.load_weights) writes every parameter of a dense Qwen2 in place: 0 of 9 "
        "storages move and the graphs generate the new weights' tokens. A reload that re-allocates the "
        "parameters leaves the graphs on the old memory: stale tokens (the decoder on the old weights, the tied "
        "output layer on the new), or a replay error once the old memory is freed. 0.23.0.post1's update (vLLM's "
        "layerwise reload) copies every parameter and buffer back into its storage, and builds anew the "
        "tensors a layer derives and holds as plain attributes: vLLM's attention q/k/v_range constants in a "
        "dense model, vllm-ascend's quantized scales (docs/findings/reload-storages.md). So Trinity 0.6.0's "
        "graph-mode run of a dense model without npu-compat's guard stays fresh: every parameter and buffer at "
        "its address after each of its three syncs, the digests equal, no replay of freed memory; over three train "
        "steps its greedy evaluation after each sync generates what an eager engine on the trainer's checkpoint "
        "of that version generates",
        "every parameter and buffer, and every tensor a layer derived and holds as a plain attribute, keeps its "
        "storage across the sync (moved ones copied back and re-bound): "
        "after the same re-allocating reload 0 storages moved and the tokens equal transformers' on the new "
        "weights; a tensor whose shape changed fails the sync by name instead of generating stale tokens. The "
        "same around 0.23.0.post1's NPUWorker weight update (Trinity 0.6.0), which logs which tensors moved; "
        "its whole run in graph mode syncs three times over the release's HCCL engine, each with the "
        "trainer's and the rollout's digests equal. Over three train steps whose rewards tell the responses "
        "apart, the rollout's greedy evaluation after each sync generates, in graph mode, the tokens of an eager "
        "engine loaded with the trainer's checkpoint of that weight version, and those tokens change from "
        "version to version; the same over Trinity's checkpoint sync",
        PATCHED,
        "trinity.vllm_worker.graph_safe_sync, vllm_ascend.worker.weight_update_graph_safe",
        (
            "tests/sim/test_real_vllm_ascend.py::test_acl_graphs_replay_what_they_captured_across_weight_syncs",
            "tests/sim/test_real_vllm_ascend.py::test_a_weight_update_leaves_every_tensor_in_its_storage",
            "tests/e2e/test_trinity_run.py::test_compat_runs_in_graph_mode_on_the_real_vllm_ascend",
            "tests/e2e/test_trinity_run.py::test_without_npu_compats_sync_guard_the_dense_run_in_graph_mode_stays_fresh",
            "tests/e2e/test_trinity_run.py::test_in_graph_mode_the_rollout_generates_after_each_sync_what_an_eager_engine_on_the_trainers_weights_does",
            "tests/sim/test_npu_graphs.py::test_a_replay_reads_the_memory_it_captured",
            "tests/sim/test_npu_graphs.py::test_npu_compats_sync_keeps_every_storage_the_graphs_read",
        ),
    ),
    Row(
        "F2",
        "FRACTAL_NZ weights and RL weight updates",
        (
            Source(
                "vllm-project/vllm-ascend#5747",
                "with NZ, a weight sync in verl updated the parameter but not a tensor derived from it: garbled "
                "rollouts (fixed by vllm-project/vllm-ascend#4939)",
            ),
            Source(
                "vllm-ascend 0.18.0 worker/worker.py, 0.23.0.post1 worker/worker.py",
                "NPUWorker.wake_up and start_weight_update refuse while VLLM_ASCEND_ENABLE_NZ is set (default 1): "
                "'FRACTAL_NZ mode is enabled ... Please set VLLM_ASCEND_ENABLE_NZ=0'",
            ),
        ),
        "the releases' own NZ gate, read by their NPUWorker: 0.18.0's wake_up and 0.23.0.post1's "
        "start_weight_update refuse at the default",
        "Trinity 0.6.0's first weight update (vLLM's start_weight_update on the NPUWorker) stops: ValueError: "
        "FRACTAL_NZ mode is enabled. Trinity 0.5.2 loads through model.load_weights, which the gate does not "
        "guard, and vllm-ascend 0.18.0 casts only quantized weights to NZ at the default 1",
        "the rollout engine's processes get VLLM_ASCEND_ENABLE_NZ=0 unless the user set it, as verl's vLLM "
        "rollout does on NPU; the update lands",
        PATCHED,
        "trinity.vllm_model.weights_not_nz",
        (
            "tests/catalogue/test_catalogue.py::test_red[N1]",
            "tests/catalogue/test_catalogue.py::test_green[N1]",
            "tests/sim/test_real_vllm_ascend.py::"
            "test_sleep_mode_frees_the_device_and_level_2_without_a_reload_generates_garbage",
        ),
    ),
    Row(
        "F3",
        "Sleep level 2 woken without a reload generates garbage",
        (
            Source("vllm-project/vllm#29341", "sleep level 2 then wake without reload_weights: gibberish"),
            Source(
                "vllm-project/vllm-ascend#13012",
                "level 2 discards the weights; on Ascend the reload after wake needs the original Parameters",
            ),
        ),
        "vllm-ascend's camem allocator through the simulated vllm_ascend_C: level 1 offloads the weights and "
        "maps them back at the same address, level 2 unmaps them and a wake maps fresh pages there",
        "not reached: Trinity 0.5.2 and 0.6.0 never put their rollout engine to sleep (vLLMRolloutModel.sleep "
        "exists; nothing in Trinity calls it). Called by hand at level 2 without a reload, the engine generates "
        "other tokens than before",
        "nothing to patch: a caller of sleep(level=2) reloads the weights after the wake",
        NOT_REACHED,
        "",
        (
            "tests/sim/test_real_vllm_ascend.py::"
            "test_sleep_mode_frees_the_device_and_level_2_without_a_reload_generates_garbage",
        ),
    ),
    Row(
        "F4",
        "Expandable segments and the sleep-mode memory pool",
        (
            Source(
                "modelscope/ms-swift#6636", "vllm-ascend's sleep mode cannot run with expandable segments on"
            ),
            Source(
                "vllm-ascend 0.18.0 device_allocator/camem.py",
                "CaMemAllocator asserts 'Expandable segments are not compatible with memory pool' when "
                "PYTORCH_NPU_ALLOC_CONF holds expandable_segments:True",
            ),
        ),
        "the real 0.18.0 CaMemAllocator on the simulated device; vllm-ascend's own platform sets "
        "expandable_segments:True for an engine without sleep mode, and a user's environment often carries it",
        "not reached: Trinity 0.5.2 and 0.6.0 never build their rollout engine with sleep mode. An engine "
        "built with it (verl's rollout, a user's own) stops: AssertionError: Expandable segments are not "
        "compatible with memory pool",
        "nothing to patch in Trinity: an engine with sleep mode needs PYTORCH_NPU_ALLOC_CONF without "
        "expandable_segments:True in its processes",
        NOT_REACHED,
        "",
        (
            "tests/sim/test_real_vllm_ascend.py::"
            "test_sleep_mode_frees_the_device_and_level_2_without_a_reload_generates_garbage",
        ),
    ),
    Row(
        "F5",
        "Processes on one NPU or host bind the same HCCL ports",
        (
            Source(
                "CANN 8.5 environment variable reference, HCCL_HOST_SOCKET_PORT_RANGE",
                "processes sharing one NPU should set it, or may fail on port conflicts; it takes ports and "
                "non-overlapping first-last ranges separated by commas, or auto (the OS picks)",
            ),
            Source(
                "alibaba/ROLL#421",
                "colocate mode (train, infer and reference on the same NPUs) fails to bind; fixed by "
                "HCCL_HOST_SOCKET_PORT_RANGE=auto and HCCL_NPU_SOCKET_PORT_RANGE=auto",
            ),
            Source(
                "vllm-project/vllm-ascend#405",
                "a second program with its own tensor-parallel engine on the host: EJ0003, host NIC listen on "
                "port 60000 fails, the IP address and port have been bound already",
            ),
            Source(
                "InternLM/lmdeploy#4722", "two tensor-parallel groups initialising HCCL on one NPU: EJ0003"
            ),
            Source(
                "vllm-project/vllm-ascend#16205",
                "jobs sharing a NIC collide on HCCL's default ports 60000+; each sets its own HCCL_IF_BASE_PORT",
            ),
        ),
        "not modelled: the simulated HCCL opens no sockets, and the sources do not say which default port "
        "each communicator takes, so nothing here would bind one; doctor reads the settings as a real host has them",
        "Trinity's colocate mode puts the trainer and the rollout engine on one NPU, and each builds HCCL "
        "communicators (FSDP's groups, the rollout's tensor-parallel group, the weight-sync group): with HCCL's "
        "default ports the second fails to bind",
        "doctor names it on an NPU host where neither port range nor HCCL_IF_BASE_PORT is set, with the fix "
        "(both ranges auto before ray start, which every Ray worker inherits), and refuses a malformed range",
        DOCTOR,
        "doctor: HCCL socket ports",
        (
            "tests/seams/test_doctor.py::"
            "test_hccls_connect_timeout_and_socket_ports_unset_are_notes_on_npu_and_quiet_once_set",
            "tests/seams/test_doctor.py::test_what_would_break_a_run_exits_1_with_the_fix",
        ),
    ),
    Row(
        "F6",
        "Peers of an HCCL group that join more than HCCL_CONNECT_TIMEOUT apart",
        (
            Source(
                "modelscope/ms-swift#8281",
                "HCCL_CONNECT_TIMEOUT bounds socket set-up before a collective group is built: default 120 s, "
                "valid 120-7200; rank skew at start-up then surfaces as HCCL timeouts, where NCCL waits 10 minutes",
            ),
            Source(
                "vllm-project/vllm-ascend#486",
                "GRPO with vLLM inference colocated: EI0006, getting socket times out, remote rank did not "
                "send in time",
            ),
            Source(
                "vllm-project/afd-plugin#229",
                "EI0006 between separately started roles; HCCL_CONNECT_TIMEOUT=900 mitigates",
            ),
        ),
        "partly modelled: the simulated libhccl.so (vllm-ascend's PyHcclCommunicator, under the HCCL weight-"
        "transfer engine) waits HCCL_CONNECT_TIMEOUT for a group's ranks, then fails with HCCL_E_TIMEOUT and "
        "EI0006 (a beyond_ci test: 120 s is CANN's floor); the simulated hccl process group of torch.distributed "
        "still builds through torch's store with the caller's timeout, as gloo does",
        "Trinity's weight-sync group is joined by the trainer and by every rollout engine, each once its "
        "model has loaded: more than 120 s apart on a real host, the first to arrive fails with EI0006",
        "doctor names it on an NPU host where HCCL_CONNECT_TIMEOUT is unset, with the fix (seconds from 120 "
        "to 7200 before ray start), and refuses a value outside that range",
        DOCTOR,
        "doctor: HCCL_CONNECT_TIMEOUT",
        (
            "tests/seams/test_doctor.py::"
            "test_hccls_connect_timeout_and_socket_ports_unset_are_notes_on_npu_and_quiet_once_set",
            "tests/seams/test_doctor.py::test_what_would_break_a_run_exits_1_with_the_fix",
            "tests/sim/test_real_pyhccl.py::test_a_rank_that_never_joins_fails_after_hccl_connect_timeout",
        ),
    ),
    Row(
        "F7",
        "Ray leaves the visible NPUs alone, and a worker takes Ray's physical NPU id as its device index",
        (
            Source(
                "verl-project/verl#7507",
                "with RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES and ASCEND_RT_VISIBLE_DEVICES=4,5,6,7, "
                "Ray reports physical id 5 and torch_npu.set_device(5) raises Invalid device ID",
            ),
            Source(
                "verl 0.7.1 and 0.8.0 single_controller/base/worker.py",
                "Worker._setup_env_cuda_visible_devices: when a NOSET variable is set, LOCAL_RANK is Ray's "
                "accelerator id and set_device(int(local_rank)) is called with it",
            ),
            Source(
                "ray-project/ray#59163",
                "ray job submit set NOSET for CUDA but not for Ascend: the NPU visibility of a job's driver",
            ),
        ),
        "not modelled yet: the simulated cluster does not run verl's worker with the variable set; doctor "
        "reads the two settings as a real host has them",
        "Trinity's trainer runs on verl's workers (both releases): with the variable set and the visible "
        "NPUs not numbered from 0, each worker asks torch_npu for a device index the runtime does not have",
        "doctor makes it an error on an NPU host, naming verl's method and the fix (unset the variable, or "
        "number the visible NPUs from 0); quiet where Ray's ids are the device indices",
        DOCTOR,
        "doctor: RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
        (
            "tests/seams/test_doctor.py::test_what_would_break_a_run_exits_1_with_the_fix",
            "tests/seams/test_doctor.py::"
            "test_ray_leaving_the_visible_devices_alone_is_fine_where_they_are_numbered_from_0",
        ),
    ),
    Row(
        "F8",
        "Expandable segments with max_split_size_mb or garbage_collection_threshold in PYTORCH_NPU_ALLOC_CONF",
        (
            Source(
                "Ascend/pytorch torch_npu/csrc/core/npu/NPUCachingAllocator.cpp",
                "CachingAllocatorConfig::parseArgs (6.0.0 on; NPUAllocatorConfig.cpp in newer branches) reads "
                "every pair, then TORCH_CHECKs: max_split_size_mb or garbage_collection_threshold cannot be "
                "enabled with expandable_segments; expandable_segments takes True or False only",
            ),
            Source(
                "Ascend/pytorch docs/zh/environment_variable_reference/PYTORCH_NPU_ALLOC_CONF.md",
                "where max_split_size_mb or garbage_collection_threshold is not its default, "
                "expandable_segments must be False",
            ),
            Source(
                "vllm-project/vllm-ascend#5855",
                "vllm-ascend (0.14.0rc1 on) appends expandable_segments:True to PYTORCH_NPU_ALLOC_CONF for an "
                "engine without sleep mode, unless it already holds expandable_segments, max_split_size_mb "
                "or garbage_collection_threshold",
            ),
            Source(
                "vllm-project/vllm-ascend#4246",
                "max_split_size_mb:256 ran out of memory; expandable_segments:True was suggested instead",
            ),
        ),
        "not modelled: the simulated allocator does not read PYTORCH_NPU_ALLOC_CONF; doctor applies torch_npu's "
        "rule as its source gives it (the error's moment, the allocator's first read, is from the code, not a "
        "run)",
        "a user who adds expandable_segments:True to an environment that already sets max_split_size_mb (or "
        "the reverse, for fragmentation) gets a RuntimeError in every trainer and rollout process at its "
        "first NPU allocation",
        "doctor makes it an error on an NPU host, in torch_npu's words, with the fix; a lowercase true is an "
        "error too, as torch_npu refuses it",
        DOCTOR,
        "doctor: PYTORCH_NPU_ALLOC_CONF",
        ("tests/seams/test_doctor.py::test_what_would_break_a_run_exits_1_with_the_fix",),
    ),
    Row(
        "F9",
        "Ray shows a worker its NPUs in the order it assigned them, and CANN sees none",
        (
            Source(
                "agentscope-ai/Trinity-RFT#618",
                "CANN requires the ids in ASCEND_RT_VISIBLE_DEVICES in strictly ascending order; with 1,0 "
                "torch.npu.is_available() silently returns False and Trinity picks its GPU worker class",
            ),
            Source(
                "gpustack/gpustack#2527",
                "vLLM's NPU workers fail in aclrtGetDeviceCount (207004): EE1001, set "
                "ASCEND_RT_VISIBLE_DEVICES:0,2,4,6,1,3,5,7 error, it must be configured in ascending order",
            ),
            Source(
                "ray 2.x _private/accelerators/npu.py",
                "NPUAcceleratorManager.set_current_process_visible_accelerator_ids joins the worker's NPU ids "
                "in the order given, unsorted",
            ),
        ),
        "torch_npu's count of the visible devices (ids that do not ascend show none), applied by the simulated "
        "runtime at a process's first device use; Ray's own function sets the variable",
        "Trinity 0.6.0's TP 2 rollout on the real vllm-ascend 0.23.0.post1: Ray gives the rollout actor NPUs "
        "2,1, vLLM's multiprocess workers inherit them, and each worker's NPUWorker fails at set_device "
        "(invalid device 0): the engine never starts",
        "Ray's function sets the ids ascending (1,2) in every worker; the TP 2 rollout starts and the run "
        "goes to the end",
        PATCHED,
        "ray.npu.visible_devices_ascending",
        (
            "tests/patches/test_ray.py::test_ray_shows_a_worker_its_npus_in_ascending_order",
            "tests/e2e/test_trinity_run.py::test_compat_runs_on_the_real_vllm_ascend_with_an_eager_tp2_rollout",
        ),
    ),
)
