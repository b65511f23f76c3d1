#pragma once
//! \file
//! Byte automata and their token-level view, the one home of the constraints' matching machinery
//! (sampling/regex.hpp and sampling/json_schema.hpp compile to it; sampling/constraint.hpp masks
//! rows with it):
//!
//! - `detail::nfa`: a byte-level NFA builder (Thompson fragments: byte ranges, literals,
//!   sequences, alternatives, bounded and unbounded repetition, Unicode code-point ranges encoded
//!   as UTF-8 byte sequences);
//! - `byte_dfa`: its determinisation (subset construction), trimmed to the states from which an
//!   accepting state is reachable, so that every transition it keeps can still end in a match,
//!   and minimised (Moore's partition refinement: fewer states, fewer token tables);
//! - `token_vocabulary`: the bytes each token adds to the output, in a trie, and the end tokens;
//! - `automaton_constraint`: a `constraint` (sampling/constraint.hpp) over a DFA and a vocabulary.
//!   Its state is a DFA state; a token is allowed in a state when its bytes lead to a state from
//!   which the vocabulary can still complete a match (so generation never reaches a dead end);
//!   the end tokens are allowed in accepting states. Each state's token table (the allowed set as
//!   a bitmask, its size, the only allowed token) is built the first time it is asked for, by a
//!   walk of the token trie that prunes every subtree the DFA rejects, and cached (thread-safe).
//!
//! No library in Debian builds token-level automata from patterns or schemas (xgrammar, outlines
//! and llguidance are not packaged), so this is written here; the tests check it against a slow
//! reference (each token's bytes run through a backtracking matcher) and std::regex.

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"

namespace specdec {

namespace detail {

//! A byte-level NFA under construction: states with epsilon edges and byte-range edges, built
//! from fragments (an entry and an exit state). The language of a fragment is the set of byte
//! strings along the paths from its entry to its exit.
class nfa {
 public:
  //! A piece of the automaton: paths from `in` to `out`.
  struct fragment {
    std::int32_t in = 0;
    std::int32_t out = 0;
  };
  //! A byte-range edge.
  struct edge {
    std::uint8_t lo, hi;
    std::int32_t to;
  };

  //! `max_states` bounds the automaton's size (`errc::invalid_argument` beyond it, naming `who`).
  explicit nfa(std::size_t max_states = std::size_t{1} << 20, std::string who = "nfa")
      : max_states_(max_states), who_(std::move(who)) {}

  //! A new state.
  std::int32_t state() {
    SPECDEC_CHECK(eps_.size() < max_states_, invalid_argument, who_, ": the automaton needs more ",
                  "than ", max_states_, " states (a repetition count or nesting too large)");
    eps_.emplace_back();
    edges_.emplace_back();
    return static_cast<std::int32_t>(eps_.size() - 1);
  }
  //! An epsilon edge a -> b.
  void epsilon(std::int32_t a, std::int32_t b) { eps_[static_cast<std::size_t>(a)].push_back(b); }
  //! An edge a -> b on bytes lo..hi.
  void bytes(std::int32_t a, std::uint8_t lo, std::uint8_t hi, std::int32_t b) {
    edges_[static_cast<std::size_t>(a)].push_back({lo, hi, b});
  }

