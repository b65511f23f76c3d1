#pragma once
//! \file
//! What the verifiers share: input validation, the per-node history buffer that penalty-aware
//! policies see, the inverse-CDF draws (plain, residual max(p - q, 0), with excluded tokens), the
//! sampling walk of the lossless verifiers, and the ragged batched entry points
//! (`detail::batch_entry_points`).
//!
//! RNG contract, shared by every verifier (greedy.hpp, speculative_sampling.hpp,
//! tree_sampling.hpp, typical_acceptance.hpp) and by the device kernels: for a tree of n nodes, a
//! verifier reads word offset() + j, j >= 1, for the acceptance test of node j (when its rule
//! draws for that test) and word offset() + 0 for the final draw (the residual or bonus token),
//! and reads no other word; then it advances `rng` by exactly n, whatever the outcome, so that a
//! decoder's stream stays aligned whichever verifier runs (and with the device kernels). On error
//! `rng` is unchanged. Each verifier's header says which of these words it reads.
//!
//! The draw rule, used for every final (residual or bonus) token of every verifier: with weights
//! w over the vocabulary and total W = sum(w) (accumulated in double), the drawn token is the first
//! index i with w[i] > 0 whose running sum exceeds u * W, u = the uniform of Philox word
//! `offset() + 0`. This is `sample_from` of sampling/sample.hpp; summation order is not part of
//! the contract (a device may sum differently; that can only move a draw lying within rounding of a
//! boundary). Should rounding leave u * W unreached, the last index with w[i] > 0 is drawn.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/sampling/kernels.hpp"

