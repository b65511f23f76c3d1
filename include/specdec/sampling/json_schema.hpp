#pragma once
//! \file
//! JSON Schema compiled to a byte automaton (sampling/automaton.hpp): the DFA of the JSON texts,
//! laid out with a chosen whitespace, that are instances of a schema, and the constraint over a
//! token vocabulary that keeps generation inside it. Every part is built with the NFA builder
//! directly (no regex text in between); a string's `pattern` goes through sampling/regex.hpp.
//!
//! No library in Debian builds token-level automata from JSON Schema (xgrammar, outlines and
//! llguidance are not packaged), so this is written here. One topic -- the compiler of every
//! supported keyword, with the checks that name the path of a bad one -- needs more than 600 lines.
//!
//! Supported (anything else is refused, see below):
//! - `type`: "string", "number", "integer", "boolean", "null", "object", "array", or an array of
//!   them (alternatives). Without `type`, the types whose keywords appear (`properties`,
//!   `required`, `additionalProperties`: object; `items`, `minItems`, `maxItems`: array;
//!   `minLength`, `maxLength`, `pattern`: string); with none of those, any value.
//! - `enum` and `const`: the values written as nlohmann's `dump()` writes scalars, with the
//!   layout's separators inside arrays and objects (so `1.0` is matched as "1.0" only). A `type`
//!   next to them keeps the values of that type.
//! - strings: characters are any code point but `"`, `\` and U+0000..U+001F, written as UTF-8,
//!   or the escapes `\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t` `\uXXXX` (`\u` escapes of surrogates
//!   only as a high-low pair, one character). `minLength`/`maxLength` count characters (an escape
//!   or a surrogate pair is one). `pattern` constrains the characters between the quotes as
//!   written (the whole of them must match: a pattern is read as anchored at both ends); the
//!   bytes `"`, `\` and the control characters are taken out of what it allows, so such a string
//!   has no escapes. `pattern` together with `minLength`/`maxLength` is refused.
//! - numbers `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, integers `-?(0|[1-9][0-9]*)`;
//!   `true`, `false`, `null`.
//! - objects: `properties` (their members are written in declaration order, each at most once;
//!   no other member is written), `required` (names of declared properties; the others may be
//!   left out), `additionalProperties` absent or false (true only without `properties`). An
//!   object without `properties` is a generic object (below). The comma before a member depends
//!   on whether one was written before it: one entry state per (property, something written
//!   yet), all sharing one exit, so the automaton grows linearly with the number of optional
//!   properties, not as the 2^n subsets.
//! - arrays: `items` (one schema for every element; absent: generic values), `minItems`,
//!   `maxItems`.
//! - `anyOf`; `oneOf` compiled as `anyOf` (exclusivity is not enforced: a text that matches two
//!   branches is accepted); `allOf` with one schema (that schema). These stand alone next to
//!   annotations only.
//! - `$ref` to `#`, `#/$defs/NAME` or `#/definitions/NAME` of the root schema, alone next to
//!   annotations. Recursion is unrolled: along one path of nested references, each reference is
//!   expanded at most `max_recursion` times; beyond that the branch matches nothing, so optional
//!   recursive members are left out and arrays of them stay empty at the bound (a schema left
//!   with no instance at all is refused by `byte_dfa`: "matches no string at all").
//! - boolean schemas: `true` (any value), `false` (nothing).
//! - a generic value of depth d: a string, number, `true`, `false`, `null`, and for d > 0 an
//!   array of generic values of depth d - 1 or an object with string keys and such values. A
//!   schema that says nothing (`{}`, `true`) is a generic value of depth `generic_depth`; an
//!   object or array schema without `properties` / `items` is that value restricted to the type
//!   (its members have depth `generic_depth` - 1, at least scalars).
//! - annotations, ignored: `title`, `description`, `default`, `examples`, `$schema`, `$id`,
//!   `$comment`, `deprecated`, `readOnly`, `writeOnly`; `$defs` and `definitions` (read through
//!   `$ref` only).
//! Every other keyword (`format`, numeric bounds `minimum` ..., `patternProperties`, ...) is
//! refused with `errc::unsupported` naming the keyword and the schema's JSON pointer ("#/..."); a
//! keyword with a bad value with `errc::invalid_argument` naming the pointer. But for `oneOf`,
//! the texts the automaton matches are valid instances of the schema: the order of members, the
//! absence of undeclared ones, the layout and the depth bounds only narrow them.
//!
//! Bounds cost states: each character position of a bounded string takes about 40 DFA states
//! (the states inside a UTF-8 sequence or an escape), each bounded array item a copy of the
//! item's automaton; beyond `max_states` the compilation is refused.
//!
//! Layout (`json_whitespace`): `compact` writes no whitespace; `spaced` writes ", " between items
//! and members and ": " after keys (Python's `json.dumps`), nothing else; `flexible` allows
//! [ \t\n]{0,max_whitespace} between any two tokens inside an array or object (so before and
//! after every `{ } [ ] , :`), none before or after the whole text.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/sampling/automaton.hpp"
#include "specdec/sampling/automaton_constraint.hpp"
#include "specdec/sampling/regex.hpp"

