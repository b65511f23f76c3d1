// JSON Schema compiled to byte DFAs (sampling/json_schema.hpp): random walks of each DFA judged by
// an independent checker (nlohmann's parser, a small validator of the instance against the
// schema, and a check of the layout), hand-written instances in and out in every layout, the
// size of an object with many optional properties, errors that say where they are, and the token
// constraint over a schema.

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
// GCC 12 warns inside <regex> itself (maybe-uninitialized, in std::function) at -O1.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>
#pragma GCC diagnostic pop
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/sampling/automaton.hpp"
#include "specdec/sampling/automaton_constraint.hpp"
#include "specdec/sampling/json_schema.hpp"

namespace json_schema_test {

using specdec::json_whitespace;
using ordered = nlohmann::ordered_json;

constexpr std::array<json_whitespace, 3> layouts{json_whitespace::compact, json_whitespace::spaced,
                                                 json_whitespace::flexible};

char const* layout_name(json_whitespace w) {
  return w == json_whitespace::compact  ? "compact"
         : w == json_whitespace::spaced ? "spaced"
                                        : "flexible";
}

// ---- The independent checker ----------------------------------------------------------------

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Checks the layout of `text` outside strings and copies it to `out` with the numbers nlohmann
// cannot hold replaced by ones of the same kind (it refuses a float that overflows a double, and
// holds an integer of more than 19 digits as a float): an integer of more than 18 digits becomes
// 10^17, a float that overflows 1e300. Returns what is wrong with the layout, or "".
std::string layout_and_numbers(std::string_view text, json_whitespace w, int max_ws,
                               std::string& out) {
  static std::regex const number("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?");
  out.clear();
  bool in_string = false;
  std::size_t i = 0;
  while (i < text.size()) {
    char const c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[i + 1];
        i += 2;
        continue;
      }
      if (c == '"') in_string = false;
      ++i;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      ++i;
      continue;
    }
    if (is_space(c)) {
      std::size_t j = i;
      while (j < text.size() && is_space(text[j])) ++j;
      std::string_view const run = text.substr(i, j - i);
      if (w == json_whitespace::compact) return "whitespace in the compact layout";
      if (w == json_whitespace::spaced &&
          (run != " " || i == 0 || (text[i - 1] != ',' && text[i - 1] != ':')))
        return "whitespace other than one space after ',' or ':'";
      if (w == json_whitespace::flexible) {
        if (i == 0 || j == text.size()) return "whitespace at the start or the end";
        if (run.size() > static_cast<std::size_t>(max_ws)) return "too much whitespace";
        if (run.find('\r') != std::string_view::npos) return "a carriage return";
      }
      out += run;
      i = j;
      continue;
    }
    if (w == json_whitespace::spaced && (c == ',' || c == ':') &&
        (i + 1 >= text.size() || text[i + 1] != ' '))
      return "no space after ',' or ':'";
    if (c == '-' || (c >= '0' && c <= '9')) {
      std::size_t j = i;
      while (j < text.size() &&
             std::string_view("0123456789+-.eE").find(text[j]) != std::string_view::npos)
        ++j;
      std::string token(text.substr(i, j - i));
      if (std::regex_match(token, number)) {
        std::string const sign = token[0] == '-' ? "-" : "";
        if (token.find_first_of(".eE") == std::string::npos) {
          if (token.size() - sign.size() > 18) token = sign + "100000000000000000";
        } else if (std::isinf(std::strtod(token.c_str(), nullptr))) {
          token = sign + "1e300";
        }
      }
      out += token;
      i = j;
      continue;
    }
    out += c;
    ++i;
  }
  return "";
}

std::size_t code_points(std::string const& s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) == 0x80 ? 0 : 1;
  return n;
}

// A validator of an instance against a schema, written from the JSON Schema rules, with the
// narrowing the compiler documents for undeclared members: an object schema with `properties`
// admits no others.
class validator {
 public:
  explicit validator(nlohmann::json root) : root_(std::move(root)) {}

  [[nodiscard]] bool valid(nlohmann::json const& v) const { return valid(v, root_); }

