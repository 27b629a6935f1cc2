// The simulated Ascend's PrivateUse1 ("npu") backend: shared declarations.
//
// npu tensors live in host memory.  Each device counts its own allocations
// against a capacity, has a current-device guard per thread and a default
// generator, and every operator without an npu kernel of its own runs the CPU
// kernel on CPU tensors that alias the npu tensors' memory (no copies).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>

#include "device_memory_api.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace npu_sim {

constexpr c10::DeviceType kNpu = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;

// devices and the current device of this thread
c10::DeviceIndex device_count();
bool devices_counted();                          // whether device_count() has counted (the first use)
int physical_count();                            // the host's NPUs
void set_physical_count(int count);
int visible_count(const char* visible, int physical);  // the runtime's reading of ASCEND_RT_VISIBLE_DEVICES
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
void check_device(c10::DeviceIndex index);

// memory: every byte an npu storage holds is counted on its device
at::Allocator* npu_allocator();
void reserve(c10::DeviceIndex device, int64_t nbytes);  // raises OutOfMemoryError past the capacity
void release(c10::DeviceIndex device, int64_t nbytes);
int64_t capacity();
void set_capacity(int64_t nbytes);
void set_memory_fraction(c10::DeviceIndex device, double fraction);  // of the capacity, this process
struct MemoryStats {
  int64_t allocated;
  int64_t peak;
  int64_t allocations;  // live blocks
  int64_t total_allocations;
  int64_t ooms;
};
MemoryStats memory_stats(c10::DeviceIndex device);
void reset_peak(c10::DeviceIndex device);
void resize_bytes(c10::StorageImpl* storage, size_t nbytes);
// Zero nbytes at ptr, inside data's memory, giving the whole pages of a large (mapped) allocation back
// to the host rather than writing them; false (nothing done) when data is not such an allocation.
bool zero_unbacked(const at::DataPtr& data, void* ptr, size_t nbytes);

// the runtime's virtual memory (device_memory_api.h), pluggable allocators and memory pools (use_mem_pool:
// this thread's allocations on a device go to a pool's allocator)
const NpuSimDeviceMemoryApi* device_memory_api();
int64_t custom_allocator(uintptr_t alloc, uintptr_t free);
bool routed_to_pool(c10::DeviceIndex device);  // whether this thread's allocations there go to a pluggable allocator
int64_t create_pool(int64_t allocator);  // allocator -1: the backend's own
int64_t pool_use_count(int64_t pool);
void begin_allocate_to_pool(c10::DeviceIndex device, int64_t pool);
void end_allocate_to_pool(c10::DeviceIndex device, int64_t pool);
void release_pool(c10::DeviceIndex device, int64_t pool);

// a host tensor aliasing an npu tensor's memory, and back
at::Tensor cpu_alias(const at::Tensor& npu);
c10::Storage adopt_storage(const c10::Storage& cpu, c10::DeviceIndex device);

// pinned host memory
at::Allocator* pinned_allocator();
bool is_pinned(const void* ptr);

// random numbers: one generator per device, computing with a CPU generator inside
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
at::Generator cpu_generator_of(const at::Generator& npu_generator);

// which operators the CPU fallback served (counted only while enabled)
void set_fallback_counting(bool on);
std::vector<std::pair<std::string, int64_t>> fallback_counts();

}  // namespace npu_sim
