// The decode loop does not allocate per step: once a decoder has served one request, a request of
// 160 tokens performs exactly as many heap allocations as one of 40 tokens (any allocation left is
// per request, not per step). Counts every global operator new of this test executable
// (support/allocation_counter.hpp).
#include "support/doctest.hpp"

#include <vector>

#include "specdec/backend/cpu/eagle.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/allocation_counter.hpp"
#include "support/eagle.hpp"
#include "support/fixture.hpp"
#include "support/toy_model.hpp"

namespace sd = specdec;

namespace {

// Allocations of one request of `tokens` tokens, after a warm-up request.
template <class Decoder>
std::size_t allocations_of(Decoder& dec, std::size_t tokens, sd::decode_result& out) {
  std::vector<sd::token_id> const prompt{1, 5, 9, 5, 9, 2};
  dec.config().max_new_tokens = 200;
  dec.generate(prompt, out);  // warm-up: buffers reach their working sizes
  dec.config().max_new_tokens = tokens;
  std::size_t const before = test_support::allocations();
  dec.generate(prompt, out);
  std::size_t const count = test_support::allocations() - before;
  REQUIRE(out.tokens.size() == tokens);
  return count;
}

sd::sampler temperature_one() {
  sd::sampling_params params;
  params.temperature = 1.0f;
  params.top_p = 0.9f;
  return sd::sampler(params);
}

}  // namespace

TEST_CASE("no allocation per step") {
  constexpr std::size_t vocab = 24;
  toy::toy_lm target(vocab, 600);
  toy::toy_lm draft(vocab, 600, 7, 6.0f, 0.6f);
  sd::decode_result out;

  SUBCASE("autoregressive") {
    sd::autoregressive_decoder dec(target, temperature_one());
    CHECK(allocations_of(dec, 160, out) == allocations_of(dec, 40, out));
  }
  SUBCASE("prompt lookup, tree verifier") {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 4, .max_branches = 2});
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, temperature_one());
    CHECK(allocations_of(dec, 160, out) == allocations_of(dec, 40, out));
  }
  SUBCASE("draft model, sampled drafts, speculative sampling") {
    sd::draft_model_proposer<toy::toy_lm, sd::sampler, sd::draft_mode::sample> p(
        draft, target, temperature_one(), {.k = 4, .adaptive = true, .k_min = 1, .k_max = 6});
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, temperature_one());
    CHECK(allocations_of(dec, 160, out) == allocations_of(dec, 40, out));
  }
  SUBCASE("layer skip, greedy") {
    sd::layer_skip_proposer<sd::greedy> p({.skip_layers = {1}}, sd::greedy{});
    sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{});
    CHECK(allocations_of(dec, 160, out) == allocations_of(dec, 40, out));
  }
}

TEST_CASE("no allocation per step: EAGLE-3 on the CPU backend") {
  // The fixture target and a random EAGLE-3 head: the head's cache, its scratch and the
  // proposer's buffers reach their sizes in the warm-up request.
  auto const weights = fixture::stories260k();
  sd::cpu_llama target(weights, {.threads = 1});
  sd::cpu_eagle_head head(
      test_support::random_eagle(sd::eagle_version::eagle3, weights, 8, 4, 300, {1, 3, 5}, 3));
  sd::eagle_proposer p(head, sd::eagle_tree_config{.depth = 4, .top_k = 4, .nodes = 12});
  sd::speculative_decoder dec(target, p, sd::tree_verifier{}, temperature_one());
  sd::decode_result out;
  CHECK(allocations_of(dec, 160, out) == allocations_of(dec, 40, out));
}
