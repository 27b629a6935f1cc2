// Devices, the device guard, memory, pinned memory, generators and the
// PrivateUse1 hooks of the simulated npu backend.
#include "npu_backend.h"
#include "device_memory_api.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace npu_sim {

// ---------------------------------------------------------------- devices

// The host's NPUs (what the driver's drvGetDevNum reports), and this process's visible ones:
// counted once, at the first use of a device, from ASCEND_RT_VISIBLE_DEVICES as the runtime reads
// it then -- not at start-up, so a launcher may still set the variable after `import torch`.
static std::atomic<int> g_physical_count{2};
static std::atomic<int> g_device_count{-1};
static std::mutex g_count_mutex;
static thread_local c10::DeviceIndex t_device = 0;

int visible_count(const char* visible, int physical) {
  // torch_npu's _parse_visible_devices and _device_count_ascend_hal: unset is every device; the
  // ids are read up to the first character that is neither a digit nor a comma, and up to an
  // empty element; ids must ascend (else none is visible); an id past the host's last NPU ends
  // the list.
  if (visible == nullptr) {
    return physical;
  }
  const std::string var(visible);
  size_t end = 0;
  while (end < var.size() && (std::isdigit(static_cast<unsigned char>(var[end])) || var[end] == ',')) {
    ++end;
  }
  int count = 0;
  long previous = -1;
  size_t start = 0;
  while (start < end) {
    size_t comma = var.find(',', start);
    if (comma == std::string::npos || comma > end) {
      comma = end;
    }
    if (comma == start) {
      break;  // an empty element
    }
    const long id = std::stol(var.substr(start, comma - start));
    if (count > 0 && id <= previous) {
      return 0;
    }
    if (id >= physical) {
      return count;
    }
    previous = id;
    ++count;
    start = comma + 1;
  }
  return count;
}

c10::DeviceIndex device_count() {
  int count = g_device_count.load();
  if (count < 0) {
    std::lock_guard<std::mutex> lock(g_count_mutex);
    count = g_device_count.load();
    if (count < 0) {
      count = std::min(visible_count(std::getenv("ASCEND_RT_VISIBLE_DEVICES"), g_physical_count.load()), kMaxDevices);
      g_device_count = count;
    }
  }
  return static_cast<c10::DeviceIndex>(count);
}

bool devices_counted() {
  return g_device_count.load() >= 0;
}

int physical_count() {
  return g_physical_count.load();
}

void set_physical_count(int count) {
  TORCH_CHECK(count >= 0 && count <= kMaxDevices, "simulated npu: device count ", count, " out of range");
  g_physical_count = count;
}

void check_device(c10::DeviceIndex index) {
  TORCH_CHECK(
      index >= 0 && index < device_count(),
      "simulated npu: invalid device npu:", static_cast<int>(index), " (", static_cast<int>(device_count()),
      " visible)");
}

c10::DeviceIndex current_device() {
  return t_device;
}

void set_device(c10::DeviceIndex index) {
  check_device(index);
  t_device = index;
}

// ---------------------------------------------------------------- memory

static std::atomic<int64_t> g_capacity{int64_t(64) << 30};
struct DeviceCounters {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> allocations{0};
  std::atomic<int64_t> total_allocations{0};
  std::atomic<int64_t> ooms{0};
  std::atomic<double> fraction{1.0};  // set_per_process_memory_fraction: this process's share of the capacity
};
static std::array<DeviceCounters, kMaxDevices> g_counters;

// torch_npu's format_size (NPUCachingAllocator.cpp): two decimals, the unit by the size.
static std::string format_size(int64_t n) {
  const auto size = static_cast<uint64_t>(n < 0 ? 0 : n);
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (size <= 1024) {
    os << size << " bytes";
  } else if (size <= 1048576) {
    os << static_cast<double>(size) / 1024.0 << " KiB";
  } else if (size <= 1073741824ULL) {
    os << static_cast<double>(size) / 1048576.0 << " MiB";
  } else {
    os << static_cast<double>(size) / 1073741824.0 << " GiB";
  }
  return os.str();
}