 private:
  bool valid(nlohmann::json const& v, nlohmann::json const& s) const {
    if (s.is_boolean()) return s.get<bool>();
    if (s.contains("$ref")) {
      std::string const r = s["$ref"].get<std::string>();
      if (r == "#") return valid(v, root_);
      for (std::string const prefix : {"#/$defs/", "#/definitions/"})
        if (r.rfind(prefix, 0) == 0)
          return valid(v, root_[prefix.substr(2, prefix.size() - 3)][r.substr(prefix.size())]);
      return false;
    }
    if (s.contains("anyOf")) {
      bool any = false;
      for (auto const& b : s["anyOf"]) any = any || valid(v, b);
      if (!any) return false;
    }
    if (s.contains("oneOf")) {
      int n = 0;
      for (auto const& b : s["oneOf"]) n += valid(v, b) ? 1 : 0;
      if (n != 1) return false;
    }
    if (s.contains("allOf"))
      for (auto const& b : s["allOf"])
        if (!valid(v, b)) return false;
    if (s.contains("enum")) {
      bool found = false;
      for (auto const& e : s["enum"]) found = found || e == v;
      if (!found) return false;
    }
    if (s.contains("const") && s["const"] != v) return false;
    if (s.contains("type")) {
      auto const& t = s["type"];
      bool ok = false;
      if (t.is_array()) {
        for (auto const& name : t) ok = ok || of_type(v, name.get<std::string>());
      } else {
        ok = of_type(v, t.get<std::string>());
      }
      if (!ok) return false;
    }
    if (v.is_string()) {
      std::string const text = v.get<std::string>();
      if (s.contains("minLength") && code_points(text) < s["minLength"].get<std::size_t>())
        return false;
      if (s.contains("maxLength") && code_points(text) > s["maxLength"].get<std::size_t>())
        return false;
      if (s.contains("pattern") &&
          !std::regex_match(text, std::regex(s["pattern"].get<std::string>())))
        return false;
    }
    if (v.is_array()) {
      if (s.contains("minItems") && v.size() < s["minItems"].get<std::size_t>()) return false;
      if (s.contains("maxItems") && v.size() > s["maxItems"].get<std::size_t>()) return false;
      if (s.contains("items"))
        for (auto const& item : v)
          if (!valid(item, s["items"])) return false;
    }
    if (v.is_object()) {
      if (s.contains("required"))
        for (auto const& name : s["required"])
          if (!v.contains(name.get<std::string>())) return false;
      bool const closed = s.contains("properties") || (s.contains("additionalProperties") &&
                                                       s["additionalProperties"] == false);
      for (auto const& [key, value] : v.items()) {
        if (s.contains("properties") && s["properties"].contains(key)) {
          if (!valid(value, s["properties"][key])) return false;
        } else if (closed) {
          return false;
        }
      }
    }
    return true;
  }

  static bool of_type(nlohmann::json const& v, std::string const& t) {
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.is_number_integer();
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "object") return v.is_object();
    if (t == "array") return v.is_array();
    return false;
  }

  nlohmann::json root_;
};

// What is wrong with `text` as an instance of `schema` in layout `w`, or "".
std::string judge(std::string_view text, std::string_view schema, json_whitespace w,
                  int max_ws = 2) {
  std::string normalized;
  std::string const layout = layout_and_numbers(text, w, max_ws, normalized);
  if (!layout.empty()) return layout;
  nlohmann::json const v = nlohmann::json::parse(normalized, nullptr, false);
  if (v.is_discarded()) return "not JSON";
  if (!validator(nlohmann::json::parse(schema)).valid(v)) return "not an instance";
  return "";
}

// ---- Writing instances in a layout (independent of the compiler's) ----------------------------

std::string write(ordered const& v, json_whitespace w) {
  if (w == json_whitespace::compact) return v.dump();
  if (!v.is_array() && !v.is_object()) return v.dump();
  bool const spaced = w == json_whitespace::spaced;
  std::string const comma = spaced ? ", " : " ,\n";
  std::string const colon = spaced ? ": " : " :\t";
  std::string const after_open = spaced ? "" : "\n ";
  std::string const before_close = spaced ? "" : "\t\n";
  char const open = v.is_array() ? '[' : '{';
  char const close = v.is_array() ? ']' : '}';
  if (v.empty()) return spaced ? std::string{open, close} : std::string{open, ' ', '\n', close};
  std::string out(1, open);
  out += after_open;
  bool first = true;
  for (auto const& [key, value] : v.items()) {
    if (!first) out += comma;
    first = false;
    if (v.is_object()) out += ordered(key).dump() + colon;
    out += write(value, w);
  }
  return out + before_close + close;
}

