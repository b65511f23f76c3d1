#pragma once
//! \file
//! The exp of the sampling rows, `exp_nonpositive`: one definition that the host kernels (on
//! floats and on the vectors of detail/simd.hpp) and the CUDA kernels (backend/cuda) all call, so
//! that a device computes the host's probabilities operation for operation. Internals, not API.
//!
//! The algorithm is written once, in `exp_nonpositive_with<Ops>` (detail/kernels/exp_with.inl,
//! included here and, for the vectors of each CPU target, by detail/rows.hpp), over the
//! operations of `Ops`:
//! `scalar_exp_ops` (here: host and device floats; on the device every operation is rounded on its
//! own, `__fmul_rn` / `__fadd_rn`, so nvcc cannot fuse them) and `vector_exp_ops`
//! (detail/kernels/simd_exp.inl: host vectors, with single AVX-512 instructions for the clamp and
//! the final scaling where they give the same values). A host compiler may still contract a
//! multiply and an add into a fused multiply-add where the target has one (GCC does in its default
//! GNU mode): that can move the last bit of an exp, which is why device and host results are
//! compared "within rounding" by the tests rather than bit for bit.

#include <bit>
#include <cstdint>

#include "specdec/core/host_device.hpp"

namespace specdec::detail {

//! Inputs below this give an exp below the smallest normal float; `exp_nonpositive` returns 0.
inline constexpr float exp_lower_limit = -87.33654f;

//! The constants of `exp_nonpositive_with`.
namespace exp_constants {
inline constexpr float log2e = 1.44269504088896341f;
inline constexpr float ln2_hi = 0.693359375f;
inline constexpr float ln2_lo = -2.12194440e-4f;
inline constexpr float round_magic = 12582912.0f;  //!< 1.5 * 2^23: adding it rounds to an integer
// The Cephes expf polynomial, highest degree first.
inline constexpr float p0 = 1.9875691500e-4f;
inline constexpr float p1 = 1.3981999507e-3f;
inline constexpr float p2 = 8.3334519073e-3f;
inline constexpr float p3 = 4.1665795894e-2f;
inline constexpr float p4 = 1.6666665459e-1f;
inline constexpr float p5 = 5.0000001201e-1f;
}  // namespace exp_constants

//! The operations of `exp_nonpositive_with` on one float, host and device.
struct scalar_exp_ops {
  using value = float;  //!< the operand type

  [[nodiscard]] SPECDEC_HOST_DEVICE static constexpr float splat(float c) noexcept { return c; }
  //! a * b, rounded on its own: never fused with the addition that follows (on the host an empty
  //! asm holds the product in a register, so that no flag or target turns the pair into a fused
  //! multiply-add and every host target gives the same bits).
  [[nodiscard]] SPECDEC_HOST_DEVICE static float mul(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    float r = a * b;
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    asm("" : "+x"(r));
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
    asm("" : "+w"(r));
#endif
    return r;
#endif
  }
  [[nodiscard]] SPECDEC_HOST_DEVICE static float add(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
  }
  [[nodiscard]] SPECDEC_HOST_DEVICE static float sub(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
  }
  //! max(x, `exp_lower_limit`); a NaN passes through (and makes the exp NaN).
  [[nodiscard]] SPECDEC_HOST_DEVICE static float clamp_low(float x) noexcept {
    return x < exp_lower_limit ? exp_lower_limit : x;
  }
  //! er * 2^n, where `shifted` = x * log2e + round_magic holds n in its low mantissa bits; 0 where
  //! the input `x` is below `exp_lower_limit`.
  [[nodiscard]] SPECDEC_HOST_DEVICE static float scale_pow2(float er, float /*n*/, float shifted,
                                                            float x) noexcept {
#if defined(__CUDA_ARCH__)
    std::int32_t const ni = __float_as_int(shifted) - 0x4B400000;
    float const scale = __int_as_float((ni + 127) << 23);
#else
    std::int32_t const ni = std::bit_cast<std::int32_t>(shifted) - 0x4B400000;
    float const scale = std::bit_cast<float>((ni + 127) << 23);
#endif
    float const y = mul(er, scale);
    return x < exp_lower_limit ? 0.0f : y;
  }
};

// clang-format off
#include "specdec/detail/kernels/exp_with.inl"
// clang-format on

//! `exp_nonpositive_with<scalar_exp_ops>`: exp(x) for one float x <= 0, on the host or a device.
[[nodiscard]] SPECDEC_HOST_DEVICE inline float exp_nonpositive(float x) noexcept {
  return exp_nonpositive_with<scalar_exp_ops>(x);
}

}  // namespace specdec::detail
