// The block proposer (propose/block.hpp) with the CPU runner and the drafters trained for the
// fixture: the chain it drafts from the golden features is the golden chain (DFlash and DSpark,
// the Markov head on and off); the budget and the length cap it; the confidence cutoff stops at
// the product of the head's estimates; sampled drafts carry q rows that are distributions holding
// their token; the context follows partial and full acceptance and history edits; errors.
#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "propose/context.hpp"
#include "specdec/backend/cpu/block_drafter.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/propose/block.hpp"
#include "specdec/reference/block_drafter.hpp"
#include "specdec/sampling/policy.hpp"
#include "support/block.hpp"
#include "support/errors.hpp"

namespace block_proposer_test {

namespace sd = specdec;
using greedy_block = sd::block_proposer<sd::cpu_block_drafter, sd::greedy>;
using sampled_block =
    sd::block_proposer<sd::cpu_block_drafter, sd::sampler, sd::draft_mode::sample>;
static_assert(sd::proposer<greedy_block> && sd::proposer<sampled_block>);
static_assert(!sd::produces_trees_v<greedy_block> && sd::needs_target_hidden_v<greedy_block>);
static_assert(!sd::samples_drafts_v<greedy_block> && sd::samples_drafts_v<sampled_block>);

// The golden case of `kind`: features [T, F] of sequence[0..T-1], root sequence[T].
struct golden {
  std::vector<float> features;
  std::vector<sd::token_id> sequence;
  std::vector<sd::token_id> chain;
  std::size_t rows = 0;
};

inline golden golden_of(char const* kind) {
  sd::safetensors_file const g(test_support::block_dir(kind) / "golden.safetensors");
  golden c;
  c.features = g.read("features");
  for (std::int64_t x : test_support::tensor_integers(g, "sequence"))
    c.sequence.push_back(static_cast<sd::token_id>(x));
  for (std::int64_t x : test_support::tensor_integers(g, "chain_tokens"))
    c.chain.push_back(static_cast<sd::token_id>(x));
  c.rows = c.sequence.size() - 1;
  return c;
}

// The drafted chain of `tree`.
inline std::vector<sd::token_id> chain_of(sd::draft_tree const& tree) {
  std::vector<sd::token_id> out;
  for (sd::node_index i = 1; static_cast<std::size_t>(i) < tree.size(); ++i) {
    REQUIRE(tree.parent(i) == i - 1);
    out.push_back(tree.token(i));
  }
  return out;
}

// A context whose feature rows are rows [from, to) of `g` and whose tokens are sequence[0..to].
inline sd::propose_context ctx_of(golden const& g, std::size_t from, std::size_t to,
                                  std::size_t max_nodes, sd::philox* rng = nullptr) {
  std::size_t const f = g.features.size() / g.rows;
  sd::propose_context c = propose_test::make_ctx(
      std::span<sd::token_id const>(g.sequence.data(), to + 1), max_nodes, rng);
  c.target_hidden = sd::matrix_view<float const>(g.features.data() + from * f, to - from, f);
  return c;
}

}  // namespace block_proposer_test

