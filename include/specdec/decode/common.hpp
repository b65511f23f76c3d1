#pragma once
//! \file
//! What the speculative decoder and the autoregressive baseline share: their configuration, the
//! stop conditions, the streaming callbacks and the result of one request.
//!
//! Stops are checked token by token, in commit order, so a speculative step that commits several
//! tokens stops exactly where plain decoding would have stopped:
//! - an end-of-sequence token (any of `decode_config::eos_tokens`: a model family's end-of-text
//!   set, e.g. `tokenizer::end_of_text()`), not emitted unless `emit_eos`;
//! - a stop token sequence (`stop_sequences`) or a stop string (`stop_strings`, matched in the
//!   generated text through the caller's `piece` function, so the decoder needs no tokenizer): the
//!   token that completes the match is emitted, then generation stops;
//! - `max_new_tokens` emitted tokens;
//! - the model's context: when the cache cannot take one more position the request ends cleanly
//!   with `finish_reason::context_full`, never with an overflow;
//! - the streaming callback returning false (after the token it was given is emitted).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/stats.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"

namespace specdec {

//! Why a request ended.
enum class finish_reason {
  max_tokens,     //!< `max_new_tokens` tokens were emitted
  eos,            //!< an end-of-sequence token (`decode_config::eos_tokens`) was produced
  stop_sequence,  //!< the generated tokens ended with one of `decode_config::stop_sequences`
  stop_string,    //!< the generated text contains one of `decode_config::stop_strings`
  context_full,   //!< the model's context cannot take another token
  cancelled,      //!< the streaming callback returned false (or the request was cancelled)
  failed,         //!< the request failed alone in a batch (`batch_result::error` says why)
  //! `max_new_tokens` or the context ended an output whose constraint (a constrained policy,
  //! sampling/constraint.hpp) was not complete: the output is a valid beginning, not a match
  constraint_incomplete,
};

//! A short name for a finish reason, e.g. "eos".
[[nodiscard]] constexpr std::string_view to_string(finish_reason reason) noexcept {
  switch (reason) {
    case finish_reason::max_tokens:
      return "max_tokens";
    case finish_reason::eos:
      return "eos";
    case finish_reason::stop_sequence:
      return "stop_sequence";
    case finish_reason::stop_string:
      return "stop_string";
    case finish_reason::context_full:
      return "context_full";
    case finish_reason::cancelled:
      return "cancelled";
    case finish_reason::failed:
      return "failed";
    case finish_reason::constraint_incomplete:
      return "constraint_incomplete";
  }
  return "unknown";
}

//! The text of `token` when it follows `previous` (a tokenizer's `decode(previous, token)`; the
//! previous token matters for tokenizers that drop a leading space after BOS). Used only to match
//! stop strings.
using piece_function = std::function<std::string(token_id previous, token_id token)>;

//! Called once per emitted token, in order, as soon as it is committed; returning false stops the
//! request after that token (`finish_reason::cancelled`).
using token_callback = std::function<bool(token_id token)>;

//! One emitted token and where it came from, as a `request_observer` sees it.
struct token_event {
  token_id token = no_token;  //!< the token
  std::size_t index = 0;      //!< its index among the generated tokens (0 = the first)
  std::size_t step = 0;  //!< the decode step that committed it (0 = the first after the prefill)
  //! Its depth below the step's root: an accepted draft token at depth d has d (1 = the root's
  //! child), the step's bonus token has the accepted length + 1 (1 when nothing was accepted,
  //! and always 1 for the autoregressive baseline).
  std::size_t depth = 1;
  bool drafted = false;  //!< an accepted draft token; false for the step's bonus token
  //! [vocab] the target's logits row that scored the token (the row of its parent node, before
  //! any sampling parameter), valid during the call only; empty when the decoder keeps the rows
  //! on the target's device (speculative_decoder.hpp).
  std::span<float const> logits;
};

//! One verified step of the speculative decoder, as a `request_observer` sees it: the draft
//! tree that was scored and the verifier's decision, before the commit.
struct step_event {
  std::size_t step = 0;                   //!< the step (0 = the first after the prefill)
  draft_tree const* tree = nullptr;       //!< the scored draft (root = the last committed token)
  verify_result const* result = nullptr;  //!< the accepted path and the bonus token
};

//! What a caller observes of one request: each emitted token with its origin, and each verified
//! step. Either may be empty. `on_token` returning false stops the request after that token, as
//! a `token_callback` does; `on_step` is called by the speculative decoder only (the baseline
//! drafts nothing).
struct request_observer {
  std::function<bool(token_event const&)> on_token;  //!< per emitted token, or empty
  std::function<void(step_event const&)> on_step;    //!< per verified step, or empty
};

//! The per-step node budget of a proposer that declares none (no `max_nodes()`) when
//! `decode_config::max_draft_nodes` is unset.
inline constexpr std::size_t default_max_draft_nodes = 64;

//! Configuration of one decoder (shared by all its requests).
struct decode_config {
  //! Most tokens to emit after the prompt (0: a request returns at once, without running the
  //! model, with `finish_reason::max_tokens`).
  std::size_t max_new_tokens = 128;
  //! The end-of-sequence tokens: generation stops at any of them (a model family's end-of-text
  //! set, e.g. `tokenizer::end_of_text()`: llama2.c models end a text with BOS as well as EOS).
  //! Empty for none.
  std::vector<token_id> eos_tokens;
  //! Whether an end-of-sequence token is emitted (appended and streamed) before stopping.
  bool emit_eos = false;
  //! Token sequences that end generation once the generated tokens end with one of them (the
  //! completing token is emitted). Matched against the generated tokens only, not the prompt.
  std::vector<std::vector<token_id>> stop_sequences;
  //! Strings that end generation once the generated text contains one of them (the token that
  //! completes it is emitted). Requires `piece`.
  std::vector<std::string> stop_strings;
  //! Turns tokens into text for `stop_strings`.
  piece_function piece;
  //! An optional upper cap on the draft nodes (root excluded) scored per step, in
  //! [0, max_tree_nodes - 1]. The speculative decoder's per-step budget is the proposer's own
  //! (`max_nodes()`: the most nodes its tree can hold under its configuration), capped by this
  //! when set; a proposer that declares no `max_nodes()` gets this, or `default_max_draft_nodes`
  //! when unset. Ignored by the autoregressive baseline.
  std::optional<std::size_t> max_draft_nodes;
  //! Seed of the request's Philox stream (each request starts at word 0 of `stream`).
  std::uint64_t seed = 0;
  //! Philox stream of each request.
  std::uint64_t stream = 0;

