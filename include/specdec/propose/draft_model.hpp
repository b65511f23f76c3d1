#pragma once
//! \file
//! `draft_model_proposer`: a smaller causal language model drafts a chain of k tokens, one forward
//! per token, and rolls its KV cache back to what the target accepted.
//!
//! Draft cache. The draft model has its own cache holding a prefix of the committed tokens plus the
//! drafted tokens it has been fed. `propose` first feeds every committed token the cache lacks (the
//! whole prompt on the first step; the bonus token -- and after a full acceptance also the last
//! draft token, which was drafted but never fed -- on later steps) in one batched forward, then
//! drafts d_1..d_k feeding d_1..d_{k-1} one at a time. `accept` truncates the cache to the
//! committed tokens plus the accepted drafts, which covers every case: partial acceptance (the
//! rejected drafts go), full acceptance (d_k was never in the cache, it is fed with the bonus at
//! the next step) and the bonus token (fed at the next step). If the committed tokens ever
//! disagree with the cache (a new sequence without `begin`, a caller that edited its history), the
//! cache is cut back to the longest common prefix and refilled, so the draft never conditions on
//! stale tokens.
//!
//! The modes (greedy candidates, or sampled drafts with q rows) and the options (a confidence
//! cutoff, an adaptive draft length) are those of propose/chain_drafter.hpp.
//!
//! `batched_draft_model_proposer` (below) drafts for a whole batch of requests (`batch_decoder`)
//! with one draft model that scores them all in each forward (a `batched_lm`).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/core/batch_forward.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/propose/chain_drafter.hpp"
#include "specdec/sampling/draw.hpp"

namespace specdec {

//! Drafts chains with a separate (smaller) causal language model of the same vocabulary.
//!
//! \tparam DraftModel a `causal_lm`; held by reference, its cache belongs to this proposer.
//! \tparam Policy     a `sampling_policy` for the draft rows (normally the target's policy, so that
//!                    q is in the same processed space as p); owned.
//! \tparam Mode       greedy candidates or sampled drafts with q rows (see the file comment).
template <causal_lm DraftModel, sampling_policy Policy, draft_mode Mode = draft_mode::greedy>
class draft_model_proposer {
 public:
  static constexpr bool produces_trees = false;                       //!< always a chain
  static constexpr bool samples_drafts = Mode == draft_mode::sample;  //!< q rows when sampling
  static constexpr bool needs_target_hidden = false;  //!< the draft runs on tokens only

  //! A proposer drafting with `draft` (which must outlive it) for a target of `target_vocab`
  //! tokens. Throws `errc::invalid_argument` when the vocabularies differ or `config` is invalid.
  draft_model_proposer(DraftModel& draft, std::size_t target_vocab, Policy policy,
                       draft_model_config config = {})
      : draft_(&draft), drafter_(config, std::move(policy), {}) {
    SPECDEC_CHECK(draft.vocab_size() == target_vocab, invalid_argument,
                  "draft_model_proposer: the draft model's vocabulary (", draft.vocab_size(),
                  " tokens) differs from the target's (", target_vocab, " tokens)");
  }

  //! As above, reading the vocabulary size from the target model.
  template <causal_lm Target>
  draft_model_proposer(DraftModel& draft, Target const& target, Policy policy,
                       draft_model_config config = {})
      : draft_model_proposer(draft, static_cast<std::size_t>(target.vocab_size()),
                             std::move(policy), config) {}

  //! Starts a sequence (see `proposer`).
  void begin(std::span<token_id const> prompt) { drafter_.begin(*draft_, prompt); }
  //! Drafts a chain of at most min(k, ctx.max_nodes) tokens under ctx.tokens.back().
  void propose(propose_context const& ctx, draft_tree& tree) {
    drafter_.propose(*draft_, ctx, tree);
  }
  //! Rolls the draft cache back to the accepted tokens and adapts k.
  void accept(verify_result const& result) { drafter_.accept(*draft_, result); }

  //! The draft length of the next step (before the context and max_nodes limits).
  [[nodiscard]] std::size_t current_k() const noexcept { return drafter_.current_k(); }
  //! The node budget: the most draft nodes (root excluded) one `propose` can draft under this
  //! configuration, the longest chain (k_max when adaptive, else k). The decoder scores at most
  //! this many nodes per step.
  [[nodiscard]] std::size_t max_nodes() const noexcept { return drafter_.max_nodes(); }
  //! Positions held in the draft model's cache.
  [[nodiscard]] std::size_t cached_positions() const noexcept { return drafter_.cached(); }
  //! [vocab] the draft's logits after the last token it was fed.
  [[nodiscard]] std::span<float const> last_logits() const { return drafter_.last_logits(); }
  //! The draft model.
  [[nodiscard]] DraftModel& draft() const noexcept { return *draft_; }
  //! The configuration (validated).
  [[nodiscard]] draft_model_config const& config() const noexcept { return drafter_.config(); }

