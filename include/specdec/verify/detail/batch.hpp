#pragma once
//! \file
//! The ragged batched entry points of every verifier (`batch_entry_points`), written once over
//! the verifiers' single-sequence calls. Internals, not API.

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

namespace specdec::detail {

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