namespace specdec::detail {

//! Returned by the draws when no index has positive weight.
inline constexpr std::size_t no_index = static_cast<std::size_t>(-1);

//! Entries per block of the row reductions: a block is summed in float over 16 lanes, blocks are
//! accumulated in double. Fixed-size blocks vectorise; float sums of 64 probabilities lose nothing
//! that matters to a draw.
inline constexpr std::size_t reduce_block = 64;

//! Sum of w(base) .. w(base + 63): 16 float lanes (lane l sums entries l, l + 16, l + 32, l + 48
//! in that order), combined by the fixed tree l += l + 8, then l + 4, l + 2, l + 1. The lanes
//! are one vector and the tree is vector halves added together (the same additions in the same
//! order as an array of lanes; an array is combined through memory, one scalar at a time).
template <class W>
[[nodiscard]] inline float block_sum(std::size_t base, W const& w) noexcept {
  using f16 = float __attribute__((vector_size(16 * sizeof(float))));
  f16 acc = f16{};
  for (std::size_t i = 0; i < reduce_block; i += 16) {
    f16 x;
    for (std::size_t l = 0; l < 16; ++l) x[l] = w(base + i + l);
    acc += x;
  }
  using f8 = float __attribute__((vector_size(8 * sizeof(float))));
  using f4 = float __attribute__((vector_size(4 * sizeof(float))));
  using f2 = float __attribute__((vector_size(2 * sizeof(float))));
  f8 const t8 = __builtin_shufflevector(acc, acc, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15);
  f4 const t4 =
      __builtin_shufflevector(t8, t8, 0, 1, 2, 3) + __builtin_shufflevector(t8, t8, 4, 5, 6, 7);
  f2 const t2 = __builtin_shufflevector(t4, t4, 0, 1) + __builtin_shufflevector(t4, t4, 2, 3);
  return t2[0] + t2[1];
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

//! Throws `errc::numerical` unless `v` is a finite probability (>= 0).
inline void check_probability(float v, char const* who, char const* what, node_index node,
                              token_id token) {
  SPECDEC_CHECK(std::isfinite(v) && v >= 0.0f, numerical, who, ": ", what, " at node ", node,
                " for token ", token, " is ", v, ", not a finite probability");
}

//! The draw rule (see the file comment) over weights p[i] with uniform u: the drawn index, or
//! `no_index` when the weights have no finite positive mass (`total`, their sum, says which).
[[nodiscard]] inline std::size_t draw_index(std::span<float const> p, float u,
                                            double& total) noexcept {
  float const* const data = p.data();
  auto const w = [data](std::size_t j) { return data[j]; };
  kept_sums kept(p.size());
  total = weight_sum(p.size(), w, kept.sums);
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

//! -x ln x for a normal positive float x, accurate to float rounding; 0 for zero, subnormals,
//! negatives, Inf and NaN (callers detect those separately). Selects are done on the bits so that
//! loops calling it vectorise: ln x = e ln 2 + ln m with m in [sqrt(1/2), sqrt(2)) and
//! ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| < 0.172, by its series to s^9.
[[nodiscard]] inline float neg_x_log_x(float x) noexcept {
  std::uint32_t const raw = std::bit_cast<std::uint32_t>(x);
  std::uint32_t const normal = (raw - 0x00800000u) < 0x7f000000u ? 0xffffffffu : 0u;
  std::uint32_t const bits = (raw & normal) | (0x3f800000u & ~normal);  // 1.0f when not normal
  std::uint32_t const mb = (bits & 0x007fffffu) | 0x3f800000u;          // mantissa in [1, 2)
  std::uint32_t const high = (0x3fb504f3u - mb) >> 31;                  // 1 when m > sqrt(2)
  float const m = std::bit_cast<float>(mb - (high << 23));              // halved when high
  float const e = static_cast<float>(static_cast<std::int32_t>(bits >> 23) - 127 +
                                     static_cast<std::int32_t>(high));
  float const s = (m - 1.0f) / (m + 1.0f);
  float const s2 = s * s;
  float const series =
      1.0f + s2 * (1.0f / 3.0f + s2 * (1.0f / 5.0f + s2 * (1.0f / 7.0f + s2 * (1.0f / 9.0f))));
  float const ln = 2.0f * s * series + e * 0.693147180559945f;
  return -std::bit_cast<float>(bits) * ln;  // -1 * ln 1 = 0 when not normal
}

//! Shannon entropy -sum p ln p (nats) of a distribution row; entries below FLT_MIN count as 0.
//! Throws `errc::numerical` when the row holds NaN/Inf.
[[nodiscard]] inline double entropy(std::span<float const> p, char const* who, node_index node) {
  float const* const d = p.data();
  std::size_t const n = p.size();
  auto const raw = [d](std::size_t j) { return d[j]; };
  float terms[reduce_block] = {};  // zeroed: nvcc takes the lambda's read for a use before set
  auto const term = [&terms](std::size_t j) { return terms[j]; };
  double h = 0.0, mass = 0.0;
  std::size_t i = 0;
  for (; i + reduce_block <= n; i += reduce_block) {
    for (std::size_t j = 0; j < reduce_block; ++j) terms[j] = neg_x_log_x(d[i + j]);
    h += static_cast<double>(block_sum(0, term));
    mass += static_cast<double>(block_sum(i, raw));
  }
  for (; i < n; ++i) {
    h += static_cast<double>(neg_x_log_x(d[i]));
    mass += static_cast<double>(d[i]);
  }
  SPECDEC_CHECK(std::isfinite(mass), numerical, who, ": the target distribution at node ", node,
                " has NaN/Inf entries");
  return h;
}

//! Checks a q row the way `draft_tree::validate` does (every entry finite and >= 0, the sum within
//! 1e-3 of 1), in one vectorised pass (`detail::sum_checked`). Throws `errc::numerical` naming
//! the node.
inline void check_q_row(std::span<float const> q, char const* who, node_index node) {
  bool bad = false;
  double const sum = sum_checked(q.data(), q.size(), bad);
  SPECDEC_CHECK(!bad && std::isfinite(sum), numerical, who, ": q row ", node,
                " has NaN/Inf or negative entries");
  SPECDEC_CHECK(std::abs(sum - 1.0) < 1e-3, numerical, who, ": q row ", node, " sums to ", sum,
                ", not 1");
}

//! The committed history followed by the path to a node: what a penalty-aware policy sees when it
//! scores that node's row. Grows geometrically, so it stops allocating once warm.
class path_history {
 public:
  //! Starts a new tree over `committed` (every committed token, the root last) whose paths are
  //! at most `max_depth` tokens long; reserves room for the longest one (geometric growth).
  void reset(std::span<token_id const> committed, std::size_t max_depth) {
    committed_ = committed;
    copied_ = false;
    std::size_t const need = committed.size() + max_depth;
    if (max_depth > 0 && buf_.capacity() < need) buf_.reserve(std::max<std::size_t>(2 * need, 256));
  }

  //! `committed` followed by the tokens of the path to `node` (root excluded, node included).
  [[nodiscard]] std::span<token_id const> at(draft_tree const& tree, node_index node) {
    if (node == 0) return committed_;
    std::size_t const base = committed_.size();
    std::size_t const depth = static_cast<std::size_t>(tree.depth(node));
    if (!copied_) {
      buf_.assign(committed_.begin(), committed_.end());
      copied_ = true;
    }
    buf_.resize(base + depth);
    for (node_index a = node; a > 0; a = tree.parent(a))
      buf_[base + static_cast<std::size_t>(tree.depth(a)) - 1] = tree.token(a);
    return std::span<token_id const>(buf_.data(), base + depth);
  }

 private:
  std::span<token_id const> committed_;
  std::vector<token_id> buf_;
  bool copied_ = false;
};

//! Checks what every verifier needs up front: a non-empty tree, `rows` == tree.size(), vocab >= 1,
//! every token id < vocab and, with q rows, their vocabulary. O(nodes): the rows themselves are
//! checked where they are read (`draft_tree::validate` would read every q row, O(nodes x vocab)).
inline void check_inputs(char const* who, draft_tree const& tree, std::size_t rows,
                         std::size_t vocab) {
  SPECDEC_CHECK(!tree.empty(), invalid_argument, who, ": the draft tree is empty (no root)");
  SPECDEC_CHECK(vocab >= 1, invalid_argument, who, ": target rows have 0 columns (vocabulary 0)");
  SPECDEC_CHECK(rows == tree.size(), invalid_argument, who, ": ", rows,
                " target rows for a draft tree of ", tree.size(), " nodes (one row per node)");
  for (std::size_t i = 0; i < tree.size(); ++i) {
    token_id const t = tree.token(static_cast<node_index>(i));
    SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < vocab, out_of_range, who, ": node ", i,
                  " has token ", t, ", outside the vocabulary of ", vocab);
  }
  SPECDEC_CHECK(!tree.has_q() || tree.q_vocab() == vocab, invalid_argument, who, ": q rows have ",
                tree.q_vocab(), " entries but target rows have ", vocab);
}

//! Checks a token a policy returned.
inline void check_policy_token(token_id t, std::size_t vocab, char const* who, node_index node) {
  SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < vocab, out_of_range, who,
                ": the policy returned token ", t, " at node ", node,
                ", outside the vocabulary of ", vocab);
}

//! Row source for the logits entry points: the policy's distribution of row `node` (history
//! extended by the path to the node), written into `buf`.
template <class Policy>
struct policy_rows {
  //! q rows are validated where the walk uses them (the whole tree is not re-read).
  static constexpr bool check_q = true;
  draft_tree const& tree;
  matrix_view<float const> logits;  //!< [tree.size(), vocab], row-major
  Policy const& policy;
  path_history& history;
  //! The committed history was checked by the caller (the path's tokens by `check_inputs`).
  bool history_checked = false;

