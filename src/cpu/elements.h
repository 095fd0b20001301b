// The CPU backend's element types: float32, bfloat16 and float16 values in host memory, read as
// float32 and written rounded once to nearest even, NaN staying NaN: one element through the CUDA
// toolkit's host conversions (the same functions the CUDA backend rounds with), rows eight at a
// time through AVX2 / F16C (which the library's x86-64-v3 target has) to the same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "latentkv/latentkv.h"

namespace latentkv::detail {

// One element's conversions: the CUDA toolkit's host implementations (round to nearest even, NaN
// kept), on the 16-bit patterns the arrays hold.
inline float bf16_to_float(uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

inline uint16_t float_to_bf16(float f) {
  return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(f)).x;
}

inline float fp16_to_float(uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

inline uint16_t float_to_fp16(float f) { return static_cast<__half_raw>(__float2half_rn(f)).x; }

// Element i of an array of dtype, as float32.
inline float load_element(const void* base, int64_t i, DType dtype) {
  if (dtype == DType::kFloat32) return static_cast<const float*>(base)[i];
  const uint16_t bits = static_cast<const uint16_t*>(base)[i];
  return dtype == DType::kBFloat16 ? bf16_to_float(bits) : fp16_to_float(bits);
}

// value rounded to dtype into element i.
inline void store_element(void* base, int64_t i, DType dtype, float value) {
  if (dtype == DType::kFloat32) {
    static_cast<float*>(base)[i] = value;
  } else {
    static_cast<uint16_t*>(base)[i] =
        dtype == DType::kBFloat16 ? float_to_bf16(value) : float_to_fp16(value);
  }
}

// Eight float32 values rounded to bf16 / fp16 bit patterns, bit for bit as float_to_bf16 /
// float_to_fp16 round them: to nearest even, a NaN as the toolkit's 0x7fff. bf16 adds 0x7fff plus
// the kept part's lowest bit and truncates (infinities stay, overflow goes to infinity); fp16 is
// F16C's conversion (IEEE round to nearest even, subnormals kept).
inline __m128i round8_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fff),
                         _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
inline __m128i round8_fp16(__m256 v) {
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan),
                                        _mm256_extracti128_si256(nan, 1));
  return _mm_blendv_epi8(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                         _mm_set1_epi16(0x7fff), nan16);
}

// values[0:n] rounded to dtype into elements [i, i + n), eight at a time.
inline void store_elements(void* base, int64_t i, DType dtype, const float* values, int64_t n) {
  if (dtype == DType::kFloat32) {
    std::memcpy(static_cast<float*>(base) + i, values, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(base) + i;
  int64_t j = 0;
  if (dtype == DType::kBFloat16) {
    for (; j + 8 <= n; j += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                       round8_bf16(_mm256_loadu_ps(values + j)));
    }
    for (; j < n; ++j) out[j] = float_to_bf16(values[j]);
  } else {
    for (; j + 8 <= n; j += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                       round8_fp16(_mm256_loadu_ps(values + j)));
    }
    for (; j < n; ++j) out[j] = float_to_fp16(values[j]);
  }
}

// value as dtype holds it (rounded to nearest even; float32 unchanged).
inline float round_to(float value, DType dtype) {
  if (dtype == DType::kFloat32) return value;
  return dtype == DType::kBFloat16 ? bf16_to_float(float_to_bf16(value))
                                   : fp16_to_float(float_to_fp16(value));
}

// Eight bf16 / fp16 values as float32 lanes.
inline __m256 widen8_bf16(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8_bf16(const uint16_t* p) {
  return widen8_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8_fp16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// dst[0:n] = src[0:n] (dtype) as float32, eight at a time.
inline void to_float(const void* src, DType dtype, int64_t n, float* dst) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  if (dtype == DType::kBFloat16) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_bf16(s + i));
    for (; i < n; ++i) dst[i] = bf16_to_float(s[i]);
  } else {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_fp16(s + i));
    for (; i < n; ++i) dst[i] = fp16_to_float(s[i]);
  }
}

// row[0:n] rounded to dtype in place (float32 unchanged), eight at a time; with bits (bf16 /
// fp16), their bit patterns too.
inline void round_row(float* row, int64_t n, DType dtype, uint16_t* bits) {
  if (dtype == DType::kFloat32) return;
  const bool bf16 = dtype == DType::kBFloat16;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(row + j);
    const __m128i h = bf16 ? round8_bf16(v) : round8_fp16(v);
    if (bits != nullptr) _mm_storeu_si128(reinterpret_cast<__m128i*>(bits + j), h);
    _mm256_storeu_ps(row + j, bf16 ? widen8_bf16(h) : _mm256_cvtph_ps(h));
  }
  for (; j < n; ++j) {
    const uint16_t h = bf16 ? float_to_bf16(row[j]) : float_to_fp16(row[j]);
    if (bits != nullptr) bits[j] = h;
    row[j] = bf16 ? bf16_to_float(h) : fp16_to_float(h);
  }
}

}  // namespace latentkv::detail
