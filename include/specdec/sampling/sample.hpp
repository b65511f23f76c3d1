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

//! Entries per block of the two-level inverse-CDF scan in `sample_from` (small, so that the
//! entry-by-entry scan of the block that crosses is short).
inline constexpr std::size_t sample_block = 4 * row_lanes;
//! Block sums `sample_from` keeps on the stack (16 KiB): rows up to 2048 * 64 = 131072 entries
//! take one pass.
inline constexpr std::size_t sample_stack_blocks = 2048;

//! Scans block [start, start + len) of p, whose cumulative mass before it is `running`, for the
//! first entry whose cumulative mass exceeds `target`; the block's own sum is known to cross it.
[[nodiscard]] inline token_id sample_in_block(float const* p, std::size_t start, std::size_t len,
                                              double running, double target) noexcept {
  std::size_t const j = first_crossing(p + start, len, running, target);
  if (j < len) return static_cast<token_id>(start + j);
  // The block sum (lane order) crossed but the sequential scan fell short by rounding: the last
  // positive entry.
  std::size_t last_positive = start;
  for (std::size_t i = start; i < start + len; ++i)
    if (p[i] > 0.0f) last_positive = i;
  return static_cast<token_id>(last_positive);
}

}  // namespace detail

//! Inverse-CDF draw from the (not necessarily normalised) distribution `probs`: returns the first
//! index i with sum(probs[0..i]) > u * sum(probs), u in [0, 1).
//!
//! Sums are accumulated in double: the row is cut into blocks of `detail::sample_block` entries,
//! each summed in double over `detail::row_lanes` lanes combined in a fixed order; the total is
//! the sum of the block sums in order, and the block where the running sum crosses u * total is
//! scanned entry by entry. The result therefore equals the sequential definition except
//! where u * sum lies within double rounding of a cumulative sum. Zero entries are skipped: the
//! returned index always has a positive probability.
//!
//! Throws `errc::invalid_argument` when u is outside [0, 1) and `errc::numerical` when an entry
//! is negative or NaN, or the row has no positive mass (an empty row included). One pass plus
//! one block for rows up to 2^17 entries (two passes beyond); no allocation.
[[nodiscard]] inline token_id sample_from(std::span<float const> probs, float u) {
  SPECDEC_CHECK(u >= 0.0f && u < 1.0f, invalid_argument, "sample_from: uniform ", u,
                " is outside [0, 1)");
  float const* p = probs.data();
  std::size_t const n = probs.size();
  std::size_t const blocks = (n + detail::sample_block - 1) / detail::sample_block;
  bool const keep = blocks <= detail::sample_stack_blocks;
  double sums[detail::sample_stack_blocks];
  double total = 0.0;
  bool bad = false;
  if (keep) {
    total = detail::block_sums_double(p, n, sums, bad);
  } else {
    for (std::size_t blk = 0; blk < blocks; ++blk) {
      std::size_t const start = blk * detail::sample_block;
      bool block_bad = false;
      total += detail::sum_double(p + start, std::min(detail::sample_block, n - start), block_bad);
      bad = bad || block_bad;
    }
  }
  if (bad) [[unlikely]] {
    for (std::size_t i = 0; i < n; ++i)
      SPECDEC_CHECK(p[i] >= 0.0f, numerical, "sample_from: probability ", i, " of ", n, " is ",
                    p[i]);
  }
  SPECDEC_CHECK(total > 0.0 && total < std::numeric_limits<double>::infinity(), numerical,
                "sample_from: a row of ", n, " probabilities has total mass ", total);
  double const target = static_cast<double>(u) * total;
  double running = 0.0;
  for (std::size_t blk = 0; blk < blocks; ++blk) {
    std::size_t const start = blk * detail::sample_block;
    std::size_t const len = std::min(detail::sample_block, n - start);
    double const sum = keep ? sums[blk] : detail::sum_double(p + start, len);
    if (running + sum > target) return detail::sample_in_block(p, start, len, running, target);
    running += sum;
  }
  // Unreachable: target < total, the final running sum. Kept for safety: the last positive entry.
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
  std::int64_t const a = detail::argmax_index(x, n);
  if (a >= 0) return static_cast<token_id>(a);
  // Nothing above -inf: the first -inf entry, if any.
  for (std::size_t k = 0; k < n; ++k)
    if (x[k] == ninf) return static_cast<token_id>(k);
  SPECDEC_THROW(numerical, "argmax: every one of the ", n, " entries is NaN");
}

}  // namespace specdec
