#pragma once
//! \file
//! The chain drafting of a causal model, shared by `draft_model_proposer` (a separate draft model
//! with its own cache), `layer_skip_proposer` and `sparse_kv_proposer` (the target itself, on its
//! own cache through its `target_handle`, with layers skipped or a bounded view of the cache):
//! `draft_mode`, `draft_model_config`, `detail::chain_sequence` (one sequence, phase by phase; also
//! what `batched_draft_model_proposer` drives per request) and `detail::chain_drafter`.
//!
//! Modes (a template parameter, so `samples_drafts` stays a compile-time trait):
//! - `draft_mode::greedy`: d_i = policy.greedy_token(draft row, history); the drafts are
//!   deterministic candidates (no q rows); pair with a greedy or tree verifier.
//! - `draft_mode::sample`: d_i is drawn from q_i = policy.distribution(draft row, history) with one
//!   word of the request's Philox stream, by the draw rule of sampling/draw.hpp (as
//!   `policy.sample` draws), and q_i is recorded as the tree's q row i - 1; pair with a
//!   speculative-sampling (or tree) verifier, which accepts with min(1, p/q). Lossless.
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
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/target_handle.hpp"
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

//! One sequence's chain drafting, phase by phase: the tokens its draft cache holds, kept in step
//! with the committed tokens, and the step's chain and its draws. `chain_drafter` drives one with a
//! single model (or the target's handle); `batched_draft_model_proposer` drives one per request,
//! all of them fed by one batched forward per draft position. A phase that throws leaves the
//! sequence to be started again by the next step (`sync` mends the draft cache).
template <draft_mode Mode>
class chain_sequence {
 public:
  //! Starts a sequence: its draft cache holds no token; room for `reserve` tokens.
  void begin(std::size_t reserve) {
    cached_.clear();
    cached_.reserve(reserve);
    committed_ = drafted_ = k_ = 0;
  }

  //! Cuts `cache` (the sequence's draft cache) and the tokens it holds back to the longest prefix
  //! they share with `tokens`, leaving at least the root to feed (so that the next forward yields
  //! the row after the root). The whole prefix is compared (a few microseconds for thousands of
  //! tokens, far below a forward), so a history edited anywhere is noticed; a cache used or reset
  //! elsewhere is emptied.
  template <class Cache>
  void sync(Cache& cache, std::span<token_id const> tokens) {
    std::size_t const t = tokens.size();
    if (cache.size() != cached_.size()) {
      cache.truncate(0);
      cached_.clear();
    }
    std::size_t const s = cached_.size();
    std::size_t const limit = std::min(s, t - 1);
    auto const first = cached_.begin();
    std::size_t const p = static_cast<std::size_t>(
        std::mismatch(first, first + static_cast<std::ptrdiff_t>(limit), tokens.begin()).first -
        first);
    if (p == s) return;  // the cache is a prefix of the history, the root not in it
    cache.truncate(p);
    cached_.resize(p);
  }

  //! The draft cache holds exactly `tokens` (the target's own cache, the root excluded): the
  //! tokens committed since the last step are appended (a history that does not extend the one
  //! held is copied whole).
  void hold(std::span<token_id const> tokens) {
    std::size_t const s = cached_.size();
    if (s <= tokens.size() && (s == 0 || cached_[s - 1] == tokens[s - 1]))
      cached_.insert(cached_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(s), tokens.end());
    else
      cached_.assign(tokens.begin(), tokens.end());
  }

