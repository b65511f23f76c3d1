#pragma once
//! \file
//! `speculative_decoder`: the propose -> score -> verify -> commit loop of DESIGN.md section 1 for
//! one sequence, generic over the target model, the proposer, the verifier and the sampling policy.
//!
//! One request (`generate`):
//! 1. prefill: the target scores prompt tokens x_1..x_{t-1} in ONE batched forward (logits are
//!    requested for the last row only; hidden rows only when the proposer needs them). The last
//!    prompt token x_t is the root of the first draft tree, so the first generated token is
//!    already speculated.
//! 2. each step, with t committed tokens and the target cache holding t - 1 of them:
//!    - propose: `proposer.propose(ctx, tree)` with `ctx.max_nodes` = min(the node budget, the
//!      positions left in the context - 1, and for chain proposers the tokens still allowed by
//!      max_new_tokens - 1). The node budget is the proposer's own (`proposer.max_nodes()`, the
//!      most nodes its tree can hold under its configuration), capped by config.max_draft_nodes
//!      when set; a proposer that declares no `max_nodes()` gets config.max_draft_nodes, or
//!      `default_max_draft_nodes` when unset. The draft tree is sized for the budget;
//!    - score: one target forward over the whole tree (tokens = tree tokens, positions =
//!      t - 1 + depth, mask = the tree's ancestor mask), one logits row per node;
//!    - verify: `verifier.verify(tree, logits, policy, committed, rng, result)`;
//!    - commit: the cache keeps the root and the accepted nodes (`truncate` when they are the
//!      first nodes of a chain, `keep_path` otherwise), `proposer.accept(result)`, then the
//!      accepted tokens and the bonus token are emitted one by one through the stop checks.
//!    An `auxiliary_proposer` (core/concepts.hpp) also appends auxiliary tokens after the tree
//!    (`auxiliary(ctx, tree, aux)`, after propose): the forward scores [tree nodes, auxiliary
//!    tokens] with the batch's mask (tree rows see only their ancestors), the verifier reads the
//!    tree's rows only, `observe(tree_logits, aux_logits, result)` precedes `accept`, and the
//!    commit drops the auxiliary KV entries with the rejected nodes.
//! A request with `max_new_tokens` = 0 returns at once, with no tokens and
//! `finish_reason::max_tokens`: no prefill, no proposer call (the prompt is still checked).
//! The request's randomness is one Philox stream (config.seed, config.stream) starting at word 0;
//! proposers that sample draw from it first, then the verifier reads its words and advances it by
//! the tree size, so a request is reproducible from its seed.
//!
//! Where the target's rows live is the model's and the verifier's business, settled at compile
//! time (`detail::step_result_t`): a model that can leave its logits on its device declares
//! `device_forward_result` (e.g. `cuda_llama`), and when the verifier's `verify` takes that
//! result's `logits_view()` (e.g. `cuda::step_verifier`) and the proposer reads no target rows or
//! hidden states, the decoder asks for that result, so that a step copies no logits row to the
//! host. The loop is the same; token events then carry no logits row (`token_event::logits` is
//! empty).

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <vector>

#include "specdec/core/auxiliary_batch.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/stats.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/decode/detail/phase_timer.hpp"

