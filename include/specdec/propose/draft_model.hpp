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
//! Modes (a template parameter, so `samples_drafts` stays a compile-time trait):
//! - `draft_mode::greedy`: d_i = policy.greedy_token(draft row, history); the drafts are
//!   deterministic candidates (no q rows); pair with a greedy or tree verifier.
//! - `draft_mode::sample`: d_i is drawn from q_i = policy.distribution(draft row, history) with one
//!   word of the request's Philox stream, by the draw rule of sampling/draw.hpp (as
//!   `policy.sample` draws), and q_i is recorded as the tree's q row i - 1; pair with a
//!   speculative-sampling (or tree) verifier, which accepts with min(1, p/q). Lossless.
//!
//! `batched_draft_model_proposer` (below) drafts for a whole batch of requests (`batch_decoder`)
//! with one draft model that scores them all in each forward (a `batched_lm`).
//!
//! Options: a confidence cutoff (stop drafting when the draft's top probability under its plain
//! softmax falls below a threshold; the first draft token is always drafted) and an adaptive draft
//! length (after a step whose drafts were all accepted k grows by `k_step_up`, after a rejection it
//! shrinks by one, within [k_min, k_max]). Both depend only on the draft's own outputs and on past
//! acceptance, so sampling stays lossless.

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
#include "specdec/sampling/draw.hpp"

namespace specdec {

//! How a model-based proposer picks its draft tokens.
enum class draft_mode {
  greedy,  //!< the policy's greedy token of each draft row (deterministic candidates)
  sample,  //!< drawn from the policy's distribution of each draft row, recorded as q rows
};

//! Configuration of a chain-drafting model proposer.
struct draft_model_config {
  //! Draft length per step (the starting length when `adaptive`).
  std::size_t k = 4;
  //! Adapt k to recent acceptance within [k_min, k_max].
  bool adaptive = false;
  std::size_t k_min = 1;      //!< smallest adaptive k (>= 1)
  std::size_t k_max = 8;      //!< largest adaptive k (>= k_min)
  std::size_t k_step_up = 2;  //!< growth of k after a step whose drafts were all accepted
  //! Stop drafting once the draft's top probability (plain softmax of its logits) is below this;
  //! 0 disables the cutoff. In [0, 1].
  float confidence_threshold = 0.0f;

  //! Throws `errc::invalid_argument` naming the field that is out of its domain.
  void validate() const {
    SPECDEC_CHECK(k < max_tree_nodes, invalid_argument, "draft_model_config: k = ", k,
                  " must be below ", max_tree_nodes);
    SPECDEC_CHECK(k_min >= 1 && k_min <= k_max && k_max < max_tree_nodes, invalid_argument,
                  "draft_model_config: need 1 <= k_min <= k_max < ", max_tree_nodes,
                  " (k_min = ", k_min, ", k_max = ", k_max, ")");
    SPECDEC_CHECK(!adaptive || (k >= k_min && k <= k_max), invalid_argument,
                  "draft_model_config: adaptive k = ", k, " is outside [", k_min, ", ", k_max, "]");
    SPECDEC_CHECK(confidence_threshold >= 0.0f && confidence_threshold <= 1.0f, invalid_argument,
                  "draft_model_config: confidence_threshold ", confidence_threshold,
                  " is outside [0, 1]");
  }
};

namespace detail {

//! Probability of the most likely token under the plain softmax of `logits` (1 / sum exp(l - max)).
//! Non-finite rows give 0 (no confidence).
[[nodiscard]] inline float top_probability(std::span<float const> logits) noexcept {
  float hi = -INFINITY;
  for (float l : logits) hi = std::max(hi, l);
  if (!std::isfinite(hi)) return 0.0f;
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - hi));
  return sum > 0.0 && std::isfinite(sum) ? static_cast<float>(1.0 / sum) : 0.0f;
}

//! The drafting machinery shared by `draft_model_proposer` and `layer_skip_proposer`: a draft
//! cache kept in step with the committed tokens, chain drafting, rollback and adaptive k. The draft
//! model is passed to each call so that the owner may hold it by reference or by value.
template <class Model, class Policy, draft_mode Mode>
class chain_drafter {
 public:
  //! A drafter with `config` (validated), `policy`, and layers to skip in every draft forward.
  chain_drafter(draft_model_config config, Policy policy, std::vector<std::int32_t> skip_layers)
      : config_(config), policy_(std::move(policy)), skip_(std::move(skip_layers)), k_(config.k) {
    config_.validate();
  }

  //! Starts a sequence: empties the draft cache (the prompt is fed at the first `propose`).
  void begin(Model& model, std::span<token_id const> prompt) {
    model.cache().truncate(0);
    cached_.clear();
    cached_.reserve(std::min<std::size_t>(model.max_context(), prompt.size() + 4096));
    committed_at_propose_ = 0;
    k_ = config_.k;
  }

