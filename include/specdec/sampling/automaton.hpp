#pragma once
//! \file
//! Byte automata, the matching machinery of the output constraints (sampling/regex.hpp and
//! sampling/json_schema.hpp compile to it; sampling/automaton_constraint.hpp gives it a token-level
//! view):
//!
//! - `detail::nfa`: a byte-level NFA builder (Thompson fragments: byte ranges, literals,
//!   sequences, alternatives, bounded and unbounded repetition, Unicode code-point ranges encoded
//!   as UTF-8 byte sequences);
//! - `byte_dfa`: its determinisation (subset construction), trimmed to the states from which an
//!   accepting state is reachable, so that every transition it keeps can still end in a match,
//!   and minimised (Moore's partition refinement: fewer states, fewer token tables);
//!
//! No library in Debian builds token-level automata from patterns or schemas (xgrammar, outlines
//! and llguidance are not packaged), so this is written here; the tests check it against a slow
//! reference (each token's bytes run through a backtracking matcher) and std::regex.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
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

}  // namespace specdec
