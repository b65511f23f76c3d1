// The EAGLE proposer (propose/eagle.hpp) with the CPU head runner on random heads: the dynamic
// tree (EAGLE-2) is exactly the one built from the reference head (reference/eagle.hpp) by the
// rule (expand the K most confident nodes per depth, keep the N most confident candidates); the
// static tree (EAGLE-1) drafts the ranks it lists; after any sequence of partial, full or no
// acceptance the head's cache holds the committed pairs only and the drafted tree equals the one a
// fresh proposer drafts from the whole sequence's true features; errors for rows that do not fit.
#include "specdec/propose/eagle.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "propose/context.hpp"
#include "specdec/backend/cpu/eagle.hpp"
#include "specdec/reference/eagle.hpp"
#include "support/eagle.hpp"
#include "support/errors.hpp"
#include "support/llama_shapes.hpp"

namespace sd = specdec;
using test_support::check_error;

using cpu_eagle = sd::eagle_proposer<sd::cpu_eagle_head>;
static_assert(sd::proposer<cpu_eagle>);
static_assert(sd::produces_trees_v<cpu_eagle>);
static_assert(sd::needs_target_hidden_v<cpu_eagle>);
static_assert(!sd::samples_drafts_v<cpu_eagle>);

namespace {

using path = std::vector<sd::token_id>;

// Every drafted node of `tree` as its path of tokens below the root.
std::vector<path> paths_of(sd::draft_tree const& tree) {
  std::vector<path> out;
  for (sd::node_index i = 1; static_cast<std::size_t>(i) < tree.size(); ++i) {
    path p;
    for (sd::node_index n = i; n > 0; n = tree.parent(n)) p.push_back(tree.token(n));
    std::reverse(p.begin(), p.end());
    out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The top k (index, log-probability) of `logits` in double, ties to the lower index.
std::vector<std::pair<std::size_t, double>> top_log_probs(std::vector<double> const& logits,
                                                          std::size_t k) {
  double top = -INFINITY;
  for (double l : logits) top = std::max(top, l);
  double s = 0.0;
  for (double l : logits) s += std::exp(l - top);
  double const lse = top + std::log(s);
  std::vector<std::size_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  std::vector<std::pair<std::size_t, double>> out;
  for (std::size_t i = 0; i < k; ++i) out.push_back({order[i], logits[order[i]] - lse});
  return out;
}

// The EAGLE-2 tree of `cfg` after the committed `tokens`, from the reference head in double: the
// paths of the N most confident candidates (see the file comment).
std::vector<path> reference_dynamic_tree(sd::eagle_weights const& w,
                                         std::vector<sd::token_id> const& tokens,
                                         sd::eagle_tree_config cfg) {
  std::size_t const t = tokens.size(), f = w.feature_width();
  std::vector<float> const features = test_support::target_features(w, tokens);
  std::vector<sd::reference_eagle_entry> entries;
  for (std::size_t j = 0; j + 1 < t; ++j) {
    sd::reference_eagle_entry e;
    e.feature.assign(features.begin() + static_cast<std::ptrdiff_t>(j * f),
                     features.begin() + static_cast<std::ptrdiff_t>((j + 1) * f));
    e.token = tokens[j + 1];
    e.position = static_cast<sd::position_t>(j);
    for (std::size_t k = 0; k < j; ++k) e.visible.push_back(k);
    entries.push_back(e);
  }
  auto const map = [&](std::size_t i) {
    return w.draft_to_target.empty() ? static_cast<sd::token_id>(i) : w.draft_to_target[i];
  };
  struct cand {
    path p;
    double score;
    std::int64_t entry;  // the entry whose output predicts its children (after expansion)
    std::vector<std::size_t> ancestors;
  };
  std::vector<cand> all;
  auto outs = sd::reference_eagle_outputs(w, entries);
  std::size_t const root_entry = entries.size() - 1;
  std::vector<std::size_t> level;
  for (auto const& [i, lp] :
       top_log_probs(sd::reference_eagle_logits(w, outs[root_entry]), cfg.top_k)) {
    all.push_back({{map(i)}, lp, -1, {}});
    level.push_back(all.size() - 1);
  }
  for (std::size_t depth = 1; depth < cfg.depth; ++depth) {
    std::vector<std::size_t> order = level;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return all[a].score > all[b].score; });
    order.resize(std::min(order.size(), cfg.top_k));
    std::vector<std::size_t> next;
    for (std::size_t c : order) {
      sd::reference_eagle_entry e;
      std::size_t parent_entry = all[c].ancestors.empty() ? root_entry : all[c].ancestors.back();
      e.input = static_cast<std::int64_t>(parent_entry);
      e.token = all[c].p.back();
      e.position = static_cast<sd::position_t>(t - 2 + depth);
      for (std::size_t k = 0; k + 1 < t; ++k) e.visible.push_back(k);
      for (std::size_t a : all[c].ancestors) e.visible.push_back(a);
      entries.push_back(e);
      all[c].entry = static_cast<std::int64_t>(entries.size() - 1);
    }
    outs = sd::reference_eagle_outputs(w, entries);
    for (std::size_t c : order) {
      auto const e = static_cast<std::size_t>(all[c].entry);
      for (auto const& [i, lp] : top_log_probs(sd::reference_eagle_logits(w, outs[e]), cfg.top_k)) {
        cand child{all[c].p, all[c].score + lp, -1, all[c].ancestors};
        child.p.push_back(map(i));
        child.ancestors.push_back(e);
        all.push_back(child);
        next.push_back(all.size() - 1);
      }
    }
    level = next;
  }
  std::vector<std::size_t> order(all.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return all[a].score > all[b].score; });
  std::vector<path> out;
  for (std::size_t i = 0; i < std::min(cfg.nodes, order.size()); ++i)
    out.push_back(all[order[i]].p);
  std::sort(out.begin(), out.end());
  return out;
}