  //! The empty string.
  fragment empty() {
    std::int32_t const s = state();
    return {s, s};
  }
  //! Nothing at all (no path from in to out).
  fragment nothing() { return {state(), state()}; }
  //! One byte in lo..hi.
  fragment range(std::uint8_t lo, std::uint8_t hi) {
    fragment const f{state(), state()};
    bytes(f.in, lo, hi, f.out);
    return f;
  }
  //! One byte of `set` (256 flags).
  fragment byte_set(std::array<bool, 256> const& set) {
    fragment const f{state(), state()};
    for (int b = 0; b < 256;) {
      if (!set[static_cast<std::size_t>(b)]) {
        ++b;
        continue;
      }
      int e = b;
      while (e + 1 < 256 && set[static_cast<std::size_t>(e + 1)]) ++e;
      bytes(f.in, static_cast<std::uint8_t>(b), static_cast<std::uint8_t>(e), f.out);
      b = e + 1;
    }
    return f;
  }
  //! Exactly the bytes of `text`.
  fragment literal(std::string_view text) {
    fragment f = empty();
    for (char c : text) {
      auto const b = static_cast<std::uint8_t>(c);
      f = seq(f, range(b, b));
    }
    return f;
  }
  //! a then b.
  fragment seq(fragment a, fragment b) {
    epsilon(a.out, b.in);
    return {a.in, b.out};
  }
  //! Any one of `parts` (`nothing()` when empty).
  fragment alt(std::span<fragment const> parts) {
    fragment const f{state(), state()};
    for (fragment const& p : parts) {
      epsilon(f.in, p.in);
      epsilon(p.out, f.out);
    }
    return f;
  }
  //! a or b.
  fragment alt(fragment a, fragment b) {
    std::array<fragment, 2> const parts{a, b};
    return alt(parts);
  }
  //! a or nothing.
  fragment optional(fragment a) { return alt(a, empty()); }
  //! Zero or more repetitions of a.
  fragment star(fragment a) {
    std::int32_t const s = state();
    epsilon(s, a.in);
    epsilon(a.out, s);
    return {s, s};
  }
  //! From `min` to `max` repetitions (`max` < 0: unbounded) of what `make` builds (called once per
  //! copy, so each repetition is its own sub-automaton).
  fragment repeat(std::function<fragment()> const& make, std::int64_t min, std::int64_t max) {
    SPECDEC_CHECK(min >= 0 && (max < 0 || max >= min), invalid_argument, who_, ": a repetition of ",
                  min, " to ", max, " copies");
    fragment f = empty();
    for (std::int64_t i = 0; i < min; ++i) f = seq(f, make());
    if (max < 0) return seq(f, star(make()));
    std::int32_t const end = state();
    std::int32_t cur = f.out;
    for (std::int64_t i = min; i < max; ++i) {
      epsilon(cur, end);
      fragment const g = make();
      epsilon(cur, g.in);
      cur = g.out;
    }
    epsilon(cur, end);
    return {f.in, end};
  }

  //! One code point in any of `ranges` (inclusive [lo, hi] pairs within 0..0x10FFFF), as its
  //! UTF-8 bytes. Surrogates (D800..DFFF) are never matched.
  fragment code_points(std::span<std::pair<std::uint32_t, std::uint32_t> const> ranges) {
    fragment const f{state(), state()};
    for (auto [lo, hi] : ranges) {
      hi = std::min<std::uint32_t>(hi, 0x10FFFF);
      if (lo > hi) continue;
      // Split off the surrogates, then by encoded length.
      if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800) utf8_range(f, lo, 0xD7FF);
        if (hi > 0xDFFF) utf8_range(f, 0xE000, hi);
      } else {
        utf8_range(f, lo, hi);
      }
    }
    return f;
  }

  [[nodiscard]] std::size_t size() const noexcept { return eps_.size(); }
  [[nodiscard]] std::vector<std::int32_t> const& epsilons(std::int32_t s) const {
    return eps_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] std::vector<edge> const& edges(std::int32_t s) const {
    return edges_[static_cast<std::size_t>(s)];
  }
  [[nodiscard]] std::string const& who() const noexcept { return who_; }