namespace specdec {

//! Where a JSON text may hold whitespace (the file comment has the rules).
enum class json_whitespace {
  compact,   //!< none: {"a":1,"b":[1,2]}
  spaced,    //!< ", " and ": ", as Python's json.dumps: {"a": 1, "b": [1, 2]}
  flexible,  //!< [ \t\n]{0,max_whitespace} around every structural character
};

//! How a JSON Schema is compiled.
struct json_schema_options {
  json_whitespace whitespace = json_whitespace::spaced;  //!< the layout
  int max_whitespace = 2;  //!< flexible: the most whitespace characters between two tokens
  int max_recursion = 3;   //!< the most expansions of one `$ref` along one path of references
  int generic_depth = 2;   //!< nesting of arrays/objects in a value a schema says nothing about
};

namespace detail {

//! The compiler of one schema into an NFA: one instance per root schema.
class json_schema_compiler {
 public:
  using json = nlohmann::ordered_json;

  //! Compiles into `a`, resolving references against `root`. Throws `errc::invalid_argument` for
  //! options out of their domain.
  json_schema_compiler(nfa& a, json const& root, json_schema_options const& options)
      : a_(a), root_(root), o_(options) {
    SPECDEC_CHECK(o_.max_whitespace >= 0, invalid_argument,
                  "json schema: max_whitespace is negative (", o_.max_whitespace, ")");
    SPECDEC_CHECK(o_.max_recursion >= 0, invalid_argument,
                  "json schema: max_recursion is negative (", o_.max_recursion, ")");
    SPECDEC_CHECK(o_.generic_depth >= 0, invalid_argument,
                  "json schema: generic_depth is negative (", o_.generic_depth, ")");
    SPECDEC_CHECK(o_.whitespace == json_whitespace::compact ||
                      o_.whitespace == json_whitespace::spaced ||
                      o_.whitespace == json_whitespace::flexible,
                  invalid_argument, "json schema: unknown whitespace layout");
  }

  //! The fragment of the instances of `schema`, found at JSON pointer `path` ("#/...").
  nfa::fragment schema(json const& s, std::string const& path) {
    if (s.is_boolean()) return s.get<bool>() ? generic(o_.generic_depth) : a_.nothing();
    if (!s.is_object()) invalid(path, "a schema must be an object or a boolean");
    if (s.contains("format")) unsupported("format", path, " (formats are not checked)");
    for (auto const& [key, value] : s.items()) {
      if (!known(key)) unsupported(key, path);
      if ((key == "$defs" || key == "definitions") && !value.is_object())
        invalid(path, "'" + key + "' must be an object");
    }
    if (s.contains("$ref")) {
      alone(s, path, "$ref");
      return reference(s["$ref"], path);
    }
    for (char const* const kw : {"anyOf", "oneOf"}) {
      if (!s.contains(kw)) continue;
      alone(s, path, kw);
      json const& list = s[kw];
      if (!list.is_array() || list.empty())
        invalid(path, concat("'", kw, "' must be a non-empty array of schemas"));
      std::vector<nfa::fragment> parts;
      for (std::size_t i = 0; i < list.size(); ++i)
        parts.push_back(schema(list[i], concat(path, "/", kw, "/", i)));
      return a_.alt(parts);
    }
    if (s.contains("allOf")) {
      alone(s, path, "allOf");
      json const& list = s["allOf"];
      if (!list.is_array()) invalid(path, "'allOf' must be an array of schemas");
      if (list.empty()) return generic(o_.generic_depth);
      if (list.size() > 1) unsupported("allOf", path, " with more than one schema");
      return schema(list[0], path + "/allOf/0");
    }
    std::vector<std::string> const types = type_list(s, path);
    if (s.contains("enum") || s.contains("const")) return constants(s, path, types);
    if (types.empty()) return generic(o_.generic_depth);
    std::vector<nfa::fragment> parts;
    for (std::string const& t : types) parts.push_back(typed(s, path, t));
    return a_.alt(parts);
  }