void reserve(c10::DeviceIndex device, int64_t nbytes) {
  auto& c = g_counters.at(device);
  int64_t now = c.allocated.fetch_add(nbytes) + nbytes;
  int64_t cap = g_capacity.load();
  double fraction = c.fraction.load();
  int64_t allowed = fraction < 1.0 ? static_cast<int64_t>(fraction * static_cast<double>(cap)) : cap;
  if (now > allowed) {
    c.allocated.fetch_sub(nbytes);
    c.ooms.fetch_add(1);
    const int64_t before = now - nbytes;
    // torch_npu's own error, field by field (DeviceCachingAllocator::malloc): with no caching
    // allocator here, "current active" and "reserved" are what is allocated, and "free" is the
    // rest of the device.  The simulation's own sentence comes last.
    const std::string allowed_info = allowed < cap ? format_size(allowed) + " allowed; " : "";
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, "NPU out of memory. Tried to allocate ", format_size(nbytes), " (NPU ",
        static_cast<int>(device), "; ", format_size(cap), " total capacity; ", format_size(before),
        " already allocated; ", format_size(before), " current active; ", format_size(cap - before), " free; ",
        allowed_info, format_size(before), " reserved in total by PyTorch)",
        " If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.",
        " (simulated NPU: NPU_COMPAT_SIMULATE_NPU_MEMORY sets its capacity)");
  }
  c.allocations.fetch_add(1);
  c.total_allocations.fetch_add(1);
  int64_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

void release(c10::DeviceIndex device, int64_t nbytes) {
  auto& c = g_counters.at(device);
  c.allocated.fetch_sub(nbytes);
  c.allocations.fetch_sub(1);
}

int64_t capacity() {
  return g_capacity.load();
}

void set_capacity(int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "simulated npu: capacity must not be negative");
  g_capacity = nbytes;
}

void set_memory_fraction(c10::DeviceIndex device, double fraction) {
  check_device(device);
  TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "simulated npu: memory fraction ", fraction, " is not in 0~1");
  g_counters.at(device).fraction = fraction;
}

MemoryStats memory_stats(c10::DeviceIndex device) {
  check_device(device);
  auto& c = g_counters.at(device);
  return {c.allocated.load(), c.peak.load(), c.allocations.load(), c.total_allocations.load(), c.ooms.load()};
}

void reset_peak(c10::DeviceIndex device) {
  check_device(device);
  auto& c = g_counters.at(device);
  c.peak = c.allocated.load();
}

namespace {

// Allocations of at least this many bytes are anonymous private mappings with MAP_NORESERVE:
// the device counts them in full, the host backs only the pages that are written (a read of an
// untouched page sees the kernel's shared zero page; with transparent huge pages "always", a
// write may back 2 MiB at once), so a KV cache of 90 % of a 64 GiB device costs the host what
// is written of it.  Smaller ones come from malloc, which packs them.  1 MiB: far above a page,
// so the rounding up to whole pages costs at most 0.4 %, and below it lie the many small
// tensors of a step.  Anonymous mappings start zero-filled, which torch.empty allows (it
// promises no content).  On a host with strict overcommit (vm.overcommit_memory=2) the kernel
// ignores MAP_NORESERVE and a mapping larger than the commit limit fails (OutOfMemoryError).
constexpr size_t kMappedBytes = size_t(1) << 20;

struct Block {
  void* ptr;
  int64_t size;
  c10::DeviceIndex device;
  bool mapped;  // mmap'd (munmap it) rather than malloc'd (free it)
};

// The one deleter of the npu allocator's memory: resize_bytes and the fallback's storage swaps
// (set_data_ptr_noswap) free the old memory through it too.  (adopted_data's memory is a CPU
// storage's, freed by that storage's own deleter.)
void free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  if (block->mapped) {
    munmap(block->ptr, static_cast<size_t>(block->size));
  } else {
    std::free(block->ptr);
  }
  release(block->device, block->size);
  delete block;
}

void no_delete(void*) {}