 private:
  DraftModel* draft_;
  detail::chain_drafter<DraftModel, Policy, Mode> drafter_;
};

}  // namespace specdec

namespace specdec {

//! Drafts chains for every request of a batch with ONE draft model that scores all of them
//! together (`batch_proposer`, for `batch_decoder`): the draft's weights are read once per draft
//! position for the whole batch, as the target's are once per step.
//!
//! Each request holds a slot of the draft model (a `batched_lm`), acquired by `begin` and
//! released by `end`, with the draft cache of `draft_model_proposer`: `propose` feeds every
//! committed token a request's cache lacks (all requests in one forward), then drafts d_1..d_k
//! feeding d_1..d_{k-1}, one forward per draft position over the requests still drafting;
//! `accept` truncates the request's cache to its committed tokens plus its accepted drafts. A
//! request's draft rows are the same bits as alone, so its drafts -- and in `draft_mode::sample`
//! the words it reads from its own Philox stream, one per draft token -- are those
//! `draft_model_proposer` draws for it alone. Each request drafts min(k, its ctx.max_nodes)
//! tokens (the batch's speculation policy sets max_nodes; `draft_model_config::adaptive` is
//! refused: the policy decides), stopping early at the confidence cutoff. One policy serves every
//! request's draft rows (with sampled drafts any q is lossless; matching each request's own
//! policy raises acceptance).
//! \tparam DraftModel a `batched_lm`; held by reference, its slots belong to this proposer.
//! \tparam Policy     a `sampling_policy` for the draft rows; owned.
//! \tparam Mode       greedy candidates or sampled drafts with q rows.
template <batched_lm DraftModel, sampling_policy Policy, draft_mode Mode = draft_mode::greedy>
class batched_draft_model_proposer {
 public:
  static constexpr bool produces_trees = false;                       //!< always a chain
  static constexpr bool samples_drafts = Mode == draft_mode::sample;  //!< q rows when sampling

  //! A proposer drafting with `draft` (which must outlive it) for a target of `target_vocab`
  //! tokens. Throws `errc::invalid_argument` when the vocabularies differ, `config` is invalid or
  //! adaptive.
  batched_draft_model_proposer(DraftModel& draft, std::size_t target_vocab, Policy policy,
                               draft_model_config config = {})
      : draft_(&draft), policy_(std::move(policy)), config_(config) {
    config_.validate();
    SPECDEC_CHECK(!config_.adaptive, invalid_argument,
                  "batched_draft_model_proposer: adaptive k is the batch's speculation policy's "
                  "to decide (draft_model_config::adaptive must be false)");
    SPECDEC_CHECK(draft.vocab_size() == target_vocab, invalid_argument,
                  "batched_draft_model_proposer: the draft model's vocabulary (",
                  draft.vocab_size(), " tokens) differs from the target's (", target_vocab,
                  " tokens)");
  }

  //! Starts the request in `slot`: acquires a draft slot for it (throws what the draft model's
  //! `acquire_slot` throws when none is free: the request fails alone).
  void begin(std::size_t slot, std::span<token_id const> prompt) {
    if (slot >= requests_.size()) requests_.resize(slot + 1);
    request& r = requests_[slot];
    if (r.active) end(slot);
    r.draft_slot = draft_->acquire_slot();
    r.active = true;
    r.seq.begin(std::min<std::size_t>(draft_->max_context(), prompt.size() + 4096));
  }

