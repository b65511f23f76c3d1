#pragma once
//! \file
//! Row kernels shared by the sampling headers: a float exp accurate to float rounding that the
//! compiler can vectorise, and checked passes over one row (maximum, exp-and-sum, scaled sums).
//! Internals (namespace `specdec::detail`), not API.
//!
//! Every reduction here is written with an explicit number of independent lanes and combines
//! them in a fixed order, so results do not depend on how (or whether) the compiler vectorises
//! the loop; only fused multiply-add contraction may change the last bit of an exp between
//! builds.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "specdec/core/error.hpp"

namespace specdec::detail {

//! Independent accumulators per reduction (two AVX2 vectors of floats).
inline constexpr std::size_t row_lanes = 16;
//! Elements summed in float per lane before the lane sums are added into doubles.
inline constexpr std::size_t row_block = 512;

//! Inputs below this give an exp below the smallest normal float; `exp_nonpositive` returns 0.
inline constexpr float exp_lower_limit = -87.33654f;

//! exp(x) for x <= 0 (x may be -inf; must not be NaN), within about 2 ulp of the correctly
//! rounded value; exactly 1 at x = 0 and exactly 0 below `exp_lower_limit` (results that would be
//! subnormal are flushed to 0). Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, and the Cephes
//! expf polynomial for exp(r). Branch-free so that loops calling it vectorise.
[[nodiscard]] inline float exp_nonpositive(float x) noexcept {
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693359375f;
  constexpr float ln2_lo = -2.12194440e-4f;
  constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float const xc = x < exp_lower_limit ? exp_lower_limit : x;
  float const shifted = xc * log2e + round_magic;
  float const n = shifted - round_magic;
  std::int32_t const ni = std::bit_cast<std::int32_t>(shifted) - 0x4B400000;
  float const r = (xc - n * ln2_hi) - n * ln2_lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float const er = (p * r) * r + r + 1.0f;
  float const scale = std::bit_cast<float>((ni + 127) << 23);
  float const y = er * scale;
  return x < exp_lower_limit ? 0.0f : y;
}

//! Summary of one logits row: its largest value, how many entries are finite, and where the
//! first NaN or +inf is (or `size` when there is none).
struct row_summary {
  float max = -std::numeric_limits<float>::infinity();        //!< largest non-NaN entry
  float min_finite = std::numeric_limits<float>::infinity();  //!< smallest finite entry
  std::size_t finite = 0;                                     //!< number of finite entries
};

//! Scans `row` for its maximum, minimum finite entry and number of finite entries, and throws
//! `errc::numerical` naming the index of the first NaN or +inf, or when no entry is finite.
//! `who` names the caller in the message.
[[nodiscard]] inline row_summary summarize_row(std::span<float const> row, char const* who) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  float mx[row_lanes];
  float mn[row_lanes];
  std::int32_t fin[row_lanes];
  std::int32_t bad[row_lanes];
  for (std::size_t j = 0; j < row_lanes; ++j) {
    mx[j] = -inf;
    mn[j] = inf;
    fin[j] = 0;
    bad[j] = 0;
  }
  float const* x = row.data();
  std::size_t const n = row.size();
  std::size_t i = 0;
  std::size_t finite = 0;
  // Per-lane finite counts are flushed into `finite` every 2^24 entries, so they never overflow.
  while (i + row_lanes <= n) {
    std::size_t const stop = std::min(n - (n - i) % row_lanes, i + (std::size_t{1} << 24));
    for (; i + row_lanes <= stop; i += row_lanes) {
      for (std::size_t j = 0; j < row_lanes; ++j) {
        float const v = x[i + j];
        mx[j] = v > mx[j] ? v : mx[j];
        bool const is_finite = v > -inf && v < inf;
        mn[j] = is_finite && v < mn[j] ? v : mn[j];
        fin[j] += is_finite ? 1 : 0;
        bad[j] |= (v != v || v == inf) ? 1 : 0;
      }
    }
    for (std::size_t j = 0; j < row_lanes; ++j) {
      finite += static_cast<std::size_t>(fin[j]);
      fin[j] = 0;
    }
  }
  row_summary s;
  bool any_bad = false;
  for (std::size_t j = 0; j < row_lanes; ++j) {
    s.max = mx[j] > s.max ? mx[j] : s.max;
    s.min_finite = mn[j] < s.min_finite ? mn[j] : s.min_finite;
    any_bad = any_bad || bad[j] != 0;
  }
  for (; i < n; ++i) {
    float const v = x[i];
    s.max = v > s.max ? v : s.max;
    bool const is_finite = v > -inf && v < inf;
    if (is_finite) {
      s.min_finite = v < s.min_finite ? v : s.min_finite;
      ++finite;
    }
    any_bad = any_bad || v != v || v == inf;
  }
  s.finite = finite;
  if (any_bad) [[unlikely]] {
    for (std::size_t k = 0; k < n; ++k) {
      SPECDEC_CHECK(!std::isnan(x[k]), numerical, who, ": logit ", k, " of ", n, " is NaN");
      SPECDEC_CHECK(x[k] != inf, numerical, who, ": logit ", k, " of ", n, " is +inf");
    }
  }
  SPECDEC_CHECK(finite > 0, numerical, who, ": no finite logit in a row of ", n,
                " (every entry is -inf, or the row is empty)");
  return s;
}

//! Writes out[i] = exp((x[i] - shift) * scale) for every i and returns the sum of the written
//! values, accumulated in float over blocks of `row_block` and in double across blocks.
//! Requires x[i] - shift <= 0 (or -inf) and scale > 0 finite. `out` may be `x` itself.
inline double exp_shifted(float const* x, float* out, std::size_t n, float shift, float scale) {
  double total = 0.0;
  std::size_t i = 0;
  while (i + row_lanes <= n) {
    float acc[row_lanes] = {};
    std::size_t const stop = std::min(n - (n - i) % row_lanes, i + row_block);
    for (; i + row_lanes <= stop; i += row_lanes) {
      for (std::size_t j = 0; j < row_lanes; ++j) {
        float const e = exp_nonpositive((x[i + j] - shift) * scale);
        out[i + j] = e;
        acc[j] += e;
      }
    }
    double block = 0.0;
    for (std::size_t j = 0; j < row_lanes; ++j) block += static_cast<double>(acc[j]);
    total += block;
  }
  for (; i < n; ++i) {
    float const e = exp_nonpositive((x[i] - shift) * scale);
    out[i] = e;
    total += static_cast<double>(e);
  }
  return total;
}

//! out[i] = x[i] * factor. `out` may be `x` itself.
inline void scale_row(float const* x, float* out, std::size_t n, float factor) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] * factor;
}

//! Sum of x[0..n) accumulated in double over `row_lanes` lanes combined in a fixed order.
[[nodiscard]] inline double sum_double(float const* x, std::size_t n) noexcept {
  double acc[row_lanes] = {};
  std::size_t i = 0;
  for (; i + row_lanes <= n; i += row_lanes)
    for (std::size_t j = 0; j < row_lanes; ++j) acc[j] += static_cast<double>(x[i + j]);
  double total = 0.0;
  for (std::size_t j = 0; j < row_lanes; ++j) total += acc[j];
  for (; i < n; ++i) total += static_cast<double>(x[i]);
  return total;
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