  //! Throws `errc::invalid_argument` (naming the field) when the configuration cannot work with a
  //! vocabulary of `vocab` tokens.
  void validate(std::size_t vocab) const {
    for (std::size_t i = 0; i < eos_tokens.size(); ++i)
      SPECDEC_CHECK(eos_tokens[i] >= 0 && static_cast<std::size_t>(eos_tokens[i]) < vocab,
                    invalid_argument, "decode_config: eos_tokens[", i, "] = ", eos_tokens[i],
                    " is outside the vocabulary of ", vocab);
    SPECDEC_CHECK(!max_draft_nodes || *max_draft_nodes < max_tree_nodes, invalid_argument,
                  "decode_config: max_draft_nodes ", max_draft_nodes.value_or(0), " must be below ",
                  max_tree_nodes);
    for (std::size_t i = 0; i < stop_sequences.size(); ++i) {
      SPECDEC_CHECK(!stop_sequences[i].empty(), invalid_argument, "decode_config: stop_sequences[",
                    i, "] is empty");
      for (token_id t : stop_sequences[i])
        SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < vocab, invalid_argument,
                      "decode_config: stop_sequences[", i, "] holds token ", t,
                      ", outside the vocabulary of ", vocab);
    }
    for (std::size_t i = 0; i < stop_strings.size(); ++i)
      SPECDEC_CHECK(!stop_strings[i].empty(), invalid_argument, "decode_config: stop_strings[", i,
                    "] is empty");
    SPECDEC_CHECK(stop_strings.empty() || static_cast<bool>(piece), invalid_argument,
                  "decode_config: stop_strings are set but no piece function turns tokens into "
                  "text");
  }
};

//! The outcome of one request.
struct decode_result {
  std::vector<token_id> tokens;  //!< [generated] the emitted tokens, prompt excluded
  finish_reason reason = finish_reason::max_tokens;  //!< why generation ended
  //! Index into `stop_sequences` or `stop_strings` of the stop that matched (when `reason` is
  //! stop_sequence or stop_string; 0 otherwise).
  std::size_t stop_index = 0;
  request_stats stats;  //!< what happened, step by step, summed (see core/stats.hpp)
};