namespace specdec {

namespace detail {

//! The forward result `speculative_decoder` asks the target for (see the file comment): the
//! model's `device_forward_result` when the verifier verifies its rows and the proposer reads no
//! target rows or hidden states on the host; `forward_result` otherwise.
template <class Model, class Proposer, class Verifier, class Policy>
struct step_result {
  using type = forward_result;
};

template <class Model, class Proposer, class Verifier, class Policy>
requires(!needs_target_hidden_v<Proposer> && !has_auxiliary_tokens_v<Proposer>) &&
    requires(Verifier& v, draft_tree const& tree, typename Model::device_forward_result const& r,
             Policy const& policy, token_history history, philox& rng, verify_result& out) {
  v.verify(tree, r.logits_view().subrows(0, 1), policy, history, rng, out);
}
struct step_result<Model, Proposer, Verifier, Policy> {
  using type = typename Model::device_forward_result;
};

//! `step_result<...>::type`.
template <class Model, class Proposer, class Verifier, class Policy>
using step_result_t = typename step_result<Model, Proposer, Verifier, Policy>::type;

}  // namespace detail

//! Speculative decoding of one sequence at a time: DESIGN.md's loop (see the file comment).
//!
//! \tparam Model    the target, a `causal_lm`; held by reference, its cache is reset per request.
//! \tparam Proposer a `proposer`; held by reference. Its traits select what the loop does:
//!                  `needs_target_hidden` requests hidden rows from the target and passes those of
//!                  the last committed tokens in `propose_context::target_hidden` (the final
//!                  hidden state, or, when its `target_hidden_layers() const` names layers, their
//!                  residual streams side by side: `forward_request::hidden_layers`);
//!                  `has_auxiliary_tokens` scores the proposer's auxiliary tokens after the tree
//!                  in the same forward and shows it the rows (`auxiliary_proposer`). Its
//!                  `max_nodes() const`, when it has one, is the node budget of every step.
//! \tparam Verifier a `verifier` for Policy; owned (verifiers own scratch buffers).
//! \tparam Policy   a `sampling_policy`; owned. The verifier uses it for every target row.
//! Pairings that cannot work are rejected at compile time (see `compatible_v`).
//! Not thread-safe: one request at a time per decoder.
template <causal_lm Model, proposer Proposer, class Verifier, sampling_policy Policy>
requires verifier<Verifier, Policy>
class speculative_decoder {
  static_assert(!(samples_drafts_v<Proposer> && greedy_only_v<Verifier>),
                "speculative_decoder: this proposer samples its drafts (and records q rows); a "
                "greedy-only verifier would ignore them. Use a sampling verifier.");
  static_assert(!(needs_draft_probs_v<Verifier> && !samples_drafts_v<Proposer>),
                "speculative_decoder: this verifier needs draft probabilities (q rows) but the "
                "proposer drafts deterministic candidates. Use a greedy or tree verifier.");
  static_assert(!(produces_trees_v<Proposer> && !supports_trees_v<Verifier>),
                "speculative_decoder: this proposer drafts trees but the verifier handles chains "
                "only. Use a tree verifier.");
  static_assert(!has_auxiliary_tokens_v<Proposer> || auxiliary_proposer<Proposer>,
                "speculative_decoder: this proposer declares has_auxiliary_tokens but lacks "
                "auxiliary(ctx, tree, aux) or observe(tree_logits, aux_logits, result)");

 public:
  using model_type = Model;        //!< the target model
  using proposer_type = Proposer;  //!< the drafting strategy
  using verifier_type = Verifier;  //!< the acceptance rule
  using policy_type = Policy;      //!< the sampling policy
  //! What the target's forward fills: `forward_result` (host rows), or the model's device result
  //! (see the file comment).
  using result_type = detail::step_result_t<Model, Proposer, Verifier, Policy>;

  //! A decoder scoring drafts of `proposer` with `target`. `target` and `proposer` must outlive
  //! the decoder. Throws `errc::invalid_argument` for a bad configuration.
  speculative_decoder(Model& target, Proposer& proposer, Verifier verifier, Policy policy,
                      decode_config config = {})
      : target_(&target),
        proposer_(&proposer),
        verifier_(std::move(verifier)),
        policy_(std::move(policy)),
        config_(std::move(config)),
        tree_(node_budget() + 1) {
    config_.validate(target.vocab_size());
    positions_.reserve(node_budget() + 1);
    keep_.reserve(node_budget() + 1);
  }

  //! Generates from `prompt` (every token < vocab, at least one, fitting the context), calling
  //! `on_token` per emitted token. Throws `specdec::error` for a bad prompt or a component failure.
  [[nodiscard]] decode_result generate(std::span<token_id const> prompt,
                                       token_callback const& on_token = {}) {
    decode_result out;
    generate(prompt, out, on_token);
    return out;
  }

  //! As above, into `out` (its buffers are reused). The loop of DESIGN.md section 1: `prefill`,
  //! then per step `propose`, `score`, `verify` and `commit`, each phase timed back to back.
  void generate(std::span<token_id const> prompt, decode_result& out,
                token_callback const& on_token = {}) {
    run(prompt, out, &on_token, nullptr);
  }

  //! As above, reporting each emitted token with its origin (step, depth, drafted or bonus, the
  //! target row that scored it) and each verified step (its tree and the verifier's decision,
  //! before the commit) to `observer`.
  void generate(std::span<token_id const> prompt, decode_result& out,
                request_observer const& observer) {
    run(prompt, out, nullptr, &observer);
  }

  //! The configuration (changes apply from the next request).
  [[nodiscard]] decode_config& config() noexcept { return config_; }
  //! The configuration, read-only.
  [[nodiscard]] decode_config const& config() const noexcept { return config_; }
  //! The owned verifier.
  [[nodiscard]] Verifier& get_verifier() noexcept { return verifier_; }
  //! The owned sampling policy.
  [[nodiscard]] Policy const& policy() const noexcept { return policy_; }

