#pragma once
//! \file
//! Row kernels shared by the sampling headers: a float exp accurate to float rounding, and
//! vectorised passes over one row (checked maximum, exp-and-sum, threshold statistics, gathers,
//! double-precision sums, argmax). Internals (namespace `specdec::detail`), not API.
//!
//! The kernels use GCC / Clang vector extensions: `simd_width` floats per vector (8 where AVX is
//! enabled, else 4), so a Release build with -march=native uses AVX registers and a baseline
//! build SSE ones; scalar code elsewhere compiles unchanged. Every reduction runs over
//! `row_lanes` = 16 logical lanes combined in a fixed order whatever the vector width, so a
//! result does not depend on the instruction set, except that fused multiply-add contraction
//! (where the compiler uses FMA) may change the last bit of an exp.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#include "specdec/core/error.hpp"

#if !defined(__GNUC__)
#error "specdec/sampling needs the GCC / Clang vector extensions (g++ 12+ or clang++ 14+)"
#endif

#if defined(__SSE__)
#include <immintrin.h>
#endif

namespace specdec::detail {

//! Floats per vector register used by the kernels.
#if defined(__AVX512F__)
inline constexpr std::size_t simd_width = 16;
#elif defined(__AVX__)
inline constexpr std::size_t simd_width = 8;
#else
inline constexpr std::size_t simd_width = 4;
#endif
//! A vector of `simd_width` floats.
using vfloat = float __attribute__((vector_size(simd_width * sizeof(float))));
//! A vector of `simd_width` 32-bit integers (comparison masks: -1 true, 0 false).
using vint = std::int32_t __attribute__((vector_size(simd_width * sizeof(float))));
//! A vector of `simd_width / 2` doubles.
using vdouble_half = double __attribute__((vector_size(simd_width * sizeof(float))));

//! Logical lanes of every reduction (16 floats: two AVX vectors, four SSE vectors).
inline constexpr std::size_t row_lanes = 16;
//! Vectors per logical step.
inline constexpr std::size_t row_vectors = row_lanes / simd_width;
//! Entries summed in float per lane before the lane sums are added into doubles.
inline constexpr std::size_t row_block = 512;

//! Loads `simd_width` floats from p (any alignment).
[[nodiscard, gnu::always_inline]] inline vfloat load(float const* p) noexcept {
  vfloat v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
//! Stores `simd_width` floats to p (any alignment).
[[gnu::always_inline]] inline void store(float* p, vfloat v) noexcept {
  __builtin_memcpy(p, &v, sizeof v);
}
//! A vector with every lane `x`.
[[nodiscard, gnu::always_inline]] inline vfloat splat(float x) noexcept {
  return vfloat{} + x;
}
//! Whether any lane of a mask is set (one vector test where the instruction set has one).
[[nodiscard, gnu::always_inline]] inline bool any(vint m) noexcept {
#if defined(__AVX512F__)
  static_assert(sizeof(vint) == sizeof(__m512i));
  __m512i v;
  __builtin_memcpy(&v, &m, sizeof v);
  return _mm512_test_epi32_mask(v, v) != 0;
#elif defined(__AVX__)
  static_assert(sizeof(vint) == sizeof(__m256i));
  __m256i v;
  __builtin_memcpy(&v, &m, sizeof v);
  return _mm256_testz_si256(v, v) == 0;
#elif defined(__SSE4_1__)
  static_assert(sizeof(vint) == sizeof(__m128i));
  __m128i v;
  __builtin_memcpy(&v, &m, sizeof v);
  return _mm_testz_si128(v, v) == 0;
#else
  std::uint64_t w[sizeof(vint) / 8];
  __builtin_memcpy(w, &m, sizeof w);
  std::uint64_t acc = 0;
  for (std::uint64_t x : w) acc |= x;
  return acc != 0;
#endif
}

//! The lanes of `v` (a `vfloat`) combined by `op` as a pairwise tree of vector halves (lane l with
//! lane l + simd_width / 2, then l + simd_width / 4, ...), without a round trip through memory.
template <class V, class Op>
[[nodiscard, gnu::always_inline]] inline float reduce_lanes(V v, Op op) noexcept {
  using f8 = float __attribute__((vector_size(8 * sizeof(float))));
  using f4 = float __attribute__((vector_size(4 * sizeof(float))));
  using f2 = float __attribute__((vector_size(2 * sizeof(float))));
  constexpr std::size_t width = sizeof(V) / sizeof(float);
  static_assert(width == 16 || width == 8 || width == 4);
  f4 t4;
  if constexpr (width == 16) {
    f8 const t8 = op(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                     __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
    t4 = op(__builtin_shufflevector(t8, t8, 0, 1, 2, 3),
            __builtin_shufflevector(t8, t8, 4, 5, 6, 7));
  } else if constexpr (width == 8) {
    t4 = op(__builtin_shufflevector(v, v, 0, 1, 2, 3), __builtin_shufflevector(v, v, 4, 5, 6, 7));
  } else {
    t4 = v;
  }
  f2 const t2 = op(__builtin_shufflevector(t4, t4, 0, 1), __builtin_shufflevector(t4, t4, 2, 3));
  return op(t2, __builtin_shufflevector(t2, t2, 1, 0))[0];
}

//! max(x, 0) without a branch (x not NaN): x where x > 0, else a zero (its sign unspecified:
//! the callers add it to a non-negative sum, which it leaves unchanged).
[[nodiscard, gnu::always_inline]] inline float positive_part(float x) noexcept {
#if defined(__SSE__)
  return _mm_cvtss_f32(_mm_max_ss(_mm_set_ss(x), _mm_setzero_ps()));
#else
  return x > 0.0f ? x : 0.0f;
#endif
}

//! Makes `x` opaque to the optimiser (no instruction): a select computing it is then not merged
//! into the branches of later tests on it.
[[gnu::always_inline]] inline void opaque(float& x) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+x"(x));
#elif defined(__aarch64__)
  asm("" : "+w"(x));
#else
  (void)x;
#endif
}

//! `keep ? a : b` for indices, without a branch.
[[nodiscard, gnu::always_inline]] inline std::size_t select_index(bool keep, std::size_t a,
                                                                  std::size_t b) noexcept {
  return b ^ ((a ^ b) & (std::size_t{0} - static_cast<std::size_t>(keep)));
}

//! Inputs below this give an exp below the smallest normal float; `exp_nonpositive` returns 0.
inline constexpr float exp_lower_limit = -87.33654f;

//! exp(x) for x <= 0 (x may be -inf; must not be NaN), on a float or a `vfloat`: within 1 ulp of
//! the correctly rounded value (checked exhaustively over [-87.34, 0]); exactly 1 at x = 0 and
//! exactly 0 below `exp_lower_limit` (results that would be subnormal are flushed to 0).
//! Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, and the Cephes expf polynomial for exp(r).
template <class F>
[[nodiscard, gnu::always_inline]] inline F exp_nonpositive(F x) noexcept {
  using I = std::conditional_t<std::is_same_v<F, float>, std::int32_t, vint>;
  auto const bcast = [](float c) {
    if constexpr (std::is_same_v<F, float>)
      return c;
    else
      return splat(c);
  };
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693359375f;
  constexpr float ln2_lo = -2.12194440e-4f;
  constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // The clamp is a maximum (the same value, x not being NaN); one instruction with AVX-512.
  F xc = x > exp_lower_limit ? x : bcast(exp_lower_limit);
#if defined(__AVX512F__)
  if constexpr (!std::is_same_v<F, float> && simd_width == 16) {
    __m512 xv;
    __builtin_memcpy(&xv, &x, sizeof xv);
    __m512 const m = _mm512_maskz_max_ps(0xFFFF, xv, _mm512_set1_ps(exp_lower_limit));
    __builtin_memcpy(&xc, &m, sizeof xc);
  }
#endif
  F const shifted = xc * log2e + round_magic;
  F const n = shifted - round_magic;
  F const r = (xc - n * ln2_hi) - n * ln2_lo;
  F p = bcast(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  F const er = (p * r) * r + r + 1.0f;
#if defined(__AVX512F__)
  if constexpr (!std::is_same_v<F, float> && simd_width == 16) {
    // er * 2^n, zero below the limit, in one instruction: scaling by a power of two rounds the
    // exact product once, as the multiplication by 2^n below does (n >= -126: 2^n is normal).
    __m512 e, k;
    __builtin_memcpy(&e, &er, sizeof e);
    __builtin_memcpy(&k, &n, sizeof k);
    __m512 xv;
    __builtin_memcpy(&xv, &x, sizeof xv);
    __mmask16 const keep = _mm512_cmp_ps_mask(xv, _mm512_set1_ps(exp_lower_limit), _CMP_NLT_US);
    __m512 const y = _mm512_maskz_scalef_ps(keep, e, k);
    F out;
    __builtin_memcpy(&out, &y, sizeof out);
    return out;
  }
#endif
  I const ni = std::bit_cast<I>(shifted) - 0x4B400000;
  F const scale = std::bit_cast<F>((ni + 127) << 23);
  F const y = er * scale;
  return x < exp_lower_limit ? bcast(0.0f) : y;
}

//! Summary of one logits row.
struct row_summary {
  float max = -std::numeric_limits<float>::infinity();  //!< largest entry
};

//! Throws `errc::numerical` naming the first NaN or +inf entry of x[0..n), or saying that no
//! entry is finite. Cold path of `summarize_row`.
[[noreturn]] inline void throw_bad_row(float const* x, std::size_t n, char const* who) {
  for (std::size_t k = 0; k < n; ++k) {
    SPECDEC_CHECK(!std::isnan(x[k]), numerical, who, ": logit ", k, " of ", n, " is NaN");
    SPECDEC_CHECK(x[k] != std::numeric_limits<float>::infinity(), numerical, who, ": logit ", k,
                  " of ", n, " is +inf");
  }
  SPECDEC_THROW(numerical, who, ": no finite logit in a row of ", n,
                " (every entry is -inf, or the row is empty)");
}

//! The maximum of x[0..n) as `summarize_row` defines it, one step of `row_lanes` at a time into
//! one set of lane maxima (each lane keeps the first of equal values), merged lane by lane in
//! order, then the tail; `bad` is set when an entry is NaN. Resolves the sign of a zero maximum.
[[nodiscard]] inline float ordered_row_max(float const* x, std::size_t n, bool& bad) noexcept {
  constexpr float inf = std::numeric_limits<float>::infinity();
  vfloat mx[row_vectors];
  vint nan[row_vectors];
  for (std::size_t v = 0; v < row_vectors; ++v) {
    mx[v] = splat(-inf);
    nan[v] = vint{};
  }
  std::size_t const full = n - n % row_lanes;
  for (std::size_t i = 0; i < full; i += row_lanes) {
    for (std::size_t v = 0; v < row_vectors; ++v) {
      vfloat const a = load(x + i + v * simd_width);
      mx[v] = a > mx[v] ? a : mx[v];
      nan[v] |= a != a;
    }
  }
  float m = -inf;
  bool any_nan = false;
  for (std::size_t v = 0; v < row_vectors; ++v) {
    any_nan = any_nan || any(nan[v]);
    for (std::size_t j = 0; j < simd_width; ++j) m = mx[v][j] > m ? mx[v][j] : m;
  }
  for (std::size_t i = full; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    any_nan = any_nan || x[i] != x[i];
  }
  bad = any_nan;
  return m;
}

//! The maximum of `row`; throws `errc::numerical` naming the index of the first NaN or +inf, or
//! when no entry is finite (an empty row included). `who` names the caller in the message.
//! One vectorised pass over four independent sets of lane maxima (a single set would chain every
//! step on the previous one). The maximum of a set of floats does not depend on the order it is
//! taken in, except for the sign of a zero maximum (-0 and +0 compare equal), which the rare rows
//! whose maximum is zero take from `ordered_row_max`.
[[nodiscard]] inline row_summary summarize_row(std::span<float const> row, char const* who) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr std::size_t sets = 4;
  constexpr std::size_t stride = sets * row_lanes;
  float const* x = row.data();
  std::size_t const n = row.size();
  vfloat mx[sets][row_vectors];
  vint nan[sets][row_vectors];
  for (std::size_t u = 0; u < sets; ++u) {
    for (std::size_t v = 0; v < row_vectors; ++v) {
      mx[u][v] = splat(-inf);
      nan[u][v] = vint{};
    }
  }
  std::size_t const wide = n - n % stride;
  for (std::size_t i = 0; i < wide; i += stride) {
    for (std::size_t u = 0; u < sets; ++u) {
      for (std::size_t v = 0; v < row_vectors; ++v) {
        vfloat const a = load(x + i + u * row_lanes + v * simd_width);
        mx[u][v] = a > mx[u][v] ? a : mx[u][v];
        nan[u][v] |= a != a;
      }
    }
  }
  std::size_t const full = n - n % row_lanes;
  for (std::size_t i = wide; i < full; i += row_lanes) {
    for (std::size_t v = 0; v < row_vectors; ++v) {
      vfloat const a = load(x + i + v * simd_width);
      mx[0][v] = a > mx[0][v] ? a : mx[0][v];
      nan[0][v] |= a != a;
    }
  }
  vint bad_lanes = vint{};
  for (std::size_t v = 0; v < row_vectors; ++v) {
    for (std::size_t u = 1; u < sets; ++u) {
      mx[0][v] = mx[u][v] > mx[0][v] ? mx[u][v] : mx[0][v];
      nan[0][v] |= nan[u][v];
    }
    bad_lanes |= nan[0][v];
  }
  // The lanes by a pairwise tree of vector halves (short dependency chains).
  auto const vmax = [](auto a, auto b) { return b > a ? b : a; };
  for (std::size_t v = 1; v < row_vectors; ++v) mx[0][0] = vmax(mx[0][0], mx[0][v]);
  row_summary s;
  s.max = reduce_lanes(mx[0][0], vmax);
  bool bad = any(bad_lanes);
  for (std::size_t i = full; i < n; ++i) {
    s.max = x[i] > s.max ? x[i] : s.max;
    bad = bad || x[i] != x[i];
  }
  if (bad || !(s.max > -inf && s.max < inf)) [[unlikely]]
    throw_bad_row(x, n, who);
  if (s.max == 0.0f) [[unlikely]]
    s.max = ordered_row_max(x, n, bad);
  return s;
}

//! What `exp_masked` returns.
struct exp_sums {
  double total = 0.0;           //!< sum of every written value
  double at_least_floor = 0.0;  //!< sum of the written values >= `efloor` (when requested)
};

//! `exp_masked`, with the test against `zfloor` only when `Masked` (without it, every entry is
//! written as if it passed, which is what the test gives for zfloor = -inf on NaN-free rows).
template <bool WithFloor, bool Masked, bool Scaled>
[[nodiscard]] inline exp_sums exp_masked_pass(float const* x, float* out, std::size_t n,
                                              float shift, float scale, float zfloor,
                                              float efloor) noexcept {
  exp_sums s;
  std::size_t i = 0;
  std::size_t const full = n - n % row_lanes;
  vfloat const vshift = splat(shift), vscale = splat(scale), vzfloor = splat(zfloor),
               vefloor = splat(efloor), zero = splat(0.0f);
  while (i < full) {
    vfloat acc[row_vectors];
    vfloat acc_floor[row_vectors];
    for (std::size_t v = 0; v < row_vectors; ++v) acc[v] = acc_floor[v] = zero;
    std::size_t const stop = std::min(full, i + row_block);
    for (; i < stop; i += row_lanes) {
      for (std::size_t v = 0; v < row_vectors; ++v) {
        vfloat const a = load(x + i + v * simd_width);
        vfloat d = a - vshift;
        if constexpr (Scaled) d *= vscale;
        vfloat e = exp_nonpositive(d);
        if constexpr (Masked) e = a >= vzfloor ? e : zero;
        store(out + i + v * simd_width, e);
        acc[v] += e;
        if constexpr (WithFloor) acc_floor[v] += e >= vefloor ? e : zero;
      }
    }
    double block = 0.0, block_floor = 0.0;
    for (std::size_t v = 0; v < row_vectors; ++v) {
      for (std::size_t j = 0; j < simd_width; ++j) {
        block += static_cast<double>(acc[v][j]);
        block_floor += static_cast<double>(acc_floor[v][j]);
      }
    }
    s.total += block;
    s.at_least_floor += block_floor;
  }
  for (; i < n; ++i) {
    float const a = x[i];
    float d = a - shift;
    if constexpr (Scaled) d *= scale;
    float e = exp_nonpositive(d);
    if constexpr (Masked) e = a >= zfloor ? e : 0.0f;
    out[i] = e;
    s.total += static_cast<double>(e);
    if constexpr (WithFloor) s.at_least_floor += e >= efloor ? static_cast<double>(e) : 0.0;
  }
  return s;
}

//! Writes out[i] = x[i] >= zfloor ? exp((x[i] - shift) * scale) : 0 for every i and returns the
//! sum of the written values (and, with `WithFloor`, the sum of those >= efloor), accumulated in
//! float over blocks of `row_block` and in double across blocks. Requires x[i] - shift <= 0 (or
//! -inf), scale > 0 finite, no NaN. `out` may be `x` itself. With zfloor = -inf (no top-k) the
//! pass skips the test, which every entry passes; with scale = 1 it skips the multiplication,
//! which leaves every value as it is.
template <bool WithFloor>
[[nodiscard]] inline exp_sums exp_masked(float const* x, float* out, std::size_t n, float shift,
                                         float scale, float zfloor, float efloor) noexcept {
  bool const masked = zfloor != -std::numeric_limits<float>::infinity();
  if (scale == 1.0f) {
    return masked
               ? exp_masked_pass<WithFloor, true, false>(x, out, n, shift, scale, zfloor, efloor)
               : exp_masked_pass<WithFloor, false, false>(x, out, n, shift, scale, zfloor, efloor);
  }
  return masked ? exp_masked_pass<WithFloor, true, true>(x, out, n, shift, scale, zfloor, efloor)
                : exp_masked_pass<WithFloor, false, true>(x, out, n, shift, scale, zfloor, efloor);
}

//! Writes out[i] = exp((x[i] - shift) * scale) for every i and returns the sum of the written
//! values (see `exp_masked`). `out` may be `x` itself.
inline double exp_shifted(float const* x, float* out, std::size_t n, float shift, float scale) {
  return exp_masked<false>(x, out, n, shift, scale, -std::numeric_limits<float>::infinity(), 0.0f)
      .total;
}

//! out[i] = x[i] * factor. `out` may be `x` itself.
inline void scale_row(float const* x, float* out, std::size_t n, float factor) noexcept {
  std::size_t const full = n - n % simd_width;
  vfloat const f = splat(factor);
  for (std::size_t i = 0; i < full; i += simd_width) store(out + i, load(x + i) * f);
  for (std::size_t i = full; i < n; ++i) out[i] = x[i] * factor;
}

//! out[i] = x[i] >= floor ? x[i] * factor : 0. `out` may be `x` itself.
inline void scale_at_least(float const* x, float* out, std::size_t n, float floor,
                           float factor) noexcept {
  std::size_t const full = n - n % simd_width;
  vfloat const f = splat(factor), fl = splat(floor), zero = splat(0.0f);
  for (std::size_t i = 0; i < full; i += simd_width) {
    vfloat const a = load(x + i);
    store(out + i, a >= fl ? a * f : zero);
  }
  for (std::size_t i = full; i < n; ++i) out[i] = x[i] >= floor ? x[i] * factor : 0.0f;
}

//! A vector of `simd_width / 2` floats, converted to `vdouble_half`.
using vfloat_half = float __attribute__((vector_size(simd_width * sizeof(float) / 2)));

//! Sum of x[0..n) in double (every addition in double), over `row_lanes` logical lanes combined
//! by a fixed pairwise tree, then the entries past the last whole step in order; `bad` is set
//! when an entry is negative or NaN.
[[nodiscard]] inline double sum_double(float const* x, std::size_t n, bool& bad) noexcept {
  constexpr std::size_t H = simd_width / 2;
  constexpr std::size_t V = row_lanes / H;
  constexpr std::size_t group = 4 * row_lanes;  // entries per test for an all-zero stretch
  vdouble_half acc[V];
  for (std::size_t v = 0; v < V; ++v) acc[v] = vdouble_half{};
  vint negative = vint{};
  vfloat const vzero = splat(0.0f);
  auto const add_lanes = [&](std::size_t at) {
    for (std::size_t v = 0; v < V; ++v) {
      vfloat_half a;
      __builtin_memcpy(&a, x + at + v * H, sizeof a);
      acc[v] += __builtin_convertvector(a, vdouble_half);
    }
  };
  std::size_t const full = n - n % row_lanes;
  std::size_t i = 0;
  // Stretches of zeros (most of a truncated row) are skipped after one vectorised test; adding
  // them would leave every lane unchanged, so the sum does not depend on the stretch length.
  for (; i + group <= full; i += group) {
    vint nonzero = vint{};
    for (std::size_t v = 0; v < group / simd_width; ++v) {
      vfloat const a = load(x + i + v * simd_width);
      nonzero |= a != vzero;
      negative |= ~(a >= vzero);
    }
    if (!any(nonzero)) continue;
    for (std::size_t k = 0; k < group; k += row_lanes) add_lanes(i + k);
  }
  for (; i < full; i += row_lanes) {
    for (std::size_t v = 0; v < row_vectors; ++v)
      negative |= ~(load(x + i + v * simd_width) >= vzero);
    add_lanes(i);
  }
  // The 16 lane sums, in logical lane order, combined by a fixed pairwise tree (lane l with lane
  // l + 8, then l + 4, l + 2, l + 1): the same order whatever the vector width.
  double lanes[row_lanes];
  __builtin_memcpy(lanes, acc, sizeof lanes);
  for (std::size_t h = row_lanes / 2; h >= 1; h /= 2)
    for (std::size_t l = 0; l < h; ++l) lanes[l] += lanes[l + h];
  double total = lanes[0];
  bool any_bad = any(negative);
  for (std::size_t k = full; k < n; ++k) {
    total += static_cast<double>(x[k]);
    any_bad = any_bad || !(x[k] >= 0.0f);
  }
  bad = any_bad;
  return total;
}

//! Sum of x[0..n) for validation (not bit-compatible with any other sum here): float over
//! `row_lanes` lanes in four independent sets within blocks of `row_block` entries, double
//! across blocks; `bad` is set when an entry is negative or NaN (+inf makes the sum +inf).
[[nodiscard]] inline double sum_checked(float const* x, std::size_t n, bool& bad) noexcept {
  constexpr std::size_t sets = 4;
  constexpr std::size_t stride = sets * row_lanes;
  static_assert(row_block % stride == 0);
  vfloat const zero = splat(0.0f);
  vint negative = vint{};
  double total = 0.0;
  std::size_t i = 0;
  std::size_t const wide = n - n % stride;
  while (i < wide) {
    vfloat acc[sets * row_vectors];
    for (vfloat& a : acc) a = zero;
    std::size_t const stop = std::min(wide, i + row_block);
    for (; i < stop; i += stride) {
      for (std::size_t v = 0; v < sets * row_vectors; ++v) {
        vfloat const a = load(x + i + v * simd_width);
        negative |= ~(a >= zero);  // negative or NaN
        acc[v] += a;
      }
    }
    for (std::size_t v = 1; v < sets * row_vectors; ++v) acc[0] += acc[v];
    total += static_cast<double>(reduce_lanes(acc[0], [](auto a, auto b) { return a + b; }));
  }
  bool any_bad = any(negative);
  for (; i < n; ++i) {
    total += static_cast<double>(x[i]);
    any_bad = any_bad || !(x[i] >= 0.0f);
  }
  bad = any_bad;
  return total;
}

//! Sum of x[0..n) in double (see the three-argument overload), without the sign check.
[[nodiscard]] inline double sum_double(float const* x, std::size_t n) noexcept {
  bool bad = false;
  return sum_double(x, n, bad);
}

//! Writes sums[b] = sum_double(x + b * block, min(block, n - b * block)) for every block b of
//! `block` = 4 * `row_lanes` entries (the blocks of `sample_from`) and returns their sum, added in
//! block order; `bad` is set when an entry is negative or NaN. Bit for bit what the per-block
//! `sum_double` calls give: the same additions in the same order (each of the 16 lanes from +0
//! through its four entries, then the lane tree l += l + 8, l + 4, l + 2, l + 1), written as
//! whole-vector operations without branches so that consecutive blocks overlap; a zero block
//! sums to +0 whether it is skipped (as in `sum_double`) or added.
inline double block_sums_double(float const* x, std::size_t n, double* sums, bool& bad) noexcept {
  static_assert(row_lanes == 16);
  using f16 = float __attribute__((vector_size(16 * sizeof(float))));
  using f8 = float __attribute__((vector_size(8 * sizeof(float))));
  using i16 = std::int32_t __attribute__((vector_size(16 * sizeof(float))));
  using d8 = double __attribute__((vector_size(8 * sizeof(double))));
  using d4 = double __attribute__((vector_size(4 * sizeof(double))));
  using d2 = double __attribute__((vector_size(2 * sizeof(double))));
  constexpr std::size_t block = 4 * row_lanes;
  std::size_t const blocks = (n + block - 1) / block;
  std::size_t const full = n / block;
  f16 const zero = f16{};
  i16 negative = i16{};
  double total = 0.0;
  std::size_t b = 0;
#if defined(__AVX512F__)
  // The same operations with AVX-512 conversions (GCC splits the generic 8-double conversions
  // below into 4-double ones). The zero-masked conversion with every lane selected is the plain
  // instruction (the unmasked intrinsic, like the 512-to-256 casts, trips GCC 12's
  // -Wmaybe-uninitialized); halves are taken with vector shuffles.
  __mmask16 negative_mask = 0;
  for (; b < full; ++b) {
    float const* p = x + b * block;
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (std::size_t k = 0; k < block; k += row_lanes) {
      __m512 const a = _mm512_loadu_ps(p + k);
      negative_mask |= _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NGE_UQ);
      __m256 const a_lo = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7);
      __m256 const a_hi = __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
      lo = _mm512_add_pd(lo, _mm512_maskz_cvtps_pd(0xFF, a_lo));
      hi = _mm512_add_pd(hi, _mm512_maskz_cvtps_pd(0xFF, a_hi));
    }
    __m512d const t8 = _mm512_add_pd(lo, hi);
    __m256d const t4 = _mm256_add_pd(__builtin_shufflevector(t8, t8, 0, 1, 2, 3),
                                     __builtin_shufflevector(t8, t8, 4, 5, 6, 7));
    __m128d const t2 =
        _mm_add_pd(__builtin_shufflevector(t4, t4, 0, 1), __builtin_shufflevector(t4, t4, 2, 3));
    double const s = t2[0] + t2[1];
    sums[b] = s;
    total += s;
  }
  if (negative_mask != 0) negative = ~i16{};
#endif
  for (; b < full; ++b) {
    float const* p = x + b * block;
    d8 lo = d8{}, hi = d8{};  // lanes 0..7 and 8..15
    for (std::size_t k = 0; k < block; k += row_lanes) {
      f16 a;
      __builtin_memcpy(&a, p + k, sizeof a);
      negative |= ~(a >= zero);  // negative or NaN
      f8 const a_lo = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7);
      f8 const a_hi = __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
      lo += __builtin_convertvector(a_lo, d8);
      hi += __builtin_convertvector(a_hi, d8);
    }
    d8 const t8 = lo + hi;
    d4 const t4 =
        __builtin_shufflevector(t8, t8, 0, 1, 2, 3) + __builtin_shufflevector(t8, t8, 4, 5, 6, 7);
    d2 const t2 = __builtin_shufflevector(t4, t4, 0, 1) + __builtin_shufflevector(t4, t4, 2, 3);
    double const s = t2[0] + t2[1];
    sums[b] = s;
    total += s;
  }
  std::int32_t lanes[16];
  __builtin_memcpy(lanes, &negative, sizeof lanes);
  bool any_bad = false;
  for (std::int32_t l : lanes) any_bad = any_bad || l != 0;
  for (; b < blocks; ++b) {
    std::size_t const start = b * block;
    bool block_bad = false;
    double const s = sum_double(x + start, n - start, block_bad);
    sums[b] = s;
    total += s;
    any_bad = any_bad || block_bad;
  }
  bad = any_bad;
  return total;
}

