#pragma once
//! \file
//! `autoregressive_decoder`: the plain baseline, one target forward per token, through the same
//! model interface, sampling policy, stop conditions, statistics and streaming callback as
//! `speculative_decoder`.
//!
//! The prefill is the same (x_1..x_{t-1} in one forward), then each step scores the last committed
//! token alone and draws the next one from the policy's distribution of that row. Randomness: the
//! request's Philox stream (config.seed, config.stream) from word 0; a sampled token reads exactly
//! one word; a greedy step reads none but advances the stream by one word, as a verifier does for a
//! one-node tree. So a speculative decoder whose proposer drafts nothing consumes the stream
//! exactly as this baseline does and emits the same tokens for the same seed. A request with
//! `max_new_tokens` = 0 returns at once, with no tokens and `finish_reason::max_tokens`, without a
//! forward (the prompt is still checked).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/stats.hpp"
#include "specdec/core/types.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/decode/detail/phase_timer.hpp"

namespace specdec {

//! Plain autoregressive decoding of one sequence (see the file comment). `config.max_draft_nodes`
//! is ignored. Statistics: one step per emitted-token forward, `drafted` and `accepted` stay 0,
//! `score_seconds` is the forward time, `verify_seconds` the sampling time.
//! \tparam Model  a `causal_lm`, held by reference; its cache is reset per request.
//! \tparam Policy a `sampling_policy`, owned.
template <causal_lm Model, sampling_policy Policy>
class autoregressive_decoder {
 public:
  using model_type = Model;    //!< the model
  using policy_type = Policy;  //!< the sampling policy

  //! A decoder over `model` (which must outlive it). Throws `errc::invalid_argument` for a bad
  //! configuration.
  autoregressive_decoder(Model& model, Policy policy, decode_config config = {})
      : model_(&model), policy_(std::move(policy)), config_(std::move(config)) {
    config_.validate(model.vocab_size());
    probs_.resize(model.vocab_size());
  }

  //! Generates from `prompt`, calling `on_token` per emitted token.
  [[nodiscard]] decode_result generate(std::span<token_id const> prompt,
                                       token_callback const& on_token = {}) {
    decode_result out;
    generate(prompt, out, on_token);
    return out;
  }

  //! As above, into `out` (its buffers are reused).
  void generate(std::span<token_id const> prompt, decode_result& out,
                token_callback const& on_token = {}) {
    run(prompt, out, &on_token, nullptr);
  }

  //! As above, reporting each emitted token with its origin to `observer` (each is a bonus token
  //! at depth 1 of its own step; `on_step` is not called).
  void generate(std::span<token_id const> prompt, decode_result& out,
                request_observer const& observer) {
    run(prompt, out, nullptr, &observer);
  }

  //! The configuration (changes apply from the next request).
  [[nodiscard]] decode_config& config() noexcept { return config_; }
  //! The configuration, read-only.
  [[nodiscard]] decode_config const& config() const noexcept { return config_; }
  //! The owned sampling policy.
  [[nodiscard]] Policy const& policy() const noexcept { return policy_; }

 private:
  void run(std::span<token_id const> prompt, decode_result& out, token_callback const* on_token,
           request_observer const* observer) {
    auto const request_start = std::chrono::steady_clock::now();
    Model& model = *model_;
    std::size_t const vocab = model.vocab_size();
    std::size_t const capacity =
        detail::start_request(model, prompt, config_, 0, "autoregressive_decoder");
    auto&& policy = policy_for_prompt(policy_, prompt.size());

    out.stats = request_stats{};
    out.stats.prompt_tokens = prompt.size();
    sink_.begin(config_, prompt, out, on_token, 0, observer);
    if (sink_.done()) {  // max_new_tokens == 0: no tokens, so no prefill
      out.stats.total_seconds = detail::seconds_since(request_start);
      return;
    }
    philox rng(config_.seed, config_.stream, 0);
    model.cache().truncate(0);

    detail::phase_timer timer;  // phases timed back to back (see speculative_decoder)
    if (prompt.size() > 1) {
      std::size_t const n = prompt.size() - 1;
      positions_.resize(n);
      for (std::size_t i = 0; i < n; ++i) positions_[i] = static_cast<position_t>(i);
      std::int32_t const last_row = static_cast<std::int32_t>(n - 1);
      forward_request const req{.tokens = prompt.first(n),
                                .positions = positions_,
                                .logits_rows = std::span<std::int32_t const>(&last_row, 1)};
      model.forward(req, fwd_);
    }
    timer.lap(detail::phase::prefill);

    positions_.resize(1);
    while (!sink_.done()) {
      std::span<token_id const> const committed = sink_.committed();
      std::size_t const base = committed.size() - 1;
      SPECDEC_CHECK(model.cache().size() == base, internal, "autoregressive_decoder: the cache ",
                    "holds ", model.cache().size(), " positions, expected ", base);
      if (base >= capacity) {
        sink_.context_full();
        break;
      }
      step_stats step;
      positions_[0] = static_cast<position_t>(base);
      forward_request const req{.tokens = committed.last(1), .positions = positions_};
      model.forward(req, fwd_);
      timer.lap(detail::phase::score);

      std::span<float const> const row = fwd_.logits_view().at_row(0);
      token_id next = no_token;
      if (policy.is_greedy()) {
        next = policy.greedy_token(row, token_history::checked(committed));
        rng.skip(1);
      } else {
        // The committed tokens were checked as they were committed (the prompt by check_prompt,
        // each drawn token below).
        policy.distribution(row, token_history::checked(committed), probs_);
        next = policy.sample(std::span<float const>(probs_), rng);
      }
      SPECDEC_CHECK(next >= 0 && static_cast<std::size_t>(next) < vocab, out_of_range,
                    "autoregressive_decoder: the policy produced token ", next,
                    " outside the vocabulary of ", vocab);
      timer.lap(detail::phase::verify);

      std::size_t const emitted_before = sink_.emitted();
      (void)sink_.emit(next,
                       {.step = out.stats.steps, .depth = 1, .drafted = false, .logits = row});
      step.emitted = sink_.emitted() - emitted_before;
      timer.lap(detail::phase::commit);
      out.stats.add(step);
    }
    timer.finish(out.stats, request_start);
    detail::check_output_complete(policy, out);
  }

  Model* model_;
  Policy policy_;
  decode_config config_;
  forward_result fwd_;
  detail::token_sink sink_;
  std::vector<position_t> positions_;
  std::vector<float> probs_;
};

}  // namespace specdec