// ---------------------------------------------------------------- the runtime's virtual memory

constexpr size_t kGranularity = size_t(2) << 20;

struct Physical {
  c10::DeviceIndex device;
  size_t size;
};

struct Region {
  size_t size;
  Physical* mapped = nullptr;  // the physical memory mapped at the range's start, if any
};

std::mutex g_regions_mutex;
std::map<uintptr_t, Region> g_regions;  // reserved address ranges, by start

int reserve_address(void** ptr, size_t size) {
  if (ptr == nullptr || size == 0 || size % kGranularity != 0) {
    return kAclErrorInvalidParam;
  }
  void* at = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (at == MAP_FAILED) {
    return kAclErrorMemoryAllocation;
  }
  std::lock_guard<std::mutex> lock(g_regions_mutex);
  g_regions[reinterpret_cast<uintptr_t>(at)] = Region{size};
  *ptr = at;
  return kAclSuccess;
}

int release_address(void* ptr) {
  std::lock_guard<std::mutex> lock(g_regions_mutex);
  const auto found = g_regions.find(reinterpret_cast<uintptr_t>(ptr));
  if (found == g_regions.end() || found->second.mapped != nullptr) {
    return kAclErrorInvalidParam;  // not reserved, or still mapped
  }
  munmap(ptr, found->second.size);
  g_regions.erase(found);
  return kAclSuccess;
}

int malloc_physical(void** handle, size_t size, int device) {
  if (handle == nullptr || size == 0 || device < 0 || device >= device_count()) {
    return kAclErrorInvalidParam;
  }
  try {
    reserve(static_cast<c10::DeviceIndex>(device), static_cast<int64_t>(size));
  } catch (const c10::OutOfMemoryError&) {
    return kAclErrorMemoryAllocation;
  }
  *handle = new Physical{static_cast<c10::DeviceIndex>(device), size};
  return kAclSuccess;
}

int free_physical(void* handle) {
  if (handle == nullptr) {
    return kAclErrorInvalidParam;
  }
  auto* physical = static_cast<Physical*>(handle);
  release(physical->device, static_cast<int64_t>(physical->size));
  delete physical;
  return kAclSuccess;
}

int map_memory(void* ptr, size_t size, void* handle) {
  std::lock_guard<std::mutex> lock(g_regions_mutex);
  const auto found = g_regions.find(reinterpret_cast<uintptr_t>(ptr));
  auto* physical = static_cast<Physical*>(handle);
  if (found == g_regions.end() || found->second.mapped != nullptr || physical == nullptr ||
      size > found->second.size || size > physical->size) {
    return kAclErrorInvalidParam;
  }
  if (mprotect(ptr, size, PROT_READ | PROT_WRITE) != 0) {
    return kAclErrorMemoryAllocation;
  }
  found->second.mapped = physical;
  return kAclSuccess;
}

int unmap_memory(void* ptr) {
  std::lock_guard<std::mutex> lock(g_regions_mutex);
  const auto found = g_regions.find(reinterpret_cast<uintptr_t>(ptr));
  if (found == g_regions.end() || found->second.mapped == nullptr) {
    return kAclErrorInvalidParam;
  }
  // the pages go back to the host: what was written is gone, and the range faults until mapped again
  madvise(ptr, found->second.size, MADV_DONTNEED);
  mprotect(ptr, found->second.size, PROT_NONE);
  found->second.mapped = nullptr;
  return kAclSuccess;
}

bool in_mapped_region(uintptr_t begin, size_t nbytes) {
  std::lock_guard<std::mutex> lock(g_regions_mutex);
  auto found = g_regions.upper_bound(begin);
  if (found == g_regions.begin()) {
    return false;
  }
  --found;
  return found->second.mapped != nullptr && begin + nbytes <= found->first + found->second.size;
}

const NpuSimDeviceMemoryApi g_device_memory_api{
    1, kGranularity, &reserve_address, &release_address, &malloc_physical, &free_physical, &map_memory,
    &unmap_memory};

// ---------------------------------------------------------------- pluggable allocators and memory pools