// The features of tokens[from, to) (rows of a fresh forward over `tokens`), as a propose_context
// carries them.
struct feature_rows {
  std::vector<float> data;
  sd::matrix_view<float const> view;
  feature_rows(sd::eagle_weights const& w, std::vector<sd::token_id> const& tokens,
               std::size_t from, std::size_t to) {
    std::size_t const f = w.feature_width();
    std::vector<float> const all = test_support::target_features(w, tokens);
    data.assign(all.begin() + static_cast<std::ptrdiff_t>(from * f),
                all.begin() + static_cast<std::ptrdiff_t>(to * f));
    view = sd::matrix_view<float const>(data.data(), to - from, f);
  }
};

std::vector<std::shared_ptr<sd::eagle_weights const>> random_heads() {
  auto const target = test_support::random_target(test_support::shapes::odd_gqa(), 3);
  return {test_support::random_eagle(sd::eagle_version::eagle1, target, 6, 2, 0, {}, 21),
          test_support::random_eagle(sd::eagle_version::eagle3, target, 6, 2, 40, {3, 1, 2}, 22)};
}

}  // namespace

TEST_CASE("eagle proposer: the dynamic tree is EAGLE-2's rule on the reference head") {
  std::vector<sd::token_id> const tokens = {1, 14, 60, 3, 22, 9, 41};
  for (auto const& head : random_heads()) {
    CAPTURE(static_cast<int>(head->config.version));
    for (sd::eagle_tree_config cfg : {sd::eagle_tree_config{.depth = 4, .top_k = 3, .nodes = 12},
                                      sd::eagle_tree_config{.depth = 3, .top_k = 4, .nodes = 40},
                                      sd::eagle_tree_config{.depth = 1, .top_k = 5, .nodes = 3}}) {
      CAPTURE(cfg.depth);
      sd::cpu_eagle_head runner(head);
      cpu_eagle p(runner, cfg);
      CHECK(p.max_nodes() == cfg.nodes);
      p.begin(tokens);
      auto ctx = propose_test::make_ctx(tokens, 64);
      feature_rows const rows(*head, tokens, 0, tokens.size() - 1);
      ctx.target_hidden = rows.view;
      sd::draft_tree tree(65);
      p.propose(ctx, tree);
      CHECK(tree.root() == tokens.back());
      CHECK(tree.num_drafted() == std::min(cfg.nodes, cfg.candidates()));
      CHECK(static_cast<std::size_t>(tree.max_depth()) <= cfg.depth);
      CHECK(paths_of(tree) == reference_dynamic_tree(*head, tokens, cfg));
      CHECK(runner.cache().size() == tokens.size() - 1 + (cfg.depth - 1) * cfg.top_k);
      p.accept({});
      CHECK(runner.cache().size() == tokens.size() - 1);
      // A smaller budget keeps the most confident nodes, ancestors included.
      ctx.target_hidden = {};
      ctx.max_nodes = 2;
      p.propose(ctx, tree);
      auto const want = reference_dynamic_tree(*head, tokens, {cfg.depth, cfg.top_k, 2});
      CHECK(paths_of(tree) == want);
    }
  }
}

