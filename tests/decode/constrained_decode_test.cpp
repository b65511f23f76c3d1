// Constrained decoding on the stories260K fixture (sampling/constraint.hpp,
// propose/constrained.hpp): greedy speculative output equals greedy constrained autoregressive
// output token for token, for several strategies with and without forced spans, single and batched;
// every output matches its pattern (checked by std::regex on the decoded text, not by the library's
// automaton) and ends at an end token once complete; the first two sampled tokens follow the exact
// constrained joint distribution (chi-square, sampling_check.hpp's threshold), for the tree
// verifier with point masses and speculative sampling with masked q rows; and the test has power: a
// policy that scores every node with the root's state fails it.

#include "support/doctest.hpp"

#include <map>
#include <memory>
#include <string>
#include <vector>
// GCC 12 warns inside <regex> itself (maybe-uninitialized, in std::function) at -O1.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>
#pragma GCC diagnostic pop

#include "decode/one_thread.hpp"
#include "decode/sampling_check.hpp"
#include "specdec/backend/cpu/batched_llama.hpp"
#include "specdec/backend/cpu/eagle.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/batch_decoder.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/constrained.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/per_request.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/reference/regex.hpp"
#include "specdec/sampling/automaton.hpp"
#include "specdec/sampling/automaton_constraint.hpp"
#include "specdec/sampling/constraint.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/sampling/regex.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/eagle.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

namespace constrained_decode_test {

using constraint_ptr = std::shared_ptr<sd::automaton_constraint const>;
using policy = sd::constrained<sd::sampler, sd::automaton_constraint>;
using decode_test::one_thread;

std::shared_ptr<sd::token_vocabulary const> const& vocabulary() {
  static auto const v =
      std::make_shared<sd::token_vocabulary const>(sd::token_vocabulary::of(fixture::tok512()));
  return v;
}

sd::sampler greedy_sampler() {
  sd::sampling_params p;
  p.temperature = 0.0f;
  return sd::sampler(p);
}

sd::decode_config config_for(std::size_t max_new) {
  sd::decode_config c;
  c.max_new_tokens = max_new;
  c.eos_tokens = fixture::tok512().end_of_text();
  c.max_draft_nodes = 8;
  return c;
}

std::vector<sd::token_id> encode(std::string_view text) {
  return fixture::tok512().encode(text, false, false);
}

// The output's text: each token after the previous one (the prompt's last token first).
std::string text_of(std::vector<sd::token_id> const& prompt, std::vector<sd::token_id> const& out) {
  std::string s;
  sd::token_id prev = prompt.back();
  for (sd::token_id t : out) {
    if (fixture::tok512().type(t) == sd::token_type::control) break;
    s += fixture::tok512().decode(prev, t);
    prev = t;
  }
  return s;
}

// Patterns the fixture can fill in a few dozen tokens; ECMAScript reads them the same way.
std::vector<std::string> const patterns = {
    " (Tim|Lily|Ben) (was|is) (happy|sad|big)\\. [A-Z][a-z]+( [a-z]+){2,6}\\.",
    "\\{\"name\": \"[A-Z][a-z]{1,10}\", \"age\": [1-9][0-9]?, \"pet\": \"(cat|dog|bird)\"\\}",
    " [a-z]+(, [a-z]+){1,3}!",
};

}  // namespace constrained_decode_test