  //! Drafts a chain for every item (see the class comment); a failure of one request (a token
  //! outside the draft's vocabulary, a draft row without mass) is its item's error.
  void propose(std::span<batch_propose_item> items) {
    std::size_t const vocab = draft_->vocab_size();
    active_.clear();
    for (std::size_t i = 0; i < items.size(); ++i) {
      batch_propose_item& item = items[i];
      try {
        request& r = at(item.slot);
        auto& cache = draft_->cache(r.draft_slot);
        if (!item.ctx.tokens.empty()) r.seq.sync(cache, item.ctx.tokens);
        std::size_t const capacity = std::min<std::size_t>(draft_->max_context(), cache.capacity());
        r.feed = r.seq.start(item.ctx, *item.tree, config_.k, capacity, vocab, who);
        if (!r.feed.empty()) active_.push_back(i);
      } catch (...) {
        item.error = std::current_exception();
      }
    }
    // Draft position by position: feed (all active requests in one forward), then draw.
    while (!active_.empty()) {
      forward(items);
      next_.clear();
      for (std::size_t s = 0; s < active_.size(); ++s) {
        batch_propose_item& item = items[active_[s]];
        request& r = requests_[item.slot];
        try {
          if (r.seq.draw(out_.logits(s).at_row(0), policy_, config_.confidence_threshold, item.ctx,
                         *item.tree, vocab, who)) {
            r.feed = std::span<token_id const>(&r.seq.next(), 1);
            next_.push_back(active_[s]);
          }
        } catch (...) {
          item.error = std::current_exception();
        }
      }
      std::swap(active_, next_);
    }
  }

  //! Rolls the request's draft cache back to its committed tokens plus its accepted drafts.
  void accept(std::size_t slot, verify_result const& result) {
    request& r = at(slot);
    r.seq.accept(draft_->cache(r.draft_slot), result);
  }

  //! The request in `slot` left: its draft slot is released.
  void end(std::size_t slot) {
    if (slot >= requests_.size() || !requests_[slot].active) return;
    request& r = requests_[slot];
    r.active = false;
    r.seq.begin(0);
    draft_->release_slot(r.draft_slot);
  }

  //! The node budget: the longest chain, k.
  [[nodiscard]] std::size_t max_nodes() const noexcept { return config_.k; }
  //! The draft model.
  [[nodiscard]] DraftModel& draft() const noexcept { return *draft_; }
  //! The configuration (validated).
  [[nodiscard]] draft_model_config const& config() const noexcept { return config_; }
  //! Positions held in the draft cache of the request in `slot`.
  [[nodiscard]] std::size_t cached_positions(std::size_t slot) const {
    SPECDEC_CHECK(slot < requests_.size() && requests_[slot].active, invalid_argument,
                  "batched_draft_model_proposer: no request in slot ", slot);
    return requests_[slot].seq.cached().size();
  }

 private:
  static constexpr char const* who = "batched_draft_model_proposer";

  struct request {
    bool active = false;
    std::size_t draft_slot = 0;
    detail::chain_sequence<Mode> seq;   // its draft cache and its chain
    std::span<token_id const> feed;     // what the next forward feeds
    std::vector<position_t> positions;  // of `feed`
  };

  request& at(std::size_t slot) {
    SPECDEC_CHECK(slot < requests_.size() && requests_[slot].active, invalid_argument,
                  "batched_draft_model_proposer: no request in slot ", slot);
    return requests_[slot];
  }

  //! One draft forward: every active request's `feed` at the positions after its cache, logits
  //! of the last row each; the fed tokens join the caches.
  void forward(std::span<batch_propose_item const> items) {
    std::size_t longest = 1;
    for (std::size_t const i : active_)
      longest = std::max(longest, requests_[items[i].slot].feed.size());
    if (last_rows_.size() < longest) {
      last_rows_.resize(longest);
      for (std::size_t j = 0; j < longest; ++j) last_rows_[j] = static_cast<std::int32_t>(j);
    }
    segments_.clear();
    for (std::size_t const i : active_) {
      request& r = requests_[items[i].slot];
      std::size_t const start = r.seq.cached().size();
      r.positions.resize(r.feed.size());
      for (std::size_t j = 0; j < r.feed.size(); ++j)
        r.positions[j] = static_cast<position_t>(start + j);
      segments_.push_back({.slot = r.draft_slot,
                           .request = {.tokens = r.feed,
                                       .positions = r.positions,
                                       .logits_rows = std::span<std::int32_t const>(last_rows_)
                                                          .subspan(r.feed.size() - 1, 1)}});
    }
    draft_->forward({.segments = segments_}, out_);
    for (std::size_t const i : active_) {
      request& r = requests_[items[i].slot];
      r.seq.fed(r.feed);
    }
  }

  DraftModel* draft_;
  Policy policy_;
  draft_model_config config_;
  std::vector<request> requests_;           // [slot]
  std::vector<std::size_t> active_, next_;  // items still drafting
  std::vector<batch_segment> segments_;
  std::vector<std::int32_t> last_rows_;  // 0, 1, 2, ...: a segment's last row is one of them
  batch_forward_result out_;
};

}  // namespace specdec
