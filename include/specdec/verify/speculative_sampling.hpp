#pragma once
//! \file
//! `speculative_sampling_verifier`: lossless verification of a drafted chain (Leviathan et al.
//! 2023; Chen et al. 2023).
//!
//! Semantics. The draft is a chain root, d_1, ..., d_k. Let p_i be the target distribution at
//! node i (the policy's `distribution` of row i, the history extended by d_1..d_i) and q_i the
//! tree's q row i, the distribution d_{i+1} was drawn from. For i = 1..k in order, d_i is accepted
//! with probability min(1, p_{i-1}(d_i) / q_{i-1}(d_i)); on the first rejection the token is drawn
//! from norm(max(p_{i-1} - q_{i-1}, 0)) -- from p_{i-1} itself if that residual has no mass -- and
//! the walk stops; if all k are accepted the bonus token is drawn from p_k. The emitted tokens are
//! distributed exactly as plain sampling from the policy.
//!
//! The acceptance test, exactly (float arithmetic): with p = p_{i-1}(d_i), q = q_{i-1}(d_i) and u
//! the uniform of word offset() + i, d_i is accepted iff p > 0 and (p >= q or u * q < p). No
//! division: a drafted token with q = 0 (the draft claims it could not have drawn it) is accepted
//! iff p > 0 -- the limit of p/q -- and rejected when p = 0; either way nothing divides by zero
//! and the residual stays well defined.
//!
//! A chain without q rows is verified as point masses (q_{i-1} = one-hot at d_i, the rule for
//! deterministic candidates): d_i is accepted iff p > 0 and (p >= 1 or u < p), and on rejection
//! the token is drawn from p_{i-1} with d_i removed.
//!
//! RNG contract: that of every verifier (verify/detail/walk.hpp). The test of d_i reads word
//! offset() + i; the final draw (residual or bonus) reads word offset() + 0 and follows the draw
//! rule stated there.
//!
//! Cost: only rows on the walked path are processed (one `distribution` each); acceptance tests
//! are gathers; only the first rejected row gets the residual pass (a sum over the vocabulary,
//! then a scan that stops at the drawn token). A greedy policy (`is_greedy()`) takes the greedy
//! path: one `greedy_token` per walked row, the same decisions as its one-hot distribution.
//!
//! Validation: token ids < vocab, one target row per node and the q vocabulary are checked up
//! front; `verify` checks each q row the walk uses as `draft_tree::validate` would (finite, >= 0,
//! sums to 1 within 1e-3) -- not the q rows of nodes the walk never reaches, which would cost a
//! pass over the vocabulary per node -- and NaN/Inf logits are reported by the policy or by the
//! checks on every value read. `verify_probs` trusts that given rows are distributions: it checks
//! every value it reads (gathered probabilities, NaN/Inf in any row it passes over) but does not
//! re-read whole q rows. Errors are `specdec::error`, never undefined behaviour.

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

//! Speculative sampling over a drafted chain (see the file comment for the exact semantics).
//! The ragged batched entry points `verify_batch` / `verify_probs_batch` are those of
//! `detail::batch_entry_points`. A verifier owns scratch buffers (sized once, reused): use one per
//! thread.
class speculative_sampling_verifier
    : public detail::batch_entry_points<speculative_sampling_verifier> {
 public:
  //! Any sampling policy works (greedy ones take the greedy path).
  static constexpr bool greedy_only = false;
  //! Chains only; multi-child trees go to `tree_verifier`.
  static constexpr bool supports_trees = false;
  //! Uses q rows when the tree has them, and verifies point masses otherwise (lossless for any
  //! way of choosing the candidates), so q rows are not required.
  static constexpr bool needs_draft_probs = false;
  //! Output is distributed exactly as plain sampling.
  static constexpr bool lossless = true;

  //! Verifies the chain `tree` against `target_logits` ([tree.size(), vocab], row i = the
  //! target's logits after the path to node i) under `policy`; `history` is every committed
  //! token with the root last. Throws `errc::invalid_argument` when the tree is not a chain or
  //! shapes disagree, `errc::out_of_range` for token ids >= vocab, `errc::numerical` for NaN/Inf or
  //! massless rows. On error `rng` is unchanged. Advances `rng` by tree.size().
  template <sampling_policy Policy>
  void verify(draft_tree const& tree, matrix_view<float const> target_logits, Policy const& policy,
              token_history history, philox& rng, verify_result& out) {
    check_chain(tree);
    core_.verify(name, tree, target_logits, policy, history, rng, out);
  }

  //! The same over target distribution rows `target_probs` ([tree.size(), vocab], row i = p_i,
  //! already processed by the policy, e.g. by an engine's fused softmax). Same RNG contract.
  void verify_probs(draft_tree const& tree, matrix_view<float const> target_probs, philox& rng,
                    verify_result& out) {
    check_chain(tree);
    core_.verify_probs(name, tree, target_probs, rng, out);
  }

 private:
  friend class detail::batch_entry_points<speculative_sampling_verifier>;
  static constexpr char const* name = "speculative_sampling_verifier";

  static void check_chain(draft_tree const& tree) {
    SPECDEC_CHECK(tree.empty() || tree.is_chain(), invalid_argument, name,
                  ": the draft is not a chain (", tree.size(), " nodes, depth ", tree.max_depth(),
                  "); use tree_verifier for multi-child trees");
  }

  detail::sampling_verifier_core core_;
};

}  // namespace specdec
