// Regular expressions compiled to byte DFAs (sampling/regex.hpp) and their token tables
// (sampling/automaton.hpp): whole-string matches against std::regex and the backtracking
// reference (reference/regex.hpp), each state's allowed tokens against the reference run over
// each token's bytes, and bad patterns refused with their offset.

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <random>
// GCC 12 warns inside <regex> itself (maybe-uninitialized, in std::function) at -O1.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>
#pragma GCC diagnostic pop
#include <string>
#include <thread>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/reference/regex.hpp"
#include "specdec/sampling/automaton.hpp"
#include "specdec/sampling/automaton_constraint.hpp"
#include "specdec/sampling/regex.hpp"
#include "support/fixture.hpp"

namespace regex_test {

using specdec::token_id;

// ASCII patterns std::regex (ECMAScript) reads the same way.
std::vector<std::string> const ascii_patterns = {
    "abc",
    "a|b|cd",
    "(ab)*c",
    "[a-c]+x?",
    "\\d{2,4}-\\d{2}",
    "[^ab]{1,3}",
    "(a|ab)(c|bcd)(d*)",
    "x(?:yz|y)*z",
    "\\w+@\\w+\\.com",
    "[-+]?[0-9]*\\.?[0-9]+",
    "(true|false|null)",
    "\"([^\"\\\\]|\\\\.)*\"",
    "a{3}",
    "a{2,}b",
    "(\\s|,)*[A-Z][a-z]*",
    "^ab$",
    "[\\]\\-a]+",
};

std::string random_string(std::mt19937& rng, std::string const& alphabet, std::size_t max_len) {
  std::uniform_int_distribution<std::size_t> len(0, max_len);
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  std::string s;
  for (std::size_t n = len(rng); n > 0; --n) s += alphabet[pick(rng)];
  return s;
}

// Strings that match often: random walks of the DFA, ended in an accepting state when possible.
std::string dfa_walk(specdec::byte_dfa const& dfa, std::mt19937& rng, std::size_t max_len) {
  std::string s;
  std::int32_t state = 0;
  std::uniform_int_distribution<int> coin(0, 3);
  while (s.size() < max_len) {
    if (dfa.accepting(state) && coin(rng) == 0) break;
    std::vector<int> next;
    for (int b = 0; b < 256; ++b)
      if (dfa.next(state, static_cast<std::uint8_t>(b)) >= 0) next.push_back(b);
    if (next.empty()) break;
    int const b = next[std::uniform_int_distribution<std::size_t>(0, next.size() - 1)(rng)];
    s += static_cast<char>(b);
    state = dfa.next(state, static_cast<std::uint8_t>(b));
  }
  return s;
}

}  // namespace regex_test

TEST_CASE("regex DFA: whole-string matches agree with std::regex and the backtracking reference") {
  using namespace regex_test;
  std::mt19937 rng(7);
  std::string const alphabet = "abcdxyz019-+.@\" \\,ABZ_\n";
  for (std::string const& pattern : ascii_patterns) {
    CAPTURE(pattern);
    specdec::byte_dfa const dfa = specdec::compile_regex(pattern);
    std::regex const expected(pattern, std::regex::ECMAScript);
    int matched = 0;
    for (int i = 0; i < 600; ++i) {
      std::string const s = i % 2 == 0 ? random_string(rng, alphabet, 8) : dfa_walk(dfa, rng, 40);
      CAPTURE(s);
      bool const ascii = std::all_of(s.begin(), s.end(), [](char c) { return c >= 0; });
      bool const want = specdec::reference::regex_matches(pattern, s);
      REQUIRE(dfa.matches(s) == want);
      // std::regex reads bytes as characters: it judges ASCII strings only.
      if (ascii) REQUIRE(std::regex_match(s, expected) == want);
      matched += want ? 1 : 0;
    }
    CHECK(matched > 10);  // the walks do reach matches: the comparison is not all "no"
  }
}