namespace detail {

//! Where an emitted token came from (see `token_event`).
struct token_origin {
  std::size_t step = 0;           //!< the decode step
  std::size_t depth = 1;          //!< the depth below the step's root
  bool drafted = false;           //!< an accepted draft token (else the bonus)
  std::span<float const> logits;  //!< the target row that scored it (empty: on the device)
};

//! Emits tokens one at a time and decides when a request stops. Owns the committed sequence
//! (prompt + emitted tokens), which is the history the proposers and verifiers see.
class token_sink {
 public:
  //! Starts a request: `committed` becomes the prompt; `out` is cleared. Reserves room for
  //! `extra` tokens beyond the prompt and `max_new_tokens` so that emitting does not allocate.
  //! Each emitted token goes to `on_token` and to `observer->on_token` (either may be null or
  //! empty).
  void begin(decode_config const& config, std::span<token_id const> prompt, decode_result& out,
             token_callback const* on_token, std::size_t extra,
             request_observer const* observer = nullptr) {
    config_ = &config;
    out_ = &out;
    on_token_ = on_token != nullptr && *on_token ? on_token : nullptr;
    on_event_ = observer != nullptr && observer->on_token ? &observer->on_token : nullptr;
    out.tokens.clear();
    out.reason = finish_reason::max_tokens;
    out.stop_index = 0;
    committed_.clear();
    committed_.reserve(prompt.size() + config.max_new_tokens + extra + 1);
    committed_.assign(prompt.begin(), prompt.end());
    out.tokens.reserve(config.max_new_tokens + extra + 1);
    text_.clear();
    max_stop_chars_ = 0;
    for (auto const& s : config.stop_strings) max_stop_chars_ = std::max(max_stop_chars_, s.size());
    done_ = config.max_new_tokens == 0;
  }

  //! Emits `token` (unless it is an EOS that is not emitted), which came from `origin`, and
  //! returns true when the request is over. Must not be called after it returned true.
  bool emit(token_id token, token_origin const& origin = {}) {
    decode_config const& c = *config_;
    token_id const previous = committed_.empty() ? no_token : committed_.back();
    if (is_eos(token)) {
      if (c.emit_eos) {
        push(token);
        (void)notify(token, origin);
      }
      out_->reason = finish_reason::eos;
      return done_ = true;
    }
    push(token);
    bool stop = false;
    if (match_sequences()) stop = true;
    if (!stop && !c.stop_strings.empty() && match_strings(previous, token)) stop = true;
    if (!notify(token, origin) && !stop) {
      out_->reason = finish_reason::cancelled;
      stop = true;
    }
    if (!stop && out_->tokens.size() >= c.max_new_tokens) {
      out_->reason = finish_reason::max_tokens;
      stop = true;
    }
    return done_ = stop;
  }

  //! Ends the request for a lack of context.
  void context_full() noexcept {
    out_->reason = finish_reason::context_full;
    done_ = true;
  }

  //! Whether the request is over.
  [[nodiscard]] bool done() const noexcept { return done_; }
  //! [prompt + emitted] every committed token, the last one is the next root.
  [[nodiscard]] std::span<token_id const> committed() const noexcept { return committed_; }
  //! Number of tokens emitted so far.
  [[nodiscard]] std::size_t emitted() const noexcept { return out_->tokens.size(); }
  //! Tokens that may still be emitted before `max_new_tokens`.
  [[nodiscard]] std::size_t remaining() const noexcept {
    return config_->max_new_tokens - std::min(config_->max_new_tokens, out_->tokens.size());
  }

 private:
  void push(token_id token) {
    committed_.push_back(token);
    out_->tokens.push_back(token);
  }

  [[nodiscard]] bool is_eos(token_id token) const noexcept {
    for (token_id e : config_->eos_tokens)
      if (token == e) return true;
    return false;
  }

  //! Passes the pushed `token` to the callbacks; false when one of them cancels.
  bool notify(token_id token, token_origin const& origin) {
    bool go_on = true;
    if (on_token_ != nullptr) go_on = (*on_token_)(token);
    if (on_event_ != nullptr) {
      token_event const e{.token = token,
                          .index = out_->tokens.size() - 1,
                          .step = origin.step,
                          .depth = origin.depth,
                          .drafted = origin.drafted,
                          .logits = origin.logits};
      go_on = (*on_event_)(e) && go_on;
    }
    return go_on;
  }

  bool match_sequences() {
    auto const& seqs = config_->stop_sequences;
    std::span<token_id const> const gen = out_->tokens;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      auto const& s = seqs[i];
      if (s.size() > gen.size()) continue;
      if (std::equal(s.begin(), s.end(), gen.end() - static_cast<std::ptrdiff_t>(s.size()))) {
        out_->reason = finish_reason::stop_sequence;
        out_->stop_index = i;
        return true;
      }
    }
    return false;
  }

