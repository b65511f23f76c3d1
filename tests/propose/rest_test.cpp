// rest_proposer: the drafted tree equals the documented rule computed by brute force (longest
// match by scanning, evenly spaced occurrences in suffix order, a trie of counts, the most
// frequent prefixes kept, children by frequency); budgets, no-match and bad-id contexts.
#include "specdec/propose/rest.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "propose/context.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/error.hpp"

namespace sd = specdec;

namespace {

constexpr std::uint32_t separator = sd::rest_datastore::separator;

static_assert(sd::proposer<sd::rest_proposer>);
static_assert(sd::produces_trees_v<sd::rest_proposer>);
static_assert(!sd::samples_drafts_v<sd::rest_proposer>);
static_assert(!sd::needs_target_hidden_v<sd::rest_proposer>);

using propose_test::make_ctx;

using path = std::vector<sd::token_id>;

// The documented rule by brute force. Returns the tree as (tokens, parents).
std::pair<std::vector<sd::token_id>, std::vector<sd::node_index>> brute_force(
    std::vector<std::uint32_t> const& corpus, std::size_t vocab,
    std::vector<sd::token_id> const& ctx, sd::rest_config const& c, std::size_t max_nodes) {
  std::vector<sd::token_id> tokens{ctx.back()};
  std::vector<sd::node_index> parents{-1};
  // 1. Longest valid suffix in [n_min, n_max] with an occurrence.
  std::size_t len = 0;
  std::vector<std::uint32_t> occ;
  for (std::size_t l = std::min(c.n_max, ctx.size()); l >= c.n_min && l >= 1; --l) {
    bool valid = true;
    for (std::size_t k = ctx.size() - l; k < ctx.size(); ++k)
      valid = valid && ctx[k] >= 0 && static_cast<std::size_t>(ctx[k]) < vocab;
    if (!valid) continue;
    occ.clear();
    for (std::size_t p = 0; p + l <= corpus.size(); ++p) {
      bool ok = true;
      for (std::size_t k = 0; k < l && ok; ++k)
        ok = corpus[p + k] == static_cast<std::uint32_t>(ctx[ctx.size() - l + k]);
      if (ok) occ.push_back(static_cast<std::uint32_t>(p));
    }
    if (!occ.empty()) {
      len = l;
      break;
    }
  }
  if (len == 0) return {tokens, parents};
  // 2. Suffix order (separator above tokens, end of corpus below everything).
  auto key = [&](std::uint32_t p) {
    std::vector<std::uint64_t> k;
    for (std::size_t i = p; i < corpus.size(); ++i)
      k.push_back(corpus[i] == separator ? std::uint64_t{1} << 40 : corpus[i]);
    return k;
  };
  std::sort(occ.begin(), occ.end(),
            [&](std::uint32_t a, std::uint32_t b) { return key(a) < key(b); });
  std::size_t const count = occ.size(), samples = std::min(count, c.max_occurrences);
  // 3-4. Continuations and prefix counts.
  std::map<path, std::size_t> counts;
  for (std::size_t j = 0; j < samples; ++j) {
    std::size_t const idx = samples == count ? j : j * count / samples;
    path pref;
    for (std::size_t d = 0; d < c.depth; ++d) {
      std::size_t const at = occ[idx] + len + d;
      if (at >= corpus.size() || corpus[at] == separator) break;
      pref.push_back(static_cast<sd::token_id>(corpus[at]));
      ++counts[pref];
    }
  }
  // 5. Keep the budget best by (count desc, depth asc, path asc).
  std::vector<std::pair<path, std::size_t>> nodes(counts.begin(), counts.end());
  std::sort(nodes.begin(), nodes.end(), [](auto const& a, auto const& b) {
    if (a.second != b.second) return a.second > b.second;
    if (a.first.size() != b.first.size()) return a.first.size() < b.first.size();
    return a.first < b.first;
  });
  std::size_t const budget = std::min(c.max_nodes, max_nodes);
  if (nodes.size() > budget) nodes.resize(budget);
  // 6. Emit in that order.
  std::map<path, sd::node_index> index{{path{}, 0}};
  for (auto const& [p, cnt] : nodes) {
    path parent(p.begin(), p.end() - 1);
    REQUIRE(index.count(parent) == 1);  // the kept nodes form a tree
    parents.push_back(index[parent]);
    tokens.push_back(p.back());
    index[p] = static_cast<sd::node_index>(tokens.size() - 1);
  }
  return {tokens, parents};
}

std::vector<std::uint32_t> random_corpus(std::mt19937_64& rng, std::size_t n, std::size_t vocab) {
  std::vector<std::uint32_t> c(n);
  std::geometric_distribution<std::size_t> geo(0.35);
  for (auto& v : c)
    v = rng() % 41 == 0 ? separator : static_cast<std::uint32_t>(std::min(geo(rng), vocab - 1));
  for (std::size_t k = 0; k < n / 30; ++k) {  // repeated stretches
    std::size_t const len = 4 + rng() % 12, from = rng() % (n - len), to = rng() % (n - len);
    std::copy_n(c.begin() + static_cast<std::ptrdiff_t>(from), len,
                c.begin() + static_cast<std::ptrdiff_t>(to));
  }
  c.push_back(separator);
  return c;
}

}  // namespace