  //! Drafts a chain under `ctx.tokens.back()` (see the file comment).
  void propose(Model& model, propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument,
                  "draft proposer: propose with no committed tokens");
    tree.reset(ctx.tokens.back());
    std::size_t const t = ctx.tokens.size();
    std::size_t const vocab = model.vocab_size();
    committed_at_propose_ = t;
    drafted_ = 0;
    sync(model, ctx.tokens);

    std::size_t const capacity =
        std::min<std::size_t>(model.max_context(), model.cache().capacity());
    // Feeding the root and k - 1 drafts needs positions up to t + k - 2.
    std::size_t k = std::min({k_, ctx.max_nodes, tree.capacity() - 1});
    if (t > capacity) k = 0;
    k = std::min(k, capacity + 1 - std::min(capacity + 1, t));
    if constexpr (Mode == draft_mode::sample) {
      if (tree.q_vocab() != vocab) tree.enable_q(vocab);
    } else {
      if (tree.has_q()) tree.enable_q(0);  // deterministic candidates carry no q rows
    }
    if (k == 0) return;
    if constexpr (Mode == draft_mode::sample)
      SPECDEC_CHECK(ctx.rng != nullptr, invalid_argument,
                    "draft proposer: sampling drafts needs propose_context::rng");

    // Feed the committed tokens the cache lacks (at least the root).
    std::size_t const have = cached_.size();
    feed(model, ctx.tokens.subspan(have), have);