 private:
  static int utf8_length(std::uint32_t c) {
    return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  }
  static std::array<std::uint8_t, 4> encode(std::uint32_t c, int n) {
    std::array<std::uint8_t, 4> b{};
    if (n == 1) {
      b[0] = static_cast<std::uint8_t>(c);
    } else {
      for (int i = n - 1; i > 0; --i) {
        b[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(0x80 | (c & 0x3F));
        c >>= 6;
      }
      std::uint8_t const lead = n == 2 ? 0xC0 : n == 3 ? 0xE0 : 0xF0;
      b[0] = static_cast<std::uint8_t>(lead | c);
    }
    return b;
  }
  //! Adds to f the byte sequences of the code points lo..hi (no surrogates), split so that each
  //! sequence is a product of byte ranges (the classical construction of RE2 and regex-syntax).
  void utf8_range(fragment f, std::uint32_t lo, std::uint32_t hi) {
    static constexpr std::array<std::uint32_t, 4> last{0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    int const nl = utf8_length(lo);
    int const nh = utf8_length(hi);
    if (nl != nh) {
      utf8_range(f, lo, last[static_cast<std::size_t>(nl - 1)]);
      utf8_range(f, last[static_cast<std::size_t>(nl - 1)] + 1, hi);
      return;
    }
    int const n = nl;
    for (int i = 1; i < n; ++i) {
      std::uint32_t const m = (std::uint32_t{1} << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          utf8_range(f, lo, lo | m);
          utf8_range(f, (lo | m) + 1, hi);
          return;
        }
        if ((hi & m) != m) {
          utf8_range(f, lo, (hi & ~m) - 1);
          utf8_range(f, hi & ~m, hi);
          return;
        }
      }
    }
    auto const a = encode(lo, n);
    auto const b = encode(hi, n);
    std::int32_t cur = f.in;
    for (int i = 0; i < n; ++i) {
      std::int32_t const next = i + 1 == n ? f.out : state();
      bytes(cur, a[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(i)], next);
      cur = next;
    }
  }

  std::size_t max_states_;
  std::string who_;
  std::vector<std::vector<std::int32_t>> eps_;
  std::vector<std::vector<edge>> edges_;
};

}  // namespace detail

