#pragma once
//! \file
//! The chain drafting of a causal model, shared by `draft_model_proposer` (a separate draft model
//! with its own cache) and `layer_skip_proposer` (the target itself, on its own cache through its
//! `target_handle`): `draft_mode`, `draft_model_config` and `detail::chain_drafter`.
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

//! The drafting machinery shared by `draft_model_proposer` and `layer_skip_proposer`: a draft
//! cache kept in step with the committed tokens, chain drafting, rollback and adaptive k. The draft
//! model is passed to each call so that the owner may hold it by reference or by value. With
//! `Model` = `target_handle const` the draft runs on the target's own cache (self-speculation):
//! the committed tokens are already there, each step feeds the root and the drafts after them and
//! drops them again before it returns.
template <class Model, class Policy, draft_mode Mode>
class chain_drafter {
  static constexpr bool on_target = std::is_same_v<std::remove_const_t<Model>, target_handle>;

 public:
  //! A drafter with `config` (validated), `policy`, and layers to skip in every draft forward.
  chain_drafter(draft_model_config config, Policy policy, std::vector<std::int32_t> skip_layers)
      : config_(config), policy_(std::move(policy)), skip_(std::move(skip_layers)), k_(config.k) {
    config_.validate();
  }

  //! Starts a sequence: empties the draft cache (the prompt is fed at the first `propose`).
  void begin(Model& model, std::span<token_id const> prompt) requires(!on_target) {
    model.cache().truncate(0);
    start(std::min<std::size_t>(model.max_context(), prompt.size() + 4096));
  }
  //! Starts a sequence on the target's cache (its prompt is there at the first `propose`).
  void begin(std::span<token_id const> prompt) requires on_target { start(prompt.size() + 4096); }

  //! Drafts a chain under `ctx.tokens.back()` (see the file comment).
  void propose(Model& model, propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument,
                  "draft proposer: propose with no committed tokens");
    tree.reset(ctx.tokens.back());
    std::size_t const t = ctx.tokens.size();
    std::size_t const vocab = model.vocab_size();
    committed_at_propose_ = t;
    drafted_ = 0;
    std::size_t capacity = 0;
    if constexpr (on_target) {
      SPECDEC_CHECK(model.committed() + 1 == t && model.size() == model.committed(), internal,
                    "draft proposer: the target's cache holds ", model.size(), " positions and ",
                    model.committed(), " committed, expected ", t - 1);
      cached_.assign(ctx.tokens.begin(), ctx.tokens.end() - 1);  // what the cache holds
      capacity = model.capacity();
    } else {
      sync(model, ctx.tokens);
      capacity = std::min<std::size_t>(model.max_context(), model.cache().capacity());
    }
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
    if constexpr (on_target) {  // the target's cache keeps the committed tokens only
      model.rollback();
      cached_.resize(t - 1);
    }
  }

  //! Rolls the draft cache back to the committed tokens plus the accepted drafts, and adapts k.
  void accept(Model& model, verify_result const& result) requires(!on_target) {
    std::size_t const keep =
        std::min(cached_.size(), committed_at_propose_ + result.num_accepted());
    if (keep < cached_.size()) {
      model.cache().truncate(keep);
      cached_.resize(keep);
    }
    adapt(result);
  }
  //! Adapts k (on the target's cache, the step's commit keeps what was accepted).
  void accept(verify_result const& result) requires on_target { adapt(result); }

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
  // After a step: k grows after a step whose drafts were all accepted, shrinks after a rejection.
  void adapt(verify_result const& result) {
    if (config_.adaptive && drafted_ > 0) {
      if (result.num_accepted() >= drafted_)
        k_ = std::min(config_.k_max, k_ + config_.k_step_up);
      else
        k_ = std::max(config_.k_min, k_ - std::min<std::size_t>(k_, 1));
    }
  }

  void start(std::size_t reserve) {
    cached_.clear();
    cached_.reserve(reserve);
    committed_at_propose_ = 0;
    k_ = config_.k;
  }

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

}  // namespace specdec