  //! Starts a step under ctx.tokens.back(): resets `tree` (with q rows when sampling) and sets the
  //! chain's length to at most `want` drafts, ctx.max_nodes, the tree's room and what a draft cache
  //! of `capacity` positions allows (feeding the root and k - 1 drafts needs positions up to
  //! t + k - 2). Returns the tokens to feed first -- the committed tokens the draft cache lacks
  //! (at least the root), checked against `vocab` -- or nothing when the step drafts nothing.
  //! `who` names the proposer in messages.
  std::span<token_id const> start(propose_context const& ctx, draft_tree& tree, std::size_t want,
                                  std::size_t capacity, std::size_t vocab, char const* who) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument, who, ": propose with no committed tokens");
    tree.reset(ctx.tokens.back());
    if constexpr (Mode == draft_mode::sample) {
      if (tree.q_vocab() != vocab) tree.enable_q(vocab);
    } else {
      if (tree.has_q()) tree.enable_q(0);  // deterministic candidates carry no q rows
    }
    std::size_t const t = ctx.tokens.size();
    committed_ = t;
    drafted_ = 0;
    parent_ = 0;
    k_ = std::min({want, ctx.max_nodes, tree.capacity() - 1});
    if (t > capacity) k_ = 0;
    k_ = std::min(k_, capacity + 1 - std::min(capacity + 1, t));
    if (k_ == 0) return {};
    if constexpr (Mode == draft_mode::sample)
      SPECDEC_CHECK(ctx.rng != nullptr, invalid_argument, who,
                    ": sampling drafts needs propose_context::rng");
    std::span<token_id const> const missing = ctx.tokens.subspan(cached_.size());
    // Every token entering the draft cache is checked here (the drafts where they are drawn), so
    // that the policy need not check the whole history again at every draft row.
    for (std::size_t j = 0; j < missing.size(); ++j)
      SPECDEC_CHECK(missing[j] >= 0 && static_cast<std::size_t>(missing[j]) < vocab, out_of_range,
                    who, ": token ", missing[j], " at position ", cached_.size() + j,
                    " is outside the draft's vocabulary of ", vocab);
    return missing;
  }

  //! The tokens the draft cache holds, in order (the position of the next token fed: size()).
  [[nodiscard]] std::span<token_id const> cached() const noexcept { return cached_; }
  //! After a forward that fed `tokens` (at positions cached().size()...): the cache holds them.
  void fed(std::span<token_id const> tokens) {
    cached_.insert(cached_.end(), tokens.begin(), tokens.end());
  }
  //! Drops the tokens after the first n (the draft's entries on the target's own cache).
  void drop_to(std::size_t n) { cached_.resize(std::min(n, cached_.size())); }

  //! Draws the next draft from `row`, the draft's logits after the last token fed, under `policy`
  //! (the greedy token, or a draw from its distribution with one word of ctx.rng, recorded as the
  //! parent's q row) and adds it to `tree` -- unless the chain already has a draft and `row`'s top
  //! probability is below `threshold` (the confidence cutoff). Returns whether the chain goes on:
  //! `next()` is then to be fed, and its row drawn from.
  template <class Policy>
  bool draw(std::span<float const> row, Policy const& policy, float threshold,
            propose_context const& ctx, draft_tree& tree, std::size_t vocab, char const* who) {
    if (drafted_ > 0 && threshold > 0.0f && top_probability(row) < threshold) return false;
    token_id next = no_token;
    if constexpr (Mode == draft_mode::sample) {
      std::span<float> const q = tree.q_row(parent_);
      policy.distribution(row, token_history::checked(cached_), q);  // checked as they came
      double total = 0.0;
      std::size_t const i = draw_index(q, ctx.rng->uniform(), total);
      SPECDEC_CHECK(i != no_index, numerical, who, ": the q row under node ", parent_, " sums to ",
                    total, " (the policy's distribution has no positive mass)");
      next = static_cast<token_id>(i);
    } else {
      next = policy.greedy_token(row, token_history::checked(cached_));
    }
    SPECDEC_CHECK(next >= 0 && static_cast<std::size_t>(next) < vocab, out_of_range, who,
                  ": the policy produced token ", next, " outside the vocabulary of ", vocab);
    parent_ = tree.add_node(parent_, next);
    next_ = next;
    return ++drafted_ < k_;
  }
  //! The draft to feed next (after `draw` returned true).
  [[nodiscard]] token_id const& next() const noexcept { return next_; }

  //! After verification: the draft cache keeps the committed tokens plus the accepted drafts
  //! (`cache` truncated to them).
  template <class Cache>
  void accept(Cache& cache, verify_result const& result) {
    std::size_t const keep = std::min(cached_.size(), committed_ + result.num_accepted());
    if (keep < cached_.size()) {
      cache.truncate(keep);
      cached_.resize(keep);
    }
  }

  //! Drafts of the last step.
  [[nodiscard]] std::size_t drafted() const noexcept { return drafted_; }

 private:
  std::vector<token_id> cached_;  // the tokens in the draft cache, in order
  std::size_t committed_ = 0;     // committed tokens at the step's start
  std::size_t drafted_ = 0;       // drafts of the step
  std::size_t k_ = 0;             // the step's chain length
  node_index parent_ = 0;         // the last drafted node
  token_id next_ = no_token;      // the draft to feed next
};

