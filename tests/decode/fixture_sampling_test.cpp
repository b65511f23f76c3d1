// Speculative sampling on the stories260K fixture draws the first two generated tokens from the
// same distribution as autoregressive sampling, for every proposer: temperature 1 and top-p 0.9,
// many requests with distinct seeds, and a chi-square test of the observed counts of (x1, x2)
// against the exact joint distribution computed from the model.
//
// Threshold (sampling_check.hpp): the statistic is compared with the chi-square quantile at
// p = 1e-4 for its degrees of freedom (Wilson-Hilferty approximation); cells with an expected count
// below 5 are pooled into one. A pair of probability 0 under the target must never be emitted. The
// seeds are fixed, so the test is deterministic; a correct decoder fails it with probability about
// 1e-4 per configuration over the choice of seeds.
#include "support/doctest.hpp"

#include <memory>
#include <vector>

#include "decode/one_thread.hpp"
#include "decode/sampling_check.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/propose/sparse_kv.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

namespace {

using sampling_check::check_counts;
using sampling_check::exact_joint;
using sampling_check::sample_pairs;
using sampling_check::target_policy;
using sampling_check::trials;
using sampling_check::two_tokens;

using decode_test::one_thread;

}  // namespace

TEST_CASE("fixture: sampled speculative decoding matches autoregressive sampling (chi-square)") {
  auto const weights = fixture::stories260k();
  // BOS + " very" ("Very ..."): a short prompt (cheap to prefill) after which the next two tokens
  // are uncertain: about 65 cells with an expected count >= 5 at 1500 trials.
  std::vector<sd::token_id> const prompt{1, 399};
  static auto const joint = exact_joint(weights, prompt);  // once for every subcase
  sd::cpu_llama target(weights, one_thread());

  SUBCASE("autoregressive sampling (the test's own check)") {
    sd::autoregressive_decoder ar(target, target_policy(), two_tokens());
    check_counts(sample_pairs(ar, prompt), joint, trials, "autoregressive");
  }
  SUBCASE("draft model (random weights, mostly rejected), sampled drafts, speculative sampling") {
    sd::cpu_llama draft(fixture::random_draft(), one_thread());
    sd::draft_model_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample> p(
        draft, target, target_policy(), {.k = 3});
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, target_policy(),
                                two_tokens());
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "random draft, sampled");
    CHECK(s.drafted > 0);
  }
  SUBCASE("layer skip (a good draft), sampled drafts, speculative sampling") {
    sd::layer_skip_proposer<sd::sampler, sd::draft_mode::sample> p(
        {.skip_layers = {2}, .draft = {.k = 3}}, target_policy());
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, target_policy(),
                                two_tokens());
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "layer skip, sampled");
    CHECK(s.accepted > s.drafted / 4);  // acceptance must be substantial for the test to bite
  }
  SUBCASE("sparse KV (a view of 2 sinks and 3 recent positions), sampled drafts") {
    sd::sparse_kv_proposer<sd::sampler, sd::draft_mode::sample> p(
        {.sinks = 2, .budget = 5, .draft = {.k = 3}}, target_policy());
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, target_policy(),
                                two_tokens());
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "sparse KV, sampled");
    CHECK(s.accepted > s.drafted / 4);
  }
  SUBCASE("layer skip, sampled drafts, tree verifier") {
    sd::layer_skip_proposer<sd::sampler, sd::draft_mode::sample> p(
        {.skip_layers = {3}, .draft = {.k = 2}}, target_policy());
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, target_policy(), two_tokens());
    check_counts(sample_pairs(dec, prompt), joint, trials, "layer skip, sampled, tree verifier");
  }
  SUBCASE("layer skip, greedy drafts (point masses), tree verifier") {
    sd::layer_skip_proposer<sd::sampler, sd::draft_mode::greedy> p(
        {.skip_layers = {2}, .draft = {.k = 3}}, target_policy());
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, target_policy(), two_tokens());
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "greedy drafts, tree verifier");
    CHECK(s.accepted > 0);
  }
  SUBCASE("trained draft model, sampled drafts, speculative sampling") {
    sd::cpu_llama draft(fixture::trained_draft(), one_thread());
    sd::draft_model_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample> p(
        draft, target, target_policy(), {.k = 3});
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, target_policy(),
                                two_tokens());
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "trained draft, sampled");
    CHECK(s.accepted > s.drafted / 10);  // about 17% after this prompt: acceptance does occur
  }
}

TEST_CASE(
    "fixture: sparse KV views selected per head under sampling match autoregressive "
    "sampling (chi-square)") {
  auto const weights = fixture::stories260k();
  // 15 tokens ("Once upon a time, there was a little girl, there was a"): long enough that the
  // view is selected from them (SnapKV observes the last 2 prompt tokens, retrieval the root).
  std::vector<sd::token_id> const prompt{1,   403, 407, 261, 378, 432, 383, 286,
                                         261, 376, 298, 432, 383, 286, 261};
  static auto const joint = exact_joint(weights, prompt);
  sd::cpu_llama target(weights, one_thread());
  for (sd::kv_policy const policy : {sd::kv_policy::snapkv, sd::kv_policy::retrieval}) {
    CAPTURE(static_cast<int>(policy));
    // 4 positions selected of the 12 before the 2-position window: SnapKV's best pooled ones,
    // or 2 chunks of 2 of 6 (retrieval, chunk 0 among them).
    sd::sparse_kv_proposer<sd::sampler, sd::draft_mode::sample> p(
        {.policy = policy, .budget = 6, .window = 2, .pool = 3, .chunk = 2, .draft = {.k = 3}},
        target_policy());
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, target_policy(),
                                two_tokens());
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials,
                 policy == sd::kv_policy::snapkv ? "sparse KV, SnapKV" : "sparse KV, retrieval");
    CHECK(p.view().per_head == 4);  // a selection was made
    CHECK(s.accepted > s.drafted / 4);
    CHECK(s.accepted < s.drafted);  // and it drafts other tokens than the target would
  }
}

TEST_CASE("fixture: prompt lookup trees under sampling match autoregressive sampling") {
  auto const weights = fixture::stories260k();
  // "Once upon a time, there was a little girl, there was a": with unigrams only, "a" matches
  // twice ("upon a time , there" and "was a little girl ,"), so the draft is a two-branch tree.
  std::vector<sd::token_id> const prompt{1,   403, 407, 261, 378, 432, 383, 286,
                                         261, 376, 298, 432, 383, 286, 261};
  auto const joint = exact_joint(weights, prompt);
  sd::cpu_llama target(weights, one_thread());
  sd::prompt_lookup_proposer p({.n_max = 1, .n_min = 1, .k = 3, .max_branches = 2});
  sd::speculative_decoder dec(target, p, sd::tree_verifier{}, target_policy(), two_tokens());
  sd::request_stats s;
  check_counts(sample_pairs(dec, prompt, &s), joint, trials, "prompt lookup tree");
  CHECK(s.drafted >= 6 * trials);  // two branches of three every first step
  CHECK(s.accepted > 0);
}
