// Greedy speculative decoding on the stories260K fixture is token-identical to greedy
// autoregressive decoding, for every proposer, and reproduces the MANIFEST's reference ids.
#include "support/doctest.hpp"

#include <algorithm>
#include <memory>
#include <vector>

#include "decode/one_thread.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/propose/sparse_kv.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

namespace {

using decode_test::one_thread;

// Runs greedy speculative decoding with `proposer` and checks it against `expected`.
template <class Proposer, class Verifier>
sd::request_stats check_greedy(sd::cpu_llama& target, Proposer& proposer, Verifier verifier,
                               std::vector<sd::token_id> const& prompt,
                               std::vector<sd::token_id> const& expected,
                               std::size_t max_draft_nodes = 16) {
  sd::decode_config config;
  config.max_new_tokens = expected.size();
  config.max_draft_nodes = max_draft_nodes;
  sd::speculative_decoder dec(target, proposer, std::move(verifier), sd::greedy{}, config);
  auto const r = dec.generate(prompt);
  CHECK(r.tokens == expected);
  CHECK(r.reason == sd::finish_reason::max_tokens);
  return r.stats;
}

}  // namespace

TEST_CASE("fixture: greedy decoding reproduces the reference ids with every proposer") {
  auto const weights = fixture::stories260k();
  std::vector<sd::token_id> const prompt = fixture::once_upon_a_time();
  std::vector<sd::token_id> const expected = fixture::reference_continuation();  // 252 tokens

  sd::cpu_llama target(weights, one_thread());
  sd::decode_config config;
  config.max_new_tokens = expected.size();
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);
  auto const baseline = ar.generate(prompt);
  CHECK(baseline.tokens == expected);

  SUBCASE("prompt lookup, chain") {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 6});
    auto const s = check_greedy(target, p, sd::greedy_verifier{}, prompt, expected);
    CHECK(s.accepted > 0);
  }
  SUBCASE("prompt lookup, tree") {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 5, .max_branches = 4});
    auto const s = check_greedy(target, p, sd::greedy_verifier{}, prompt, expected, 20);
    CHECK(s.accepted > 0);
  }
  SUBCASE("prompt lookup, tree, tree verifier") {
    sd::prompt_lookup_proposer p({.n_max = 2, .n_min = 1, .k = 4, .max_branches = 3});
    check_greedy(target, p, sd::tree_verifier{}, prompt, expected);
  }
  SUBCASE("draft model (trained)") {
    sd::cpu_llama draft(fixture::trained_draft(), one_thread());
    sd::draft_model_proposer p(draft, target, sd::greedy{}, {.k = 4});
    check_greedy(target, p, sd::greedy_verifier{}, prompt, expected);
  }
  SUBCASE("draft model, random weights, adaptive k") {
    sd::cpu_llama draft(fixture::random_draft(), one_thread());
    sd::draft_model_proposer p(draft, target, sd::greedy{},
                               {.k = 3, .adaptive = true, .k_min = 1, .k_max = 6});
    check_greedy(target, p, sd::greedy_verifier{}, prompt, expected);
  }
  SUBCASE("layer skip") {
    for (auto const& skip : std::vector<std::vector<std::int32_t>>{{1}, {2, 3}, {3}}) {
      sd::layer_skip_proposer<sd::greedy> p({.skip_layers = skip}, sd::greedy{});
      auto const s = check_greedy(target, p, sd::greedy_verifier{}, prompt, expected);
      CHECK(s.accepted > 0);
    }
  }
  SUBCASE("sparse KV: the target over a view of its cache") {
    // A budget over the whole context makes the draft the target: every draft is accepted.
    sd::sparse_kv_proposer<sd::greedy> whole({.sinks = 4, .budget = 1024}, sd::greedy{});
    auto const all = check_greedy(target, whole, sd::greedy_verifier{}, prompt, expected);
    CHECK(all.drafted > 0);
    CHECK(all.accepted == all.drafted);
    // A small view (4 sinks and the last 28 positions) drafts something else some of the time.
    sd::sparse_kv_proposer<sd::greedy> small({.sinks = 4, .budget = 32}, sd::greedy{});
    auto const s = check_greedy(target, small, sd::greedy_verifier{}, prompt, expected);
    CHECK(s.accepted > s.drafted / 4);
    CHECK(s.accepted < s.drafted);
  }
  SUBCASE("sparse KV: SnapKV and retrieval views selected from a long prompt") {
    // The first 100 reference tokens join the prompt, so that the view is selected from it (per
    // layer and kv head); the 152 generated tokens roll the window far past the budget.
    std::vector<sd::token_id> long_prompt = prompt;
    long_prompt.insert(long_prompt.end(), expected.begin(), expected.begin() + 100);
    std::vector<sd::token_id> const rest(expected.begin() + 100, expected.end());
    for (sd::kv_policy const policy : {sd::kv_policy::snapkv, sd::kv_policy::retrieval}) {
      CAPTURE(static_cast<int>(policy));
      sd::sparse_kv_proposer<sd::greedy> small({.policy = policy, .budget = 48, .window = 16},
                                               sd::greedy{});
      auto const s = check_greedy(target, small, sd::greedy_verifier{}, long_prompt, rest);
      CHECK(s.accepted > s.drafted / 4);
      CHECK(s.accepted < s.drafted);
      // A selection of 32 positions per layer and kv head (5 x 4 of stories260K), lists that
      // differ between heads.
      sd::kv_view const view = small.view();
      CHECK(view.per_head == 32);
      REQUIRE(view.positions.size() == 5 * 4 * 32);
      CHECK(view.sinks == 0);
      CHECK(view.window == 16);
      std::size_t differ = 0;
      for (std::size_t i = 1; i < 20; ++i)
        differ += std::equal(view.positions.begin(), view.positions.begin() + 32,
                             view.positions.begin() + static_cast<std::ptrdiff_t>(32 * i))
                      ? 0
                      : 1;
      CHECK(differ > 0);
      // Whole: every draft accepted.
      sd::sparse_kv_proposer<sd::greedy> whole({.policy = policy, .budget = 1024, .window = 16},
                                               sd::greedy{});
      auto const all = check_greedy(target, whole, sd::greedy_verifier{}, long_prompt, rest);
      CHECK(all.accepted == all.drafted);
      CHECK(whole.view().positions.empty());
    }
  }
  SUBCASE("the fixture itself as a draft model (every draft accepted)") {
    sd::cpu_llama draft(weights, one_thread());
    sd::draft_model_proposer p(draft, target, sd::greedy{}, {.k = 5});
    auto const s = check_greedy(target, p, sd::greedy_verifier{}, prompt, expected);
    CHECK(s.accepted == s.drafted);
  }
}

