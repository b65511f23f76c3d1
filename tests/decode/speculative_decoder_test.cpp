// The speculative decoder and the autoregressive baseline on the toy model: greedy equality for
// every proposer, the commit path for chains and trees, stops, the streaming callback, statistics.
#include "support/doctest.hpp"

#include <string>
#include <vector>

#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculation.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "support/toy_model.hpp"

namespace sd = specdec;

namespace {

constexpr std::size_t vocab = 24;
constexpr std::size_t context = 400;

// Drafts nothing: speculative decoding degenerates to one token per step.
struct null_proposer {
  void begin(std::span<sd::token_id const>) {}
  void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
    tree.reset(ctx.tokens.back());
  }
  void accept(sd::verify_result const&) {}
};

// Drafts a fixed tree of the target's own greedy path plus decoys, with `needs_target_hidden`.
struct hidden_reading_proposer {
  static constexpr bool produces_trees = true;
  static constexpr bool needs_target_hidden = true;
  std::vector<std::size_t> hidden_rows_seen;
  std::size_t expected_rows = 0;    // rows the next propose should see
  std::size_t mismatches = 0;       // hidden rows that are not those of the last committed tokens
  std::vector<sd::token_id> truth;  // the greedy continuation
  std::size_t prompt_size = 0;
  void begin(std::span<sd::token_id const> prompt) {
    expected_rows = prompt.size() - 1;
    prompt_size = prompt.size();
  }
  void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
    std::size_t const rows = ctx.target_hidden.rows();
    hidden_rows_seen.push_back(rows);
    if (rows != expected_rows) ++mismatches;
    // The toy's hidden row of a token is [token, previous token, position, 1]; the rows are those
    // of the tokens committed by the last step, in order, the last one just before the root.
    std::size_t const t = ctx.tokens.size();
    for (std::size_t r = 0; r < rows && rows <= t - 1; ++r) {
      std::size_t const at = t - 1 - rows + r;
      if (ctx.target_hidden(r, 0) != static_cast<float>(ctx.tokens[at]) ||
          ctx.target_hidden(r, 2) != static_cast<float>(at))
        ++mismatches;
    }
    tree.reset(ctx.tokens.back());
    std::size_t const done = t - prompt_size;
    if (ctx.max_nodes >= 3 && done + 1 < truth.size()) {
      // A decoy child first, then the true continuation (two tokens) as the second child, so the
      // accepted path is nodes 2, 3: a keep_path commit and hidden rows gathered out of order.
      sd::token_id const good = truth[done];
      tree.add_node(0, (good + 1) % static_cast<sd::token_id>(vocab));
      sd::node_index const second = tree.add_node(0, good);
      tree.add_node(second, truth[done + 1]);
    }
  }
  void accept(sd::verify_result const& r) { expected_rows = r.num_accepted() + 1; }
};

// Proposes the true greedy continuation as the SECOND child of the root, with a decoy first.
struct oracle_proposer {
  static constexpr bool produces_trees = true;
  std::vector<sd::token_id> truth;
  std::size_t prompt_size = 0;
  void begin(std::span<sd::token_id const> p) { prompt_size = p.size(); }
  void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
    tree.reset(ctx.tokens.back());
    std::size_t const done = ctx.tokens.size() - prompt_size;
    if (done >= truth.size() || ctx.max_nodes < 4) return;
    sd::token_id const good = truth[done];
    sd::token_id const decoy = (good + 1) % static_cast<sd::token_id>(vocab);
    sd::node_index const d = tree.add_node(0, decoy);
    tree.add_node(d, 0);
    sd::node_index at = tree.add_node(0, good);
    for (std::size_t i = done + 1; i < truth.size() && i < done + 3; ++i)
      at = tree.add_node(at, truth[i]);
  }
  void accept(sd::verify_result const&) {}
};

std::vector<std::vector<sd::token_id>> toy_prompts() {
  return {{1}, {1, 5, 9}, {1, 3, 3, 3, 3, 7, 2, 11}, {4, 8, 15, 16, 23, 4, 8, 15}};
}

