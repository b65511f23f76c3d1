#pragma once
//! \file
//! `sparse_kv_proposer`: self-speculation over a bounded view of the target's own cache, the
//! draft of MagicDec (Sadhukhan et al., arXiv 2408.11049) and the draft cache of TriForce (Sun et
//! al., arXiv 2404.11912). The draft is the target itself, every layer of it, run through the
//! target handle the decoder gives it (core/target_handle.hpp), but each draft token attends to a
//! fixed budget of cache positions instead of the whole context (`forward_request::view`). Where
//! the cache is long (large batch x context), loading it dominates a decode step: verifying k
//! tokens costs about one step, while a draft step reads a bounded cache, so the draft gets
//! cheaper relative to the target as the context grows, and its acceptance stays high (MagicDec
//! reports about 0.8 with a budget of 512 from 4K to 100K tokens).
//!
//! Which positions, `kv_policy`: StreamingLLM's `sinks` leading positions and a window of the most
//! recent ones; or a selection per layer and kv head made once, at a request's first draft, from
//! the attention the target pays its prompt (SnapKV: the last `window` prompt queries' softmax
//! weights -- as many as the cache has room for beyond the prompt --, summed per GQA group and
//! pooled; TriForce's retrieval: the root's query against the
//! mean key of each chunk of `chunk` positions, chunk 0 always kept), with the window of the most
//! recent positions beside it. Either way the window moves with the sequence (rolling eviction):
//! at each draft forward it is the last positions of the cache, the committed tokens and the
//! drafts fed so far, so verified tokens enter it and rejected ones leave it with the target's
//! rollback. Positions are absolute: the kept keys keep the rotation of the position they were
//! cached at and the draft's queries use their own positions, as the target's do; nothing is
//! re-rotated, so a viewed entry is the entry the full forward reads. The committed entries the
//! draft reads are the target's own (written by the verification forward), so after a fully
//! accepted step the next draft feeds only the root.
//!
//! Drafting, the confidence cutoff and the adaptive draft length are those of
//! `draft_model_proposer` (propose/chain_drafter.hpp); the draft length adapts by default. A
//! budget that covers the whole context makes the draft the target itself: every greedy draft is
//! accepted. The target must declare `supports_kv_view` (`cpu_llama` does).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/target_handle.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/propose/chain_drafter.hpp"

namespace specdec {

//! Which cache positions the draft of `sparse_kv_proposer` attends to (see the file comment).
enum class kv_policy : std::uint8_t {
  streaming,  //!< StreamingLLM: `sinks` leading positions and the latest budget - sinks
  snapkv,     //!< SnapKV: budget - window positions per layer and kv head, and the latest window
  retrieval,  //!< TriForce: (budget - window) / chunk chunks per layer and kv head, and the window
};

//! Configuration of `sparse_kv_proposer`.
struct sparse_kv_config {
  kv_policy policy = kv_policy::streaming;  //!< which positions the draft sees
  //! streaming: leading positions always seen (StreamingLLM's attention sinks; 16 as MagicDec's
  //! reference); the window holds the other budget - sinks.
  std::size_t sinks = 16;
  //! Cache positions in the draft's view in all (the sinks or the selection, and the window).
  std::size_t budget = 512;
  //! snapkv, retrieval: the latest positions always seen (< budget); snapkv's observation window
  //! too (the prompt queries whose attention chooses the rest; 32 as SnapKV).
  std::size_t window = 32;
  std::size_t pool = 5;   //!< snapkv: positions pooled around each (odd; 5 as SnapKV)
  std::size_t chunk = 8;  //!< retrieval: positions per chunk (8 as TriForce)
  //! Draft length, adaptivity and confidence cutoff (adaptive by default).
  draft_model_config draft = {.k = 4, .adaptive = true, .k_min = 1, .k_max = 8};

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    if (policy == kv_policy::streaming) {
      SPECDEC_CHECK(budget > sinks, invalid_argument, "sparse_kv_config: budget ", budget,
                    " must exceed sinks ", sinks, " (the window holds budget - sinks positions)");
    } else {
      SPECDEC_CHECK(window >= 1 && budget > window, invalid_argument, "sparse_kv_config: budget ",
                    budget, " must exceed window ", window,
                    " >= 1 (the selection holds budget - "
                    "window positions)");
      SPECDEC_CHECK(policy != kv_policy::snapkv || pool % 2 == 1, invalid_argument,
                    "sparse_kv_config: pool ", pool,
                    " must be odd (a window centred on each "
                    "position)");
      SPECDEC_CHECK(policy != kv_policy::retrieval || (chunk >= 1 && budget - window >= chunk),
                    invalid_argument,
                    "sparse_kv_config: the selection of budget - window = ", budget - window,
                    " positions must hold a chunk of ", chunk, " (chunk >= 1)");
    }
    draft.validate();
  }
};

