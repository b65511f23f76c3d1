#pragma once
// specdec-generate's options as data: each option is declared once, as an `option_spec` (its
// flag, its kind of value and domain, its default and its one-line help), and everything else
// reads that declaration: the parser (options.hpp, CLI11), the checks of the values, the --help
// text and the code that uses the values (`option_values::get`). The strategies declare their own
// options the same way (strategies.hpp).
//
// Every mistake (a value that is not a number or lies outside its domain, a file that does not
// exist) throws `usage_error`, which main() turns into a one-line message and exit status 2.

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <variant>
#include <vector>

#include "cli.hpp"

namespace generate {

//! A command-line mistake (tools/cli.hpp); main() prints it on one line and exits with status 2.
using specdec_cli::usage_error;

//! What an option takes.
enum class value_kind {
  flag,    //!< nothing: present or not
  count,   //!< a non-negative integer within [count_lo, count_hi]
  real,    //!< a finite number within [real_lo, real_hi] (or (real_lo, real_hi] when open_low)
  text,    //!< any text
  file,    //!< the path of an existing regular file (not a directory)
  layers,  //!< non-negative layer numbers separated by commas, e.g. "2" or "1,3"
};

//! One option: everything the parser, the checks, --help and its users need to know about it.
struct option_spec {
  std::string_view flag = {};        //!< "-k", "--temp": the name errors and --help show
  std::string_view alias = {};       //!< another accepted name ("--temperature"), or empty
  std::string_view value_name = {};  //!< "N", "PATH", ... (empty for a flag)
  value_kind kind = value_kind::flag;
  std::string_view help = {};  //!< one line, without the domain and the default (added by --help)
  //! The default as --help shows it; empty: derived from `count_default` / `real_default`, or none
  //! shown (flags, texts, files, layers).
  std::string_view default_text = {};
  std::uint64_t count_lo = 0;                                          //!< count: smallest
  std::uint64_t count_hi = std::numeric_limits<std::uint64_t>::max();  //!< count: largest
  std::uint64_t count_default = 0;  //!< count: the value when the option is not given
  float real_lo = -std::numeric_limits<float>::infinity();  //!< real: smallest (see open_low)
  float real_hi = std::numeric_limits<float>::infinity();   //!< real: largest
  bool open_low = false;                                    //!< real: real_lo itself is excluded
  bool open_high = false;                                   //!< real: real_hi itself is excluded
  float real_default = 0.0f;   //!< real: the value when the option is not given
  bool repeatable = false;     //!< may be given more than once (each value kept, in order)
  bool required = false;       //!< must be given (with the strategy that declares it)
  bool non_empty = false;      //!< text: the empty text is refused
  bool sampling_only = false;  //!< refused at temperature 0, where it cannot change the output

  //! The value's domain in words ("in [1, 4095]", ">= 0", "in (0, 1]"), or empty when any value
  //! of its kind is accepted.
  [[nodiscard]] std::string domain() const {
    if (kind == value_kind::count) {
      if (count_lo == 0 && count_hi == std::numeric_limits<std::uint64_t>::max()) return {};
      return "in [" + std::to_string(count_lo) + ", " + std::to_string(count_hi) + "]";
    }
    if (kind != value_kind::real) return {};
    bool const low = std::isfinite(real_lo), high = std::isfinite(real_hi);
    if (!low && !high) return {};
    if (!high) return (open_low ? "> " : ">= ") + number_text(real_lo);
    return std::string("in ") + (open_low ? "(" : "[") + number_text(real_lo) + ", " +
           number_text(real_hi) + (open_high ? ")" : "]");
  }

  //! The default as --help shows it, or empty.
  [[nodiscard]] std::string default_shown() const {
    if (!default_text.empty()) return std::string(default_text);
    if (kind == value_kind::count) return std::to_string(count_default);
    if (kind == value_kind::real) return number_text(real_default);
    return {};
  }

