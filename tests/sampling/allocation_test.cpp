// The hot path does not allocate after warm-up: this executable replaces the global operator new
// with a counting one (support/allocation_counter.hpp) and compares its count around the measured
// region.
#include "support/doctest.hpp"

#include <cstddef>
#include <random>
#include <vector>

#include "rows.hpp"
#include "specdec/sampling/policy.hpp"
#include "support/allocation_counter.hpp"

TEST_CASE("distribution, greedy_token, sample and softmax do not allocate after warm-up") {
  namespace sd = specdec;
  std::mt19937_64 gen(12);
  std::vector<float> const logits =
      sampling_test::make_row(sampling_test::row_kind::peaked, 32000, gen);
  std::vector<sd::token_id> const history = sampling_test::make_history(32000, 512, gen);
  sd::sampling_params all;
  all.temperature = 0.8f;
  all.top_k = 50;
  all.top_p = 0.9f;
  all.min_p = 0.02f;
  all.repetition_penalty = 1.1f;
  all.frequency_penalty = 0.2f;
  all.presence_penalty = 0.3f;
  all.logit_bias = {{5, 1.0f}, {7, -2.0f}};
  sd::sampling_params top_p_only;
  top_p_only.top_p = 0.5f;
  sd::sampler const samplers[] = {sd::sampler(all), sd::sampler(top_p_only), sd::sampler({})};
  std::vector<float> probs(logits.size());
  sd::philox rng(1);
  auto const work = [&] {
    for (auto const& s : samplers) {
      s.distribution(logits, history, probs);
      (void)s.sample(probs, rng);
      (void)s.greedy_token(logits, history);
    }
    sd::softmax(logits, probs);
    (void)sd::argmax(logits);
  };
  // The counter sees allocations.
  std::size_t const before_probe = test_support::allocations();
  auto* probe = new std::vector<int>(3);
  std::size_t const probe_allocations = test_support::allocations() - before_probe;
  delete probe;
  CHECK(probe_allocations == 2);

  work();  // warm-up: per-thread scratch grows here
  std::size_t const before = test_support::allocations();
  for (int i = 0; i < 5; ++i) work();
  CHECK(test_support::allocations() - before == 0);
}