 private:
  [[noreturn]] static void unsupported(std::string_view keyword, std::string const& path,
                                       std::string_view why = {}) {
    throw error(errc::unsupported,
                concat("json schema: keyword '", keyword, "' at ", path, " is not supported", why));
  }
  [[noreturn]] static void invalid(std::string const& path, std::string_view what) {
    throw error(errc::invalid_argument, concat("json schema: at ", path, ": ", what));
  }

  static bool annotation(std::string_view k) {
    for (std::string_view const a : {"title", "description", "default", "examples", "$schema",
                                     "$id", "$comment", "deprecated", "readOnly", "writeOnly"})
      if (k == a) return true;
    return false;
  }
  static bool known(std::string_view k) {
    for (std::string_view const a :
         {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions",
          "minLength", "maxLength", "pattern", "items", "minItems", "maxItems", "properties",
          "required", "additionalProperties"})
      if (k == a) return true;
    return annotation(k);
  }
  //! Refuses every keyword of `s` but `keyword`, the annotations and the definitions.
  static void alone(json const& s, std::string const& path, std::string_view keyword) {
    for (auto const& [key, value] : s.items())
      if (key != keyword && !annotation(key) && key != "$defs" && key != "definitions")
        unsupported(key, path, concat(" next to '", keyword, "'"));
  }
  //! One JSON pointer reference token (RFC 6901: `~` as ~0, `/` as ~1).
  static std::string pointer_token(std::string_view name) {
    std::string out;
    for (char c : name) {
      if (c == '~') {
        out += "~0";
      } else if (c == '/') {
        out += "~1";
      } else {
        out += c;
      }
    }
    return out;
  }
  //! `v` as nlohmann writes it (compact); a string that is not UTF-8 is refused.
  static std::string dump(json const& v, std::string const& path) {
    try {
      return v.dump();
    } catch (json::exception const& e) {
      invalid(path, concat("a value cannot be written as JSON (", e.what(), ")"));
    }
  }

  //! A non-negative integer keyword of `s`, or `fallback` when absent.
  static std::int64_t count(json const& s, std::string const& path, char const* key,
                            std::int64_t fallback) {
    auto const it = s.find(key);
    if (it == s.end()) return fallback;
    json const& v = *it;
    if (v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0)) {
      std::uint64_t const u = v.get<std::uint64_t>();
      return u > std::uint64_t{1} << 40 ? std::int64_t{1} << 40 : static_cast<std::int64_t>(u);
    }
    if (v.is_number_float()) {
      double const d = v.get<double>();
      if (d >= 0 && d <= 1e12 && d == static_cast<double>(static_cast<std::int64_t>(d)))
        return static_cast<std::int64_t>(d);
    }
    invalid(path, concat("'", key, "' must be a non-negative integer, not ", dump(v, path)));
  }

  //! The names in `type` (empty: any value), or those the keywords present imply.
  static std::vector<std::string> type_list(json const& s, std::string const& path) {
    static constexpr std::array<char const*, 7> names{"string", "number", "integer", "boolean",
                                                      "null",   "object", "array"};
    std::vector<std::string> out;
    auto const add = [&](json const& t) {
      if (!t.is_string()) invalid(path, "'type' must be a type name or an array of them");
      std::string const name = t.get<std::string>();
      bool ok = false;
      for (char const* n : names) ok = ok || name == n;
      if (!ok) invalid(path, concat("unknown type '", name, "'"));
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
    };
    auto const it = s.find("type");
    if (it != s.end()) {
      if (it->is_array()) {
        if (it->empty()) invalid(path, "'type' is an empty array");
        for (json const& t : *it) add(t);
      } else {
        add(*it);
      }
      return out;
    }
    if (s.contains("enum") || s.contains("const")) return out;
    auto const any = [&](std::initializer_list<char const*> keys) {
      for (char const* k : keys)
        if (s.contains(k)) return true;
      return false;
    };
    if (any({"properties", "required", "additionalProperties"})) out.emplace_back("object");
    if (any({"items", "minItems", "maxItems"})) out.emplace_back("array");
    if (any({"minLength", "maxLength", "pattern"})) out.emplace_back("string");
    return out;
  }

