#pragma once
//! \file
//! `typical_acceptance_verifier`: Medusa's typical acceptance (Cai et al. 2024). LOSSY and opt-in:
//! its output is not distributed as plain sampling; it trades fidelity for longer accepted paths.
//!
//! Semantics. For a node with target distribution p (the policy's `distribution` of its row, the
//! history extended by the path to the node) and entropy H(p) = -sum p ln p (nats), a child x is
//! accepted iff p(x) > min(epsilon, delta * exp(-H(p))) (evaluated in double). A node is reached
//! when every node on its path was accepted. The accepted path is the one to the deepest reached
//! node (ties: the lowest node index, i.e. the earliest drafted). The bonus token is drawn from p
//! at that last node with the uniform of word offset() + 0 (the draw rule of
//! sampling/draw.hpp), so it follows the policy: with a greedy policy it is the argmax, as in
//! Medusa's greedy mode; with temperature/top-k/top-p it is a policy sample. With a greedy policy
//! p is one-hot, so exactly the children equal to the greedy token are accepted (epsilon < 1).
//! q rows are ignored.
//!
//! RNG contract: that of every verifier (verify/detail/walk.hpp). The acceptance tests read no
//! word; the bonus reads word offset() + 0.
//!
//! Cost: one `distribution` and one entropy pass per reached node that has children, plus the
//! last node's row when it is a leaf; unreached rows are never read.
//!
//! Validation: token ids < vocab, one target row per node, the q vocabulary when q rows exist (q
//! rows themselves are not read, so they are not validated); every value read is checked.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/sampling/draw.hpp"
#include "specdec/verify/detail/batch.hpp"
#include "specdec/verify/detail/checks.hpp"
#include "specdec/verify/detail/walk.hpp"

namespace specdec {

namespace detail {

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

}  // namespace detail

//! Parameters of typical acceptance.
struct typical_acceptance_params {
  float epsilon = 0.09f;  //!< posterior threshold, in [0, 1) (Medusa's posterior_threshold)
  float delta = 0.3f;     //!< entropy-scaled threshold factor, >= 0 (Medusa's posterior_alpha)

  //! Throws `errc::invalid_argument` naming the field when a value is outside its domain.
  void validate() const {
    SPECDEC_CHECK(std::isfinite(epsilon) && epsilon >= 0.0f && epsilon < 1.0f, invalid_argument,
                  "typical_acceptance_params: epsilon ", epsilon, " is outside [0, 1)");
    SPECDEC_CHECK(std::isfinite(delta) && delta >= 0.0f, invalid_argument,
                  "typical_acceptance_params: delta ", delta, " is not a finite value >= 0");
  }

  //! The acceptance threshold for a distribution of entropy `h` nats.
  [[nodiscard]] double threshold(double h) const noexcept {
    double const scaled = static_cast<double>(delta) * std::exp(-h);
    double const eps = static_cast<double>(epsilon);
    return scaled < eps ? scaled : eps;
  }
};

//! Typical acceptance over chains and trees (see the file comment for the exact semantics).
//! The ragged batched entry points `verify_batch` / `verify_probs_batch` are those of
//! `detail::batch_entry_points`. A verifier owns scratch buffers (sized once, reused): use one per
//! thread.
class typical_acceptance_verifier : public detail::batch_entry_points<typical_acceptance_verifier> {
 public:
  //! Any sampling policy works.
  static constexpr bool greedy_only = false;
  //! Multi-child trees are supported.
  static constexpr bool supports_trees = true;
  //! q rows are not needed (and are ignored).
  static constexpr bool needs_draft_probs = false;
  //! Lossy: the output is not distributed as plain sampling.
  static constexpr bool lossless = false;

  //! Medusa's defaults (epsilon 0.09, delta 0.3).
  typical_acceptance_verifier() = default;
  //! Validates `params`.
  explicit typical_acceptance_verifier(typical_acceptance_params params) : params_(params) {
    params_.validate();
  }

  //! The parameters.
  [[nodiscard]] typical_acceptance_params const& params() const noexcept { return params_; }

  //! Verifies `tree` against `target_logits` ([tree.size(), vocab], row i = the target's logits
  //! after the path to node i) under `policy`; `history` is every committed token with the root
  //! last. Throws `errc::invalid_argument` when shapes disagree, `errc::out_of_range` for token
  //! ids >= vocab, `errc::numerical` for NaN/Inf or massless rows. On error `rng` is unchanged.
  //! Advances `rng` by tree.size().
  template <sampling_policy Policy>
  void verify(draft_tree const& tree, matrix_view<float const> target_logits, Policy const& policy,
              token_history history, philox& rng, verify_result& out) {
    detail::check_inputs(name, tree, target_logits.rows(), target_logits.cols());
    detail::check_history(name, tree, history);
    prepare(tree, target_logits.cols(), out);
    detail::with_paths(policy, history, tree, history_, [&](auto& paths) {
      if (policy.is_greedy()) {
        walk_greedy(tree, target_logits, policy, paths, out);
      } else {
        detail::policy_rows<Policy, std::remove_reference_t<decltype(paths)>> const rows{
            tree, target_logits, policy, paths};
        walk(tree, rows, rng, out);
      }
    });
    rng.skip(tree.size());
  }

