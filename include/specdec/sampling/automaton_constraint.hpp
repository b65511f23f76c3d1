#pragma once
//! \file
//! The token-level view of a byte automaton (sampling/automaton.hpp): what an output constraint
//! allows, token by token.
//!
//! - `token_vocabulary`: the bytes each token adds to the output, in a trie, and the end tokens;
//! - `automaton_constraint`: a `constraint` (sampling/constraint.hpp) over a DFA and a vocabulary.
//!   Its state is a DFA state; a token is allowed in a state when its bytes lead to a state from
//!   which the vocabulary can still complete a match (so generation never reaches a dead end);
//!   the end tokens are allowed in accepting states. Each state's token table (the allowed set as
//!   a bitmask, its size, the only allowed token) is built the first time it is asked for, by a
//!   walk of the token trie that prunes every subtree the DFA rejects, and cached (thread-safe).

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/sampling/automaton.hpp"

namespace specdec {

//! The bytes each token adds to the output, and the tokens that end it: what a constraint needs
//! of a tokenizer. Tokens with no bytes (control tokens, the unknown token) are never allowed in
//! text. The byte strings sit in a trie, which the token tables walk.
class token_vocabulary {
 public:
  //! `bytes[t]`: what token t appends to the output (empty: never allowed as text); `end_tokens`:
  //! the ids that end the output (allowed where a match is complete). Throws
  //! `errc::invalid_argument` for an empty vocabulary or an end token outside it.
  token_vocabulary(std::vector<std::string> bytes, std::vector<token_id> end_tokens)
      : bytes_(std::move(bytes)), end_(std::move(end_tokens)) {
    SPECDEC_CHECK(!bytes_.empty(), invalid_argument, "token_vocabulary: empty vocabulary");
    SPECDEC_CHECK(bytes_.size() < static_cast<std::size_t>(std::numeric_limits<token_id>::max()),
                  invalid_argument, "token_vocabulary: too many tokens");
    for (token_id t : end_)
      SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < bytes_.size(), invalid_argument,
                    "token_vocabulary: end token ", t, " is outside the vocabulary of ",
                    bytes_.size());
    // The trie in preorder (see `walk`): the text tokens sorted by their bytes, each distinct
    // prefix one node, a node's tokens those whose bytes end there.
    for (std::size_t t = 0; t < bytes_.size(); ++t) {
      // End tokens end the output: whatever their bytes, they are never text.
      if (bytes_[t].empty() || is_end(static_cast<token_id>(t))) continue;
      sorted_.push_back(static_cast<token_id>(t));
      if (bytes_[t].size() == 1) {
        auto const b = static_cast<std::uint8_t>(bytes_[t][0]);
        if (single_[b] == no_token) single_[b] = static_cast<token_id>(t);
      }
    }
    std::stable_sort(sorted_.begin(), sorted_.end(),
                     [&](token_id a, token_id b) { return this->bytes(a) < this->bytes(b); });
    std::vector<std::uint32_t> path;  // the nodes of the current prefix, by depth - 1
    std::string_view prev;
    for (std::size_t i = 0; i < sorted_.size(); ++i) {
      std::string_view const b = this->bytes(sorted_[i]);
      std::size_t common = 0;
      while (common < prev.size() && common < b.size() && prev[common] == b[common]) ++common;
      for (; path.size() > common; path.pop_back())
        node_end_[path.back()] = static_cast<std::uint32_t>(node_byte_.size());
      for (std::size_t d = common; d < b.size(); ++d) {
        path.push_back(static_cast<std::uint32_t>(node_byte_.size()));
        node_byte_.push_back(static_cast<std::uint8_t>(b[d]));
        node_depth_.push_back(static_cast<std::uint32_t>(d + 1));
        node_end_.push_back(0);
        node_tokens_.push_back(static_cast<std::uint32_t>(i));  // first token at or after it
        max_depth_ = std::max(max_depth_, d + 1);
      }
      prev = b;
    }
    for (; !path.empty(); path.pop_back())
      node_end_[path.back()] = static_cast<std::uint32_t>(node_byte_.size());
    node_tokens_.push_back(static_cast<std::uint32_t>(sorted_.size()));
  }