//! The sequential definition of `first_crossing`: the first j in [0, len) at which
//! c = running + w[0] + ... + w[j], added one entry at a time in double with w[j] = max(x[j], 0),
//! exceeds `target`; `len` when none does.
[[nodiscard]] inline std::size_t first_crossing_sequential(float const* x, std::size_t len,
                                                           double running, double target) noexcept {
  double c = running;
  for (std::size_t j = 0; j < len; ++j) {
    c += static_cast<double>(positive_part(x[j]));
    if (c > target) return j;
  }
  return len;
}

//! Entries `first_crossing` searches with vectors (other runs take the sequential loop).
inline constexpr std::size_t crossing_block = 64;

//! `first_crossing_sequential` (the same index, always), for x[0..len) without NaN and
//! 0 <= running <= target. With AVX-512, runs of `crossing_block` entries are searched with
//! prefix sums in double vectors instead of one dependent addition per entry: with every weight
//! non-negative, the sequential sums and the vector prefix sums (another association, at most 64
//! roundings each) are both within 2^-47 of the exact sum, relative to it, so the first index
//! whose prefix sum A has A * (1 + 2^-44) > target is the sequential answer when it also has
//! A * (1 - 2^-44) > target (and a positive weight); when the crossing is not that clear (the
//! target within about 2^-44 of a prefix sum) the sequential loop decides.
[[nodiscard]] inline std::size_t first_crossing(float const* x, std::size_t len, double running,
                                                double target) noexcept {
#if defined(__AVX512F__)
  if (len == crossing_block) {
    constexpr double slack = 0x1p-44;
    __m512d const zero = _mm512_setzero_pd();
    __m512d const vt = _mm512_set1_pd(target);
    __m512d const up = _mm512_set1_pd(1.0 + slack);
    __m512d const down = _mm512_set1_pd(1.0 - slack);
    auto const shift = [zero](__m512d a, auto lanes) {  // lanes up by `lanes`, zeros in
      return _mm512_castsi512_pd(_mm512_maskz_alignr_epi64(
          0xFF, _mm512_castpd_si512(a), _mm512_castpd_si512(zero), 8 - decltype(lanes)::value));
    };
    // The zero-masked forms with every lane selected are the plain instructions (the unmasked
    // intrinsics trip GCC 12's -Wmaybe-uninitialized).
    __m512d carry = _mm512_set1_pd(running);
    for (std::size_t k = 0; k < crossing_block; k += 8) {
      __m256 const xf = _mm256_max_ps(_mm256_loadu_ps(x + k), _mm256_setzero_ps());
      __m512d a = _mm512_maskz_cvtps_pd(0xFF, xf);
      a = _mm512_add_pd(a, shift(a, std::integral_constant<int, 1>{}));
      a = _mm512_add_pd(a, shift(a, std::integral_constant<int, 2>{}));
      a = _mm512_add_pd(a, shift(a, std::integral_constant<int, 4>{}));
      a = _mm512_add_pd(a, carry);
      __mmask8 const maybe = _mm512_cmp_pd_mask(_mm512_mul_pd(a, up), vt, _CMP_GT_OQ);
      if (maybe != 0) {
        __mmask8 const sure = _mm512_cmp_pd_mask(_mm512_mul_pd(a, down), vt, _CMP_GT_OQ);
        auto const j = static_cast<std::size_t>(std::countr_zero(static_cast<unsigned>(maybe)));
        if (((sure >> j) & 1) != 0 && x[k + j] > 0.0f) return k + j;
        return first_crossing_sequential(x, len, running, target);
      }
      carry = _mm512_maskz_permutexvar_pd(0xFF, _mm512_set1_epi64(7), a);
    }
    // No prefix sum comes near the target, so no sequential sum (within the slack) crosses it.
    return len;
  }
#endif
  return first_crossing_sequential(x, len, running, target);
}