  //! Whether constant `v` is of JSON Schema type `t`.
  static bool of_type(json const& v, std::string_view t) {
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer")
      return v.is_number_integer() ||
             (v.is_number_float() && v.get<double>() == std::trunc(v.get<double>()));
    if (t == "boolean") return v.is_boolean();
    if (t == "null") return v.is_null();
    if (t == "object") return v.is_object();
    return v.is_array();
  }

  // --- layout -------------------------------------------------------------------------------

  //! Where whitespace may go between two tokens: [ \t\n]{0,max} when flexible, else nothing.
  nfa::fragment gap() {
    if (o_.whitespace != json_whitespace::flexible || o_.max_whitespace == 0) return a_.empty();
    return a_.repeat([&] { return chars(" \t\n"); }, 0, o_.max_whitespace);
  }
  //! Between two items or members.
  nfa::fragment comma() {
    if (o_.whitespace == json_whitespace::spaced) return a_.literal(", ");
    return a_.seq(a_.seq(gap(), a_.literal(",")), gap());
  }
  //! After a key.
  nfa::fragment colon() {
    if (o_.whitespace == json_whitespace::spaced) return a_.literal(": ");
    return a_.seq(a_.seq(gap(), a_.literal(":")), gap());
  }
  //! `open` gap (`body` gap)? `close`, the body optional when `may_be_empty`.
  nfa::fragment container(char open, nfa::fragment body, bool may_be_empty, char close) {
    nfa::fragment inner = a_.seq(body, gap());
    if (may_be_empty) inner = a_.optional(inner);
    nfa::fragment const head = a_.seq(a_.literal(std::string_view(&open, 1)), gap());
    return a_.seq(a_.seq(head, inner), a_.literal(std::string_view(&close, 1)));
  }
  //! `item (comma item)*` with `lo` (>= 1) to `hi` (< 0: unbounded) items, each built by `make`.
  nfa::fragment list(std::function<nfa::fragment()> const& make, std::int64_t lo, std::int64_t hi) {
    if (hi < 0 && lo <= 1) {  // one item, and a way back to it after a comma
      nfa::fragment const item = make();
      nfa::fragment const c = comma();
      a_.epsilon(item.out, c.in);
      a_.epsilon(c.out, item.in);
      return item;
    }
    nfa::fragment const first = make();
    return a_.seq(first,
                  a_.repeat([&] { return a_.seq(comma(), make()); }, lo - 1, hi < 0 ? -1 : hi - 1));
  }

  // --- scalars ------------------------------------------------------------------------------