using AllocFn = void* (*)(ssize_t size, int device, void* stream);
using FreeFn = void (*)(void* ptr, ssize_t size, int device, void* stream);

struct Pluggable {
  AllocFn alloc;
  FreeFn free;
};

struct Pool {
  int64_t allocator;  // an id in g_allocators, or -1: the backend's own
  int64_t use_count = 1;
};

struct Route {
  std::thread::id thread;
  int64_t pool;
};

std::mutex g_pools_mutex;
std::map<int64_t, Pluggable> g_allocators;
std::map<int64_t, Pool> g_pools;
std::array<std::vector<Route>, kMaxDevices> g_routes;  // per device: the threads whose allocations go to a pool
std::atomic<int> g_route_count{0};
int64_t g_next_id = 1;

struct PoolBlock {
  void* ptr;
  ssize_t size;
  c10::DeviceIndex device;
  FreeFn free;
};

void free_pool_block(void* ctx) {
  auto* block = static_cast<PoolBlock*>(ctx);
  block->free(block->ptr, block->size, block->device, nullptr);
  delete block;
}

// The pluggable allocator this thread's allocations on `device` go to (use_mem_pool), if any.
const Pluggable* routed(c10::DeviceIndex device) {
  if (g_route_count.load() == 0) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  const auto me = std::this_thread::get_id();
  for (const auto& route : g_routes.at(device)) {
    if (route.thread == me) {
      const auto pool = g_pools.find(route.pool);
      if (pool != g_pools.end() && pool->second.allocator >= 0) {
        return &g_allocators.at(pool->second.allocator);
      }
      return nullptr;
    }
  }
  return nullptr;
}

struct NpuAllocator final : at::Allocator {
  at::DataPtr allocate(size_t nbytes) override {
    const auto device = current_device();
    const c10::Device where(kNpu, device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &no_delete, where};
    }
    if (const Pluggable* pluggable = routed(device)) {
      // torch_npu's NPUPluggableAllocator: the allocator's own functions; what they take from the device
      // they count themselves (vllm-ascend's camem: aclrtMallocPhysical)
      void* ptr = pluggable->alloc(static_cast<ssize_t>(nbytes), device, nullptr);
      TORCH_CHECK_WITH(
          OutOfMemoryError, ptr != nullptr, "NPU out of memory: the pluggable allocator returned no memory for ",
          format_size(static_cast<int64_t>(nbytes)), " (NPU ", static_cast<int>(device), ")");
      return {ptr, new PoolBlock{ptr, static_cast<ssize_t>(nbytes), device, pluggable->free}, &free_pool_block,
              where};
    }
    reserve(device, static_cast<int64_t>(nbytes));
    void* ptr = nullptr;
    const bool mapped = nbytes >= kMappedBytes;
    if (mapped) {
      ptr = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (ptr == MAP_FAILED) {
        const int error = errno;
        release(device, static_cast<int64_t>(nbytes));
        TORCH_CHECK_WITH(
            OutOfMemoryError, false, "simulated npu: the host cannot map ", format_size(nbytes), " (mmap: ",
            std::strerror(error), ")");
      }
    } else if (posix_memalign(&ptr, 64, nbytes) != 0 || ptr == nullptr) {
      release(device, static_cast<int64_t>(nbytes));
      TORCH_CHECK_WITH(OutOfMemoryError, false, "simulated npu: the host has no ", format_size(nbytes), " left");
    }
    return {ptr, new Block{ptr, static_cast<int64_t>(nbytes), device, mapped}, &free_block, where};
  }

  at::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

NpuAllocator g_allocator;

}  // namespace

at::Allocator* npu_allocator() {
  return &g_allocator;
}

const NpuSimDeviceMemoryApi* device_memory_api() {
  return &g_device_memory_api;
}

bool routed_to_pool(c10::DeviceIndex device) {
  return routed(device) != nullptr;
}