//! For each of the K thresholds th[k]: count[k] = #{i : x[i] >= th[k]} and, with `Mass`,
//! mass[k] = sum of those x[i] (float within blocks of `row_block`, double across blocks).
//! One vectorised pass over the row.
template <bool Mass, std::size_t K>
inline void threshold_stats(float const* x, std::size_t n, float const (&th)[K], double (&mass)[K],
                            double (&count)[K]) noexcept {
  for (std::size_t k = 0; k < K; ++k) mass[k] = count[k] = 0.0;
  vfloat vth[K];
  for (std::size_t k = 0; k < K; ++k) vth[k] = splat(th[k]);
  vfloat const zero = splat(0.0f);
  std::size_t i = 0;
  std::size_t const full = n - n % simd_width;
  while (i < full) {
    vfloat am[K];
    vint ac[K];
    for (std::size_t k = 0; k < K; ++k) {
      am[k] = zero;
      ac[k] = vint{};
    }
    std::size_t const stop = std::min(full, i + row_block);
    for (; i < stop; i += simd_width) {
      vfloat const a = load(x + i);
      for (std::size_t k = 0; k < K; ++k) {
        vint const ge = a >= vth[k];
        if constexpr (Mass) am[k] += ge ? a : zero;
        ac[k] -= ge;  // a true lane is -1
      }
    }
    for (std::size_t k = 0; k < K; ++k) {
      for (std::size_t j = 0; j < simd_width; ++j) {
        if constexpr (Mass) mass[k] += static_cast<double>(am[k][j]);
        count[k] += static_cast<double>(ac[k][j]);
      }
    }
  }
  for (; i < n; ++i) {
    for (std::size_t k = 0; k < K; ++k) {
      if (x[i] >= th[k]) {
        if constexpr (Mass) mass[k] += static_cast<double>(x[i]);
        count[k] += 1.0;
      }
    }
  }
}

