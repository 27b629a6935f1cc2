"""ACL graphs on the simulated Ascend: what a replay reads, as on the device.

A graph is captured with ``torch.npu.graph`` (torch_npu's API, as vllm-ascend's ``ACLGraphWrapper`` uses it)
in a fresh simulated-Ascend interpreter, then replayed after the ways an RL framework updates weights: in
place, by re-allocating while the old memory is still held, and by re-allocating and dropping it.
"""

from __future__ import annotations

from tests.sim.npu_backend import needs_backend, sim_json

pytestmark = needs_backend

LINEAR = """
import json, torch, torch_npu
from npu_compat.testing._npu_graphs import GraphReplayError
torch.manual_seed(0)
lin = torch.nn.Linear(4, 3).to("npu:0")
x = torch.randn(2, 4, device="npu:0")
out = {}
g = torch.npu.NPUGraph()
with torch.inference_mode():
    with torch.npu.graph(g):
        out["capturing"] = torch.npu.is_current_stream_capturing()
        y = torch.relu(lin(x)) * 2
    out["after"] = torch.npu.is_current_stream_capturing()
    eager = lambda: (torch.relu(lin(x)) * 2).tolist()
    x.copy_(torch.randn(2, 4))                      # the runner fills its static input buffer
    g.replay()
    out["new_input"] = y.tolist() == eager()
    lin.weight.copy_(torch.randn(3, 4))              # a sync in place: the same memory
    g.replay()
    out["in_place"] = y.tolist() == eager()
    old = lin.weight.data
    lin.weight.data = torch.randn(3, 4, device="npu:0")   # a sync that re-allocates; the old memory still held
    g.replay()
    out["reallocated_seen"] = y.tolist() == eager()
    out["reads_the_old"] = y.tolist() == (torch.relu(x @ old.T + lin.bias) * 2).tolist()
    del old                                          # now only the graph holds it
    try:
        g.replay()
        out["freed"] = "replayed"
    except GraphReplayError as e:
        out["freed"] = str(e)
    out["is_runtime_error"] = issubclass(GraphReplayError, RuntimeError)
print(json.dumps(out))
"""


def test_a_replay_reads_the_memory_it_captured() -> None:
    out = sim_json(LINEAR, devices=1)
    assert out["capturing"] and not out["after"]
    assert out["new_input"] and out["in_place"]
    assert not out["reallocated_seen"] and out["reads_the_old"]
    assert out["freed"].startswith(
        "simulated npu: ACL graph replay reads memory that only the graph still holds -- "
        "argument 1 of aten.linear.default: a Parameter float32[3, 4] at 0x"
    )
    assert out["is_runtime_error"]


KERNELS_AND_VIEWS = """
import json, torch, torch_npu
torch.manual_seed(0)
out = {}
with torch.inference_mode():
    x = torch.randn(6, 16, device="npu:0")
    w = torch.randn(16, device="npu:0")
    cache = torch.zeros(4, 16, device="npu:0")
    slots = torch.tensor([0, 2], device="npu:0")

    def step():
        y = torch_npu.npu_rms_norm(x, w)[0]      # a torch.library kernel, one task
        cache.index_copy_(0, slots, y[:2])        # in place, on a view of a result
        return torch_npu.npu_swiglu(y.view(6, 2, 8), -1).sum(-1), cache

    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        captured, _ = step()
    out["tasks"] = g.captured_tasks()
    x.copy_(torch.randn(6, 16))
    w.mul_(3)
    cache.zero_()
    g.replay()
    graph_out, graph_cache = captured.clone(), cache.clone()
    cache.zero_()
    want, want_cache = step()
    out["equal"] = torch.equal(graph_out, want) and torch.equal(graph_cache, want_cache)
    g2 = torch.npu.NPUGraph()
    with torch.npu.graph(g2):
        torch.ones(3) * 2
    out["cpu_only_is_not_captured"] = g2.captured_tasks() == 0
print(json.dumps(out))
"""


def test_replay_reruns_kernels_in_place_updates_and_views_in_order() -> None:
    out = sim_json(KERNELS_AND_VIEWS, devices=1)
    assert out["tasks"] >= 4
    assert out["equal"]
    assert out["cpu_only_is_not_captured"]


