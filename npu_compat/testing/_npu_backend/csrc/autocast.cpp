// Autocast on npu: the AutocastPrivateUse1 dispatch key, which torch enables for `npu` tensors
// inside `torch.autocast("npu", ...)` (verl's FSDP forward runs under it).
//
// torch_npu serves this key as torch serves AutocastCUDA: the same cast policy per operator
// (lower precision for matmuls and convolutions, fp32 for reductions, norms and losses, promotion
// for mixed inputs) and a fallthrough for every other operator.  Here torch's own policy lists
// (ATen/autocast_mode.h, "to make sure other backends can reuse the policy op list") are
// registered for PrivateUse1; without any registration every operator under autocast fails
// with "Could not run 'aten::...' with arguments from the 'Autocastnpu' backend".
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace npu_sim {
namespace {

// the names the policy lists' signatures are written with
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

at::Tensor binary_cross_entropy_banned(const at::Tensor&, const at::Tensor&,
                                       const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Use torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, "
              "which are safe to autocast.");
}

#define NPU_SIM_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NPU_SIM_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NPU_SIM_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NPU_SIM_DIFFERENT_REDISPATCH(...) KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(__VA_ARGS__)
#define NPU_SIM_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NPU_SIM_LOWER_PRECISION_FP)
  AT_FORALL_FP32(NPU_SIM_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NPU_SIM_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(NPU_SIM_DIFFERENT_REDISPATCH)
  AT_FORALL_PROMOTE(NPU_SIM_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN((&binary_cross_entropy_banned)));
}

}  // namespace
}  // namespace npu_sim