  //! One byte of `set`.
  nfa::fragment chars(std::string_view set) {
    std::array<bool, 256> flags{};
    for (char c : set) flags[static_cast<std::uint8_t>(c)] = true;
    return a_.byte_set(flags);
  }
  nfa::fragment hex() { return chars("0123456789abcdefABCDEF"); }
  nfa::fragment hex_run(nfa::fragment head, int digits) {
    for (int i = 0; i < digits; ++i) head = a_.seq(head, hex());
    return head;
  }
  //! One character of a string: unescaped, or an escape (a surrogate pair as one).
  nfa::fragment string_char() {
    static constexpr std::array<std::pair<std::uint32_t, std::uint32_t>, 3> plain{
        {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}}};
    nfa::fragment const unescaped = a_.code_points(plain);
    // \u of a non-surrogate: a first digit other than d, or d then 0-7.
    nfa::fragment const bmp = a_.alt(hex_run(chars("0123456789abcefABCEF"), 3),
                                     hex_run(a_.seq(chars("dD"), chars("01234567")), 2));
    nfa::fragment const high = hex_run(a_.seq(chars("dD"), chars("89abAB")), 2);
    nfa::fragment const low = hex_run(a_.seq(chars("dD"), chars("cdefCDEF")), 2);
    std::array<nfa::fragment, 3> const escapes{
        chars("\"\\/bfnrt"), a_.seq(a_.literal("u"), bmp),
        a_.seq(a_.seq(a_.seq(a_.literal("u"), high), a_.literal("\\u")), low)};
    nfa::fragment const escaped = a_.seq(a_.literal("\\"), a_.alt(escapes));
    return a_.alt(unescaped, escaped);
  }
  //! A string of `lo` to `hi` (< 0: any number of) characters.
  nfa::fragment string_of(std::int64_t lo, std::int64_t hi) {
    nfa::fragment const body = a_.repeat([&] { return string_char(); }, lo, hi);
    return a_.seq(a_.seq(a_.literal("\""), body), a_.literal("\""));
  }
  //! -?(0|[1-9][0-9]*)
  nfa::fragment integer() {
    nfa::fragment const digits = a_.seq(a_.range('1', '9'), a_.star(a_.range('0', '9')));
    return a_.seq(a_.optional(a_.literal("-")), a_.alt(a_.literal("0"), digits));
  }
  //! integer (\.[0-9]+)?([eE][+-]?[0-9]+)?
  nfa::fragment number() {
    auto const digits = [&] { return a_.seq(a_.range('0', '9'), a_.star(a_.range('0', '9'))); };
    nfa::fragment const fraction = a_.seq(a_.literal("."), digits());
    nfa::fragment const exponent = a_.seq(a_.seq(chars("eE"), a_.optional(chars("+-"))), digits());
    return a_.seq(a_.seq(integer(), a_.optional(fraction)), a_.optional(exponent));
  }

  //! A string whose content (as written) matches `pattern`, less `"`, `\` and control bytes.
  nfa::fragment pattern_string(std::string_view pattern, std::string const& path) {
    nfa scratch(std::size_t{1} << 20, "json schema pattern");
    nfa::fragment f;
    try {
      f = detail::compile_regex(scratch, pattern);
    } catch (error const& e) {
      throw with_context(e, concat("json schema: 'pattern' at ", path, ": "));
    }
    // Copy it into a_, clipping the bytes a JSON string cannot hold unescaped. In UTF-8 those
    // bytes are whole characters (lead and continuation bytes are >= 0x80), so clipping them
    // removes exactly those characters.
    std::vector<std::int32_t> map(scratch.size());
    for (auto& m : map) m = a_.state();
    auto const allowed = [](int b) { return b >= 0x20 && b != '"' && b != '\\'; };
    for (std::size_t s = 0; s < scratch.size(); ++s) {
      auto const from = static_cast<std::int32_t>(s);
      for (std::int32_t t : scratch.epsilons(from))
        a_.epsilon(map[s], map[static_cast<std::size_t>(t)]);
      for (nfa::edge const& e : scratch.edges(from)) {
        for (int b = e.lo; b <= e.hi;) {
          if (!allowed(b)) {
            ++b;
            continue;
          }
          int end = b;
          while (end < e.hi && allowed(end + 1)) ++end;
          a_.bytes(map[s], static_cast<std::uint8_t>(b), static_cast<std::uint8_t>(end),
                   map[static_cast<std::size_t>(e.to)]);
          b = end + 1;
        }
      }
    }
    nfa::fragment const body{map[static_cast<std::size_t>(f.in)],
                             map[static_cast<std::size_t>(f.out)]};
    return a_.seq(a_.seq(a_.literal("\""), body), a_.literal("\""));
  }

  // --- generic values -----------------------------------------------------------------------

