// The draft-head proposers (propose/medusa.hpp, propose/hydra.hpp) on the fixture's heads: every
// drafted token is the rank the tree lists of the reference logits (Medusa: of its depth's head;
// Hydra: of its depth's head on its parent's path), pruning keeps the most probable nodes, no
// hidden row drafts nothing, bad pairings are refused, and the accuracies measured on the target's
// own greedy text are those of trained heads.
#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

#include "propose/context.hpp"
#include "specdec/backend/cpu/heads.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/propose/hydra.hpp"
#include "specdec/propose/medusa.hpp"
#include "specdec/reference/heads.hpp"
#include "specdec/sampling/policy.hpp"
#include "support/errors.hpp"
#include "support/fixture.hpp"
#include "support/heads.hpp"

namespace sd = specdec;
using test_support::check_error;

static_assert(sd::proposer<sd::medusa_proposer<sd::cpu_medusa_heads>>);
static_assert(sd::proposer<sd::hydra_proposer<sd::cpu_hydra_heads>>);
static_assert(sd::produces_trees_v<sd::medusa_proposer<sd::cpu_medusa_heads>>);
static_assert(sd::needs_target_hidden_v<sd::hydra_proposer<sd::cpu_hydra_heads>>);
static_assert(!sd::samples_drafts_v<sd::hydra_proposer<sd::cpu_hydra_heads>>);

namespace {

// The fixture's final hidden rows after `tokens` ([tokens, 64]).
std::vector<float> hidden_rows(std::vector<sd::token_id> const& tokens) {
  sd::cpu_llama model(fixture::stories260k(), {.threads = 1});
  std::vector<sd::position_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), 0);
  sd::forward_result out;
  model.forward({.tokens = tokens, .positions = positions, .want_hidden = true}, out);
  return out.hidden;
}

// The rank-k token of `logits` (descending, ties to the lower id).
sd::token_id rank_of(std::vector<double> const& logits, std::size_t k) {
  std::vector<sd::token_id> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](sd::token_id a, sd::token_id b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)];
  });
  return order[k];
}

// One step's input: "Once upon a time" committed, the hidden rows of all but its last token (as
// the decoder's prefill leaves them).
struct step_input {
  std::vector<sd::token_id> tokens = fixture::once_upon_a_time();
  std::vector<float> hidden =
      hidden_rows(std::vector<sd::token_id>(tokens.begin(), tokens.end() - 1));
  sd::matrix_view<float const> rows() const { return {hidden.data(), tokens.size() - 1, 64}; }
  sd::propose_context ctx(std::size_t max_nodes) const {
    sd::propose_context c = propose_test::make_ctx(tokens, max_nodes);
    c.target_hidden = rows();
    return c;
  }
};

}  // namespace

TEST_CASE("medusa_proposer: each node is its rank of its depth's head, on the last hidden row") {
  step_input const in;
  sd::cpu_medusa_heads runner(test_support::fixture_medusa());
  sd::sparse_tree const shape = test_support::fixture_tree("medusa");
  sd::medusa_proposer proposer(runner, shape);
  CHECK(proposer.max_nodes() == 32);
  sd::draft_tree tree(64);
  proposer.begin(in.tokens);
  proposer.propose(in.ctx(63), tree);
  REQUIRE(tree.size() == 33);
  CHECK(tree.root() == in.tokens.back());
  std::span<float const> const h = in.rows().row(in.rows().rows() - 1);
  std::vector<std::vector<double>> ref;
  for (std::size_t i = 0; i < 4; ++i)
    ref.push_back(sd::reference_medusa_logits(*test_support::fixture_medusa(), i, h));
  for (std::size_t i = 1; i <= shape.size(); ++i) {
    CAPTURE(i);
    auto const n = static_cast<sd::node_index>(i);
    CHECK(tree.parent(n) == shape.parent(i));
    CHECK(tree.depth(n) == shape.depth(i));
    CHECK(tree.token(n) == rank_of(ref[static_cast<std::size_t>(shape.depth(i) - 1)],
                                   static_cast<std::size_t>(shape.rank(i))));
  }
  // The verifier's accepted path through these trees: the next step drafts again from scratch.
  proposer.accept(sd::verify_result{});
}