template <class Decoder>
sd::decode_result run(Decoder& d, std::vector<sd::token_id> const& prompt) {
  return d.generate(prompt);
}

}  // namespace

TEST_CASE("greedy speculative decoding on the toy model equals greedy autoregressive decoding") {
  toy::toy_lm target(vocab, context);
  sd::decode_config config;
  config.max_new_tokens = 90;
  sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar(target, sd::greedy{}, config);

  for (auto const& prompt : toy_prompts()) {
    CAPTURE(prompt.size());
    auto const reference = ar.generate(prompt);
    REQUIRE(reference.tokens.size() == 90);
    CHECK(reference.reason == sd::finish_reason::max_tokens);
    CHECK(reference.stats.steps == 90);
    CHECK(reference.stats.drafted == 0);

    SUBCASE("no drafts") {
      null_proposer p;
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      auto const r = dec.generate(prompt);
      CHECK(r.tokens == reference.tokens);
      CHECK(r.stats.steps == 90);
    }
    SUBCASE("prompt lookup, chains") {
      sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 5});
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      auto const r = dec.generate(prompt);
      CHECK(r.tokens == reference.tokens);
      CHECK(r.stats.accepted > 0);
      CHECK(r.stats.steps < 90);
    }
    SUBCASE("prompt lookup, chain proposer, speculative sampling verifier") {
      sd::prompt_lookup_chain_proposer p({.n_max = 3, .n_min = 1, .k = 5});
      sd::speculative_decoder dec(target, p, sd::speculative_sampling_verifier{}, sd::greedy{},
                                  config);
      auto const r = dec.generate(prompt);
      CHECK(r.tokens == reference.tokens);
      CHECK(r.stats.accepted > 0);
    }
    SUBCASE("prompt lookup, trees") {
      sd::prompt_lookup_proposer p({.n_max = 2, .n_min = 1, .k = 4, .max_branches = 3});
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      auto const r = dec.generate(prompt);
      CHECK(r.tokens == reference.tokens);
    }
    SUBCASE("draft model") {
      toy::toy_lm draft(vocab, context, 7, 6.0f, 0.8f);
      sd::draft_model_proposer p(draft, target, sd::greedy{}, {.k = 4});
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      auto const r = dec.generate(prompt);
      CHECK(r.tokens == reference.tokens);
      CHECK(r.stats.accepted > 0);
      CHECK(r.stats.accepted < r.stats.drafted);
    }
    SUBCASE("draft model, adaptive k and confidence cutoff") {
      toy::toy_lm draft(vocab, context, 7, 6.0f, 0.8f);
      sd::draft_model_proposer p(
          draft, target, sd::greedy{},
          {.k = 3, .adaptive = true, .k_min = 1, .k_max = 7, .confidence_threshold = 0.2f});
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      auto const r = dec.generate(prompt);
      CHECK(r.tokens == reference.tokens);
    }
    SUBCASE("layer skip") {
      sd::layer_skip_proposer<sd::greedy> p({.skip_layers = {2}}, sd::greedy{});
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      auto const r = dec.generate(prompt);
      CHECK(r.tokens == reference.tokens);
      CHECK(r.stats.accepted > 0);
    }
    SUBCASE("trees that need keep_path, with target hidden rows") {
      hidden_reading_proposer p;
      p.truth = reference.tokens;
      sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
      std::size_t const keeps_before = target.cache().keep_path_calls;
      auto const r = dec.generate(prompt);
      CHECK(r.tokens == reference.tokens);
      REQUIRE(!p.hidden_rows_seen.empty());
      CHECK(p.hidden_rows_seen[0] == prompt.size() - 1);  // the prefill's rows
      CHECK(p.mismatches == 0);
      CHECK(target.cache().keep_path_calls > keeps_before + 10);
      CHECK(r.stats.mean_accepted_length() > 2.5);
    }
  }
}

