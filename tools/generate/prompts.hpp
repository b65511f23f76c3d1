#pragma once
// specdec-generate --prompts: the prompts of a JSON Lines file (one JSON object per line, like
// ../shared/data/*.jsonl), each with its line number.

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "specdec/core/error.hpp"

namespace generate {

//! One prompt of a --prompts file.
struct numbered_prompt {
  std::size_t line = 0;  //!< its line in the file, from 1
  std::string text;      //!< the prompt
};

//! The prompts of the JSON Lines file `path`: each non-blank line is a JSON object whose
//! "prompt" member is a string, or (MT-Bench style) whose "turns" member is an array beginning with
//! a string, the first turn. Throws `specdec::error` -- `errc::io` when the file cannot be read,
//! `errc::bad_file` naming the line for a line that is not such an object (or holds a NUL byte),
//! or for a file without any prompt.
inline std::vector<numbered_prompt> read_prompts(std::filesystem::path const& path) {
  std::ifstream in(path, std::ios::binary);
  SPECDEC_CHECK(in.good(), io, "--prompts: cannot read '", path.string(), "'");
  std::vector<numbered_prompt> prompts;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    // The parser would take a NUL byte for the end of the line and ignore what follows.
    SPECDEC_CHECK(line.find('\0') == std::string::npos, bad_file, "--prompts: '", path.string(),
                  "' line ", number, " holds a NUL byte at column ", line.find('\0') + 1,
                  " (JSON text holds none)");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (nlohmann::json::exception const& e) {
      SPECDEC_THROW(bad_file, "--prompts: '", path.string(), "' line ", number,
                    " is not JSON: ", e.what());
    }
    SPECDEC_CHECK(j.is_object(), bad_file, "--prompts: '", path.string(), "' line ", number,
                  " is not a JSON object");
    auto const prompt = j.find("prompt");
    auto const turns = j.find("turns");
    if (prompt != j.end() && prompt->is_string()) {
      prompts.push_back({number, prompt->get<std::string>()});
    } else if (turns != j.end() && turns->is_array() && !turns->empty() &&
               turns->front().is_string()) {
      prompts.push_back({number, turns->front().get<std::string>()});
    } else {
      SPECDEC_THROW(bad_file, "--prompts: '", path.string(), "' line ", number,
                    " has no \"prompt\" string (nor \"turns\" beginning with one)");
    }
  }
  SPECDEC_CHECK(!in.bad(), io, "--prompts: reading '", path.string(), "' failed");
  SPECDEC_CHECK(!prompts.empty(), bad_file, "--prompts: '", path.string(), "' holds no prompt");
  return prompts;
}

}  // namespace generate