  bool match_strings(token_id previous, token_id token) {
    std::size_t const old_size = text_.size();
    text_ += config_->piece(previous, token);
    auto const& strs = config_->stop_strings;
    for (std::size_t i = 0; i < strs.size(); ++i) {
      std::size_t const from = old_size >= strs[i].size() - 1 ? old_size - (strs[i].size() - 1) : 0;
      if (text_.find(strs[i], from) != std::string::npos) {
        out_->reason = finish_reason::stop_string;
        out_->stop_index = i;
        return true;
      }
    }
    // Keep only the tail that a future match could still overlap.
    if (text_.size() > 4 * max_stop_chars_ + 64)
      text_.erase(0, text_.size() - (max_stop_chars_ - 1));
    return false;
  }

  decode_config const* config_ = nullptr;
  decode_result* out_ = nullptr;
  token_callback const* on_token_ = nullptr;
  std::function<bool(token_event const&)> const* on_event_ = nullptr;
  std::vector<token_id> committed_;
  std::string text_;
  std::size_t max_stop_chars_ = 0;
  bool done_ = false;
};

//! The positions the target cache can hold: the smaller of the model's context and the cache's
//! capacity.
template <class Model>
[[nodiscard]] std::size_t context_capacity(Model& model) {
  return std::min<std::size_t>(model.max_context(), model.cache().capacity());
}

//! Checks a prompt for a model of `vocab` tokens and `capacity` positions.
inline void check_prompt(std::span<token_id const> prompt, std::size_t vocab, std::size_t capacity,
                         char const* where) {
  SPECDEC_CHECK(!prompt.empty(), invalid_argument, where,
                ": the prompt is empty (it needs at least one token, e.g. BOS)");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    SPECDEC_CHECK(prompt[i] >= 0 && static_cast<std::size_t>(prompt[i]) < vocab, out_of_range,
                  where, ": prompt token ", prompt[i], " at index ", i,
                  " is outside the vocabulary of ", vocab);
  SPECDEC_CHECK(prompt.size() <= capacity, context_overflow, where, ": a prompt of ", prompt.size(),
                " tokens does not fit the context of ", capacity, " positions");
}

//! Makes room for `positions` positions in `model` when it can do so ahead of its forwards (a
//! `reserve(positions)` member, as `cpu_llama` has: its cache grows on demand, and reserving
//! checks the memory a request needs before it starts). Models without one are left as they are.
template <class Model>
void reserve_context(Model& model, std::size_t positions) {
  if constexpr (requires(Model & m, std::size_t n) { m.reserve(n); }) model.reserve(positions);
}

//! What a decoder checks when a request starts: the prompt against the model's vocabulary and the
//! positions its cache can hold, and the configuration (which may have been edited since the
//! decoder was built); then it reserves the positions the request can use (the prompt,
//! `max_new_tokens` and `extra` scored beyond them, within the capacity: `reserve_context`).
//! Returns the capacity. `who` names the decoder in errors.
template <class Model>
[[nodiscard]] std::size_t start_request(Model& model, std::span<token_id const> prompt,
                                        decode_config const& config, std::size_t extra,
                                        char const* who) {
  std::size_t const capacity = context_capacity(model);
  check_prompt(prompt, model.vocab_size(), capacity, who);
  config.validate(model.vocab_size());
  if (config.max_new_tokens > 0) {
    std::size_t const room = capacity - prompt.size();
    std::size_t const wanted = std::min(room, config.max_new_tokens) + std::min(room, extra);
    reserve_context(model, prompt.size() + std::min(room, wanted));
  }
  return capacity;
}

}  // namespace detail
namespace detail {

//! At the end of a request: when `policy` constrains the output (`output_complete`, e.g.
//! `constrained`) and `max_new_tokens` or the context ended it before the constraint was
//! complete, the reason becomes `finish_reason::constraint_incomplete`. Every driver calls it.
template <class Policy>
void check_output_complete(Policy const& policy, decode_result& out) {
  if constexpr (requires {
                  { policy.output_complete(std::span<token_id const>()) } -> std::same_as<bool>;
                }) {
    if ((out.reason == finish_reason::max_tokens || out.reason == finish_reason::context_full) &&
        !policy.output_complete(out.tokens))
      out.reason = finish_reason::constraint_incomplete;
  }
}

}  // namespace detail

}  // namespace specdec