TEST_CASE("eagle proposer: the static tree drafts the ranks it lists") {
  std::vector<sd::token_id> const tokens = {1, 7, 33, 2, 50};
  sd::tree_choices const choices = {{0}, {1}, {2}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}, {0, 0, 1}};
  for (auto const& head : random_heads()) {
    sd::cpu_eagle_head runner(head);
    cpu_eagle p(runner, sd::sparse_tree::from_choices(choices));
    CHECK(p.static_tree());
    CHECK(p.max_nodes() == choices.size());
    p.begin(tokens);
    auto ctx = propose_test::make_ctx(tokens, 64);
    feature_rows const rows(*head, tokens, 0, tokens.size() - 1);
    ctx.target_hidden = rows.view;
    sd::draft_tree tree(65);
    p.propose(ctx, tree);
    REQUIRE(tree.num_drafted() == choices.size());
    // Every node is the rank its path lists of the reference logits at its parent: a chain of
    // the nodes' paths recomputed with the reference.
    std::size_t const f = head->feature_width(), t = tokens.size();
    std::vector<sd::reference_eagle_entry> entries;
    for (std::size_t j = 0; j + 1 < t; ++j) {
      sd::reference_eagle_entry e;
      e.feature.assign(rows.data.begin() + static_cast<std::ptrdiff_t>(j * f),
                       rows.data.begin() + static_cast<std::ptrdiff_t>((j + 1) * f));
      e.token = tokens[j + 1];
      e.position = static_cast<sd::position_t>(j);
      for (std::size_t k = 0; k < j; ++k) e.visible.push_back(k);
      entries.push_back(e);
    }
    auto const map = [&](std::size_t i) {
      return head->draft_to_target.empty() ? static_cast<sd::token_id>(i)
                                           : head->draft_to_target[i];
    };
    for (sd::node_index i = 1; static_cast<std::size_t>(i) < tree.size(); ++i) {
      std::vector<sd::node_index> chain;
      for (sd::node_index n = i; n > 0; n = tree.parent(n)) chain.push_back(n);
      std::reverse(chain.begin(), chain.end());
      std::vector<sd::reference_eagle_entry> es = entries;
      std::vector<std::int32_t> ranks;
      for (std::size_t k = 0; k < chain.size(); ++k) {
        // The rank of chain[k] among its siblings = its position among the parent's children.
        std::int32_t r = 0;
        for (sd::node_index c = tree.first_child(tree.parent(chain[k])); c != chain[k];
             c = tree.next_sibling(c))
          ++r;
        ranks.push_back(r);
        if (k + 1 == chain.size()) break;
        sd::reference_eagle_entry e;
        e.input = static_cast<std::int64_t>(es.size() - 1);
        e.token = tree.token(chain[k]);
        e.position = static_cast<sd::position_t>(t - 1 + k);
        for (std::size_t j = 0; j < es.size(); ++j) e.visible.push_back(j);
        es.push_back(e);
      }
      auto const outs = sd::reference_eagle_outputs(*head, es);
      auto const top = top_log_probs(sd::reference_eagle_logits(*head, outs.back()), 8);
      CHECK(tree.token(i) == map(top[static_cast<std::size_t>(ranks.back())].first));
    }
  }
}

