#pragma once
//! \file
//! Drawing a token from a probability row (`sample_from`) and the greedy choice (`argmax`).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/sampling/kernels.hpp"

namespace specdec {

namespace detail {

//! Entries per block of the two-level inverse-CDF scan in `sample_from`.
inline constexpr std::size_t sample_block = 1024;

//! Sum of p[0..n) in double, and whether any entry is negative or NaN.
struct checked_sum {
  double total = 0.0;
  bool bad = false;
};

//! Sums p[0..n) in double over `row_lanes` lanes combined in a fixed order, flagging negative or
//! NaN entries.
[[nodiscard]] inline checked_sum sum_checked(float const* p, std::size_t n) noexcept {
  double acc[row_lanes] = {};
  std::int32_t bad[row_lanes] = {};
  std::size_t i = 0;
  for (; i + row_lanes <= n; i += row_lanes) {
    for (std::size_t j = 0; j < row_lanes; ++j) {
      float const v = p[i + j];
      acc[j] += static_cast<double>(v);
      bad[j] |= (v >= 0.0f) ? 0 : 1;
    }
  }
  checked_sum out;
  bool any_bad = false;
  for (std::size_t j = 0; j < row_lanes; ++j) {
    out.total += acc[j];
    any_bad = any_bad || bad[j] != 0;
  }
  for (; i < n; ++i) {
    out.total += static_cast<double>(p[i]);
    any_bad = any_bad || !(p[i] >= 0.0f);
  }
  out.bad = any_bad;
  return out;
}

}  // namespace detail

//! Inverse-CDF draw from the (not necessarily normalised) distribution `probs`: returns the first
//! index i with sum(probs[0..i]) > u * sum(probs), u in [0, 1).
//!
//! Sums are accumulated in double: the row is cut into blocks of `detail::sample_block` entries;
//! block sums use `detail::row_lanes` lanes combined in a fixed order, and the crossing block is
//! scanned entry by entry, so the result equals the sequential definition except where u * sum
//! lies within double rounding of a cumulative sum. Zero entries are skipped: the returned index
//! always has a positive probability.
//!
//! Throws `errc::invalid_argument` when u is outside [0, 1) and `errc::numerical` when an entry
//! is negative or NaN, or the row has no positive mass (an empty row included). Two passes at
//! most (one full, one up to the crossing block); no allocation.
[[nodiscard]] inline token_id sample_from(std::span<float const> probs, float u) {
  SPECDEC_CHECK(u >= 0.0f && u < 1.0f, invalid_argument, "sample_from: uniform ", u,
                " is outside [0, 1)");
  float const* p = probs.data();
  std::size_t const n = probs.size();
  detail::checked_sum const s = detail::sum_checked(p, n);
  if (s.bad) [[unlikely]] {
    for (std::size_t i = 0; i < n; ++i)
      SPECDEC_CHECK(p[i] >= 0.0f, numerical, "sample_from: probability ", i, " of ", n, " is ",
                    p[i]);
  }
  SPECDEC_CHECK(s.total > 0.0 && s.total < std::numeric_limits<double>::infinity(), numerical,
                "sample_from: a row of ", n, " probabilities has total mass ", s.total);
  double const target = static_cast<double>(u) * s.total;
  double running = 0.0;
  for (std::size_t start = 0; start < n; start += detail::sample_block) {
    std::size_t const len = std::min(detail::sample_block, n - start);
    double const block = detail::sum_double(p + start, len);
    if (running + block > target) {
      double c = running;
      std::size_t last_positive = start;
      for (std::size_t i = start; i < start + len; ++i) {
        if (p[i] > 0.0f) {
          c += static_cast<double>(p[i]);
          last_positive = i;
          if (c > target) return static_cast<token_id>(i);
        }
      }
      // The block sum (lane order) crossed but the sequential scan fell short by rounding.
      return static_cast<token_id>(last_positive);
    }
    running += block;
  }
  // Unreachable in exact arithmetic (u < 1); guard against rounding: the last positive entry.
  for (std::size_t i = n; i-- > 0;)
    if (p[i] > 0.0f) return static_cast<token_id>(i);
  SPECDEC_THROW(internal, "sample_from: no positive entry in a row with positive mass");
}

//! Index of the largest entry of `values`, ties to the lowest index. NaN entries are never
//! chosen. Throws `errc::invalid_argument` for an empty row and `errc::numerical` when every
//! entry is NaN. One pass; no allocation.
[[nodiscard]] inline token_id argmax(std::span<float const> values) {
  SPECDEC_CHECK(!values.empty(), invalid_argument, "argmax: empty row");
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  float const* x = values.data();
  std::size_t const n = values.size();
  // Per lane: the best value and the first index holding it (-1: none yet, all -inf or NaN).
  float best[detail::row_lanes];
  std::int64_t at[detail::row_lanes];
  for (std::size_t j = 0; j < detail::row_lanes; ++j) {
    best[j] = ninf;
    at[j] = -1;
  }
  std::size_t i = 0;
  for (; i + detail::row_lanes <= n; i += detail::row_lanes) {
    for (std::size_t j = 0; j < detail::row_lanes; ++j) {
      float const v = x[i + j];
      bool const better = v > best[j];
      best[j] = better ? v : best[j];
      at[j] = better ? static_cast<std::int64_t>(i + j) : at[j];
    }
  }
  float b = ninf;
  std::int64_t a = -1;
  for (std::size_t j = 0; j < detail::row_lanes; ++j) {
    if (at[j] >= 0 && (best[j] > b || (best[j] == b && at[j] < a) || a < 0)) {
      b = best[j];
      a = at[j];
    }
  }
  for (; i < n; ++i) {
    if (x[i] > b) {
      b = x[i];
      a = static_cast<std::int64_t>(i);
    }
  }
  if (a >= 0) return static_cast<token_id>(a);
  // Nothing above -inf: the first -inf entry, if any.
  for (std::size_t k = 0; k < n; ++k)
    if (x[k] == ninf) return static_cast<token_id>(k);
  SPECDEC_THROW(numerical, "argmax: every one of the ", n, " entries is NaN");
}

}  // namespace specdec