// ---- Random walks -----------------------------------------------------------------------------

// Random walks of a DFA: at each step one of the distinct next states (then one of the bytes that
// lead there), so that a string's closing quote is as likely as "one more character"; in an
// accepting state the walk stops with probability 1/3.
class walker {
 public:
  explicit walker(specdec::byte_dfa const& dfa) : dfa_(dfa) {}

  // A walk of at most `max_len` bytes; `accepted`: whether it ended in an accepting state.
  std::string walk(std::mt19937& rng, std::size_t max_len, bool& accepted) {
    std::string s;
    std::int32_t state = 0;
    std::uniform_int_distribution<int> coin(0, 2);
    while (s.size() < max_len) {
      auto const& g = groups(state);
      if (g.empty() || (dfa_.accepting(state) && coin(rng) == 0)) break;
      auto const& bytes = g[std::uniform_int_distribution<std::size_t>(0, g.size() - 1)(rng)];
      auto const b = bytes[std::uniform_int_distribution<std::size_t>(0, bytes.size() - 1)(rng)];
      s += static_cast<char>(b);
      state = dfa_.next(state, b);
    }
    accepted = dfa_.accepting(state);
    return s;
  }

 private:
  std::vector<std::vector<std::uint8_t>> const& groups(std::int32_t state) {
    auto const it = cache_.find(state);
    if (it != cache_.end()) return it->second;
    std::map<std::int32_t, std::vector<std::uint8_t>> by_target;
    for (int b = 0; b < 256; ++b) {
      std::int32_t const t = dfa_.next(state, static_cast<std::uint8_t>(b));
      if (t >= 0) by_target[t].push_back(static_cast<std::uint8_t>(b));
    }
    std::vector<std::vector<std::uint8_t>> g;
    for (auto& [t, bytes] : by_target) g.push_back(std::move(bytes));
    return cache_.emplace(state, std::move(g)).first->second;
  }

  specdec::byte_dfa const& dfa_;
  std::map<std::int32_t, std::vector<std::vector<std::uint8_t>>> cache_;
};

// ---- The schemas ------------------------------------------------------------------------------

struct schema_case {
  char const* name;
  char const* schema;
  int max_recursion;
  std::vector<char const*> valid;     // instances (any layout: written again in each)
  std::vector<char const*> invalid;   // not instances: the DFA and the checker refuse them
  std::vector<char const*> narrowed;  // instances the DFA refuses by design (order, depth bounds)
  // Textual edits of valid[0] as written in each layout (the last occurrence of .first becomes
  // .second) that make it invalid JSON or not an instance.
  std::vector<std::pair<char const*, char const*>> edits;
};

