#pragma once
// The stories260K fixture for decoder and proposer tests (and the CUDA decoder tests): the weights
// and tokenizer loaded once, the trained and a random draft model, the reference greedy ids, and
// the prompt set. Files come from SPECDEC_MODEL_DIR / SPECDEC_DATA_DIR (support/files.hpp: a
// missing file FAILS the test with a message).

#include "support/doctest.hpp"

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "specdec/core/types.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/tokenizer.hpp"
#include "support/files.hpp"
#include "support/jsonl.hpp"
#include "support/llama_shapes.hpp"

namespace fixture {

// The stories260K weights, loaded once per process.
inline std::shared_ptr<specdec::llama_weights const> const& stories260k() {
  static std::shared_ptr<specdec::llama_weights const> const weights =
      std::make_shared<specdec::llama_weights const>(
          specdec::load_model(test_support::model_file("stories260K.bin")));
  return weights;
}

// The fixture's tokenizer (tok512.bin), loaded once per process.
inline specdec::tokenizer const& tok512() {
  static specdec::tokenizer const tok = specdec::load_tokenizer(
      test_support::model_file("stories260K.bin"), test_support::model_file("tok512.bin"));
  return tok;
}

// The draft model trained for the fixture, tools/draft/stories_draft.bin in the source tree;
// fails the test when it is missing.
inline std::filesystem::path draft_model_path() {
  return test_support::source_file("tools/draft/stories_draft.bin");
}

// The draft trained for the fixture (tools/draft/stories_draft.bin), loaded once per process.
inline std::shared_ptr<specdec::llama_weights const> const& trained_draft() {
  static std::shared_ptr<specdec::llama_weights const> const weights =
      std::make_shared<specdec::llama_weights const>(specdec::load_model(draft_model_path()));
  return weights;
}

// The draft of another vocabulary and its tokenizer (tools/draft/cross/stories_draft_tok1024.bin,
// tok1024.bin), and the same-vocabulary draft trained with the same recipe
// (stories_draft_same_vocab.bin), loaded once per process.
inline std::shared_ptr<specdec::llama_weights const> const& cross_draft() {
  static std::shared_ptr<specdec::llama_weights const> const weights =
      std::make_shared<specdec::llama_weights const>(specdec::load_model(
          test_support::source_file("tools/draft/cross/stories_draft_tok1024.bin")));
  return weights;
}
inline specdec::tokenizer const& tok1024() {
  static specdec::tokenizer const tok = specdec::load_tokenizer(
      test_support::source_file("tools/draft/cross/stories_draft_tok1024.bin"),
      test_support::source_file("tools/draft/cross/tok1024.bin"));
  return tok;
}
inline std::shared_ptr<specdec::llama_weights const> const& same_vocab_draft() {
  static std::shared_ptr<specdec::llama_weights const> const weights =
      std::make_shared<specdec::llama_weights const>(specdec::load_model(
          test_support::source_file("tools/draft/cross/stories_draft_same_vocab.bin")));
  return weights;
}

// The parallel draft model (PARD) trained for the fixture (tools/draft/pard/stories_pard.bin, mask
// id 0), loaded once per process.
inline std::shared_ptr<specdec::llama_weights const> const& pard_draft() {
  static std::shared_ptr<specdec::llama_weights const> const weights =
      std::make_shared<specdec::llama_weights const>(
          specdec::load_model(test_support::source_file("tools/draft/pard/stories_pard.bin")));
  return weights;
}

// A tiny random-weight draft with the fixture's vocabulary (acceptance near zero, which exercises
// rejection and rollback on every step).
inline std::shared_ptr<specdec::llama_weights const> random_draft() {
  return std::make_shared<specdec::llama_weights const>(
      specdec::make_random_llama(test_support::shapes::fixture_draft(), 11, 0.5f));
}

// BOS + encode("Once upon a time") (MANIFEST.md).
inline std::vector<specdec::token_id> once_upon_a_time() {
  return {1, 403, 407, 261, 378};
}

// The 256 reference greedy ids after BOS (prompt included).
inline std::vector<specdec::token_id> reference_ids() {
  std::ifstream in(test_support::model_file("reference_greedy_once_upon_a_time.ids"));
  std::vector<specdec::token_id> ids;
  specdec::token_id t = 0;
  while (in >> t) ids.push_back(t);
  REQUIRE(ids.size() == 256);
  return ids;
}

// The 252 reference greedy ids that follow once_upon_a_time(): reference_ids() without the prompt,
// which it must begin with.
inline std::vector<specdec::token_id> reference_continuation() {
  std::vector<specdec::token_id> const ref = reference_ids();
  std::vector<specdec::token_id> const prompt = once_upon_a_time();
  REQUIRE(std::equal(prompt.begin() + 1, prompt.end(), ref.begin()));
  return {ref.begin() + static_cast<std::ptrdiff_t>(prompt.size() - 1), ref.end()};
}

// The `key` string field of every line of tinystories_prompts.jsonl that has one ("prompt",
// "story"; read by support/jsonl.hpp, as the benchmarks read it); the set has 14 lines.
inline std::vector<std::string> tinystories_field(char const* key) {
  std::vector<std::string> values =
      test_support::jsonl_strings(test_support::data_file("tinystories_prompts.jsonl"), key);
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