TEST_CASE(
    "eagle proposer: after any acceptance the tree equals a fresh one from the true features") {
  std::mt19937_64 rng(99);
  for (auto const& head : random_heads()) {
    CAPTURE(static_cast<int>(head->config.version));
    for (bool dynamic : {true, false}) {
      CAPTURE(dynamic);
      sd::cpu_eagle_head runner(head), fresh_runner(head);
      sd::eagle_tree_config const cfg{.depth = 4, .top_k = 3, .nodes = 10};
      sd::sparse_tree const shape =
          sd::sparse_tree::from_choices({{0}, {1}, {0, 0}, {0, 1}, {1, 0}, {0, 0, 0}});
      cpu_eagle p = dynamic ? cpu_eagle(runner, cfg) : cpu_eagle(runner, shape);
      cpu_eagle fresh = dynamic ? cpu_eagle(fresh_runner, cfg) : cpu_eagle(fresh_runner, shape);
      std::vector<sd::token_id> tokens = {1, 5, 40, 12};
      p.begin(tokens);
      std::size_t from = 0;  // the first token whose feature the next step passes
      std::size_t full = 0, partial = 0, none = 0;
      sd::draft_tree tree(65), want(65);
      for (int step = 0; step < 14; ++step) {
        CAPTURE(step);
        auto ctx = propose_test::make_ctx(tokens, 64);
        feature_rows const rows(*head, tokens, from, tokens.size() - 1);
        ctx.target_hidden = rows.view;
        p.propose(ctx, tree);
        CHECK(p.committed_entries() == tokens.size() - 1);
        // A fresh proposer given every feature drafts the same tree, from the same output.
        fresh.begin(tokens);
        auto fctx = propose_test::make_ctx(tokens, 64);
        feature_rows const all(*head, tokens, 0, tokens.size() - 1);
        fctx.target_hidden = all.view;
        fresh.propose(fctx, want);
        REQUIRE(tree.size() == want.size());
        for (sd::node_index i = 0; static_cast<std::size_t>(i) < tree.size(); ++i) {
          CHECK(tree.token(i) == want.token(i));
          CHECK(tree.parent(i) == want.parent(i));
        }
        CHECK(std::equal(p.last_output().begin(), p.last_output().end(),
                         fresh.last_output().begin(), fresh.last_output().end()));
        // Accept a random path: none, a partial one, or down to a leaf; then a random bonus.
        sd::verify_result r;
        std::size_t const pick = rng() % 4;
        sd::node_index node = 0;
        if (pick > 0) {
          node = static_cast<sd::node_index>(1 + rng() % (tree.size() - 1));
          if (pick == 3)
            while (tree.num_children(node) > 0) node = tree.first_child(node);
        }
        for (sd::node_index n = node; n > 0; n = tree.parent(n)) r.accepted_nodes.push_back(n);
        std::reverse(r.accepted_nodes.begin(), r.accepted_nodes.end());
        for (sd::node_index n : r.accepted_nodes) r.tokens.push_back(tree.token(n));
        r.tokens.push_back(static_cast<sd::token_id>(rng() % 75));
        (none += r.num_accepted() == 0 ? 1 : 0),
            (full += node > 0 && tree.num_children(node) == 0 ? 1 : 0),
            (partial += node > 0 && tree.num_children(node) > 0 ? 1 : 0);
        p.accept(r);
        CHECK(runner.cache().size() == tokens.size() - 1);
        from = tokens.size() - 1;
        tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
      }
      CHECK(none > 0);
      CHECK(partial > 0);
      CHECK(full > 0);
    }
  }
}

