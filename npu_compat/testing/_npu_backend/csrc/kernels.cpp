// The npu operator kernels: allocation, copies, views, storage, and the CPU
// fallback that serves every other operator on CPU tensors aliasing the npu
// tensors' memory.
#include "npu_backend.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>

namespace npu_sim {

// ---------------------------------------------------------------- aliasing

namespace {

void release_storage_ref(void* ctx) {
  delete static_cast<c10::Storage*>(ctx);
}

// A CPU storage over the same bytes as `npu`; it keeps `npu` alive.
c10::Storage cpu_storage_over(const c10::Storage& npu) {
  void* data = const_cast<void*>(npu.data());
  at::DataPtr ptr(data, new c10::Storage(npu), &release_storage_ref, c10::Device(c10::kCPU));
  return c10::Storage(
      c10::Storage::use_byte_size_t(), npu.nbytes(), std::move(ptr), c10::GetCPUAllocator(), /*resizable=*/true);
}

at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return at::Tensor(std::move(impl));
}

struct Adopted {
  c10::Storage keep;
  int64_t nbytes;
  c10::DeviceIndex device;
};

void release_adopted(void* ctx) {
  auto* a = static_cast<Adopted*>(ctx);
  if (a->nbytes > 0) {
    release(a->device, a->nbytes);
  }
  delete a;
}

at::DataPtr adopted_data(const c10::Storage& cpu, c10::DeviceIndex device) {
  const auto nbytes = static_cast<int64_t>(cpu.nbytes());
  if (nbytes > 0 && routed_to_pool(device)) {
    // under use_mem_pool the pool's allocator owns every new npu memory, a computed result's too
    c10::DeviceGuard guard(c10::Device(kNpu, device));
    at::DataPtr fresh = npu_allocator()->allocate(static_cast<size_t>(nbytes));
    std::memcpy(fresh.get(), cpu.data(), static_cast<size_t>(nbytes));
    return fresh;
  }
  if (nbytes > 0) {
    reserve(device, nbytes);
  }
  void* data = const_cast<void*>(cpu.data());
  return at::DataPtr(data, new Adopted{cpu, nbytes, device}, &release_adopted, c10::Device(kNpu, device));
}

}  // namespace

at::Tensor cpu_alias(const at::Tensor& npu) {
  return tensor_on(cpu_storage_over(npu.storage()), c10::DispatchKey::CPU, npu);
}

c10::Storage adopt_storage(const c10::Storage& cpu, c10::DeviceIndex device) {
  return c10::Storage(
      c10::Storage::use_byte_size_t(), cpu.nbytes(), adopted_data(cpu, device), npu_allocator(), /*resizable=*/true);
}

// ---------------------------------------------------------------- fallback counting

static std::atomic<bool> g_counting{false};
static std::mutex g_counts_mutex;
static std::unordered_map<std::string, int64_t> g_counts;

void set_fallback_counting(bool on) {
  std::lock_guard<std::mutex> lock(g_counts_mutex);
  if (on) {
    g_counts.clear();
  }
  g_counting = on;
}

std::vector<std::pair<std::string, int64_t>> fallback_counts() {
  std::lock_guard<std::mutex> lock(g_counts_mutex);
  return {g_counts.begin(), g_counts.end()};
}

// ---------------------------------------------------------------- the fallback

namespace {

bool is_npu(const at::Tensor& t) {
  return t.defined() && t.device().type() == kNpu;
}

// What one fallback call converted, to map the CPU kernel's results back.
struct Call {
  c10::DeviceIndex device = -1;
  // npu storage <-> its CPU stand-in in this call
  c10::SmallVector<std::pair<c10::Storage, c10::Storage>, 8> storages;  // (npu, cpu)
  // npu tensor <-> its CPU alias
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 8> tensors;  // (npu, cpu)
  // CPU storages the kernel allocated, adopted into npu storages
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> adopted;  // (cpu, npu)

  at::Tensor to_cpu(const at::Tensor& t) {
    if (!is_npu(t)) {
      return t;
    }
    if (device < 0) {
      device = t.device().index();
    }
    for (auto& [n, c] : tensors) {
      if (n.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        return c;
      }
    }
    const auto& storage = t.storage();
    c10::Storage cpu;
    for (auto& [n, c] : storages) {
      if (n.unsafeGetStorageImpl() == storage.unsafeGetStorageImpl()) {
        cpu = c;
        break;
      }
    }
    if (!cpu) {
      cpu = cpu_storage_over(storage);
      storages.emplace_back(storage, cpu);
    }
    auto alias = tensor_on(cpu, c10::DispatchKey::CPU, t);
    tensors.emplace_back(t, alias);
    return alias;
  }

