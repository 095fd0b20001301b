// The decode strategy's entry points (backends.h): float32 goes to the FFMA kernels of
// decode_stream.cu, bf16/fp16 to the cooperative tensor-core kernel of decode_tensor_core.cu.
#include <cstdint>
#include <string>

#include "backends.h"

namespace latentkv::detail {
namespace {

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

int64_t cuda_decode_workspace_size(const Problem& p) {
  return p.dtype == DType::kFloat32 ? cuda_decode_fp32_workspace_size(p)
                                    : cuda_decode_tc_workspace_size(p);
}

// Both families read every weight row in 16-byte pieces and keep their scratch in the workspace.
Status cuda_decode_supports(const Problem& p, const Args& a) {
  const Status fits = p.dtype == DType::kFloat32 ? cuda_decode_fp32_fits(p) : cuda_decode_tc_fits(p);
  if (!fits.ok()) return fits;
  const int64_t vector = 16 / element_size(p.dtype);  // elements per 16 bytes
  if (a.w_down_stride_row % vector != 0 || a.w_up_k_stride_row % vector != 0 ||
      a.w_up_v_stride_row % vector != 0 || !aligned16(a.w_down) || !aligned16(a.w_up_k) ||
      !aligned16(a.w_up_v)) {
    return {StatusCode::kUnsupported,
            "cuda-decode: needs the weight row strides to be multiples of " +
                std::to_string(vector) + " elements and the weights 16-byte aligned"};
  }
  const int64_t need = cuda_decode_workspace_size(p);
  if (a.workspace == nullptr || a.workspace_bytes < need || !aligned16(a.workspace)) {
    return {StatusCode::kInvalidArgument,
            "args.workspace_bytes = " + std::to_string(a.workspace_bytes) +
                ": cuda-decode needs a 16-byte aligned workspace of " + std::to_string(need) +
                " bytes"};
  }
  return Status::Ok();
}

bool cuda_decode_preferred(const Problem& p) {
  return p.dtype == DType::kFloat32 ? cuda_decode_fp32_preferred(p) : cuda_decode_tc_preferred(p);
}

Status run_cuda_decode(const Problem& p, const Args& a, Stream stream) {
  return p.dtype == DType::kFloat32 ? run_cuda_decode_fp32(p, a, stream)
                                    : run_cuda_decode_tc(p, a, stream);
}

}  // namespace latentkv::detail