//! What a chain drafter's forwards ask of its model besides the tokens: layers to skip
//! (`forward_request::skip_layers`, ascending) and a view of the cache of `sinks` leading
//! positions, `per_head` positions listed per layer and kv head (`positions`) and the last
//! `window` (`forward_request::view`; the whole cache when nothing is selected).
struct draft_variant {
  std::vector<std::int32_t> skip_layers = {};
  std::size_t sinks = 0;
  std::size_t window = 0;
  std::vector<std::int32_t> positions = {};  //!< [layers, kv_heads, per_head], or empty
  std::size_t per_head = 0;
};

//! The drafting shared by `draft_model_proposer`, `layer_skip_proposer` and `sparse_kv_proposer`:
//! one `chain_sequence`
//! fed by a single model, and the adaptive k. The draft model is passed to each call so that the
//! owner may hold it by reference or by value. With `Model` = `target_handle const` the draft runs
//! on the target's own cache (self-speculation): the committed tokens are already there, each step
//! feeds the root and the drafts after them and drops them again before it returns.
template <class Model, class Policy, draft_mode Mode>
class chain_drafter {
  static constexpr bool on_target = std::is_same_v<std::remove_const_t<Model>, target_handle>;
  static constexpr char const* who = "draft proposer";

 public:
  //! A drafter with `config` (validated), `policy`, and what every draft forward asks besides its
  //! tokens (`variant`).
  chain_drafter(draft_model_config config, Policy policy, draft_variant variant)
      : config_(config), policy_(std::move(policy)), variant_(std::move(variant)), k_(config.k) {
    config_.validate();
  }

  //! Starts a sequence: empties the draft cache (the prompt is fed at the first `propose`).
  void begin(Model& model, std::span<token_id const> prompt) requires(!on_target) {
    bind_prompt(prompt.size());
    model.cache().truncate(0);
    seq_.begin(std::min<std::size_t>(model.max_context(), prompt.size() + 4096));
    k_ = config_.k;
  }
  //! Starts a sequence on the target's cache (its prompt is there at the first `propose`).
  void begin(std::span<token_id const> prompt) requires on_target {
    bind_prompt(prompt.size());
    seq_.begin(prompt.size() + 4096);
    k_ = config_.k;
  }

  //! Drafts a chain under `ctx.tokens.back()` (see the file comment).
  void propose(Model& model, propose_context const& ctx, draft_tree& tree) {
    std::size_t capacity = 0;
    if constexpr (on_target) {
      std::size_t const t = ctx.tokens.size();
      SPECDEC_CHECK(t > 0 && model.committed() + 1 == t && model.size() == model.committed(),
                    internal, who, ": the target's cache holds ", model.size(), " positions and ",
                    model.committed(), " committed, expected ", t == 0 ? 0 : t - 1);
      seq_.hold(ctx.tokens.first(t - 1));
      capacity = model.capacity();
    } else {
      if (!ctx.tokens.empty()) seq_.sync(model.cache(), ctx.tokens);
      capacity = std::min<std::size_t>(model.max_context(), model.cache().capacity());
    }
    std::size_t const vocab = model.vocab_size();
    std::span<token_id const> const first = seq_.start(ctx, tree, k_, capacity, vocab, who);
    if (first.empty()) return;
    feed(model, first);
    while (seq_.draw(last_logits(), policy_, config_.confidence_threshold, ctx, tree, vocab, who))
      feed(model, std::span<token_id const>(&seq_.next(), 1));
    if constexpr (on_target) {  // the target's cache keeps the committed tokens only
      model.rollback();
      seq_.drop_to(ctx.tokens.size() - 1);
    }
  }

