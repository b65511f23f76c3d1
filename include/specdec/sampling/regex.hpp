#pragma once
//! \file
//! Regular expressions over the bytes of the output (UTF-8), compiled to a `byte_dfa`
//! (sampling/automaton.hpp). The whole output must match (the pattern is anchored at both ends;
//! a leading `^` and a trailing `$` are accepted and change nothing).
//!
//! Syntax (a subset of ECMAScript / Python `re`, the parts a structured-output pattern uses):
//! - literals (any UTF-8 character; escapes `\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH` and an escaped
//!   punctuation character), `.` (any character but a newline);
//! - classes `[...]` and `[^...]` with ranges (of any code points) and `\\d \\w \\s` (ASCII:
//!   [0-9], [A-Za-z0-9_], [ \\t\\n\\r\\f\\v]) and their negations `\\D \\W \\S`, also outside
//!   classes;
//! - groups `(...)`, `(?:...)`; alternation `|`;
//! - quantifiers `* + ? {n} {n,} {n,m}` (a trailing `?`, lazy, is accepted: laziness does not
//!   change which whole strings match).
//! Not supported (`errc::unsupported`, with the position): backreferences, lookaround, word
//! boundaries, anchors inside the pattern, named groups, flags. Errors name the byte offset in
//! the pattern.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/sampling/automaton.hpp"
#include "specdec/sampling/automaton_constraint.hpp"

namespace specdec {

namespace detail {

//! A parsed regular expression.
struct regex_node {
  enum class kind { empty, chars, seq, alt, repeat };
  kind k = kind::empty;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;  //!< chars: code-point ranges
  std::vector<regex_node> parts;                                //!< seq, alt; repeat: one
  std::int64_t min = 0, max = -1;                               //!< repeat bounds (-1: none)
};

//! Recursive-descent parser of the syntax in the file comment.
class regex_parser {
 public:
  explicit regex_parser(std::string_view pattern) : p_(pattern) {}

  regex_node parse() {
    if (at('^')) ++i_;
    regex_node n = alternation();
    if (i_ < p_.size() && p_[i_] == ')') fail(errc::invalid_argument, "unmatched ')'");
    if (i_ < p_.size()) fail(errc::invalid_argument, "unexpected character");
    return n;
  }

 private:
  using range_list = std::vector<std::pair<std::uint32_t, std::uint32_t>>;
  static constexpr std::int64_t max_count = 10000;

  [[noreturn]] void fail(errc code, std::string_view what) const {
    throw error(code, "regex: " + std::string(what) + " at offset " + std::to_string(i_) +
                          " of \"" + std::string(p_) + "\"");
  }
  [[nodiscard]] bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }

  regex_node alternation() {
    regex_node first = sequence();
    if (!at('|')) return first;
    regex_node n;
    n.k = regex_node::kind::alt;
    n.parts.push_back(std::move(first));
    while (at('|')) {
      ++i_;
      n.parts.push_back(sequence());
    }
    return n;
  }

  regex_node sequence() {
    regex_node n;
    n.k = regex_node::kind::seq;
    while (i_ < p_.size() && !at('|') && !at(')')) {
      if (at('$') && i_ + 1 == p_.size()) {
        ++i_;
        break;
      }
      n.parts.push_back(quantified());
    }
    return n;
  }

  regex_node quantified() {
    regex_node atom_node = atom();
    for (;;) {
      std::int64_t lo = 0, hi = -1;
      if (at('*')) {
        ++i_;
      } else if (at('+')) {
        lo = 1;
        ++i_;
      } else if (at('?')) {
        hi = 1;
        ++i_;
      } else if (at('{') && braces(lo, hi)) {
      } else {
        return atom_node;
      }
      if (at('?')) ++i_;  // lazy: the same whole-string language
      regex_node r;
      r.k = regex_node::kind::repeat;
      r.min = lo;
      r.max = hi;
      r.parts.push_back(std::move(atom_node));
      atom_node = std::move(r);
    }
  }

