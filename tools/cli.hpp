#pragma once
// What the command-line programs share: the command-line mistake (`usage_error`, exit status 2),
// numbers parsed exactly (std::from_chars, the whole text or an error naming the option), CLI11's
// parse errors as one-line messages, messages kept on one line, and the layout of --help (one
// entry per option, its text wrapped at 100 columns), written from the options' declarations.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace specdec_cli {

//! A command-line mistake: main() prints it on one line and exits with status 2.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! Parses all of `text` as a T (a finite number for floating-point T, no sign for unsigned T), or
//! throws a usage_error naming `flag`.
template <class T>
T parse_number(std::string_view flag, std::string_view text) {
  T value{};
  bool const negative = !text.empty() && text.front() == '-';
  auto const [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() ||
      (std::is_unsigned_v<T> && negative))
    throw usage_error(std::string(flag) + " expects " +
                      (std::is_floating_point_v<T> ? "a number"
                       : std::is_unsigned_v<T>     ? "a non-negative integer"
                                                   : "an integer") +
                      ", got '" + std::string(text) + "'");
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value))
      throw usage_error(std::string(flag) + " expects a finite number, got '" + std::string(text) +
                        "'");
  }
  return value;
}

//! Throws CLI11's parse error `e` (from `app`) as a usage_error with a one-line message: an
//! unknown option, an option given more than once, an option without its value.
[[noreturn]] inline void rethrow(CLI::ParseError const& e, CLI::App const& app) {
  std::string const what = e.what();
  if (dynamic_cast<CLI::ArgumentMismatch const*>(&e) != nullptr) {
    std::size_t const colon = what.find(':');
    if (colon != std::string::npos) {
      std::string const name = what.substr(0, colon);
      if (what.find("At Most", colon) != std::string::npos)
        throw usage_error(name + " is given more than once");
      throw usage_error(name + " needs a value");
    }
  }
  if (dynamic_cast<CLI::ExtrasError const*>(&e) != nullptr) {
    std::vector<std::string> const extra = app.remaining();
    if (!extra.empty()) {
      if (extra.front().size() > 1 && extra.front().front() == '-')
        throw usage_error("unknown option '" + extra.front() + "'");
      throw usage_error("unexpected argument '" + extra.front() + "'");
    }
  }
  throw usage_error(what);
}

//! One --help entry: `head` (e.g. "  -k N"), then `text` from column 26 on, wrapped at 100
//! columns with continuation lines under column 26.
inline std::string help_row(std::string const& head, std::string const& text) {
  constexpr std::size_t help_column = 26, width = 100;
  std::string out = head;
  if (out.size() + 1 >= help_column) {
    out += '\n';
    out.append(help_column, ' ');
  } else {
    out.append(help_column - out.size(), ' ');
  }
  std::size_t column = help_column;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    std::size_t const word = end - start;
    if (column > help_column && column + 1 + word > width) {
      out += '\n';
      out.append(help_column, ' ');
      column = help_column;
    } else if (column > help_column) {
      out += ' ';
      ++column;
    }
    out.append(text, start, word);
    column += word;
    start = end + 1;
  }
  return out + '\n';
}

//! The --help text of `app` from its options' declarations: `head`, then each group of options
//! (in the order of their first option) with one entry per option -- its names, its value's name,
//! its description and its default --, -h/--help, then `tail`.
inline std::string help_text(CLI::App const& app, std::string const& head,
                             std::string const& tail) {
  std::vector<CLI::Option const*> const options =
      app.get_options([](CLI::Option const* o) { return o != nullptr; });
  std::vector<std::string> groups;
  for (CLI::Option const* o : options)
    if (o != app.get_help_ptr() &&
        std::find(groups.begin(), groups.end(), o->get_group()) == groups.end())
      groups.push_back(o->get_group());
  std::string out = head;
  for (std::string const& group : groups) {
    out += "\n" + group + ":\n";
    for (CLI::Option const* o : options) {
      if (o == app.get_help_ptr() || o->get_group() != group) continue;
      std::string names;
      for (std::string const& n : o->get_snames()) names += (names.empty() ? "-" : ", -") + n;
      for (std::string const& n : o->get_lnames()) names += (names.empty() ? "--" : ", --") + n;
      std::string const type = o->get_type_name();
      std::string text = o->get_description();
      if (!o->get_default_str().empty()) text += " (default: " + o->get_default_str() + ")";
      out += help_row("  " + names + (type.empty() ? "" : " " + type), text);
    }
  }
  out += help_row("  -h, --help", "this text");
  return out + tail;
}

//! `message` on one line (newlines become spaces).
inline std::string one_line(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r') c = ' ';
  return message;
}

//! Parses `argv` into `app`'s options. Returns false when --help was asked for, after printing it
//! (`head`, the options, `tail`); throws CLI11's parse errors as usage_errors (`rethrow`).
inline bool parse_command_line(CLI::App& app, int argc, char** argv, std::string const& head,
                               std::string const& tail) {
  try {
    app.parse(argc, argv);
  } catch (CLI::CallForHelp const&) {
    std::fputs(help_text(app, head, tail).c_str(), stdout);
    return false;
  } catch (CLI::ParseError const& e) {
    rethrow(e, app);
  }
  return true;
}

}  // namespace specdec_cli