//! Copies (x[i], i) for every i with lo <= x[i] < hi, in index order, into vals / ids (at most
//! `capacity` of them) and returns how many entries are in the range (which may exceed
//! `capacity`; only the first `capacity` are stored). Groups of `row_lanes` entries with none in
//! range are skipped after one vectorised test.
[[nodiscard]] inline std::size_t gather_range(float const* x, std::size_t n, float lo, float hi,
                                              float* vals, std::int32_t* ids,
                                              std::size_t capacity) noexcept {
  std::size_t found = 0;
  std::size_t const full = n - n % row_lanes;
  std::size_t i0 = 0;
#if defined(__AVX512F__)
  // Compressing stores write the hits of 16 entries at once, in index order; near the capacity
  // the generic loop below takes over.
  {
    __m512 const zlo = _mm512_set1_ps(lo), zhi = _mm512_set1_ps(hi);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i const step = _mm512_set1_epi32(16);
    static_assert(row_lanes == 16);
    for (; i0 < full && found + 16 <= capacity; i0 += 16) {
      __m512 const a = _mm512_loadu_ps(x + i0);
      __mmask16 const m =
          _mm512_cmp_ps_mask(a, zlo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(a, zhi, _CMP_LT_OQ);
      _mm512_mask_compressstoreu_ps(vals + found, m, a);
      _mm512_mask_compressstoreu_epi32(ids + found, m, idx);
      found += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(m)));
      idx = _mm512_add_epi32(idx, step);
    }
  }
