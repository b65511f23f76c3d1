// REST end to end on the stories260K fixture: datastores built from the TinyStories stories of
// tinystories_prompts.jsonl and from text sampled from the fixture itself; greedy output
// token-identical to autoregressive decoding on every prompt with the second (every other prompt
// with the first), and the manifest's reference ids,
// the datastore file round trip under decoding, and under sampling the chi-square test of the
// first two tokens against the exact distribution.
#include "support/doctest.hpp"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "decode/sampling_check.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/rest.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

namespace {

// A datastore of the 14 stories, tokenised with the fixture's tokenizer (no BOS).
std::shared_ptr<sd::rest_datastore const> stories_datastore() {
  sd::rest_datastore_builder b(static_cast<std::size_t>(fixture::tok512().vocab_size()));
  for (auto const& s : fixture::tinystories_stories()) b.add(fixture::tok512().encode(s, false));
  return std::make_shared<sd::rest_datastore const>(b.build());
}

// A datastore of `count` stories of `length` tokens sampled from the fixture (temperature 1,
// top-p 0.9) after BOS, seeds 1..count.
std::shared_ptr<sd::rest_datastore const> generated_datastore(std::size_t count,
                                                              std::size_t length) {
  sd::cpu_llama model(fixture::stories260k(), {.threads = 1});
  sd::decode_config config;
  config.max_new_tokens = length;
  sd::autoregressive_decoder ar(model, sampling_check::target_policy(), config);
  sd::rest_datastore_builder b(model.vocab_size());
  std::vector<sd::token_id> const bos{1};
  for (std::size_t i = 0; i < count; ++i) {
    ar.config().seed = 1 + i;
    b.add(ar.generate(bos).tokens);
  }
  return std::make_shared<sd::rest_datastore const>(b.build());
}

}  // namespace

TEST_CASE("fixture: greedy REST == greedy autoregressive on every TinyStories prompt") {
  auto const weights = fixture::stories260k();
  auto const prompts = fixture::encoded_prompts();
  sd::cpu_llama target(weights, {.threads = 1});
  sd::decode_config config;
  config.max_new_tokens = 128;
  config.max_draft_nodes = 32;
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);

  auto const from_stories = stories_datastore();
  auto const from_model = generated_datastore(24, 256);
  // The generated datastore through a file (memory-mapped), as the tool would provide it.
  test_support::temp_dir const dir;
  auto const path = dir.file("generated.sdrest");
  from_model->save(path);
  auto const mapped = std::make_shared<sd::rest_datastore const>(sd::rest_datastore::load(path));
  std::filesystem::remove(path);
  CHECK(mapped->is_mapped());
  MESSAGE("datastores: stories " << from_stories->size() << " tokens, generated "
                                 << from_model->size() << " tokens");

  struct setup {
    char const* name;
    std::shared_ptr<sd::rest_datastore const> ds;
    sd::rest_config config;
  };
  std::vector<setup> const setups{
      {"stories, default", from_stories, {}},
      {"generated (mapped), default", mapped, {}},
  };
  std::vector<sd::request_stats> totals(setups.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    auto const reference = ar.generate(prompts[i]);
    REQUIRE(reference.tokens.size() == 128);
    for (std::size_t k = 0; k < setups.size(); ++k) {
      if (k == 0 && i % 2 != 0) continue;  // the stories datastore on every other prompt
      std::string const name = setups[k].name;
      CAPTURE(name);
      sd::rest_proposer p(setups[k].ds, setups[k].config);
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      auto const r = dec.generate(prompts[i]);
      CHECK(r.tokens == reference.tokens);
      totals[k].steps += r.stats.steps;
      totals[k].drafted += r.stats.drafted;
      totals[k].accepted += r.stats.accepted;
    }
  }
  for (std::size_t k = 0; k < setups.size(); ++k) {
    MESSAGE("REST " << std::string(setups[k].name) << ": " << totals[k].mean_accepted_length()
                    << " tokens per step, " << totals[k].mean_tree_size() << " nodes per tree");
    CHECK(totals[k].accepted > 0);
  }
  // The manifest's reference ids, with the tree verifier.
  std::vector<sd::token_id> const expected = fixture::reference_continuation();
  config.max_new_tokens = expected.size();
  sd::rest_proposer p(from_model);
  sd::speculative_decoder dec(target, p, sd::tree_verifier{}, sd::greedy{}, config);
  CHECK(dec.generate(fixture::once_upon_a_time()).tokens == expected);
}

TEST_CASE("fixture: REST under sampling matches autoregressive sampling (chi-square)") {
  auto const weights = fixture::stories260k();
  // "Once upon a time, there was a": many continuations in the stories.
  std::vector<sd::token_id> const prompt{1, 403, 407, 261, 378, 432, 383, 286, 261};
  auto const joint = sampling_check::exact_joint(weights, prompt);
  sd::cpu_llama target(weights, {.threads = 1});
  sd::rest_proposer p(stories_datastore(), {.depth = 3, .max_nodes = 8});
  sd::speculative_decoder dec(target, p, sd::tree_verifier{}, sampling_check::target_policy(),
                              sampling_check::two_tokens());
  sd::request_stats s;
  sampling_check::check_counts(sampling_check::sample_pairs(dec, prompt, &s), joint,
                               sampling_check::trials, "REST, tree verifier");
  CHECK(s.drafted >= 2 * sampling_check::trials);  // a tree every first step
  CHECK(s.accepted > s.drafted / 10);
}
