// Serving many requests. One `speculative_decoder` serves requests with their own seeds, policies
// and limits, each as a decoder built for it would. Every strategy served by `batch_decoder` as
// it is decoded alone: for Medusa, Hydra, EAGLE-1,
// EAGLE-3 (proposers that read the target's hidden rows), lookahead and Jacobi (auxiliary tokens)
// and layer-skip self-speculation, each request of a batch (more requests than slots, so they
// join and leave) emits exactly the tokens `speculative_decoder` emits for it alone on the
// stories260K fixture, greedy and sampled (each request with its own seed and policy). The rows
// of the CPU backend are the same bits whatever else is in the batch, and a request's draws come
// from its own Philox stream, so equality is exact.
#include "support/doctest.hpp"

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "decode/jobs.hpp"
#include "specdec/backend/cpu/batched_llama.hpp"
#include "specdec/backend/cpu/eagle.hpp"
#include "specdec/backend/cpu/heads.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/batch_decoder.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/propose/hydra.hpp"
#include "specdec/propose/jacobi.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/lookahead.hpp"
#include "specdec/propose/medusa.hpp"
#include "specdec/propose/per_request.hpp"
#include "specdec/propose/sparse_kv.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/eagle.hpp"
#include "support/fixture.hpp"
#include "support/heads.hpp"

namespace sd = specdec;

namespace {

using cpu_eagle = sd::eagle_proposer<sd::cpu_eagle_head>;
using owned_eagle = sd::owning_proposer<sd::cpu_eagle_head, cpu_eagle>;
using layer_skip = sd::layer_skip_proposer<sd::sampler>;
using sparse_kv = sd::sparse_kv_proposer<sd::sampler>;

static_assert(sd::batch_proposer<sd::per_request_proposer<owned_eagle>>);
static_assert(sd::needs_target_hidden_v<sd::per_request_proposer<owned_eagle>>);
static_assert(sd::has_auxiliary_tokens_v<sd::per_request_proposer<sd::lookahead_proposer>>);

using decode_test::job;
using decode_test::policy_of;

// Seven requests over the fixture prompts: greedy when `sampled` is false, else temperatures and
// top-p that differ per request, each with its own seed; lengths differ.
std::vector<job> jobs_of(bool sampled) {
  auto const prompts = fixture::encoded_prompts();
  std::vector<job> jobs;
  for (std::size_t i = 0; i < 7; ++i) {
    job j{prompts[(3 * i) % prompts.size()],
          sampled ? policy_of(0.6f + 0.1f * static_cast<float>(i % 4), i % 2 == 0 ? 1.0f : 0.9f)
                  : policy_of(0.0f),
          {}};
    j.config.max_new_tokens = 24 + 5 * (i % 4);
    j.config.seed = 1000 + i;
    j.config.eos_tokens = fixture::tok512().end_of_text();
    jobs.push_back(std::move(j));
  }
  return jobs;
}

// Decodes `jobs` alone (a proposer from `make` per request, `speculative_decoder`) and in one
// batch (`per_request_proposer` over the same factory, 3 slots) and checks every request's tokens
// and finish reason are the same.
template <class Proposer, class Make>
void check_batch_equals_alone(char const* name, Make make) {
  for (bool const sampled : {false, true}) {
    CAPTURE(name);
    CAPTURE(sampled);
    std::vector<job> const jobs = jobs_of(sampled);
    std::vector<sd::decode_result> want;
    for (job const& j : jobs) {
      sd::cpu_llama target(fixture::stories260k(), {.threads = 1});
      Proposer proposer = make();
      sd::speculative_decoder d(target, proposer, sd::tree_verifier{}, j.policy, j.config);
      want.push_back(d.generate(j.prompt));
    }
    sd::cpu_batched_llama target(fixture::stories260k(), {.model = {.threads = 1}, .max_slots = 3});
    sd::per_request_proposer<Proposer> proposers(make);
    sd::batch_decoder<sd::cpu_batched_llama, sd::per_request_proposer<Proposer>, sd::tree_verifier,
                      sd::sampler>
        decoder(target, proposers);
    std::vector<std::uint64_t> ids;
    for (job const& j : jobs) ids.push_back(decoder.submit(j.prompt, j.policy, j.config));
    decoder.run();
    CHECK(decoder.stats().max_batch == 3);
    std::size_t drafted = 0, accepted = 0;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      CAPTURE(i);
      std::optional<sd::batch_result> got = decoder.take(ids[i]);
      REQUIRE(got.has_value());
      REQUIRE_MESSAGE(!got->failed(), got->error);
      CHECK(got->result.tokens == want[i].tokens);
      CHECK(got->result.reason == want[i].reason);
      CHECK(got->result.stats.accepted == want[i].stats.accepted);
      drafted += got->result.stats.drafted;
      accepted += got->result.stats.accepted;
    }
    CHECK(drafted > 0);
    if (!sampled) CHECK(accepted > 0);  // the strategy speculates and is right sometimes
  }
}

}  // namespace