namespace detail {

//! Writes into `order` [0, count) the indices of `key` with the largest values, ties to the
//! earlier index, in ascending order; the first `fixed` indices are always among them
//! (fixed <= count <= key.size()). `order` holds key.size() indices after the call.
inline void best_ascending(std::span<float const> key, std::size_t fixed, std::size_t count,
                           std::vector<std::int32_t>& order) {
  order.resize(key.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin() + static_cast<std::ptrdiff_t>(fixed),
                    order.begin() + static_cast<std::ptrdiff_t>(count), order.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      float const ka = key[static_cast<std::size_t>(a)];
                      float const kb = key[static_cast<std::size_t>(b)];
                      return ka > kb || (ka == kb && a < b);
                    });
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count));
}

}  // namespace detail

//! SnapKV's selection: for each of the lists of `scores` (list i at `scores[i * stride]`, one per
//! layer and kv head, the attention weights of cache positions), the `keep` positions of
//! [0, horizon) with the largest pooled score -- the sum of the scores of the `pool` positions
//! centred on it (pool odd; positions outside [0, horizon) add 0: SnapKV's average pooling with
//! zero padding, up to a constant) -- ties to the earlier position, ascending, into `out`
//! [lists, keep]. Requires keep <= horizon <= stride.
inline void snapkv_select(std::span<float const> scores, std::size_t stride, std::size_t horizon,
                          std::size_t keep, std::size_t pool, std::vector<std::int32_t>& out) {
  std::size_t const lists = stride == 0 ? 0 : scores.size() / stride;
  std::vector<float> pooled(horizon);
  std::vector<std::int32_t> order;
  out.resize(lists * keep);
  std::size_t const half = pool / 2;
  for (std::size_t i = 0; i < lists; ++i) {
    float const* const s = scores.data() + i * stride;
    for (std::size_t j = 0; j < horizon; ++j) {
      float sum = 0.0f;
      for (std::size_t a = j < half ? 0 : j - half; a <= j + half && a < horizon; ++a) sum += s[a];
      pooled[j] = sum;
    }
    detail::best_ascending(pooled, 0, keep, order);
    std::copy_n(order.begin(), keep, out.begin() + static_cast<std::ptrdiff_t>(i * keep));
  }
}

//! TriForce's chunk retrieval: for each of the lists of `logits` (list i at `logits[i * stride]`,
//! one per layer and kv head, a query's scaled logits over cache positions), chunk c holding
//! positions [c chunk, (c + 1) chunk) of the whole chunks of [0, horizon) is scored by the mean of
//! its logits (the query against the chunk's mean key); chunk 0 and the `chunks - 1` best others
//! are kept (ties to the earlier chunk), their positions ascending into `out` [lists, chunks
//! chunk]. Requires 1 <= chunks <= horizon / chunk and horizon <= stride.
inline void retrieval_select(std::span<float const> logits, std::size_t stride, std::size_t horizon,
                             std::size_t chunk, std::size_t chunks,
                             std::vector<std::int32_t>& out) {
  std::size_t const lists = stride == 0 ? 0 : logits.size() / stride;
  std::size_t const total = horizon / chunk;
  std::vector<float> mean(total);
  std::vector<std::int32_t> order;
  out.resize(lists * chunks * chunk);
  for (std::size_t i = 0; i < lists; ++i) {
    float const* const s = logits.data() + i * stride;
    for (std::size_t c = 0; c < total; ++c) {
      float sum = 0.0f;
      for (std::size_t j = c * chunk; j < (c + 1) * chunk; ++j) sum += s[j];
      mean[c] = sum / static_cast<float>(chunk);
    }
    detail::best_ascending(mean, 1, chunks, order);
    std::int32_t* at = out.data() + i * chunks * chunk;
    for (std::size_t c = 0; c < chunks; ++c)
      for (std::size_t j = 0; j < chunk; ++j)
        *at++ = static_cast<std::int32_t>(static_cast<std::size_t>(order[c]) * chunk + j);
  }
}

//! Self-speculative drafting with the target over a bounded view of its cache (see the file
//! comment). Any decoder runs it with any target that declares `supports_kv_view`; a batch decoder
//! runs one per request (`per_request_proposer`), each on its own slot.
//!
//! \tparam Policy a `sampling_policy` for the draft rows; owned.
//! \tparam Mode   greedy candidates or sampled drafts with q rows.
template <sampling_policy Policy, draft_mode Mode = draft_mode::greedy>
class sparse_kv_proposer {
 public:
  static constexpr bool produces_trees = false;                       //!< always a chain
  static constexpr bool samples_drafts = Mode == draft_mode::sample;  //!< q rows when sampling
  static constexpr bool uses_target = true;      //!< drafts through `propose_context::target`
  static constexpr bool views_target_kv = true;  //!< with `forward_request::view`

  //! Throws `errc::invalid_argument` for an invalid configuration.
  sparse_kv_proposer(sparse_kv_config config, Policy policy)
      : config_((config.validate(), config)), drafter_(config.draft, std::move(policy), {}) {
    if (config_.policy == kv_policy::streaming)
      drafter_.variant() = {.sinks = config_.sinks, .window = config_.budget - config_.sinks};
  }