int64_t custom_allocator(uintptr_t alloc, uintptr_t free) {
  TORCH_CHECK(alloc != 0 && free != 0, "simulated npu: a pluggable allocator needs both functions");
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  const int64_t id = g_next_id++;
  g_allocators[id] = Pluggable{reinterpret_cast<AllocFn>(alloc), reinterpret_cast<FreeFn>(free)};
  return id;
}

int64_t create_pool(int64_t allocator) {
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  TORCH_CHECK(allocator < 0 || g_allocators.count(allocator), "simulated npu: no such pluggable allocator");
  const int64_t id = g_next_id++;
  g_pools[id] = Pool{allocator};
  return id;
}

int64_t pool_use_count(int64_t pool) {
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  const auto found = g_pools.find(pool);
  return found == g_pools.end() ? 0 : found->second.use_count;
}

void begin_allocate_to_pool(c10::DeviceIndex device, int64_t pool) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  TORCH_CHECK(g_pools.count(pool), "simulated npu: no such memory pool");
  g_pools[pool].use_count += 1;
  g_routes.at(device).push_back(Route{std::this_thread::get_id(), pool});
  g_route_count += 1;
}

void end_allocate_to_pool(c10::DeviceIndex device, int64_t pool) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  auto& routes = g_routes.at(device);
  const auto me = std::this_thread::get_id();
  for (auto it = routes.begin(); it != routes.end(); ++it) {
    if (it->thread == me && it->pool == pool) {
      routes.erase(it);
      g_route_count -= 1;
      return;
    }
  }
}

void release_pool(c10::DeviceIndex device, int64_t pool) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  const auto found = g_pools.find(pool);
  if (found != g_pools.end()) {
    found->second.use_count -= 1;
  }
}

bool zero_unbacked(const at::DataPtr& data, void* ptr, size_t nbytes) {
  const bool ours = data.get_deleter() == &free_block && static_cast<Block*>(data.get_context())->mapped;
  if (!ours && !in_mapped_region(reinterpret_cast<uintptr_t>(ptr), nbytes)) {
    return false;  // neither a large allocation of ours nor runtime-mapped memory: not known anonymous
  }
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(ptr);
  const auto end = begin + nbytes;
  const auto first = (begin + page - 1) / page * page;
  const auto last = end / page * page;
  if (last <= first) {
    return false;
  }
  std::memset(ptr, 0, first - begin);
  // a private anonymous mapping's pages given back read as zeros, and are backed again when written
  TORCH_CHECK(
      madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) == 0,
      "simulated npu: madvise(MADV_DONTNEED): ", std::strerror(errno));
  std::memset(reinterpret_cast<void*>(last), 0, end - last);
  return true;
}

void resize_bytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  const auto device = storage->device().index();
  c10::DeviceGuard guard(c10::Device(kNpu, device));
  at::DataPtr fresh = g_allocator.allocate(nbytes);
  const size_t keep = std::min(nbytes, storage->nbytes());
  if (keep > 0 && storage->data() != nullptr) {
    std::memcpy(fresh.get(), storage->data(), keep);
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}


// ---------------------------------------------------------------- pinned host memory

namespace {

std::mutex g_pinned_mutex;
std::map<uintptr_t, size_t> g_pinned;  // start -> size

void free_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  std::free(ptr);
}

struct PinnedAllocator final : at::HostAllocator {
  at::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) {
      return {nullptr, nullptr, &no_delete, c10::Device(c10::kCPU)};
    }
    void* ptr = nullptr;
    TORCH_CHECK_WITH(
        OutOfMemoryError, posix_memalign(&ptr, 64, nbytes) == 0 && ptr != nullptr,
        "simulated npu: cannot pin ", format_size(nbytes));
    {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override {
    return true;
  }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    return {};
  }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

PinnedAllocator g_pinned_allocator;

}  // namespace

at::Allocator* pinned_allocator() {
  return &g_pinned_allocator;
}

bool is_pinned(const void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto it = g_pinned.upper_bound(p);
  if (it == g_pinned.begin()) {
    return false;
  }
  --it;
  return p < it->first + it->second;
}

// ---------------------------------------------------------------- generators

