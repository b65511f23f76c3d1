// Jacobi decoding end to end: greedy output token-identical to autoregressive decoding on the toy
// model and on every TinyStories prompt with the stories260K fixture.
#include "support/doctest.hpp"

#include <vector>

#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/jacobi.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "support/fixture.hpp"
#include "support/toy_model.hpp"

namespace sd = specdec;

TEST_CASE("jacobi: greedy on the toy model equals autoregressive decoding") {
  toy::toy_lm target(40, 200);
  sd::decode_config config;
  config.max_new_tokens = 150;
  config.max_draft_nodes = 16;
  sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar(target, sd::greedy{}, config);
  for (std::size_t const block : {1u, 4u, 16u, 40u}) {
    CAPTURE(block);
    sd::jacobi_proposer p({.block = block});
    sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
    std::vector<sd::token_id> const prompt{2, 7, 1};
    auto const reference = ar.generate(prompt);
    auto const r = dec.generate(prompt);
    CHECK(r.tokens == reference.tokens);
    CHECK(r.stats.aux_tokens == 0);
    CHECK(r.stats.max_tree_size == std::min<std::size_t>(block, 16));
  }
  // To the end of the context.
  config.max_new_tokens = 1000;
  sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar_full(target, sd::greedy{}, config);
  sd::jacobi_proposer p({.block = 6});
  sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
  std::vector<sd::token_id> const prompt{5};
  auto const reference = ar_full.generate(prompt);
  auto const r = dec.generate(prompt);
  CHECK(r.tokens == reference.tokens);
  CHECK(r.reason == sd::finish_reason::context_full);
  MESSAGE("toy model, k=6: " << r.stats.mean_accepted_length() << " tokens per step");
}

TEST_CASE("fixture: greedy Jacobi == greedy autoregressive on every TinyStories prompt") {
  auto const weights = fixture::stories260k();
  auto const prompts = fixture::encoded_prompts();
  sd::cpu_llama target(weights, {.threads = 1});
  sd::decode_config config;
  config.max_new_tokens = 128;
  config.max_draft_nodes = 16;
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);
  sd::jacobi_proposer p8({.block = 8});
  sd::speculative_decoder d8(target, p8, sd::greedy_verifier{}, sd::greedy{}, config);
  sd::request_stats t8;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    auto const reference = ar.generate(prompts[i]);
    auto const r8 = d8.generate(prompts[i]);
    CHECK(r8.tokens == reference.tokens);
    t8.steps += r8.stats.steps;
    t8.accepted += r8.stats.accepted;
    t8.drafted += r8.stats.drafted;
  }
  MESSAGE("jacobi k=8: " << t8.mean_accepted_length() << " tokens per step");
  std::vector<sd::token_id> const expected = fixture::reference_continuation();
  config.max_new_tokens = expected.size();
  sd::speculative_decoder dec(target, p8, sd::greedy_verifier{}, sd::greedy{}, config);
  CHECK(dec.generate(fixture::once_upon_a_time()).tokens == expected);
}