  //! The same over target distribution rows `target_probs` ([tree.size(), vocab], row i = the
  //! policy's distribution at node i). Same RNG contract.
  void verify_probs(draft_tree const& tree, matrix_view<float const> target_probs, philox& rng,
                    verify_result& out) {
    detail::check_inputs(name, tree, target_probs.rows(), target_probs.cols());
    prepare(tree, target_probs.cols(), out);
    walk(tree, detail::given_rows{target_probs}, rng, out);
    rng.skip(tree.size());
  }

 private:
  friend class detail::batch_entry_points<typical_acceptance_verifier>;
  static constexpr char const* name = "typical_acceptance_verifier";

  void prepare(draft_tree const& tree, std::size_t vocab, verify_result& out) {
    detail::prepare_result(tree, out);
    if (cur_.size() != vocab) cur_.assign(vocab, 0.0f);
    if (best_.size() != vocab) best_.assign(vocab, 0.0f);
    reached_.assign(tree.size(), 0);
  }

  // Writes the path root -> best (root excluded) into `out.accepted_nodes` and its tokens.
  void emit_path(draft_tree const& tree, node_index best, verify_result& out) const {
    auto const depth = static_cast<std::size_t>(tree.depth(best));
    out.accepted_nodes.resize(depth);
    out.tokens.resize(depth);
    for (node_index a = best; a > 0; a = tree.parent(a)) {
      auto const d = static_cast<std::size_t>(tree.depth(a)) - 1;
      out.accepted_nodes[d] = a;
      out.tokens[d] = tree.token(a);
    }
  }

  template <class Source>
  void walk(draft_tree const& tree, Source const& rows, philox const& rng, verify_result& out) {
    node_index best = 0;
    std::span<float const> best_p;  // p of `best` when already computed
    bool best_has_p = false;
    reached_[0] = 1;
    for (std::size_t i = 0; i < tree.size(); ++i) {
      if (!reached_[i]) continue;
      auto const v = static_cast<node_index>(i);
      bool const deeper = tree.depth(v) > tree.depth(best) || v == 0;
      if (deeper) {
        best = v;
        best_has_p = false;
      }
      if (tree.num_children(v) == 0) continue;
      std::span<float const> const p = rows(v, std::span<float>(cur_));
      double const thr = params_.threshold(detail::entropy(p, name, v));
      for (node_index c = tree.first_child(v); c >= 0; c = tree.next_sibling(c)) {
        token_id const x = tree.token(c);
        float const px = p[static_cast<std::size_t>(x)];
        detail::check_probability(px, name, "the target probability", v, x);
        if (static_cast<double>(px) > thr) reached_[static_cast<std::size_t>(c)] = 1;
      }
      if (best == v) {
        best_p = p;
        best_has_p = true;
        if (p.data() == cur_.data()) std::swap(cur_, best_);  // keeps best_p's storage alive
      }
    }
    if (!best_has_p) best_p = rows(best, std::span<float>(best_));
    emit_path(tree, best, out);
    out.tokens.push_back(detail::draw_from(best_p, rng.uniform_at(0), name, best));
  }

  template <class Policy, class Paths>
  void walk_greedy(draft_tree const& tree, matrix_view<float const> logits, Policy const& policy,
                   Paths& paths, verify_result& out) {
    std::size_t const vocab = logits.cols();
    auto const greedy_at = [&](node_index v) {
      std::span<float const> const row = logits.row(static_cast<std::size_t>(v));
      token_id const g = policy.greedy_token(row, paths.at(tree, v));
      detail::check_policy_token(g, vocab, name, v);
      SPECDEC_CHECK(std::isfinite(row[static_cast<std::size_t>(g)]), numerical, name,
                    ": the target logit of the greedy token ", g, " at node ", v, " is ",
                    row[static_cast<std::size_t>(g)]);
      return g;
    };
    node_index best = 0;
    token_id best_g = no_token;
    reached_[0] = 1;
    for (std::size_t i = 0; i < tree.size(); ++i) {
      if (!reached_[i]) continue;
      auto const v = static_cast<node_index>(i);
      if (tree.depth(v) > tree.depth(best) || v == 0) {
        best = v;
        best_g = no_token;
      }
      if (tree.num_children(v) == 0) continue;
      token_id const g = greedy_at(v);
      for (node_index c = tree.first_child(v); c >= 0; c = tree.next_sibling(c))
        if (tree.token(c) == g) reached_[static_cast<std::size_t>(c)] = 1;
      if (best == v) best_g = g;
    }
    if (best_g == no_token) best_g = greedy_at(best);
    emit_path(tree, best, out);
    out.tokens.push_back(best_g);
  }

  typical_acceptance_params params_{};
  detail::path_history history_;
  std::vector<float> cur_;
  std::vector<float> best_;
  std::vector<char> reached_;
};

}  // namespace specdec