  //! Rolls the draft cache back to the committed tokens plus the accepted drafts, and adapts k.
  void accept(Model& model, verify_result const& result) requires(!on_target) {
    seq_.accept(model.cache(), result);
    adapt(result);
  }
  //! Adapts k (on the target's cache, the step's commit keeps what was accepted).
  void accept(verify_result const& result) requires on_target { adapt(result); }
  //! Instead of `accept`, for a caller that knows which of the draft's tokens still stand: the
  //! draft cache keeps its first `n` tokens (k is not adapted).
  void keep(Model& model, std::size_t n) requires(!on_target) {
    if (n >= seq_.cached().size()) return;
    model.cache().truncate(n);
    seq_.drop_to(n);
  }

  //! The draft length the next step will use (before the context and max_nodes limits).
  [[nodiscard]] std::size_t current_k() const noexcept { return k_; }
  //! The longest chain `propose` can draft under this configuration: k_max when adaptive, else k.
  [[nodiscard]] std::size_t max_nodes() const noexcept {
    return config_.adaptive ? config_.k_max : config_.k;
  }
  //! Number of positions in the draft cache.
  [[nodiscard]] std::size_t cached() const noexcept { return seq_.cached().size(); }
  //! The tokens in the draft cache, in order.
  [[nodiscard]] std::span<token_id const> cached_tokens() const noexcept { return seq_.cached(); }
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
  [[nodiscard]] std::span<std::int32_t const> skip_layers() const noexcept {
    return variant_.skip_layers;
  }
  //! What every draft forward asks besides its tokens.
  [[nodiscard]] draft_variant const& variant() const noexcept { return variant_; }
  //! The same, for the owner to change between steps (a view selected once the prompt is seen).
  [[nodiscard]] draft_variant& variant() noexcept { return variant_; }

 private:
  //! The policy for the request of `prompt_length` prompt tokens (`policy_for_prompt`): a
  //! constrained policy's draft rows are then masked by the request's own constraint state.
  void bind_prompt(std::size_t prompt_length) {
    if constexpr (!std::is_reference_v<decltype(policy_for_prompt(policy_, prompt_length))>)
      policy_ = policy_for_prompt(policy_, prompt_length);
  }

  // After a step: k grows after a step whose drafts were all accepted, shrinks after a rejection.
  void adapt(verify_result const& result) {
    std::size_t const drafted = seq_.drafted();
    if (config_.adaptive && drafted > 0) {
      if (result.num_accepted() >= drafted)
        k_ = std::min(config_.k_max, k_ + config_.k_step_up);
      else
        k_ = std::max(config_.k_min, k_ - std::min<std::size_t>(k_, 1));
    }
  }

  //! Feeds `tokens` at the positions after the draft cache in one causal forward; logits for the
  //! last row only.
  void feed(Model& model, std::span<token_id const> tokens) {
    std::size_t const start = seq_.cached().size();
    positions_.resize(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i)
      positions_[i] = static_cast<position_t>(start + i);
    std::int32_t const last = static_cast<std::int32_t>(tokens.size() - 1);
    forward_request const req{.tokens = tokens,
                              .positions = positions_,
                              .logits_rows = std::span<std::int32_t const>(&last, 1),
                              .skip_layers = variant_.skip_layers,
                              .view = {.sinks = variant_.sinks,
                                       .window = variant_.window,
                                       .positions = variant_.positions,
                                       .per_head = variant_.per_head}};
    model.forward(req, fwd_);
    seq_.fed(tokens);
  }

  draft_model_config config_;
  Policy policy_;
  draft_variant variant_;
  std::size_t k_;
  chain_sequence<Mode> seq_;
  std::vector<position_t> positions_;
  forward_result fwd_;
};

}  // namespace detail

}  // namespace specdec