TEST_CASE("batch_decoder serves Medusa and Hydra heads as they decode alone") {
  sd::cpu_medusa_heads medusa_heads(test_support::fixture_medusa());
  sd::cpu_hydra_heads hydra_heads(test_support::fixture_hydra(), fixture::stories260k());
  sd::sparse_tree const medusa_tree = test_support::fixture_tree("medusa");
  sd::sparse_tree const hydra_tree = test_support::fixture_tree("hydra");
  using medusa = sd::medusa_proposer<sd::cpu_medusa_heads>;
  using hydra = sd::hydra_proposer<sd::cpu_hydra_heads>;
  check_batch_equals_alone<medusa>("medusa", [&] { return medusa(medusa_heads, medusa_tree); });
  check_batch_equals_alone<hydra>("hydra", [&] { return hydra(hydra_heads, hydra_tree); });
}

TEST_CASE("batch_decoder serves EAGLE-1 and EAGLE-3 heads as they decode alone") {
  constexpr sd::eagle_tree_config tree{.depth = 6, .top_k = 4, .nodes = 16};
  for (auto const* weights : {&test_support::fixture_eagle1(), &test_support::fixture_eagle3()}) {
    check_batch_equals_alone<owned_eagle>(
        weights == &test_support::fixture_eagle1() ? "eagle1" : "eagle3", [&] {
          return owned_eagle(std::make_unique<sd::cpu_eagle_head>(*weights),
                             [&](sd::cpu_eagle_head& h) { return cpu_eagle(h, tree); });
        });
  }
}

TEST_CASE("batch_decoder serves lookahead and Jacobi decoding as they decode alone") {
  check_batch_equals_alone<sd::lookahead_proposer>(
      "lookahead", [] { return sd::lookahead_proposer({.window = 5, .ngram = 4, .guesses = 5}); });
  check_batch_equals_alone<sd::jacobi_proposer>("jacobi",
                                                [] { return sd::jacobi_proposer({.block = 4}); });
}

TEST_CASE("batch_decoder serves layer-skip self-speculation as it decodes alone") {
  check_batch_equals_alone<layer_skip>("layer-skip", [] {
    return layer_skip(sd::layer_skip_config{.skip_layers = {2}}, policy_of(0.0f));
  });
}

TEST_CASE("batch_decoder serves sparse-KV self-speculation as it decodes alone") {
  check_batch_equals_alone<sparse_kv>("sparse-kv", [] {
    return sparse_kv(sd::sparse_kv_config{.sinks = 4, .budget = 24}, policy_of(0.0f));
  });
  // Views selected per layer and kv head from the prompts (10-16 tokens: 6 positions chosen of
  // those before a window of 2), each request its own.
  check_batch_equals_alone<sparse_kv>("sparse-kv, snapkv", [] {
    return sparse_kv(
        sd::sparse_kv_config{.policy = sd::kv_policy::snapkv, .budget = 8, .window = 2, .pool = 3},
        policy_of(0.0f));
  });
  check_batch_equals_alone<sparse_kv>("sparse-kv, retrieval", [] {
    return sparse_kv(
        sd::sparse_kv_config{
            .policy = sd::kv_policy::retrieval, .budget = 8, .window = 2, .chunk = 2},
        policy_of(0.0f));
  });
}

TEST_CASE("owning_proposer refuses a null runner") {
  CHECK_THROWS_WITH_AS(
      owned_eagle(nullptr,
                  [](sd::cpu_eagle_head& h) { return cpu_eagle(h, sd::eagle_tree_config{}); }),
      doctest::Contains("owning_proposer: null runner"), sd::error);
}

TEST_CASE("speculative_decoder: one decoder serves requests with their own settings") {
  sd::cpu_llama target(fixture::stories260k(), {.threads = 1});
  sd::lookahead_proposer proposer({.window = 4, .ngram = 3, .guesses = 4});
  sd::speculative_decoder shared(target, proposer, sd::tree_verifier{}, policy_of(0.0f));
  for (bool const sampled : {true, false}) {
    for (job const& j : jobs_of(sampled)) {
      CAPTURE(j.config.seed);
      sd::cpu_llama own_target(fixture::stories260k(), {.threads = 1});
      sd::lookahead_proposer own_proposer({.window = 4, .ngram = 3, .guesses = 4});
      sd::speculative_decoder own(own_target, own_proposer, sd::tree_verifier{}, j.policy,
                                  j.config);
      sd::decode_result const want = own.generate(j.prompt);
      sd::decode_result got;
      std::vector<sd::token_id> streamed;
      shared.generate(j.prompt, j.config, j.policy, got, [&](sd::token_id t) {
        streamed.push_back(t);
        return true;
      });
      CHECK(got.tokens == want.tokens);
      CHECK(streamed == want.tokens);
      CHECK(got.reason == want.reason);
    }
  }
  sd::decode_config bad;
  bad.eos_tokens = {100000};
  sd::decode_result out;
  CHECK_THROWS_WITH_AS(shared.generate(fixture::encoded_prompts()[0], bad, policy_of(0.0f), out),
                       doctest::Contains("eos_tokens[0]"), sd::error);
}
