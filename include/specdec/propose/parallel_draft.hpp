#pragma once
//! \file
//! `parallel_draft_proposer`: parallel drafting with a target-independent draft model (PARD,
//! arXiv 2504.18583). The draft is an ordinary causal language model of the target's vocabulary
//! trained to fill in mask tokens: fed the root followed by k - 1 mask tokens, the root's row
//! predicts the next token and mask j's row the token j places further, so ONE draft forward
//! gives a chain of k drafts where a chain drafter runs k.
//!
//! Draft cache. As `draft_model_proposer`'s (propose/chain_drafter.hpp's `chain_sequence`): it
//! holds a prefix of the committed tokens; each step feeds the committed tokens it lacks (at least
//! the root) and the k - 1 masks in one forward, with logits for the last k rows, then drops the
//! masks from the cache, so it holds committed tokens only and `accept` has nothing to roll back.
//! A history that does not continue the cache cuts it back to the common prefix.
//!
//! Modes (`draft_mode`): greedy candidates (each row's greedy token under the policy), or drafts
//! drawn from each row's distribution under the policy with the request's Philox stream, recorded
//! as the chain's q rows for the speculative sampling verifier. A row's distribution does not
//! depend on the other drafts (they are masks to the draft), so q_i is exactly what draft i was
//! drawn from: lossless. The mask id must be one the text never uses (the draft is trained to
//! read it as a mask; tools/draft/pard uses tok512's <unk>).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/propose/chain_drafter.hpp"

namespace specdec {

//! Options of a `parallel_draft_proposer`.
struct parallel_draft_config {
  std::size_t k = 4;        //!< drafts per step: the root's row and k - 1 mask rows, >= 1
  token_id mask_token = 0;  //!< the draft's mask id (in the vocabulary, unused by the text)

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    SPECDEC_CHECK(k >= 1 && k < max_tree_nodes, invalid_argument, "parallel_draft_config: k = ", k,
                  " is outside [1, ", max_tree_nodes - 1, "]");
    SPECDEC_CHECK(mask_token >= 0, invalid_argument, "parallel_draft_config: mask_token ",
                  mask_token, " is negative");
  }
};

//! Drafts a chain of k tokens per step in one forward of a mask-trained draft model (see the
//! file comment).
//!
//! \tparam DraftModel a `causal_lm` of the target's vocabulary; held by reference, its cache
//!                    belongs to this proposer.
//! \tparam Policy     a `sampling_policy` for the draft rows (normally the target's); owned.
//! \tparam Mode       greedy candidates or sampled drafts with q rows.
template <causal_lm DraftModel, sampling_policy Policy, draft_mode Mode = draft_mode::greedy>
class parallel_draft_proposer {
  static constexpr char const* who = "parallel_draft_proposer";

 public:
  static constexpr bool produces_trees = false;                       //!< always a chain
  static constexpr bool samples_drafts = Mode == draft_mode::sample;  //!< q rows when sampling
  static constexpr bool needs_target_hidden = false;                  //!< tokens only

  //! A proposer drafting with `draft` (which must outlive it) for a target of `target_vocab`
  //! tokens. Throws `errc::invalid_argument` for a bad config, a draft of another vocabulary or a
  //! mask id outside it.
  parallel_draft_proposer(DraftModel& draft, std::size_t target_vocab, Policy policy,
                          parallel_draft_config config)
      : draft_(&draft), policy_(std::move(policy)), config_(config) {
    config_.validate();
    SPECDEC_CHECK(draft.vocab_size() == target_vocab, invalid_argument, who, ": a draft of ",
                  draft.vocab_size(), " tokens for a target of ", target_vocab,
                  " (the mask id is a token of the shared vocabulary)");
    SPECDEC_CHECK(static_cast<std::size_t>(config_.mask_token) < target_vocab, invalid_argument,
                  who, ": mask token ", config_.mask_token, " is outside the vocabulary of ",
                  target_vocab);
  }

  //! Starts a sequence: empties the draft cache (the prompt is fed at the first `propose`).
  void begin(std::span<token_id const> prompt) {
    if constexpr (!std::is_reference_v<decltype(policy_for_prompt(policy_, prompt.size()))>)
      policy_ = policy_for_prompt(policy_, prompt.size());
    draft_->cache().truncate(0);
    seq_.begin(std::min<std::size_t>(draft_->max_context(), prompt.size() + 4096));
  }

  //! Drafts a chain of at most min(k, ctx.max_nodes) tokens under ctx.tokens.back() in one draft
  //! forward. Throws `errc::invalid_argument` / `errc::out_of_range` for tokens outside the
  //! vocabulary, `errc::numerical` for a draft row without mass.
  void propose(propose_context const& ctx, draft_tree& tree) {
    if (!ctx.tokens.empty()) seq_.sync(draft_->cache(), ctx.tokens);
    std::size_t const capacity =
        std::min<std::size_t>(draft_->max_context(), draft_->cache().capacity());
    std::size_t const vocab = draft_->vocab_size();
    std::span<token_id const> const first = seq_.start(ctx, tree, config_.k, capacity, vocab, who);
    if (first.empty()) return;
    // The chain's length, as `start` set it: k, the budget, the tree's room, and the positions
    // the masks need (the root at t - 1, its masks up to t + k - 2).
    std::size_t const t = ctx.tokens.size();
    std::size_t const k = std::min(
        {config_.k, ctx.max_nodes, tree.capacity() - 1, capacity + 1 - std::min(capacity + 1, t)});
    std::size_t const start = seq_.cached().size();
    tokens_.assign(first.begin(), first.end());
    tokens_.insert(tokens_.end(), k - 1, config_.mask_token);
    positions_.resize(tokens_.size());
    rows_.resize(k);
    for (std::size_t i = 0; i < tokens_.size(); ++i)
      positions_[i] = static_cast<position_t>(start + i);
    for (std::size_t j = 0; j < k; ++j) rows_[j] = static_cast<std::int32_t>(first.size() - 1 + j);
    forward_request const req{.tokens = tokens_, .positions = positions_, .logits_rows = rows_};
    draft_->forward(req, fwd_);
    seq_.fed(first);
    draft_->cache().truncate(seq_.cached().size());  // the masks leave the cache
    for (std::size_t j = 0; j < k; ++j)
      if (!seq_.draw(fwd_.logits_view().at_row(j), policy_, 0.0f, ctx, tree, vocab, who)) break;
  }

  //! Nothing to roll back: the draft cache holds committed tokens only.
  void accept(verify_result const& result) { seq_.accept(draft_->cache(), result); }

  //! Drafts per step (before the step's budget).
  [[nodiscard]] std::size_t max_nodes() const noexcept { return config_.k; }
  //! The configuration.
  [[nodiscard]] parallel_draft_config const& config() const noexcept { return config_; }
  //! Number of positions in the draft cache.
  [[nodiscard]] std::size_t cached() const noexcept { return seq_.cached().size(); }

 private:
  DraftModel* draft_;
  Policy policy_;
  parallel_draft_config config_;
  detail::chain_sequence<Mode> seq_;
  std::vector<token_id> tokens_;
  std::vector<position_t> positions_;
  std::vector<std::int32_t> rows_;
  forward_result fwd_;
};

}  // namespace specdec
