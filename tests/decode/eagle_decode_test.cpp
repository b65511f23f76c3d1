// EAGLE end to end on the stories260K fixture with the heads trained for it (tools/eagle): greedy
// output token-identical to greedy autoregressive decoding on every prompt of
// tinystories_prompts.jsonl (128 new tokens; EAGLE-1 and EAGLE-3 heads, dynamic EAGLE-2 trees and a
// static tree, the greedy and tree verifiers), the mean accepted length per target forward against
// the bars (EAGLE-2 >= 3.0 with <= 32 nodes, above the trained draft model at k = 4 and the Medusa
// heads measured in the same run; EAGLE-3 >= EAGLE-2), and under temperature 1 / top-p 0.9 the
// joint distribution of the first two tokens against the exact one (the chi-square check of
// sampling_check.hpp). Random heads check the same identity where acceptance is low.
#include "support/doctest.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "decode/sampling_check.hpp"
#include "specdec/backend/cpu/eagle.hpp"
#include "specdec/backend/cpu/heads.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/propose/medusa.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/eagle.hpp"
#include "support/fixture.hpp"
#include "support/heads.hpp"

namespace sd = specdec;

namespace {

using cpu_eagle = sd::eagle_proposer<sd::cpu_eagle_head>;

// The EAGLE-2 tree the fixture's numbers are measured with: depth 8, top-6 expansions, 32 nodes
// (the training run's best of its grid, tools/eagle/README.md).
constexpr sd::eagle_tree_config fixture_tree{.depth = 8, .top_k = 6, .nodes = 32};

// The greedy continuations (128 tokens) of every fixture prompt.
std::vector<std::vector<sd::token_id>> const& greedy_outputs() {
  static std::vector<std::vector<sd::token_id>> const out = [] {
    sd::cpu_llama target(fixture::stories260k(), {.threads = 1});
    sd::decode_config config;
    config.max_new_tokens = 128;
    sd::autoregressive_decoder ar(target, sd::greedy{}, config);
    std::vector<std::vector<sd::token_id>> o;
    for (auto const& p : fixture::encoded_prompts()) o.push_back(ar.generate(p).tokens);
    return o;
  }();
  return out;
}

// Greedy decoding of every prompt (the first `count`) with `proposer` and `verifier`: the tokens
// must equal the baseline's; returns the summed statistics.
template <class Proposer, class Verifier>
sd::request_stats greedy_on_every_prompt(Proposer& proposer, Verifier verifier,
                                         std::size_t count = 14) {
  sd::cpu_llama target(fixture::stories260k(), {.threads = 1});
  auto prompts = fixture::encoded_prompts();
  prompts.resize(std::min(prompts.size(), count));
  sd::decode_config config;
  config.max_new_tokens = 128;
  sd::speculative_decoder dec(target, proposer, std::move(verifier), sd::greedy{}, config);
  sd::request_stats total;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    CAPTURE(i);
    auto const r = dec.generate(prompts[i]);
    CHECK(r.tokens == greedy_outputs()[i]);
    total.steps += r.stats.steps;
    total.drafted += r.stats.drafted;
    total.accepted += r.stats.accepted;
    total.max_tree_size = std::max(total.max_tree_size, r.stats.max_tree_size);
  }
  return total;
}

}  // namespace

TEST_CASE("eagle: random heads, greedy == greedy autoregressive (rejections most steps)") {
  auto const target = fixture::stories260k();
  for (auto version : {sd::eagle_version::eagle1, sd::eagle_version::eagle3}) {
    CAPTURE(static_cast<int>(version));
    auto const head = test_support::random_eagle(version, target, 8, 4, 300, {1, 3, 5}, 7);
    sd::cpu_eagle_head runner(head);
    cpu_eagle dynamic(runner, sd::eagle_tree_config{.depth = 4, .top_k = 4, .nodes = 12});
    sd::request_stats const s = greedy_on_every_prompt(dynamic, sd::greedy_verifier{}, 3);
    CHECK(s.max_tree_size <= 12);
    cpu_eagle chain(runner, sd::sparse_tree::chain(3));
    (void)greedy_on_every_prompt(chain, sd::tree_verifier{}, 2);
  }
}