  //! `v` written shortly: "0", "1", "0.5".
  [[nodiscard]] static std::string number_text(float v) {
    char buf[32];
    auto const [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    return ec == std::errc{} ? std::string(buf, end) : std::to_string(v);
  }
};

//! A value as parsed: flags are counted by presence, counts, reals, texts (all the values of a
//! repeatable one), files (their path) and layer lists.
using option_value =
    std::variant<std::uint64_t, float, std::vector<std::string>, std::vector<std::int32_t>>;

namespace detail {

using specdec_cli::parse_number;

//! Throws a usage_error saying that `flag`'s value `text` is outside `domain`.
[[noreturn]] inline void out_of_domain(option_spec const& spec, std::string_view text) {
  throw usage_error(std::string(spec.flag) + " must be " + spec.domain() + ", got '" +
                    std::string(text) + "'");
}

//! A count within the spec's domain.
inline std::uint64_t parse_count(option_spec const& spec, std::string_view text) {
  if (!text.empty() && text.front() == '-' && !spec.domain().empty()) out_of_domain(spec, text);
  auto const v = parse_number<std::uint64_t>(spec.flag, text);
  if (v < spec.count_lo || v > spec.count_hi) out_of_domain(spec, text);
  return v;
}

//! A real within the spec's domain.
inline float parse_real(option_spec const& spec, std::string_view text) {
  float const v = parse_number<float>(spec.flag, text);
  if (v < spec.real_lo || v > spec.real_hi || (spec.open_low && v == spec.real_lo) ||
      (spec.open_high && v == spec.real_hi))
    out_of_domain(spec, text);
  return v;
}

//! "2" or "1,3,5": non-negative layer indices separated by commas.
inline std::vector<std::int32_t> parse_layers(option_spec const& spec, std::string_view text) {
  std::vector<std::int32_t> layers;
  std::size_t start = 0;
  while (true) {
    std::size_t const comma = text.find(',', start);
    std::string_view const item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    std::int32_t layer = 0;
    auto const [end, ec] = std::from_chars(item.data(), item.data() + item.size(), layer);
    if (item.empty() || item.front() == '-' || ec != std::errc{} ||
        end != item.data() + item.size() || layer > 4095)
      throw usage_error(std::string(spec.flag) +
                        " expects layer numbers in [0, 4095] separated by commas, got '" +
                        std::string(text) + "'");
    layers.push_back(layer);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return layers;
}

}  // namespace detail

//! Parses and checks the values `raw` given for `spec` (one per occurrence, at least one).
inline option_value parse_value(option_spec const& spec, std::vector<std::string> const& raw) {
  switch (spec.kind) {
    case value_kind::flag:
      return std::uint64_t{1};
    case value_kind::count:
      return detail::parse_count(spec, raw.front());
    case value_kind::real:
      return detail::parse_real(spec, raw.front());
    case value_kind::text:
      if (spec.non_empty)
        for (std::string const& r : raw)
          if (r.empty()) throw usage_error(std::string(spec.flag) + " needs a non-empty text");
      return raw;
    case value_kind::file: {
      std::error_code ec;
      auto const status = std::filesystem::status(raw.front(), ec);
      if (std::filesystem::is_directory(status))
        throw usage_error(std::string(spec.flag) + ": '" + raw.front() +
                          "' is a directory, not a file");
      if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
        throw usage_error(std::string(spec.flag) + ": '" + raw.front() + "' is not a regular file");
      if (!std::filesystem::is_regular_file(status))
        throw usage_error(std::string(spec.flag) + ": no such file '" + raw.front() + "'");
      return raw;
    }
    case value_kind::layers:
      return detail::parse_layers(spec, raw.front());
  }
  throw usage_error(std::string(spec.flag) + ": unknown kind of value");
}

//! The options given on one command line, parsed and checked, looked up by their declarations.
//! An option that was not given reads as its default (`get`) or as absent (`find`).
class option_values {
 public:
  //! Records `value` for `spec`.
  void set(option_spec const& spec, option_value value) {
    values_.insert_or_assign(spec.flag, std::move(value));
  }

  //! Whether `spec` was given.
  [[nodiscard]] bool given(option_spec const& spec) const { return values_.contains(spec.flag); }

  //! A flag: whether it was given.
  [[nodiscard]] bool flag(option_spec const& spec) const { return given(spec); }

  //! A count: its value, else its default.
  [[nodiscard]] std::uint64_t count(option_spec const& spec) const {
    auto const* v = find_as<std::uint64_t>(spec);
    return v != nullptr ? *v : spec.count_default;
  }

  //! A real: its value, else its default.
  [[nodiscard]] float real(option_spec const& spec) const {
    auto const* v = find_as<float>(spec);
    return v != nullptr ? *v : spec.real_default;
  }

  //! A text or a file: its value, if given.
  [[nodiscard]] std::optional<std::string> text(option_spec const& spec) const {
    auto const* v = find_as<std::vector<std::string>>(spec);
    return v != nullptr ? std::optional<std::string>(v->front()) : std::nullopt;
  }

  //! A repeatable text: every value, in order (empty when not given).
  [[nodiscard]] std::vector<std::string> texts(option_spec const& spec) const {
    auto const* v = find_as<std::vector<std::string>>(spec);
    return v != nullptr ? *v : std::vector<std::string>{};
  }

  //! A layer list, if given.
  [[nodiscard]] std::optional<std::vector<std::int32_t>> layers(option_spec const& spec) const {
    auto const* v = find_as<std::vector<std::int32_t>>(spec);
    return v != nullptr ? std::optional<std::vector<std::int32_t>>(*v) : std::nullopt;
  }

 private:
  template <class T>
  T const* find_as(option_spec const& spec) const {
    auto const it = values_.find(spec.flag);
    return it == values_.end() ? nullptr : std::get_if<T>(&it->second);
  }

  std::map<std::string_view, option_value> values_;
};

using specdec_cli::help_row;

//! The --help entry of `spec`: "  -k N   help, in [1, 4095] (default 4)" (`indent` spaces before
//! the flag).
inline std::string help_lines(option_spec const& spec, std::size_t indent = 2) {
  std::string head(indent, ' ');
  head += spec.flag;
  if (!spec.alias.empty()) head += std::string(", ") + std::string(spec.alias);
  if (!spec.value_name.empty()) head += std::string(" ") + std::string(spec.value_name);
  std::string text(spec.help);
  std::string const domain = spec.domain();
  if (!domain.empty()) text += ", " + domain;
  std::string const def = spec.default_shown();
  if (spec.required)
    text += " (required)";
  else if (!def.empty())
    text += " (default: " + def + ")";
  if (spec.repeatable) text += " (repeatable)";
  if (spec.sampling_only) text += " (needs --temp > 0)";
  return help_row(head, text);
}

}  // namespace generate