std::vector<schema_case> const cases = {
    {"person",
     R"js({"type": "object", "properties": {
          "name": {"type": "string", "maxLength": 12, "description": "ignored"},
          "age": {"type": "integer"},
          "email": {"type": "string", "pattern": "[a-z]{1,8}@[a-z]{1,8}\\.(com|org)"},
          "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": false})js",
     3,
     {R"({"name": "Ada", "age": 36, "tags": ["red"]})",
      R"({"name": "Bob é", "age": -5, "email": "bob@mail.org", "tags": []})",
      R"({"name": "x\"y\n\u0001/", "age": 0, "tags": ["red", "green", "blue"]})",
      R"({"name": "日本語のテキスト😀", "age": 12345678901234, "tags": ["blue", "blue"]})"},
     {R"({"name": "Ada", "tags": []})",                         // missing required
      R"({"name": "Ada", "age": 1, "tags": [], "nick": "A"})",  // an extra property
      R"({"name": "Ada", "age": "36", "tags": []})",            // wrong type
      R"({"name": "Ada", "age": 1.5, "tags": []})",             // a number, not an integer
      R"({"name": "Ada", "age": 1, "tags": ["red", "red", "red", "red"]})",  // too many items
      R"({"name": "Ada Lovelace-B", "age": 1, "tags": []})",                 // 14 characters
      R"({"name": "Ada", "age": 1, "tags": ["pink"]})",                      // not in the enum
      R"({"name": "Ada", "age": 1, "email": "Ada@x.com", "tags": []})",      // the pattern
      R"({"name": null, "age": 1, "tags": []})"},
     {R"({"age": 36, "name": "Ada", "tags": []})"},  // declaration order
     {{"36", "036"}, {"Ada", "A\\qa"}, {"}", ",}"}, {"]", ",]"}, {"\"red\"", "red"}}},
    {"nested optional members",
     R"({"type": "object", "properties": {
          "id": {"type": "integer"},
          "meta": {"type": "object", "properties": {
              "created": {"type": "string"},
              "score": {"type": "number"},
              "flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1,
                        "maxItems": 2}},
            "required": ["created"]},
          "note": {"type": ["string", "null"]}},
        "required": ["id"]})",
     3,
     {R"({"id": 1})", R"({"id": 2, "meta": {"created": "now"}})",
      R"({"id": 3, "meta": {"created": "t", "score": -1.5e3, "flags": [true, false]},)"
      R"( "note": null})",
      R"({"id": 4, "note": "x"})", R"({"id": 5, "meta": {"created": "", "flags": [false]}})"},
     {R"({"id": 1, "meta": {}})", R"({"id": 1, "meta": {"created": "a", "flags": []}})",
      R"({"id": 1, "meta": {"created": "a", "flags": [true, true, true]}})",
      R"({"meta": {"created": "a"}})", R"({"id": 1, "extra": 2})", R"({"id": 1, "note": 3})",
      R"({"id": 1, "meta": {"created": "a", "score": "1"}})"},
     {R"({"note": null, "id": 1})"},
     {{"1", "01"}, {"1", "1."}, {"}", ",}"}, {"{", "{,"}}},
    {"recursive tree",
     R"({"$defs": {"node": {"type": "object", "properties": {
            "value": {"type": "integer"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
          "required": ["value"]}},
        "$ref": "#/$defs/node"})",
     2,
     {R"({"value": 1, "children": [{"value": 2}, {"value": 3, "children": []}]})",
      R"({"value": 1})", R"({"value": -7, "children": []})"},
     {R"({"value": 1, "children": [{"value": 2}, {"value": 3}, {"value": 4}]})",
      R"({"children": []})", R"({"value": 1, "children": [{"value": "2"}]})",
      R"({"value": 1, "children": {"value": 2}})"},
     {R"({"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]})"},  // depth 3
     {{"1", "01"}, {"}", ",}"}, {"]", ",]"}}},
    {"string or null",
     R"({"type": ["string", "null"], "maxLength": 5})",
     3,
     {R"("abc")", "null", R"("")", R"("\\\"\b\f")", R"("é€😀\t")"},
     {"5", R"("abcdef")", "true", R"(["a"])", R"("ééééé\n")"},
     {},
     {{"abc", "a\\xbc"}, {"abc", "a\\u1bc"}, {"\"abc\"", " \"abc\""}, {"abc\"", "abc\" "}}},
    {"number or boolean",
     R"({"anyOf": [{"type": "number"}, {"type": "boolean"}], "title": "ignored"})",
     3,
     {"1", "-2.5", "1e10", "true", "false", "0", "-0.0"},
     {R"("1")", "null", "[1]", R"({"a": 1})"},
     {},
     {{"1", "01"}, {"1", "1e"}, {"1", "+1"}, {"1", ".1"}}},
    {"enum of mixed values",
     R"({"enum": ["a b", 1, 2.5, null, true, [1, "x"], {"k": "v", "n": [null, {}]}]})",
     3,
     {R"("a b")", "1", "2.5", "null", "true", R"([1, "x"])", R"({"k": "v", "n": [null, {}]})"},
     {R"("a")", "2", "false", "[1]", R"({"k": "v"})", R"(["x", 1])"},
     {R"({"n": [null, {}], "k": "v"})", "1.0"},  // another order; another spelling of 1
     {{"b", "c"}, {"\"a b\"", "\"a b\","}}},
    {"any value",
     "true",
     3,
     {R"("x")", "1", "[1, [2, \"\\u00e9\"]]", R"({"a": {"b": null}, "": [true, -1e-7]})", "[]",
      "{}"},
     {},
     {"[[[1]]]"},  // deeper than generic_depth 2
     {{"x", "\\x"}, {"\"x\"", "'x'"}}},
};

