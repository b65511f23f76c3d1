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
//! RNG contract: greedy verification reads no Philox word, but like every verifier it advances
//! `rng` by exactly `tree.size()` words, whatever the outcome, so that a decoder's stream stays
//! aligned with the sampling verifiers (and with the device kernels).

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

//! Greedy verification of chains and trees (see the file comment for the exact semantics).
//! A verifier owns scratch buffers (sized once, reused): use one per thread.
class greedy_verifier {
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
              std::span<token_id const> history, philox& rng, verify_result& out) {
    SPECDEC_CHECK(policy.is_greedy(), invalid_argument,
                  "greedy_verifier: the sampling policy is not greedy (use a sampling verifier, "
                  "e.g. speculative_sampling_verifier or tree_verifier)");
    detail::check_inputs(name, tree, target_logits.rows(), target_logits.cols());
    prepare(tree, out);
    history_.reset(history, static_cast<std::size_t>(tree.max_depth()));
    detail::greedy_walk(name, tree, target_logits, policy, history_, out);
    rng.skip(tree.size());
  }

  //! Greedy verification over target distribution rows (`target_probs`, [tree.size(), vocab]):
  //! the target token of a row is its argmax (ties to the lowest id). Same contract as `verify`.
  void verify_probs(draft_tree const& tree, matrix_view<float const> target_probs, philox& rng,
                    verify_result& out) {
    detail::check_inputs(name, tree, target_probs.rows(), target_probs.cols());
    prepare(tree, out);
    detail::greedy_walk_probs(name, tree, target_probs, out);
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
  static constexpr char const* name = "greedy_verifier";

  static void prepare(draft_tree const& tree, verify_result& out) {
    out.clear();
    auto const depth = static_cast<std::size_t>(tree.max_depth());
    out.accepted_nodes.reserve(depth);
    out.tokens.reserve(depth + 1);
  }

  detail::path_history history_;
};

}  // namespace specdec
