// Block drafting end to end on the stories260K fixture with the drafters trained for it
// (tools/block): greedy output token-identical to greedy autoregressive decoding on every prompt
// of tinystories_prompts.jsonl (128 new tokens; DFlash, DSpark, DSpark with its confidence
// cutoff, DDTree's trees), the tokens per target forward against EAGLE-3's chain of the same
// length and its dynamic tree measured in the same run (greedy and at temperature 1), and under
// temperature 1 / top-p 0.9 the joint distribution of the first two tokens against the exact one
// (sampling_check.hpp), for chains and trees.
#include "support/doctest.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "decode/sampling_check.hpp"
#include "specdec/backend/cpu/block_drafter.hpp"
#include "specdec/backend/cpu/eagle.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/block.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/block.hpp"
#include "support/eagle.hpp"
#include "support/fixture.hpp"

namespace block_decode_test {

namespace sd = specdec;

// The greedy continuations (128 tokens) of every fixture prompt.
inline std::vector<std::vector<sd::token_id>> const& greedy_outputs() {
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

// Every prompt decoded with `proposer` and `verifier` under `policy` (128 new tokens; `seeds`
// runs of each, seeds 1 + seeds i + j for prompt i); under greedy the tokens must equal the
// baseline's. Returns the summed statistics.
template <class Proposer, class Verifier, class Policy>
sd::request_stats on_every_prompt(Proposer& proposer, Verifier verifier, Policy policy,
                                  std::size_t seeds = 1) {
  sd::cpu_llama target(fixture::stories260k(), {.threads = 1});
  auto const prompts = fixture::encoded_prompts();
  sd::decode_config config;
  config.max_new_tokens = 128;
  sd::speculative_decoder dec(target, proposer, std::move(verifier), std::move(policy), config);
  sd::request_stats total;
  for (std::size_t i = 0; i < prompts.size(); ++i)
    for (std::size_t j = 0; j < seeds; ++j) {
      CAPTURE(i);
      dec.config().seed = 1 + seeds * i + j;
      auto const r = dec.generate(prompts[i]);
      if constexpr (std::is_same_v<Policy, sd::greedy>) CHECK(r.tokens == greedy_outputs()[i]);
      total.steps += r.stats.steps;
      total.drafted += r.stats.drafted;
      total.accepted += r.stats.accepted;
      total.max_tree_size = std::max(total.max_tree_size, r.stats.max_tree_size);
    }
  return total;
}

inline sd::sampler block_temperature_one() {
  sd::sampling_params params;
  params.temperature = 1.0f;
  return sd::sampler(params);
}

}  // namespace block_decode_test

TEST_CASE("block drafting: greedy == greedy autoregressive; tokens per forward vs EAGLE-3") {
  using namespace block_decode_test;
  sd::cpu_block_drafter dflash(test_support::fixture_dflash());
  sd::cpu_block_drafter dspark(test_support::fixture_dspark());
  sd::block_proposer<sd::cpu_block_drafter, sd::greedy> pf(dflash, sd::greedy{});
  sd::block_proposer<sd::cpu_block_drafter, sd::greedy> ps(dspark, sd::greedy{});
  sd::block_proposer<sd::cpu_block_drafter, sd::greedy> pc(dspark, sd::greedy{},
                                                           {.confidence_threshold = 0.3f});
  sd::request_stats const f = on_every_prompt(pf, sd::greedy_verifier{}, sd::greedy{});
  sd::request_stats const s = on_every_prompt(ps, sd::greedy_verifier{}, sd::greedy{});
  sd::request_stats const c = on_every_prompt(pc, sd::greedy_verifier{}, sd::greedy{});
  sd::cpu_eagle_head e3(test_support::fixture_eagle3());
  sd::eagle_proposer<sd::cpu_eagle_head> chain(
      e3, sd::eagle_tree_config{.depth = 7, .top_k = 1, .nodes = 7});
  sd::request_stats const e = on_every_prompt(chain, sd::greedy_verifier{}, sd::greedy{});
  CHECK(f.max_tree_size <= 8);
  CHECK(c.drafted < s.drafted);  // the cutoff drafts less
  MESSAGE("greedy, 14 prompts x 128 tokens, chains of 7, tokens per target forward: DFlash "
          << f.mean_accepted_length() << ", DSpark " << s.mean_accepted_length()
          << ", DSpark with cutoff 0.3 " << c.mean_accepted_length() << " (" << c.drafted
          << " drafted against " << s.drafted << "), EAGLE-3 chain " << e.mean_accepted_length());
  CHECK(f.mean_accepted_length() > 1.5);
  CHECK(s.mean_accepted_length() > f.mean_accepted_length());
}

TEST_CASE("block drafting: DDTree trees, greedy == greedy autoregressive, vs EAGLE-3's tree") {
  using namespace block_decode_test;
  using tree_block = sd::block_proposer<sd::cpu_block_drafter, sd::greedy, sd::draft_mode::greedy,
                                        sd::block_shape::tree>;
  sd::cpu_block_drafter dflash(test_support::fixture_dflash());
  sd::cpu_block_drafter dspark(test_support::fixture_dspark());
  tree_block tf(dflash, sd::greedy{}, {.nodes = 32});
  tree_block ts(dspark, sd::greedy{}, {.nodes = 32});
  sd::request_stats const f = on_every_prompt(tf, sd::greedy_verifier{}, sd::greedy{});
  sd::request_stats const s = on_every_prompt(ts, sd::greedy_verifier{}, sd::greedy{});
  sd::request_stats const st = on_every_prompt(ts, sd::tree_verifier{}, sd::greedy{});
  CHECK(st.steps == s.steps);
  sd::cpu_eagle_head e3(test_support::fixture_eagle3());
  sd::eagle_proposer<sd::cpu_eagle_head> eagle(
      e3, sd::eagle_tree_config{.depth = 8, .top_k = 6, .nodes = 32});
  sd::request_stats const e = on_every_prompt(eagle, sd::greedy_verifier{}, sd::greedy{});
  CHECK(f.max_tree_size <= 33);
  CHECK(s.max_tree_size <= 33);
  MESSAGE(
      "greedy, 14 prompts x 128 tokens, trees of 32 nodes, tokens per target forward: DDTree "
      "over DFlash "
      << f.mean_accepted_length() << ", over DSpark " << s.mean_accepted_length()
      << ", EAGLE-3's dynamic tree (depth 8, top-6) " << e.mean_accepted_length());
  CHECK(s.mean_accepted_length() > f.mean_accepted_length());
}

TEST_CASE("block drafting: temperature 1, tokens per forward vs EAGLE-3's chain") {
  using namespace block_decode_test;
  sd::cpu_block_drafter dflash(test_support::fixture_dflash());
  sd::cpu_block_drafter dspark(test_support::fixture_dspark());
  using sampled = sd::block_proposer<sd::cpu_block_drafter, sd::sampler, sd::draft_mode::sample>;
  sampled pf(dflash, block_temperature_one());
  sampled ps(dspark, block_temperature_one());
  constexpr std::size_t seeds = 8;  // the sampled runs' spread is then a few percent
  sd::request_stats const f =
      on_every_prompt(pf, sd::speculative_sampling_verifier{}, block_temperature_one(), seeds);
  sd::request_stats const s =
      on_every_prompt(ps, sd::speculative_sampling_verifier{}, block_temperature_one(), seeds);
  sd::cpu_eagle_head e3(test_support::fixture_eagle3());
  sd::eagle_proposer<sd::cpu_eagle_head> chain(
      e3, sd::eagle_tree_config{.depth = 7, .top_k = 1, .nodes = 7});
  sd::request_stats const e =
      on_every_prompt(chain, sd::tree_verifier{}, block_temperature_one(), seeds);
  MESSAGE(
      "temperature 1, 14 prompts x 8 seeds x 128 tokens, chains of 7, tokens per target forward: "
      "DFlash "
      << f.mean_accepted_length() << ", DSpark " << s.mean_accepted_length() << ", EAGLE-3 chain "
      << e.mean_accepted_length());
  CHECK(f.mean_accepted_length() > 1.2);
  CHECK(s.mean_accepted_length() > f.mean_accepted_length());
}

TEST_CASE("block drafting: sampled decoding matches autoregressive sampling (chi-square)") {
  using namespace block_decode_test;
  using sampling_check::check_counts;
  using sampling_check::exact_joint;
  using sampling_check::sample_pairs;
  using sampling_check::target_policy;
  using sampling_check::trials;
  using sampling_check::two_tokens;
  auto const weights = fixture::stories260k();
  std::vector<sd::token_id> const prompt{1, 399};  // BOS + " very", as fixture_sampling_test
  static auto const joint = exact_joint(weights, prompt, target_policy());
  sd::cpu_llama target(weights, {.threads = 1});
  using sampled = sd::block_proposer<sd::cpu_block_drafter, sd::sampler, sd::draft_mode::sample>;
  for (char const* kind : {"dflash", "dspark"}) {
    CAPTURE(kind);
    sd::cpu_block_drafter runner(std::string(kind) == "dflash" ? test_support::fixture_dflash()
                                                               : test_support::fixture_dspark());
    sampled p(runner, target_policy());
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, target_policy(),
                                two_tokens(7));
    sd::request_stats st;
    check_counts(sample_pairs(dec, prompt, &st), joint, trials, kind);
    CHECK(st.accepted > 0);
  }
  // DDTree's candidates under the tree verifier.
  sd::cpu_block_drafter runner(test_support::fixture_dspark());
  sd::block_proposer<sd::cpu_block_drafter, sd::greedy, sd::draft_mode::greedy,
                     sd::block_shape::tree>
      p(runner, sd::greedy{}, {.nodes = 12});
  sd::speculative_decoder dec(target, p, sd::tree_verifier{}, target_policy(), two_tokens(12));
  sd::request_stats st;
  check_counts(sample_pairs(dec, prompt, &st), joint, trials, "dspark, DDTree of 12");
  CHECK(st.accepted > 0);
}