// The DFA of case `c` in layout `w`.
inline specdec::byte_dfa compile_case(schema_case const& c, json_whitespace w) {
  specdec::json_schema_options options;
  options.whitespace = w;
  options.max_recursion = c.max_recursion;
  return specdec::compile_json_schema(c.schema, options);
}

}  // namespace json_schema_test

TEST_CASE("json schema: every string a random walk of the DFA accepts is an instance") {
  using namespace json_schema_test;
  std::mt19937 rng(2024);
  for (schema_case const& c : cases) {
    for (json_whitespace const w : layouts) {
      std::string const name = c.name, layout = layout_name(w);
      CAPTURE(name);
      CAPTURE(layout);
      specdec::byte_dfa const dfa = compile_case(c, w);
      walker walks(dfa);
      int accepted = 0;
      for (int i = 0; i < 150; ++i) {
        bool ok = false;
        std::string const text = walks.walk(rng, 400, ok);
        if (!ok) continue;
        ++accepted;
        CAPTURE(text);
        REQUIRE(judge(text, c.schema, w) == "");
      }
      CHECK(accepted >= 50);
    }
  }
}

TEST_CASE(
    "json schema: hand-written instances are matched, non-instances refused, in each layout") {
  using namespace json_schema_test;
  for (schema_case const& c : cases) {
    for (json_whitespace const w : layouts) {
      std::string const name = c.name, layout = layout_name(w);
      CAPTURE(name);
      CAPTURE(layout);
      specdec::byte_dfa const dfa = compile_case(c, w);
      for (char const* v : c.valid) {
        std::string const text = write(ordered::parse(v), w);
        CAPTURE(text);
        CHECK(judge(text, c.schema, w) == "");  // the checker agrees it is an instance
        CHECK(dfa.matches(text));
        // The other layouts: the flexible one admits them all, the others only themselves.
        for (json_whitespace const other : layouts) {
          std::string const elsewhere = write(ordered::parse(v), other);
          CAPTURE(elsewhere);
          if (w == json_whitespace::flexible || elsewhere == text) {
            CHECK(dfa.matches(elsewhere));
          } else {
            CHECK_FALSE(dfa.matches(elsewhere));
          }
        }
      }
      for (char const* v : c.invalid) {
        std::string const text = write(ordered::parse(v), w);
        CAPTURE(text);
        CHECK(judge(text, c.schema, w) != "");
        CHECK_FALSE(dfa.matches(text));
      }
      for (char const* v : c.narrowed) {
        std::string const text = write(ordered::parse(v), w);
        CAPTURE(text);
        CHECK(judge(text, c.schema, w) == "");
        CHECK_FALSE(dfa.matches(text));
      }
      std::string const base = write(ordered::parse(c.valid[0]), w);
      for (auto const& [from, to] : c.edits) {
        std::string text = base;
        std::size_t const at = text.rfind(from);
        REQUIRE(at != std::string::npos);
        text.replace(at, std::string_view(from).size(), to);
        CAPTURE(text);
        CHECK(judge(text, c.schema, w) != "");
        CHECK_FALSE(dfa.matches(text));
      }
    }
  }
}

TEST_CASE("json schema: generic values, const, and the bounds of generic_depth") {
  specdec::json_schema_options options;
  options.whitespace = specdec::json_whitespace::compact;
  options.generic_depth = 1;
  auto const any = specdec::compile_json_schema("{}", options);
  CHECK(any.matches("[1,\"a\",null]"));
  CHECK(any.matches("{\"k\":false}"));
  CHECK_FALSE(any.matches("[[1]]"));
  CHECK_FALSE(any.matches("{\"k\":{}}"));
  auto const object = specdec::compile_json_schema(R"({"type": "object"})", options);
  CHECK(object.matches("{\"k\":1,\"k\":\"v\"}"));
  CHECK_FALSE(object.matches("[]"));
  CHECK_FALSE(object.matches("{\"k\":[]}"));
  auto const constant = specdec::compile_json_schema(
      R"({"const": {"a": [1, 2.5, "\u00e9"]}, "type": "object"})", options);
  CHECK(constant.matches("{\"a\":[1,2.5,\"é\"]}"));
  CHECK_FALSE(constant.matches("{\"a\":[1,2.50,\"é\"]}"));
  // A `type` next to `enum` keeps the values of that type.
  auto const ints = specdec::compile_json_schema(R"({"enum": [1, "1", 2.5], "type": "integer"})");
  CHECK(ints.matches("1"));
  CHECK_FALSE(ints.matches("\"1\""));
  CHECK_FALSE(ints.matches("2.5"));
  // A pattern cannot produce a quote, a backslash or a control character.
  auto const quoted = specdec::compile_json_schema(R"({"type": "string", "pattern": "a.b"})");
  CHECK(quoted.matches("\"axb\""));
  CHECK_FALSE(quoted.matches("\"a\"b\""));
  CHECK_FALSE(quoted.matches("\"a\\b\""));
  CHECK_FALSE(quoted.matches("\"a\tb\""));
  // Surrogates: only as a pair, which counts as one character.
  auto const one = specdec::compile_json_schema(R"({"type": "string", "maxLength": 1})");
  CHECK(one.matches("\"\\ud83d\\ude00\""));
  CHECK(one.matches("\"\\u00e9\""));
  CHECK_FALSE(one.matches("\"\\ud83d\""));
  CHECK_FALSE(one.matches("\"\\ude00\""));
  CHECK_FALSE(one.matches("\"\\ud83d\\u0041\""));
}

