// The simulated runtime's virtual-memory calls, as CANN's ACL runtime gives them (aclrtReserveMemAddress,
// aclrtMallocPhysical, aclrtMapMem, aclrtUnmapMem, aclrtFreePhysical, aclrtReleaseMemAddress,
// aclrtMemGetAllocationGranularity), handed to the vllm_ascend_C stand-in as a table in a PyCapsule
// (NPU_SIM_DEVICE_MEMORY_CAPSULE): that module is a separate library, and the backend's symbols are
// local to it.  Each returns an ACL error code, 0 on success.
//
// Semantics, as on the device: an address range is reserved without memory; physical memory is counted
// on its device when allocated (and may fail for want of it); mapping it makes the range readable and
// writable, and it reads as zeros; unmapping gives the pages back and makes the range inaccessible again,
// at the same address, which a later map reuses.
#pragma once

#include <cstddef>

#define NPU_SIM_DEVICE_MEMORY_CAPSULE "npu_compat_npu_backend.device_memory_api"

struct NpuSimDeviceMemoryApi {
  int version;  // 1
  size_t granularity;  // ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM of ACL_HBM_MEM_HUGE: 2 MiB
  int (*reserve_address)(void** ptr, size_t size);
  int (*release_address)(void* ptr);
  int (*malloc_physical)(void** handle, size_t size, int device);
  int (*free_physical)(void* handle);
  int (*map)(void* ptr, size_t size, void* handle);
  int (*unmap)(void* ptr);
};

// ACL's error codes the calls return (acl_base.h / rt_error_codes)
constexpr int kAclSuccess = 0;
constexpr int kAclErrorInvalidParam = 107000;       // ACL_ERROR_RT_PARAM_INVALID
constexpr int kAclErrorMemoryAllocation = 207001;   // ACL_ERROR_RT_MEMORY_ALLOCATION