  //! Starts a sequence (see `proposer`); a selecting policy selects again at its first draft.
  void begin(std::span<token_id const> prompt) {
    drafter_.begin(prompt);
    selected_ = config_.policy == kv_policy::streaming;
    if (!selected_) drafter_.variant() = {};
  }
  //! Drafts a chain of at most min(current k, ctx.max_nodes) tokens under ctx.tokens.back() on
  //! `ctx.target`, first selecting the view when the policy selects and has not yet. Throws
  //! `errc::invalid_argument` without a target, and when the target returns no attention
  //! statistics for the selection (`forward_request::kv_scores`).
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(ctx.target != nullptr && ctx.target->valid(), invalid_argument,
                  "sparse_kv_proposer: no target in the propose context (a decoder gives one to "
                  "proposers that declare uses_target)");
    if (!selected_ && !ctx.tokens.empty()) select(*ctx.target, ctx.tokens);
    drafter_.propose(*ctx.target, ctx, tree);
  }
  //! Adapts k to the outcome.
  void accept(verify_result const& result) { drafter_.accept(result); }

  //! The configuration (validated).
  [[nodiscard]] sparse_kv_config const& config() const noexcept { return config_; }
  //! The draft length of the next step (before the context and max_nodes limits).
  [[nodiscard]] std::size_t current_k() const noexcept { return drafter_.current_k(); }
  //! The node budget: the longest chain one `propose` can draft (k_max when adaptive, else k).
  [[nodiscard]] std::size_t max_nodes() const noexcept { return drafter_.max_nodes(); }
  //! [vocab] the draft's logits after the last token it was fed.
  [[nodiscard]] std::span<float const> last_logits() const { return drafter_.last_logits(); }
  //! The view of the draft forwards: `sinks` and `window`, and the selection (`positions`, one
  //! list of `per_head` per layer and kv head) once made (spans valid until the next `begin`).
  [[nodiscard]] kv_view view() const noexcept {
    detail::draft_variant const& v = drafter_.variant();
    return {.sinks = v.sinks, .window = v.window, .positions = v.positions, .per_head = v.per_head};
  }

 private:
  // The selection of a request (see the file comment), before its first draft: the cache holds
  // its committed tokens but the root. Positions [0, horizon) are chosen from; the window holds
  // the later ones. When the chosen positions would be all of them, the first budget - window
  // positions are kept instead (sinks), so that a budget over the whole context sees all of it.
  void select(target_handle const& target, std::span<token_id const> tokens) {
    detail::draft_variant& v = drafter_.variant();
    std::size_t const committed = tokens.size() - 1;
    std::size_t const horizon = committed - std::min(config_.window, committed);
    std::size_t const keep = config_.budget - config_.window;
    bool const snap = config_.policy == kv_policy::snapkv;
    std::size_t const chunks = keep / config_.chunk;
    v = {.sinks = keep, .window = config_.window};  // all of the cache while it fits the budget
    // SnapKV observes the last `window` prompt tokens again over the cache before them (the
    // prefill's attention; fewer where the cache has no room for them), retrieval the root's
    // query over the whole cache.
    std::size_t const room = target.capacity() - std::min(target.capacity(), committed);
    std::size_t const rows = std::min(snap ? config_.window : 1, room);
    if (rows == 0 || (snap ? horizon <= keep : horizon / config_.chunk <= chunks)) {
      selected_ = true;
      return;
    }
    std::span<token_id const> const fed = tokens.last(rows);
    positions_.resize(rows);
    std::iota(positions_.begin(), positions_.end(), static_cast<position_t>(tokens.size() - rows));
    std::int32_t const last = static_cast<std::int32_t>(rows - 1);
    forward_request const req{
        .tokens = fed,
        .positions = positions_,
        .logits_rows = std::span<std::int32_t const>(&last, 1),
        .view = {.sinks = rows > 1 ? tokens.size() - rows : 0},
        .kv_scores = {.kind = snap ? kv_score_kind::probability : kv_score_kind::logit,
                      .rows = rows}};
    target.forward(req, observed_);
    target.rollback();
    std::size_t const per_list = observed_.kv_score_positions;
    SPECDEC_CHECK(per_list == committed && observed_.kv_score_heads > 0 &&
                      observed_.kv_scores.size() % (per_list * observed_.kv_score_heads) == 0,
                  invalid_argument,
                  "sparse_kv_proposer: the target returned no attention "
                  "statistics of its cache (forward_request::kv_scores) to select a view from");
    if (snap) {
      snapkv_select(observed_.kv_scores, per_list, horizon, keep, config_.pool, v.positions);
      v.per_head = keep;
    } else {
      retrieval_select(observed_.kv_scores, per_list, horizon, config_.chunk, chunks, v.positions);
      v.per_head = chunks * config_.chunk;
    }
    v.sinks = 0;
    selected_ = true;  // not before: a request whose selection failed fails again, not silently
  }

  sparse_kv_config config_;
  detail::chain_drafter<target_handle const, Policy, Mode> drafter_;
  bool selected_ = true;               // the view of this request is chosen
  std::vector<position_t> positions_;  // an observation's positions
  forward_result observed_;            // an observation's attention statistics
};

}  // namespace specdec
