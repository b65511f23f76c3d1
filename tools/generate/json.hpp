#pragma once
// A small JSON writer for specdec-generate's --json output: strings are escaped per RFC 8259 and
// made valid UTF-8 (a byte that does not start or continue a well-formed sequence becomes U+FFFD,
// since byte-fallback tokens can split a character), non-finite numbers become null.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

namespace generate {

//! Length of the well-formed UTF-8 sequence starting at s[i], or 0 when there is none (overlong
//! forms, surrogates, code points above U+10FFFF and truncated sequences are ill-formed).
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) noexcept {
  auto const byte = [&](std::size_t j) { return static_cast<unsigned char>(s[j]); };
  unsigned char const b0 = byte(i);
  if (b0 < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t j = 2; j < n; ++j)
    if (byte(i + j) < 0x80 || byte(i + j) > 0xBF) return 0;
  return n;
}

//! `text` as a JSON string literal, quotes included.
inline std::string json_string(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (std::size_t i = 0; i < text.size();) {
    auto const c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      std::size_t const n = utf8_sequence_length(text, i);
      if (n == 0) {
        out += "\\ufffd";
        ++i;
      } else {
        out.append(text.substr(i, n));
        i += n;
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

//! A JSON number with enough digits to round-trip a double; null when not finite.
inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

//! A JSON array of integers.
template <class Int>
std::string json_int_array(std::span<Int const> values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(values[i]);
  }
  out += ']';
  return out;
}

//! Builds one JSON object member by member: `object().field("a", 1).raw("b", "[1,2]").str()`.
class json_object {
 public:
  //! A member whose value is already JSON text.
  json_object& raw(std::string_view key, std::string_view json) {
    body_ += body_.empty() ? "" : ",";
    body_ += json_string(key);
    body_ += ':';
    body_ += json;
    return *this;
  }
  //! A string member.
  json_object& text(std::string_view key, std::string_view value) {
    return raw(key, json_string(value));
  }
  //! A number member (null when not finite).
  json_object& number(std::string_view key, double value) { return raw(key, json_number(value)); }
  //! An unsigned integer member.
  json_object& count(std::string_view key, std::uint64_t value) {
    return raw(key, std::to_string(value));
  }
  //! A boolean member.
  json_object& boolean(std::string_view key, bool value) {
    return raw(key, value ? "true" : "false");
  }
  //! The object's JSON text.
  [[nodiscard]] std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace generate
