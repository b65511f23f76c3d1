// Parallel drafting (PARD) end to end on the stories260K fixture with the mask-trained draft of
// tools/draft/pard: greedy output token-identical to greedy autoregressive decoding on every
// prompt of tinystories_prompts.jsonl (128 new tokens, k = 4 and 8), the tokens per target forward
// and draft forwards per step against the draft model it was fine-tuned from (chains of k, one
// draft forward per token) in the same run, and under temperature 1 / top-p 0.9 the joint
// distribution of the first two tokens against the exact one (sampling_check.hpp).
#include "support/doctest.hpp"

#include <vector>

#include "decode/sampling_check.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/parallel_draft.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "support/fixture.hpp"

namespace parallel_draft_decode_test {

namespace sd = specdec;

// Greedy decoding of every fixture prompt (128 new tokens) with `proposer`; the tokens must equal
// autoregressive greedy decoding's. Returns the summed statistics.
template <class Proposer>
sd::request_stats greedy_on_every_prompt(Proposer& proposer) {
  sd::cpu_llama target(fixture::stories260k(), {.threads = 1});
  auto const prompts = fixture::encoded_prompts();
  sd::decode_config config;
  config.max_new_tokens = 128;
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);
  std::vector<std::vector<sd::token_id>> want;
  for (auto const& p : prompts) want.push_back(ar.generate(p).tokens);
  sd::speculative_decoder dec(target, proposer, sd::greedy_verifier{}, sd::greedy{}, config);
  sd::request_stats total;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    auto const r = dec.generate(prompts[i]);
    CHECK(r.tokens == want[i]);
    total.steps += r.stats.steps;
    total.drafted += r.stats.drafted;
    total.accepted += r.stats.accepted;
  }
  return total;
}

}  // namespace parallel_draft_decode_test

TEST_CASE("parallel drafting: greedy == greedy autoregressive; against chain drafting") {
  using namespace parallel_draft_decode_test;
  sd::cpu_llama pard(fixture::pard_draft(), {.threads = 1});
  sd::parallel_draft_proposer<sd::cpu_llama, sd::greedy> p4(pard, 512, sd::greedy{},
                                                            {.k = 4, .mask_token = 0});
  sd::parallel_draft_proposer<sd::cpu_llama, sd::greedy> p8(pard, 512, sd::greedy{},
                                                            {.k = 8, .mask_token = 0});
  sd::request_stats const a = greedy_on_every_prompt(p4);
  sd::request_stats const b = greedy_on_every_prompt(p8);
  // The draft it was fine-tuned from, drafting a chain of 4 with one forward per token.
  sd::cpu_llama draft(fixture::trained_draft(), {.threads = 1});
  sd::draft_model_proposer<sd::cpu_llama, sd::greedy> chain(draft, 512, sd::greedy{}, {.k = 4});
  sd::request_stats const c = greedy_on_every_prompt(chain);
  // PARD with its own weights drafting a chain, one forward per token (the ordinary rows only).
  sd::draft_model_proposer<sd::cpu_llama, sd::greedy> own(pard, 512, sd::greedy{}, {.k = 4});
  sd::request_stats const d = greedy_on_every_prompt(own);
  MESSAGE("greedy, 14 prompts x 128 tokens, tokens per target forward: PARD k = 4 "
          << a.mean_accepted_length() << ", k = 8 " << b.mean_accepted_length()
          << " (one draft forward per step); the draft model it was fine-tuned from, chain of 4 "
          << c.mean_accepted_length() << " (4 draft forwards per step); the PARD weights as a "
          << "chain drafter, 4 " << d.mean_accepted_length());
  CHECK(a.mean_accepted_length() > 1.5);
}

TEST_CASE("parallel drafting: sampled decoding matches autoregressive sampling (chi-square)") {
  using sampling_check::check_counts;
  using sampling_check::exact_joint;
  using sampling_check::sample_pairs;
  using sampling_check::target_policy;
  using sampling_check::trials;
  using sampling_check::two_tokens;
  namespace sd = specdec;
  auto const weights = fixture::stories260k();
  std::vector<sd::token_id> const prompt{1, 399};  // BOS + " very", as fixture_sampling_test
  static auto const joint = exact_joint(weights, prompt, target_policy());
  sd::cpu_llama target(weights, {.threads = 1});
  sd::cpu_llama pard(fixture::pard_draft(), {.threads = 1});
  sd::parallel_draft_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample> p(
      pard, 512, target_policy(), {.k = 4, .mask_token = 0});
  sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, target_policy(),
                              two_tokens(4));
  sd::request_stats st;
  check_counts(sample_pairs(dec, prompt, &st), joint, trials, "pard, k = 4");
  CHECK(st.accepted > 0);
}