 private:
  void run(std::span<token_id const> prompt, decode_result& out, token_callback const* on_token,
           request_observer const* observer) {
    auto const request_start = std::chrono::steady_clock::now();
    Model& target = *target_;
    std::size_t const budget = node_budget();
    std::size_t const capacity =
        detail::start_request(target, prompt, config_, budget, "speculative_decoder");
    if (tree_.capacity() < budget + 1) tree_.reserve(budget + 1);

    out.stats = request_stats{};
    out.stats.prompt_tokens = prompt.size();
    sink_.begin(config_, prompt, out, on_token, budget, observer);
    on_step_ = observer != nullptr && observer->on_step ? &observer->on_step : nullptr;
    if (sink_.done()) {  // max_new_tokens == 0: no tokens, so no prefill and no proposer call
      out.stats.total_seconds = detail::seconds_since(request_start);
      return;
    }
    philox rng(config_.seed, config_.stream, 0);

    detail::phase_timer timer;
    matrix_view<float const> hidden = prefill(prompt);
    timer.lap(detail::phase::prefill);
    while (!sink_.done()) {
      std::span<token_id const> const committed = sink_.committed();
      std::size_t const base = committed.size() - 1;  // positions in the target cache
      SPECDEC_CHECK(target.cache().size() == base, internal,
                    "speculative_decoder: the target cache", " holds ", target.cache().size(),
                    " positions, expected ", base);
      if (base >= capacity) {
        sink_.context_full();
        break;
      }
      step_stats step;
      propose(committed, std::min(budget, capacity - base - 1), capacity, hidden, rng, step);
      timer.lap(detail::phase::propose);
      score(base);
      timer.lap(detail::phase::score);
      verify(committed, rng);
      timer.lap(detail::phase::verify);
      if (on_step_ != nullptr)
        (*on_step_)(step_event{.step = out.stats.steps, .tree = &tree_, .result = &result_});
      hidden = commit(base, step, out.stats.steps);
      timer.lap(detail::phase::commit);
      out.stats.add(step);
    }
    timer.finish(out.stats, request_start);
  }

  //! The most draft nodes (root excluded) a step scores: the proposer's node budget
  //! (`max_nodes()`) capped by config.max_draft_nodes when set; for a proposer that declares no
  //! budget, config.max_draft_nodes or `default_max_draft_nodes`. Below max_tree_nodes.
  [[nodiscard]] std::size_t node_budget() const {
    std::size_t budget = config_.max_draft_nodes.value_or(default_max_draft_nodes);
    if constexpr (requires(Proposer const& p) {
                    { p.max_nodes() } -> std::convertible_to<std::size_t>;
                  })
      budget = std::min<std::size_t>(proposer_->max_nodes(),
                                     config_.max_draft_nodes.value_or(max_tree_nodes - 1));
    return std::min(budget, max_tree_nodes - 1);
  }

  //! Prefill: the target scores prompt tokens x_1..x_{t-1} in one forward (logits for the last
  //! row only; hidden rows when the proposer reads them); x_t is the first root. Then the proposer
  //! starts the sequence. Returns the hidden rows the first `propose` sees.
  matrix_view<float const> prefill(std::span<token_id const> prompt) {
    target_->cache().truncate(0);
    matrix_view<float const> hidden;
    if (prompt.size() > 1) {
      std::size_t const n = prompt.size() - 1;
      positions_.resize(n);
      for (std::size_t i = 0; i < n; ++i) positions_[i] = static_cast<position_t>(i);
      std::int32_t const last_row = static_cast<std::int32_t>(n - 1);
      forward_request req{.tokens = prompt.first(n),
                          .positions = positions_,
                          .logits_rows = std::span<std::int32_t const>(&last_row, 1)};
      if constexpr (needs_target_hidden_v<Proposer>) request_hidden(req);
      target_->forward(req, fwd_);
      if constexpr (needs_target_hidden_v<Proposer>) hidden = hidden_rows();
    }
    proposer_->begin(prompt);
    return hidden;
  }