// The speculation policy sizes each step's draft within the limit, as in batch_decoder: with costs
// seeded (and kept: a negligible cost weight) the choice is deterministic. A forward whose time is
// its rows (compute-bound) never pays for a draft token; one whose time does not depend on its
// rows (weights streamed) pays for several.
TEST_CASE("a speculation policy sizes each step's draft; greedy output unchanged") {
  toy::toy_lm target(vocab, context);
  sd::decode_config config;
  config.max_new_tokens = 90;
  sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar(target, sd::greedy{}, config);
  auto const seeded = [](double slope) {
    sd::adaptive_speculation s({.max_k = 5, .cost_weight = 1e-12});
    for (std::size_t r = 1; r <= 8; ++r)
      s.costs().observe(r, 1e-3 * (1.0 + slope * static_cast<double>(r - 1)), 1.0);
    return s;
  };
  using decoder =
      sd::speculative_decoder<toy::toy_lm, sd::prompt_lookup_proposer, sd::greedy_verifier,
                              sd::greedy, sd::adaptive_speculation>;
  for (auto const& prompt : toy_prompts()) {
    CAPTURE(prompt.size());
    auto const reference = ar.generate(prompt);
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 5});
    decoder compute_bound(target, p, sd::greedy_verifier{}, sd::greedy{}, config, seeded(1.0));
    auto const none = compute_bound.generate(prompt);
    CHECK(none.tokens == reference.tokens);
    CHECK(none.stats.drafted == 0);
    CHECK(none.stats.steps == 90);
    decoder streamed(target, p, sd::greedy_verifier{}, sd::greedy{}, config, seeded(0.0));
    auto const some = streamed.generate(prompt);
    CHECK(some.tokens == reference.tokens);
    CHECK(some.stats.drafted > 0);
    CHECK(some.stats.steps < 90);
    CHECK(some.stats.max_tree_size <= 5);
    // A second request (the acceptance evidence of the first now its prior).
    auto const again = streamed.generate(prompt);
    CHECK(again.tokens == reference.tokens);
    CHECK(again.stats.drafted > 0);
  }
  // The fixed policy of 2 tokens a step drafts at most 2 (the proposer's budget is 5).
  sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 5});
  sd::speculative_decoder<toy::toy_lm, sd::prompt_lookup_proposer, sd::greedy_verifier, sd::greedy,
                          sd::fixed_speculation>
      two(target, p, sd::greedy_verifier{}, sd::greedy{}, config, sd::fixed_speculation(2));
  auto const r = two.generate(toy_prompts()[2]);
  CHECK(r.tokens == ar.generate(toy_prompts()[2]).tokens);
  CHECK(r.stats.max_tree_size <= 2);
  CHECK(r.stats.accepted > 0);
  // Bad acceptance options name the decoder.
  CHECK_THROWS_WITH_AS((decoder(target, p, sd::greedy_verifier{}, sd::greedy{}, config, seeded(0.0),
                                {.decay = 1.0})),
                       doctest::Contains("speculative_decoder: acceptance decay 1"), sd::error);
}

// The cost model's calibration of a one-sequence model: a point per row count that fits the cache,
// the cache cleared before and after.
TEST_CASE("forward_cost_model calibrates a causal_lm") {
  toy::toy_lm target(vocab, 40);
  sd::forward_cost_model costs;
  std::vector<std::size_t> const rows = {1, 2, 4, 8, 64};
  costs.calibrate(target, rows, 16, 2);
  CHECK(costs.calibrated());
  CHECK(costs.size() == 4);  // 64 rows do not fit a cache of 40 entries
  CHECK(costs.predict(1) > 0.0);
  CHECK(costs.predict(8) >= costs.predict(1));
  CHECK(target.cache().size() == 0);
  sd::adaptive_speculation s({.max_k = 2});
  s.prepare(target);  // rows up to max_k + 1 = 3, and the next one above (4)
  CHECK(s.costs().size() == 4);
  CHECK(target.cache().size() == 0);
}

