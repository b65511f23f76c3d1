#pragma once
//! \file
//! `speculative_decoder`: the propose -> score -> verify -> commit loop for one sequence, generic
//! over the target model, the proposer, the verifier and the sampling policy.
//!
//! One request (`generate`): the target scores prompt tokens x_1..x_{t-1} in one forward (logits
//! for the last row only; hidden rows only when the proposer reads them) and the proposer starts
//! the sequence; x_t is the root of the first draft tree, so the first generated token is already
//! speculated. Then, until a stop, the phases of `sequence_step` (decode/sequence.hpp, the one
//! home of the step): the draft limit, propose (and the auxiliary tokens of an
//! `auxiliary_proposer`), one target forward over the draft, verify, commit.
//! How many of its draft limit a step drafts is the `speculation_policy`'s choice, as in
//! `batch_decoder` (decode/speculation.hpp): `fixed_speculation` (the default) drafts the whole
//! limit every step; `adaptive_speculation` what maximises the expected committed tokens per second
//! from the target's measured forward cost and the sequence's acceptance (`acceptance_estimator`),
//! down to no draft at all (an autoregressive step) where speculation cannot pay.
//! A request with `max_new_tokens` = 0 returns at once, with no tokens and
//! `finish_reason::max_tokens`: no prefill, no proposer call (the prompt is still checked).
//! The request's randomness is one Philox stream (config.seed, config.stream) starting at word 0.
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
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

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
#include "specdec/decode/sequence.hpp"
#include "specdec/decode/speculation.hpp"

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

//! Speculative decoding of one sequence at a time: the loop of `sequence_step` (see the file
//! comment).
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
//! \tparam Speculation a `speculation_policy`; owned: each step's draft length within the limit
//!                  (its `prepare(target)`, when it has one, runs before the first request; it
//!                  keeps what it learns across requests).
//! Pairings that cannot work are rejected at compile time (see `compatible_v`).
//! Not thread-safe: one request at a time per decoder.
template <causal_lm Model, proposer Proposer, class Verifier, sampling_policy Policy,
          speculation_policy Speculation = fixed_speculation>
requires verifier<Verifier, Policy>
class speculative_decoder {
  static_assert(detail::pairing_checks<Model, Proposer, Verifier>::ok);
  static_assert(!has_auxiliary_tokens_v<Proposer> || auxiliary_proposer<Proposer>,
                "speculative_decoder: this proposer declares has_auxiliary_tokens but lacks "
                "auxiliary(ctx, tree, aux) or observe(tree_logits, aux_logits, result)");

 public:
  using model_type = Model;              //!< the target model
  using proposer_type = Proposer;        //!< the drafting strategy
  using verifier_type = Verifier;        //!< the acceptance rule
  using policy_type = Policy;            //!< the sampling policy
  using speculation_type = Speculation;  //!< the draft-length policy
  //! What the target's forward fills: `forward_result` (host rows), or the model's device result
  //! (see the file comment).
  using result_type = detail::step_result_t<Model, Proposer, Verifier, Policy>;

  //! A decoder scoring drafts of `proposer` with `target`, each step's draft length chosen by
  //! `speculation` from the acceptance estimates of `acceptance`. `target` and `proposer` must
  //! outlive the decoder. Throws `errc::invalid_argument` for a bad configuration.
  speculative_decoder(Model& target, Proposer& proposer, Verifier verifier, Policy policy,
                      decode_config config = {}, Speculation speculation = {},
                      acceptance_options acceptance = {})
      : target_(&target),
        proposer_(&proposer),
        verifier_(std::move(verifier)),
        policy_(std::move(policy)),
        config_(std::move(config)),
        speculation_(std::move(speculation)),
        acceptance_((acceptance.validate("speculative_decoder"), acceptance)) {
    config_.validate(target.vocab_size());
  }

  //! Generates from `prompt` (every token < vocab, at least one, fitting the context), calling
  //! `on_token` per emitted token. Throws `specdec::error` for a bad prompt or a component failure.
  [[nodiscard]] decode_result generate(std::span<token_id const> prompt,
                                       token_callback const& on_token = {}) {
    decode_result out;
    generate(prompt, out, on_token);
    return out;
  }

  //! As above, into `out` (its buffers are reused). The loop: `prefill`,
  //! then per step `propose`, `score`, `verify` and `commit`, each phase timed back to back.
  void generate(std::span<token_id const> prompt, decode_result& out,
                token_callback const& on_token = {}) {
    run(prompt, config_, policy_, out, &on_token, nullptr);
  }

  //! As above, reporting each emitted token with its origin (step, depth, drafted or bonus, the
  //! target row that scored it) and each verified step (its tree and the verifier's decision,
  //! before the commit) to `observer`.
  void generate(std::span<token_id const> prompt, decode_result& out,
                request_observer const& observer) {
    run(prompt, config_, policy_, out, nullptr, &observer);
  }

  //! One request with settings of its own: `config` (seed and stream, max_new_tokens, stops, node
  //! cap) and `policy` stand for the decoder's for this call only, so that one decoder (per
  //! worker) serves requests of any seeds and sampling parameters, one at a time. Throws as the
  //! other overloads, and `errc::invalid_argument` for a configuration that cannot work.
  void generate(std::span<token_id const> prompt, decode_config const& config, Policy const& policy,
                decode_result& out, token_callback const& on_token = {}) {
    run(prompt, config, policy, out, &on_token, nullptr);
  }

  //! The configuration (changes apply from the next request).
  [[nodiscard]] decode_config& config() noexcept { return config_; }
  //! The configuration, read-only.
  [[nodiscard]] decode_config const& config() const noexcept { return config_; }
  //! The owned verifier.
  [[nodiscard]] Verifier& get_verifier() noexcept { return verifier_; }
  //! The owned sampling policy.
  [[nodiscard]] Policy const& policy() const noexcept { return policy_; }
  //! The owned draft-length policy (what it learnt persists across requests).
  [[nodiscard]] Speculation& speculation() noexcept { return speculation_; }

