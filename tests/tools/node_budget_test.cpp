// The node budgets specdec-generate relies on: every proposer of include/specdec/propose reports,
// in `max_nodes()`, the most draft nodes its tree can hold per step under its configuration, so
// that the decoder (and the command line) need no budget of their own. Checked by proposing with
// no outside limit (ctx.max_nodes and the tree's capacity at their largest) on histories built to
// fill each proposer's tree, and through the decoder, whose steps stay within the budget and
// within decode_config::max_draft_nodes when that cap is set.
#include "support/doctest.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/load.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/jacobi.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/lookahead.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/propose/rest.hpp"
#include "specdec/propose/rest_datastore.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "tools/fixture.hpp"

namespace sd = specdec;

namespace {

// `branches` continuations of `length` distinct tokens, each after token 1, then token 1 again:
// every n-gram lookup of "1" finds `branches` full-length continuations with distinct first
// tokens.
std::vector<sd::token_id> branching_history(std::size_t branches, std::size_t length) {
  std::vector<sd::token_id> h;
  sd::token_id next = 10;
  for (std::size_t b = 0; b < branches; ++b) {
    h.push_back(1);
    for (std::size_t i = 0; i < length; ++i) h.push_back(next++);
  }
  h.push_back(1);
  return h;
}

// Drafts once from `history` with no outside limit and returns the number of nodes drafted.
template <class Proposer>
std::size_t draft_unlimited(Proposer& p, std::span<sd::token_id const> history,
                            sd::target_handle const* target = nullptr) {
  sd::draft_tree tree(sd::max_tree_nodes);
  sd::philox rng(1, 0, 0);
  p.begin(history);
  sd::propose_context ctx;
  ctx.tokens = history;
  ctx.max_nodes = sd::max_tree_nodes - 1;
  ctx.rng = &rng;
  ctx.target = target;
  p.propose(ctx, tree);
  return tree.num_drafted();
}

// A greedy decode of the fixture from "Once upon a time" with `proposer` (and `cap`, if any).
template <class Proposer>
sd::decode_result decode(sd::cpu_llama& target, Proposer& proposer,
                         std::optional<std::size_t> cap = std::nullopt) {
  sd::decode_config config;
  config.max_new_tokens = 48;
  config.max_draft_nodes = cap;
  sd::speculative_decoder decoder(target, proposer, sd::greedy_verifier{}, sd::greedy{}, config);
  std::vector<sd::token_id> const prompt{1, 403, 407, 261, 378};
  return decoder.generate(prompt);
}

std::shared_ptr<sd::llama_weights const> fixture_weights() {
  static auto const w =
      std::make_shared<sd::llama_weights const>(sd::load_model(tools_test::model()));
  return w;
}

}  // namespace

TEST_CASE("node budget: prompt lookup drafts at most k x max_branches nodes") {
  for (auto const& [k, branches] :
       {std::pair<std::size_t, std::size_t>{1, 1}, {3, 1}, {3, 4}, {5, 7}, {4, 40}}) {
    CAPTURE(k);
    CAPTURE(branches);
    sd::prompt_lookup_proposer p({.n_max = 1, .n_min = 1, .k = k, .max_branches = branches});
    CHECK(p.max_nodes() == k * branches);
    std::vector<sd::token_id> const history = branching_history(branches + 3, k + 2);
    CHECK(draft_unlimited(p, history) == p.max_nodes());  // the budget is reached, never passed
  }
  sd::prompt_lookup_proposer wide({.k = 100, .max_branches = 100});
  CHECK(wide.max_nodes() == sd::max_tree_nodes - 1);
  sd::prompt_lookup_chain_proposer chain({.k = 6});
  CHECK(chain.max_nodes() == 6);
}

TEST_CASE("node budget: REST drafts at most max_nodes nodes") {
  sd::rest_datastore_builder builder(512);
  for (std::size_t b = 0; b < 40; ++b) {
    std::vector<sd::token_id> const doc = {7, static_cast<sd::token_id>(20 + b),
                                           static_cast<sd::token_id>(100 + b), 3};
    builder.add(doc);
  }
  auto const ds = std::make_shared<sd::rest_datastore const>(builder.build());
  std::vector<sd::token_id> const history = {5, 7};
  for (std::size_t const nodes : {1u, 8u, 32u, 200u}) {
    CAPTURE(nodes);
    sd::rest_proposer p(ds, {.depth = 3, .max_nodes = nodes});
    CHECK(p.max_nodes() == nodes);
    std::size_t const drafted = draft_unlimited(p, history);
    CHECK(drafted <= p.max_nodes());
    CHECK(drafted == std::min<std::size_t>(nodes, 40 * 3));  // the trie has 120 nodes
  }
}