  //! Propose: the proposer drafts `tree_` (root = the last committed token) with at most
  //! `max_nodes` nodes, fewer for a chain than the tokens still allowed; an auxiliary proposer
  //! then appends its tokens after the tree. Checks what came back.
  void propose(std::span<token_id const> committed, std::size_t max_nodes, std::size_t capacity,
               matrix_view<float const> hidden, philox& rng, step_stats& step) {
    propose_context ctx;
    ctx.tokens = committed;
    ctx.target_hidden = hidden;
    ctx.max_nodes = max_nodes;
    // A chain deeper than the tokens still allowed cannot be used: a step emits at most its
    // accepted drafts plus one. (A tree's node count is not its depth, so trees keep the bound.)
    if constexpr (!produces_trees_v<Proposer>)
      ctx.max_nodes = std::min(ctx.max_nodes, sink_.remaining() - 1);
    ctx.rng = &rng;
    proposer_->propose(ctx, tree_);
    if constexpr (has_auxiliary_tokens_v<Proposer>) {
      // Auxiliary tokens follow the tree in the same forward (room: the cache's free positions).
      std::size_t const base = committed.size() - 1;
      std::size_t const free = capacity - base;
      std::size_t const room =
          tree_.size() < free ? std::min(free - tree_.size(), max_tree_nodes) : 0;
      aux_.reset(tree_, static_cast<position_t>(base), room, capacity);
      proposer_->auxiliary(ctx, tree_, aux_);
      aux_.finalize();
      step.aux_tokens = aux_.num_aux();
    }
    SPECDEC_CHECK(!tree_.empty() && tree_.root() == committed.back(), invalid_argument,
                  "speculative_decoder: the proposer's tree must have the last committed token ",
                  committed.back(), " as its root");
    SPECDEC_CHECK(tree_.num_drafted() <= ctx.max_nodes, invalid_argument,
                  "speculative_decoder: the proposer drafted ", tree_.num_drafted(),
                  " nodes, more than max_nodes = ", ctx.max_nodes);
    step.tree_size = tree_.num_drafted();
    step.tree_depth = static_cast<std::size_t>(tree_.max_depth());
  }

  //! Score: one target forward over the whole tree (positions base + depth, the tree's ancestor
  //! mask), followed by the auxiliary tokens when there are any; one logits row per node.
  void score(std::size_t base) {
    std::size_t const n = tree_.size();
    positions_.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      positions_[i] = static_cast<position_t>(base) + tree_.depth(static_cast<node_index>(i));
    forward_request req{.tokens = tree_.tokens(),
                        .positions = positions_,
                        .mask = tree_.mask(),
                        .mask_stride = tree_.mask_stride()};
    if constexpr (has_auxiliary_tokens_v<Proposer>) {
      if (aux_.num_aux() > 0) {
        req.tokens = aux_.tokens();
        req.positions = aux_.positions();
        req.mask = aux_.mask();
        req.mask_stride = aux_.mask_stride();
        req.logits_rows = aux_.logits_rows();
      }
    }
    if constexpr (needs_target_hidden_v<Proposer>) request_hidden(req);
    target_->forward(req, fwd_);
  }

  //! The layers whose residual streams the proposer reads (its `target_hidden_layers()`, e.g.
  //! EAGLE-3's), or none: the final hidden state.
  [[nodiscard]] std::span<std::int32_t const> hidden_layers() const {
    if constexpr (requires(Proposer const& p) {
                    {
                      p.target_hidden_layers()
                      } -> std::convertible_to<std::span<std::int32_t const>>;
                  })
      return proposer_->target_hidden_layers();
    else
      return {};
  }

  //! Asks `req` for the hidden rows the proposer reads: the final hidden state, or the residual
  //! streams of its layers.
  void request_hidden(forward_request& req) const {
    req.hidden_layers = hidden_layers();
    req.want_hidden = req.hidden_layers.empty();
  }

  //! The hidden rows of the last forward that the proposer reads ([n, width]).
  [[nodiscard]] matrix_view<float const> hidden_rows() const {
    return hidden_layers().empty() ? fwd_.hidden_view() : fwd_.layer_hidden_view();
  }

  //! The tree's logits rows (auxiliary rows follow them in the forward's result).
  [[nodiscard]] auto tree_logits() const { return fwd_.logits_view().subrows(0, tree_.size()); }

  //! The host row of the target that scored the children of `node`, for token events; empty when
  //! the rows stay on the target's device.
  [[nodiscard]] std::span<float const> origin_row(node_index node) const {
    if constexpr (std::is_same_v<result_type, forward_result>)
      return tree_logits().row(static_cast<std::size_t>(node));
    else
      return {};
  }

