#pragma once
//! \file
//! `tree_verifier`: lossless verification of multi-candidate draft trees, for deterministic
//! candidates (prompt lookup, REST, lookahead, greedy/top-k drafts) and for children sampled
//! i.i.d. from a draft distribution (SpecInfer, Miao et al. 2024).
//!
//! Semantics. From the root, with p the target distribution at the current node (the policy's
//! `distribution` of its row, the history extended by the path to the node), the children are
//! tried in insertion order:
//! - Deterministic candidates (the tree has no q rows): each child c is a point mass. With m the
//!   mass not yet rejected (1, minus p(c) of every rejected sibling), c is accepted with
//!   probability p(c) / m -- that is, p(c) of the distribution renormalised after setting each
//!   rejected sibling's probability to 0. If every child is rejected, the token is drawn from p
//!   with the rejected children removed (renormalised).
//! - Sampled children (the tree has q rows; q = q_row(node), the distribution the children were
//!   drawn from i.i.d.; duplicate siblings may occur): each child x is accepted with probability
//!   min(1, p(x) / q(x)); on rejection p becomes norm(max(p - q, 0)) (kept as is if that has no
//!   mass) before the next sibling is tried. If every child is rejected, the token is drawn from
//!   norm(max(p - q, 0)) of the last p (from p if that has no mass).
//! When a child is accepted the walk moves to it; at a node without children the bonus token is
//! drawn from p. Both rules are lossless for any number of children. A chain with q rows gives
//! exactly `speculative_sampling_verifier`'s decisions.
//!
//! The acceptance tests, exactly (float arithmetic), with u the uniform of the child's word:
//! point masses: accept iff p(c) > 0 and (p(c) >= m or u * m < p(c)); sampled children: accept iff
//! p(x) > 0 and (p(x) >= q(x) or u * q(x) < p(x)). A drafted token with q(x) = 0 is accepted iff
//! p(x) > 0; nothing divides by zero. Should rounding leave no mass outside the rejected point
//! masses (the children covered p's whole support), the token is the last rejected child with
//! p > 0, which held the remaining mass.
//!
//! RNG contract (shared by every verifier and by the device kernels): for a tree of n nodes the
//! verifier reads word offset() + j, j >= 1, for the acceptance test of node j, and word
//! offset() + 0 for the final draw (residual or bonus; the inverse-CDF rule of verify/common.hpp,
//! `sample_from` semantics); then it advances `rng` by exactly n, whatever the outcome.
//!
//! Cost: only rows on the walked path are processed (one `distribution` each); acceptance tests
//! are gathers; a rejected sampled child costs one residual pass over the vocabulary (a rejected
//! point mass costs nothing); the final draw sums the row once and scans it up to the drawn token.
//! A greedy policy takes the greedy path (one `greedy_token` per walked row), which makes the same
//! decisions as its one-hot distribution.
//!
//! Validation: as `speculative_sampling_verifier` (token ids, shapes and the q vocabulary up
//! front; `verify` validates each q row the walk uses, `verify_probs` checks every value it reads).

#include <cstddef>
#include <cstdint>
#include <span>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/verify/common.hpp"

namespace specdec {

//! Verification of multi-candidate trees (see the file comment for the exact semantics).
//! A verifier owns scratch buffers (sized once, reused): use one per thread.
class tree_verifier {
 public:
  //! Any sampling policy works (greedy ones take the greedy path).
  static constexpr bool greedy_only = false;
  //! Multi-child trees are supported.
  static constexpr bool supports_trees = true;
  //! Uses q rows when the tree has them (point masses otherwise).
  static constexpr bool needs_draft_probs = false;
  //! Output is distributed exactly as plain sampling.
  static constexpr bool lossless = true;