  //! A generic value of depth `d` (<= 0: scalars only).
  nfa::fragment generic(int d) {
    std::vector<nfa::fragment> parts{string_of(0, -1), number(), a_.literal("true"),
                                     a_.literal("false"), a_.literal("null")};
    if (d > 0) {
      parts.push_back(generic_array(d));
      parts.push_back(generic_object(d));
    }
    return a_.alt(parts);
  }
  //! An array of generic values of depth d - 1, `lo`..`hi` of them.
  nfa::fragment generic_array(int d, std::int64_t lo = 0, std::int64_t hi = -1) {
    return array_of([&] { return generic(d - 1); }, lo, hi);
  }
  //! An object with any keys and generic values of depth d - 1.
  nfa::fragment generic_object(int d) {
    nfa::fragment const members =
        list([&] { return a_.seq(a_.seq(string_of(0, -1), colon()), generic(d - 1)); }, 1, -1);
    return container('{', members, true, '}');
  }
  //! An array of `lo`..`hi` (< 0: unbounded) items built by `make`.
  nfa::fragment array_of(std::function<nfa::fragment()> const& make, std::int64_t lo,
                         std::int64_t hi) {
    if (hi == 0) return container('[', a_.nothing(), true, ']');
    return container('[', list(make, std::max<std::int64_t>(lo, 1), hi), lo == 0, ']');
  }

  // --- schemas ------------------------------------------------------------------------------

  //! The instances of type `t` of `s`.
  nfa::fragment typed(json const& s, std::string const& path, std::string const& t) {
    if (t == "string") return string_schema(s, path);
    if (t == "number") return number();
    if (t == "integer") return integer();
    if (t == "boolean") return a_.alt(a_.literal("true"), a_.literal("false"));
    if (t == "null") return a_.literal("null");
    if (t == "object") return object_schema(s, path);
    return array_schema(s, path);
  }

  nfa::fragment string_schema(json const& s, std::string const& path) {
    std::int64_t const lo = count(s, path, "minLength", 0);
    std::int64_t const hi = count(s, path, "maxLength", -1);
    if (hi >= 0 && lo > hi) invalid(path, "'minLength' is above 'maxLength'");
    auto const it = s.find("pattern");
    if (it == s.end()) return string_of(lo, hi);
    if (!it->is_string()) invalid(path, "'pattern' must be a string");
    for (char const* const kw : {"minLength", "maxLength"})
      if (s.contains(kw)) unsupported(kw, path, " next to 'pattern'");
    return pattern_string(it->get<std::string>(), path);
  }

  nfa::fragment array_schema(json const& s, std::string const& path) {
    std::int64_t const lo = count(s, path, "minItems", 0);
    std::int64_t const hi = count(s, path, "maxItems", -1);
    if (hi >= 0 && lo > hi) invalid(path, "'minItems' is above 'maxItems'");
    auto const it = s.find("items");
    if (it == s.end()) return generic_array(o_.generic_depth, lo, hi);
    if (it->is_array()) unsupported("items", path, " as an array (tuple validation)");
    std::string const item_path = path + "/items";
    json const& items = *it;
    return array_of([&] { return schema(items, item_path); }, lo, hi);
  }

  nfa::fragment object_schema(json const& s, std::string const& path) {
    auto const extra = s.find("additionalProperties");
    if (extra != s.end() && !extra->is_boolean()) {
      if (extra->is_object()) unsupported("additionalProperties", path, " as a schema");
      invalid(path, "'additionalProperties' must be a boolean or a schema");
    }
    bool const extra_allowed = extra != s.end() && extra->get<bool>();
    auto const props = s.find("properties");
    if (props != s.end() && !props->is_object()) invalid(path, "'properties' must be an object");
    std::vector<std::string> required;
    if (auto const r = s.find("required"); r != s.end()) {
      if (!r->is_array()) invalid(path, "'required' must be an array of property names");
      for (json const& name : *r) {
        if (!name.is_string()) invalid(path, "'required' must be an array of property names");
        std::string const n = name.get<std::string>();
        if (props == s.end() || !props->contains(n))
          invalid(path + "/required",
                  concat("required property '", n, "' is not declared in 'properties'"));
        required.push_back(n);
      }
    }
    if (props == s.end()) {
      if (extra == s.end() || extra_allowed) return generic_object(o_.generic_depth);
      return container('{', a_.nothing(), true, '}');
    }
    if (extra_allowed) unsupported("additionalProperties", path, " as true next to 'properties'");

    // at[i][w]: before property i, w = whether a member was written yet. Writing property i
    // leads to at[i + 1][1] (after a comma when w), skipping it (when optional) to at[i + 1][w].
    std::size_t const n = props->size();
    std::vector<std::array<std::int32_t, 2>> at(n + 1);
    for (auto& st : at) st = {a_.state(), a_.state()};
    std::size_t i = 0;
    for (auto const& [name, sub] : props->items()) {
      std::string const sub_path = path + "/properties/" + pointer_token(name);
      nfa::fragment const key = a_.literal(dump(json(name), sub_path));
      nfa::fragment const member = a_.seq(a_.seq(key, colon()), schema(sub, sub_path));
      nfa::fragment const c = comma();
      a_.epsilon(at[i][0], member.in);
      a_.epsilon(at[i][1], c.in);
      a_.epsilon(c.out, member.in);
      a_.epsilon(member.out, at[i + 1][1]);
      if (std::find(required.begin(), required.end(), name) == required.end()) {
        a_.epsilon(at[i][0], at[i + 1][0]);
        a_.epsilon(at[i][1], at[i + 1][1]);
      }
      ++i;
    }
    nfa::fragment const open = a_.seq(a_.literal("{"), gap());
    nfa::fragment const close = a_.literal("}");
    nfa::fragment const before_close = gap();
    a_.epsilon(open.out, at[0][0]);
    a_.epsilon(at[n][0], close.in);
    a_.epsilon(at[n][1], before_close.in);
    a_.epsilon(before_close.out, close.in);
    return {open.in, close.out};
  }