  //! Verify: the verifier walks the tree against its rows under the policy and writes the
  //! accepted path and the bonus token into `result_`.
  void verify(std::span<token_id const> committed, philox& rng) {
    // The committed tokens were checked as they were committed (the prompt by check_prompt,
    // the rest by the verifier that produced them).
    verifier_.verify(tree_, tree_logits(), policy_, token_history::checked(committed), rng,
                     result_);
    SPECDEC_CHECK(result_.tokens.size() == result_.accepted_nodes.size() + 1, internal,
                  "speculative_decoder: the verifier returned ", result_.tokens.size(),
                  " tokens for ", result_.accepted_nodes.size(), " accepted nodes");
  }

  //! Commit: the target cache keeps the root and the accepted nodes (`truncate` when they are the
  //! first nodes of a chain, `keep_path` otherwise), the proposer observes and accepts the
  //! outcome, and the accepted tokens and the bonus are emitted one by one through the stop
  //! checks (step `step_index`). Returns the hidden rows of the root and the accepted nodes (for
  //! the next `propose`).
  matrix_view<float const> commit(std::size_t base, step_stats& step, std::size_t step_index) {
    std::size_t const n = tree_.size();
    std::size_t const m = result_.num_accepted();
    bool prefix_of_chain = true;
    for (std::size_t i = 0; i < m; ++i) {
      node_index const a = result_.accepted_nodes[i];
      SPECDEC_CHECK(a > 0 && static_cast<std::size_t>(a) < n &&
                        tree_.depth(a) == static_cast<std::int32_t>(i + 1) &&
                        tree_.parent(a) == (i == 0 ? 0 : result_.accepted_nodes[i - 1]),
                    internal,
                    "speculative_decoder: the verifier's accepted nodes are not a "
                    "root-to-node path (entry ",
                    i, " is node ", a, ")");
      prefix_of_chain = prefix_of_chain && a == static_cast<node_index>(i + 1);
    }
    if (prefix_of_chain) {
      target_->cache().truncate(base + m + 1);
    } else {
      keep_.clear();
      keep_.push_back(0);
      keep_.insert(keep_.end(), result_.accepted_nodes.begin(), result_.accepted_nodes.end());
      target_->cache().keep_path(base, keep_);
    }
    matrix_view<float const> hidden;
    if constexpr (needs_target_hidden_v<Proposer>) hidden = gather_hidden();
    if constexpr (has_auxiliary_tokens_v<Proposer>)
      proposer_->observe(tree_logits(), fwd_.logits_view().subrows(n, aux_.num_aux_logits()),
                         result_);
    proposer_->accept(result_);
    step.accepted = m;
    std::size_t const emitted_before = sink_.emitted();
    for (std::size_t i = 0; i < result_.tokens.size(); ++i) {
      // Token i was scored by the row of its parent: the root, then the accepted nodes.
      node_index const parent = i == 0 ? 0 : result_.accepted_nodes[i - 1];
      detail::token_origin const origin{
          .step = step_index, .depth = i + 1, .drafted = i < m, .logits = origin_row(parent)};
      if (sink_.emit(result_.tokens[i], origin)) break;
    }
    step.emitted = sink_.emitted() - emitted_before;
    return hidden;
  }

  //! Copies the hidden rows of the root and the accepted nodes, in order, into `hidden_`.
  matrix_view<float const> gather_hidden() {
    matrix_view<float const> const all = hidden_rows();
    if (all.empty()) return {};
    std::size_t const h = all.cols();
    std::size_t const rows = result_.num_accepted() + 1;
    hidden_.resize(rows * h);
    for (std::size_t r = 0; r < rows; ++r) {
      std::size_t const node = r == 0 ? 0 : static_cast<std::size_t>(result_.accepted_nodes[r - 1]);
      std::span<float const> const src = all.at_row(node);
      std::copy(src.begin(), src.end(), hidden_.begin() + static_cast<std::ptrdiff_t>(r * h));
    }
    return matrix_view<float const>(hidden_.data(), rows, h);
  }

  Model* target_;
  Proposer* proposer_;
  Verifier verifier_;
  Policy policy_;
  decode_config config_;
  draft_tree tree_;
  result_type fwd_;
  verify_result result_;
  detail::token_sink sink_;
  std::function<void(step_event const&)> const* on_step_ = nullptr;  //!< this request's observer
  std::vector<position_t> positions_;
  std::vector<std::int32_t> keep_;
  std::vector<float> hidden_;
  auxiliary_batch aux_;  //!< tree + auxiliary tokens (auxiliary_proposer only)
};

}  // namespace specdec