TEST_CASE("block proposer: the golden chain, the budget and the length") {
  using namespace block_proposer_test;
  for (char const* kind : {"dflash", "dspark"}) {
    CAPTURE(kind);
    bool const dspark = std::string(kind) == "dspark";
    golden const g = golden_of(kind);
    sd::cpu_block_drafter runner(dspark ? test_support::fixture_dspark()
                                        : test_support::fixture_dflash());
    greedy_block p(runner, sd::greedy{});
    CHECK(p.max_nodes() == runner.block_size() - 1);
    p.begin(std::span<sd::token_id const>(g.sequence.data(), 2));
    sd::draft_tree tree(64);
    // Fed in two steps: rows 0..4 (root sequence[5]), then 5..T-1 (root sequence[T]).
    p.propose(ctx_of(g, 0, 5, 64), tree);
    CHECK(p.context() == 5);
    p.propose(ctx_of(g, 5, g.rows, 64), tree);
    CHECK(p.context() == g.rows);
    CHECK(chain_of(tree) == g.chain);
    CHECK(p.last_confidence().size() == (dspark ? g.chain.size() : 0));
    // A budget of 3, then a length of 2.
    p.propose(ctx_of(g, g.rows, g.rows, 3), tree);
    CHECK(chain_of(tree) == std::vector<sd::token_id>(g.chain.begin(), g.chain.begin() + 3));
    greedy_block two(runner, sd::greedy{}, {.length = 2});
    two.begin(g.sequence);
    two.propose(ctx_of(g, 0, g.rows, 64), tree);
    CHECK(chain_of(tree) == std::vector<sd::token_id>(g.chain.begin(), g.chain.begin() + 2));
    // A budget of 0 drafts nothing but keeps the rows.
    two.begin(g.sequence);
    two.propose(ctx_of(g, 0, g.rows, 0), tree);
    CHECK(tree.size() == 1);
    CHECK(two.context() == g.rows);
  }
  // DSpark without its Markov head drafts each row's own greedy token (the reference's).
  golden const g = golden_of("dspark");
  auto const w = test_support::fixture_dspark();
  sd::cpu_block_drafter body(w);
  greedy_block p(body, sd::greedy{}, {.markov = false});
  p.begin(g.sequence);
  sd::draft_tree tree(64);
  p.propose(ctx_of(g, 0, g.rows, 64), tree);
  auto const out = sd::reference_block_outputs(
      *w, sd::matrix_view<float const>(g.features.data(), g.rows, w->feature_width()),
      g.sequence.back());
  std::vector<sd::token_id> want;
  for (std::size_t i = 1; i < out.size(); ++i) {
    std::vector<double> const l = sd::reference_block_logits(*w, out[i]);
    want.push_back(static_cast<sd::token_id>(std::max_element(l.begin(), l.end()) - l.begin()));
  }
  CHECK(chain_of(tree) == want);
}

TEST_CASE("block proposer: the confidence cutoff stops at the product of the estimates") {
  using namespace block_proposer_test;
  golden const g = golden_of("dspark");
  sd::cpu_block_drafter runner(test_support::fixture_dspark());
  greedy_block all(runner, sd::greedy{});
  all.begin(g.sequence);
  sd::draft_tree tree(64);
  all.propose(ctx_of(g, 0, g.rows, 64), tree);
  std::vector<double> const conf(all.last_confidence().begin(), all.last_confidence().end());
  REQUIRE(conf.size() == g.chain.size());
  for (double c : conf) CHECK((c > 0.0 && c < 1.0));
  // A threshold between the products after 2 and 3 drafts keeps 2 of them (ties aside).
  double const p2 = conf[0] * conf[1], p3 = p2 * conf[2];
  REQUIRE(p3 < p2);
  auto const threshold = static_cast<float>(std::sqrt(p2 * p3));
  sd::cpu_block_drafter runner2(test_support::fixture_dspark());
  greedy_block cut(runner2, sd::greedy{}, {.confidence_threshold = threshold});
  cut.begin(g.sequence);
  cut.propose(ctx_of(g, 0, g.rows, 64), tree);
  CHECK(chain_of(tree) == std::vector<sd::token_id>(g.chain.begin(), g.chain.begin() + 2));
  // The first draft is always drafted.
  sd::cpu_block_drafter runner3(test_support::fixture_dspark());
  greedy_block one(runner3, sd::greedy{}, {.confidence_threshold = 1.0f});
  one.begin(g.sequence);
  one.propose(ctx_of(g, 0, g.rows, 64), tree);
  CHECK(chain_of(tree) == std::vector<sd::token_id>(g.chain.begin(), g.chain.begin() + 1));
}