  //! Calls `visit(token, state)` for every text token whose bytes, run from `state` through
  //! `next(state, byte)` (-1: rejected), keep it alive, with the state they lead to. One pass over
  //! the trie in preorder, skipping each rejected subtree whole.
  template <class Next, class Visit>
  void walk(std::int32_t state, Next&& next, Visit&& visit) const {
    std::vector<std::int32_t>& at = walk_states();
    at.resize(max_depth_ + 1);
    at[0] = state;
    std::size_t const n = node_byte_.size();
    for (std::size_t i = 0; i < n;) {
      std::uint32_t const d = node_depth_[i];
      std::int32_t const s = next(at[d - 1], node_byte_[i]);
      if (s < 0) {
        i = node_end_[i];
        continue;
      }
      at[d] = s;
      // The tokens whose bytes end here: from this node's first token while their length is d.
      for (std::uint32_t k = node_tokens_[i]; k < node_tokens_[i + 1]; ++k) {
        token_id const t = sorted_[k];
        if (bytes(t).size() != d) break;
        visit(t, s);
      }
      ++i;
    }
  }

  //! The vocabulary of a tokenizer (`model/tokenizer.hpp`'s `tokenizer`, or any type with
  //! `vocab_size()`, `decode(prev, id)`, `type(id)` and `end_of_text()`): each token's text as it
  //! reads after another token (byte tokens their byte; control and unknown tokens none); the end
  //! tokens are the tokenizer's end-of-text set.
  template <class Tokenizer>
  [[nodiscard]] static token_vocabulary of(Tokenizer const& tok) {
    std::vector<std::string> bytes(static_cast<std::size_t>(tok.vocab_size()));
    for (std::size_t t = 0; t < bytes.size(); ++t) {
      auto const id = static_cast<token_id>(t);
      if (id == tok.unk()) continue;
      bytes[t] = std::string(tok.decode(no_token, id));
    }
    return token_vocabulary(std::move(bytes), tok.end_of_text());
  }

  [[nodiscard]] std::size_t size() const noexcept { return bytes_.size(); }
  //! The bytes of token `t` (in range); an end token's are never output.
  [[nodiscard]] std::string_view bytes(token_id t) const noexcept {
    return bytes_[static_cast<std::size_t>(t)];
  }
  [[nodiscard]] std::vector<token_id> const& end_tokens() const noexcept { return end_; }
  [[nodiscard]] bool is_end(token_id t) const noexcept {
    return std::find(end_.begin(), end_.end(), t) != end_.end();
  }
  //! Whether some token is exactly byte `b`.
  [[nodiscard]] bool has_single(std::uint8_t b) const noexcept { return single_[b] != no_token; }
  //! The lowest token that is exactly byte `b`, or `no_token`.
  [[nodiscard]] token_id single(std::uint8_t b) const noexcept { return single_[b]; }

 private:
  static std::vector<std::int32_t>& walk_states() {
    thread_local std::vector<std::int32_t> states;
    return states;
  }

  std::vector<std::string> bytes_;
  std::vector<token_id> end_;
  // The trie, in preorder: node i's byte, depth, the end of its subtree, and the first entry of
  // `sorted_` at or after its prefix (the tokens ending at node i are the ones from there whose
  // length is its depth).
  std::vector<token_id> sorted_;
  std::vector<std::uint8_t> node_byte_;
  std::vector<std::uint32_t> node_depth_, node_end_, node_tokens_;
  std::size_t max_depth_ = 0;
  std::array<token_id, 256> single_ = filled_single();

  static std::array<token_id, 256> filled_single() {
    std::array<token_id, 256> a{};
    a.fill(no_token);
    return a;
  }
};

//! What a constraint allows in one state, cached per state.
struct token_table {
  std::vector<std::uint64_t> mask;  //!< [ceil(vocab / 64)] bit t: token t is allowed
  std::size_t count = 0;            //!< allowed tokens
  token_id only = no_token;         //!< the allowed token when count == 1
};

//! A `constraint` (sampling/constraint.hpp) over a byte DFA and a token vocabulary: the output's
//! bytes must form a match of the DFA. States are DFA states, plus `ended` (after an end token:
//! only end tokens are allowed there, so a tree drafted past the end still scores) and `broken`
//! (a token that was not allowed; never scored). See the file comment for the rules.
//!
//! Thread safety: const members may run concurrently (the per-state tables are built under a
//! lock and published atomically). Not copyable: share it (`std::shared_ptr`) between policies.
class automaton_constraint {
 public:
  using state_type = std::int32_t;
  static constexpr state_type ended = -2;   //!< after an end token
  static constexpr state_type broken = -3;  //!< after a token that was not allowed