TEST_CASE("fixture: greedy speculative == greedy autoregressive on every TinyStories prompt") {
  auto const weights = fixture::stories260k();
  auto const prompts = fixture::encoded_prompts();
  REQUIRE(fixture::tok512().encode("Once upon a time", true) == fixture::once_upon_a_time());
  sd::cpu_llama target(weights, one_thread());
  sd::cpu_llama draft(fixture::trained_draft(), one_thread());
  sd::cpu_llama random(fixture::random_draft(), one_thread());
  sd::decode_config config;
  config.max_new_tokens = 128;
  config.max_draft_nodes = 16;
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);

  sd::prompt_lookup_proposer lookup_chain({.n_max = 3, .n_min = 1, .k = 6});
  sd::prompt_lookup_proposer lookup_tree({.n_max = 3, .n_min = 1, .k = 4, .max_branches = 3});
  sd::draft_model_proposer drafted(draft, target, sd::greedy{}, {.k = 4});
  sd::draft_model_proposer adaptive(
      random, target, sd::greedy{},
      {.k = 2, .adaptive = true, .k_min = 1, .k_max = 5, .confidence_threshold = 0.05f});
  sd::layer_skip_proposer<sd::greedy> skip({.skip_layers = {2}}, sd::greedy{});
  sd::speculative_decoder d1(target, lookup_chain, sd::greedy_verifier{}, sd::greedy{}, config);
  sd::speculative_decoder d2(target, lookup_tree, sd::tree_verifier{}, sd::greedy{}, config);
  sd::speculative_decoder d3(target, drafted, sd::greedy_verifier{}, sd::greedy{}, config);
  sd::speculative_decoder d4(target, adaptive, sd::greedy_verifier{}, sd::greedy{}, config);
  sd::speculative_decoder d5(target, skip, sd::greedy_verifier{}, sd::greedy{}, config);

  sd::request_stats totals[5];
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    auto const reference = ar.generate(prompts[i]);
    REQUIRE(reference.tokens.size() == 128);
    auto const r1 = d1.generate(prompts[i]);
    auto const r2 = d2.generate(prompts[i]);
    auto const r3 = d3.generate(prompts[i]);
    auto const r4 = d4.generate(prompts[i]);
    auto const r5 = d5.generate(prompts[i]);
    CHECK(r1.tokens == reference.tokens);
    CHECK(r2.tokens == reference.tokens);
    CHECK(r3.tokens == reference.tokens);
    CHECK(r4.tokens == reference.tokens);
    CHECK(r5.tokens == reference.tokens);
    sd::decode_result const* rs[5] = {&r1, &r2, &r3, &r4, &r5};
    for (std::size_t k = 0; k < 5; ++k) {
      totals[k].steps += rs[k]->stats.steps;
      totals[k].drafted += rs[k]->stats.drafted;
      totals[k].accepted += rs[k]->stats.accepted;
    }
  }
  char const* names[5] = {"prompt lookup chain", "prompt lookup tree", "draft model",
                          "random draft, adaptive", "layer skip {2}"};
  CHECK(totals[0].accepted > 0);
  CHECK(totals[1].accepted > 0);
  CHECK(totals[2].acceptance_rate() > 0.2);  // the distilled draft agrees often with the target
  CHECK(totals[4].acceptance_rate() > 0.2);  // so does the target without layer 2
  for (std::size_t k = 0; k < 5; ++k)
    MESSAGE(std::string(names[k]) << ": " << totals[k].mean_accepted_length()
                                  << " tokens per step, " << totals[k].acceptance_rate()
                                  << " of drafts accepted");
}
