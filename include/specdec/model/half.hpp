#pragma once
//! \file
//! IEEE binary16 (F16) and bfloat16 (BF16) conversions to and from float32, bit-exact: float to
//! 16-bit rounds to nearest, ties to even; 16-bit to float is exact. Used by the GGUF reader and
//! writer.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace specdec {

//! The float32 value of the binary16 bit pattern `h` (exact, subnormals and infinities included;
//! a NaN keeps its sign and payload and becomes quiet).
[[nodiscard]] constexpr float half_to_float(std::uint16_t h) noexcept {
  std::uint32_t const sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t const exponent = (h >> 10) & 0x1fu;
  std::uint32_t const mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32.
    float const magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  if (exponent == 31) {  // infinity, or NaN (made quiet, as the F16C instructions do)
    std::uint32_t const quiet = mantissa != 0 ? 0x400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

//! The binary16 bit pattern nearest to `f` (ties to even); overflow gives infinity, NaN stays a
//! (quiet) NaN.
[[nodiscard]] constexpr std::uint16_t float_to_half(float f) noexcept {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  auto const sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // infinity or NaN
    std::uint32_t const nan_bits = x > 0x7f800000u ? (0x200u | ((x >> 13) & 0x3ffu)) : 0u;
    return static_cast<std::uint16_t>(sign | 0x7c00u | nan_bits);
  }
  if (x >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (x < 0x38800000u) {               // below 2^-14: a half subnormal or zero
    if (x < 0x33000000u) return sign;  // below 2^-25 (2^-25 itself ties to 0)
    std::uint32_t const mantissa = (x & 0x7fffffu) | 0x800000u;
    std::uint32_t const shift = 126u - (x >> 23);  // 14..24
    std::uint32_t h = mantissa >> shift;
    std::uint32_t const rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (x - 0x38000000u) >> 13;  // rebias the exponent, keep 10 mantissa bits
  std::uint32_t const rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves up the exponent
  return static_cast<std::uint16_t>(sign | h);
}

//! The float32 value of the bfloat16 bit pattern `b` (exact).
[[nodiscard]] constexpr float bf16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

//! The bfloat16 bit pattern nearest to `f` (ties to even); NaN stays a (quiet) NaN.
[[nodiscard]] constexpr std::uint16_t float_to_bf16(float f) noexcept {
  std::uint32_t const x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

//! Converts `out.size()` little-endian binary16 values at `in` (any alignment) to float32, exactly
//! as `half_to_float` does (with the F16C instructions where the target has them).
inline void half_to_float(std::byte const* in, std::span<float> out) noexcept {
  constexpr std::size_t chunk = 256;
  std::uint16_t buffer[chunk];
  for (std::size_t begin = 0; begin < out.size(); begin += chunk) {
    std::size_t const n = out.size() - begin < chunk ? out.size() - begin : chunk;
    std::memcpy(buffer, in + 2 * begin, 2 * n);
    float* const dst = out.data() + begin;
    std::size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
      __m128i const h = _mm_loadu_si128(reinterpret_cast<__m128i const*>(buffer + i));
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
#endif
    for (; i < n; ++i) dst[i] = half_to_float(buffer[i]);
  }
}

//! Converts `out.size()` little-endian bfloat16 values at `in` (any alignment) to float32.
inline void bf16_to_float(std::byte const* in, std::span<float> out) noexcept {
  constexpr std::size_t chunk = 256;
  std::uint16_t buffer[chunk];
  for (std::size_t begin = 0; begin < out.size(); begin += chunk) {
    std::size_t const n = out.size() - begin < chunk ? out.size() - begin : chunk;
    std::memcpy(buffer, in + 2 * begin, 2 * n);
    for (std::size_t i = 0; i < n; ++i) out[begin + i] = bf16_to_float(buffer[i]);
  }
}

}  // namespace specdec