  c10::Storage npu_storage_for(const c10::Storage& cpu) {
    for (auto& [n, c] : storages) {
      if (c.unsafeGetStorageImpl() == cpu.unsafeGetStorageImpl()) {
        return n;
      }
    }
    for (auto& [c, n] : adopted) {
      if (c == cpu.unsafeGetStorageImpl()) {
        return n;
      }
    }
    auto npu = adopt_storage(cpu, device < 0 ? current_device() : device);
    adopted.emplace_back(cpu.unsafeGetStorageImpl(), npu);
    return npu;
  }

  at::Tensor to_npu(const at::Tensor& t) {
    if (!t.defined() || !t.device().is_cpu() || t.layout() != c10::kStrided) {
      return t;
    }
    for (auto& [n, c] : tensors) {
      if (c.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        return n;
      }
    }
    return tensor_on(npu_storage_for(t.storage()), c10::DispatchKey::PrivateUse1, t);
  }

  // A mutable argument the CPU kernel may have resized: carry that over to the npu tensor.
  void sync_back(const at::Tensor& npu, const at::Tensor& cpu) {
    auto* n = npu.unsafeGetTensorImpl();
    auto* c = cpu.unsafeGetTensorImpl();
    auto* ns = n->storage().unsafeGetStorageImpl();
    const auto& cs = c->storage();
    if (cs.data() != ns->data() || cs.nbytes() != ns->nbytes()) {
      // the kernel gave the storage new memory: the npu storage adopts it
      ns->set_data_ptr_noswap(adopted_data(cs, npu.device().index()));
      ns->set_nbytes(cs.nbytes());
    }
    if (n->sizes() != c->sizes() || n->strides() != c->strides() || n->storage_offset() != c->storage_offset()) {
      n->set_sizes_and_strides(c->sizes(), c->strides(), c->storage_offset());
    }
  }
};

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() != c10::TypeKind::OptionalType) {
    return false;
  }
  return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

void alias_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  if (g_counting.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(g_counts_mutex);
    const auto& name = schema.operator_name();
    g_counts[name.overload_name.empty() ? name.name : name.name + "." + name.overload_name] += 1;
  }
  const auto& arguments = schema.arguments();
  const auto num_arguments = arguments.size();
  const auto first = stack->size() - num_arguments;
  Call call;
  int default_generator_at = -1;
  for (size_t i = 0; i < num_arguments; ++i) {
    auto& value = (*stack)[first + i];
    if (value.isTensor()) {
      const auto& t = value.toTensor();
      if (is_npu(t)) {
        value = call.to_cpu(t);
      }
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      c10::List<at::Tensor> converted;
      converted.reserve(list.size());
      for (const at::Tensor& t : list) {
        converted.push_back(call.to_cpu(t));
      }
      value = converted;
    } else if (value.isList()) {
      auto list = value.toList();
      if (list.size() > 0 && list.elementType()->kind() == c10::TypeKind::OptionalType) {
        c10::impl::GenericList converted(list.elementType());
        converted.reserve(list.size());
        for (const c10::IValue& item : list) {
          converted.push_back(item.isTensor() ? c10::IValue(call.to_cpu(item.toTensor())) : item);
        }
        value = converted;
      }
    } else if (value.isGenerator()) {
      const auto& gen = value.toGenerator();
      if (gen.defined() && gen.device().type() == kNpu) {
        value = cpu_generator_of(gen);
      }
    } else if (value.isNone() && is_optional_generator(arguments[i])) {
      default_generator_at = static_cast<int>(i);
    }
  }
  const auto device = call.device < 0 ? current_device() : call.device;
  if (default_generator_at >= 0 && call.device >= 0) {
    // npu randomness comes from the npu device's generator, as on the device
    (*stack)[first + default_generator_at] = cpu_generator_of(default_generator(device));
  }
  c10::DeviceGuard guard(c10::Device(kNpu, device));

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  // only a mutable argument can have changed (an out= tensor resized); the comparison is cheap
  for (auto& [npu, cpu] : call.tensors) {
    const auto* c = cpu.unsafeGetTensorImpl();
    const auto* n = npu.unsafeGetTensorImpl();
    if (c->storage().data() != n->storage().data() || c->sizes() != n->sizes() ||
        c->storage_offset() != n->storage_offset() || c->strides() != n->strides()) {
      call.sync_back(npu, cpu);
    }
  }
  const auto num_returns = schema.returns().size();
  const auto returns = stack->size() - num_returns;
  for (size_t i = 0; i < num_returns; ++i) {
    auto& value = (*stack)[returns + i];
    if (value.isTensor()) {
      value = call.to_npu(value.toTensor());
    } else if (value.isTensorList()) {
      auto list = value.toTensorList();
      c10::List<at::Tensor> converted;
      converted.reserve(list.size());
      for (const at::Tensor& t : list) {
        converted.push_back(call.to_npu(t));
      }
      value = converted;
    }
  }
}

// ---------------------------------------------------------------- kernels

at::Tensor empty_memory_format(
    c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
    std::optional<c10::Device> device, std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  const auto where = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "simulated npu: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(where);
  return at::detail::empty_generic(
      size, npu_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::dtype_or_default(dtype),
      memory_format);
}