GUARDED_SYNC = """
import json, torch, torch_npu
from npu_compat.patches.trinity_vllm import GraphUnsafeSync, keep_storages
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)).to("npu:0")
model.register_buffer("scale", torch.full((3,), 2.0, device="npu:0"))
x = torch.randn(2, 4, device="npu:0")
out = {}

def reallocating_sync(weights, held):
    # a loader that re-allocates before it loads: ``layer.weight.data = f(layer.weight.data)`` (vllm-ascend's
    # ``.contiguous()`` and ``npu_format_cast`` reassignments), a new Parameter object, a new buffer
    for p in model.parameters():
        held.append(p.data)
        p.data = p.data.clone()
    held.append(model[0].bias)
    model[0].bias = torch.nn.Parameter(model[0].bias.data.clone())
    held.append(model.scale)
    model.scale = model.scale.clone()
    model.load_state_dict(weights)
    return "loaded"

def new_weights():
    return {k: torch.randn(v.shape) for k, v in model.state_dict().items()}

with torch.inference_mode():
    ptrs = {k: v.untyped_storage().data_ptr() for k, v in model.state_dict().items()}
    bias = model[0].bias
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        y = model(x) * model.scale
    eager = lambda: (model(x) * model.scale).tolist()
    result, checked, restored = keep_storages(model, lambda: reallocating_sync(new_weights(), []), graphs=True)
    out["guarded"] = {"result": result, "checked": checked, "restored": restored,
                      "same_storages": ptrs == {k: v.untyped_storage().data_ptr() for k, v in model.state_dict().items()},
                      "same_parameter": model[0].bias is bias}
    g.replay()
    out["guarded"]["replay_is_new_weights"] = y.tolist() == eager()
    lin = model[0]
    captured = lin.weight.data
    reshape = lambda: setattr(lin.weight, "data", lin.weight.data.t().contiguous())
    try:
        keep_storages(model, reshape, graphs=True)
    except GraphUnsafeSync as e:
        out["reshaped"] = str(e)
    lin.weight.data = captured
    out["reshaped_eager"] = keep_storages(model, reshape, graphs=False)[1:]
    lin.weight.data = captured
    held = []
    reallocating_sync(new_weights(), held)       # stock: the same sync without npu-compat
    g.replay()
    out["stock_replay_is_new_weights"] = y.tolist() == eager()
print(json.dumps(out))
"""


def test_npu_compats_sync_keeps_every_storage_the_graphs_read() -> None:
    """npu-compat's sync guard (``trinity.vllm_worker.graph_safe_sync``): a sync that re-allocates parameters,
    replaces a Parameter object and a buffer, then loads, leaves every tensor in the storage it had; the replay
    then computes the new weights, where the same sync without it replays the old ones.  A tensor whose shape
    changed cannot be kept: with graphs the sync fails naming it; eager, it passes."""
    out = sim_json(GUARDED_SYNC, devices=1)
    assert out["guarded"] == {
        "result": "loaded", "checked": 5, "restored": 5, "same_storages": True, "same_parameter": True,
        "replay_is_new_weights": True,
    }  # fmt: skip
    assert out["reshaped"].startswith(
        "the weight sync re-allocated 1 tensor(s) the rollout's ACL graphs read, and npu-compat cannot put them "
        "back in place: 0.weight (torch.float32 [3, 4] -> torch.float32 [4, 3])."
    )
    assert out["reshaped_eager"] == [5, 0]
    assert out["stock_replay_is_new_weights"] is False


TASK_GROUPS = """
import json, torch, torch_npu
from npu_compat.testing._boundary import SimulatedComputeBoundary
torch.manual_seed(0)
dev = "npu:0"
x = torch.randn(4, device=dev)
y = torch.empty(4, device=dev)
two, three = torch.full((4,), 2.0, device=dev), torch.full((4,), 3.0, device=dev)
event = torch.npu.ExternalEvent()
out = {}
handles = []
# as vllm-ascend captures each attention layer of a FULL graph, inside vLLM's attention operator (a Python
# operator of vLLM's direct_register_custom_op, on the device's dispatch key)
lib = torch.library.Library("sim_test", "DEF")
lib.define("attention(Tensor x, Tensor(a!) y) -> ()")

def attention(x, y):
    stream = torch.npu.current_stream()
    event.wait(stream)
    event.reset(stream)
    torch.npu.graph_task_group_begin(stream)
    torch.mul(x, two, out=y)
    handles.append(torch.npu.graph_task_group_end(stream))

lib.impl("attention", attention, "PrivateUse1")
g = torch.npu.NPUGraph()
with torch.npu.graph(g):
    torch.ops.sim_test.attention(x, y)
    z = y + 1
handle = handles[0]
out["tasks"] = [t.name for t in g._recording.tasks]
update_stream = torch.npu.Stream()

def update(other, op=torch.mul):
    with torch.npu.stream(update_stream):
        torch.npu.graph_task_update_begin(update_stream, handle)
        op(x, other, out=y)
        torch.npu.graph_task_update_end(update_stream)
        event.record(update_stream)

def boundary(f):
    try:
        f()
        return "ran"
    except SimulatedComputeBoundary as e:
        return str(e)

x.copy_(torch.randn(4))
g.replay()                               # held at the event's wait: nothing after it has run yet
out["held_read"] = boundary(lambda: z.tolist())
out["held_sync"] = boundary(torch.npu.synchronize)
update(three)                            # the group's new arguments, then the event: the replay goes on
out["updated"] = z.tolist() == (x * 3 + 1).tolist()
x.copy_(torch.randn(4))
g.replay()
event.record(update_stream)              # no new arguments: the last update's stand
out["kept"] = z.tolist() == (x * 3 + 1).tolist()
g.replay()
try:
    update(two, op=torch.add)
except RuntimeError as e:
    out["mismatch"] = str(e)
update(two)
out["again"] = z.tolist() == (x * 2 + 1).tolist()
outside = torch.npu.ExternalEvent()
out["outside_wait"] = boundary(lambda: outside.wait(torch.npu.current_stream()))
print(json.dumps(out))
"""