//! A deterministic byte automaton: a dense transition table, trimmed so that every state can
//! still reach an accepting one (a transition that could not is -1: the byte is rejected).
class byte_dfa {
 public:
  //! The determinisation of `fragment` of `nfa` (its language: the byte strings from `in` to
  //! `out`), with at most `max_states` states. Throws `errc::invalid_argument` (naming the NFA's
  //! `who`) when it needs more, or when the language is empty.
  byte_dfa(detail::nfa const& nfa, detail::nfa::fragment fragment,
           std::size_t max_states = std::size_t{1} << 16) {
    std::vector<std::vector<std::int32_t>> sets;
    std::map<std::vector<std::int32_t>, std::int32_t> index;
    std::vector<char> mark(nfa.size(), 0);
    std::vector<std::int32_t> stack;
    auto const closure = [&](std::vector<std::int32_t>& set) {
      stack.assign(set.begin(), set.end());
      for (std::int32_t s : set) mark[static_cast<std::size_t>(s)] = 1;
      while (!stack.empty()) {
        std::int32_t const s = stack.back();
        stack.pop_back();
        for (std::int32_t t : nfa.epsilons(s)) {
          if (mark[static_cast<std::size_t>(t)]) continue;
          mark[static_cast<std::size_t>(t)] = 1;
          set.push_back(t);
          stack.push_back(t);
        }
      }
      for (std::int32_t s : set) mark[static_cast<std::size_t>(s)] = 0;
      std::sort(set.begin(), set.end());
    };
    auto const intern = [&](std::vector<std::int32_t> set) -> std::int32_t {
      auto const it = index.find(set);
      if (it != index.end()) return it->second;
      SPECDEC_CHECK(sets.size() < max_states, invalid_argument, nfa.who(),
                    ": the deterministic automaton needs more than ", max_states, " states");
      auto const id = static_cast<std::int32_t>(sets.size());
      index.emplace(set, id);
      sets.push_back(std::move(set));
      return id;
    };
    std::vector<std::int32_t> first{fragment.in};
    closure(first);
    intern(std::move(first));
    std::vector<std::int32_t> raw;  // [states][256]
    std::array<std::vector<std::int32_t>, 256> targets;
    for (std::size_t d = 0; d < sets.size(); ++d) {
      for (auto& t : targets) t.clear();
      for (std::int32_t s : sets[d])
        for (detail::nfa::edge const& e : nfa.edges(s))
          for (int b = e.lo; b <= e.hi; ++b) targets[static_cast<std::size_t>(b)].push_back(e.to);
      raw.resize((d + 1) * 256, -1);
      for (std::size_t b = 0; b < 256; ++b) {
        if (targets[b].empty()) continue;
        std::vector<std::int32_t> set = targets[b];
        std::sort(set.begin(), set.end());
        set.erase(std::unique(set.begin(), set.end()), set.end());
        closure(set);
        raw[d * 256 + b] = intern(std::move(set));
      }
    }
    std::size_t const n = sets.size();
    std::vector<char> accepting(n, 0);
    for (std::size_t d = 0; d < n; ++d)
      accepting[d] = std::binary_search(sets[d].begin(), sets[d].end(), fragment.out) ? 1 : 0;
    // Trim: keep the states from which an accepting state is reachable.
    std::vector<std::vector<std::int32_t>> back(n);
    for (std::size_t d = 0; d < n; ++d)
      for (std::size_t b = 0; b < 256; ++b)
        if (raw[d * 256 + b] >= 0)
          back[static_cast<std::size_t>(raw[d * 256 + b])].push_back(static_cast<std::int32_t>(d));
    std::vector<char> live(accepting);
    std::vector<std::int32_t> todo;
    for (std::size_t d = 0; d < n; ++d)
      if (live[d]) todo.push_back(static_cast<std::int32_t>(d));
    while (!todo.empty()) {
      std::int32_t const d = todo.back();
      todo.pop_back();
      for (std::int32_t p : back[static_cast<std::size_t>(d)]) {
        if (live[static_cast<std::size_t>(p)]) continue;
        live[static_cast<std::size_t>(p)] = 1;
        todo.push_back(p);
      }
    }
    SPECDEC_CHECK(live[0], invalid_argument, nfa.who(), ": matches no string at all");
    // Minimise (Moore): split the live states by acceptance, then by the classes of their
    // successors, until no class splits; dead successors are class -1. The start's class is 0.
    std::vector<std::int32_t> cls(n, -1);
    for (std::size_t d = 0; d < n; ++d)
      if (live[d]) cls[d] = accepting[d] ? 1 : 0;
    std::size_t classes = 0;
    for (;;) {
      std::map<std::vector<std::int32_t>, std::int32_t> signature;
      std::vector<std::int32_t> next_cls(n, -1);
      std::vector<std::int32_t> key(257);
      // Classes are numbered in order of first appearance: the start (state 0) stays class 0.
      for (std::size_t d = 0; d < n; ++d) {
        if (!live[d]) continue;
        key[0] = cls[d];
        for (std::size_t b = 0; b < 256; ++b) {
          std::int32_t const t = raw[d * 256 + b];
          key[b + 1] =
              t >= 0 && live[static_cast<std::size_t>(t)] ? cls[static_cast<std::size_t>(t)] : -1;
        }
        auto const [it, fresh] =
            signature.emplace(key, static_cast<std::int32_t>(signature.size()));
        (void)fresh;
        next_cls[d] = it->second;
      }
      std::size_t const count = signature.size();
      cls.swap(next_cls);
      if (count == classes) break;
      classes = count;
    }
    next_.assign(classes * 256, -1);
    accepting_.assign(classes, 0);
    for (std::size_t d = 0; d < n; ++d) {
      if (!live[d]) continue;
      auto const r = static_cast<std::size_t>(cls[d]);
      accepting_[r] = accepting[d];
      for (std::size_t b = 0; b < 256; ++b) {
        std::int32_t const t = raw[d * 256 + b];
        next_[r * 256 + b] =
            t >= 0 && live[static_cast<std::size_t>(t)] ? cls[static_cast<std::size_t>(t)] : -1;
      }
    }
  }