at::Tensor empty_strided(
    c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout, std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  const auto where = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "simulated npu: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
  const c10::DeviceGuard guard(where);
  return at::detail::empty_strided_generic(
      size, stride, npu_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::dtype_or_default(dtype));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  auto src = is_npu(self) ? cpu_alias(self) : self;
  auto out = is_npu(dst) ? cpu_alias(dst) : dst;
  out.copy_(src, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

void set_geometry(
    c10::TensorImpl* impl, c10::IntArrayRef size, std::optional<c10::IntArrayRef> stride, int64_t offset) {
  if (stride.has_value() && !stride->empty()) {
    impl->set_sizes_and_strides(size, *stride, offset);
  } else {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(offset);
  }
  // the storage must hold the furthest element
  int64_t extent = 1;
  bool empty = false;
  for (size_t i = 0; i < impl->sizes().size(); ++i) {
    if (impl->sizes()[i] == 0) {
      empty = true;
      break;
    }
    extent += (impl->sizes()[i] - 1) * impl->strides()[i];
  }
  if (!empty) {
    const auto need = static_cast<size_t>((offset + extent) * static_cast<int64_t>(impl->dtype().itemsize()));
    auto* storage = impl->unsafe_storage().unsafeGetStorageImpl();
    if (need > storage->nbytes()) {
      resize_bytes(storage, need);
    }
  }
}

const at::Tensor& resize_(
    const at::Tensor& self, c10::SymIntArrayRef size, std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  if (impl->sizes() != sizes) {
    set_geometry(impl, sizes, std::nullopt, impl->storage_offset());
  }
  if (memory_format.has_value() && *memory_format != c10::MemoryFormat::Preserve) {
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_storage_offset_(
    at::Tensor& self, c10::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
    c10::SymIntArrayRef stride) {
  TORCH_CHECK(
      source.device() == self.device(), "simulated npu: cannot set the storage of a tensor on ", self.device(),
      " to a storage on ", source.device());
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->storage().unsafeGetStorageImpl() != source.unsafeGetStorageImpl()) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  set_geometry(impl, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), offset.expect_int());
  return self;
}

at::Tensor& set_storage_(at::Tensor& self, c10::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  set_geometry(impl, {n}, std::nullopt, 0);
  return self;
}

at::Tensor& set_tensor_(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() != source.unsafeGetTensorImpl()) {
    auto* impl = self.unsafeGetTensorImpl();
    impl->set_storage_keep_dtype(source.storage());
    set_geometry(impl, source.sizes(), source.strides(), source.storage_offset());
  }
  return self;
}

at::Tensor& set_empty_(at::Tensor& self) {
  c10::Storage empty(
      c10::Storage::use_byte_size_t(), 0, at::DataPtr(nullptr, self.device()), npu_allocator(), true);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(empty));
  set_geometry(impl, {0}, std::nullopt, 0);
  return self;
}

// zero_ (torch.zeros, vLLM's KV cache): a large allocation's whole pages go back to the host instead of
// being written -- they read as zeros until written again -- so a zero-filled KV cache costs the host
// what the model later writes of it, as torch.empty's does.  On the device it is zeros all the same.
at::Tensor& zero_(at::Tensor& self) {
  if (self.numel() > 0 && self.is_contiguous() &&
      zero_unbacked(self.storage().data_ptr(), self.data_ptr(), self.nbytes())) {
    return self;
  }
  cpu_alias(self).zero_();
  return self;
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::_local_scalar_dense(cpu_alias(self));
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  const auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.device().is_cpu() || t.device().type() == kNpu);
  };
  if (dense(self) && dense(from)) {
    return true;
  }
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

void record_stream(at::Tensor&, c10::Stream) {}

// ATen's CPU native_dropout draws its mask inside the kernel, from the CPU generator; here the mask is an npu
// tensor, so its bernoulli_ reaches the fallback, which gives it the npu device's generator (as on the device).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) {
    return std::make_tuple(input, at::empty_like(input));
  }
  if (train.has_value() && !*train) {
    return std::make_tuple(input.clone(), at::ones_like(input, input.options().dtype(c10::kBool)));
  }
  const double keep = 1.0 - p;
  const double scale = keep == 0 ? 0.0 : 1.0 / keep;
  at::Tensor mask = at::empty_like(input, input.options().dtype(c10::kBool));
  mask.bernoulli_(keep);
  return std::make_tuple(input.mul(mask).mul_(scale), mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset_);
  m.impl("set_.source_Storage", set_storage_);
  m.impl("set_.source_Tensor", set_tensor_);
  m.impl("set_", set_empty_);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("record_stream", record_stream);
  m.impl("native_dropout", native_dropout);
  m.impl("zero_", zero_);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&alias_fallback>());
}

}  // namespace npu_sim
