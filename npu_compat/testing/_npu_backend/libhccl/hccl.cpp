// The simulated Ascend's libhccl.so: HCCL's C entry points that vllm-ascend's PyHcclCommunicator loads with
// ctypes (pyhccl_wrapper.py's HCCLLibrary), under their real names and signatures (CANN's hccl.h and
// hccl_types.h), with HCCL's result codes.  There is no device network behind it: each call hands its
// arguments to npu_compat.testing._libhccl, which moves the bytes at the given addresses (the simulated NPU's
// memory is host memory) between the ranks through a TCP store, with HCCL's connect and execution timeouts.
//
// Built with the SONAME libhccl.so and loaded by the simulated torch_npu at `import torch`, as the real
// torch_npu's libraries load CANN's libhccl.so: ctypes.CDLL("libhccl.so") then finds the loaded library.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdarg>
#include <cstdint>

extern "C" {

typedef int HcclResult;
typedef void* HcclComm;
typedef void* aclrtStream;
typedef int HcclDataType;
typedef int HcclReduceOp;
// sizeof(HcclRootInfo): HCCL_ROOT_INFO_BYTES
struct HcclRootInfo {
  char internal[4108];
};

}  // extern "C"

namespace {

constexpr HcclResult kInternal = 4;  // HCCL_E_INTERNAL

// hccl_types.h's HcclResult, in order, by its names (what the real library's strings say is not public)
const char* const kResultNames[] = {
    "HCCL_SUCCESS",
    "HCCL_E_PARA",
    "HCCL_E_PTR",
    "HCCL_E_MEMORY",
    "HCCL_E_INTERNAL",
    "HCCL_E_NOT_SUPPORT",
    "HCCL_E_NOT_FOUND",
    "HCCL_E_UNAVAIL",
    "HCCL_E_SYSCALL",
    "HCCL_E_TIMEOUT",
    "HCCL_E_OPEN_FILE_FAILURE",
    "HCCL_E_TCP_CONNECT",
    "HCCL_E_ROCE_CONNECT",
    "HCCL_E_TCP_TRANSFER",
    "HCCL_E_ROCE_TRANSFER",
    "HCCL_E_RUNTIME",
    "HCCL_E_DRV",
    "HCCL_E_PROFILING",
    "HCCL_E_CCE",
    "HCCL_E_NETWORK",
    "HCCL_E_AGAIN",
    "HCCL_E_REMOTE",
    "HCCL_E_SUSPENDING",
};

// Calls npu_compat.testing._libhccl.<function>(*Py_BuildValue(format, ...)) with the GIL held (ctypes
// releases it around a foreign call) and returns its int result; a Python exception is printed and is
// HCCL_E_INTERNAL.
HcclResult forward(const char* function, const char* format, ...) {
  if (!Py_IsInitialized()) {
    return kInternal;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  HcclResult result = kInternal;
  PyObject* module = PyImport_ImportModule("npu_compat.testing._libhccl");
  if (module != nullptr) {
    va_list args;
    va_start(args, format);
    PyObject* arguments = Py_VaBuildValue(format, args);
    va_end(args);
    PyObject* callable = PyObject_GetAttrString(module, function);
    if (arguments != nullptr && callable != nullptr) {
      PyObject* returned = PyObject_CallObject(callable, arguments);
      if (returned != nullptr) {
        result = static_cast<HcclResult>(PyLong_AsLong(returned));
        Py_DECREF(returned);
      }
    }
    Py_XDECREF(callable);
    Py_XDECREF(arguments);
    Py_DECREF(module);
  }
  if (PyErr_Occurred()) {
    PyErr_Print();
    result = kInternal;
  }
  PyGILState_Release(gil);
  return result;
}

unsigned long long address(const void* pointer) {
  return static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(pointer));
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) const char* HcclGetErrorString(HcclResult code) {
  if (code < 0 || code >= static_cast<HcclResult>(sizeof(kResultNames) / sizeof(kResultNames[0]))) {
    return "unknown error";
  }
  return kResultNames[code];
}

__attribute__((visibility("default"))) HcclResult HcclGetRootInfo(HcclRootInfo* rootInfo) {
  return forward("get_root_info", "(K)", address(rootInfo));
}

__attribute__((visibility("default"))) HcclResult HcclCommInitRootInfo(
    uint32_t nRanks, const HcclRootInfo* rootInfo, uint32_t rank, HcclComm* comm) {
  return forward("comm_init_root_info", "(IKIK)", nRanks, address(rootInfo), rank, address(comm));
}

__attribute__((visibility("default"))) HcclResult HcclAllReduce(
    void* sendBuf, void* recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op, HcclComm comm,
    aclrtStream stream) {
  return forward(
      "all_reduce", "(KKKiiKK)", address(sendBuf), address(recvBuf), static_cast<unsigned long long>(count),
      dataType, op, address(comm), address(stream));
}

__attribute__((visibility("default"))) HcclResult HcclBroadcast(
    void* buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm, aclrtStream stream) {
  return forward(
      "broadcast", "(KKiIKK)", address(buf), static_cast<unsigned long long>(count), dataType, root,
      address(comm), address(stream));
}

__attribute__((visibility("default"))) HcclResult HcclGetRankSize(HcclComm comm, uint32_t* rankSize) {
  return forward("get_rank_size", "(KK)", address(comm), address(rankSize));
}

__attribute__((visibility("default"))) HcclResult HcclGetRankId(HcclComm comm, uint32_t* rank) {
  return forward("get_rank_id", "(KK)", address(comm), address(rank));
}

__attribute__((visibility("default"))) HcclResult HcclCommDestroy(HcclComm comm) {
  return forward("comm_destroy", "(K)", address(comm));
}

}  // extern "C"