TEST_CASE("json schema: the automaton grows linearly with the number of optional properties") {
  using namespace json_schema_test;
  ordered schema = {{"type", "object"}};
  for (int i = 0; i < 24; ++i) {
    std::string key = "p";  // (not "p" + to_string: GCC 12 -O3 warns falsely, -Wrestrict)
    key += std::to_string(i);
    schema["properties"][key] = ordered{{"type", "integer"}};
  }
  for (json_whitespace const w : layouts) {
    std::string const layout = layout_name(w);
    CAPTURE(layout);
    specdec::json_schema_options options;
    options.whitespace = w;
    specdec::byte_dfa const dfa = specdec::compile_json_schema(schema, options);
    std::string const states = std::to_string(dfa.size()) + " DFA states";
    MESSAGE(states);
    CHECK(dfa.size() < 5000);
    CHECK(dfa.matches("{}"));
    CHECK(dfa.matches(write(ordered::parse(R"({"p0": 1, "p10": 2, "p23": -3})"), w)));
    CHECK(dfa.matches(write(ordered::parse(R"({"p1": 1, "p2": 2})"), w)));
    CHECK_FALSE(dfa.matches(write(ordered::parse(R"({"p2": 1, "p1": 2})"), w)));
    std::string twice = write(ordered::parse(R"({"p1": 1, "p2": 2})"), w);
    twice.replace(twice.find("p2"), 2, "p1");
    CHECK_FALSE(dfa.matches(twice));  // a property written twice
    CHECK_FALSE(dfa.matches(write(ordered::parse(R"({"p24": 1})"), w)));
  }
}