TEST_CASE("hydra_proposer: each node is its rank of its depth's head on its parent's path") {
  step_input const in;
  auto const target = fixture::stories260k();
  sd::cpu_hydra_heads runner(test_support::fixture_hydra(), target);
  sd::sparse_tree const shape = test_support::fixture_tree("hydra");
  sd::hydra_proposer proposer(runner, shape);
  sd::draft_tree tree(64);
  proposer.propose(in.ctx(63), tree);
  REQUIRE(tree.size() == 33);
  std::span<float const> const h = in.rows().row(in.rows().rows() - 1);
  for (std::size_t i = 1; i <= shape.size(); ++i) {
    CAPTURE(i);
    auto const n = static_cast<sd::node_index>(i);
    REQUIRE(tree.parent(n) == shape.parent(i));
    // The parent's path, root first.
    std::vector<sd::token_id> path;
    for (sd::node_index a = tree.parent(n); a >= 0; a = tree.parent(a))
      path.insert(path.begin(), tree.token(a));
    auto const head = static_cast<std::size_t>(shape.depth(i) - 1);
    auto const logits = sd::reference_hydra_logits(*test_support::fixture_hydra(),
                                                   target->token_embedding, head, h, path);
    CHECK(tree.token(n) == rank_of(logits, static_cast<std::size_t>(shape.rank(i))));
  }
}

TEST_CASE("draft-head proposers: pruning to the budget keeps the most probable nodes") {
  step_input const in;
  auto const target = fixture::stories260k();
  sd::cpu_medusa_heads medusa_runner(test_support::fixture_medusa());
  sd::cpu_hydra_heads hydra_runner(test_support::fixture_hydra(), target);
  sd::medusa_proposer medusa(medusa_runner, test_support::fixture_tree("medusa"));
  sd::hydra_proposer hydra(hydra_runner, test_support::fixture_tree("hydra"));
  auto const check = [&](auto& proposer, auto const& path_logits) {
    sd::draft_tree full(64), pruned(64);
    proposer.propose(in.ctx(32), full);
    REQUIRE(full.size() == 33);
    // Log path probability of every node of the full tree, from the reference logits.
    std::vector<double> lp(full.size(), 0.0);
    for (std::size_t i = 1; i < full.size(); ++i) {
      auto const n = static_cast<sd::node_index>(i);
      std::vector<double> const logits = path_logits(full, n);
      double top = -1e300;
      for (double v : logits) top = std::max(top, v);
      double s = 0.0;
      for (double v : logits) s += std::exp(v - top);
      lp[i] = lp[static_cast<std::size_t>(full.parent(n))] +
              logits[static_cast<std::size_t>(full.token(n))] - top - std::log(s);
    }
    for (std::size_t budget : {1u, 5u, 12u, 31u}) {
      CAPTURE(budget);
      proposer.propose(in.ctx(budget), pruned);
      REQUIRE(pruned.num_drafted() == budget);
      // Each kept node is a node of the full tree (same path of tokens), and none dropped is
      // more probable than a kept one.
      std::vector<bool> kept(full.size(), false);
      for (std::size_t i = 1; i < pruned.size(); ++i) {
        sd::node_index at = 0;
        std::vector<sd::token_id> path;
        for (sd::node_index a = static_cast<sd::node_index>(i); a > 0; a = pruned.parent(a))
          path.insert(path.begin(), pruned.token(a));
        for (sd::token_id t : path) at = full.find_child(at, t);
        REQUIRE(at > 0);
        kept[static_cast<std::size_t>(at)] = true;
      }
      double worst_kept = 0.0, best_dropped = -1e300;
      for (std::size_t i = 1; i < full.size(); ++i) {
        if (kept[i])
          worst_kept = std::min(worst_kept, lp[i]);
        else
          best_dropped = std::max(best_dropped, lp[i]);
      }
      CHECK(best_dropped <= worst_kept + 1e-6);
    }
  };
  check(medusa, [&](sd::draft_tree const& t, sd::node_index n) {
    return sd::reference_medusa_logits(*test_support::fixture_medusa(),
                                       static_cast<std::size_t>(t.depth(n) - 1),
                                       in.rows().row(in.rows().rows() - 1));
  });
  check(hydra, [&](sd::draft_tree const& t, sd::node_index n) {
    std::vector<sd::token_id> path;
    for (sd::node_index a = t.parent(n); a >= 0; a = t.parent(a))
      path.insert(path.begin(), t.token(a));
    return sd::reference_hydra_logits(*test_support::fixture_hydra(), target->token_embedding,
                                      static_cast<std::size_t>(t.depth(n) - 1),
                                      in.rows().row(in.rows().rows() - 1), path);
  });
}

