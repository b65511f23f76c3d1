#pragma once
//! \file
//! Drawing a token: the one inverse-CDF draw rule of the library, which the sampler
//! (`sample_from`), the proposers that sample their drafts and every verifier's final draw all use,
//! its variants (over residual weights max(p - q, 0), with excluded tokens), and the greedy choice
//! (`argmax`).
//!
//! The draw rule: with weights w over the vocabulary and total W = sum(w), the drawn token is the
//! first index i with w[i] > 0 whose running sum exceeds u * W, u in [0, 1). Sums are taken over
//! blocks of `detail::reduce_block` entries, each summed in float over 16 lanes in a fixed order,
//! and accumulated in double across blocks; the block where the running sum crosses u * W is then
//! searched entry by entry in double. A draw therefore equals the exact sequential definition
//! except where u * W lies within float rounding of a block's cumulative sum. Summation order is
//! not part of the contract: a device may sum differently, which can only move a draw that lies
//! within rounding of a boundary. Should rounding leave u * W unreached, the last index with
//! w[i] > 0 is drawn; an index with w[i] <= 0 never is.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/detail/rows.hpp"
#include "specdec/detail/simd.hpp"

namespace specdec {

namespace detail {

//! Returned by the draws when no index has positive weight.
inline constexpr std::size_t no_index = static_cast<std::size_t>(-1);

//! Entries per block of the row reductions: a block is summed in float over 16 lanes, blocks are
//! accumulated in double. Fixed-size blocks vectorise; float sums of 64 probabilities lose nothing
//! that matters to a draw.
inline constexpr std::size_t reduce_block = 64;

//! Sum of w(base) .. w(base + 63): 16 float lanes (lane l sums entries l, l + 16, l + 32, l + 48
//! in that order), combined by the fixed tree l += l + 8, then l + 4, l + 2, l + 1
//! (`sum_row_lanes`): the same additions in the same order whatever the vector width.
template <class W>
[[nodiscard]] SPECDEC_INLINE float block_sum(std::size_t base, W const& w) noexcept {
  static_assert(reduce_block % row_lanes == 0);
  vfloat acc[row_vectors];
  for (vfloat& a : acc) a = vfloat{};
  for (std::size_t i = 0; i < reduce_block; i += row_lanes) {
    for (std::size_t v = 0; v < row_vectors; ++v) {
      vfloat x;
      for (std::size_t l = 0; l < simd_width; ++l) x[l] = w(base + i + v * simd_width + l);
      acc[v] += x;
    }
  }
  return sum_row_lanes(acc);
}

//! Whole blocks whose sums a draw keeps on the stack (8 KiB) for its scan: rows up to
//! 2048 * 64 = 131072 entries; longer rows recompute the sums they scan past.
inline constexpr std::size_t kept_block_sums = 2048;

//! Block sums kept by a draw between its total and its scan (`sums` is null for longer rows).
struct kept_sums {
  float buf[kept_block_sums];
  float* sums = nullptr;
  explicit kept_sums(std::size_t n) noexcept {
    if (n / reduce_block <= kept_block_sums) sums = buf;
  }
};

//! Sum of w(0) .. w(n - 1): blocks of `reduce_block` in float, accumulated in double. Writes
//! each whole block's sum to `sums[b]` when `sums` is not null.
template <class W>
[[nodiscard]] inline double weight_sum(std::size_t n, W const& w, float* sums = nullptr) noexcept {
  double total = 0.0;
  std::size_t i = 0;
  for (; i + reduce_block <= n; i += reduce_block) {
    float const b = block_sum(i, w);
    if (sums != nullptr) sums[i / reduce_block] = b;
    total += static_cast<double>(b);
  }
  for (; i < n; ++i) total += static_cast<double>(w(i));
  return total;
}

//! `weight_sum` of the plain row x[0..n) (the same sums: whole blocks through the lanes of
//! `block_sum`, the tail in order), read with vector loads; `bad` is set, in the same pass, when an
//! entry is negative or NaN.
[[nodiscard]] inline double row_weight_sum(float const* x, std::size_t n, float* sums,
                                           bool& bad) noexcept {
  vfloat const zero = splat(0.0f);
  vint negative = vint{};
  double total = 0.0;
  std::size_t i = 0;
  for (; i + reduce_block <= n; i += reduce_block) {
    vfloat acc[row_vectors];
    for (vfloat& a : acc) a = vfloat{};
    for (std::size_t k = 0; k < reduce_block; k += row_lanes) {
      for (std::size_t v = 0; v < row_vectors; ++v) {
        vfloat const a = load(x + i + k + v * simd_width);
        negative |= ~(a >= zero);  // negative or NaN
        acc[v] += a;
      }
    }
    float const b = sum_row_lanes(acc);
    if (sums != nullptr) sums[i / reduce_block] = b;
    total += static_cast<double>(b);
  }
  bad = add_tail_checked(x, i, n, total) || any(negative);
  return total;
}

//! The inverse-CDF scan: the first index i, not in `excluded` (ascending, unique), with
//! w(i) > 0 whose running sum exceeds u * total; `no_index` when no index qualifies. Blocks of 64
//! are skipped on their sums (read from `sums` when not null: what `weight_sum` wrote for the same
//! weights); the block where the sum crosses is walked element by element.
template <class W>
[[nodiscard]] inline std::size_t scan_weights(std::size_t n, double total, float u, W const& w,
                                              std::span<token_id const> excluded = {},
                                              float const* sums = nullptr) noexcept {
  constexpr std::size_t block = reduce_block;
  double const target = static_cast<double>(u) * total;
  double cum = 0.0;
  std::size_t i = 0;
  std::size_t e = 0;  // first excluded index >= i
  for (; i + block <= n; i += block) {
    double b = static_cast<double>(sums != nullptr ? sums[i / block] : block_sum(i, w));
    std::size_t e_end = e;
    while (e_end < excluded.size() && static_cast<std::size_t>(excluded[e_end]) < i + block) {
      float const x = w(static_cast<std::size_t>(excluded[e_end]));
      if (x > 0.0f) b -= static_cast<double>(x);
      ++e_end;
    }
    if (cum + b > target) break;
    cum += b;
    e = e_end;
  }
  // The crossing block, when no excluded token is in it, is searched by `first_crossing` on its
  // weights; otherwise (or when the block does not cross after all) entry by entry.
  if (i + block <= n &&
      (e == excluded.size() || static_cast<std::size_t>(excluded[e]) >= i + block)) {
    float buf[block];
    for (std::size_t j = 0; j < block; ++j) buf[j] = w(i + j);
    std::size_t const j = first_crossing(buf, block, cum, target);
    if (j < block) return i + j;
  }
  std::size_t last_positive = no_index;
  for (; i < n; ++i) {
    if (e < excluded.size() && static_cast<std::size_t>(excluded[e]) == i) {
      ++e;
      continue;
    }
    // Branch-free on the sign (residual rows mix zeros and positives unpredictably): a zero
    // added to the running sum leaves it unchanged, so it cannot cross.
    float x = w(i);
    opaque(x);  // so that the weight's own clamp is not turned into a branch
    last_positive = select_index(x > 0.0f, i, last_positive);
    cum += static_cast<double>(positive_part(x));
    if (cum > target) return i;
  }
  if (last_positive != no_index) return last_positive;
  // The crossing block was entered on a rounding artefact and held nothing positive: search back.
  for (std::size_t j = n; j-- > 0;) {
    bool const skip =
        std::binary_search(excluded.begin(), excluded.end(), static_cast<token_id>(j));
    if (!skip && w(j) > 0.0f) return j;
  }
  return no_index;
}

//! The draw rule (see the file comment) over weights p[i] with uniform u: the drawn index, or
//! `no_index` when the weights have no finite positive mass (`total`, their sum, says which).
[[nodiscard]] inline std::size_t draw_index(std::span<float const> p, float u,
                                            double& total) noexcept {
  float const* const data = p.data();
  auto const w = [data](std::size_t j) { return data[j]; };
  kept_sums kept(p.size());
  bool bad = false;
  total = row_weight_sum(data, p.size(), kept.sums, bad);
  if (!(std::isfinite(total) && total > 0.0)) return no_index;
  return scan_weights(p.size(), total, u, w, {}, kept.sums);
}

//! Draws from distribution row `p` (weights p[i]) with uniform `u`. Throws `errc::numerical` when
//! the row has NaN/Inf entries or no mass.
[[nodiscard]] inline token_id draw_from(std::span<float const> p, float u, char const* who,
                                        node_index node) {
  double total = 0.0;
  std::size_t const i = draw_index(p, u, total);
  SPECDEC_CHECK(std::isfinite(total) && total > 0.0, numerical, who,
                ": the target distribution at node ", node, " sums to ", total,
                " (NaN/Inf entries or no mass)");
  SPECDEC_CHECK(i != no_index, numerical, who, ": the target distribution at node ", node,
                " has no positive entry");
  return static_cast<token_id>(i);
}

//! Draws from `p` with the tokens in `excluded` (ascending, unique) set to zero. Returns
//! `no_token` when nothing outside `excluded` has mass. Throws `errc::numerical` on NaN/Inf.
[[nodiscard]] inline token_id draw_excluding(std::span<float const> p,
                                             std::span<token_id const> excluded, float u,
                                             char const* who, node_index node) {
  float const* const data = p.data();
  auto const w = [data](std::size_t j) { return data[j]; };
  kept_sums kept(p.size());
  double total = weight_sum(p.size(), w, kept.sums);
  SPECDEC_CHECK(std::isfinite(total), numerical, who, ": the target distribution at node ", node,
                " sums to ", total, " (NaN/Inf entries)");
  for (token_id t : excluded)
    if (p[static_cast<std::size_t>(t)] > 0.0f)
      total -= static_cast<double>(p[static_cast<std::size_t>(t)]);
  if (!(total > 0.0)) return no_token;
  std::size_t const i = scan_weights(p.size(), total, u, w, excluded, kept.sums);
  return i == no_index ? no_token : static_cast<token_id>(i);
}

//! max(p - q, 0), NaN-propagating (a NaN difference stays NaN and poisons the sum).
[[nodiscard]] inline float residual_weight(float p, float q) noexcept {
  float const d = p - q;
  return d < 0.0f ? 0.0f : d;
}

//! Sum of max(p - q, 0) in double (each whole block's float sum written to `sums[b]` when `sums`
//! is not null). Throws `errc::numerical` when p or q hold NaN/Inf (a second sum, of p - q
//! itself, catches what the clamp would hide).
[[nodiscard]] inline double residual_total(std::span<float const> p, std::span<float const> q,
                                           char const* who, node_index node,
                                           float* sums = nullptr) {
  float const* pp = p.data();
  float const* qq = q.data();
  auto const w = [pp, qq](std::size_t j) { return residual_weight(pp[j], qq[j]); };
  auto const d = [pp, qq](std::size_t j) { return pp[j] - qq[j]; };
  std::size_t const n = p.size();
  double total = 0.0, diff = 0.0;
  std::size_t i = 0;
  for (; i + reduce_block <= n; i += reduce_block) {
    float const b = block_sum(i, w);
    if (sums != nullptr) sums[i / reduce_block] = b;
    total += static_cast<double>(b);
    diff += static_cast<double>(block_sum(i, d));
  }
  for (; i < n; ++i) {
    total += static_cast<double>(w(i));
    diff += static_cast<double>(d(i));
  }
  SPECDEC_CHECK(std::isfinite(total) && std::isfinite(diff), numerical, who,
                ": the target or draft distribution at node ", node, " has NaN/Inf entries");
  return total;
}

//! Draws from norm(max(p - q, 0)); when that residual has no mass, draws from p (the rule of
//! speculative sampling). Throws `errc::numerical` on NaN/Inf or when p has no mass.
[[nodiscard]] inline token_id draw_residual(std::span<float const> p, std::span<float const> q,
                                            float u, char const* who, node_index node) {
  kept_sums kept(p.size());
  double const total = residual_total(p, q, who, node, kept.sums);
  if (total > 0.0) {
    float const* const pp = p.data();
    float const* const qq = q.data();
    auto const w = [pp, qq](std::size_t j) { return residual_weight(pp[j], qq[j]); };
    std::size_t const i = scan_weights(p.size(), total, u, w, {}, kept.sums);
    if (i != no_index) return static_cast<token_id>(i);
  }
  return draw_from(p, u, who, node);
}

//! Replaces `cur` by norm(max(cur - q, 0)) written into `out` (which may alias `cur`), unless that
//! residual has no mass, in which case `cur` is returned unchanged.
[[nodiscard]] inline std::span<float const> residual_update(std::span<float const> cur,
                                                            std::span<float const> q,
                                                            std::span<float> out, char const* who,
                                                            node_index node) {
  double const total = residual_total(cur, q, who, node);
  if (!(total > 0.0)) return cur;
  float const scale = static_cast<float>(1.0 / total);
  std::size_t const n = cur.size();
  float const* c = cur.data();
  float const* qq = q.data();
  float* o = out.data();
  for (std::size_t i = 0; i < n; ++i) o[i] = residual_weight(c[i], qq[i]) * scale;
  return std::span<float const>(out.data(), n);
}

}  // namespace detail

//! Inverse-CDF draw from the (not necessarily normalised) distribution `probs` by the draw rule
//! (see the file comment): the first index i with probs[i] > 0 and
//! sum(probs[0..i]) > u * sum(probs), u in [0, 1).
//!
//! Throws `errc::invalid_argument` when u is outside [0, 1) and `errc::numerical` when an entry
//! is negative or NaN, or the row has no positive finite mass (an empty row included). One pass
//! plus one block for rows up to 2^17 entries (two passes beyond); no allocation.
[[nodiscard]] inline token_id sample_from(std::span<float const> probs, float u) {
  SPECDEC_CHECK(u >= 0.0f && u < 1.0f, invalid_argument, "sample_from: uniform ", u,
                " is outside [0, 1)");
  float const* const p = probs.data();
  std::size_t const n = probs.size();
  auto const w = [p](std::size_t j) { return p[j]; };
  detail::kept_sums kept(n);
  bool bad = false;
  double const total = detail::row_weight_sum(p, n, kept.sums, bad);
  if (bad || !(total > 0.0 && total < std::numeric_limits<double>::infinity())) [[unlikely]] {
    for (std::size_t i = 0; i < n; ++i)
      SPECDEC_CHECK(p[i] >= 0.0f, numerical, "sample_from: probability ", i, " of ", n, " is ",
                    p[i]);
    SPECDEC_THROW(numerical, "sample_from: a row of ", n, " probabilities has total mass ", total);
  }
  std::size_t const i = detail::scan_weights(n, total, u, w, {}, kept.sums);
  SPECDEC_CHECK(i != detail::no_index, internal,
                "sample_from: no positive entry in a row with positive mass");
  return static_cast<token_id>(i);
}

namespace detail {

//! The index of the largest entry of `row` that is not NaN, ties to the lowest index; when nothing
//! is above -inf, the first -inf entry; -1 when every entry is NaN or the row is empty. One
//! vectorised pass (`argmax_index`).
[[nodiscard]] inline std::int64_t argmax_or_none(std::span<float const> row) noexcept {
  if (row.empty()) return -1;
  std::int64_t const a = argmax_index(row.data(), row.size());
  if (a >= 0) return a;
  for (std::size_t k = 0; k < row.size(); ++k)
    if (row[k] == -std::numeric_limits<float>::infinity()) return static_cast<std::int64_t>(k);
  return -1;
}

//! `argmax_or_none`, with 0 for a row with no entry that is not NaN (the proposers that guess
//! from raw logits take any token there; verification decides).
[[nodiscard]] inline token_id argmax_token(std::span<float const> row) noexcept {
  std::int64_t const a = argmax_or_none(row);
  return a >= 0 ? static_cast<token_id>(a) : 0;
}

}  // namespace detail

//! Index of the largest entry of `values`, ties to the lowest index. NaN entries are never
//! chosen. Throws `errc::invalid_argument` for an empty row and `errc::numerical` when every
//! entry is NaN. One pass; no allocation.
[[nodiscard]] inline token_id argmax(std::span<float const> values) {
  SPECDEC_CHECK(!values.empty(), invalid_argument, "argmax: empty row");
  std::int64_t const a = detail::argmax_or_none(values);
  SPECDEC_CHECK(a >= 0, numerical, "argmax: every one of the ", values.size(), " entries is NaN");
  return static_cast<token_id>(a);
}

}  // namespace specdec
