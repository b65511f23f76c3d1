// Lookahead decoding end to end: greedy output token-identical to autoregressive decoding (the toy
// model, which checks every mask and position it is given, and the stories260K fixture on every
// TinyStories prompt with the default configuration, every third with a wider window), the
// auxiliary KV entries dropped at each commit, and under sampling the chi-square test of the first
// two tokens against the exact distribution.
#include "support/doctest.hpp"

#include <string>
#include <vector>

#include "decode/sampling_check.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/lookahead.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/fixture.hpp"
#include "support/toy_model.hpp"

namespace sd = specdec;

TEST_CASE("lookahead: greedy on the toy model equals autoregressive decoding") {
  std::size_t const vocab = 40, context = 160;
  toy::toy_lm target(vocab, context);
  sd::decode_config config;
  config.max_new_tokens = 120;
  config.max_draft_nodes = 24;
  sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar(target, sd::greedy{}, config);
  std::vector<std::vector<sd::token_id>> const prompts{{1}, {3, 9, 27, 3, 9}, {5, 5, 5, 5}};
  std::vector<sd::lookahead_config> const configs{
      {.window = 5, .ngram = 4, .guesses = 5},
      {.window = 1, .ngram = 2, .guesses = 1},
      {.window = 8, .ngram = 6, .guesses = 8, .pool_from_context = false},
      {.window = 3, .ngram = 3, .guesses = 0},  // the window alone: never drafts
  };
  for (auto const& prompt : prompts) {
    auto const reference = ar.generate(prompt);
    for (std::size_t c = 0; c < configs.size(); ++c) {
      CAPTURE(c);
      sd::lookahead_proposer p(configs[c]);
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      auto const r = dec.generate(prompt);
      CHECK(r.tokens == reference.tokens);
      CHECK(r.reason == reference.reason);
      if (configs[c].window > 1) CHECK(r.stats.aux_tokens > 0);
      if (configs[c].guesses == 0) CHECK(r.stats.drafted == 0);
      // The tree verifier under a greedy policy makes the same decisions.
      sd::speculative_decoder dec2(target, p, sd::tree_verifier{}, sd::greedy{}, config);
      CHECK(dec2.generate(prompt).tokens == reference.tokens);
    }
  }
  // Up to the end of the context: the window stops fitting and is skipped; output unchanged.
  config.max_new_tokens = 1000;
  sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar_full(target, sd::greedy{}, config);
  auto const reference = ar_full.generate(prompts[1]);
  CHECK(reference.reason == sd::finish_reason::context_full);
  sd::lookahead_proposer p({.window = 6, .ngram = 5, .guesses = 6});
  sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
  auto const r = dec.generate(prompts[1]);
  CHECK(r.tokens == reference.tokens);
  CHECK(r.reason == sd::finish_reason::context_full);
  CHECK(r.stats.accepted > 0);
  MESSAGE("toy model, W=6 N=5 G=6: " << r.stats.mean_accepted_length() << " tokens per step");
}

TEST_CASE("fixture: greedy lookahead == greedy autoregressive on every TinyStories prompt") {
  auto const weights = fixture::stories260k();
  auto const prompts = fixture::encoded_prompts();
  sd::cpu_llama target(weights, {.threads = 1});
  sd::decode_config config;
  config.max_new_tokens = 128;
  config.max_draft_nodes = 32;
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);
  std::vector<sd::lookahead_config> const configs{
      {.window = 5, .ngram = 4, .guesses = 5},
      {.window = 7, .ngram = 5, .guesses = 7, .pool_from_context = false},
  };
  std::vector<sd::request_stats> totals(configs.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    auto const reference = ar.generate(prompts[i]);
    REQUIRE(reference.tokens.size() == 128);
    for (std::size_t c = 0; c < configs.size(); ++c) {
      if (c > 0 && i % 3 != 0) continue;  // the second configuration on every third prompt
      CAPTURE(c);
      sd::lookahead_proposer p(configs[c]);
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      auto const r = dec.generate(prompts[i]);
      CHECK(r.tokens == reference.tokens);
      totals[c].steps += r.stats.steps;
      totals[c].drafted += r.stats.drafted;
      totals[c].accepted += r.stats.accepted;
      totals[c].aux_tokens += r.stats.aux_tokens;
    }
  }
  for (std::size_t c = 0; c < configs.size(); ++c)
    MESSAGE("lookahead W=" << configs[c].window << " N=" << configs[c].ngram
                           << " G=" << configs[c].guesses
                           << std::string(configs[c].pool_from_context ? "" : " (window only)")
                           << ": " << totals[c].mean_accepted_length() << " tokens per step, "
                           << totals[c].mean_tree_size() << " tree nodes and "
                           << static_cast<double>(totals[c].aux_tokens) /
                                  static_cast<double>(totals[c].steps)
                           << " window tokens per step");
  // The bar: more than 1.3 tokens per target forward with the default configuration.
  CHECK(totals[0].mean_accepted_length() > 1.3);

  // The manifest's reference ids.
  std::vector<sd::token_id> const expected = fixture::reference_continuation();
  config.max_new_tokens = expected.size();
  sd::lookahead_proposer p;
  sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
  CHECK(dec.generate(fixture::once_upon_a_time()).tokens == expected);
}

TEST_CASE("fixture: lookahead under sampling matches autoregressive sampling (chi-square)") {
  auto const weights = fixture::stories260k();
  // "Once upon a time, there was a little girl, there was a": the pool holds the prompt's
  // 3-grams after "a" ("a time ,", "a little girl"), so the first step drafts a two-branch tree.
  std::vector<sd::token_id> const prompt{1,   403, 407, 261, 378, 432, 383, 286,
                                         261, 376, 298, 432, 383, 286, 261};
  auto const joint = sampling_check::exact_joint(weights, prompt);
  sd::cpu_llama target(weights, {.threads = 1});
  sd::lookahead_proposer p({.window = 4, .ngram = 3, .guesses = 4});
  sd::speculative_decoder dec(target, p, sd::tree_verifier{}, sampling_check::target_policy(),
                              sampling_check::two_tokens());
  sd::request_stats s;
  sampling_check::check_counts(sampling_check::sample_pairs(dec, prompt, &s), joint,
                               sampling_check::trials, "lookahead, tree verifier");
  CHECK(s.drafted >= 3 * sampling_check::trials);  // the first step's tree
  CHECK(s.accepted > 0);
  CHECK(s.aux_tokens > 0);
}
