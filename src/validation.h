// Validation helpers shared by the API layers of every operation (api.cpp for the projection,
// mla/api.cpp for the MLA path): tensor layouts as (extent, stride) lists checked for negative or
// overlapping strides and int64 overflow, byte ranges for the aliasing checks, and the
// dimension checks (positive, or non-negative where an operation computes empty sums). Every
// refusal names the argument and its value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "latentkv/latentkv.h"

namespace latentkv::detail {

#define LATENTKV_RETURN_IF_ERROR(expr)   \
  do {                                   \
    ::latentkv::Status status_ = (expr); \
    if (!status_.ok()) return status_;   \
  } while (0)

inline Status invalid(const std::string& what) { return {StatusCode::kInvalidArgument, what}; }

// One tensor dimension as validation sees it: extent and element stride.
struct Dim {
  int64_t extent;
  int64_t stride;
  const char* stride_name;  // the Args field, for messages; null for the contiguous inner dim
  bool shared = false;      // a read-only input's dimension that may be broadcast (stride 0)
};

// The element offsets a tensor touches, relative to its base pointer.
struct Span {
  int64_t last = 0;  // largest element offset; -1 for a tensor with no elements
  bool empty() const { return last < 0; }
};

// Checks that a row-major (outermost first) layout with padded strides has non-negative strides,
// that each stride holds the dimension inside it (no overlapping rows) and that the largest
// element offset, in bytes, fits in int64. Dims of extent 1 may carry any non-negative stride; a
// tensor with an extent of 0 has no elements, and only its strides' signs are checked.
Status check_layout(const char* tensor, const Dim* dims, int rank, int64_t elem_bytes, Span* span);

struct Range {
  const char* name;
  uintptr_t begin, end;  // bytes [begin, end)
};

Range byte_range(const char* name, const void* base, const Span& span, int64_t elem_bytes);

// Empty ranges (tensors with no elements) overlap nothing.
inline bool overlaps(const Range& a, const Range& b) {
  return a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end;
}

// The product of dimensions in wrapping (unsigned) arithmetic: for the dense strides that
// contiguous_args() and contiguous_mla_args() compute before anything is checked; check() refuses
// a problem whose products overflow, whatever strides it comes with.
inline int64_t wrapping_product(std::initializer_list<int64_t> factors) {
  uint64_t product = 1;
  for (int64_t f : factors) product *= static_cast<uint64_t>(f);
  return static_cast<int64_t>(product);
}

// Packed tensors of a problem are limited to 2^60 bytes, so that every size derived from them
// (workspace regions, the weights' total) and the sums of a few such sizes fit in int64.
constexpr int64_t kMaxPackedBytes = int64_t{1} << 60;
// "<product> = <f0> * <f1> ... elements of <elem_bytes> bytes: <tensor> would exceed 2^60 bytes"
// unless the product of `factors` (non-negative; product names the fields) times elem_bytes fits.
Status check_packed_bytes(const char* tensor, const char* product,
                          std::initializer_list<int64_t> factors, int64_t elem_bytes);

// "problem.<name> = <value> must be positive" unless value > 0.
Status check_positive(const char* name, int64_t value);
// "problem.<name> = <value> must not be negative" unless value >= 0.
Status check_nonnegative(const char* name, int64_t value);

}  // namespace latentkv::detail