TEST_CASE("a tree step commits the accepted branch with keep_path") {
  toy::toy_lm target(vocab, context);
  sd::decode_config config;
  config.max_new_tokens = 40;
  sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar(target, sd::greedy{}, config);
  std::vector<sd::token_id> const prompt{1, 2, 3};
  auto const reference = ar.generate(prompt);

  oracle_proposer p{.truth = reference.tokens};
  sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, config);
  std::size_t const keeps = target.cache().keep_path_calls;
  auto const r = dec.generate(prompt);
  CHECK(r.tokens == reference.tokens);
  CHECK(target.cache().keep_path_calls > keeps);
  CHECK(r.stats.accepted > 0);
  CHECK(r.stats.mean_accepted_length() > 2.0);
}

TEST_CASE("stops: EOS, stop sequences, stop strings, max tokens, context, callback") {
  toy::toy_lm target(vocab, context);
  std::vector<sd::token_id> const prompt{1, 5, 9};
  sd::decode_config base;
  base.max_new_tokens = 60;
  sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar0(target, sd::greedy{}, base);
  auto const free_run = ar0.generate(prompt);
  REQUIRE(free_run.tokens.size() == 60);

  auto check_both = [&](sd::decode_config const& config, auto&& expect) {
    sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar(target, sd::greedy{}, config);
    auto const a = ar.generate(prompt);
    expect(a);
    sd::prompt_lookup_proposer pl({.k = 6});
    sd::speculative_decoder sp(target, pl, sd::greedy_verifier{}, sd::greedy{}, config);
    auto const s = sp.generate(prompt);
    expect(s);
    CHECK(s.tokens == a.tokens);
    CHECK(s.reason == a.reason);
    CHECK(s.stop_index == a.stop_index);
    toy::toy_lm draft(vocab, context, 7, 6.0f, 0.5f);
    sd::draft_model_proposer dm(draft, target, sd::greedy{}, {.k = 5});
    sd::speculative_decoder sp2(target, dm, sd::greedy_verifier{}, sd::greedy{}, config);
    auto const s2 = sp2.generate(prompt);
    CHECK(s2.tokens == a.tokens);
    CHECK(s2.reason == a.reason);
  };

  SUBCASE("EOS, not emitted and emitted") {
    sd::token_id const eos = free_run.tokens[17];
    std::size_t first = 0;
    while (free_run.tokens[first] != eos) ++first;
    sd::decode_config c = base;
    c.eos_tokens = {eos};
    check_both(c, [&](sd::decode_result const& r) {
      CHECK(r.reason == sd::finish_reason::eos);
      CHECK(r.tokens.size() == first);
      CHECK(std::equal(r.tokens.begin(), r.tokens.end(), free_run.tokens.begin()));
    });
    c.emit_eos = true;
    check_both(c, [&](sd::decode_result const& r) {
      CHECK(r.reason == sd::finish_reason::eos);
      CHECK(r.tokens.size() == first + 1);
      CHECK(r.tokens.back() == eos);
    });
  }
  SUBCASE("stop sequences") {
    sd::decode_config c = base;
    c.stop_sequences = {{23, 23, 23, 23}, {free_run.tokens[20], free_run.tokens[21]}};
    check_both(c, [&](sd::decode_result const& r) {
      CHECK(r.reason == sd::finish_reason::stop_sequence);
      CHECK(r.stop_index == 1);
      REQUIRE(r.tokens.size() >= 2);
      CHECK(r.tokens.size() <= 22);
      CHECK(r.tokens[r.tokens.size() - 2] == free_run.tokens[20]);
      CHECK(r.tokens.back() == free_run.tokens[21]);
    });
  }
  SUBCASE("stop strings through a piece function") {
    sd::decode_config c = base;
    // Token t reads as the letter 'a' + t; a stop string spanning three tokens.
    c.piece = [](sd::token_id, sd::token_id t) {
      return std::string(1, static_cast<char>('a' + t));
    };
    std::string s;
    for (std::size_t i = 30; i < 33; ++i) s += static_cast<char>('a' + free_run.tokens[i]);
    c.stop_strings = {"zzzzzz", s};
    check_both(c, [&](sd::decode_result const& r) {
      CHECK(r.reason == sd::finish_reason::stop_string);
      CHECK(r.stop_index == 1);
      CHECK(r.tokens.size() <= 33);
      std::string text;
      for (auto t : r.tokens) text += static_cast<char>('a' + t);
      CHECK(text.find(s) == text.size() - s.size());
    });
    c.piece = nullptr;
    CHECK_THROWS_AS((sd::autoregressive_decoder<toy::toy_lm, sd::greedy>(target, sd::greedy{}, c)),
                    sd::error);
  }
  SUBCASE("max tokens") {
    sd::decode_config c = base;
    c.max_new_tokens = 7;
    check_both(c, [&](sd::decode_result const& r) {
      CHECK(r.reason == sd::finish_reason::max_tokens);
      CHECK(r.tokens.size() == 7);
    });
    c.max_new_tokens = 0;
    check_both(c, [&](sd::decode_result const& r) {
      CHECK(r.reason == sd::finish_reason::max_tokens);
      CHECK(r.tokens.empty());
    });
  }
  SUBCASE("context capacity") {
    toy::toy_lm small(vocab, 20);
    sd::decode_config c = base;
    sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar(small, sd::greedy{}, c);
    auto const a = ar.generate(prompt);
    CHECK(a.reason == sd::finish_reason::context_full);
    // Positions 0..19 are scored; the token after the last scored one is emitted too.
    CHECK(a.tokens.size() == 20 - prompt.size() + 1);
    CHECK(std::equal(a.tokens.begin(), a.tokens.end(), free_run.tokens.begin()));
    for (std::size_t k : {1u, 3u, 8u}) {
      sd::prompt_lookup_proposer pl({.k = k});
      sd::speculative_decoder sp(small, pl, sd::greedy_verifier{}, sd::greedy{}, c);
      auto const s = sp.generate(prompt);
      CHECK(s.reason == sd::finish_reason::context_full);
      CHECK(s.tokens == a.tokens);
      toy::toy_lm draft(vocab, 12, 7, 6.0f, 0.5f);  // a draft with an even smaller context
      sd::draft_model_proposer dm(draft, small, sd::greedy{}, {.k = k});
      sd::speculative_decoder sp2(small, dm, sd::greedy_verifier{}, sd::greedy{}, c);
      auto const s2 = sp2.generate(prompt);
      CHECK(s2.reason == sd::finish_reason::context_full);
      CHECK(s2.tokens == a.tokens);
    }
    std::vector<sd::token_id> const too_long(21, 3);
    CHECK_THROWS_AS((void)ar.generate(too_long), sd::error);
    std::vector<sd::token_id> const fits(20, 3);
    auto const r = ar.generate(fits);
    CHECK(r.reason == sd::finish_reason::context_full);
    CHECK(r.tokens.size() == 1);
  }
  SUBCASE("streaming callback sees every token in order and can stop") {
    sd::decode_config c = base;
    c.max_new_tokens = 30;
    std::vector<sd::token_id> streamed;
    sd::prompt_lookup_proposer pl({.k = 6});
    sd::speculative_decoder sp(target, pl, sd::greedy_verifier{}, sd::greedy{}, c);
    auto const r = sp.generate(prompt, [&](sd::token_id t) {
      streamed.push_back(t);
      return true;
    });
    CHECK(streamed == r.tokens);
    streamed.clear();
    auto const cut = sp.generate(prompt, [&](sd::token_id t) {
      streamed.push_back(t);
      return streamed.size() < 11;
    });
    CHECK(cut.reason == sd::finish_reason::cancelled);
    CHECK(cut.tokens.size() == 11);
    CHECK(streamed == cut.tokens);
    CHECK(std::equal(cut.tokens.begin(), cut.tokens.end(), free_run.tokens.begin()));
  }
}