TEST_CASE("eagle: trained heads, greedy == greedy autoregressive, and the acceptance bars") {
  sd::cpu_eagle_head e1(test_support::fixture_eagle1());
  sd::cpu_eagle_head e3(test_support::fixture_eagle3());
  cpu_eagle eagle2(e1, fixture_tree);
  cpu_eagle eagle3(e3, fixture_tree);
  sd::request_stats const a = greedy_on_every_prompt(eagle2, sd::greedy_verifier{});
  sd::request_stats const b = greedy_on_every_prompt(eagle3, sd::greedy_verifier{});
  // The same tokens through the tree verifier's greedy path, and with EAGLE-1's static tree.
  sd::request_stats const at = greedy_on_every_prompt(eagle2, sd::tree_verifier{});
  CHECK(at.steps == a.steps);
  cpu_eagle eagle1_static(e1, test_support::fixture_tree("medusa"));
  sd::request_stats const st = greedy_on_every_prompt(eagle1_static, sd::greedy_verifier{});

  // The yardsticks in the same run: the trained draft model (k = 4) and the Medusa heads.
  sd::cpu_llama draft(fixture::trained_draft(), {.threads = 1});
  sd::draft_model_proposer dm(draft, fixture::stories260k()->config.vocab_size, sd::greedy{},
                              {.k = 4});
  sd::request_stats const d = greedy_on_every_prompt(dm, sd::greedy_verifier{});
  sd::cpu_medusa_heads medusa_heads(test_support::fixture_medusa());
  sd::medusa_proposer medusa(medusa_heads, test_support::fixture_tree("medusa"));
  sd::request_stats const m = greedy_on_every_prompt(medusa, sd::greedy_verifier{});

  CHECK(a.max_tree_size <= 32);
  CHECK(b.max_tree_size <= 32);
  MESSAGE(
      "mean accepted length per target forward, 14 prompts x 128 tokens, greedy: EAGLE-2 "
      "(EAGLE-1 head, dynamic tree of 32) "
      << a.mean_accepted_length() << " (" << a.steps << " steps), EAGLE-3 "
      << b.mean_accepted_length() << " (" << b.steps << " steps), EAGLE-1 static tree "
      << st.mean_accepted_length() << ", draft model k = 4 " << d.mean_accepted_length()
      << ", Medusa 32 nodes " << m.mean_accepted_length());
  CHECK(a.mean_accepted_length() >= 3.0);
  CHECK(a.mean_accepted_length() > d.mean_accepted_length());
  CHECK(a.mean_accepted_length() > m.mean_accepted_length());
  CHECK(b.mean_accepted_length() >= a.mean_accepted_length());
}

TEST_CASE("eagle: sampled decoding matches autoregressive sampling (chi-square)") {
  using sampling_check::check_counts;
  using sampling_check::exact_joint;
  using sampling_check::sample_pairs;
  using sampling_check::target_policy;
  using sampling_check::trials;
  using sampling_check::two_tokens;
  auto const weights = fixture::stories260k();
  std::vector<sd::token_id> const prompt{1, 399};  // BOS + " very", as fixture_sampling_test
  static auto const joint = exact_joint(weights, prompt);
  sd::cpu_llama target(weights, {.threads = 1});

  SUBCASE("EAGLE-3 head, dynamic tree of depth 4, top-4, 16 nodes, tree verifier") {
    sd::cpu_eagle_head runner(test_support::fixture_eagle3());
    cpu_eagle p(runner, sd::eagle_tree_config{.depth = 4, .top_k = 4, .nodes = 16});
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, target_policy(), two_tokens(16));
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "eagle-3, 16 nodes");
    CHECK(s.accepted > 0);
  }
  SUBCASE("EAGLE-1 head, dynamic tree pruned to 6 nodes, tree verifier") {
    sd::cpu_eagle_head runner(test_support::fixture_eagle1());
    cpu_eagle p(runner, sd::eagle_tree_config{.depth = 3, .top_k = 3, .nodes = 6});
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, target_policy(), two_tokens(6));
    sd::request_stats s;
    check_counts(sample_pairs(dec, prompt, &s), joint, trials, "eagle-1, 6 nodes");
    CHECK(s.accepted > 0);
  }
}
