// The decode strategy's entry points (backends.h): float32 goes to the FFMA kernels of
// decode_stream.cu, bf16/fp16 to the tensor-core kernels of decode_tensor_core.cu.
#include "backends.h"

namespace latentkv::detail {

int64_t cuda_decode_workspace_size(const Problem& p) {
  return p.dtype == DType::kFloat32 ? cuda_decode_fp32_workspace_size(p)
                                    : cuda_decode_tc_workspace_size(p);
}

Status cuda_decode_supports(const Problem& p, const Args& a) {
  return p.dtype == DType::kFloat32 ? cuda_decode_fp32_supports(p, a)
                                    : cuda_decode_tc_supports(p, a);
}

bool cuda_decode_preferred(const Problem& p) {
  return p.dtype == DType::kFloat32 ? cuda_decode_fp32_preferred(p) : cuda_decode_tc_preferred(p);
}

Status run_cuda_decode(const Problem& p, const Args& a, Stream stream) {
  return p.dtype == DType::kFloat32 ? run_cuda_decode_fp32(p, a, stream)
                                    : run_cuda_decode_tc(p, a, stream);
}

}  // namespace latentkv::detail