TEST_CASE("block proposer: sampled drafts carry their q rows") {
  using namespace block_proposer_test;
  golden const g = golden_of("dspark");
  auto const w = test_support::fixture_dspark();
  sd::cpu_block_drafter runner(w);
  sd::sampling_params params;
  params.temperature = 1.0f;
  sampled_block p(runner, sd::sampler(params));
  p.begin(g.sequence);
  sd::draft_tree tree(64);
  sd::philox rng(7, 0);
  p.propose(ctx_of(g, 0, g.rows, 64, &rng), tree);
  REQUIRE(tree.has_q());
  REQUIRE(tree.size() == w->config.block_size);
  // Row 1's q is the softmax of the reference logits with the Markov bias after the root.
  auto const out = sd::reference_block_outputs(
      *w, sd::matrix_view<float const>(g.features.data(), g.rows, w->feature_width()),
      g.sequence.back());
  std::vector<double> const l = sd::reference_block_logits(*w, out[1], g.sequence.back());
  double const top = *std::max_element(l.begin(), l.end());
  double sum = 0.0;
  for (double x : l) sum += std::exp(x - top);
  std::span<float const> const q0 = tree.q_row(0);
  double worst = 0.0;
  for (std::size_t v = 0; v < l.size(); ++v)
    worst = std::max(worst, std::abs(q0[v] - std::exp(l[v] - top) / sum));
  CHECK(worst < 1e-5);
  for (sd::node_index i = 0; static_cast<std::size_t>(i) + 1 < tree.size(); ++i) {
    std::span<float const> const q = tree.q_row(i);
    CHECK(std::accumulate(q.begin(), q.end(), 0.0) == doctest::Approx(1.0).epsilon(1e-4));
    CHECK(q[static_cast<std::size_t>(tree.token(i + 1))] > 0.0f);
  }
  // Without a random stream: an error.
  test_support::check_error([&] { p.propose(ctx_of(g, g.rows, g.rows, 64), tree); },
                            sd::errc::invalid_argument, "propose_context::rng");
}

TEST_CASE("block proposer: the context follows acceptance and edits; errors") {
  using namespace block_proposer_test;
  using test_support::check_error;
  golden const g = golden_of("dflash");
  sd::cpu_block_drafter runner(test_support::fixture_dflash());
  greedy_block p(runner, sd::greedy{});
  p.begin(g.sequence);
  sd::draft_tree tree(64);
  p.propose(ctx_of(g, 0, 8, 64), tree);
  p.accept({});
  // The history edited at token 3: rows from 3 on replace the old ones.
  std::vector<sd::token_id> edited(g.sequence.begin(), g.sequence.end());
  p.propose(ctx_of(g, 3, g.rows, 64), tree);
  CHECK(p.context() == g.rows);
  CHECK(chain_of(tree) == g.chain);
  // Rows that skip tokens the drafter has not seen.
  greedy_block q(runner, sd::greedy{});
  q.begin(g.sequence);
  check_error([&] { q.propose(ctx_of(g, 2, g.rows, 64), tree); }, sd::errc::invalid_argument,
              "do not continue the drafter's 0 context rows");
  // An edited token just before the new rows.
  q.begin(g.sequence);
  q.propose(ctx_of(g, 0, 6, 64), tree);
  edited[5] = edited[5] == 5 ? 6 : 5;
  sd::propose_context c = ctx_of(g, 6, 8, 64);
  c.tokens = std::span<sd::token_id const>(edited.data(), 9);
  check_error([&] { q.propose(c, tree); }, sd::errc::invalid_argument, "do not continue");
  check_error([&] { greedy_block bad(runner, sd::greedy{}, {.length = 8}); },
              sd::errc::invalid_argument, "exceeds the drafter's 7 drafts per block");
  check_error([&] { greedy_block bad(runner, sd::greedy{}, {.confidence_threshold = 0.5f}); },
              sd::errc::invalid_argument, "needs a DSpark drafter");
  check_error([&] { greedy_block bad(runner, sd::greedy{}, {.confidence_threshold = 2.0f}); },
              sd::errc::invalid_argument, "outside [0, 1]");
}