  std::span<float const> operator()(node_index node, std::span<float> buf) const {
    distribution_of(policy, logits.row(static_cast<std::size_t>(node)), history.at(tree, node), buf,
                    history_checked);
    return std::span<float const>(buf.data(), buf.size());
  }
};

//! Row source for the probability entry points: row `node` as given.
struct given_rows {
  //! The probability entry points trust q rows beyond the values they read.
  static constexpr bool check_q = false;
  matrix_view<float const> probs;  //!< [tree.size(), vocab], row-major

  std::span<float const> operator()(node_index node, std::span<float> /*buf*/) const noexcept {
    return probs.row(static_cast<std::size_t>(node));
  }
};

//! Greedy walk: from the root, accept the first child whose token is the policy's greedy token
//! of the current row; the bonus is the greedy token where no child matches. One
//! `greedy_token` call per walked row; no distribution is written.
template <class Policy>
void greedy_walk(char const* who, draft_tree const& tree, matrix_view<float const> logits,
                 Policy const& policy, path_history& history, verify_result& out) {
  std::size_t const vocab = logits.cols();
  node_index node = 0;
  for (;;) {
    std::span<float const> const row = logits.row(static_cast<std::size_t>(node));
    token_id const g = policy.greedy_token(row, history.at(tree, node));
    check_policy_token(g, vocab, who, node);
    SPECDEC_CHECK(std::isfinite(row[static_cast<std::size_t>(g)]), numerical, who,
                  ": the target logit of the greedy token ", g, " at node ", node, " is ",
                  row[static_cast<std::size_t>(g)]);
    node_index const child = tree.find_child(node, g);
    if (child < 0) {
      out.tokens.push_back(g);
      return;
    }
    out.accepted_nodes.push_back(child);
    out.tokens.push_back(g);
    node = child;
  }
}

//! Greedy walk over probability rows (argmax of each row, ties to the lowest id).
inline void greedy_walk_probs(char const* who, draft_tree const& tree,
                              matrix_view<float const> probs, verify_result& out) {
  node_index node = 0;
  for (;;) {
    std::span<float const> const row = probs.row(static_cast<std::size_t>(node));
    std::size_t best = 0;
    float best_v = row[0];
    for (std::size_t i = 1; i < row.size(); ++i) {
      if (row[i] > best_v) {
        best_v = row[i];
        best = i;
      }
    }
    SPECDEC_CHECK(std::isfinite(best_v) && best_v > 0.0f, numerical, who,
                  ": the target distribution at node ", node, " has maximum ", best_v,
                  " (NaN/Inf entries or no mass)");
    auto const g = static_cast<token_id>(best);
    node_index const child = tree.find_child(node, g);
    out.tokens.push_back(g);
    if (child < 0) return;
    out.accepted_nodes.push_back(child);
    node = child;
  }
}

//! The uniforms at `rng.offset() + delta` (`philox::uniform_at`), keeping the last Philox block
//! computed: a walk reads words offset + 0 and offset + j of the children it tests, which share
//! few blocks.
class uniform_reader {
 public:
  explicit uniform_reader(philox const& rng) noexcept : rng_(rng) {}
  //! `rng.uniform_at(delta)`.
  [[nodiscard]] float at(std::uint64_t delta) noexcept {
    return word_to_uniform(kept_.word(rng_.seed(), rng_.stream(), rng_.offset() + delta));
  }