  //! Number of states; state 0 is the start.
  [[nodiscard]] std::size_t size() const noexcept { return accepting_.size(); }
  //! The state after byte `b` from `s`, or -1 when no match can follow.
  [[nodiscard]] std::int32_t next(std::int32_t s, std::uint8_t b) const noexcept {
    return next_[static_cast<std::size_t>(s) * 256 + b];
  }
  //! The state after `bytes` from `s`, or -1.
  [[nodiscard]] std::int32_t run(std::int32_t s, std::string_view bytes) const noexcept {
    for (char c : bytes) {
      s = next(s, static_cast<std::uint8_t>(c));
      if (s < 0) return -1;
    }
    return s;
  }
  //! Whether `s` accepts (the bytes so far are a complete match).
  [[nodiscard]] bool accepting(std::int32_t s) const noexcept {
    return accepting_[static_cast<std::size_t>(s)] != 0;
  }
  //! Whether the whole of `text` matches.
  [[nodiscard]] bool matches(std::string_view text) const noexcept {
    std::int32_t const s = run(0, text);
    return s >= 0 && accepting(s);
  }
  //! The bytes every match must continue with from `s`: while `s` does not accept and exactly one
  //! byte leads on, that byte (at most `limit` of them).
  [[nodiscard]] std::string forced_bytes(std::int32_t s, std::size_t limit = 256) const {
    std::string out;
    while (out.size() < limit && !accepting(s)) {
      std::int32_t only = -1;
      int byte = -1;
      for (int b = 0; b < 256; ++b) {
        std::int32_t const t = next(s, static_cast<std::uint8_t>(b));
        if (t < 0) continue;
        if (byte >= 0) return out;
        byte = b;
        only = t;
      }
      if (byte < 0) return out;
      out.push_back(static_cast<char>(byte));
      s = only;
    }
    return out;
  }

 private:
  std::vector<std::int32_t> next_;  // [size][256]
  std::vector<char> accepting_;
};

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
    nodes_.emplace_back();
    for (std::size_t t = 0; t < bytes_.size(); ++t) {
      // End tokens end the output: whatever their bytes, they are never text.
      if (bytes_[t].empty() || is_end(static_cast<token_id>(t))) continue;
      std::int32_t n = 0;
      for (char c : bytes_[t]) {
        auto const b = static_cast<std::uint8_t>(c);
        std::int32_t child = find_child(n, b);
        if (child < 0) {
          child = static_cast<std::int32_t>(nodes_.size());
          nodes_.emplace_back();
          auto& kids = nodes_[static_cast<std::size_t>(n)].children;
          kids.insert(std::lower_bound(kids.begin(), kids.end(),
                                       std::pair<std::uint8_t, std::int32_t>(b, -1)),
                      {b, child});
        }
        n = child;
      }
      nodes_[static_cast<std::size_t>(n)].tokens.push_back(static_cast<token_id>(t));
      if (bytes_[t].size() == 1) {
        auto const b = static_cast<std::uint8_t>(bytes_[t][0]);
        if (single_[b] == no_token) single_[b] = static_cast<token_id>(t);
      }
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

  //! A trie node: children by byte (ascending), tokens ending here.
  struct node {
    std::vector<std::pair<std::uint8_t, std::int32_t>> children;
    std::vector<token_id> tokens;
  };
  [[nodiscard]] std::vector<node> const& trie() const noexcept { return nodes_; }

 private:
  [[nodiscard]] std::int32_t find_child(std::int32_t n, std::uint8_t b) const {
    auto const& kids = nodes_[static_cast<std::size_t>(n)].children;
    auto const it =
        std::lower_bound(kids.begin(), kids.end(), std::pair<std::uint8_t, std::int32_t>(b, -1));
    return it != kids.end() && it->first == b ? it->second : -1;
  }

  std::vector<std::string> bytes_;
  std::vector<token_id> end_;
  std::vector<node> nodes_;
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

  //! Walks the trie from DFA state `s`, calling `visit(token, next state)` for every token whose
  //! bytes keep the DFA alive (subtrees the DFA rejects are skipped).
  template <class Visit>
  void walk(std::int32_t s, Visit&& visit) const {
    auto const& trie = vocab_->trie();
    struct item {
      std::int32_t node, state;
    };
    std::vector<item> stack{{0, s}};
    while (!stack.empty()) {
      item const it = stack.back();
      stack.pop_back();
      auto const& n = trie[static_cast<std::size_t>(it.node)];
      if (it.node != 0)
        for (token_id t : n.tokens) visit(t, it.state);
      for (auto const& [b, child] : n.children) {
        std::int32_t const next = dfa_.next(it.state, b);
        if (next >= 0) stack.push_back({child, next});
      }
    }
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
    walk(s, [&](token_id t, std::int32_t to) {
      if (live_[static_cast<std::size_t>(to)]) set_bit(*table, t);
    });
    if (dfa_.accepting(s))
      for (token_id t : vocab_->end_tokens()) set_bit(*table, t);
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
