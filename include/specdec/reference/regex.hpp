#pragma once
//! \file
//! Reference regular-expression matching: a backtracking matcher over the parsed pattern
//! (`detail::regex_node`, sampling/regex.hpp), byte by byte over UTF-8, with no automaton. Slow
//! and obviously correct; the tests compare the DFA and the token tables against it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "specdec/sampling/regex.hpp"

namespace specdec::reference {

namespace detail_regex {

using specdec::detail::regex_node;

//! Whether the bytes s[pos..] start a code point of `ranges`: `k` then says how many bytes it
//! takes; with `prefix`, bytes that run out mid-character count when some code point of the
//! ranges starts with them (k = the bytes left).
inline bool code_point_at(regex_node const& n, std::string_view s, std::size_t pos, bool prefix,
                          std::size_t& k) {
  auto const b0 = static_cast<unsigned char>(s[pos]);
  std::size_t const len = b0 < 0x80         ? 1
                          : (b0 >> 5) == 6  ? 2
                          : (b0 >> 4) == 14 ? 3
                          : (b0 >> 3) == 30 ? 4
                                            : 0;
  if (len == 0) return false;
  std::size_t const have = std::min(len, s.size() - pos);
  if (have < len && !prefix) return false;
  std::uint32_t lo = len == 1 ? b0 : b0 & (0x7Fu >> len);
  std::uint32_t hi = lo;
  for (std::size_t i = 1; i < len; ++i) {
    if (i < have) {
      auto const b = static_cast<unsigned char>(s[pos + i]);
      if ((b & 0xC0) != 0x80) return false;
      lo = (lo << 6) | (b & 0x3Fu);
      hi = (hi << 6) | (b & 0x3Fu);
    } else {
      lo = lo << 6;
      hi = (hi << 6) | 0x3Fu;
    }
  }
  static constexpr std::uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  lo = std::max(lo, smallest[len]);
  hi = std::min<std::uint32_t>(hi, 0x10FFFF);
  for (auto [a, b] : n.ranges) {
    std::uint32_t const x = std::max(a, lo), y = std::min(b, hi);
    if (x > y) continue;
    // Some code point in [x, y] that is not a surrogate.
    if (x < 0xD800 || y > 0xDFFF) {
      k = have;
      return true;
    }
  }
  return false;
}

inline bool match(regex_node const& n, std::string_view s, std::size_t pos, bool prefix,
                  std::function<bool(std::size_t)> const& cont) {
  switch (n.k) {
    case regex_node::kind::empty:
      return cont(pos);
    case regex_node::kind::chars: {
      if (pos == s.size()) return prefix && !n.ranges.empty();
      std::size_t k = 0;
      return code_point_at(n, s, pos, prefix, k) && cont(pos + k);
    }
    case regex_node::kind::seq: {
      std::function<bool(std::size_t, std::size_t)> step = [&](std::size_t i, std::size_t p) {
        if (i == n.parts.size()) return cont(p);
        return match(n.parts[i], s, p, prefix, [&](std::size_t q) { return step(i + 1, q); });
      };
      return step(0, pos);
    }
    case regex_node::kind::alt:
      for (regex_node const& p : n.parts)
        if (match(p, s, pos, prefix, cont)) return true;
      return false;
    case regex_node::kind::repeat: {
      std::function<bool(std::int64_t, std::size_t)> rep = [&](std::int64_t count, std::size_t p) {
        if (count >= n.min && cont(p)) return true;
        if (n.max >= 0 && count >= n.max) return false;
        return match(n.parts[0], s, p, prefix, [&](std::size_t q) {
          if (q == p && count >= n.min) return false;         // no progress: the loop adds nothing
          if (q == s.size() && prefix && q > p) return true;  // the rest can follow
          return rep(count + 1, q);
        });
      };
      return rep(0, pos);
    }
  }
  return false;
}

}  // namespace detail_regex

//! Whether the whole of `text` matches `pattern` (backtracking).
[[nodiscard]] inline bool regex_matches(std::string_view pattern, std::string_view text) {
  auto const n = specdec::detail::regex_parser(pattern).parse();
  return detail_regex::match(n, text, 0, false, [&](std::size_t p) { return p == text.size(); });
}

//! Whether `text` is the beginning of some match of `pattern` (backtracking).
[[nodiscard]] inline bool regex_viable_prefix(std::string_view pattern, std::string_view text) {
  auto const n = specdec::detail::regex_parser(pattern).parse();
  return detail_regex::match(n, text, 0, true, [&](std::size_t p) { return p == text.size(); });
}

}  // namespace specdec::reference