TEST_CASE("block proposer: DDTree holds the most probable paths (brute force over the reference)") {
  using namespace block_proposer_test;
  using tree_block = sd::block_proposer<sd::cpu_block_drafter, sd::greedy, sd::draft_mode::greedy,
                                        sd::block_shape::tree>;
  static_assert(sd::produces_trees_v<tree_block>);
  for (char const* kind : {"dflash", "dspark"}) {
    CAPTURE(kind);
    bool const dspark = std::string(kind) == "dspark";
    auto const w = dspark ? test_support::fixture_dspark() : test_support::fixture_dflash();
    golden const g = golden_of(kind);
    sd::cpu_block_drafter runner(w);
    constexpr std::size_t nodes = 6, depth = 3;
    tree_block p(runner, sd::greedy{}, {.length = depth, .nodes = nodes});
    CHECK(p.max_nodes() == nodes);
    p.begin(g.sequence);
    sd::draft_tree tree(64);
    p.propose(ctx_of(g, 0, g.rows, 64), tree);
    REQUIRE(tree.size() == nodes + 1);
    // Every path of up to `depth` tokens through the top `nodes` tokens of each row, scored by the
    // reference's log-softmax (DSpark: each row with the Markov bias after the path's previous
    // token); the tree must hold the `nodes` best (whose parents are among them).
    auto const out = sd::reference_block_outputs(
        *w, sd::matrix_view<float const>(g.features.data(), g.rows, w->feature_width()),
        g.sequence.back());
    struct scored {
      std::vector<sd::token_id> path;
      double score;
    };
    std::vector<scored> all;
    std::vector<scored> level = {{{}, 0.0}};
    for (std::size_t d = 1; d <= depth; ++d) {
      std::vector<scored> next;
      for (scored const& s : level) {
        sd::token_id const prev = s.path.empty() ? g.sequence.back() : s.path.back();
        std::vector<double> const l = sd::reference_block_logits(*w, out[d], dspark ? prev : -1);
        double const top = *std::max_element(l.begin(), l.end());
        double sum = 0.0;
        for (double x : l) sum += std::exp(x - top);
        std::vector<std::size_t> idx(l.size());
        std::iota(idx.begin(), idx.end(), std::size_t{0});
        std::partial_sort(idx.begin(), idx.begin() + nodes, idx.end(),
                          [&](std::size_t a, std::size_t b) { return l[a] > l[b]; });
        for (std::size_t r = 0; r < nodes; ++r) {
          scored c = s;
          c.path.push_back(static_cast<sd::token_id>(idx[r]));
          c.score += l[idx[r]] - top - std::log(sum);
          next.push_back(c);
        }
      }
      all.insert(all.end(), next.begin(), next.end());
      level = next;
    }
    std::sort(all.begin(), all.end(),
              [](scored const& a, scored const& b) { return a.score > b.score; });
    std::vector<std::vector<sd::token_id>> want, got;
    for (std::size_t i = 0; i < nodes; ++i) want.push_back(all[i].path);
    // A tie at the cut would make the set ambiguous: the test's drafters have none.
    REQUIRE(all[nodes - 1].score - all[nodes].score > 1e-6);
    for (sd::node_index i = 1; static_cast<std::size_t>(i) < tree.size(); ++i) {
      std::vector<sd::token_id> path;
      for (sd::node_index n = i; n > 0; n = tree.parent(n)) path.push_back(tree.token(n));
      std::reverse(path.begin(), path.end());
      got.push_back(path);
      CHECK(tree.parent(i) < i);
    }
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    CHECK(got == want);
    // The first path down is the greedy chain.
    CHECK(tree.token(1) == g.chain[0]);
  }
}
