#pragma once
//! \file
//! `jacobi_proposer`: Jacobi decoding (Santilli et al. 2023, "Accelerating Transformer Inference
//! for Translation via Parallel Decoding"), the baseline lookahead decoding improves on. A block of
//! k guessed tokens is drafted as a chain and verified greedily (the longest prefix matching the
//! target's argmax is accepted, plus the target's next token); the target's predictions at the
//! positions that were not accepted become the next step's guesses, so the block iterates towards
//! the fixed point of y_i = argmax p(. | x, y_1..y_{i-1}), which is exactly greedy decoding.
//!
//! How the rows reach the proposer: it is an `auxiliary_proposer` that adds no auxiliary token and
//! reads, in `observe`, the target's rows of its own chain. Row i of a chain of k guesses is the
//! target's prediction for the position after root, g_1..g_i; with m guesses accepted, the bonus is
//! row m's argmax and rows m+1..k predict the k - m positions after it: they are the new guesses
//! g'_1..g'_{k-m}. The m positions left at the end of the block are filled with the last
//! prediction (with every guess accepted, with the bonus token) -- Jacobi's usual padding. The
//! first block after `begin` repeats the last prompt token.
//!
//! Greedy only in spirit: predictions are raw argmaxes (lowest id on ties); the drafts are
//! deterministic candidates, so a sampling verifier stays lossless, but the guesses track greedy
//! decoding. Pair with `greedy_verifier`.

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "specdec/core/auxiliary_batch.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/sampling/draw.hpp"

namespace specdec {

//! Configuration of `jacobi_proposer`.
struct jacobi_config {
  std::size_t block = 8;  //!< k: guesses per step (chain length), in [1, max_tree_nodes - 1]

  //! Throws `errc::invalid_argument` when `block` is out of its domain.
  void validate() const {
    SPECDEC_CHECK(block >= 1 && block < max_tree_nodes, invalid_argument,
                  "jacobi_config: block = ", block, " is outside [1, ", max_tree_nodes - 1, "]");
  }
};

//! Jacobi decoding (see the file comment): a chain of k guesses refined by the target's own
//! predictions at every step.
class jacobi_proposer {
 public:
  static constexpr bool produces_trees = false;       //!< a chain
  static constexpr bool samples_drafts = false;       //!< deterministic candidates
  static constexpr bool needs_target_hidden = false;  //!< only logits
  //! Reads the target's rows of its chain in `observe` (adds no auxiliary token).
  static constexpr bool has_auxiliary_tokens = true;

  //! A proposer with `config` (validated: `errc::invalid_argument`).
  explicit jacobi_proposer(jacobi_config config = {}) : config_(config) {
    config_.validate();
    guesses_.assign(config_.block, 0);
    next_.assign(config_.block, 0);
  }

  //! Starts a sequence: the first block repeats the last prompt token.
  void begin(std::span<token_id const> prompt) {
    std::fill(guesses_.begin(), guesses_.end(), prompt.empty() ? 0 : prompt.back());
    drafted_ = 0;
  }

  //! Drafts the current guesses as a chain of min(k, ctx.max_nodes, capacity - 1) tokens.
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument,
                  "jacobi_proposer: propose with no committed tokens");
    tree.reset(ctx.tokens.back());
    if (tree.has_q()) tree.enable_q(0);
    drafted_ = std::min({config_.block, ctx.max_nodes, tree.capacity() - 1});
    node_index at = 0;
    for (std::size_t i = 0; i < drafted_; ++i) at = tree.add_node(at, guesses_[i]);
  }

  //! No auxiliary tokens: Jacobi needs only its chain's rows.
  void auxiliary(propose_context const&, draft_tree const&, auxiliary_batch&) noexcept {}

  //! The next guesses: the predictions of the chain's rows after the accepted prefix.
  void observe(matrix_view<float const> tree_logits, matrix_view<float const>,
               verify_result const& result) {
    std::size_t const rows = tree_logits.rows();
    SPECDEC_CHECK(rows == drafted_ + 1, internal, "jacobi_proposer: observe got ", rows,
                  " rows for a chain of ", drafted_);
    std::size_t const m = result.num_accepted();
    std::size_t k = 0;
    for (std::size_t r = m + 1; r < rows && k < config_.block; ++r, ++k)
      next_[k] = detail::argmax_token(tree_logits.row(r));
    token_id const pad = k > 0 ? next_[k - 1] : result.bonus();
    for (; k < config_.block; ++k) next_[k] = pad < 0 ? 0 : pad;
    guesses_.swap(next_);
  }

  //! Nothing else: the guesses were refreshed in `observe`.
  void accept(verify_result const&) noexcept {}

  //! The node budget: the most draft nodes (root excluded) one `propose` can draft under this
  //! configuration, the block length k. The decoder scores at most this many nodes per step.
  [[nodiscard]] std::size_t max_nodes() const noexcept { return config_.block; }
  //! The configuration (validated).
  [[nodiscard]] jacobi_config const& config() const noexcept { return config_; }
  //! The guesses the next `propose` drafts, [k].
  [[nodiscard]] std::span<token_id const> guesses() const noexcept { return guesses_; }

 private:
  jacobi_config config_;
  std::vector<token_id> guesses_;  //!< [k] the current block
  std::vector<token_id> next_;     //!< [k] scratch
  std::size_t drafted_ = 0;        //!< guesses drafted by the last propose
};

}  // namespace specdec