 private:
  static constexpr char const* who = "speculative_decoder";

  // The phases of `sequence_step`, in order, each timed back to back.
  void run(std::span<token_id const> prompt, decode_config const& config, Policy const& policy,
           decode_result& out, token_callback const* on_token, request_observer const* observer) {
    Model& target = *target_;
    if (!prepared_) {  // before the request's clock starts
      if constexpr (requires(Speculation & s, Model & m) { s.prepare(m); })
        speculation_.prepare(target);
      prepared_ = true;
    }
    auto const request_start = std::chrono::steady_clock::now();
    auto&& request_policy = policy_for_prompt(policy, prompt.size());
    std::size_t const budget = node_budget(*proposer_, config);
    std::size_t const capacity = detail::start_request(target, prompt, config, budget, who);
    step_.begin(prompt, config, budget, capacity, out, on_token, observer,
                target_hidden_layers(*proposer_));
    if constexpr (uses_target_v<Proposer>) step_.bind_target(target_handle(target));
    auto const* on_step = observer != nullptr && observer->on_step ? &observer->on_step : nullptr;
    if (step_.done()) {  // max_new_tokens == 0: no tokens, so no prefill and no proposer call
      out.stats.total_seconds = detail::seconds_since(request_start);
      return;
    }

    detail::phase_timer timer;
    target.cache().truncate(0);
    if (step_.prompt_rows() > 0) {
      target.forward(step_.prefill_request(), prefill_);
      step_.prefilled(hidden_rows(prefill_));
    }
    proposer_->begin(prompt);
    timer.lap(detail::phase::prefill);
    acceptance_estimator::counts seen;  // this request's acceptance evidence
    while (!step_.done()) {
      auto const step_start = std::chrono::steady_clock::now();
      std::optional<std::size_t> const limit = step_.draft_limit();
      if (!limit) break;
      speculation_request const wanted = acceptance_.request(seen, 0, *limit, 1);
      acceptance_.decay(seen);
      acceptance_.decay_all();
      std::size_t k = 0;
      speculation_.choose(std::span<speculation_request const>(&wanted, 1),
                          std::span<std::size_t>(&k, 1));
      k = std::min(k, *limit);
      propose_context const ctx = step_.context(k);
      proposer_->propose(ctx, step_.tree());
      step_.end_propose();
      if constexpr (has_auxiliary_tokens_v<Proposer>)
        step_.auxiliary(
            [&](auxiliary_batch& aux) { proposer_->auxiliary(ctx, step_.tree(), aux); });
      step_.check_draft(k, who);
      timer.lap(detail::phase::propose);
      auto const score_start = std::chrono::steady_clock::now();
      forward_request const& req = step_.request();
      std::size_t const rows = req.tokens.size();
      target.forward(req, fwd_);
      timer.lap(detail::phase::score);
      auto const score_end = std::chrono::steady_clock::now();
      step_.verify(verifier_, tree_logits(), request_policy, who);
      timer.lap(detail::phase::verify);
      if (on_step != nullptr)
        (*on_step)(
            step_event{.step = out.stats.steps, .tree = &step_.tree(), .result = &step_.result()});
      step_stats const& done = step_.commit(
          target.cache(), host_rows(), hidden_rows(fwd_),
          [&] {
            if constexpr (has_auxiliary_tokens_v<Proposer>)
              proposer_->observe(
                  tree_logits(),
                  fwd_.logits_view().subrows(step_.tree().size(), step_.aux().num_aux_logits()),
                  step_.result());
            proposer_->accept(step_.result());
          },
          who);
      timer.lap(detail::phase::commit);
      acceptance_.record(seen, done.accepted, done.tree_depth);
      double const propose_seconds =
          std::chrono::duration<double>(score_start - step_start).count();
      double const forward_seconds = std::chrono::duration<double>(score_end - score_start).count();
      speculation_.observe(step_cost{
          .requests = 1,
          .rows = rows,
          .drafted = done.tree_size,
          .forward_seconds = forward_seconds,
          .propose_seconds = propose_seconds,
          .remaining_seconds = std::max(
              0.0, detail::seconds_since(step_start) - forward_seconds - propose_seconds)});
    }
    timer.finish(out.stats, request_start);
    detail::check_output_complete(request_policy, out);
  }

  //! The hidden rows of a forward that the proposer reads ([n, width]; empty when it reads none).
  template <class Result>
  [[nodiscard]] matrix_view<float const> hidden_rows(Result const& r) const {
    if constexpr (needs_target_hidden_v<Proposer>)
      return target_hidden_layers(*proposer_).empty() ? r.hidden_view() : r.layer_hidden_view();
    else
      return {};
  }

  //! The tree's logits rows (auxiliary rows follow them in the forward's result).
  [[nodiscard]] auto tree_logits() const {
    return fwd_.logits_view().subrows(0, step_.tree().size());
  }

  //! The tree's host rows, for token events; empty when the rows stay on the target's device.
  [[nodiscard]] matrix_view<float const> host_rows() const {
    if constexpr (std::is_same_v<result_type, forward_result>)
      return tree_logits();
    else
      return {};
  }

  Model* target_;
  Proposer* proposer_;
  Verifier verifier_;
  Policy policy_;
  decode_config config_;
  Speculation speculation_;
  acceptance_estimator acceptance_;
  bool prepared_ = false;
  sequence_step<Proposer> step_;
  result_type fwd_;
  forward_result prefill_;
};

}  // namespace specdec
