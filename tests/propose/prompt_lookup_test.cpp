// prompt_lookup_proposer: the incremental n-gram index drafts exactly what a brute-force scan of
// the history drafts, for random sequences and configurations; budgets, trees and resyncs.
#include "specdec/propose/prompt_lookup.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "propose/context.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"

namespace sd = specdec;

namespace {

using propose_test::make_ctx;

static_assert(sd::proposer<sd::prompt_lookup_proposer>);
static_assert(sd::produces_trees_v<sd::prompt_lookup_proposer>);
static_assert(!sd::samples_drafts_v<sd::prompt_lookup_proposer>);
static_assert(!sd::needs_target_hidden_v<sd::prompt_lookup_proposer>);

// The draft shape is a template parameter whose value sets `produces_trees`; the default (and
// `prompt_lookup_proposer`) drafts trees.
static_assert(std::is_same_v<sd::prompt_lookup_proposer, sd::basic_prompt_lookup_proposer<>>);
static_assert(std::is_same_v<sd::prompt_lookup_proposer,
                             sd::basic_prompt_lookup_proposer<sd::draft_shape::tree>>);
static_assert(std::is_same_v<sd::prompt_lookup_chain_proposer,
                             sd::basic_prompt_lookup_proposer<sd::draft_shape::chain>>);
static_assert(sd::proposer<sd::prompt_lookup_chain_proposer>);
static_assert(!sd::produces_trees_v<sd::prompt_lookup_chain_proposer>);
static_assert(!sd::samples_drafts_v<sd::prompt_lookup_chain_proposer>);
static_assert(!sd::needs_target_hidden_v<sd::prompt_lookup_chain_proposer>);
static_assert(!sd::has_auxiliary_tokens_v<sd::prompt_lookup_chain_proposer>);
// Pairing: a chains-only verifier takes the chain proposer, not the tree one.
static_assert(
    sd::compatible_v<sd::prompt_lookup_chain_proposer, sd::speculative_sampling_verifier>);
static_assert(!sd::compatible_v<sd::prompt_lookup_proposer, sd::speculative_sampling_verifier>);
static_assert(sd::compatible_v<sd::prompt_lookup_chain_proposer, sd::greedy_verifier>);
static_assert(sd::compatible_v<sd::prompt_lookup_chain_proposer, sd::tree_verifier>);
static_assert(sd::compatible_v<sd::prompt_lookup_proposer, sd::greedy_verifier>);
static_assert(sd::compatible_v<sd::prompt_lookup_proposer, sd::tree_verifier>);

// The documented rule, by brute force over the whole history.
sd::draft_tree brute_force(std::vector<sd::token_id> const& h, sd::prompt_lookup_config const& c,
                           std::size_t max_nodes) {
  sd::draft_tree tree(max_nodes + 1);
  tree.reset(h.back());
  std::size_t const L = h.size();
  for (std::size_t n = c.n_max; n >= c.n_min; --n) {
    if (n < L) {
      struct cand {
        std::size_t start, length;
      };
      std::vector<cand> cands;
      for (std::size_t s = L - n; s-- > 0;) {  // most recent first; s + n < L
        if (!std::equal(h.begin() + static_cast<std::ptrdiff_t>(s),
                        h.begin() + static_cast<std::ptrdiff_t>(s + n),
                        h.begin() + static_cast<std::ptrdiff_t>(L - n)))
          continue;
        if (cands.size() == c.max_candidates) break;
        cands.push_back({s + n, std::min(c.k, L - (s + n))});
      }
      std::stable_sort(cands.begin(), cands.end(),
                       [](cand const& a, cand const& b) { return a.length > b.length; });
      if (!cands.empty()) {
        std::size_t branches = 0;
        for (auto const& cd : cands) {
          sd::node_index at = 0;
          bool added = false;
          for (std::size_t j = 0; j < cd.length; ++j) {
            sd::node_index child = tree.find_child(at, h[cd.start + j]);
            if (child < 0) {
              if (tree.num_drafted() >= max_nodes) break;
              child = tree.add_node(at, h[cd.start + j]);
              added = true;
            }
            at = child;
          }
          if (added && ++branches >= c.max_branches) break;
          if (tree.num_drafted() >= max_nodes) break;
        }
        return tree;
      }
    }
    if (n == 1) break;
  }
  return tree;
}

void check_same(sd::draft_tree const& a, sd::draft_tree const& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto const n = static_cast<sd::node_index>(i);
    CHECK(a.token(n) == b.token(n));
    CHECK(a.parent(n) == b.parent(n));
  }
}

}  // namespace

