// The simulated vllm_ascend_C: the camem allocator of vllm-ascend's csrc/camem_allocator.cpp, over the
// simulated runtime's virtual memory (../csrc/device_memory_api.h) instead of CANN's.
//
// The module and its C functions are the release's, name for name and argument for argument:
// init_module(python_malloc, python_free), python_create_and_map(device, size, d_mem, p_memHandle),
// python_unmap_and_release(...), and the pluggable allocator's my_malloc(size, device, stream) and
// my_free(ptr, size, device, stream), found by vllm-ascend in this library (its path holds
// "vllm_ascend_C") and loaded with ctypes by torch.npu.memory.NPUPluggableAllocator.  The release's
// acl* calls are the same calls here, each answered by the simulated runtime: an address range reserved
// without memory, physical memory counted on its device, mapped at that address and unmapped again (the
// address stays, the contents go).  The real library also registers vllm-ascend's _C_ascend operators;
// here npu_compat.testing._npu_ops registers those it simulates.
#include <Python.h>
#include <sys/types.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "device_memory_api.h"

namespace {

const NpuSimDeviceMemoryApi* g_runtime = nullptr;

using aclError = int;
using aclrtDrvMemHandle = void*;
using aclrtStream = void*;

aclError aclrtMemGetAllocationGranularity(size_t* granularity) {
  *granularity = g_runtime->granularity;
  return kAclSuccess;
}
aclError aclrtReserveMemAddress(void** d_mem, size_t size) {
  return g_runtime->reserve_address(d_mem, size);
}
aclError aclrtReleaseMemAddress(void* d_mem) {
  return g_runtime->release_address(d_mem);
}
aclError aclrtMallocPhysical(aclrtDrvMemHandle* handle, size_t size, unsigned long long device) {
  return g_runtime->malloc_physical(handle, size, static_cast<int>(device));
}
aclError aclrtFreePhysical(aclrtDrvMemHandle handle) {
  return g_runtime->free_physical(handle);
}
aclError aclrtMapMem(void* d_mem, size_t size, aclrtDrvMemHandle handle) {
  return g_runtime->map(d_mem, size, handle);
}
aclError aclrtUnmapMem(void* d_mem) {
  return g_runtime->unmap(d_mem);
}

std::string where(int line) {
  return std::string(" ") + __FILE__ + ":" + std::to_string(line);
}

}  // namespace