TEST_CASE("json schema: unsupported keywords and bad values are refused, saying where") {
  struct bad {
    char const* schema;
    specdec::errc code;
    std::vector<char const*> says;
  };
  using specdec::errc;
  std::vector<bad> const refused = {
      {R"({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}})",
       errc::unsupported,
       {"keyword 'minimum' at #/properties/age is not supported"}},
      {R"({"type": "object", "patternProperties": {"^a": {}}})",
       errc::unsupported,
       {"keyword 'patternProperties' at # is not supported"}},
      {R"({"properties": {"d": {"type": "string", "format": "date"}}})",
       errc::unsupported,
       {"keyword 'format' at #/properties/d is not supported"}},
      {R"({"properties": {"a/b": {"exclusiveMaximum": 3}}})",
       errc::unsupported,
       {"keyword 'exclusiveMaximum' at #/properties/a~1b"}},
      {R"({"properties": {"a": {"$ref": "#/$defs/missing"}}, "$defs": {"b": {}}})",
       errc::invalid_argument,
       {"#/properties/a", "\"#/$defs/missing\" does not resolve"}},
      {R"({"$ref": "https://example.com/s.json"})", errc::unsupported, {"keyword '$ref' at #"}},
      {R"({"properties": {"a": {}}, "required": ["a", "b"]})",
       errc::invalid_argument,
       {"#/required", "'b' is not declared"}},
      {R"({"type": "array", "items": {"type": "array", "minItems": -1}})",
       errc::invalid_argument,
       {"#/items", "'minItems' must be a non-negative integer"}},
      {R"({"type": 5})", errc::invalid_argument, {"at #: 'type'"}},
      {R"({"properties": {"x": {"type": "strin"}}})",
       errc::invalid_argument,
       {"#/properties/x", "unknown type 'strin'"}},
      {R"({"type": "string", "pattern": "a(b"})", errc::invalid_argument, {"'pattern' at #"}},
      {R"({"anyOf": [{"type": "string"}], "type": "string"})",
       errc::unsupported,
       {"keyword 'type' at # is not supported next to 'anyOf'"}},
      {R"({"properties": {"a": {}}, "additionalProperties": {"type": "string"}})",
       errc::unsupported,
       {"keyword 'additionalProperties' at #"}},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})",
       errc::unsupported,
       {"keyword 'allOf' at #"}},
      {R"({"type": "array", "items": [{"type": "string"}]})",
       errc::unsupported,
       {"keyword 'items' at #"}},
      {R"({"type": "object", "properties": {"a": {}}}, "x")",
       errc::invalid_argument,
       {"not valid JSON at byte 44"}},
      {R"({"type": "object", "properties": {"a": {"type": }}})",
       errc::invalid_argument,
       {"not valid JSON at byte 49"}},
      {"false", errc::invalid_argument, {"matches no string at all"}},
      // A required member that recurses has no finite instance.
      {R"({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}},
                          "required": ["next"]}}, "$ref": "#/$defs/n"})",
       errc::invalid_argument,
       {"matches no string at all"}},
  };
  for (bad const& b : refused) {
    std::string const schema = b.schema;
    CAPTURE(schema);
    try {
      (void)specdec::compile_json_schema(b.schema);
      FAIL("accepted");
    } catch (specdec::error const& e) {
      std::string const what = e.what();
      CAPTURE(what);
      CHECK(e.code() == b.code);
      for (char const* says : b.says) CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
  }
  specdec::json_schema_options options;
  options.max_whitespace = -1;
  CHECK_THROWS_AS((void)specdec::compile_json_schema("{}", options), specdec::error);
  // A schema whose automaton is too large is refused, not built.
  CHECK_THROWS_AS(
      (void)specdec::compile_json_schema(R"({"type": "string", "maxLength": 3000})", {}, 1000),
      specdec::error);
}

TEST_CASE("json schema: a constrained token walk writes an instance") {
  using namespace json_schema_test;
  std::vector<std::string> bytes = {""};  // token 0: the end
  for (char c = ' '; c <= '~'; ++c) bytes.emplace_back(1, c);
  for (char const* multi : {"\"name\"", "true", "false", "null", ": ", ", ", "{\"", "\"}", "12"})
    bytes.emplace_back(multi);
  auto const vocab =
      std::make_shared<specdec::token_vocabulary const>(bytes, std::vector<specdec::token_id>{0});
  char const* const schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 6},
      "ok": {"type": "boolean"},
      "n": {"type": ["integer", "null"]}},
    "required": ["name"]})";
  auto const c = specdec::json_schema_constraint(schema, vocab);
  std::mt19937 rng(5);
  int complete = 0;
  for (int walk = 0; walk < 60; ++walk) {
    specdec::automaton_constraint::state_type s = c->start();
    std::string text;
    for (int step = 0; step < 200 && !c->complete(s); ++step) {
      specdec::token_table const& table = c->table(s);
      std::vector<specdec::token_id> allowed;
      for (std::size_t t = 0; t < vocab->size(); ++t)
        if ((table.mask[t / 64] >> (t % 64)) & 1u)
          allowed.push_back(static_cast<specdec::token_id>(t));
      REQUIRE(allowed.size() == table.count);
      REQUIRE_FALSE(allowed.empty());
      for (specdec::token_id t : allowed) REQUIRE(c->allows(s, t));
      specdec::token_id const t =
          allowed[std::uniform_int_distribution<std::size_t>(0, allowed.size() - 1)(rng)];
      REQUIRE(c->advance(s, t));
      text += vocab->bytes(t);
    }
    if (!c->complete(s)) continue;
    ++complete;
    CAPTURE(text);
    CHECK(c->matches(text));
    CHECK(judge(text, schema, json_whitespace::spaced) == "");
  }
  CHECK(complete >= 20);
}
