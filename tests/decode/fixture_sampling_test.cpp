// Speculative sampling on the stories260K fixture draws the first two generated tokens from the
// same distribution as autoregressive sampling, for every proposer: temperature 1 and top-p 0.9,
// many requests with distinct seeds, and a chi-square test of the observed counts of (x1, x2)
// against the exact joint distribution computed from the model.
//
// Threshold: the statistic is compared with the chi-square quantile at p = 1e-4 for its degrees of
// freedom (Wilson-Hilferty approximation); cells with an expected count below 5 are pooled into
// one. A pair of probability 0 under the target must never be emitted. The seeds are fixed, so the
// test is deterministic; a correct decoder fails it with probability about 1e-4 per configuration
// over the choice of seeds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "decode/fixture.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/random.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"

namespace sd = specdec;

namespace {

// Requests per configuration (fewer under sanitizers, which are ~10x slower; the threshold is
// valid for any count).
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t trials = 600;
#else
constexpr std::size_t trials = 1500;
#endif

sd::cpu_llama_options one_thread() {
  return {.threads = 1};
}

sd::sampler target_policy() {
  sd::sampling_params params;
  params.temperature = 1.0f;
  params.top_p = 0.9f;
  return sd::sampler(params);
}

using pair_key = std::pair<sd::token_id, sd::token_id>;

// The exact joint distribution of the first two tokens after `prompt` under the policy.
std::map<pair_key, double> exact_joint(std::shared_ptr<sd::llama_weights const> const& weights,
                                       std::vector<sd::token_id> const& prompt) {
  sd::cpu_llama model(weights, one_thread());
  sd::sampler const policy = target_policy();
  std::size_t const vocab = model.vocab_size();
  std::vector<sd::position_t> positions(prompt.size());
  for (std::size_t i = 0; i < prompt.size(); ++i) positions[i] = static_cast<sd::position_t>(i);
  sd::forward_result out;
  model.forward({.tokens = prompt, .positions = positions}, out);
  std::vector<float> p1(vocab), p2(vocab);
  policy.distribution(out.logits_view().row(prompt.size() - 1), prompt, p1);
  std::map<pair_key, double> joint;
  std::vector<sd::token_id> history = prompt;
  for (std::size_t x1 = 0; x1 < vocab; ++x1) {
    if (p1[x1] <= 0.0f) continue;
    model.cache().truncate(prompt.size());
    sd::token_id const t1 = static_cast<sd::token_id>(x1);
    sd::position_t const pos = static_cast<sd::position_t>(prompt.size());
    model.forward({.tokens = std::span<sd::token_id const>(&t1, 1),
                   .positions = std::span<sd::position_t const>(&pos, 1)},
                  out);
    history.resize(prompt.size());
    history.push_back(t1);
    policy.distribution(out.logits_view().row(0), history, p2);
    for (std::size_t x2 = 0; x2 < vocab; ++x2)
      if (p2[x2] > 0.0f)
        joint[{t1, static_cast<sd::token_id>(x2)}] =
            static_cast<double>(p1[x1]) * static_cast<double>(p2[x2]);
  }
  return joint;
}

// Chi-square quantile at upper tail 1e-4 (Wilson-Hilferty).
double chi2_threshold(double dof) {
  double const z = 3.719;  // standard normal quantile at 1 - 1e-4
  double const a = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Compares counts of (x1, x2) with the exact joint; also the marginal of x1.
void check_counts(std::map<pair_key, std::size_t> const& counts,
                  std::map<pair_key, double> const& joint, std::size_t n, std::string const& what) {
  CAPTURE(what);
  for (auto const& entry : counts) {
    auto const it = joint.find(entry.first);
    INFO("emitted (" << entry.first.first << ", " << entry.first.second << ") " << entry.second
                     << " times");
    CHECK((it != joint.end() && it->second > 0.0));
  }
  auto chi2 = [&](auto const& observed, auto const& expected_prob) {
    double stat = 0.0, pooled_obs = 0.0, pooled_exp = 0.0;
    std::size_t cells = 0;
    for (auto const& [key, p] : expected_prob) {
      double const e = p * static_cast<double>(n);
      auto const it = observed.find(key);
      double const o = it == observed.end() ? 0.0 : static_cast<double>(it->second);
      if (e < 5.0) {
        pooled_obs += o;
        pooled_exp += e;
        continue;
      }
      stat += (o - e) * (o - e) / e;
      ++cells;
    }
    if (pooled_exp > 0.0) {
      stat += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
      ++cells;
    }
    return std::pair<double, std::size_t>(stat, cells);
  };
  auto const joint_result = chi2(counts, joint);
  double const stat2 = joint_result.first;
  std::size_t const cells2 = joint_result.second;
  REQUIRE(cells2 >= 2);
  double const limit2 = chi2_threshold(static_cast<double>(cells2 - 1));
  INFO("joint of (x1, x2): chi2 = " << stat2 << " over " << cells2 << " cells, limit " << limit2);
  CHECK(stat2 < limit2);

  std::map<sd::token_id, std::size_t> c1;
  std::map<sd::token_id, double> p1;
  for (auto const& [key, c] : counts) c1[key.first] += c;
  for (auto const& [key, p] : joint) p1[key.first] += p;
  auto const marginal_result = chi2(c1, p1);
  double const stat1 = marginal_result.first;
  std::size_t const cells1 = marginal_result.second;
  if (cells1 >= 2) {
    double const limit1 = chi2_threshold(static_cast<double>(cells1 - 1));
    INFO("marginal of x1: chi2 = " << stat1 << " over " << cells1 << " cells, limit " << limit1);
    CHECK(stat1 < limit1);
  }
}

// Runs `trials` two-token requests with seeds 1.. and counts (x1, x2).
template <class Decoder>
std::map<pair_key, std::size_t> sample_pairs(Decoder& dec, std::vector<sd::token_id> const& prompt,
                                             sd::request_stats* total = nullptr) {
  std::map<pair_key, std::size_t> counts;
  sd::decode_result r;
  for (std::size_t i = 0; i < trials; ++i) {
    dec.config().seed = 1000 + i;
    dec.generate(prompt, r);
    REQUIRE(r.tokens.size() == 2);
    ++counts[{r.tokens[0], r.tokens[1]}];
    if (total != nullptr) {
      total->steps += r.stats.steps;
      total->drafted += r.stats.drafted;
      total->accepted += r.stats.accepted;
    }
  }
  return counts;
}

sd::decode_config two_tokens() {
  sd::decode_config c;
  c.max_new_tokens = 2;
  c.max_draft_nodes = 8;
  return c;
}

std::shared_ptr<sd::llama_weights const> random_draft() {
  sd::llama_config c;
  c.dim = 16;
  c.hidden_dim = 32;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.vocab_size = 512;
  c.seq_len = 512;
  return std::make_shared<sd::llama_weights const>(sd::make_random_llama(c, 11, 0.5f));
}

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
    sd::cpu_llama draft(random_draft(), one_thread());
    sd::draft_model_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample> p(
        draft, target, target_policy(), {.k = 3});
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, target_policy(),
                                two_tokens());
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "random draft, sampled");
    CHECK(s.drafted > 0);
  }
  SUBCASE("layer skip (a good draft), sampled drafts, speculative sampling") {
    sd::layer_skip_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample> p(
        {.skip_layers = {2}, .draft = {.k = 3}}, target_policy(), weights, one_thread());
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, target_policy(),
                                two_tokens());
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "layer skip, sampled");
    CHECK(s.accepted > s.drafted / 4);  // acceptance must be substantial for the test to bite
  }
  SUBCASE("layer skip, sampled drafts, tree verifier") {
    sd::layer_skip_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample> p(
        {.skip_layers = {3}, .draft = {.k = 2}}, target_policy(), weights, one_thread());
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, target_policy(), two_tokens());
    check_counts(sample_pairs(dec, prompt), joint, trials, "layer skip, sampled, tree verifier");
  }
  SUBCASE("layer skip, greedy drafts (point masses), tree verifier") {
    sd::layer_skip_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::greedy> p(
        {.skip_layers = {2}, .draft = {.k = 3}}, target_policy(), weights, one_thread());
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, target_policy(), two_tokens());
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "greedy drafts, tree verifier");
    CHECK(s.accepted > 0);
  }
  SUBCASE("trained draft model, sampled drafts, speculative sampling") {
    sd::cpu_llama draft(
        std::make_shared<sd::llama_weights const>(sd::load_model(fixture::draft_model_path())),
        one_thread());
    sd::draft_model_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample> p(
        draft, target, target_policy(), {.k = 3});
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, target_policy(),
                                two_tokens());
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "trained draft, sampled");
    CHECK(s.accepted > s.drafted / 10);  // about 17% after this prompt: acceptance does occur
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
