// Generation stops at the model family's end-of-text tokens (decode_config::eos_tokens set to
// tokenizer::end_of_text()): stories260K ends the first story of "Once upon a time" with BOS, the
// start of the next one, as llama2.c models do; both decoders stop there, exactly where plain
// decoding would. And what a request_observer sees: every emitted token with its step, its depth
// in the draft, drafted or bonus, and the target row that scored it; every verified step.
#include "support/doctest.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

namespace {

// Greedy tokens of "Once upon a time" with no end-of-text set, long enough to cross the end of
// the first story.
std::vector<sd::token_id> free_run(sd::cpu_llama& target) {
  sd::decode_config c;
  c.max_new_tokens = 420;
  sd::autoregressive_decoder ar(target, sd::greedy{}, c);
  return ar.generate(fixture::once_upon_a_time()).tokens;
}

}  // namespace

TEST_CASE("tokenizer: a llama2.c vocabulary ends a text at BOS or EOS") {
  CHECK(fixture::tok512().end_of_text() == std::vector<sd::token_id>{1, 2});
}

TEST_CASE("fixture: generation stops at the end of the story") {
  sd::cpu_llama target(fixture::stories260k(), {.threads = 1});
  std::vector<sd::token_id> const all = free_run(target);
  REQUIRE(all.size() == 420);
  std::vector<sd::token_id> const& end = fixture::tok512().end_of_text();
  auto const boundary = std::find_first_of(all.begin(), all.end(), end.begin(), end.end());
  REQUIRE(boundary != all.end());  // the free run glues the next story on
  CHECK(*boundary == 1);           // BOS starts it
  std::vector<sd::token_id> const story(all.begin(), boundary);
  CHECK(story.size() > 252);  // beyond the MANIFEST's reference ids, which hold no end of text

  sd::decode_config config;
  config.max_new_tokens = 420;
  config.eos_tokens = end;
  auto const check = [&](sd::decode_result const& r) {
    CHECK(r.reason == sd::finish_reason::eos);
    CHECK(r.tokens == story);
  };
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);
  check(ar.generate(fixture::once_upon_a_time()));

  SUBCASE("prompt lookup, trees") {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 5, .max_branches = 3});
    sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
    check(dec.generate(fixture::once_upon_a_time()));
  }
  SUBCASE("the trained draft model") {
    sd::cpu_llama draft(fixture::trained_draft(), {.threads = 1});
    sd::draft_model_proposer p(draft, target, sd::greedy{}, {.k = 4});
    sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
    check(dec.generate(fixture::once_upon_a_time()));
  }
  SUBCASE("the end-of-text token emitted") {
    config.emit_eos = true;
    sd::autoregressive_decoder emit(target, sd::greedy{}, config);
    auto const r = emit.generate(fixture::once_upon_a_time());
    CHECK(r.reason == sd::finish_reason::eos);
    REQUIRE(r.tokens.size() == story.size() + 1);
    CHECK(r.tokens.back() == 1);
  }
  SUBCASE("EOS alone does not end the story") {
    ar.config().eos_tokens = {2};
    auto const r = ar.generate(fixture::once_upon_a_time());
    REQUIRE(r.tokens.size() > story.size());  // it glues the next story on
    CHECK(r.tokens[story.size()] == 1);
    CHECK(std::equal(story.begin(), story.end(), r.tokens.begin()));
  }
}

TEST_CASE("request_observer: each token's step, depth, origin and row; each step") {
  sd::cpu_llama target(fixture::stories260k(), {.threads = 1});
  sd::decode_config config;
  config.max_new_tokens = 120;
  sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 5, .max_branches = 3});
  sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);

  std::vector<sd::token_event> events;
  std::vector<std::size_t> steps, tree_sizes, accepted;
  sd::request_observer observer;
  observer.on_token = [&](sd::token_event const& e) {
    // Greedy verification: every emitted token is the argmax of the row that scored it.
    REQUIRE(e.logits.size() == target.vocab_size());
    CHECK(static_cast<sd::token_id>(std::max_element(e.logits.begin(), e.logits.end()) -
                                    e.logits.begin()) == e.token);
    events.push_back(e);
    events.back().logits = {};
    return true;
  };
  observer.on_step = [&](sd::step_event const& e) {
    REQUIRE(e.tree != nullptr);
    REQUIRE(e.result != nullptr);
    steps.push_back(e.step);
    tree_sizes.push_back(e.tree->num_drafted());
    accepted.push_back(e.result->num_accepted());
  };
  sd::decode_result out;
  dec.generate(fixture::once_upon_a_time(), out, observer);
  std::vector<sd::token_id> const expected = fixture::reference_continuation();
  CHECK(std::equal(out.tokens.begin(), out.tokens.end(), expected.begin()));

  REQUIRE(events.size() == out.tokens.size());
  REQUIRE(steps.size() == out.stats.steps);
  std::size_t drafted = 0, bonus = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    CAPTURE(i);
    sd::token_event const& e = events[i];
    CHECK(e.token == out.tokens[i]);
    CHECK(e.index == i);
    REQUIRE(e.step < steps.size());
    CHECK(steps[e.step] == e.step);
    if (e.drafted) {
      ++drafted;
      CHECK(e.depth <= accepted[e.step]);
    } else {
      ++bonus;
      CHECK(e.depth == accepted[e.step] + 1);  // the bonus follows the accepted path
    }
    if (i > 0 && events[i - 1].step == e.step) CHECK(e.depth == events[i - 1].depth + 1);
    if (i > 0 && events[i - 1].step != e.step) CHECK(e.step == events[i - 1].step + 1);
    if (i == 0 || events[i - 1].step != e.step) CHECK(e.depth == 1);
  }
  CHECK(drafted == out.stats.accepted);
  CHECK(bonus == out.stats.steps);
  std::size_t total_tree = 0;
  for (std::size_t s : tree_sizes) total_tree += s;
  CHECK(total_tree == out.stats.drafted);

  // The baseline: each token a bonus at depth 1 of its own step; no step events.
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);
  events.clear();
  steps.clear();
  sd::decode_result base;
  ar.generate(fixture::once_upon_a_time(), base, observer);
  CHECK(base.tokens == out.tokens);
  REQUIRE(events.size() == base.tokens.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    CHECK(events[i].step == i);
    CHECK(events[i].depth == 1);
    CHECK(!events[i].drafted);
  }
  CHECK(steps.empty());

  // on_token returning false cancels, as a token_callback does.
  observer.on_token = [&](sd::token_event const& e) { return e.index < 9; };
  observer.on_step = {};
  auto const r = (dec.generate(fixture::once_upon_a_time(), out, observer), out);
  CHECK(r.reason == sd::finish_reason::cancelled);
  CHECK(r.tokens.size() == 10);
}