TEST_CASE("regex DFA: UTF-8 classes, dot and escapes") {
  using namespace regex_test;
  auto const dfa = specdec::compile_regex("[é-ü]\\u00e9.[^a]\\x41");
  CHECK(dfa.matches("ééxbA"));
  CHECK(
      dfa.matches("üé€\xf0\x9f\x98\x80"
                  "A"));  // a 3-byte dot, a 4-byte negated class
  CHECK_FALSE(dfa.matches("ééxaA"));
  CHECK_FALSE(dfa.matches("eéxbA"));
  CHECK_FALSE(dfa.matches("éé\nbA"));  // dot excludes newline
  CHECK_FALSE(
      dfa.matches("éé\xed\xa0\x80"
                  "bA"));  // a surrogate is not a character
  CHECK_FALSE(
      dfa.matches("éé\xc3"
                  "bA"));  // a truncated character
  for (std::string text : {"ééxbA", "üé€zA", "ééxaA",
                           "é\xc3\xa9\xc3"
                           "bA"})
    CHECK(dfa.matches(text) == specdec::reference::regex_matches("[é-ü]\\u00e9.[^a]\\x41", text));
}

TEST_CASE("regex: bad patterns are refused with the offset of the error") {
  using namespace regex_test;
  struct bad {
    char const* pattern;
    char const* says;
  };
  for (bad const& b :
       {bad{"ab(c", "missing ')' at offset 4"}, bad{"ab)c", "unmatched ')' at offset 2"},
        bad{"*a", "nothing to repeat at offset 0"}, bad{"a{3,2}", "m < n at offset"},
        bad{"[abc", "unterminated character class at offset 0"},
        bad{"[z-a]", "out of order at offset"}, bad{"a\\", "lone backslash"},
        bad{"(?=a)", "lookaround"}, bad{"(a)\\1", "backreferences"}, bad{"a^b", "anchors"},
        bad{"\\bword", "word boundaries"}, bad{"\\q", "unknown escape at offset 1"},
        bad{"a{20000}", "above 10000"}, bad{"\xff", "invalid UTF-8"},
        bad{"[^\\s\\S]", "matches no string"}}) {
    CAPTURE(b.pattern);
    try {
      (void)specdec::compile_regex(b.pattern);
      FAIL("accepted");
    } catch (specdec::error const& e) {
      CHECK(std::string(e.what()).find(b.says) != std::string::npos);
    }
  }
  // A pattern whose automaton would be too large is refused, not built.
  CHECK_THROWS_AS((void)specdec::compile_regex("[ab]*a[ab]{20}", 1000), specdec::error);
}

TEST_CASE("token tables: each state's allowed tokens are those whose bytes keep a match possible") {
  using namespace regex_test;
  auto const vocab = std::make_shared<specdec::token_vocabulary const>(
      specdec::token_vocabulary::of(fixture::tok512()));
  std::mt19937 rng(11);
  for (std::string const pattern :
       {"\\{\"name\": \"[A-Z][a-z]{1,8}\", \"age\": [1-9][0-9]?\\}",
        " (the|a) [a-z]+ (is|was) [a-z ]{3,20}\\.", "(yes|no|maybe)", "[0-9]+(\\.[0-9]{1,2})?"}) {
    CAPTURE(pattern);
    auto const c = specdec::regex_constraint(pattern, vocab);
    // Random constrained walks; at each step compare the whole table with the reference.
    for (int walk = 0; walk < 3; ++walk) {
      specdec::automaton_constraint::state_type s = c->start();
      std::string text;
      for (int step = 0; step < 12; ++step) {
        std::vector<token_id> allowed;
        for (std::size_t t = 0; t < vocab->size(); ++t) {
          auto const id = static_cast<token_id>(t);
          bool want;
          if (vocab->is_end(id)) {
            want = specdec::reference::regex_matches(pattern, text);
          } else {
            std::string_view const bytes = vocab->bytes(id);
            want = !bytes.empty() &&
                   specdec::reference::regex_viable_prefix(pattern, text + std::string(bytes));
          }
          REQUIRE(c->allows(s, id) == want);
          if (want) allowed.push_back(id);
        }
        REQUIRE(c->table(s).count == allowed.size());
        REQUIRE(c->forced(s) == (allowed.size() == 1 ? allowed[0] : specdec::no_token));
        REQUIRE_FALSE(allowed.empty());
        token_id const t =
            allowed[std::uniform_int_distribution<std::size_t>(0, allowed.size() - 1)(rng)];
        REQUIRE(c->advance(s, t));
        if (vocab->is_end(t)) {
          CHECK(c->complete(s));
          break;
        }
        text += vocab->bytes(t);
      }
    }
  }
}

