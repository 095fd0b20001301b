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
  const Dim* widest = &dims[rank - 1];  // the dim that reaches furthest: named on a refusal
  int64_t widest_reach = -1;
  for (int i = rank - 1; i >= 0; --i) {
    const Dim& d = dims[i];
    if (d.stride_name != nullptr) {
      if (d.stride < 0) {
        return invalid(std::string(d.stride_name) + " = " + std::to_string(d.stride) +
                       " is negative");
      }
      if (d.extent > 1 && d.stride < inner_extent && !(d.shared && d.stride == 0)) {
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
    if (reach > widest_reach) {
      widest = &d;
      widest_reach = reach;
    }
    inner_extent = last + 1;
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(last + 1, elem_bytes, &bytes)) {
    const std::string by =
        widest->stride_name != nullptr
            ? std::string(widest->stride_name) + " = " + std::to_string(widest->stride) +
                  " over " + std::to_string(widest->extent) + " rows"
            : "its " + std::to_string(widest->extent) + " contiguous elements";
    return invalid(std::string(tensor) + " spans more than 2^63 bytes with " + by + " (" +
                   std::to_string(last + 1) + " elements of " + std::to_string(elem_bytes) +
                   " bytes)");
  }
  span->last = last;
  return Status::Ok();
}

Range byte_range(const char* name, const void* base, const Span& span, int64_t elem_bytes) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  if (span.empty()) return {name, b, b};
  return {name, b, b + static_cast<uintptr_t>((span.last + 1) * elem_bytes)};
}


Status check_packed_bytes(const char* tensor, const char* product,
                          std::initializer_list<int64_t> factors, int64_t elem_bytes) {
  int64_t bytes = elem_bytes;
  bool over = false;
  std::string values;
  for (int64_t f : factors) {
    if (f == 0) return Status::Ok();  // no elements
    over = over || __builtin_mul_overflow(bytes, f, &bytes);
    values += (values.empty() ? "" : " * ") + std::to_string(f);
  }
  if (!over && bytes <= kMaxPackedBytes) return Status::Ok();
  return invalid(std::string(product) + " = " + values + " elements of " +
                 std::to_string(elem_bytes) + " bytes: " + tensor + " would exceed 2^60 bytes");
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
