#pragma once
//! \file
//! `greedy_verifier`: lossless verification for greedy decoding, on chains and trees.
//!
//! Semantics: from the root, the accepted child of a node is its child whose token equals the
//! target's greedy token for that node's row (`policy.greedy_token(row, history + path)`); the walk
//! stops at the first node where no child matches, and the bonus token is that node's greedy
//! token. The output is token-identical to plain greedy decoding. In a tree without q rows
//! siblings are distinct, so at most one child matches; in a tree with q rows duplicate siblings
//! may match together and the first in insertion order is taken.
//!
//! Cost: one `greedy_token` call per walked row (each row read once); nothing is written per row;
//! rows off the walked path are never read.
//!
//! RNG contract: that of every verifier (verify/detail/walk.hpp). Greedy verification reads no
//! word, but still advances `rng` by exactly tree.size() words, whatever the outcome.

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
#include "specdec/verify/detail/checks.hpp"
#include "specdec/verify/detail/walk.hpp"

namespace specdec {

//! Greedy verification of chains and trees (see the file comment for the exact semantics).
//! The ragged batched entry points `verify_batch` / `verify_probs_batch` are those of
//! `detail::batch_entry_points`. A verifier owns scratch buffers (sized once, reused): use one per
//! thread.
class greedy_verifier : public detail::batch_entry_points<greedy_verifier> {
 public:
  //! Only greedy policies are accepted (`policy.is_greedy()`).
  static constexpr bool greedy_only = true;
  //! Multi-child trees are supported.
  static constexpr bool supports_trees = true;
  //! q rows are not needed (and are ignored when present).
  static constexpr bool needs_draft_probs = false;
  //! Output equals plain greedy decoding.
  static constexpr bool lossless = true;

  //! Verifies `tree` against `target_logits` ([tree.size(), vocab], row i = the target's logits
  //! after the path to node i) and writes the accepted nodes, their tokens and the bonus to `out`.
  //! `history` is every committed token with the root last. Throws `errc::invalid_argument` when
  //! the policy is not greedy or the shapes disagree, `errc::out_of_range` for token ids >= vocab,
  //! `errc::numerical` for a non-finite logit at the greedy token (and whatever the policy throws
  //! for NaN/Inf rows; `sampler` and `greedy` throw `errc::numerical`). q rows are not read. On
  //! error `rng` is unchanged. Advances `rng` by tree.size().
  template <sampling_policy Policy>
  void verify(draft_tree const& tree, matrix_view<float const> target_logits, Policy const& policy,
              token_history history, philox& rng, verify_result& out) {
    SPECDEC_CHECK(policy.is_greedy(), invalid_argument,
                  "greedy_verifier: the sampling policy is not greedy (use a sampling verifier, "
                  "e.g. speculative_sampling_verifier or tree_verifier)");
    detail::check_inputs(name, tree, target_logits.rows(), target_logits.cols());
    detail::check_history(name, tree, history);
    detail::prepare_result(tree, out);
    detail::with_paths(policy, history, tree, history_, [&](auto& paths) {
      detail::greedy_walk(name, tree, target_logits, policy, paths, out);
    });
    rng.skip(tree.size());
  }

  //! Greedy verification over target distribution rows (`target_probs`, [tree.size(), vocab]):
  //! the target token of a row is its argmax (ties to the lowest id). Same contract as `verify`.
  void verify_probs(draft_tree const& tree, matrix_view<float const> target_probs, philox& rng,
                    verify_result& out) {
    detail::check_inputs(name, tree, target_probs.rows(), target_probs.cols());
    detail::prepare_result(tree, out);
    detail::greedy_walk_probs(name, tree, target_probs, out);
    rng.skip(tree.size());
  }

 private:
  friend class detail::batch_entry_points<greedy_verifier>;
  static constexpr char const* name = "greedy_verifier";

  detail::path_history history_;
};

}  // namespace specdec