TEST_CASE(
    "token tables: a vocabulary that cannot spell every byte allows only completable tokens") {
  using namespace regex_test;
  // Tokens: "a", "bc", "b" is missing: "ab" can never be finished by "abd" alone.
  std::vector<std::string> bytes = {"", "a", "bc", "d", "abd"};
  auto const vocab =
      std::make_shared<specdec::token_vocabulary const>(bytes, std::vector<token_id>{0});
  auto const c = specdec::regex_constraint("a(bd|bc)", vocab);
  auto s = c->start();
  CHECK(c->allows(s, 1));        // "a" then "bc"
  CHECK(c->allows(s, 4));        // "abd"
  CHECK_FALSE(c->allows(s, 0));  // not complete yet
  REQUIRE(c->advance(s, 1));
  CHECK(c->forced(s) == 2);  // only "bc" finishes it ("b" + "d" has no "b" token)
  REQUIRE(c->advance(s, 2));
  CHECK(c->complete(s));
  CHECK_FALSE(c->advance(s, 3));
  // Nothing of this vocabulary spells "ab" + "x".
  CHECK_THROWS_AS((void)specdec::regex_constraint("abx", vocab), specdec::error);
}

TEST_CASE("token tables: an end token is never text, whatever its bytes") {
  using namespace regex_test;
  std::vector<std::string> bytes = {"a", "b"};  // token 1 ("b") ends the output
  auto const vocab =
      std::make_shared<specdec::token_vocabulary const>(bytes, std::vector<token_id>{1});
  CHECK_THROWS_AS((void)specdec::regex_constraint("ab", vocab), specdec::error);
  auto const c = specdec::regex_constraint("a", vocab);
  auto s = c->start();
  CHECK_FALSE(c->allows(s, 1));
  REQUIRE(c->advance(s, 0));
  CHECK(c->allows(s, 1));
  CHECK(c->complete(s));
  // Out-of-range states are refused, not read.
  CHECK_THROWS_AS((void)c->table(12345), specdec::error);
  specdec::automaton_constraint::state_type bad = 12345;
  CHECK_FALSE(c->advance(bad, 0));
}

TEST_CASE("token tables: built concurrently by several threads, the same tables (concurrent)") {
  using namespace regex_test;
  auto const vocab = std::make_shared<specdec::token_vocabulary const>(
      specdec::token_vocabulary::of(fixture::tok512()));
  std::string const pattern =
      "\\{\"name\": \"[A-Z][a-z]{1,8}\", \"tags\": \\[(\"[a-z]+\"(, )?){0,3}\\]\\}";
  auto const alone = specdec::regex_constraint(pattern, vocab);
  auto const shared = specdec::regex_constraint(pattern, vocab);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  std::vector<std::size_t> steps(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(static_cast<unsigned>(100 + w));
      for (int walk = 0; walk < 20; ++walk) {
        auto s = shared->start();
        for (int step = 0; step < 30 && !shared->complete(s); ++step) {
          ++steps[static_cast<std::size_t>(w)];
          auto const& table = shared->table(s);
          if (table.mask != alone->table(s).mask) ++mismatches[static_cast<std::size_t>(w)];
          std::vector<token_id> allowed;
          for (std::size_t t = 0; t < vocab->size(); ++t)
            if (shared->allows(s, static_cast<token_id>(t)) &&
                !vocab->is_end(static_cast<token_id>(t)))
              allowed.push_back(static_cast<token_id>(t));
          if (allowed.empty()) break;
          (void)shared->advance(s, allowed[rng() % allowed.size()]);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int m : mismatches) CHECK(m == 0);
  for (std::size_t s : steps) CHECK(s > 200);  // the walks went deep: many states were built
}