#endif
  vfloat const vlo = splat(lo), vhi = splat(hi);
  for (std::size_t i = i0; i < full; i += row_lanes) {
    vint in[row_vectors];
    vint hit = vint{};
    for (std::size_t v = 0; v < row_vectors; ++v) {
      vfloat const a = load(x + i + v * simd_width);
      in[v] = (a >= vlo) & (a < vhi);
      hit |= in[v];
    }
    if (!any(hit)) continue;
    // Visit the set lanes only (branchy per group, not per entry).
    std::int32_t lanes[row_lanes];
    __builtin_memcpy(lanes, in, sizeof lanes);
    std::uint32_t bits = 0;
    for (std::size_t j = 0; j < row_lanes; ++j)
      bits |= static_cast<std::uint32_t>(lanes[j] & 1) << j;
    while (bits != 0) {
      auto const j = static_cast<std::size_t>(std::countr_zero(bits));
      bits &= bits - 1;
      if (found < capacity) {
        vals[found] = x[i + j];
        ids[found] = static_cast<std::int32_t>(i + j);
      }
      ++found;
    }
  }
  for (std::size_t i = full; i < n; ++i) {
    if (!(x[i] >= lo && x[i] < hi)) continue;
    if (found < capacity) {
      vals[found] = x[i];
      ids[found] = static_cast<std::int32_t>(i);
    }
    ++found;
  }
  return found;
}

