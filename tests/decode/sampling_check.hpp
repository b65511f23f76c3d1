#pragma once
// The statistical check of the fixture sampling tests (fixture_sampling_test.cpp,
// rest_decode_test.cpp, lookahead_decode_test.cpp): many two-token requests with distinct seeds,
// and a chi-square test of the observed (x1, x2) counts (and of the x1 marginal) against the exact
// joint distribution computed from the model under the policy (temperature 1, top-p 0.9).
// Threshold: the chi-square quantile at p = 1e-4 for the degrees of freedom (Wilson-Hilferty);
// cells with an expected count below 5 are pooled; a pair of probability 0 must never be emitted.
#include "support/doctest.hpp"

#include <cmath>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/stats.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/sampling/policy.hpp"

namespace sampling_check {

namespace sd = specdec;

// Requests per configuration (fewer under AddressSanitizer; the threshold holds for any count).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr std::size_t trials = 600;
#else
inline constexpr std::size_t trials = 1500;
#endif

// Temperature 1, top-p 0.9.
inline sd::sampler target_policy() {
  sd::sampling_params params;
  params.temperature = 1.0f;
  params.top_p = 0.9f;
  return sd::sampler(params);
}

// Two new tokens, a draft budget of `max_draft_nodes`.
inline sd::decode_config two_tokens(std::size_t max_draft_nodes = 8) {
  sd::decode_config c;
  c.max_new_tokens = 2;
  c.max_draft_nodes = max_draft_nodes;
  return c;
}

using pair_key = std::pair<sd::token_id, sd::token_id>;

// The exact joint distribution of the first two tokens after `prompt` under `policy` (bound to the
// prompt as the decoders bind it: `policy_for_prompt`).
template <class Policy>
std::map<pair_key, double> exact_joint(std::shared_ptr<sd::llama_weights const> const& weights,
                                       std::vector<sd::token_id> const& prompt,
                                       Policy const& unbound) {
  sd::cpu_llama model(weights, {.threads = 1});
  auto&& policy = sd::policy_for_prompt(unbound, prompt.size());
  std::size_t const vocab = model.vocab_size();
  std::vector<sd::position_t> positions(prompt.size());
  for (std::size_t i = 0; i < prompt.size(); ++i) positions[i] = static_cast<sd::position_t>(i);
  sd::forward_result out;
  model.forward({.tokens = prompt, .positions = positions}, out);
  std::vector<float> p1(vocab), p2(vocab);
  policy.distribution(out.logits_view().row(prompt.size() - 1), sd::token_history(prompt), p1);
  std::map<pair_key, double> joint;
  std::vector<sd::token_id> history = prompt;
  for (std::size_t x1 = 0; x1 < vocab; ++x1) {
    if (p1[x1] <= 0.0f) continue;
    model.cache().truncate(prompt.size());
    auto const t1 = static_cast<sd::token_id>(x1);
    auto const pos = static_cast<sd::position_t>(prompt.size());
    model.forward({.tokens = std::span<sd::token_id const>(&t1, 1),
                   .positions = std::span<sd::position_t const>(&pos, 1)},
                  out);
    history.resize(prompt.size());
    history.push_back(t1);
    policy.distribution(out.logits_view().row(0), sd::token_history(history), p2);
    for (std::size_t x2 = 0; x2 < vocab; ++x2)
      if (p2[x2] > 0.0f)
        joint[{t1, static_cast<sd::token_id>(x2)}] =
            static_cast<double>(p1[x1]) * static_cast<double>(p2[x2]);
  }
  return joint;
}

// The same under `target_policy()`.
inline std::map<pair_key, double> exact_joint(
    std::shared_ptr<sd::llama_weights const> const& weights,
    std::vector<sd::token_id> const& prompt) {
  return exact_joint(weights, prompt, target_policy());
}

// Chi-square quantile at upper tail 1e-4 (Wilson-Hilferty).
inline double chi2_threshold(double dof) {
  double const z = 3.719;  // standard normal quantile at 1 - 1e-4
  double const a = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// The chi-square statistic of `observed` counts against `expected_prob` over `n` draws, with
// cells below an expected count of 5 pooled; returns (statistic, cells).
template <class Key>
std::pair<double, std::size_t> chi2(std::map<Key, std::size_t> const& observed,
                                    std::map<Key, double> const& expected_prob, std::size_t n) {
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
  return {stat, cells};
}

// Compares counts of (x1, x2) with the exact joint, and the x1 marginal with its own.
inline void check_counts(std::map<pair_key, std::size_t> const& counts,
                         std::map<pair_key, double> const& joint, std::size_t n,
                         std::string const& what) {
  CAPTURE(what);
  for (auto const& entry : counts) {
    pair_key const& key = entry.first;
    auto const it = joint.find(key);
    INFO("emitted (" << key.first << ", " << key.second << ") " << entry.second << " times");
    CHECK((it != joint.end() && it->second > 0.0));
  }
  auto const joint_fit = chi2(counts, joint, n);
  double const stat2 = joint_fit.first;
  std::size_t const cells2 = joint_fit.second;
  REQUIRE(cells2 >= 2);
  double const limit2 = chi2_threshold(static_cast<double>(cells2 - 1));
  INFO("joint of (x1, x2): chi2 = " << stat2 << " over " << cells2 << " cells, limit " << limit2);
  CHECK(stat2 < limit2);

  std::map<sd::token_id, std::size_t> c1;
  std::map<sd::token_id, double> p1;
  for (auto const& [key, c] : counts) c1[key.first] += c;
  for (auto const& [key, p] : joint) p1[key.first] += p;
  auto const marginal_fit = chi2(c1, p1, n);
  double const stat1 = marginal_fit.first;
  std::size_t const cells1 = marginal_fit.second;
  if (cells1 >= 2) {
    double const limit1 = chi2_threshold(static_cast<double>(cells1 - 1));
    INFO("marginal of x1: chi2 = " << stat1 << " over " << cells1 << " cells, limit " << limit1);
    CHECK(stat1 < limit1);
  }
}

// Runs `trials` two-token requests with seeds 1000.. and counts (x1, x2); sums the statistics
// into `total` when given.
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
      total->aux_tokens += r.stats.aux_tokens;
    }
  }
  return counts;
}

}  // namespace sampling_check