  //! {n}, {n,}, {n,m}; leaves i_ untouched and returns false when '{' does not start one (a
  //! literal brace, as in Python).
  bool braces(std::int64_t& lo, std::int64_t& hi) {
    std::size_t j = i_ + 1;
    auto const number = [&](std::int64_t& v) {
      std::size_t const s = j;
      v = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        v = v * 10 + (p_[j] - '0');
        if (v > max_count) fail(errc::invalid_argument, "repetition count above 10000");
        ++j;
      }
      return j > s;
    };
    if (!number(lo)) return false;
    if (j < p_.size() && p_[j] == '}') {
      hi = lo;
    } else if (j < p_.size() && p_[j] == ',') {
      ++j;
      if (!number(hi)) hi = -1;
      if (j >= p_.size() || p_[j] != '}') return false;
    } else {
      return false;
    }
    if (hi >= 0 && hi < lo) fail(errc::invalid_argument, "repetition {n,m} with m < n");
    i_ = j + 1;
    return true;
  }

  regex_node chars(range_list r) {
    regex_node n;
    n.k = regex_node::kind::chars;
    n.ranges = std::move(r);
    return n;
  }

  regex_node atom() {
    char const c = p_[i_];
    switch (c) {
      case '(': {
        ++i_;
        if (at('?')) {
          if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
            i_ += 2;
          } else {
            fail(errc::unsupported, "lookaround, named groups and flags are not supported");
          }
        }
        regex_node n = alternation();
        if (!at(')')) fail(errc::invalid_argument, "missing ')'");
        ++i_;
        return n;
      }
      case '[':
        return chars(char_class());
      case '.':
        ++i_;
        return chars({{0, 9}, {11, 0x10FFFF}});
      case '\\':
        return chars(escape(false));
      case '*':
      case '+':
      case '?':
        fail(errc::invalid_argument, "nothing to repeat");
      case '^':
      case '$':
        fail(errc::unsupported, "anchors are only supported at the ends of the pattern");
      default:
        return chars({single(code_point())});
    }
  }

  static std::pair<std::uint32_t, std::uint32_t> single(std::uint32_t c) { return {c, c}; }

  //! One UTF-8 character of the pattern.
  std::uint32_t code_point() {
    auto const b0 = static_cast<unsigned char>(p_[i_]);
    int n = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + static_cast<std::size_t>(n) > p_.size())
      fail(errc::invalid_argument, "invalid UTF-8 in the pattern");
    std::uint32_t c = n == 1 ? b0 : b0 & (0x7Fu >> n);
    for (int k = 1; k < n; ++k) {
      auto const b = static_cast<unsigned char>(p_[i_ + static_cast<std::size_t>(k)]);
      if ((b & 0xC0) != 0x80) fail(errc::invalid_argument, "invalid UTF-8 in the pattern");
      c = (c << 6) | (b & 0x3Fu);
    }
    i_ += static_cast<std::size_t>(n);
    return c;
  }

  static range_list complement(range_list r) {
    std::sort(r.begin(), r.end());
    range_list out;
    std::uint32_t next = 0;
    for (auto [lo, hi] : r) {
      if (lo > next) out.emplace_back(next, lo - 1);
      if (hi + 1 > next) next = hi + 1;
    }
    if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
    return out;
  }

  std::uint32_t hex(std::size_t digits) {
    std::uint32_t v = 0;
    for (std::size_t k = 0; k < digits; ++k) {
      if (i_ >= p_.size()) fail(errc::invalid_argument, "truncated hexadecimal escape");
      char const h = p_[i_];
      int d = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) fail(errc::invalid_argument, "bad hexadecimal digit in an escape");
      v = v * 16 + static_cast<std::uint32_t>(d);
      ++i_;
    }
    return v;
  }

  //! An escape at p_[i_] == '\\': its set of code points.
  range_list escape(bool in_class) {
    ++i_;
    if (i_ >= p_.size()) fail(errc::invalid_argument, "the pattern ends with a lone backslash");
    char const c = p_[i_];
    range_list const digit{{'0', '9'}};
    range_list const word{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    range_list const space{{'\t', '\r'}, {' ', ' '}};
    switch (c) {
      case 'd':
        ++i_;
        return digit;
      case 'D':
        ++i_;
        return complement(digit);
      case 'w':
        ++i_;
        return word;
      case 'W':
        ++i_;
        return complement(word);
      case 's':
        ++i_;
        return space;
      case 'S':
        ++i_;
        return complement(space);
      case 'n':
        ++i_;
        return {single('\n')};
      case 't':
        ++i_;
        return {single('\t')};
      case 'r':
        ++i_;
        return {single('\r')};
      case 'f':
        ++i_;
        return {single('\f')};
      case 'v':
        ++i_;
        return {single('\v')};
      case '0':
        ++i_;
        return {single(0)};
      case 'x':
        ++i_;
        return {single(hex(2))};
      case 'u':
        ++i_;
        return {single(hex(4))};
      case 'b':
        if (in_class) {
          ++i_;
          return {single('\b')};
        }
        fail(errc::unsupported, "word boundaries are not supported");
      default:
        break;
    }
    if ((c >= '1' && c <= '9') || c == 'k')
      fail(errc::unsupported, "backreferences are not supported");
    if (c == 'B' || c == 'A' || c == 'Z' || c == 'z' || c == 'G')
      fail(errc::unsupported, "anchors and boundaries are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      fail(errc::invalid_argument, "unknown escape");
    return {single(code_point())};
  }

  //! A class at p_[i_] == '['.
  range_list char_class() {
    std::size_t const open = i_;
    ++i_;
    bool negate = false;
    if (at('^')) {
      negate = true;
      ++i_;
    }
    range_list out;
    bool first = true;
    for (;;) {
      if (i_ >= p_.size()) {
        i_ = open;
        fail(errc::invalid_argument, "unterminated character class");
      }
      if (at(']') && !first) break;
      first = false;
      range_list item;
      bool one = false;
      std::uint32_t lo = 0;
      if (at('\\')) {
        item = escape(true);
        one = item.size() == 1 && item[0].first == item[0].second;
        lo = item.empty() ? 0 : item[0].first;
      } else {
        lo = code_point();
        one = true;
        item = {single(lo)};
      }
      if (one && at('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        std::uint32_t hi = 0;
        if (at('\\')) {
          range_list const e = escape(true);
          if (e.size() != 1 || e[0].first != e[0].second)
            fail(errc::invalid_argument, "a class range ends with a class escape");
          hi = e[0].first;
        } else {
          hi = code_point();
        }
        if (hi < lo) fail(errc::invalid_argument, "a class range out of order");
        item = {{lo, hi}};
      }
      out.insert(out.end(), item.begin(), item.end());
    }
    ++i_;
    return negate ? complement(out) : out;
  }

  std::string_view p_;
  std::size_t i_ = 0;
};

//! The fragment of `n` in `a`.
inline nfa::fragment compile_regex_node(nfa& a, regex_node const& n) {
  switch (n.k) {
    case regex_node::kind::empty:
      return a.empty();
    case regex_node::kind::chars:
      return a.code_points(n.ranges);
    case regex_node::kind::seq: {
      nfa::fragment f = a.empty();
      for (regex_node const& p : n.parts) f = a.seq(f, compile_regex_node(a, p));
      return f;
    }
    case regex_node::kind::alt: {
      std::vector<nfa::fragment> parts;
      for (regex_node const& p : n.parts) parts.push_back(compile_regex_node(a, p));
      return a.alt(parts);
    }
    case regex_node::kind::repeat:
      return a.repeat([&] { return compile_regex_node(a, n.parts[0]); }, n.min, n.max);
  }
  return a.nothing();
}

//! The fragment of `pattern` in `a` (for composing a pattern into a larger automaton).
inline nfa::fragment compile_regex(nfa& a, std::string_view pattern) {
  regex_node const n = regex_parser(pattern).parse();
  return compile_regex_node(a, n);
}

}  // namespace detail

//! The DFA of `pattern` (syntax in the file comment). Throws `errc::invalid_argument` or
//! `errc::unsupported` with the offset of the error, or when the automaton would exceed
//! `max_states` states.
[[nodiscard]] inline byte_dfa compile_regex(std::string_view pattern,
                                            std::size_t max_states = std::size_t{1} << 16) {
  detail::nfa a(std::size_t{1} << 20, "regex \"" + std::string(pattern) + "\"");
  detail::nfa::fragment const f = detail::compile_regex(a, pattern);
  return byte_dfa(a, f, max_states);
}

//! The constraint "the output matches `pattern`" over `vocabulary`.
[[nodiscard]] inline std::shared_ptr<automaton_constraint const> regex_constraint(
    std::string_view pattern, std::shared_ptr<token_vocabulary const> vocabulary) {
  return std::make_shared<automaton_constraint const>(compile_regex(pattern), std::move(vocabulary),
                                                      "regex constraint");
}

}  // namespace specdec