 private:
  philox const& rng_;
  philox_kept_block kept_;
};

//! Scratch that a sampling walk owns; sized once per vocabulary.
struct walk_scratch {
  std::vector<float> work;         //!< [vocab] a distribution row or a residual
  std::vector<token_id> rejected;  //!< rejected sibling tokens (point-mass mode), ascending

  void prepare(std::size_t vocab, std::size_t nodes) {
    if (work.size() != vocab) work.assign(vocab, 0.0f);
    if (rejected.capacity() < nodes) rejected.reserve(nodes);
  }
};

//! The sampling walk shared by `speculative_sampling_verifier` and `tree_verifier`.
//!
//! From the root, with p the target distribution of the current node:
//! - with q rows (children drawn i.i.d. from q = q_row(node)), each child x in insertion order is
//!   accepted iff p(x) > 0 and (p(x) >= q(x) or u * q(x) < p(x)), u the uniform of its node's
//!   word; on rejection p becomes norm(max(p - q, 0)) (unchanged when that has no mass); when all
//!   children are rejected the token is drawn from max(p - q, 0) of the last p (p if no mass);
//! - without q rows (point masses), with m the mass not yet rejected (1, minus p(x) of each
//!   rejected child), each child x is accepted iff p(x) > 0 and (p(x) >= m or u * m < p(x)); when
//!   all are rejected the token is drawn from p with the rejected tokens removed;
//! - when a child is accepted the walk moves to it; at a leaf the bonus is drawn from p.
template <class Source>
void sampling_walk(char const* who, draft_tree const& tree, Source const& rows, philox const& rng,
                   walk_scratch& scratch, verify_result& out) {
  std::span<float> const work(scratch.work);
  uniform_reader uniforms(rng);
  float const u0 = uniforms.at(0);
  node_index node = 0;
  for (;;) {
    std::span<float const> cur = rows(node, work);
    node_index child = tree.first_child(node);
    if (child < 0) {
      out.tokens.push_back(draw_from(cur, u0, who, node));
      return;
    }
    node_index accepted = -1;
    if (tree.has_q()) {
      std::span<float const> const q = tree.q_row(node);
      if constexpr (Source::check_q) check_q_row(q, who, node);
      for (; child >= 0; child = tree.next_sibling(child)) {
        token_id const x = tree.token(child);
        float const px = cur[static_cast<std::size_t>(x)];
        float const qx = q[static_cast<std::size_t>(x)];
        check_probability(px, who, "the target probability", node, x);
        check_probability(qx, who, "the draft probability", node, x);
        float const u = uniforms.at(static_cast<std::uint64_t>(child));
        if (px > 0.0f && (px >= qx || u * qx < px)) {
          accepted = child;
          break;
        }
        if (tree.next_sibling(child) < 0) {
          out.tokens.push_back(draw_residual(cur, q, u0, who, node));
          return;
        }
        cur = residual_update(cur, q, work, who, node);
      }
    } else {
      float mass = 1.0f;
      scratch.rejected.clear();
      for (; child >= 0; child = tree.next_sibling(child)) {
        token_id const x = tree.token(child);
        float const px = cur[static_cast<std::size_t>(x)];
        check_probability(px, who, "the target probability", node, x);
        float const u = uniforms.at(static_cast<std::uint64_t>(child));
        if (px > 0.0f && (px >= mass || u * mass < px)) {
          accepted = child;
          break;
        }
        mass -= px;
        auto const pos = std::lower_bound(scratch.rejected.begin(), scratch.rejected.end(), x);
        if (pos == scratch.rejected.end() || *pos != x) scratch.rejected.insert(pos, x);
      }
      if (accepted < 0) {
        token_id t = draw_excluding(cur, scratch.rejected, u0, who, node);
        if (t == no_token) {
          // Only rounding can get here: the children covered all of p's mass, so the last
          // rejected child with p > 0 held what was left; it is the token.
          for (node_index c = tree.first_child(node); c >= 0; c = tree.next_sibling(c))
            if (cur[static_cast<std::size_t>(tree.token(c))] > 0.0f) t = tree.token(c);
          SPECDEC_CHECK(t != no_token, numerical, who, ": the target distribution at node ", node,
                        " has no mass");
        }
        out.tokens.push_back(t);
        return;
      }
    }
    out.accepted_nodes.push_back(accepted);
    out.tokens.push_back(tree.token(accepted));
    node = accepted;
  }
}

//! Drives a ragged batch: sequence b owns rows [cu_nodes[b], cu_nodes[b + 1]) of `rows`, tree
//! `tree_at(b)`, `rngs[b]` and `out[b]`; `one(b, tree, rows_of_b)` verifies it. Checks every shape
//! before verifying any sequence.
template <class TreeAt, class One>
void verify_ragged(char const* who, std::size_t batch, TreeAt const& tree_at,
                   matrix_view<float const> rows, std::span<std::int32_t const> cu_nodes,
                   std::size_t num_rngs, std::size_t num_out, One const& one) {
  SPECDEC_CHECK(cu_nodes.size() == batch + 1, invalid_argument, who, ": ", cu_nodes.size(),
                " cumulative node counts for a batch of ", batch, " (need batch + 1)");
  SPECDEC_CHECK(num_rngs == batch, invalid_argument, who, ": ", num_rngs,
                " generators for a batch of ", batch);
  SPECDEC_CHECK(num_out == batch, invalid_argument, who, ": ", num_out, " results for a batch of ",
                batch);
  SPECDEC_CHECK(cu_nodes[0] == 0, invalid_argument, who, ": cu_nodes[0] is ", cu_nodes[0],
                ", expected 0");
  SPECDEC_CHECK(static_cast<std::size_t>(cu_nodes[batch]) == rows.rows() && cu_nodes[batch] >= 0,
                invalid_argument, who, ": cu_nodes[", batch, "] is ", cu_nodes[batch],
                " but there are ", rows.rows(), " rows");
  for (std::size_t b = 0; b < batch; ++b) {
    draft_tree const* t = tree_at(b);
    SPECDEC_CHECK(t != nullptr, invalid_argument, who, ": tree ", b, " is null");
    SPECDEC_CHECK(cu_nodes[b + 1] >= cu_nodes[b], invalid_argument, who, ": cu_nodes decreases at ",
                  b + 1, " (", cu_nodes[b], " -> ", cu_nodes[b + 1], ")");
    auto const count = static_cast<std::size_t>(cu_nodes[b + 1] - cu_nodes[b]);
    SPECDEC_CHECK(count == t->size(), invalid_argument, who, ": sequence ", b, " has ", count,
                  " rows but its tree has ", t->size(), " nodes");
  }
  for (std::size_t b = 0; b < batch; ++b) {
    auto const first = static_cast<std::size_t>(cu_nodes[b]);
    one(b, *tree_at(b), rows.subrows(first, tree_at(b)->size()));
  }
}

//! Empties `out` and reserves room for the longest path of `tree` (its accepted nodes, and their
//! tokens plus the bonus), so that a verifier's walk does not allocate once warm.
inline void prepare_result(draft_tree const& tree, verify_result& out) {
  out.clear();
  auto const depth = static_cast<std::size_t>(tree.max_depth());
  out.accepted_nodes.reserve(depth);
  out.tokens.reserve(depth + 1);
}

//! The state and the entry points of the lossless sampling verifiers
//! (`speculative_sampling_verifier`, `tree_verifier`): a greedy policy takes `greedy_walk`, any
//! other `sampling_walk` over the policy's distributions; probability rows take `sampling_walk`
//! directly. Each call checks the inputs, verifies, and advances `rng` by tree.size().
class sampling_verifier_core {
 public:
  //! Verifies `tree` against `target_logits` ([tree.size(), vocab], row-major) under `policy`.
  template <sampling_policy Policy>
  void verify(char const* who, draft_tree const& tree, matrix_view<float const> target_logits,
              Policy const& policy, std::span<token_id const> history, philox& rng,
              verify_result& out, bool history_checked = false) {
    check_inputs(who, tree, target_logits.rows(), target_logits.cols());
    prepare(tree, target_logits.cols(), out);
    history_.reset(history, static_cast<std::size_t>(tree.max_depth()));
    if (policy.is_greedy()) {
      greedy_walk(who, tree, target_logits, policy, history_, out);
    } else {
      policy_rows<Policy> const rows{tree, target_logits, policy, history_, history_checked};
      sampling_walk(who, tree, rows, rng, scratch_, out);
    }
    rng.skip(tree.size());
  }