TEST_CASE("statistics fields") {
  toy::toy_lm target(vocab, context);
  sd::decode_config c;
  c.max_new_tokens = 50;
  toy::toy_lm draft(vocab, context, 7, 6.0f, 0.8f);
  sd::draft_model_proposer dm(draft, target, sd::greedy{}, {.k = 4});
  sd::speculative_decoder sp(target, dm, sd::greedy_verifier{}, sd::greedy{}, c);
  std::vector<sd::token_id> const prompt{1, 4, 6, 8};
  std::size_t const forwards_before = target.forwards;
  auto const r = sp.generate(prompt);
  auto const& s = r.stats;
  CHECK(s.prompt_tokens == 4);
  CHECK(s.generated == 50);
  CHECK(target.forwards - forwards_before == s.steps + 1);  // one prefill + one per step
  CHECK(s.drafted <= 4 * s.steps);
  CHECK(s.accepted <= s.drafted);
  CHECK(s.accepted + s.steps >= s.generated);  // each step emits accepted + 1 (minus stops)
  CHECK(s.max_tree_size == 4);
  REQUIRE(s.drafted_at_depth.size() == 4);
  REQUIRE(s.accepted_at_depth.size() == 4);
  // Every step drafts, except possibly the last, whose chain is cut to the tokens still allowed.
  CHECK(s.drafted_at_depth[0] + 1 >= s.steps);
  std::size_t sum = 0;
  for (std::size_t d = 0; d < 4; ++d) {
    CHECK(s.accepted_at_depth[d] <= s.drafted_at_depth[d]);
    if (d > 0) CHECK(s.accepted_at_depth[d] <= s.accepted_at_depth[d - 1]);
    sum += s.accepted_at_depth[d];
  }
  CHECK(sum == s.accepted);
  CHECK(s.mean_accepted_length() ==
        doctest::Approx(static_cast<double>(s.accepted + s.steps) / static_cast<double>(s.steps)));
  CHECK(s.prefill_seconds >= 0.0);
  CHECK(s.propose_seconds > 0.0);
  CHECK(s.score_seconds > 0.0);
  CHECK(s.verify_seconds > 0.0);
  CHECK(s.commit_seconds > 0.0);
  // The phases are timed back to back inside the request, in ticks converted at the rate measured
  // over the same interval: together they cannot exceed the request's wall time.
  double const phases =
      s.prefill_seconds + s.propose_seconds + s.score_seconds + s.verify_seconds + s.commit_seconds;
  CHECK(s.total_seconds >= phases * (1.0 - 1e-9));
  CHECK(phases > 0.0);
}