TEST_CASE("node budget: lookahead drafts at most G x (N - 1) nodes") {
  for (auto const& [guesses, ngram] :
       {std::pair<std::size_t, std::size_t>{0, 4}, {1, 2}, {5, 4}, {8, 6}}) {
    CAPTURE(guesses);
    CAPTURE(ngram);
    sd::lookahead_proposer p({.window = 3, .ngram = ngram, .guesses = guesses});
    CHECK(p.max_nodes() == guesses * (ngram - 1));
    // The pool learns the prompt's n-grams: more distinct continuations of 1 than G.
    std::vector<sd::token_id> const history = branching_history(guesses + 3, ngram + 1);
    CHECK(draft_unlimited(p, history) == p.max_nodes());
  }
  sd::lookahead_proposer largest({.window = 1, .ngram = 16, .guesses = 256});
  CHECK(largest.max_nodes() == 256 * 15);
}

TEST_CASE("node budget: Jacobi drafts its block") {
  for (std::size_t const block : {1u, 5u, 40u}) {
    sd::jacobi_proposer p({.block = block});
    CHECK(p.max_nodes() == block);
    std::vector<sd::token_id> const history = {1, 2, 3};
    CHECK(draft_unlimited(p, history) == block);
  }
}

TEST_CASE("node budget: draft model and layer skip draft at most k (k_max when adaptive)") {
  auto const weights = fixture_weights();
  sd::cpu_llama target(weights, {.threads = 1});
  sd::cpu_llama draft(weights, {.threads = 1});
  std::vector<sd::token_id> const tokens = {1, 403, 407, 261, 378};
  std::span<sd::token_id const> const history(tokens);
  for (std::size_t const k : {1u, 3u, 7u}) {
    CAPTURE(k);
    sd::draft_model_proposer p(draft, target, sd::greedy{}, {.k = k});
    CHECK(p.max_nodes() == k);
    CHECK(draft_unlimited(p, history) == k);
  }
  sd::draft_model_proposer adaptive(draft, target, sd::greedy{},
                                    {.k = 2, .adaptive = true, .k_min = 1, .k_max = 6});
  CHECK(adaptive.max_nodes() == 6);
  sd::layer_skip_proposer<sd::greedy> skip(
      {.skip_layers = {2}, .draft = {.k = 4, .adaptive = false}}, sd::greedy{});
  CHECK(skip.max_nodes() == 4);
  {  // on the target, whose cache holds the history but its last token (the root)
    std::vector<sd::position_t> const pos{0, 1, 2, 3};
    sd::forward_result out;
    target.forward({.tokens = history.first(4), .positions = pos}, out);
    sd::target_handle handle(target);
    handle.set_committed(4);
    CHECK(draft_unlimited(skip, history, &handle) == 4);
    target.cache().truncate(0);
  }
  sd::layer_skip_proposer<sd::greedy> adaptive_skip({.skip_layers = {2}}, sd::greedy{});
  CHECK(adaptive_skip.max_nodes() == sd::layer_skip_config{}.draft.k_max);

  // Through the decoder: the steps reach the proposer's budget and stay within it, and within
  // decode_config::max_draft_nodes when set (0: the root alone, plain decoding).
  sd::draft_model_proposer five(draft, target, sd::greedy{}, {.k = 5});
  sd::decode_result const full = decode(target, five);
  CHECK(full.stats.max_tree_size == 5);
  CHECK(decode(target, five, 3).stats.max_tree_size == 3);
  CHECK(decode(target, five, 9).stats.max_tree_size == 5);
  sd::decode_result const none = decode(target, five, 0);
  CHECK(none.stats.drafted == 0);
  CHECK(none.tokens == full.tokens);
  sd::prompt_lookup_proposer lookup({.k = 3, .max_branches = 30});
  sd::decode_result const tree = decode(target, lookup);
  CHECK(tree.stats.max_tree_size <= lookup.max_nodes());
  CHECK(tree.tokens == full.tokens);
  CHECK(decode(target, lookup, 2).stats.max_tree_size <= 2);
}