TEST_CASE("constrained greedy: speculative output equals constrained autoregressive output") {
  using namespace constrained_decode_test;
  auto const weights = fixture::stories260k();
  sd::cpu_llama target(weights, one_thread());
  sd::cpu_llama draft_model(fixture::trained_draft(), one_thread());
  auto const prompts = fixture::encoded_prompts();
  std::size_t forced_total = 0, pruned_total = 0;
  for (std::string const& pattern : patterns) {
    CAPTURE(pattern);
    constraint_ptr const c = sd::regex_constraint(pattern, vocabulary());
    std::regex const check(pattern, std::regex::ECMAScript);
    policy const pol(greedy_sampler(), c);
    for (std::size_t i = 0; i < 3; ++i) {
      std::vector<sd::token_id> const& prompt = prompts[i];
      CAPTURE(i);
      sd::autoregressive_decoder ar(target, pol, config_for(96));
      sd::decode_result const want = ar.generate(prompt);
      std::string const text = text_of(prompt, want.tokens);
      CAPTURE(text);
      REQUIRE(want.reason == sd::finish_reason::eos);  // complete, then the end token
      CHECK(std::regex_match(text, check));

      // Prompt lookup under the policy alone (nothing pruned, no forced spans).
      sd::prompt_lookup_proposer lookup({.k = 4, .max_branches = 3});
      sd::speculative_decoder plain(target, lookup, sd::greedy_verifier{}, pol, config_for(96));
      CHECK(plain.generate(prompt).tokens == want.tokens);

      // Prompt lookup pruned and with forced spans.
      sd::constrained_proposer<sd::prompt_lookup_proposer, sd::automaton_constraint> wrapped(
          sd::prompt_lookup_proposer({.k = 4, .max_branches = 3}), c, encode);
      sd::speculative_decoder dec(target, wrapped, sd::greedy_verifier{}, pol, config_for(96));
      sd::decode_result const got = dec.generate(prompt);
      CHECK(got.tokens == want.tokens);
      CHECK(got.reason == want.reason);
      forced_total += wrapped.forced_steps();
      pruned_total += wrapped.pruned_nodes();

      // The trained draft model, greedy chains, pruned and with forced spans.
      sd::constrained_proposer<sd::draft_model_proposer<sd::cpu_llama, sd::sampler>,
                               sd::automaton_constraint>
          drafts(sd::draft_model_proposer<sd::cpu_llama, sd::sampler>(draft_model, target,
                                                                      greedy_sampler(), {.k = 4}),
                 c, encode);
      sd::speculative_decoder dd(target, drafts, sd::greedy_verifier{}, pol, config_for(96));
      sd::decode_result const got2 = dd.generate(prompt);
      CHECK(got2.tokens == want.tokens);
      // Forced spans make steps count: fewer target forwards than tokens.
      CHECK(got2.stats.steps < want.tokens.size());
    }
  }
  CHECK(forced_total > 0);
  CHECK(pruned_total > 0);
}

TEST_CASE("constrained greedy, batched: each request its own constraint, as decoded alone") {
  using namespace constrained_decode_test;
  auto const weights = fixture::stories260k();
  auto const prompts = fixture::encoded_prompts();
  sd::cpu_batched_llama target(weights, {.model = {.threads = 1}, .max_slots = 4});
  using lookups = sd::per_request_proposer<sd::prompt_lookup_proposer>;
  lookups proposer([] { return sd::prompt_lookup_proposer({.k = 4, .max_branches = 3}); });
  sd::batch_decoder<sd::cpu_batched_llama, lookups, sd::greedy_verifier, policy> decoder(target,
                                                                                         proposer);
  sd::cpu_llama alone(weights, one_thread());
  std::vector<sd::decode_result> want;
  std::vector<std::uint64_t> ids;
  for (std::size_t i = 0; i < 6; ++i) {
    constraint_ptr const c = sd::regex_constraint(patterns[i % patterns.size()], vocabulary());
    policy const pol(greedy_sampler(), c);
    sd::autoregressive_decoder ar(alone, pol, config_for(80));
    want.push_back(ar.generate(prompts[i]));
    ids.push_back(decoder.submit(prompts[i], pol, config_for(80)));
  }
  decoder.run();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CAPTURE(i);
    std::optional<sd::batch_result> const got = decoder.take(ids[i]);
    REQUIRE(got.has_value());
    CAPTURE(got->error);
    CHECK_FALSE(got->failed());
    CHECK(got->result.tokens == want[i].tokens);
    std::regex const check(patterns[i % patterns.size()], std::regex::ECMAScript);
    CHECK(std::regex_match(text_of(prompts[i], want[i].tokens), check));
  }
}

namespace constrained_decode_test {

// A policy that scores every node with the state of the tree's root (its `advance` does nothing):
// the wrong mask for every node below the root, which the chi-square test must catch.
class root_state_policy : public sd::constrained<sd::sampler, sd::automaton_constraint> {
  using base = sd::constrained<sd::sampler, sd::automaton_constraint>;

 public:
  root_state_policy(sd::sampler s, constraint_ptr c) : base(std::move(s), std::move(c)) {}
  explicit root_state_policy(base b) : base(std::move(b)) {}
  [[nodiscard]] root_state_policy for_prompt(std::size_t n) const {
    return root_state_policy(base::for_prompt(n));
  }
  void advance(state_type&, sd::token_id) const {}
};
static_assert(sd::incremental_policy<root_state_policy>);

// Words, then a full stop: the constrained distribution of the first two tokens is spread.
constexpr char const* spread_pattern = "( [a-z]+){2,4}[.!]";

sd::sampler unit_temperature() {
  sd::sampling_params p;
  p.temperature = 1.0f;
  return sd::sampler(p);
}

}  // namespace constrained_decode_test