TEST_CASE("max_new_tokens = 0 returns at once: no prefill, no proposer call, no token") {
  toy::toy_lm target(vocab, context);
  struct counting_proposer {
    std::size_t calls = 0;
    void begin(std::span<sd::token_id const>) { ++calls; }
    void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
      ++calls;
      tree.reset(ctx.tokens.back());
    }
    void accept(sd::verify_result const&) { ++calls; }
  } p;
  sd::decode_config c;
  c.max_new_tokens = 0;
  sd::speculative_decoder sp(target, p, sd::greedy_verifier{}, sd::greedy{}, c);
  sd::autoregressive_decoder<toy::toy_lm, sd::greedy> ar(target, sd::greedy{}, c);
  std::vector<sd::token_id> const prompt{1, 5, 9, 5, 9};
  std::size_t callbacks = 0;
  sd::token_callback const on_token = [&](sd::token_id) {
    ++callbacks;
    return true;
  };
  auto const check_empty = [&](sd::decode_result const& r) {
    CHECK(r.tokens.empty());
    CHECK(r.reason == sd::finish_reason::max_tokens);
    CHECK(r.stop_index == 0);
    CHECK(r.stats.steps == 0);
    CHECK(r.stats.prompt_tokens == prompt.size());
  };
  std::size_t const forwards = target.forwards;
  // A result reused after a request that emitted tokens and stopped otherwise is reset.
  sd::decode_result r;
  r.tokens = {3, 4};
  r.reason = sd::finish_reason::stop_sequence;
  r.stop_index = 1;
  sp.generate(prompt, r, on_token);
  check_empty(r);
  r.tokens = {3, 4};
  r.reason = sd::finish_reason::eos;
  ar.generate(prompt, r, on_token);
  check_empty(r);
  check_empty(sp.generate(prompt));
  check_empty(ar.generate(prompt));
  CHECK(target.forwards == forwards);
  CHECK(p.calls == 0);
  CHECK(callbacks == 0);
  // The prompt is still checked.
  std::vector<sd::token_id> const bad{1, static_cast<sd::token_id>(vocab)};
  CHECK_THROWS_AS((void)sp.generate(bad), sd::error);
  CHECK_THROWS_AS((void)ar.generate(bad), sd::error);
  // The next request with tokens to generate runs normally.
  sp.config().max_new_tokens = 5;
  ar.config().max_new_tokens = 5;
  auto const s5 = sp.generate(prompt);
  CHECK(s5.tokens.size() == 5);
  CHECK(s5.tokens == ar.generate(prompt).tokens);
  CHECK(p.calls > 0);
}

