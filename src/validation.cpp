// Validation helpers shared by the operations' API layers (validation.h).
#include "validation.h"

namespace latentkv::detail {

Status check_layout(const char* tensor, const Dim* dims, int rank, int64_t elem_bytes,
                    Span* span) {
  for (int i = 0; i < rank; ++i) {
    if (dims[i].extent != 0) continue;
    for (int j = 0; j < rank; ++j) {
      if (dims[j].stride_name != nullptr && dims[j].stride < 0) {
        return invalid(std::string(dims[j].stride_name) + " = " + std::to_string(dims[j].stride) +
                       " is negative");
      }
    }
    span->last = -1;
    return Status::Ok();
  }
  int64_t inner_extent = 1;  // elements covered by the dims inside the current one
  int64_t last = 0;
  for (int i = rank - 1; i >= 0; --i) {
    const Dim& d = dims[i];
    if (d.stride_name != nullptr) {
      if (d.stride < 0) {
        return invalid(std::string(d.stride_name) + " = " + std::to_string(d.stride) +
                       " is negative");
      }
      if (d.extent > 1 && d.stride < inner_extent) {
        return invalid(std::string(d.stride_name) + " = " + std::to_string(d.stride) + " for " +
                       tensor + " is smaller than the " + std::to_string(inner_extent) +
                       " elements of the dimensions inside it, so rows would overlap");
      }
    }
    int64_t reach = 0;
    if (__builtin_mul_overflow(d.extent - 1, d.stride, &reach) ||
        __builtin_add_overflow(last, reach, &last) || last == INT64_MAX) {
      return invalid(std::string(tensor) + " spans more than 2^63 elements with " +
                     (d.stride_name ? d.stride_name : "its inner dimension") + " = " +
                     std::to_string(d.stride));
    }
    inner_extent = last + 1;
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(last + 1, elem_bytes, &bytes)) {
    return invalid(std::string(tensor) + " spans more than 2^63 bytes");
  }
  span->last = last;
  return Status::Ok();
}


Range byte_range(const char* name, const void* base, const Span& span, int64_t elem_bytes) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  if (span.empty()) return {name, b, b};
  return {name, b, b + static_cast<uintptr_t>((span.last + 1) * elem_bytes)};
}


Status check_positive(const char* name, int64_t value) {
  if (value <= 0) {
    return invalid(std::string("problem.") + name + " = " + std::to_string(value) +
                   " must be positive");
  }
  return Status::Ok();
}

Status check_nonnegative(const char* name, int64_t value) {
  if (value < 0) {
    return invalid(std::string("problem.") + name + " = " + std::to_string(value) +
                   " must not be negative");
  }
  return Status::Ok();
}

}  // namespace latentkv::detail