// Steps that may draft nothing (a speculation policy's choice) keep the feature rows and feed
// them to the head at the next step that drafts, in one call: that step's tree, and the head's
// output, are those of a fresh proposer given every feature.
TEST_CASE("eagle proposer: steps that draft nothing defer the head's rows") {
  std::mt19937_64 rng(7);
  for (auto const& head : random_heads()) {
    CAPTURE(static_cast<int>(head->config.version));
    sd::cpu_eagle_head runner(head), fresh_runner(head);
    sd::eagle_tree_config const cfg{.depth = 3, .top_k = 3, .nodes = 8};
    cpu_eagle p(runner, cfg), fresh(fresh_runner, cfg);
    std::vector<sd::token_id> tokens = {1, 5, 40, 12};
    p.begin(tokens);
    std::size_t from = 0;
    std::size_t deferred = 0, drafted = 0;
    sd::draft_tree tree(65), want(65);
    for (int step = 0; step < 16; ++step) {
      CAPTURE(step);
      bool const idle = step % 4 != 3;  // three steps of no draft, then one that drafts
      auto ctx = propose_test::make_ctx(tokens, idle ? 0 : 64);
      feature_rows const rows(*head, tokens, from, tokens.size() - 1);
      ctx.target_hidden = rows.view;
      std::size_t const before = p.committed_entries();
      p.propose(ctx, tree);
      if (idle) {
        CHECK(tree.size() == 1);
        CHECK(p.committed_entries() == before);  // the head ran no row
        CHECK(p.committed_entries() + p.pending_entries() == tokens.size() - 1);
        CHECK(runner.cache().size() == before);
        ++deferred;
      } else {
        CHECK(p.committed_entries() == tokens.size() - 1);
        CHECK(p.pending_entries() == 0);
        fresh.begin(tokens);
        auto fctx = propose_test::make_ctx(tokens, 64);
        feature_rows const all(*head, tokens, 0, tokens.size() - 1);
        fctx.target_hidden = all.view;
        fresh.propose(fctx, want);
        REQUIRE(tree.size() == want.size());
        CHECK(tree.size() > 1);
        for (sd::node_index i = 0; static_cast<std::size_t>(i) < tree.size(); ++i) {
          CHECK(tree.token(i) == want.token(i));
          CHECK(tree.parent(i) == want.parent(i));
        }
        CHECK(std::equal(p.last_output().begin(), p.last_output().end(),
                         fresh.last_output().begin(), fresh.last_output().end()));
        ++drafted;
      }
      // Accept the first child when there is one, then a random bonus token.
      sd::verify_result r;
      if (tree.size() > 1 && rng() % 2 == 0) {
        r.accepted_nodes.push_back(1);
        r.tokens.push_back(tree.token(1));
      }
      r.tokens.push_back(static_cast<sd::token_id>(rng() % 75));
      p.accept(r);
      from = tokens.size() - 1;
      tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
    }
    CHECK(deferred == 12);
    CHECK(drafted == 4);
    // Rows that do not continue the pairs (fed and pending) are refused.
    auto ctx = propose_test::make_ctx(tokens, 0);
    feature_rows const gap(*head, tokens, from + 1, tokens.size() - 1);
    ctx.target_hidden = gap.view;
    CHECK_THROWS_AS(p.propose(ctx, tree), sd::error);
  }
}

TEST_CASE("eagle proposer: a one-token prompt drafts nothing; bad rows and configs throw") {
  auto const head = random_heads()[1];
  sd::cpu_eagle_head runner(head);
  cpu_eagle p(runner, sd::eagle_tree_config{.depth = 3, .top_k = 2, .nodes = 4});
  std::vector<sd::token_id> const one = {1};
  p.begin(one);
  sd::draft_tree tree(8);
  auto ctx = propose_test::make_ctx(one, 4);
  p.propose(ctx, tree);
  CHECK(tree.num_drafted() == 0);
  CHECK(p.target_hidden_layers().size() == 3);

  std::vector<sd::token_id> const tokens = {1, 5, 40, 12};
  feature_rows const rows(*head, tokens, 0, 3);
  p.begin(tokens);
  auto c = propose_test::make_ctx(tokens, 4);
  c.target_hidden = sd::matrix_view<float const>(rows.data.data(), 3, 48);
  check_error([&] { p.propose(c, tree); }, sd::errc::invalid_argument, "feature rows of 48 floats");
  c.target_hidden = rows.view.subrows(1, 2);  // starts at token 1, but the head holds nothing
  check_error([&] { p.propose(c, tree); }, sd::errc::invalid_argument,
              "feature rows from token 1 do not continue");
  c.target_hidden = rows.view;
  c.max_nodes = 0;  // nothing drafted: the pairs wait for the next step that drafts
  p.propose(c, tree);
  CHECK(tree.num_drafted() == 0);
  CHECK(p.committed_entries() == 0);
  CHECK(p.pending_entries() == 3);
  c.max_nodes = 4;  // the same rows again (no token committed since): now fed, and a draft
  p.propose(c, tree);
  CHECK(p.committed_entries() == 3);
  CHECK(p.pending_entries() == 0);
  CHECK(tree.num_drafted() > 0);
  check_error([&] { cpu_eagle(runner, sd::eagle_tree_config{.depth = 0}); },
              sd::errc::invalid_argument, "depth 0");
  check_error([&] { cpu_eagle(runner, sd::eagle_tree_config{.top_k = 41}); },
              sd::errc::invalid_argument, "top_k 41 exceeds the draft vocabulary of 40");
  check_error([&] { cpu_eagle(runner, sd::sparse_tree::from_choices({{40}})); },
              sd::errc::invalid_argument, "rank 40");
}