TEST_CASE("rest_proposer: drafts exactly the documented rule (brute force)") {
  std::mt19937_64 rng(11);
  for (std::size_t const vocab : {4u, 30u, 100000u}) {
    auto const corpus = random_corpus(rng, 3000, vocab);
    auto const ds =
        std::make_shared<sd::rest_datastore const>(sd::rest_datastore::build(vocab, corpus));
    for (int trial = 0; trial < 120; ++trial) {
      sd::rest_config c;
      c.n_max = 1 + rng() % 10;
      c.n_min = 1 + rng() % std::min<std::size_t>(c.n_max, 3);
      c.max_occurrences = 1 + rng() % 40;
      c.depth = 1 + rng() % 6;
      c.max_nodes = 1 + rng() % 30;
      std::size_t const max_nodes = rng() % 40;
      std::vector<sd::token_id> ctx;
      std::size_t const from = rng() % (corpus.size() - 16);
      for (std::size_t k = 0; k < 16; ++k)
        ctx.push_back(corpus[from + k] == separator ? 0
                                                    : static_cast<sd::token_id>(corpus[from + k]));
      if (trial % 4 == 0) ctx.back() = static_cast<sd::token_id>(rng() % vocab);
      if (trial % 9 == 0) ctx[ctx.size() - 2] = static_cast<sd::token_id>(vocab);  // an unknown id
      CAPTURE(vocab);
      CAPTURE(trial);
      sd::rest_proposer p(ds, c);
      sd::draft_tree tree(64);
      p.propose(make_ctx(ctx, max_nodes), tree);
      auto const [tokens, parents] = brute_force(corpus, vocab, ctx, c, max_nodes);
      CHECK(std::vector<sd::token_id>(tree.tokens().begin(), tree.tokens().end()) == tokens);
      CHECK(std::vector<sd::node_index>(tree.parents().begin(), tree.parents().end()) == parents);
      CHECK(tree.num_drafted() <= std::min(c.max_nodes, max_nodes));
      CHECK(static_cast<std::size_t>(tree.max_depth()) <= c.depth);
    }
  }
}

TEST_CASE("rest_proposer: frequent continuations first, budgets, no match") {
  // Document "1 2 3 4" three times, "1 2 5" once, "1 6" once.
  sd::rest_datastore_builder b(10);
  std::vector<sd::token_id> const a{1, 2, 3, 4}, bb{1, 2, 5}, cc{1, 6};
  for (int i = 0; i < 3; ++i) b.add(a);
  b.add(bb);
  b.add(cc);
  auto const ds = std::make_shared<sd::rest_datastore const>(b.build());
  sd::rest_proposer p(ds, {.n_max = 4, .depth = 3, .max_nodes = 16});
  sd::draft_tree tree(32);
  std::vector<sd::token_id> const ctx{7, 1};
  p.propose(make_ctx(ctx, 16), tree);
  // Root 1; children 2 (count 4) then 6 (count 1); under 2: 3 (3) then 5 (1); under 3: 4.
  CHECK(p.last_match().length == 1);
  CHECK(p.last_match().count() == 5);
  std::vector<sd::token_id> const want_tokens{1, 2, 3, 4, 6, 5};
  std::vector<sd::node_index> const want_parents{-1, 0, 1, 2, 0, 1};
  CHECK(std::vector<sd::token_id>(tree.tokens().begin(), tree.tokens().end()) == want_tokens);
  CHECK(std::vector<sd::node_index>(tree.parents().begin(), tree.parents().end()) == want_parents);
  CHECK(tree.first_child(0) == 1);
  CHECK(tree.next_sibling(1) == 4);

  // A budget of 2 keeps the two most frequent prefixes: "2" and "2 3".
  p.propose(make_ctx(ctx, 2), tree);
  CHECK(tree.num_drafted() == 2);
  CHECK(tree.token(1) == 2);
  CHECK(tree.token(2) == 3);
  // Budget 0, unknown ids and no match: the root alone.
  p.propose(make_ctx(ctx, 0), tree);
  CHECK(tree.size() == 1);
  std::vector<sd::token_id> const none{9};
  p.propose(make_ctx(none, 8), tree);
  CHECK(tree.size() == 1);
  CHECK(tree.root() == 9);
  std::vector<sd::token_id> const outside{1, 2, 12};
  p.propose(make_ctx(outside, 8), tree);
  CHECK(tree.size() == 1);
  // The longest suffix wins: "2 3" -> "4" only.
  std::vector<sd::token_id> const longer{2, 3};
  p.propose(make_ctx(longer, 8), tree);
  CHECK(p.last_match().length == 2);
  REQUIRE(tree.size() == 2);
  CHECK(tree.token(1) == 4);
  // The tree capacity bounds the budget too.
  sd::draft_tree small(3);
  p.propose(make_ctx(ctx, 16), small);
  CHECK(small.num_drafted() == 2);

  CHECK_THROWS_AS(sd::rest_proposer(nullptr), sd::error);
  CHECK_THROWS_AS(sd::rest_proposer(ds, {.n_max = 0}), sd::error);
  CHECK_THROWS_AS(sd::rest_proposer(ds, {.n_max = 2, .n_min = 3}), sd::error);
  CHECK_THROWS_AS(sd::rest_proposer(ds, {.depth = 0}), sd::error);
  CHECK_THROWS_AS(sd::rest_proposer(ds, {.max_nodes = 0}), sd::error);
  std::vector<sd::token_id> const empty;
  CHECK_THROWS_AS(p.propose(make_ctx(empty, 4), tree), sd::error);
}