  //! Verifies `tree` against target distribution rows `target_probs` ([tree.size(), vocab],
  //! row-major).
  void verify_probs(char const* who, draft_tree const& tree, matrix_view<float const> target_probs,
                    philox& rng, verify_result& out) {
    check_inputs(who, tree, target_probs.rows(), target_probs.cols());
    prepare(tree, target_probs.cols(), out);
    sampling_walk(who, tree, given_rows{target_probs}, rng, scratch_, out);
    rng.skip(tree.size());
  }

 private:
  void prepare(draft_tree const& tree, std::size_t vocab, verify_result& out) {
    prepare_result(tree, out);
    scratch_.prepare(vocab, tree.size());
  }

  path_history history_;
  walk_scratch scratch_;
};

//! The ragged batched entry points of every verifier, written once: a verifier `V` derives from
//! `batch_entry_points<V>` (and befriends it, so that its `name` can label errors), and these
//! call `V::verify` / `V::verify_probs` once per sequence.
//!
//! Layout: the rows of every sequence are concatenated into one matrix ([num_tokens, vocab],
//! row-major, num_tokens = cu_nodes[batch]); sequence b has tree `*trees[b]`, rows
//! [cu_nodes[b], cu_nodes[b + 1]), `histories[b]` (logits entry point), `rngs[b]` and `out[b]`.
//! Results, and the words each `rngs[b]` consumes, equal per-sequence calls. Every shape is checked
//! before any sequence is verified (`errc::invalid_argument`: a null tree, cu_nodes not of
//! batch + 1 non-decreasing entries from 0 to the row count, a sequence whose row count is not its
//! tree's size, or histories / generators / results not one per tree); an error in sequence b
//! leaves sequences < b done.
template <class Derived>
class batch_entry_points {
 public:
  //! Ragged batch over target logits: results equal per-sequence `verify` calls.
  template <sampling_policy Policy>
  void verify_batch(std::span<draft_tree const* const> trees,
                    matrix_view<float const> target_logits, std::span<std::int32_t const> cu_nodes,
                    Policy const& policy, std::span<std::span<token_id const> const> histories,
                    std::span<philox> rngs, std::span<verify_result> out) {
    char const* const who = Derived::name;
    SPECDEC_CHECK(histories.size() == trees.size(), invalid_argument, who, ": ", histories.size(),
                  " histories for a batch of ", trees.size());
    verify_ragged(
        who, trees.size(), [&](std::size_t b) { return trees[b]; }, target_logits, cu_nodes,
        rngs.size(), out.size(),
        [&](std::size_t b, draft_tree const& t, matrix_view<float const> rows) {
          self().verify(t, rows, policy, histories[b], rngs[b], out[b]);
        });
  }

  //! Ragged batch over target distribution rows: results equal per-sequence `verify_probs` calls.
  void verify_probs_batch(std::span<draft_tree const* const> trees,
                          matrix_view<float const> target_probs,
                          std::span<std::int32_t const> cu_nodes, std::span<philox> rngs,
                          std::span<verify_result> out) {
    verify_ragged(
        Derived::name, trees.size(), [&](std::size_t b) { return trees[b]; }, target_probs,
        cu_nodes, rngs.size(), out.size(),
        [&](std::size_t b, draft_tree const& t, matrix_view<float const> rows) {
          self().verify_probs(t, rows, rngs[b], out[b]);
        });
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

}  // namespace specdec::detail