    node_index parent = 0;
    for (std::size_t i = 1; i <= k; ++i) {
      std::span<float const> const row = fwd_.logits_view().at_row(fwd_.logits_count - 1);
      if (i > 1 && config_.confidence_threshold > 0.0f &&
          top_probability(row) < config_.confidence_threshold)
        break;
      token_id next = no_token;
      if constexpr (Mode == draft_mode::sample) {
        std::span<float> const q = tree.q_row(parent);
        policy_.distribution(row, token_history::checked(cached_), q);  // `feed` checked it
        next = draw_draft(q, ctx.rng->uniform(), parent);
      } else {
        next = policy_.greedy_token(row, token_history::checked(cached_));
      }
      SPECDEC_CHECK(next >= 0 && static_cast<std::size_t>(next) < vocab, out_of_range,
                    "draft proposer: the policy produced token ", next,
                    " outside the vocabulary of ", vocab);
      parent = tree.add_node(parent, next);
      ++drafted_;
      if (i < k) feed(model, std::span<token_id const>(&next, 1), cached_.size());
    }
  }

  //! Rolls the draft cache back to the committed tokens plus the accepted drafts, and adapts k.
  void accept(Model& model, verify_result const& result) {
    std::size_t const keep =
        std::min(cached_.size(), committed_at_propose_ + result.num_accepted());
    if (keep < cached_.size()) {
      model.cache().truncate(keep);
      cached_.resize(keep);
    }
    if (config_.adaptive && drafted_ > 0) {
      if (result.num_accepted() >= drafted_)
        k_ = std::min(config_.k_max, k_ + config_.k_step_up);
      else
        k_ = std::max(config_.k_min, k_ - std::min<std::size_t>(k_, 1));
    }
  }

  //! The draft length the next step will use (before the context and max_nodes limits).
  [[nodiscard]] std::size_t current_k() const noexcept { return k_; }
  //! The longest chain `propose` can draft under this configuration: k_max when adaptive, else k.
  [[nodiscard]] std::size_t max_nodes() const noexcept {
    return config_.adaptive ? config_.k_max : config_.k;
  }
  //! Number of positions in the draft cache.
  [[nodiscard]] std::size_t cached() const noexcept { return cached_.size(); }
  //! [1, vocab] the draft logits of the last forward (the row after the last fed token).
  [[nodiscard]] std::span<float const> last_logits() const {
    return fwd_.logits_count == 0 ? std::span<float const>()
                                  : fwd_.logits_view().at_row(fwd_.logits_count - 1);
  }
  //! The configuration (validated).
  [[nodiscard]] draft_model_config const& config() const noexcept { return config_; }
  //! The policy of the draft rows.
  [[nodiscard]] Policy const& policy() const noexcept { return policy_; }
  //! [n] the layers skipped in every draft forward, ascending.
  [[nodiscard]] std::span<std::int32_t const> skip_layers() const noexcept { return skip_; }

 private:
  //! Cuts the cache back to the longest prefix it shares with `tokens`, leaving at least the root
  //! to feed (so that the next forward yields the row after the root). O(1) when the cache is a
  //! prefix of `tokens`, as it always is between `accept` and `propose`.
  void sync(Model& model, std::span<token_id const> tokens) {
    std::size_t const t = tokens.size();
    if (model.cache().size() != cached_.size()) {  // the cache was used or reset elsewhere
      model.cache().truncate(0);
      cached_.clear();
    }
    std::size_t s = cached_.size();
    bool const consistent = s < t && (s == 0 || cached_[s - 1] == tokens[s - 1]);
    if (consistent) return;
    std::size_t const limit = std::min(s, t - 1);
    std::size_t p = 0;
    while (p < limit && cached_[p] == tokens[p]) ++p;
    s = p;
    model.cache().truncate(s);
    cached_.resize(s);
  }

  //! The draft token drawn from q with uniform u by the draw rule (sampling/draw.hpp; what
  //! `policy.sample` draws with the same word), with an error naming the draft's node.
  static token_id draw_draft(std::span<float const> q, float u, node_index parent) {
    double total = 0.0;
    std::size_t const i = draw_index(q, u, total);
    SPECDEC_CHECK(i != no_index, numerical, "draft proposer: the q row under node ", parent,
                  " sums to ", total, " (the policy's distribution has no positive mass)");
    return static_cast<token_id>(i);
  }

  //! Feeds `tokens` at positions start.. in one causal forward; logits for the last row only.
  //! Every token entering `cached_` is checked against the vocabulary here, so that the policy
  //! need not check the whole cache again at every draft row.
  void feed(Model& model, std::span<token_id const> tokens, std::size_t start) {
    std::size_t const vocab = model.vocab_size();
    for (std::size_t i = 0; i < tokens.size(); ++i)
      SPECDEC_CHECK(tokens[i] >= 0 && static_cast<std::size_t>(tokens[i]) < vocab, out_of_range,
                    "draft proposer: token ", tokens[i], " at position ", start + i,
                    " is outside the draft's vocabulary of ", vocab);
    positions_.resize(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i)
      positions_[i] = static_cast<position_t>(start + i);
    std::int32_t const last = static_cast<std::int32_t>(tokens.size() - 1);
    forward_request const req{.tokens = tokens,
                              .positions = positions_,
                              .logits_rows = std::span<std::int32_t const>(&last, 1),
                              .skip_layers = skip_};
    model.forward(req, fwd_);
    cached_.insert(cached_.end(), tokens.begin(), tokens.end());
  }

  draft_model_config config_;
  Policy policy_;
  std::vector<std::int32_t> skip_;
  std::size_t k_;
  std::vector<token_id> cached_;  //!< the tokens in the draft cache, in order
  std::vector<position_t> positions_;
  forward_result fwd_;
  std::size_t committed_at_propose_ = 0;
  std::size_t drafted_ = 0;
};

}  // namespace detail

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
    r.cached.clear();
    r.cached.reserve(std::min<std::size_t>(draft_->max_context(), prompt.size() + 4096));
  }

  //! Drafts a chain for every item (see the class comment); a failure of one request (a token
  //! outside the draft's vocabulary, a draft row without mass) is its item's error.
  void propose(std::span<batch_propose_item> items) {
    std::size_t const vocab = draft_->vocab_size();
    active_.clear();
    segments_.clear();
    for (std::size_t i = 0; i < items.size(); ++i) {
      batch_propose_item& item = items[i];
      try {
        request& r = at(item.slot);
        propose_context const& ctx = item.ctx;
        SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument,
                      "batched_draft_model_proposer: propose with no committed tokens");
        draft_tree& tree = *item.tree;
        tree.reset(ctx.tokens.back());
        if constexpr (Mode == draft_mode::sample) {
          if (tree.q_vocab() != vocab) tree.enable_q(vocab);
        } else {
          if (tree.has_q()) tree.enable_q(0);
        }
        std::size_t const t = ctx.tokens.size();
        r.committed_at_propose = t;
        r.drafted = 0;
        sync(r, ctx.tokens);
        std::size_t const capacity =
            std::min<std::size_t>(draft_->max_context(), draft_->cache(r.draft_slot).capacity());
        std::size_t k = std::min({config_.k, ctx.max_nodes, tree.capacity() - 1});
        if (t > capacity) k = 0;
        k = std::min(k, capacity + 1 - std::min(capacity + 1, t));
        r.k = k;
        if (k == 0) continue;
        if constexpr (Mode == draft_mode::sample)
          SPECDEC_CHECK(ctx.rng != nullptr, invalid_argument,
                        "batched_draft_model_proposer: sampling drafts needs propose_context::rng");
        std::span<token_id const> const missing = ctx.tokens.subspan(r.cached.size());
        for (std::size_t j = 0; j < missing.size(); ++j)
          SPECDEC_CHECK(missing[j] >= 0 && static_cast<std::size_t>(missing[j]) < vocab,
                        out_of_range, "batched_draft_model_proposer: token ", missing[j],
                        " at position ", r.cached.size() + j,
                        " is outside the draft's vocabulary of ", vocab);
        r.feed = missing;
        r.parent = 0;
        active_.push_back(i);
      } catch (...) {
        item.error = std::current_exception();
      }
    }
    // Draft position by position: feed (all active requests in one forward), then draw.
    for (std::size_t depth = 1; !active_.empty(); ++depth) {
      forward(items);
      next_.clear();
      for (std::size_t s = 0; s < active_.size(); ++s) {
        batch_propose_item& item = items[active_[s]];
        request& r = requests_[item.slot];
        try {
          std::span<float const> const row = out_.logits(s).at_row(0);
          if (depth > 1 && config_.confidence_threshold > 0.0f &&
              detail::top_probability(row) < config_.confidence_threshold)
            continue;
          token_id next = no_token;
          if constexpr (Mode == draft_mode::sample) {
            std::span<float> const q = item.tree->q_row(r.parent);
            policy_.distribution(row, token_history::checked(r.cached), q);
            double total = 0.0;
            std::size_t const index = detail::draw_index(q, item.ctx.rng->uniform(), total);
            SPECDEC_CHECK(index != detail::no_index, numerical,
                          "batched_draft_model_proposer: the q row under node ", r.parent,
                          " sums to ", total, " (the policy's distribution has no positive mass)");
            next = static_cast<token_id>(index);
          } else {
            next = policy_.greedy_token(row, token_history::checked(r.cached));
          }
          SPECDEC_CHECK(next >= 0 && static_cast<std::size_t>(next) < vocab, out_of_range,
                        "batched_draft_model_proposer: the policy produced token ", next,
                        " outside the vocabulary of ", vocab);
          r.parent = item.tree->add_node(r.parent, next);
          ++r.drafted;
          if (depth < r.k) {
            r.next = next;
            r.feed = std::span<token_id const>(&r.next, 1);
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
    std::size_t const keep =
        std::min(r.cached.size(), r.committed_at_propose + result.num_accepted());
    if (keep < r.cached.size()) {
      draft_->cache(r.draft_slot).truncate(keep);
      r.cached.resize(keep);
    }
  }

  //! The request in `slot` left: its draft slot is released.
  void end(std::size_t slot) {
    if (slot >= requests_.size() || !requests_[slot].active) return;
    request& r = requests_[slot];
    r.active = false;
    r.cached.clear();
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
    return requests_[slot].cached.size();
  }

 private:
  struct request {
    bool active = false;
    std::size_t draft_slot = 0;
    std::vector<token_id> cached;  // the tokens in its draft cache, in order
    std::size_t committed_at_propose = 0;
    std::size_t k = 0;                  // this step's chain length
    std::size_t drafted = 0;            // drafted this step
    node_index parent = 0;              // the last drafted node
    token_id next = no_token;           // the draft token to feed next
    std::span<token_id const> feed;     // what the next forward feeds
    std::vector<position_t> positions;  // of `feed`
  };

  request& at(std::size_t slot) {
    SPECDEC_CHECK(slot < requests_.size() && requests_[slot].active, invalid_argument,
                  "batched_draft_model_proposer: no request in slot ", slot);
    return requests_[slot];
  }

  //! Cuts the request's cache back to the longest prefix it shares with `tokens`, leaving at
  //! least the root to feed (as `draft_model_proposer` does).
  void sync(request& r, std::span<token_id const> tokens) {
    auto& cache = draft_->cache(r.draft_slot);
    std::size_t const t = tokens.size();
    if (cache.size() != r.cached.size()) {  // the cache was used or reset elsewhere
      cache.truncate(0);
      r.cached.clear();
    }
    std::size_t s = r.cached.size();
    if (s < t && (s == 0 || r.cached[s - 1] == tokens[s - 1])) return;
    std::size_t const limit = std::min(s, t - 1);
    std::size_t p = 0;
    while (p < limit && r.cached[p] == tokens[p]) ++p;
    cache.truncate(p);
    r.cached.resize(p);
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
      r.positions.resize(r.feed.size());
      for (std::size_t j = 0; j < r.feed.size(); ++j)
        r.positions[j] = static_cast<position_t>(r.cached.size() + j);
      segments_.push_back(
          {.slot = r.draft_slot,
           .tokens = r.feed,
           .positions = r.positions,
           .logits_rows = std::span<std::int32_t const>(last_rows_).subspan(r.feed.size() - 1, 1)});
    }
    draft_->forward({.segments = segments_}, out_);
    for (std::size_t const i : active_) {
      request& r = requests_[items[i].slot];
      r.cached.insert(r.cached.end(), r.feed.begin(), r.feed.end());
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