  //! The values of `enum` / `const` of the types `types` (empty: any).
  nfa::fragment constants(json const& s, std::string const& path,
                          std::vector<std::string> const& types) {
    for (auto const& [key, value] : s.items())
      if (key != "enum" && key != "const" && key != "type" && !annotation(key) && key != "$defs" &&
          key != "definitions")
        unsupported(key, path, s.contains("enum") ? " next to 'enum'" : " next to 'const'");
    std::vector<json> values;
    if (auto const e = s.find("enum"); e != s.end()) {
      if (!e->is_array()) invalid(path, "'enum' must be an array");
      values.assign(e->begin(), e->end());
    }
    if (auto const c = s.find("const"); c != s.end()) {
      bool const listed =
          !s.contains("enum") || std::find(values.begin(), values.end(), *c) != values.end();
      values.clear();
      if (listed) values.push_back(*c);
    }
    std::vector<nfa::fragment> parts;
    for (json const& v : values) {
      bool ok = types.empty();
      for (std::string const& t : types) ok = ok || of_type(v, t);
      if (ok) parts.push_back(constant(v, path));
    }
    return a_.alt(parts);
  }

  //! Exactly the value `v`, in the layout.
  nfa::fragment constant(json const& v, std::string const& path) {
    if (v.is_array() || v.is_object()) {
      if (v.empty())
        return container(v.is_array() ? '[' : '{', a_.nothing(), true, v.is_array() ? ']' : '}');
      nfa::fragment body = a_.empty();
      bool first = true;
      for (auto const& [key, value] : v.items()) {
        if (!first) body = a_.seq(body, comma());
        first = false;
        if (v.is_object()) body = a_.seq(a_.seq(body, a_.literal(dump(json(key), path))), colon());
        body = a_.seq(body, constant(value, path));
      }
      return container(v.is_array() ? '[' : '{', body, false, v.is_array() ? ']' : '}');
    }
    if (v.is_binary() || v.is_discarded()) invalid(path, "a constant is not a JSON value");
    return a_.literal(dump(v, path));
  }

  //! The target of `$ref` `ref`, or nothing once it was expanded `max_recursion` times on this
  //! path.
  nfa::fragment reference(json const& ref, std::string const& path) {
    if (!ref.is_string()) invalid(path, "'$ref' must be a string");
    std::string const r = ref.get<std::string>();
    if (r.empty() || r[0] != '#')
      unsupported("$ref", path,
                  concat(" to \"", r, "\" (only #, #/$defs/NAME and ",
                         "#/definitions/NAME of this schema)"));
    json const* target = &root_;
    if (r != "#") {
      std::string_view rest(r);
      std::string_view defs;
      for (std::string_view const prefix : {"#/$defs/", "#/definitions/"})
        if (rest.substr(0, prefix.size()) == prefix) defs = prefix;
      if (defs.empty())
        unsupported("$ref", path,
                    concat(" to \"", r, "\" (only #, #/$defs/NAME and ",
                           "#/definitions/NAME of this schema)"));
      rest.remove_prefix(defs.size());
      std::string name;
      for (std::size_t k = 0; k < rest.size(); ++k) {
        if (rest[k] == '~' && k + 1 < rest.size() && (rest[k + 1] == '0' || rest[k + 1] == '1')) {
          name += rest[k + 1] == '0' ? '~' : '/';
          ++k;
        } else {
          name += rest[k];
        }
      }
      std::string const container_key(defs.substr(2, defs.size() - 3));
      auto const table = root_.is_object() ? root_.find(container_key) : root_.end();
      if (!root_.is_object() || table == root_.end() || !table->is_object() ||
          !table->contains(name))
        invalid(path, concat("'$ref' \"", r, "\" does not resolve in the root schema"));
      target = &(*table)[name];
    }
    int& depth = expansions_[r];
    if (depth >= o_.max_recursion) return a_.nothing();
    ++depth;
    nfa::fragment const f = schema(*target, r);
    --expansions_[r];
    return f;
  }