TEST_CASE("prompt lookup drafts what a brute-force scan drafts, incrementally") {
  sd::philox rng(42);
  for (int trial = 0; trial < 300; ++trial) {
    CAPTURE(trial);
    sd::prompt_lookup_config c;
    c.n_max = 1 + rng.next_u32() % 4;
    c.n_min = 1 + rng.next_u32() % c.n_max;
    c.k = 1 + rng.next_u32() % 6;
    c.max_branches = 1 + rng.next_u32() % 3;
    c.max_candidates = trial % 3 == 0 ? 2 : 64;
    std::uint32_t const vocab = 2 + rng.next_u32() % 5;  // small vocabularies repeat a lot
    sd::prompt_lookup_proposer p(c);
    std::vector<sd::token_id> h;
    std::size_t const prompt = 1 + rng.next_u32() % 20;
    for (std::size_t i = 0; i < prompt; ++i)
      h.push_back(static_cast<sd::token_id>(rng.next_u32() % vocab));
    p.begin(h);
    sd::draft_tree tree(17);
    for (int step = 0; step < 30; ++step) {
      std::size_t const max_nodes = rng.next_u32() % 17;
      sd::propose_context ctx = make_ctx(h, max_nodes, &rng);
      p.propose(ctx, tree);
      CAPTURE(step);
      check_same(tree, brute_force(h, c, max_nodes));
      CHECK(tree.num_drafted() <= max_nodes);
      CHECK(!tree.has_q());
      if (c.max_branches == 1) CHECK(tree.is_chain());
      // Commit 1..4 tokens: sometimes the drafted path, sometimes random tokens.
      std::size_t const commit = 1 + rng.next_u32() % 4;
      sd::node_index at = 0;
      for (std::size_t i = 0; i < commit; ++i) {
        sd::node_index const child = tree.first_child(at);
        if (child >= 0 && rng.next_u32() % 3 != 0) {
          h.push_back(tree.token(child));
          at = child;
        } else {
          h.push_back(static_cast<sd::token_id>(rng.next_u32() % vocab));
          at = -1;
          break;
        }
      }
      p.accept(sd::verify_result{});
      CHECK(p.history_size() <= h.size());
    }
  }
}

TEST_CASE("prompt lookup: chains, trees, budgets, no match") {
  // 1 2 3 4 | 1 2 3 5 | 1 2 3 : the trigram "1 2 3" was followed by 4 and by 5.
  std::vector<sd::token_id> const h{1, 2, 3, 4, 9, 1, 2, 3, 5, 8, 1, 2, 3};
  sd::draft_tree tree(32);
  sd::propose_context ctx = make_ctx(h, 31);

  SUBCASE("chain: the most recent full-length continuation") {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 3});
    p.begin(h);
    p.propose(ctx, tree);
    REQUIRE(tree.size() == 4);
    CHECK(tree.root() == 3);
    CHECK(tree.token(1) == 5);
    CHECK(tree.token(2) == 8);
    CHECK(tree.token(3) == 1);
  }
  SUBCASE("tree: both continuations") {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 2, .max_branches = 4});
    p.begin(h);
    p.propose(ctx, tree);
    REQUIRE(tree.size() == 5);
    CHECK(tree.num_children(0) == 2);
    CHECK(tree.token(1) == 5);
    CHECK(tree.token(2) == 8);
    CHECK(tree.token(3) == 4);
    CHECK(tree.token(4) == 9);
  }
  SUBCASE("the node budget cuts the tree") {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 4, .max_branches = 4});
    p.begin(h);
    ctx.max_nodes = 5;
    p.propose(ctx, tree);
    CHECK(tree.num_drafted() == 5);
    ctx.max_nodes = 0;
    p.propose(ctx, tree);
    CHECK(tree.size() == 1);
  }
  SUBCASE("the tree's capacity bounds the draft too") {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 8, .max_branches = 4});
    p.begin(h);
    sd::draft_tree small(3);
    p.propose(ctx, small);
    CHECK(small.size() == 3);
  }
  SUBCASE("no match drafts nothing") {
    std::vector<sd::token_id> const fresh{1, 2, 3, 4, 5, 6};
    sd::prompt_lookup_proposer p;
    p.begin(fresh);
    p.propose(make_ctx(fresh, 8), tree);
    CHECK(tree.size() == 1);
    CHECK(tree.root() == 6);
    std::vector<sd::token_id> const one{7};
    p.begin(one);
    p.propose(make_ctx(one, 8), tree);
    CHECK(tree.size() == 1);
  }
  SUBCASE("q rows left over in a reused tree are dropped") {
    tree.enable_q(16);
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 3});
    p.begin(h);
    p.propose(ctx, tree);
    CHECK(!tree.has_q());
  }
  SUBCASE("a history that does not extend the indexed one is re-indexed") {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 3});
    p.begin(h);
    p.propose(ctx, tree);
    std::vector<sd::token_id> other{7, 7, 6, 7, 7};  // no begin(): a different sequence
    p.propose(make_ctx(other, 8), tree);
    REQUIRE(tree.size() >= 2);
    CHECK(tree.token(1) == 6);
    CHECK(p.history_size() == other.size());
  }
}

