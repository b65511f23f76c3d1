#pragma once
//! \file
//! What the speculative decoder and the autoregressive baseline share: their configuration, the
//! stop conditions, the streaming callback and the result of one request.
//!
//! Stops are checked token by token, in commit order, so a speculative step that commits several
//! tokens stops exactly where plain decoding would have stopped:
//! - the end-of-sequence token (`decode_config::eos_token`), not emitted unless `emit_eos`;
//! - a stop token sequence (`stop_sequences`) or a stop string (`stop_strings`, matched in the
//!   generated text through the caller's `piece` function, so the decoder needs no tokenizer): the
//!   token that completes the match is emitted, then generation stops;
//! - `max_new_tokens` emitted tokens;
//! - the model's context: when the cache cannot take one more position the request ends cleanly
//!   with `finish_reason::context_full`, never with an overflow;
//! - the streaming callback returning false (after the token it was given is emitted).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/stats.hpp"
#include "specdec/core/types.hpp"

namespace specdec {

//! Why a request ended.
enum class finish_reason {
  max_tokens,     //!< `max_new_tokens` tokens were emitted
  eos,            //!< the end-of-sequence token was produced
  stop_sequence,  //!< the generated tokens ended with one of `decode_config::stop_sequences`
  stop_string,    //!< the generated text contains one of `decode_config::stop_strings`
  context_full,   //!< the model's context cannot take another token
  cancelled,      //!< the streaming callback returned false
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

//! The per-step node budget of a proposer that declares none (no `max_nodes()`) when
//! `decode_config::max_draft_nodes` is unset.
inline constexpr std::size_t default_max_draft_nodes = 64;

//! Configuration of one decoder (shared by all its requests).
struct decode_config {
  //! Most tokens to emit after the prompt (0: a request returns at once, without running the
  //! model, with `finish_reason::max_tokens`).
  std::size_t max_new_tokens = 128;
  //! The end-of-sequence token, or `no_token` for none.
  token_id eos_token = no_token;
  //! Whether the end-of-sequence token is emitted (appended and streamed) before stopping.
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
    SPECDEC_CHECK(
        eos_token == no_token || (eos_token >= 0 && static_cast<std::size_t>(eos_token) < vocab),
        invalid_argument, "decode_config: eos_token ", eos_token, " is outside the vocabulary of ",
        vocab);
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

//! Emits tokens one at a time and decides when a request stops. Owns the committed sequence
//! (prompt + emitted tokens), which is the history the proposers and verifiers see.
class token_sink {
 public:
  //! Starts a request: `committed` becomes the prompt; `out` is cleared. Reserves room for
  //! `extra` tokens beyond the prompt and `max_new_tokens` so that emitting does not allocate.
  void begin(decode_config const& config, std::span<token_id const> prompt, decode_result& out,
             token_callback const* on_token, std::size_t extra) {
    config_ = &config;
    out_ = &out;
    on_token_ = on_token != nullptr && *on_token ? on_token : nullptr;
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

  //! Emits `token` (unless it is an EOS that is not emitted) and returns true when the request is
  //! over. Must not be called after it returned true.
  bool emit(token_id token) {
    decode_config const& c = *config_;
    token_id const previous = committed_.empty() ? no_token : committed_.back();
    if (c.eos_token != no_token && token == c.eos_token) {
      if (c.emit_eos) push(token);
      out_->reason = finish_reason::eos;
      if (c.emit_eos && on_token_ != nullptr) (void)(*on_token_)(token);
      return done_ = true;
    }
    push(token);
    bool stop = false;
    if (match_sequences()) stop = true;
    if (!stop && !c.stop_strings.empty() && match_strings(previous, token)) stop = true;
    if (on_token_ != nullptr && !(*on_token_)(token) && !stop) {
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

//! What a decoder checks when a request starts: the prompt against the model's vocabulary and the
//! positions its cache can hold, and the configuration (which may have been edited since the
//! decoder was built). Returns those positions. `who` names the decoder in errors.
template <class Model>
[[nodiscard]] std::size_t start_request(Model& model, std::span<token_id const> prompt,
                                        decode_config const& config, char const* who) {
  std::size_t const capacity = context_capacity(model);
  check_prompt(prompt, model.vocab_size(), capacity, who);
  config.validate(model.vocab_size());
  return capacity;
}

}  // namespace detail
}  // namespace specdec
