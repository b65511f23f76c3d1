// SuffixDecoding end to end on the stories260K fixture: a repeated workload (the TinyStories
// prompts served twice, the global tree filling with the first round's outputs) decoded greedily
// alone and in a batch, token-identical to autoregressive decoding, with the global tree drafting
// more in the second round; the saved cache drafts after a restart as before; under sampling, the
// chi-square test of the first two tokens against the exact distribution (path and tree drafts).
#include "support/doctest.hpp"

#include <cstddef>
#include <memory>
#include <vector>

#include "decode/jobs.hpp"
#include "decode/sampling_check.hpp"
#include "specdec/backend/cpu/batched_llama.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/batch_decoder.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/per_request.hpp"
#include "specdec/propose/suffix.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

TEST_CASE("fixture: greedy suffix decoding == greedy autoregressive, alone and batched") {
  auto const weights = fixture::stories260k();
  auto const prompts = fixture::encoded_prompts();
  sd::cpu_llama target(weights, {.threads = 1});
  sd::decode_config config;
  config.max_new_tokens = 96;
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);
  std::vector<std::vector<sd::token_id>> reference;
  for (auto const& p : prompts) reference.push_back(ar.generate(p).tokens);

  // Alone: every prompt twice, one cache; the second round drafts from the first's outputs.
  auto const cache = std::make_shared<sd::suffix_cache>(
      sd::suffix_cache_config{.vocab_size = target.vocab_size()});
  sd::request_stats rounds[2];
  std::size_t global = 0;
  for (std::size_t round = 0; round < 2; ++round) {
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(round);
      CAPTURE(i);
      sd::suffix_proposer p(cache, {.speculation = {.max_tokens = 8, .tree = i % 2 == 1}});
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      auto const r = dec.generate(prompts[i]);
      CHECK(r.tokens == reference[i]);
      rounds[round].steps += r.stats.steps;
      rounds[round].accepted += r.stats.accepted;
      if (round == 1) global += p.drafts_from(sd::suffix_source::global);
    }
  }
  MESSAGE("suffix decoding, tokens per step: first round " << rounds[0].mean_accepted_length()
                                                           << ", second round "
                                                           << rounds[1].mean_accepted_length());
  CHECK(cache->requests() == 2 * prompts.size());
  CHECK(cache->check().empty());
  CHECK(global > 0);
  // The second round regenerates what the first produced: far fewer steps.
  CHECK(rounds[1].mean_accepted_length() > 2.0 * rounds[0].mean_accepted_length());

  // The cache through a file: a new cache loaded from it drafts the second round as well.
  test_support::temp_dir const dir;
  auto const path = dir.file("outputs.sdsuffix");
  cache->save(path);
  auto const warm = std::make_shared<sd::suffix_cache>(
      sd::suffix_cache_config{.vocab_size = target.vocab_size()});
  warm->load(path);
  CHECK(warm->nodes() == cache->nodes());

  // Batched: four slots, one shared warm cache, each request with its own local tree.
  sd::cpu_batched_llama batched(weights, {.model = {.threads = 1}, .max_slots = 4});
  using proposers = sd::per_request_proposer<sd::suffix_proposer>;
  proposers proposer([warm] { return sd::suffix_proposer(warm, {}); });
  sd::batch_decoder<sd::cpu_batched_llama, proposers, sd::greedy_verifier, sd::sampler> decoder(
      batched, proposer);
  std::vector<std::uint64_t> ids;
  for (auto const& p : prompts)
    ids.push_back(decoder.submit(p, decode_test::policy_of(0.0f), config));
  decoder.run();
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    auto const got = decoder.take(ids[i]);
    REQUIRE(got.has_value());
    CHECK(got->result.tokens == reference[i]);
  }
  MESSAGE("batched on the warm cache: " << decoder.stats().mean_accepted_length()
                                        << " tokens per step");
  CHECK(decoder.stats().mean_accepted_length() > rounds[0].mean_accepted_length());
  CHECK(warm->requests() == 3 * prompts.size());
}

TEST_CASE("fixture: suffix decoding under sampling matches autoregressive sampling (chi-square)") {
  auto const weights = fixture::stories260k();
  // "Once upon a time, there was a": many continuations in the stories.
  std::vector<sd::token_id> const prompt{1, 403, 407, 261, 378, 432, 383, 286, 261};
  auto const joint = sampling_check::exact_joint(weights, prompt);
  sd::cpu_llama target(weights, {.threads = 1});
  for (bool const tree : {false, true}) {
    CAPTURE(tree);
    // The global tree holds the stories (as earlier outputs); each trial adds its own two tokens.
    auto const cache = std::make_shared<sd::suffix_cache>(sd::suffix_cache_config{});
    for (auto const& s : fixture::tinystories_stories()) {
      auto const id = cache->start();
      cache->append(id, fixture::tok512().encode(s, false));
      cache->finish(id);
    }
    sd::suffix_proposer p(
        cache,
        {.speculation = {.max_tokens = 6, .factor = 4.0f, .min_probability = 0.0f, .tree = tree}});
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, sampling_check::target_policy(),
                                sampling_check::two_tokens());
    sd::request_stats s;
    sampling_check::check_counts(
        sampling_check::sample_pairs(dec, prompt, &s), joint, sampling_check::trials,
        tree ? "suffix trees, tree verifier" : "suffix paths, tree verifier");
    CHECK(s.drafted >= sampling_check::trials);  // a draft every first step at least
    CHECK(s.accepted > s.drafted / 20);
  }
}