TEST_CASE("prompt lookup, chain shape: the drafts of the tree shape with one branch") {
  sd::philox rng(17);
  for (int trial = 0; trial < 100; ++trial) {
    CAPTURE(trial);
    sd::prompt_lookup_config c;
    c.n_max = 1 + rng.next_u32() % 4;
    c.n_min = 1 + rng.next_u32() % c.n_max;
    c.k = 1 + rng.next_u32() % 6;
    std::uint32_t const vocab = 2 + rng.next_u32() % 5;
    sd::prompt_lookup_chain_proposer chain(c);
    sd::prompt_lookup_proposer tree_shape(c);
    std::vector<sd::token_id> h;
    for (std::size_t i = 0, n = 1 + rng.next_u32() % 40; i < n; ++i)
      h.push_back(static_cast<sd::token_id>(rng.next_u32() % vocab));
    chain.begin(h);
    tree_shape.begin(h);
    sd::draft_tree a(17), b(17);
    for (int step = 0; step < 10; ++step) {
      std::size_t const max_nodes = rng.next_u32() % 17;
      chain.propose(make_ctx(h, max_nodes), a);
      tree_shape.propose(make_ctx(h, max_nodes), b);
      check_same(a, b);
      CHECK(a.is_chain());
      h.push_back(static_cast<sd::token_id>(rng.next_u32() % vocab));
    }
  }
  CHECK_THROWS_AS(sd::prompt_lookup_chain_proposer({.max_branches = 2}), sd::error);
  CHECK_NOTHROW(sd::prompt_lookup_chain_proposer({.max_branches = 1}));
}

TEST_CASE("prompt lookup: configuration errors") {
  CHECK_THROWS_AS(sd::prompt_lookup_proposer({.n_max = 2, .n_min = 3}), sd::error);
  CHECK_THROWS_AS(sd::prompt_lookup_proposer({.n_max = 17, .n_min = 1}), sd::error);
  CHECK_THROWS_AS(sd::prompt_lookup_proposer({.n_max = 3, .n_min = 0}), sd::error);
  CHECK_THROWS_AS(sd::prompt_lookup_proposer({.n_max = 3, .n_min = 1, .k = 0}), sd::error);
  CHECK_THROWS_AS(sd::prompt_lookup_proposer({.n_max = 3, .n_min = 1, .k = 2, .max_branches = 0}),
                  sd::error);
  CHECK_THROWS_AS(sd::prompt_lookup_proposer(
                      {.n_max = 3, .n_min = 1, .k = 2, .max_branches = 1, .max_candidates = 0}),
                  sd::error);
  sd::prompt_lookup_proposer p;
  sd::draft_tree tree;
  CHECK_THROWS_AS(p.propose(make_ctx({}, 4), tree), sd::error);
}

TEST_CASE("prompt lookup: a long repetitive history stays consistent as the index grows") {
  // Grows the hash tables many times; every step still equals the brute force.
  sd::prompt_lookup_config const c{.n_max = 4, .n_min = 2, .k = 5, .max_branches = 2};
  sd::prompt_lookup_proposer p(c);
  std::vector<sd::token_id> h{0};
  p.begin(h);
  sd::philox rng(5);
  sd::draft_tree tree(12);
  for (int i = 0; i < 3000; ++i) {
    h.push_back(static_cast<sd::token_id>(rng.next_u32() % 50 < 45
                                              ? static_cast<std::uint32_t>(h.back() * 7 + 3) % 31
                                              : rng.next_u32() % 400));
    if (i % 100 == 99) {
      p.propose(make_ctx(h, 11), tree);
      check_same(tree, brute_force(h, c, 11));
    }
  }
}
