// Corrupted JSON Schema files and mangled regular expressions (sampling/json_schema.hpp,
// sampling/regex.hpp): each variant is refused with a specdec::error or compiled and used (a
// constraint over the fixture's vocabulary walked token by token), never a crash, a sanitizer
// report or another exception (tests/support/corrupt.hpp; both run as the ctest
// sampling_corrupt_schema).

#include <doctest/doctest.h>

#include <cstddef>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "specdec/core/error.hpp"
#include "specdec/sampling/automaton_constraint.hpp"
#include "specdec/sampling/json_schema.hpp"
#include "specdec/sampling/regex.hpp"
#include "support/corrupt.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

namespace corrupt_schema_test {

std::shared_ptr<sd::token_vocabulary const> const& vocabulary() {
  static auto const v =
      std::make_shared<sd::token_vocabulary const>(sd::token_vocabulary::of(fixture::tok512()));
  return v;
}

// Uses a constraint: a walk of up to 24 tokens, each the lowest allowed one that is not an end.
void use(sd::automaton_constraint const& c) {
  auto s = c.start();
  for (int step = 0; step < 24 && !c.complete(s); ++step) {
    auto const& mask = c.allowed(s);
    sd::token_id next = sd::no_token;
    for (std::size_t t = 0; t < c.vocab_size() && next == sd::no_token; ++t)
      if (((mask[t / 64] >> (t % 64)) & 1u) != 0 &&
          !c.vocabulary().is_end(static_cast<sd::token_id>(t)))
        next = static_cast<sd::token_id>(t);
    if (next == sd::no_token) break;
    REQUIRE(c.advance(s, next));
  }
}

}  // namespace corrupt_schema_test

TEST_CASE("corrupted JSON Schema files are refused or compiled and used" * doctest::skip()) {
  using namespace corrupt_schema_test;
  test_support::temp_dir dir;
  std::string const good = R"json({
  "type": "object",
  "$defs": {"tag": {"type": "string", "maxLength": 6}},
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": ["integer", "null"]},
    "email": {"type": "string", "pattern": "[a-z]{1,8}@[a-z]{1,8}\\.com"},
    "pet": {"enum": ["cat", "dog", 3, true, null]},
    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "maxItems": 3},
    "nested": {"anyOf": [{"type": "number"}, {"type": "object", "properties": {"a": {"const": 1}}}]}
  },
  "required": ["name", "age"]
})json";
  auto const path = dir.file("good.json");
  {
    std::ofstream out(path, std::ios::binary);
    out << good;
  }
  auto const probe = [](std::filesystem::path const& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    // A bounded automaton: a corrupted bound (maxLength 99999) is refused, not built for long.
    sd::byte_dfa dfa = sd::compile_json_schema(text.str(), {}, 4096);
    sd::automaton_constraint const c(std::move(dfa), vocabulary());
    use(c);
  };
  auto const counts = test_support::corrupt_file_loop(test_support::read_bytes(path), 64, 29, 300,
                                                      dir.file("variant.json"), probe);
  MESSAGE("JSON Schema file variants: ", counts.refused, " refused, ", counts.accepted,
          " compiled and used");
  CHECK(counts.refused > 0);  // byte-level damage is nearly always bad JSON: see below

  // Damage that keeps the JSON valid, so that the compiler's own checks are reached: a random
  // node's value replaced by a boundary value or a value of another type, a member removed, an
  // unknown keyword added, a type renamed.
  auto const schema = nlohmann::ordered_json::parse(good);
  std::vector<nlohmann::ordered_json> const values = {
      -1,
      0,
      1,
      2147483648LL,
      1e300,
      -1e300,
      0.5,
      "",
      "string",
      "integer",
      "#/$defs/none",
      nlohmann::ordered_json::array(),
      nlohmann::ordered_json::object(),
      true,
      false,
      nullptr,
      nlohmann::ordered_json::array({"name", "nope"}),
      99999};
  std::mt19937_64 rng(37);
  std::size_t refused = 0, accepted = 0;
  for (int i = 0; i < 240; ++i) {
    nlohmann::ordered_json j = schema;
    for (int edits = 1 + static_cast<int>(rng() % 2); edits > 0; --edits) {
      // A random node: walk down from the root a random number of steps.
      nlohmann::ordered_json* node = &j;
      for (int depth = static_cast<int>(rng() % 5); depth > 0; --depth) {
        if (!node->is_structured() || node->empty()) break;
        auto it = node->begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % node->size()));
        node = &*it;
      }
      switch (rng() % 4) {
        case 0:
          *node = values[rng() % values.size()];
          break;
        case 1:
          if (node->is_object() && !node->empty()) node->erase(node->begin());
          break;
        case 2:
          if (node->is_object()) (*node)["x-unknown"] = 1;
          break;
        default:
          if (node->is_object()) (*node)["type"] = values[rng() % values.size()];
          break;
      }
    }
    std::string const text = j.dump();
    CAPTURE(text);
    try {
      sd::automaton_constraint const c(sd::compile_json_schema(text, {}, 4096), vocabulary());
      use(c);
      ++accepted;
    } catch (sd::error const&) {
      ++refused;
    }
  }
  MESSAGE("JSON Schema edits: ", refused, " refused, ", accepted, " compiled and used");
  CHECK(refused > 30);
  CHECK(accepted > 30);
}

TEST_CASE("mangled regular expressions are refused or compiled and used" * doctest::skip()) {
  using namespace corrupt_schema_test;
  std::vector<std::string> const seeds = {
      "\\{\"name\": \"[A-Z][a-z]{1,10}\", \"age\": [1-9][0-9]?\\}", "(a|b(c|d)*){2,5}[^x-z]+\\d?",
      "[\\w.-]+@[\\w-]+\\.(com|org|net)", "(?:é|ü){1,3}\\u00e9.\\x41"};
  std::string const alphabet = "()[]{}|*+?.^$\\-,:0123456789aAzZ\"' é";
  std::mt19937_64 rng(31);
  std::size_t refused = 0, accepted = 0;
  for (int i = 0; i < 600; ++i) {
    std::string p = seeds[static_cast<std::size_t>(i) % seeds.size()];
    for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
      std::size_t const at = p.empty() ? 0 : rng() % p.size();
      switch (rng() % 3) {
        case 0:
          if (!p.empty()) p.erase(at, 1);
          break;
        case 1:
          p.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
        default:
          if (!p.empty()) p[at] = alphabet[rng() % alphabet.size()];
          break;
      }
    }
    CAPTURE(p);
    try {
      sd::automaton_constraint const c(sd::compile_regex(p, 4096), vocabulary());
      use(c);
      ++accepted;
    } catch (sd::error const&) {
      ++refused;
    }
  }
  CHECK(refused > 50);
  CHECK(accepted > 50);
}