TEST_CASE("constrained sampling: the first two tokens follow the constrained distribution") {
  using namespace constrained_decode_test;
  auto const weights = fixture::stories260k();
  // BOS " very": the next two tokens are uncertain. The masks differ between the positions: the
  // first token must start a word (" x"), the second may also go on with it or end it.
  std::vector<sd::token_id> const prompt{1, 399};
  constraint_ptr const c = sd::regex_constraint(spread_pattern, vocabulary());
  policy const pol(unit_temperature(), c);
  static auto const joint = sampling_check::exact_joint(weights, prompt, pol);
  REQUIRE(joint.size() > 1000);
  sd::cpu_llama target(weights, one_thread());
  auto const two = sampling_check::two_tokens();

  SUBCASE("autoregressive (the test's own check)") {
    sd::autoregressive_decoder ar(target, pol, two);
    sampling_check::check_counts(sampling_check::sample_pairs(ar, prompt), joint,
                                 sampling_check::trials, "autoregressive");
  }
  SUBCASE("prompt lookup trees, pruned, forced spans, tree verifier (point masses)") {
    sd::constrained_proposer<sd::prompt_lookup_proposer, sd::automaton_constraint> p(
        sd::prompt_lookup_proposer({.n_min = 1, .k = 3, .max_branches = 4}), c, encode);
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, pol, two);
    sd::request_stats s;
    sampling_check::check_counts(sampling_check::sample_pairs(dec, prompt, &s), joint,
                                 sampling_check::trials, "prompt lookup, tree verifier");
  }
  SUBCASE("EAGLE-3 trees under the policy alone (nothing pruned), tree verifier") {
    sd::cpu_eagle_head runner(test_support::fixture_eagle3());
    sd::eagle_proposer<sd::cpu_eagle_head> p(
        runner, sd::eagle_tree_config{.depth = 4, .top_k = 4, .nodes = 16});
    sd::speculative_decoder dec(target, p, sd::tree_verifier{}, pol,
                                sampling_check::two_tokens(16));
    sd::request_stats s;
    sampling_check::check_counts(sampling_check::sample_pairs(dec, prompt, &s), joint,
                                 sampling_check::trials, "eagle-3 trees, tree verifier");
    CHECK(s.accepted > 0);
  }
  SUBCASE("layer skip, q rows masked by the same constraint, speculative sampling") {
    sd::layer_skip_proposer<policy, sd::draft_mode::sample> p(
        {.skip_layers = {2}, .draft = {.k = 3}}, policy(unit_temperature(), c, prompt.size()));
    sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, pol, two);
    sd::request_stats s;
    sampling_check::check_counts(sampling_check::sample_pairs(dec, prompt, &s), joint,
                                 sampling_check::trials, "layer skip, masked q rows");
    CHECK(s.accepted > s.drafted / 4);
  }
}

TEST_CASE("constrained sampling: the chi-square test catches the root's mask applied to children") {
  using namespace constrained_decode_test;
  auto const weights = fixture::stories260k();
  std::vector<sd::token_id> const prompt{1, 399};
  constraint_ptr const c = sd::regex_constraint(spread_pattern, vocabulary());
  policy const pol(unit_temperature(), c);
  auto const joint = sampling_check::exact_joint(weights, prompt, pol);
  sd::cpu_llama target(weights, one_thread());
  sd::layer_skip_proposer<policy, sd::draft_mode::sample> p(
      {.skip_layers = {2}, .draft = {.k = 3}}, policy(unit_temperature(), c, prompt.size()));
  root_state_policy const wrong(unit_temperature(), c);
  sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, wrong,
                              sampling_check::two_tokens());
  auto const counts = sampling_check::sample_pairs(dec, prompt);
  auto const fit = sampling_check::chi2(counts, joint, sampling_check::trials);
  double const limit = sampling_check::chi2_threshold(static_cast<double>(fit.second - 1));
  INFO("chi2 = " << fit.first << " over " << fit.second << " cells, limit " << limit);
  std::size_t impossible = 0;
  for (auto const& [key, n] : counts)
    if (joint.find(key) == joint.end()) impossible += n;
  INFO(impossible << " pairs of probability 0");
  // Caught by the statistic alone (chi2 ~ 700 against a limit near 100 when written), and by
  // the emitted pairs of probability 0 that check_counts refuses.
  CHECK(fit.first > limit);
  CHECK(impossible > 0);
}

TEST_CASE("constrained proposer: a reference to the caller's proposer, and no constraint") {
  using namespace constrained_decode_test;
  sd::prompt_lookup_proposer lookup({.k = 4});
  sd::constrained_proposer<sd::prompt_lookup_proposer&, sd::automaton_constraint> by_ref(
      lookup, nullptr, encode);
  static_assert(!sd::produces_trees_v<decltype(by_ref)> ==
                !sd::produces_trees_v<sd::prompt_lookup_proposer>);
  CHECK(&by_ref.inner() == &lookup);
  // With no constraint it drafts exactly what the wrapped proposer drafts.
  sd::cpu_llama target(fixture::stories260k(), one_thread());
  auto const prompt = fixture::encoded_prompts()[0];
  sd::speculative_decoder a(target, by_ref, sd::greedy_verifier{}, policy(greedy_sampler()),
                            config_for(48));
  sd::decode_result const got = a.generate(prompt);
  sd::prompt_lookup_proposer plain({.k = 4});
  sd::speculative_decoder b(target, plain, sd::greedy_verifier{}, greedy_sampler(), config_for(48));
  sd::decode_result const want = b.generate(prompt);
  CHECK(got.tokens == want.tokens);
  CHECK(got.stats.steps == want.stats.steps);
  CHECK(got.stats.drafted == want.stats.drafted);
}