TEST_CASE("draft-head proposers: no hidden row or no budget drafts nothing; bad pairings") {
  auto const target = fixture::stories260k();
  sd::cpu_medusa_heads medusa_runner(test_support::fixture_medusa());
  sd::cpu_hydra_heads hydra_runner(test_support::fixture_hydra(), target);
  sd::medusa_proposer medusa(medusa_runner, sd::sparse_tree::chain(4));
  sd::hydra_proposer hydra(hydra_runner, sd::sparse_tree::chain(4));
  std::vector<sd::token_id> const one{1};
  sd::draft_tree tree(8);
  medusa.propose(propose_test::make_ctx(one, 4), tree);
  CHECK(tree.size() == 1);
  hydra.propose(propose_test::make_ctx(one, 4), tree);
  CHECK(tree.size() == 1);
  step_input const in;
  medusa.propose(in.ctx(0), tree);
  CHECK(tree.size() == 1);
  sd::draft_tree small(3);  // capacity 3: two drafted nodes at most
  hydra.propose(in.ctx(10), small);
  CHECK(small.size() == 3);

  check_error([&] { sd::medusa_proposer p(medusa_runner, sd::sparse_tree::chain(5)); },
              sd::errc::invalid_argument, "a tree of depth 5 needs more than the 4 heads");
  check_error([&] { sd::hydra_proposer p(hydra_runner, sd::sparse_tree::from_choices({{512}})); },
              sd::errc::invalid_argument, "the tree uses rank 512 under node 0");
  std::vector<float> wide(2 * 65);
  sd::propose_context ctx = propose_test::make_ctx(in.tokens, 4);
  ctx.target_hidden = sd::matrix_view<float const>(wide.data(), 2, 65);
  check_error([&] { medusa.propose(ctx, tree); }, sd::errc::invalid_argument,
              "hidden rows of 65 floats for heads reading 64");
}

TEST_CASE("draft-head accuracies measured on the target's own greedy text") {
  auto const target = fixture::stories260k();
  sd::cpu_llama model(target, {.threads = 1});
  sd::decode_config config;
  config.max_new_tokens = 160;
  sd::autoregressive_decoder ar(model, sd::greedy{}, config);
  std::vector<sd::token_id> text = fixture::once_upon_a_time();
  auto const r = ar.generate(text);
  text.insert(text.end(), r.tokens.begin(), r.tokens.end());
  std::vector<float> const hidden = hidden_rows(text);
  sd::matrix_view<float const> const rows(hidden.data(), text.size(), 64);

  sd::cpu_medusa_heads medusa_runner(test_support::fixture_medusa());
  sd::head_accuracy medusa(4, 10);
  sd::measure_medusa_accuracy(medusa_runner, rows, text, medusa);
  CHECK(medusa.positions(0) == text.size() - 2);
  CHECK(medusa.positions(3) == text.size() - 5);
  sd::cpu_hydra_heads hydra_runner(test_support::fixture_hydra(), target);
  sd::head_accuracy hydra(4, 10);
  sd::measure_hydra_accuracy(hydra_runner, rows, text, hydra);
  CHECK(hydra.positions(3) == text.size() - 5);
  // Trained heads: the argmax is right far more often than chance, Hydra's more than Medusa's
  // beyond the first head, and a tree built from them has the size asked for.
  for (std::size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(medusa.at(i, 0) > 0.2);
    CHECK(hydra.at(i, 0) > 0.5);
  }
  CHECK(hydra.at(3, 0) > medusa.at(3, 0));
  MESSAGE("top-1 by head, Medusa " << medusa.at(0, 0) << " " << medusa.at(1, 0) << " "
                                   << medusa.at(2, 0) << " " << medusa.at(3, 0) << ", Hydra "
                                   << hydra.at(0, 0) << " " << hydra.at(1, 0) << " "
                                   << hydra.at(2, 0) << " " << hydra.at(3, 0));
  CHECK(sd::sparse_tree::build(hydra, 24).size() == 24);
}