def test_task_groups_take_new_arguments_while_the_replay_waits_on_its_event() -> None:
    """vllm-ascend's FULL graphs: each attention layer is captured behind an ``ExternalEvent``'s wait as a task
    group, replayed, then given the step's arguments from an update stream before its event is recorded."""
    out = sim_json(TASK_GROUPS, devices=1)
    # the operator's own tasks, in the order it issued them
    assert out["tasks"] == [
        "ExternalEvent.wait", "ExternalEvent.reset", "aten.mul.out", "aten.add.Tensor"
    ], out["tasks"]  # fmt: skip
    assert out["held_read"].startswith(
        "simulated Ascend: aten._to_copy.default issued behind a held ACL graph replay"
    )
    assert out["held_sync"].startswith(
        "simulated Ascend: torch.npu.synchronize() needs a real NPU (the replay waits"
    )
    assert out["updated"] and out["kept"] and out["again"]
    assert out["mismatch"] == (
        "simulated npu: graph_task_update_end: the update issued ['aten.add.out'] for a task group of "
        "['aten.mul.out']; an update gives each of the group's tasks, one for one, new arguments"
    )
    assert "ExternalEvent not yet recorded, outside a graph" in out["outside_wait"]


#: Two ranks capture the same graph around vLLM's tensor parallel reduce (``dist.all_reduce`` on the ``hccl``
#: group, as ``NPUCommunicator.all_reduce`` issues it) and the other collectives a TP model issues, then replay
#: it on new inputs.
COLLECTIVES = """
import datetime, json, sys
import torch, torch.distributed as dist, torch_npu
rank = int(sys.argv[1])
torch.npu.set_device(rank)
dist.init_process_group("hccl", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
x = torch.zeros(4, device="npu")
gathered = torch.empty(8, device="npu")
graph = torch.npu.NPUGraph()
with torch.npu.graph(graph):
    partial = x * (rank + 1)
    dist.all_reduce(partial)
    summed = partial + 1
    dist.all_gather_into_tensor(gathered, x + rank)
    functional = torch.ops._c10d_functional.all_reduce(x * (rank + 1), "sum", dist.group.WORLD.group_name)
    functional = torch.ops._c10d_functional.wait_tensor(functional) * 1
x.copy_(torch.arange(4.0, device="npu"))
graph.replay()
print(json.dumps({"summed": summed.cpu().tolist(), "gathered": gathered.cpu().tolist(),
                  "functional": functional.cpu().tolist()}))
dist.destroy_process_group()
"""


@needs_backend
def test_a_replay_runs_the_collectives_it_captured() -> None:
    """On the device an HCCL collective issued while a graph captures is one of its tasks, run again at each
    replay with every rank's replay (vLLM's TP reduce in its PIECEWISE and FULL graphs); a replay that skipped it
    would leave each rank with its own partial sums."""
    from tests.conftest import run_ranks
    from tests.sim.npu_backend import child_env

    outs = run_ranks(COLLECTIVES, child_env(), timeout=300)
    for out in outs:
        assert out["summed"] == [3 * i + 1 for i in range(4)]  # x * 1 + x * 2, then + 1
        assert out["gathered"] == [float(i) for i in range(4)] + [float(i + 1) for i in range(4)]
        assert out["functional"] == [3 * i for i in range(4)]  # torch's functional collectives alike


