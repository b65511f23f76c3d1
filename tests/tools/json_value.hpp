#pragma once
// A strict JSON reader (RFC 8259) for checking the tools' --json output: the whole input must be
// one value (surrounding whitespace allowed); any deviation throws std::runtime_error.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tools_test {

//! One JSON value.
struct json_value {
  using array = std::vector<json_value>;
  using object = std::map<std::string, json_value>;
  std::variant<std::nullptr_t, bool, double, std::string, array, object> v;

  [[nodiscard]] bool is_null() const { return std::holds_alternative<std::nullptr_t>(v); }
  [[nodiscard]] bool is_number() const { return std::holds_alternative<double>(v); }
  [[nodiscard]] bool is_string() const { return std::holds_alternative<std::string>(v); }
  [[nodiscard]] bool is_array() const { return std::holds_alternative<array>(v); }
  [[nodiscard]] bool is_object() const { return std::holds_alternative<object>(v); }
  [[nodiscard]] bool is_bool() const { return std::holds_alternative<bool>(v); }
  [[nodiscard]] double number() const { return std::get<double>(v); }
  [[nodiscard]] bool boolean() const { return std::get<bool>(v); }
  [[nodiscard]] std::string const& str() const { return std::get<std::string>(v); }
  [[nodiscard]] array const& arr() const { return std::get<array>(v); }
  [[nodiscard]] object const& obj() const { return std::get<object>(v); }
  [[nodiscard]] bool has(std::string const& key) const {
    return is_object() && obj().count(key) != 0;
  }
  //! Member `key` of an object (throws when absent).
  [[nodiscard]] json_value const& operator[](std::string const& key) const {
    auto const& o = obj();
    auto const it = o.find(key);
    if (it == o.end()) throw std::runtime_error("json: no member '" + key + "'");
    return it->second;
  }
  //! The integers of an array of integral numbers.
  [[nodiscard]] std::vector<std::int64_t> ints() const {
    std::vector<std::int64_t> out;
    for (auto const& e : arr()) {
      double const d = e.number();
      if (d != static_cast<double>(static_cast<std::int64_t>(d)))
        throw std::runtime_error("json: not an integer");
      out.push_back(static_cast<std::int64_t>(d));
    }
    return out;
  }
};

namespace detail {

class json_parser {
 public:
  explicit json_parser(std::string_view s) : s_(s) {}

  json_value document() {
    json_value v = value();
    skip_ws();
    if (i_ != s_.size()) fail("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void fail(char const* what) const {
    throw std::runtime_error(std::string("json: ") + what + " at offset " + std::to_string(i_));
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  char peek() {
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(std::string_view word) {
    if (s_.substr(i_, word.size()) != word) fail("bad literal");
    i_ += word.size();
  }

  json_value value() {
    skip_ws();
    char const c = peek();
    if (c == '{') return object();
    if (c == '[') return array();
    if (c == '"') return json_value{string()};
    if (c == 't') return expect("true"), json_value{true};
    if (c == 'f') return expect("false"), json_value{false};
    if (c == 'n') return expect("null"), json_value{nullptr};
    return json_value{number()};
  }

  json_value object() {
    ++i_;
    json_value::object o;
    skip_ws();
    if (peek() == '}') return ++i_, json_value{std::move(o)};
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a key");
      std::string key = string();
      skip_ws();
      if (peek() != ':') fail("expected ':'");
      ++i_;
      if (o.count(key) != 0) fail("duplicate key");
      o.emplace(std::move(key), value());
      skip_ws();
      char const c = peek();
      ++i_;
      if (c == '}') break;
      if (c != ',') fail("expected ',' or '}'");
    }
    return json_value{std::move(o)};
  }

  json_value array() {
    ++i_;
    json_value::array a;
    skip_ws();
    if (peek() == ']') return ++i_, json_value{std::move(a)};
    for (;;) {
      a.push_back(value());
      skip_ws();
      char const c = peek();
      ++i_;
      if (c == ']') break;
      if (c != ',') fail("expected ',' or ']'");
    }
    return json_value{std::move(a)};
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char const c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail("bad hex digit");
      }
    }
    return v;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++i_;
    std::string out;
    for (;;) {
      char const c = peek();
      ++i_;
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      char const e = peek();
      ++i_;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (s_.substr(i_, 2) != "\\u") fail("lone high surrogate");
            i_ += 2;
            unsigned const lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("lone low surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }

  double number() {
    std::size_t const start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    auto const digits = [&] {
      std::size_t const from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - from;
    };
    if (i_ < s_.size() && s_[i_] == '0') {
      ++i_;
    } else if (digits() == 0) {
      fail("bad number");
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      if (digits() == 0) fail("bad fraction");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (digits() == 0) fail("bad exponent");
    }
    std::string const text(s_.substr(start, i_ - start));
    return std::strtod(text.c_str(), nullptr);
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

}  // namespace detail

//! Parses `text`, which must hold exactly one JSON value.
inline json_value parse_json(std::string_view text) {
  return detail::json_parser(text).document();
}

}  // namespace tools_test