TEST_CASE("chains are not drafted beyond the tokens still allowed") {
  toy::toy_lm target(vocab, context);
  toy::toy_lm draft(vocab, context, 7, 6.0f, 0.8f);
  sd::draft_model_proposer dm(draft, target, sd::greedy{}, {.k = 6});
  sd::decode_config c;
  std::vector<sd::token_id> const prompt{1, 4, 6, 8};
  for (std::size_t n : {1u, 2u, 3u, 5u}) {
    c.max_new_tokens = n;
    sd::speculative_decoder sp(target, dm, sd::greedy_verifier{}, sd::greedy{}, c);
    auto const r = sp.generate(prompt);
    CHECK(r.tokens.size() == n);
    CHECK(r.stats.max_tree_size <= n - 1);
  }
}

TEST_CASE("bad prompts and configurations are errors") {
  toy::toy_lm target(vocab, context);
  null_proposer p;
  sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{});
  std::vector<sd::token_id> const empty;
  CHECK_THROWS_AS((void)dec.generate(empty), sd::error);
  std::vector<sd::token_id> const bad{1, static_cast<sd::token_id>(vocab)};
  CHECK_THROWS_AS((void)dec.generate(bad), sd::error);
  std::vector<sd::token_id> const negative{1, -3};
  CHECK_THROWS_AS((void)dec.generate(negative), sd::error);
  sd::decode_config c;
  c.eos_tokens = {static_cast<sd::token_id>(vocab)};
  CHECK_THROWS_AS((sd::speculative_decoder(target, p, sd::greedy_verifier{}, sd::greedy{}, c)),
                  sd::error);
  c = {};
  c.max_draft_nodes = sd::max_tree_nodes;
  CHECK_THROWS_AS((sd::speculative_decoder(target, p, sd::greedy_verifier{}, sd::greedy{}, c)),
                  sd::error);
  c = {};
  c.stop_sequences = {{}};
  CHECK_THROWS_AS((sd::speculative_decoder(target, p, sd::greedy_verifier{}, sd::greedy{}, c)),
                  sd::error);

  // A proposer that drafts more than allowed, or under the wrong root.
  struct greedy_proposer {
    int mode = 0;
    void begin(std::span<sd::token_id const>) {}
    void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
      tree.reset(mode == 0 ? ctx.tokens.back() : (ctx.tokens.back() + 1) % 24);
      if (mode == 0)
        for (std::size_t i = 0; i <= ctx.max_nodes; ++i)
          tree.add_node(static_cast<sd::node_index>(i), 1);
    }
    void accept(sd::verify_result const&) {}
  } g;
  sd::decode_config small;
  small.max_draft_nodes = 3;
  sd::speculative_decoder d2(target, g, sd::greedy_verifier{}, sd::greedy{}, small);
  std::vector<sd::token_id> const prompt{1, 2};
  CHECK_THROWS_AS((void)d2.generate(prompt), sd::error);
  g.mode = 1;
  CHECK_THROWS_AS((void)d2.generate(prompt), sd::error);
}
