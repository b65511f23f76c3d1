#pragma once
//! \file
//! `propose_context`: what a proposer sees when it drafts.

#include <cstddef>
#include <exception>
#include <span>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/target_handle.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"

namespace specdec {

//! The state of one sequence at the start of a step, as a proposer sees it.
struct propose_context {
  //! [t] every committed token, prompt included; the last one is the root of the next draft tree
  //! (it is not yet in the target's KV cache).
  std::span<token_id const> tokens;
  //! [rows, hidden_size] the target's final hidden states for the tokens committed by the last
  //! step, in order (the last row is that of the token before the root; at the first step, every
  //! prompt token but the last); empty unless the proposer declares `needs_target_hidden` and the
  //! model provides hidden states. A proposer whose `target_hidden_layers()` names layers gets
  //! their residual streams instead, side by side: [rows, layers x hidden_size].
  matrix_view<float const> target_hidden;
  //! Most draft nodes (root excluded) the decoder will score this step.
  std::size_t max_nodes = 0;
  //! The random stream for proposers that sample their drafts (never null during a decode).
  philox* rng = nullptr;
  //! The target, for proposers that declare `uses_target` (core/target_handle.hpp): forwards of
  //! the draft against this sequence's committed cache, dropped when `propose` returns. Null for
  //! other proposers.
  target_handle const* target = nullptr;
};

//! One request's part of a batched `propose` call (`batch_proposer`): what a single-sequence
//! proposer gets (its context and the tree to fill), keyed by the request's slot.
struct batch_propose_item {
  std::size_t slot = 0;        //!< the request's slot: the key of its state in the proposer
  propose_context ctx;         //!< its committed tokens, node budget and random stream
  draft_tree* tree = nullptr;  //!< where its draft goes (reset to root ctx.tokens.back())
  //! Set by the proposer when drafting failed for this request alone (the others go on).
  std::exception_ptr error = nullptr;
};

namespace detail {

//! Whether `tokens` extends `history`, a proposer's own copy of the sequence: at least as long and
//! equal at the history's last token (the cheap check by which a proposer notices a new or edited
//! sequence and rebuilds its state from it).
[[nodiscard]] inline bool extends_history(std::span<token_id const> history,
                                          std::span<token_id const> tokens) noexcept {
  std::size_t const have = history.size();
  return tokens.size() >= have && (have == 0 || tokens[have - 1] == history[have - 1]);
}

}  // namespace detail

}  // namespace specdec
