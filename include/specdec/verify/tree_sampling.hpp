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
//! RNG contract: that of every verifier (verify/detail/walk.hpp). The test of node j (sampled child
//! or point mass) reads word offset() + j; the final draw (residual or bonus) reads word offset() +
//! 0 and follows the draw rule stated there.
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
#include <span>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/verify/detail/batch.hpp"
#include "specdec/verify/detail/walk.hpp"

namespace specdec {

//! Verification of multi-candidate trees (see the file comment for the exact semantics).
//! The ragged batched entry points `verify_batch` / `verify_probs_batch` are those of
//! `detail::batch_entry_points`. A verifier owns scratch buffers (sized once, reused): use one per
//! thread.
class tree_verifier : public detail::batch_entry_points<tree_verifier> {
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
              token_history history, philox& rng, verify_result& out) {
    core_.verify(name, tree, target_logits, policy, history, rng, out);
  }

  //! The same over target distribution rows `target_probs` ([tree.size(), vocab], row i = the
  //! policy's distribution at node i). Same RNG contract.
  void verify_probs(draft_tree const& tree, matrix_view<float const> target_probs, philox& rng,
                    verify_result& out) {
    core_.verify_probs(name, tree, target_probs, rng, out);
  }

 private:
  friend class detail::batch_entry_points<tree_verifier>;
  static constexpr char const* name = "tree_verifier";

  detail::sampling_verifier_core core_;
};

}  // namespace specdec