  nfa& a_;
  json const& root_;
  json_schema_options o_;
  std::map<std::string, int> expansions_;  // $ref -> expansions on the current path
};

//! The fragment of the instances of `schema` in `a` (references resolve against `schema`).
inline nfa::fragment compile_json_schema(nfa& a, nlohmann::ordered_json const& schema,
                                         json_schema_options const& options) {
  json_schema_compiler c(a, schema, options);
  return c.schema(schema, "#");
}

}  // namespace detail

//! The DFA of the JSON texts that are instances of `schema` in the layout of `options` (the file
//! comment has what is supported). Throws `errc::unsupported` for a keyword that is not,
//! `errc::invalid_argument` for a bad value (both naming the JSON pointer), for a schema with no
//! instance, or when the automaton would exceed `max_states` states.
[[nodiscard]] inline byte_dfa compile_json_schema(nlohmann::ordered_json const& schema,
                                                  json_schema_options const& options = {},
                                                  std::size_t max_states = std::size_t{1} << 16) {
  detail::nfa a(std::size_t{1} << 20, "json schema");
  detail::nfa::fragment const f = detail::compile_json_schema(a, schema, options);
  return byte_dfa(a, f, max_states);
}

//! The DFA of the schema in the JSON text `schema_text`; a text that is not JSON throws
//! `errc::invalid_argument` with the byte position of the error.
[[nodiscard]] inline byte_dfa compile_json_schema(std::string_view schema_text,
                                                  json_schema_options const& options = {},
                                                  std::size_t max_states = std::size_t{1} << 16) {
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(schema_text);
  } catch (nlohmann::ordered_json::parse_error const& e) {
    SPECDEC_THROW(invalid_argument, "json schema: not valid JSON at byte ", e.byte, ": ", e.what());
  } catch (nlohmann::ordered_json::exception const& e) {
    SPECDEC_THROW(invalid_argument, "json schema: not valid JSON: ", e.what());
  }
  return compile_json_schema(schema, options, max_states);
}

//! `compile_json_schema(std::string_view(schema_text), ...)` (a string would otherwise convert
//! to a JSON string value as readily as to a text).
[[nodiscard]] inline byte_dfa compile_json_schema(std::string const& schema_text,
                                                  json_schema_options const& options = {},
                                                  std::size_t max_states = std::size_t{1} << 16) {
  return compile_json_schema(std::string_view(schema_text), options, max_states);
}

//! `compile_json_schema(std::string_view(schema_text), ...)`.
[[nodiscard]] inline byte_dfa compile_json_schema(char const* schema_text,
                                                  json_schema_options const& options = {},
                                                  std::size_t max_states = std::size_t{1} << 16) {
  return compile_json_schema(std::string_view(schema_text), options, max_states);
}

//! The constraint "the output is an instance of the schema in `schema_text`" over `vocabulary`.
//! Throws as `compile_json_schema`, and `errc::invalid_argument` when no output of the
//! vocabulary's tokens is one.
[[nodiscard]] inline std::shared_ptr<automaton_constraint const> json_schema_constraint(
    std::string_view schema_text, std::shared_ptr<token_vocabulary const> vocabulary,
    json_schema_options const& options = {}) {
  return std::make_shared<automaton_constraint const>(
      compile_json_schema(schema_text, options), std::move(vocabulary), "json schema constraint");
}

}  // namespace specdec
