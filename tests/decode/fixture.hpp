#pragma once
// The stories260K fixture for decoder and proposer tests: locating the files through
// SPECDEC_MODEL_DIR / SPECDEC_DATA_DIR (a missing file FAILS the test with a message), loading the
// weights once, the trained and a random draft model, the reference greedy ids, and the prompt
// set.

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../../benchmarks/jsonl.hpp"
#include "specdec/core/types.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/tokenizer.hpp"

namespace fixture {

// A file under the directory named by the environment variable `var`; fails the test when the
// variable is unset or the file is missing.
inline std::filesystem::path require_file(char const* var, char const* name) {
  char const* dir = std::getenv(var);
  if (dir == nullptr || *dir == '\0') {
    FAIL(std::string(var) << " is not set: the test needs " << std::string(name)
                          << " (ctest sets it to ../shared)");
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
  std::filesystem::path const here = std::filesystem::path(__FILE__).lexically_normal();
  std::filesystem::path const path =
      here.parent_path().parent_path().parent_path() / "tools" / "draft" / "stories_draft.bin";
  if (!std::filesystem::exists(path)) FAIL("missing the trained draft model " << path.string());
  return path;
}

// The draft trained for the fixture (tools/draft/stories_draft.bin), loaded once per process.
inline std::shared_ptr<specdec::llama_weights const> const& trained_draft() {
  static std::shared_ptr<specdec::llama_weights const> const weights =
      std::make_shared<specdec::llama_weights const>(specdec::load_model(draft_model_path()));
  return weights;
}

// A tiny random-weight draft with the fixture's vocabulary (acceptance near zero, which exercises
// rejection and rollback on every step).
inline std::shared_ptr<specdec::llama_weights const> random_draft() {
  specdec::llama_config c;
  c.dim = 16;
  c.hidden_dim = 32;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.vocab_size = 512;
  c.seq_len = 512;
  return std::make_shared<specdec::llama_weights const>(specdec::make_random_llama(c, 11, 0.5f));
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

// The `key` string field of every line of tinystories_prompts.jsonl that has one ("prompt",
// "story"; escapes decoded by the benchmarks' JSONL reader); the set has 14 lines.
inline std::vector<std::string> tinystories_field(char const* key) {
  std::vector<std::string> values =
      bench::jsonl_strings(require_file("SPECDEC_DATA_DIR", "tinystories_prompts.jsonl"), key);
  REQUIRE(values.size() == 14);
  return values;
}

// The "prompt" strings of tinystories_prompts.jsonl.
inline std::vector<std::string> tinystories_prompts() {
  return tinystories_field("prompt");
}

// The "story" strings of tinystories_prompts.jsonl.
inline std::vector<std::string> tinystories_stories() {
  return tinystories_field("story");
}

// Every prompt of tinystories_prompts.jsonl encoded with BOS.
inline std::vector<std::vector<specdec::token_id>> encoded_prompts() {
  std::vector<std::vector<specdec::token_id>> out;
  for (auto const& p : tinystories_prompts()) out.push_back(tok512().encode(p, true));
  return out;
}

}  // namespace fixture