  //! Verifies `tree` against `target_logits` ([tree.size(), vocab], row i = the target's logits
  //! after the path to node i) under `policy`; `history` is every committed token with the root
  //! last. Throws `errc::invalid_argument` when shapes disagree, `errc::out_of_range` for token
  //! ids >= vocab, `errc::numerical` for NaN/Inf or massless rows. On error `rng` is unchanged.
  //! Advances `rng` by tree.size().
  template <sampling_policy Policy>
  void verify(draft_tree const& tree, matrix_view<float const> target_logits, Policy const& policy,
              std::span<token_id const> history, philox& rng, verify_result& out) {
    detail::check_inputs(name, tree, target_logits.rows(), target_logits.cols());
    prepare(tree, target_logits.cols(), out);
    history_.reset(history, static_cast<std::size_t>(tree.max_depth()));
    if (policy.is_greedy()) {
      detail::greedy_walk(name, tree, target_logits, policy, history_, out);
    } else {
      detail::policy_rows<Policy> const rows{tree, target_logits, policy, history_};
      detail::sampling_walk(name, tree, rows, rng, scratch_, out);
    }
    rng.skip(tree.size());
  }

  //! The same over target distribution rows `target_probs` ([tree.size(), vocab], row i = the
  //! policy's distribution at node i). Same RNG contract.
  void verify_probs(draft_tree const& tree, matrix_view<float const> target_probs, philox& rng,
                    verify_result& out) {
    detail::check_inputs(name, tree, target_probs.rows(), target_probs.cols());
    prepare(tree, target_probs.cols(), out);
    detail::sampling_walk(name, tree, detail::given_rows{target_probs}, rng, scratch_, out);
    rng.skip(tree.size());
  }

  //! Ragged batch: sequence b has tree `*trees[b]`, rows [cu_nodes[b], cu_nodes[b + 1]) of
  //! `target_logits` ([num_tokens, vocab], row-major), `histories[b]`, `rngs[b]` and `out[b]`.
  //! Results equal per-sequence `verify` calls. Every shape is checked before any sequence is
  //! verified; an error in sequence b leaves sequences < b done.
  template <sampling_policy Policy>
  void verify_batch(std::span<draft_tree const* const> trees,
                    matrix_view<float const> target_logits, std::span<std::int32_t const> cu_nodes,
                    Policy const& policy, std::span<std::span<token_id const> const> histories,
                    std::span<philox> rngs, std::span<verify_result> out) {
    SPECDEC_CHECK(histories.size() == trees.size(), invalid_argument, name, ": ", histories.size(),
                  " histories for a batch of ", trees.size());
    detail::verify_ragged(
        name, trees.size(), [&](std::size_t b) { return trees[b]; }, target_logits, cu_nodes,
        rngs.size(), out.size(),
        [&](std::size_t b, draft_tree const& t, matrix_view<float const> rows) {
          verify(t, rows, policy, histories[b], rngs[b], out[b]);
        });
  }

  //! Ragged batch over target distribution rows; results equal per-sequence `verify_probs`.
  void verify_probs_batch(std::span<draft_tree const* const> trees,
                          matrix_view<float const> target_probs,
                          std::span<std::int32_t const> cu_nodes, std::span<philox> rngs,
                          std::span<verify_result> out) {
    detail::verify_ragged(
        name, trees.size(), [&](std::size_t b) { return trees[b]; }, target_probs, cu_nodes,
        rngs.size(), out.size(),
        [&](std::size_t b, draft_tree const& t, matrix_view<float const> rows) {
          verify_probs(t, rows, rngs[b], out[b]);
        });
  }

 private:
  static constexpr char const* name = "tree_verifier";

  void prepare(draft_tree const& tree, std::size_t vocab, verify_result& out) {
    out.clear();
    auto const depth = static_cast<std::size_t>(tree.max_depth());
    out.accepted_nodes.reserve(depth);
    out.tokens.reserve(depth + 1);
    scratch_.prepare(vocab, tree.size());
  }

  detail::path_history history_;
  detail::walk_scratch scratch_;
};

}  // namespace specdec
