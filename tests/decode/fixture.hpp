#pragma once
// The stories260K fixture for decoder and proposer tests: locating the files through
// SPECDEC_MODEL_DIR / SPECDEC_DATA_DIR (a missing file FAILS the test with a message), loading the
// weights once, the reference greedy ids, and the prompt set.

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "specdec/core/types.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/tokenizer.hpp"

namespace fixture {

// A file under the directory named by the environment variable `var`; fails the test when the
// variable is unset or the file is missing.
inline std::filesystem::path require_file(char const* var, char const* name) {
  char const* dir = std::getenv(var);
  if (dir == nullptr || *dir == '\0') {
    FAIL(var << " is not set: the test needs " << name << " (ctest sets it to ../shared)");
    return {};
  }
  std::filesystem::path const path = std::filesystem::path(dir) / name;
  if (!std::filesystem::exists(path)) FAIL("missing fixture file " << path.string());
  return path;
}

// The stories260K weights, loaded once per process.
inline std::shared_ptr<specdec::llama_weights const> const& stories260k() {
  static std::shared_ptr<specdec::llama_weights const> const weights =
      std::make_shared<specdec::llama_weights const>(
          specdec::load_model(require_file("SPECDEC_MODEL_DIR", "stories260K.bin")));
  return weights;
}

// The fixture's tokenizer (tok512.bin), loaded once per process.
inline specdec::tokenizer const& tok512() {
  static specdec::tokenizer const tok =
      specdec::load_tokenizer(require_file("SPECDEC_MODEL_DIR", "stories260K.bin"),
                              require_file("SPECDEC_MODEL_DIR", "tok512.bin"));
  return tok;
}

// The draft model trained for the fixture, tools/draft/stories_draft.bin in the source tree;
// fails the test when it is missing.
inline std::filesystem::path draft_model_path() {
  std::filesystem::path const here(__FILE__);
  std::filesystem::path const path =
      here.parent_path().parent_path().parent_path() / "tools" / "draft" / "stories_draft.bin";
  if (!std::filesystem::exists(path)) FAIL("missing the trained draft model " << path.string());
  return path;
}

// BOS + encode("Once upon a time") (MANIFEST.md).
inline std::vector<specdec::token_id> once_upon_a_time() {
  return {1, 403, 407, 261, 378};
}

// The 256 reference greedy ids after BOS (prompt included).
inline std::vector<specdec::token_id> reference_ids() {
  std::ifstream in(require_file("SPECDEC_MODEL_DIR", "reference_greedy_once_upon_a_time.ids"));
  std::vector<specdec::token_id> ids;
  specdec::token_id t = 0;
  while (in >> t) ids.push_back(t);
  REQUIRE(ids.size() == 256);
  return ids;
}

// The "prompt" strings of tinystories_prompts.jsonl (a minimal reader of that one field: JSON
// string escapes \" \\ \n \t \uXXXX are decoded).
inline std::vector<std::string> tinystories_prompts() {
  std::ifstream in(require_file("SPECDEC_DATA_DIR", "tinystories_prompts.jsonl"));
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(in, line)) {
    std::size_t const key = line.find("\"prompt\"");
    if (key == std::string::npos) continue;
    std::size_t i = line.find('"', line.find(':', key) + 1) + 1;
    std::string s;
    while (i < line.size() && line[i] != '"') {
      char c = line[i++];
      if (c == '\\' && i < line.size()) {
        char const e = line[i++];
        if (e == 'n') {
          c = '\n';
        } else if (e == 't') {
          c = '\t';
        } else if (e == 'u' && i + 4 <= line.size()) {
          unsigned const cp = static_cast<unsigned>(std::stoul(line.substr(i, 4), nullptr, 16));
          i += 4;
          if (cp < 0x80) {
            s += static_cast<char>(cp);
          } else if (cp < 0x800) {
            s += static_cast<char>(0xC0 | (cp >> 6));
            s += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            s += static_cast<char>(0xE0 | (cp >> 12));
            s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            s += static_cast<char>(0x80 | (cp & 0x3F));
          }
          continue;
        } else {
          c = e;
        }
      }
      s += c;
    }
    prompts.push_back(s);
  }
  REQUIRE(prompts.size() == 14);
  return prompts;
}

// Every prompt of tinystories_prompts.jsonl encoded with BOS.
inline std::vector<std::vector<specdec::token_id>> encoded_prompts() {
  std::vector<std::vector<specdec::token_id>> out;
  for (auto const& p : tinystories_prompts()) out.push_back(tok512().encode(p, true));
  return out;
}

}  // namespace fixture
