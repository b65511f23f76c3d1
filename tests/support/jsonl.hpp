#pragma once
// The string values of one field in a JSON Lines file (one JSON object per line), such as the
// fixture's tinystories_prompts.jsonl, parsed with nlohmann/json. One reader for the tests
// (support/fixture.hpp) and the benchmarks (bench_e2e, bench_rest): it lives here, beside the
// other test helpers, because the tests are always built while the benchmarks may be switched off
// (SPECDEC_BUILD_BENCHMARKS=OFF, the sanitizer presets); the benchmarks have tests/support/ on
// their include path (benchmarks/CMakeLists.txt).

#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace test_support {

//! The value of the top-level string field `key` on every line of `path` that has one, in file
//! order; lines without it (or where it is not a string) and blank lines are passed over. Throws
//! std::runtime_error when the file cannot be opened or a line is not a JSON object, naming the
//! file and the line.
inline std::vector<std::string> jsonl_strings(std::filesystem::path const& path,
                                              std::string const& key) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::vector<std::string> values;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json const object = nlohmann::json::parse(line, nullptr, false);
    if (!object.is_object())
      throw std::runtime_error(path.string() + ":" + std::to_string(number) +
                               ": not a JSON object");
    auto const it = object.find(key);
    if (it != object.end() && it->is_string()) values.push_back(it->get<std::string>());
  }
  return values;
}

}  // namespace test_support

namespace bench {
//! The benchmarks' name for the same reader.
using test_support::jsonl_strings;
}  // namespace bench