//! Index of the largest entry of x[0..n), n >= 1, ties to the lowest index, NaN never chosen;
//! -1 when no entry is above -inf.
[[nodiscard]] inline std::int64_t argmax_index(float const* x, std::size_t n) noexcept {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  // Lane indices are 32-bit: rows longer than that (never a vocabulary) take the scalar loop.
  std::size_t const full =
      n <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()) - row_lanes
          ? n - n % row_lanes
          : 0;
  // Per logical lane: the best value and the first index holding it (-1: none yet).
  vfloat best[row_vectors];
  vint at[row_vectors];
  vint idx[row_vectors];
  for (std::size_t v = 0; v < row_vectors; ++v) {
    best[v] = splat(ninf);
    at[v] = vint{} - 1;
    std::int32_t first[simd_width];
    for (std::size_t j = 0; j < simd_width; ++j)
      first[j] = static_cast<std::int32_t>(v * simd_width + j);
    __builtin_memcpy(&idx[v], first, sizeof first);
  }
  auto const step = static_cast<std::int32_t>(row_lanes);
  for (std::size_t i = 0; i < full; i += row_lanes) {
    for (std::size_t v = 0; v < row_vectors; ++v) {
      vfloat const a = load(x + i + v * simd_width);
      vint const better = a > best[v];
      best[v] = better ? a : best[v];
      at[v] = better ? idx[v] : at[v];
      idx[v] += step;
    }
  }
  float b = ninf;
  std::int64_t a = -1;
  for (std::size_t v = 0; v < row_vectors; ++v) {
    for (std::size_t j = 0; j < simd_width; ++j) {
      std::int64_t const lane_at = at[v][j];
      if (lane_at < 0) continue;
      if (a < 0 || best[v][j] > b || (best[v][j] == b && lane_at < a)) {
        b = best[v][j];
        a = lane_at;
      }
    }
  }
  for (std::size_t i = full; i < n; ++i) {
    if (x[i] > b) {
      b = x[i];
      a = static_cast<std::int64_t>(i);
    }
  }
  return a;
}

//! The first index i in [0, n) with x[i] == value, or n if there is none. Vectorised: whole
//! vectors are compared at once until one holds a match.
[[nodiscard]] inline std::size_t first_equal(float const* x, std::size_t n, float value) noexcept {
  vfloat const v = splat(value);
  std::size_t i = 0;
  for (; i + simd_width <= n; i += simd_width)
    if (any(load(x + i) == v)) break;
  for (; i < n; ++i)
    if (x[i] == value) return i;
  return n;
}

//! True when [a, a + an) and [b, b + bn) share memory but do not start at the same address.
template <class T, class U>
[[nodiscard]] inline bool partially_overlap(T const* a, std::size_t an, U const* b,
                                            std::size_t bn) noexcept {
  auto const pa = reinterpret_cast<std::uintptr_t>(a);
  auto const pb = reinterpret_cast<std::uintptr_t>(b);
  if (pa == pb) return false;
  return pa < pb + bn * sizeof(U) && pb < pa + an * sizeof(T);
}

}  // namespace specdec::detail
