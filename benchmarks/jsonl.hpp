#pragma once
// The string values of one field in a JSON Lines file such as the fixture's
// tinystories_prompts.jsonl, for the benchmarks and the decoder tests' fixture: each line's `"key":
// "..."`, with the escapes \n, \t, \uXXXX (as UTF-8, basic plane) and \<c> (c itself) decoded.

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

//! Appends the code point `cp` (< 0x10000) to `out` as UTF-8.
inline void append_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

//! The value of field `key` on every line of `path` that has it, in file order. Throws
//! std::runtime_error when the file cannot be opened.
inline std::vector<std::string> jsonl_strings(std::filesystem::path const& path,
                                              std::string const& key) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::string const quoted = "\"" + key + "\": \"";
  std::vector<std::string> values;
  std::string line;
  while (std::getline(in, line)) {
    std::size_t const at = line.find(quoted);
    if (at == std::string::npos) continue;
    std::string text;
    for (std::size_t i = at + quoted.size(); i < line.size() && line[i] != '"'; ++i) {
      if (line[i] != '\\' || i + 1 >= line.size()) {
        text += line[i];
        continue;
      }
      char const e = line[++i];
      if (e == 'n') {
        text += '\n';
      } else if (e == 't') {
        text += '\t';
      } else if (e == 'u' && i + 4 < line.size()) {
        append_utf8(text, static_cast<unsigned>(std::stoul(line.substr(i + 1, 4), nullptr, 16)));
        i += 4;
      } else {
        text += e;
      }
    }
    values.push_back(std::move(text));
  }
  return values;
}

}  // namespace bench
