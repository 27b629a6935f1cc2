// The Python module of the simulated npu backend, and its hccl: a c10d backend
// that runs a Gloo backend on CPU tensors aliasing the npu tensors' memory.
#include "npu_backend.h"
#include "device_memory_api.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <map>
#include <mutex>

namespace npu_sim {
namespace {

std::vector<at::Tensor> host(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) {
    out.push_back(t.defined() && t.device().type() == kNpu ? cpu_alias(t) : t);
  }
  return out;
}

std::vector<std::vector<at::Tensor>> host(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(lists.size());
  for (const auto& l : lists) {
    out.push_back(host(l));
  }
  return out;
}

at::Tensor host(const at::Tensor& t) {
  return t.defined() && t.device().type() == kNpu ? cpu_alias(t) : t;
}

std::mutex g_collectives_mutex;
std::map<std::string, int64_t> g_collectives;

// Counts a collective this process ran over hccl, by its c10d name (read with collective_counts).
void count(const char* op) {
  std::lock_guard<std::mutex> lock(g_collectives_mutex);
  ++g_collectives[op];
}

// Every collective of the wrapped (Gloo) backend, on host aliases of npu tensors: the
// results land in the npu tensors' memory, and async work handles are Gloo's own.
class HostAliasBackend final : public c10d::Backend {
 public:
  explicit HostAliasBackend(c10::intrusive_ptr<c10d::Backend> inner)
      : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)) {}

  const std::string getBackendName() const override {
    return "hccl";
  }
  bool supportsCoalescing() const override {
    return inner_->supportsCoalescing();
  }
  void setTimeout(std::chrono::milliseconds timeout) override {
    inner_->setTimeout(timeout);
  }
  void startCoalescing() override {
    inner_->startCoalescing();
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    return inner_->endCoalescing();
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) override {
    count("broadcast");
    auto h = host(t);
    return inner_->broadcast(h, o);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) override {
    count("allreduce");
    auto h = host(t);
    return inner_->allreduce(h, o);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& t, const c10d::AllreduceCoalescedOptions& o) override {
    count("allreduce_coalesced");
    auto h = host(t);
    return inner_->allreduce_coalesced(h, o);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) override {
    count("reduce");
    auto h = host(t);
    return inner_->reduce(h, o);
  }
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
      const c10d::AllgatherOptions& o) override {
    count("allgather");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->allgather(ho, hi, o);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) override {
    count("_allgather_base");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->_allgather_base(ho, hi, o);
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
      const c10d::AllgatherOptions& o) override {
    count("allgather_coalesced");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->allgather_coalesced(ho, hi, o);
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& out, std::vector<at::Tensor>& in, const c10d::AllgatherOptions& o) override {
    count("allgather_into_tensor_coalesced");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->allgather_into_tensor_coalesced(ho, hi, o);
  }
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
      const c10d::GatherOptions& o) override {
    count("gather");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->gather(ho, hi, o);
  }
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
      const c10d::ScatterOptions& o) override {
    count("scatter");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->scatter(ho, hi, o);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
      const c10d::ReduceScatterOptions& o) override {
    count("reduce_scatter");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->reduce_scatter(ho, hi, o);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& o) override {
    count("_reduce_scatter_base");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->_reduce_scatter_base(ho, hi, o);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& out, std::vector<at::Tensor>& in, const c10d::ReduceScatterOptions& o) override {
    count("reduce_scatter_tensor_coalesced");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->reduce_scatter_tensor_coalesced(ho, hi, o);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits, std::vector<int64_t>& in_splits,
      const c10d::AllToAllOptions& o) override {
    count("alltoall_base");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->alltoall_base(ho, hi, out_splits, in_splits, o);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& out, std::vector<at::Tensor>& in, const c10d::AllToAllOptions& o) override {
    count("alltoall");
    auto ho = host(out);
    auto hi = host(in);
    return inner_->alltoall(ho, hi, o);
  }
  void monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all_ranks) override {
    inner_->monitoredBarrier(o, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override {
    inner_->setSequenceNumberForGroup();
  }
  uint64_t getSequenceNumberForGroup() override {
    return inner_->getSequenceNumberForGroup();
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int dst, int tag) override {
    count("send");
    auto h = host(t);
    return inner_->send(h, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int src, int tag) override {
    count("recv");
    auto h = host(t);
    return inner_->recv(h, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& t, int tag) override {
    count("recvAnysource");
    auto h = host(t);
    return inner_->recvAnysource(h, tag);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override {
    count("barrier");
    return inner_->barrier(o);
  }
  void waitForPendingWorks() override {
    inner_->waitForPendingWorks();
  }
  void abort() override {
    inner_->abort();
  }
  void shutdown() override {
    inner_->shutdown();
  }

 private:
  c10::intrusive_ptr<c10d::Backend> inner_;
};

pybind11::dict stats_dict(int device) {
  namespace py = pybind11;
  const auto s = memory_stats(static_cast<c10::DeviceIndex>(device));
  py::dict d;
  d["allocated_bytes.all.current"] = s.allocated;
  d["allocated_bytes.all.peak"] = s.peak;
  d["reserved_bytes.all.current"] = s.allocated;
  d["reserved_bytes.all.peak"] = s.peak;
  d["active_bytes.all.current"] = s.allocated;
  d["active_bytes.all.peak"] = s.peak;
  d["allocation.all.current"] = s.allocations;
  d["allocation.all.allocated"] = s.total_allocations;
  d["num_ooms"] = s.ooms;
  return d;
}

// torch's autograd engine runs the nodes of an npu graph on a worker thread per device index.
// The worker drops its reference to a finished graph task only after it has woken the caller,
// and since torch 2.13 that task holds a Python object: the contextvars Context that
// torch.autograd.graph._engine_run_backward stashes in the thread-local state it snapshots.
// When the worker holds the last reference, dropping it takes the GIL.  If the interpreter is
// finalizing by then, Python ends the worker with pthread_exit inside a noexcept frame and the
// process aborts at exit ("terminate called without an active exception"); a loaded machine
// makes that likely.  A small graph run from C++ on each device, with no Python object in it,
// queues behind whatever that device's worker still holds: when it returns, the worker has let
// go.  Called at exit, before finalization; a device that cannot run it (at its capacity, say) is
// skipped, as there is nothing left to do about it then.
void drain_autograd_workers() {
  pybind11::gil_scoped_release no_gil;  // the worker may be waiting for the GIL to drop its task
  c10::InferenceMode not_inference(false);
  c10::AutoGradMode grad_on(true);
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
    try {
      auto x = at::ones({1}, at::TensorOptions().device(kNpu, d)).requires_grad_(true);
      torch::autograd::grad({(x * 2).sum()}, {x});
    } catch (const std::exception&) {
    }
  }
}

// How many per-device ready queues (one worker thread each) torch's autograd engine made.  The
// engine sizes them once, at the first backward of the process, from the device count of every
// backend registered by then: a backward on CPU before the simulation was entered leaves none for
// npu, and a backward on npu:N then fails torch's INTERNAL ASSERT on device_ready_queues_.size().
// Read only (torch keeps the vector unchanged after that first backward), through the member
// pointer a subclass may name; 0 also before the first backward.
struct EngineQueues : torch::autograd::Engine {
  static size_t count(torch::autograd::Engine& engine) {
    return (engine.*(&EngineQueues::device_ready_queues_)).size();
  }
};

int autograd_device_queues() {
  return static_cast<int>(EngineQueues::count(torch::autograd::Engine::get_default_engine()));
}

}  // namespace
}  // namespace npu_sim

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using namespace npu_sim;
  m.doc() = "The simulated Ascend's npu device: tensors in host memory (npu_compat.testing).";
  m.def("set_physical_count", &set_physical_count);
  m.def("physical_count", &physical_count);
  m.def("devices_counted", &devices_counted);
  m.def("device_count", [] { return static_cast<int>(device_count()); },
        "The NPUs this process sees; counted at the first call (the device's first use), then fixed.");
  m.def("visible_count", [](const py::object& visible, int physical) {
    if (visible.is_none()) {
      return visible_count(nullptr, physical);
    }
    const auto text = visible.cast<std::string>();
    return visible_count(text.c_str(), physical);
  }, "How many NPUs ASCEND_RT_VISIBLE_DEVICES=visible (None: unset) shows on a host with `physical`.");
  m.def("current_device", [] { return static_cast<int>(current_device()); });
  m.def("set_device", [](int d) { set_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("device_memory_api", [] {
    return py::capsule(
        const_cast<void*>(static_cast<const void*>(device_memory_api())), NPU_SIM_DEVICE_MEMORY_CAPSULE);
  }, "The runtime's virtual-memory calls (device_memory_api.h), for the vllm_ascend_C stand-in.");
  m.def("custom_allocator", &custom_allocator, "A pluggable allocator from its two functions' addresses: its id.");
  m.def("create_pool", &create_pool, "A memory pool over a pluggable allocator (-1: the backend's own): its id.");
  m.def("pool_use_count", &pool_use_count);
  m.def("begin_allocate_to_pool", [](int d, int64_t pool) {
    begin_allocate_to_pool(static_cast<c10::DeviceIndex>(d), pool);
  });
  m.def("end_allocate_to_pool", [](int d, int64_t pool) {
    end_allocate_to_pool(static_cast<c10::DeviceIndex>(d), pool);
  });
  m.def("release_pool", [](int d, int64_t pool) { release_pool(static_cast<c10::DeviceIndex>(d), pool); });
  m.def("capacity", &capacity);
  m.def("set_capacity", &set_capacity);
  m.def("set_memory_fraction", [](int d, double f) { set_memory_fraction(static_cast<c10::DeviceIndex>(d), f); });
  m.def("memory_allocated", [](int d) { return memory_stats(static_cast<c10::DeviceIndex>(d)).allocated; });
  m.def("max_memory_allocated", [](int d) { return memory_stats(static_cast<c10::DeviceIndex>(d)).peak; });
  m.def("reset_peak_memory_stats", [](int d) { reset_peak(static_cast<c10::DeviceIndex>(d)); });
  m.def("memory_stats", &stats_dict);
  m.def("default_generator", [](int d) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(d))));
  });
  m.def("host_alias", &cpu_alias, "A CPU tensor over the same memory as an npu tensor.");
  m.def("set_fallback_counting", &set_fallback_counting);
  m.def("fallback_counts", &fallback_counts);
  m.def("drain_autograd_workers", &drain_autograd_workers,
        "Let each npu device's autograd worker drop its last graph task (at exit, before finalization).");
  m.def("autograd_device_queues", &autograd_device_queues,
        "How many per-device worker queues torch's autograd engine made (0 before its first backward).");
  m.def("collective_counts", [] {
    std::lock_guard<std::mutex> lock(g_collectives_mutex);
    return std::vector<std::pair<std::string, int64_t>>(g_collectives.begin(), g_collectives.end());
  }, "How many of each collective this process ran over hccl, by its c10d name.");
  m.def("hccl_backend", [](const c10::intrusive_ptr<c10d::Backend>& gloo) -> c10::intrusive_ptr<c10d::Backend> {
    return c10::make_intrusive<HostAliasBackend>(gloo);
  });
}