extern "C" {

static PyObject* g_python_malloc_callback = nullptr;
static PyObject* g_python_free_callback = nullptr;

void create_and_map(unsigned long long device, ssize_t size, void* d_mem, aclrtDrvMemHandle* p_memHandle) {
  aclError error_code = aclrtMallocPhysical(p_memHandle, static_cast<size_t>(size), device);
  if (error_code != 0) {
    if (error_code == kAclErrorMemoryAllocation) {
      throw std::runtime_error("aclrtMallocPhysical failed with acl error code: " + std::to_string(error_code) +
                               "(OOM: Out of Memory, allocation failed)" + where(__LINE__));
    }
    throw std::runtime_error("aclrtMallocPhysical failed with acl error code: " + std::to_string(error_code) +
                             where(__LINE__));
  }
  error_code = aclrtMapMem(d_mem, static_cast<size_t>(size), *p_memHandle);
  if (error_code != 0) {
    throw std::runtime_error("aclrtMapMem failed with acl error code: " + std::to_string(error_code) +
                             where(__LINE__));
  }
}

void unmap_and_release(unsigned long long, ssize_t, void* d_mem, aclrtDrvMemHandle* p_memHandle) {
  aclError error_code = aclrtUnmapMem(d_mem);
  if (error_code != 0) {
    throw std::runtime_error("aclrtUnmapMem failed with acl error code: " + std::to_string(error_code) +
                             where(__LINE__));
  }
  error_code = aclrtFreePhysical(*p_memHandle);
  if (error_code != 0) {
    throw std::runtime_error("aclrtFreePhysical failed with acl error code: " + std::to_string(error_code) +
                             where(__LINE__));
  }
}

static PyObject* create_tuple_from_c_integers(unsigned long long a, unsigned long long b, unsigned long long c,
                                              unsigned long long d) {
  PyObject* tuple = PyTuple_New(4);
  if (!tuple) {
    return nullptr;
  }
  PyTuple_SetItem(tuple, 0, PyLong_FromUnsignedLongLong(a));
  PyTuple_SetItem(tuple, 1, PyLong_FromUnsignedLongLong(b));
  PyTuple_SetItem(tuple, 2, PyLong_FromUnsignedLongLong(c));
  PyTuple_SetItem(tuple, 3, PyLong_FromUnsignedLongLong(d));
  return tuple;
}

__attribute__((visibility("default"))) void* my_malloc(ssize_t size, int device, aclrtStream) {
  size_t granularity;
  aclError error_code = aclrtMemGetAllocationGranularity(&granularity);
  if (error_code != 0) {
    throw std::runtime_error("aclrtMemGetAllocationGranularity failed with acl error code: " +
                             std::to_string(error_code) + where(__LINE__));
  }
  size_t alignedSize = ((static_cast<size_t>(size) + granularity - 1) / granularity) * granularity;
  void* d_mem;
  error_code = aclrtReserveMemAddress(&d_mem, alignedSize);
  if (error_code != 0) {
    throw std::runtime_error("aclrtReserveMemAddress failed with acl error code: " + std::to_string(error_code) +
                             where(__LINE__));
  }
  auto* p_memHandle = static_cast<aclrtDrvMemHandle*>(malloc(sizeof(aclrtDrvMemHandle)));
  if (!g_python_malloc_callback) {
    throw std::runtime_error("my_malloc ERROR: g_python_malloc_callback not set." + where(__LINE__));
  }
  PyGILState_STATE gstate = PyGILState_Ensure();
  PyObject* arg_tuple = create_tuple_from_c_integers(
      static_cast<unsigned long long>(device), static_cast<unsigned long long>(alignedSize),
      reinterpret_cast<unsigned long long>(d_mem), reinterpret_cast<unsigned long long>(p_memHandle));
  PyObject* py_result = PyObject_CallFunctionObjArgs(g_python_malloc_callback, arg_tuple, nullptr);
  Py_DECREF(arg_tuple);
  if (!py_result) {
    PyErr_Print();
    PyGILState_Release(gstate);
    return nullptr;
  }
  Py_DECREF(py_result);
  PyGILState_Release(gstate);
  create_and_map(static_cast<unsigned long long>(device), static_cast<ssize_t>(alignedSize), d_mem, p_memHandle);
  return d_mem;
}

__attribute__((visibility("default"))) void my_free(void* ptr, ssize_t size, int device, aclrtStream) {
  if (!g_python_free_callback) {
    throw std::runtime_error("aclrtDrvMemHandle ERROR: g_python_malloc_callback not set." + where(__LINE__));
  }
  PyGILState_STATE gstate = PyGILState_Ensure();
  PyObject* py_ptr = PyLong_FromUnsignedLongLong(reinterpret_cast<unsigned long long>(ptr));
  PyObject* py_result = PyObject_CallFunctionObjArgs(g_python_free_callback, py_ptr, nullptr);
  Py_DECREF(py_ptr);
  unsigned long long recv_device, recv_size, recv_d_mem, recv_p_memHandle;
  if (!py_result || !PyTuple_Check(py_result) || PyTuple_Size(py_result) != 4 ||
      !PyArg_ParseTuple(py_result, "KKKK", &recv_device, &recv_size, &recv_d_mem, &recv_p_memHandle)) {
    PyErr_Print();
    Py_XDECREF(py_result);
    PyGILState_Release(gstate);
    return;
  }
  Py_DECREF(py_result);
  PyGILState_Release(gstate);
  void* d_mem = reinterpret_cast<void*>(recv_d_mem);
  auto* p_memHandle = reinterpret_cast<aclrtDrvMemHandle*>(recv_p_memHandle);
  unmap_and_release(static_cast<unsigned long long>(device), size, d_mem, p_memHandle);
  aclError error_code = aclrtReleaseMemAddress(d_mem);
  if (error_code != 0) {
    throw std::runtime_error("aclrtReleaseMemAddress failed with acl error code: " + std::to_string(error_code) +
                             where(__LINE__));
  }
  free(p_memHandle);
}

static PyObject* py_init_module(PyObject*, PyObject* args) {
  PyObject* malloc_callback = nullptr;
  PyObject* free_callback = nullptr;
  if (!PyArg_ParseTuple(args, "OO", &malloc_callback, &free_callback)) {
    return nullptr;
  }
  if (!PyCallable_Check(malloc_callback) || !PyCallable_Check(free_callback)) {
    PyErr_SetString(PyExc_TypeError, "Both arguments must be callables");
    return nullptr;
  }
  Py_XINCREF(malloc_callback);
  Py_XINCREF(free_callback);
  g_python_malloc_callback = malloc_callback;
  g_python_free_callback = free_callback;
  Py_RETURN_NONE;
}

static PyObject* handle_call(PyObject* args, bool map) {
  unsigned long long recv_device, recv_size, recv_d_mem, recv_p_memHandle;
  if (!args || !PyTuple_Check(args) || PyTuple_Size(args) != 4) {
    PyErr_SetString(PyExc_TypeError, "Expected a tuple of size 4");
    return nullptr;
  }
  if (!PyArg_ParseTuple(args, "KKKK", &recv_device, &recv_size, &recv_d_mem, &recv_p_memHandle)) {
    return nullptr;
  }
  try {
    auto* d_mem = reinterpret_cast<void*>(recv_d_mem);
    auto* handle = reinterpret_cast<aclrtDrvMemHandle*>(recv_p_memHandle);
    if (map) {
      create_and_map(recv_device, static_cast<ssize_t>(recv_size), d_mem, handle);
    } else {
      unmap_and_release(recv_device, static_cast<ssize_t>(recv_size), d_mem, handle);
    }
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

static PyObject* python_unmap_and_release(PyObject*, PyObject* args) {
  return handle_call(args, false);
}

static PyObject* python_create_and_map(PyObject*, PyObject* args) {
  return handle_call(args, true);
}

static PyMethodDef module_methods[] = {
    {"init_module", static_cast<PyCFunction>(py_init_module), METH_VARARGS,
     "Initialize module with python_malloc and python_free callables."},
    {"python_create_and_map", static_cast<PyCFunction>(python_create_and_map), METH_VARARGS,
     "Create and map memory on the device."},
    {"python_unmap_and_release", static_cast<PyCFunction>(python_unmap_and_release), METH_VARARGS,
     "Unmap and release memory on the device."},
    {nullptr, nullptr, 0, nullptr}};

static struct PyModuleDef camem_allocator_module = {
    PyModuleDef_HEAD_INIT, "camem_allocator", "CANN-mem-based allocator for NPUPluggableAllocator (simulated)", -1,
    module_methods};

PyMODINIT_FUNC PyInit_vllm_ascend_C(void) {
  // the simulated runtime: the npu backend's table (a real host's libascendcl)
  PyObject* backend = PyImport_ImportModule("npu_compat_npu_backend");
  if (!backend) {
    return nullptr;
  }
  PyObject* capsule = PyObject_CallMethod(backend, "device_memory_api", nullptr);
  Py_DECREF(backend);
  if (!capsule) {
    return nullptr;
  }
  g_runtime = static_cast<const NpuSimDeviceMemoryApi*>(PyCapsule_GetPointer(capsule, NPU_SIM_DEVICE_MEMORY_CAPSULE));
  Py_DECREF(capsule);
  if (!g_runtime) {
    return nullptr;
  }
  return PyModule_Create(&camem_allocator_module);
}

}  // extern "C"