  //! The constraint "the output matches `dfa`" over `vocabulary`. Throws
  //! `errc::invalid_argument` when no output of the vocabulary's tokens can match.
  automaton_constraint(byte_dfa dfa, std::shared_ptr<token_vocabulary const> vocabulary,
                       std::string who = "constraint")
      : dfa_(std::move(dfa)), vocab_(std::move(vocabulary)), who_(std::move(who)) {
    SPECDEC_CHECK(vocab_ != nullptr, invalid_argument, who_, ": no vocabulary");
    words_ = (vocab_->size() + 63) / 64;
    tables_ = std::make_unique<std::atomic<token_table const*>[]>(dfa_.size());
    for (std::size_t s = 0; s < dfa_.size(); ++s) tables_[s].store(nullptr);
    compute_liveness();
    SPECDEC_CHECK(live_[0], invalid_argument, who_,
                  ": no sequence of this vocabulary's tokens produces a match");
    ended_.mask.assign(words_, 0);
    for (token_id t : vocab_->end_tokens()) set_bit(ended_, t);
  }
  automaton_constraint(automaton_constraint const&) = delete;
  automaton_constraint& operator=(automaton_constraint const&) = delete;

  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_->size(); }
  [[nodiscard]] token_vocabulary const& vocabulary() const noexcept { return *vocab_; }
  [[nodiscard]] byte_dfa const& dfa() const noexcept { return dfa_; }

  //! The state before any output.
  [[nodiscard]] state_type start() const noexcept { return 0; }
  //! Advances `s` by token `t`; returns false (and sets `s` to `broken`) when `t` is not allowed
  //! in `s` (or out of range).
  bool advance(state_type& s, token_id t) const {
    if (t < 0 || static_cast<std::size_t>(t) >= vocab_->size() || !valid(s) || s == broken) {
      s = broken;
      return false;
    }
    if (s == ended || vocab_->is_end(t)) {
      bool const ok = s == ended ? vocab_->is_end(t) : dfa_.accepting(s);
      s = ok ? ended : broken;
      return ok;
    }
    std::int32_t const n = dfa_.run(s, vocab_->bytes(t));
    if (vocab_->bytes(t).empty() || n < 0 || !live_[static_cast<std::size_t>(n)]) {
      s = broken;
      return false;
    }
    s = n;
    return true;
  }
  //! The tokens allowed in `s`: [ceil(vocab / 64)] words, bit t of word t / 64. Throws
  //! `errc::internal` for `broken`.
  [[nodiscard]] std::span<std::uint64_t const> allowed(state_type s) const { return table(s).mask; }
  //! The number of allowed tokens in `s`, and the only one when there is one.
  [[nodiscard]] token_table const& table(state_type s) const {
    SPECDEC_CHECK(s != broken, internal, who_,
                  ": a row was scored after a token the constraint "
                  "does not allow");
    if (s == ended) return ended_;
    SPECDEC_CHECK(valid(s), out_of_range, who_, ": state ", s, " is not a state of the constraint");
    token_table const* t = tables_[static_cast<std::size_t>(s)].load(std::memory_order_acquire);
    return t != nullptr ? *t : build(s);
  }
  //! Whether `s` is a state of this constraint (`ended` and `broken` included).
  [[nodiscard]] bool valid(state_type s) const noexcept {
    return s == ended || s == broken || (s >= 0 && static_cast<std::size_t>(s) < dfa_.size());
  }
  //! Whether the output may end in `s` (a complete match).
  [[nodiscard]] bool can_end(state_type s) const noexcept {
    return s == ended || (s >= 0 && valid(s) && dfa_.accepting(s));
  }
  //! Whether `s` is complete: the output may end and no more text may follow.
  [[nodiscard]] bool complete(state_type s) const {
    if (s == ended) return true;
    if (s < 0 || !valid(s) || !dfa_.accepting(s)) return false;
    token_table const& t = table(s);
    std::size_t ends = 0;
    for (token_id e : vocab_->end_tokens()) ends += test_bit(t, e) ? 1 : 0;
    return t.count == ends;
  }
  //! The only token allowed in `s`, or `no_token`.
  [[nodiscard]] token_id forced(state_type s) const { return table(s).only; }
  //! The bytes every continuation from `s` starts with (`byte_dfa::forced_bytes`).
  [[nodiscard]] std::string forced_bytes(state_type s, std::size_t limit = 256) const {
    return s >= 0 && valid(s) ? dfa_.forced_bytes(s, limit) : std::string();
  }
  //! Whether `t` is allowed in `s`.
  [[nodiscard]] bool allows(state_type s, token_id t) const {
    return t >= 0 && static_cast<std::size_t>(t) < vocab_->size() && s != broken &&
           test_bit(table(s), t);
  }
  //! Whether the whole of `text` matches.
  [[nodiscard]] bool matches(std::string_view text) const noexcept { return dfa_.matches(text); }

 private:
  static void set_bit(token_table& t, token_id id) {
    auto const i = static_cast<std::size_t>(id);
    std::uint64_t const bit = std::uint64_t{1} << (i % 64);
    if ((t.mask[i / 64] & bit) == 0) {
      t.mask[i / 64] |= bit;
      ++t.count;
      t.only = t.count == 1 ? id : no_token;
    }
  }
  static bool test_bit(token_table const& t, token_id id) {
    auto const i = static_cast<std::size_t>(id);
    return ((t.mask[i / 64] >> (i % 64)) & 1u) != 0;
  }

  //! Calls `visit(token, next state)` for every token whose bytes keep the DFA alive from `s`.
  template <class Visit>
  void walk(std::int32_t s, Visit&& visit) const {
    vocab_->walk(
        s, [this](std::int32_t at, std::uint8_t b) { return dfa_.next(at, b); }, visit);
  }

  //! Which DFA states the vocabulary can still finish a match from. When every byte the DFA reads
  //! is a token by itself, that is every state (the DFA is trimmed); otherwise a fixpoint over
  //! the token transitions.
  void compute_liveness() {
    std::size_t const n = dfa_.size();
    bool spellable = true;
    for (std::size_t s = 0; s < n && spellable; ++s)
      for (int b = 0; b < 256; ++b)
        if (dfa_.next(static_cast<std::int32_t>(s), static_cast<std::uint8_t>(b)) >= 0 &&
            !vocab_->has_single(static_cast<std::uint8_t>(b))) {
          spellable = false;
          break;
        }
    live_.assign(n, spellable ? 1 : 0);
    if (spellable) return;
    for (std::size_t s = 0; s < n; ++s) live_[s] = dfa_.accepting(static_cast<std::int32_t>(s));
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t s = 0; s < n; ++s) {
        if (live_[s]) continue;
        bool found = false;
        walk(static_cast<std::int32_t>(s), [&](token_id, std::int32_t to) {
          if (live_[static_cast<std::size_t>(to)]) found = true;
        });
        if (found) {
          live_[s] = 1;
          changed = true;
        }
      }
    }
  }

  token_table const& build(std::int32_t s) const {
    auto table = std::make_unique<token_table>();
    table->mask.assign(words_, 0);
    std::uint64_t* const mask = table->mask.data();
    walk(s, [&](token_id t, std::int32_t to) {
      auto const i = static_cast<std::size_t>(t);
      if (live_[static_cast<std::size_t>(to)]) mask[i / 64] |= std::uint64_t{1} << (i % 64);
    });
    if (dfa_.accepting(s))
      for (token_id t : vocab_->end_tokens()) {
        auto const i = static_cast<std::size_t>(t);
        mask[i / 64] |= std::uint64_t{1} << (i % 64);
      }
    for (std::size_t w = 0; w < words_; ++w) {
      if (mask[w] == 0) continue;
      int const bits = std::popcount(mask[w]);
      if (table->count == 0 && bits == 1)
        table->only =
            static_cast<token_id>(w * 64 + static_cast<std::size_t>(std::countr_zero(mask[w])));
      else
        table->only = no_token;
      table->count += static_cast<std::size_t>(bits);
    }
    std::lock_guard<std::mutex> const lock(mutex_);
    token_table const* have = tables_[static_cast<std::size_t>(s)].load(std::memory_order_acquire);
    if (have != nullptr) return *have;
    owned_.push_back(std::move(table));
    tables_[static_cast<std::size_t>(s)].store(owned_.back().get(), std::memory_order_release);
    return *owned_.back();
  }

  byte_dfa dfa_;
  std::shared_ptr<token_vocabulary const> vocab_;
  std::string who_;
  std::size_t words_ = 0;
  std::vector<char> live_;
  token_table ended_;
  std::unique_ptr<std::atomic<token_table const*>[]> tables_;
  mutable std::mutex mutex_;
  mutable std::vector<std::unique_ptr<token_table>> owned_;
};

}  // namespace specdec