namespace {

struct NpuGenerator final : c10::GeneratorImpl {
  explicit NpuGenerator(c10::DeviceIndex device, at::Generator cpu)
      : c10::GeneratorImpl(c10::Device(kNpu, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(std::move(cpu)) {}

  void set_current_seed(uint64_t seed) override {
    cpu_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    cpu_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    return cpu_.get_offset();
  }
  uint64_t current_seed() const override {
    return cpu_.current_seed();
  }
  uint64_t seed() override {
    return cpu_.seed();
  }
  void set_state(const c10::TensorImpl& state) override {
    cpu_.set_state(at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(const_cast<c10::TensorImpl*>(&state))));
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return cpu_.get_state().getIntrusivePtr();
  }
  static c10::DeviceType device_type() {
    return kNpu;
  }

  at::Generator cpu_;

 private:
  NpuGenerator* clone_impl() const override {
    return new NpuGenerator(device().index(), cpu_.clone());
  }
};

std::once_flag g_generators_once;
std::vector<at::Generator> g_generators;

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  std::call_once(g_generators_once, [] {
    for (int i = 0; i < kMaxDevices; ++i) {
      g_generators.push_back(at::make_generator<NpuGenerator>(
          static_cast<c10::DeviceIndex>(i), at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)));
    }
  });
  const auto index = device < 0 ? current_device() : device;
  check_device(index);
  return g_generators[index];
}

at::Generator new_generator(c10::DeviceIndex device) {
  const auto index = device < 0 ? current_device() : device;
  check_device(index);
  return at::make_generator<NpuGenerator>(index, at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val));
}

at::Generator cpu_generator_of(const at::Generator& npu_generator) {
  return static_cast<NpuGenerator*>(npu_generator.unsafeGetGeneratorImpl())->cpu_;
}

// ---------------------------------------------------------------- device guard, streams, events

namespace {

struct Event {
  std::chrono::steady_clock::time_point when;
};

static std::atomic<c10::StreamId> g_next_stream{1};
static thread_local std::array<c10::StreamId, kMaxDevices> t_streams{};

struct NpuGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kNpu;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    const auto old = current_device();
    if (d.index() >= 0 && d.index() != old) {
      set_device(d.index());
    }
    return c10::Device(kNpu, old);
  }
  c10::Device getDevice() const override {
    return c10::Device(kNpu, current_device());
  }
  void setDevice(c10::Device d) const override {
    set_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    t_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    const auto index = d.index() < 0 ? current_device() : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNpu, index), t_streams.at(index));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    const auto index = d.index() < 0 ? current_device() : d.index();
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kNpu, index));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool = false) const override {
    return getNewStream(d, 0);
  }
  c10::Stream getNewStream(c10::Device d, int = 0) const override {
    const auto index = d.index() < 0 ? current_device() : d.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNpu, index), g_next_stream.fetch_add(1));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    auto& slot = t_streams.at(s.device_index());
    const auto old = c10::Stream(c10::Stream::UNSAFE, s.device(), slot);
    slot = s.id();
    return old;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<Event*>(event);
  }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) {
      *event = new Event();
    }
    static_cast<Event*>(*event)->when = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "simulated npu: both events must be recorded before elapsed_time()");
    const auto a = static_cast<Event*>(start)->when;
    const auto b = static_cast<Event*>(end)->when;
    return std::chrono::duration<double, std::milli>(b - a).count();
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl)

// ---------------------------------------------------------------- hooks

namespace {

struct NpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return device_count() > 0;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_device(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto old = current_device();
    if (device >= 0 && device != old) {
      set_device(device);
    }
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return default_generator(device);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    return new_generator(device);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return at::Device(kNpu, current_device());
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned(data);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_bytes(storage.unsafeGetStorageImpl(), nbytes);
  }
};

struct Registration {
  Registration() {
    at::RegisterPrivateUse1HooksInterface(new NpuHooks());
    at::setHostAllocator(kNpu, &g_pinned_allocator);
    c10::SetAllocator(kNpu, &g_allocator);
  }
};
Registration g_registration;

}  // namespace

}  // namespace npu_sim