#: An in-place custom operator inside a compiled function, as vLLM's LoRA layers call punica's kernels: the
#: graph AOT autograd hands its compiler runs it through the higher-order operator ``auto_functionalized_v2``
#: (inductor would re-inplace it; vLLM's npugraph_ex and eager backends do not).  As vLLM does, the compiled
#: graph is called directly inside the capture, then replayed on a new input and new weights.
HIGHER_ORDER = """
import json, torch, torch_npu
from torch._dynamo.backends.common import aot_autograd

@torch.library.custom_op("npu_compat_test::add_product_", mutates_args=("y",))
def add_product_(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    y.add_(x @ w)

@add_product_.register_fake
def _(y, x, w):
    return None

def step(x, w):
    y = torch.zeros(x.shape[0], w.shape[1], device=x.device)
    add_product_(y, x, w)
    return y * 2

graphs = []
def keep(gm, example_inputs):
    graphs.append(gm)
    return gm

x = torch.randn(2, 4, device="npu:0")
w = torch.randn(4, 3, device="npu:0")
with torch.no_grad():
    torch.compile(step, backend=aot_autograd(fw_compiler=keep), fullgraph=True)(x, w)
    [graph] = graphs
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        [y] = graph(x, w)
    x.copy_(torch.randn(2, 4))
    w.copy_(torch.randn(4, 3))
    g.replay()
    print(json.dumps({"fresh": torch.allclose(y.cpu(), step(x, w).cpu()),
                      "higher_order": "auto_functionalized" in graph.code}))
"""


def test_a_higher_order_operator_in_a_compiled_graph_is_captured_and_replayed() -> None:
    """The simulation's capture once refused a higher-order operator ("no rule registered for
    HigherOrderOperator auto_functionalized_v2"), which Trinity's LoRA run in graph mode met; the device's
    capture records the kernels beneath it."""
    out = sim_json(HIGHER_ORDER, devices=1, timeout=300)
    assert out["higher_order"] and out["fresh"], out


#: Two attention layers, each a task group behind its own event, as a FULL graph of a two-layer model: the
#: replay is held at layer 0, goes on when the update stream records layer 0's event, and is held again at
#: layer 1 -- still on the stream it was issued on, while the host updates layer 1 from the update stream.
TWO_LAYERS = """
import json, torch, torch_npu
from npu_compat.testing._boundary import SimulatedComputeBoundary
dev = "npu:0"
x = torch.randn(4, device=dev)
y1 = torch.empty(4, device=dev); y2 = torch.empty(4, device=dev)
two, three = torch.full((4,), 2.0, device=dev), torch.full((4,), 3.0, device=dev)
events = [torch.npu.ExternalEvent(), torch.npu.ExternalEvent()]
handles = []
lib = torch.library.Library("sim_test2", "DEF")
lib.define("attention(Tensor x, Tensor(a!) y, int layer) -> ()")
def attention(x, y, layer):
    stream = torch.npu.current_stream()
    events[layer].wait(stream)
    events[layer].reset(stream)
    torch.npu.graph_task_group_begin(stream)
    torch.mul(x, two, out=y)
    handles.append(torch.npu.graph_task_group_end(stream))
lib.impl("attention", attention, "PrivateUse1")
g = torch.npu.NPUGraph()
with torch.npu.graph(g):
    torch.ops.sim_test2.attention(x, y1, 0)
    h = y1 + 1
    torch.ops.sim_test2.attention(h, y2, 1)
    z = y2 + 1
update_stream = torch.npu.Stream()
out = {}
try:
    x.copy_(torch.randn(4))
    g.replay()
    with torch.npu.stream(update_stream):
        for layer, (src, dst) in enumerate(((x, y1), (h, y2))):
            torch.npu.graph_task_update_begin(update_stream, handles[layer])
            torch.mul(src, three, out=dst)
            torch.npu.graph_task_update_end(update_stream)
            events[layer].record(update_stream)
    out["ok"] = z.tolist() == (((x * 3) + 1) * 3 + 1).tolist()
except SimulatedComputeBoundary as e:
    out["boundary"] = str(e)[:200]
print(json.dumps(out))
"""


def test_a_replay_held_again_at_the_next_layer_still_holds_its_own_stream() -> None:
    """A held replay was once taken to block the stream that was current when it went on (the update
    stream): the next layer's update then stopped as "issued behind a held ACL graph replay" (Trinity's
    GRPO run on a two-layer Llama in graph mode)."""
    out = sim_json(TWO_LAYERS, devices=1)
    assert out == {"ok": True}, out