TEST_CASE("constrained output cut by max_new_tokens: a valid beginning, constraint_incomplete") {
  using namespace constrained_decode_test;
  sd::cpu_llama target(fixture::stories260k(), one_thread());
  auto const prompt = fixture::encoded_prompts()[0];
  constraint_ptr const c = sd::regex_constraint(patterns[1], vocabulary());
  policy const pol(greedy_sampler(), c);
  sd::autoregressive_decoder ar(target, pol, config_for(6));
  sd::decode_result const cut = ar.generate(prompt);
  CHECK(cut.reason == sd::finish_reason::constraint_incomplete);
  CHECK(sd::to_string(cut.reason) == "constraint_incomplete");
  CHECK(cut.tokens.size() == 6);
  CHECK(sd::reference::regex_viable_prefix(patterns[1], text_of(prompt, cut.tokens)));
  CHECK_FALSE(pol.output_complete(cut.tokens));
  // The same under speculation, and without a constraint the reason stays max_tokens.
  sd::prompt_lookup_proposer lookup({.k = 4});
  sd::speculative_decoder dec(target, lookup, sd::greedy_verifier{}, pol, config_for(6));
  sd::decode_result const spec = dec.generate(prompt);
  CHECK(spec.reason == sd::finish_reason::constraint_incomplete);
  CHECK(spec.tokens == cut.tokens);
  sd::autoregressive_decoder plain(target, policy(greedy_sampler()), config_for(6));
  CHECK(plain.generate(prompt).reason == sd::finish_reason::max_tokens);
}

namespace constrained_decode_test {

// Drafts, at each step, the next tokens of a known output as a chain with a token the constraint
// never allows (the unknown token: no bytes) beside each of them, and checks in `accept` that
// every accepted node index names, in its own tree, the token accepted there.
struct recording_proposer {
  static constexpr bool produces_trees = true;
  std::vector<sd::token_id> want;
  std::size_t prompt_size = 0;
  sd::draft_tree mine;
  std::size_t checked = 0, wrong = 0;

  void begin(std::span<sd::token_id const> prompt) { prompt_size = prompt.size(); }
  void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
    tree.reset(ctx.tokens.back());
    std::size_t const done = ctx.tokens.size() - prompt_size;
    sd::node_index at = 0;
    for (std::size_t d = 0; d < 3 && done + d < want.size() && tree.size() + 2 <= ctx.max_nodes + 1;
         ++d) {
      (void)tree.add_node(at, fixture::tok512().unk());  // never allowed: pruned
      at = tree.add_node(at, want[done + d]);
    }
    mine = tree;
  }
  void accept(sd::verify_result const& r) {
    for (std::size_t i = 0; i < r.accepted_nodes.size(); ++i) {
      ++checked;
      if (mine.token(r.accepted_nodes[i]) != r.tokens[i]) ++wrong;
    }
  }
  [[nodiscard]] std::size_t max_nodes() const noexcept { return 8; }
};

}  // namespace constrained_decode_test

TEST_CASE("constrained proposer: accept() gets the wrapped proposer's own node indices") {
  using namespace constrained_decode_test;
  sd::cpu_llama target(fixture::stories260k(), one_thread());
  auto const prompt = fixture::encoded_prompts()[1];
  constraint_ptr const c = sd::regex_constraint(patterns[0], vocabulary());
  policy const pol(greedy_sampler(), c);
  sd::autoregressive_decoder ar(target, pol, config_for(64));
  sd::decode_result const want = ar.generate(prompt);
  recording_proposer inner;
  inner.want = want.tokens;
  sd::constrained_proposer<recording_proposer&, sd::automaton_constraint> wrapped(
      inner, c, encode, {.forced_spans = false});
  sd::speculative_decoder dec(target, wrapped, sd::greedy_verifier{}, pol, config_for(64));
  sd::decode_result const got = dec.generate(prompt);
  CHECK(got.tokens == want.tokens);
  CHECK(wrapped.pruned_nodes() > 0);
  CHECK(inner.checked > 10);
  CHECK(inner.wrong == 0);
}
