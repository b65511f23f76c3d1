// The sparse trees of the draft-head proposers (propose/sparse_tree.hpp): explicit paths in the
// canonical order with every malformed case, the greedy construction from accuracies (which must
// rebuild the committed tree.json files from the accuracies the training run measured), the
// ranking of a head's logits, and pruning to a node budget by path probability.
#include "specdec/propose/sparse_tree.hpp"

#include "support/doctest.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/heads.hpp"

namespace sd = specdec;
using test_support::check_error;

TEST_CASE("sparse_tree: explicit paths, canonical order, parents and ranks") {
  sd::sparse_tree const t = sd::sparse_tree::from_choices({{1, 0}, {0}, {0, 0}, {1}, {0, 0, 2}});
  REQUIRE(t.size() == 5);
  CHECK(t.depth() == 3);
  CHECK(t.choices() == sd::tree_choices{{0}, {1}, {0, 0}, {1, 0}, {0, 0, 2}});
  CHECK(t.parent(0) == -1);
  CHECK(t.parent(3) == 1);  // [0, 0] under [0]
  CHECK(t.parent(4) == 2);  // [1, 0] under [1]
  CHECK(t.parent(5) == 3);
  CHECK(t.depth(5) == 3);
  CHECK(t.rank(5) == 2);
  CHECK(t.expanded(0));
  CHECK(!t.expanded(4));
  CHECK(t.ranks_needed(0) == 2);
  CHECK(t.ranks_needed(1) == 1);
  CHECK(t.ranks_needed(2) == 3);
  CHECK(t.expected().empty());
  CHECK(sd::sparse_tree::chain(3).choices() == sd::tree_choices{{0}, {0, 0}, {0, 0, 0}});
  CHECK(sd::sparse_tree::from_choices({}).size() == 0);

  check_error(
      [] {
        (void)sd::sparse_tree::from_choices({{0}, {0, 1, 0}});
      },
      sd::errc::invalid_argument, "path [0, 1, 0] has no parent path [0, 1]");
  check_error(
      [] {
        (void)sd::sparse_tree::from_choices({{0}, {0}});
      },
      sd::errc::invalid_argument, "path [0] is given twice");
  check_error(
      [] {
        (void)sd::sparse_tree::from_choices({{0}, {}});
      },
      sd::errc::invalid_argument, "an empty path");
  check_error([] { (void)sd::sparse_tree::from_choices({{-1}}); }, sd::errc::invalid_argument,
              "path [-1] has a negative rank");
  sd::tree_choices many;
  for (std::int32_t k = 0; k < 4096; ++k) many.push_back({k});
  check_error([&] { (void)sd::sparse_tree::from_choices(many); }, sd::errc::invalid_argument,
              "4096 paths");
}

TEST_CASE("sparse_tree: the greedy construction rebuilds the committed trees") {
  std::ifstream in(test_support::source_file("tools/heads/metrics.json"));
  nlohmann::json const metrics = nlohmann::json::parse(in);
  for (char const* kind : {"medusa", "hydra"}) {
    CAPTURE(kind);
    nlohmann::json const& k = metrics["kinds"][kind];
    sd::head_accuracy const acc(
        k["heldout"]["rank_accuracy"].get<std::vector<std::vector<double>>>());
    CHECK(acc.heads() == 4);
    CHECK(acc.ranks() == 10);
    sd::sparse_tree const built = sd::sparse_tree::build(acc, 32);
    CHECK(built.choices() == test_support::fixture_tree(kind).choices());
    CHECK(built.choices() == k["tree"].get<sd::tree_choices>());
    CHECK(built.expected_length() ==
          doctest::Approx(k["tree_expected_accepted_length"].get<double>()).epsilon(1e-12));
    auto const expected = k["tree_expected_acceptance"].get<std::vector<double>>();
    REQUIRE(built.expected().size() == expected.size() + 1);
    for (std::size_t i = 0; i < expected.size(); ++i)
      CHECK(built.expected()[i + 1] == doctest::Approx(expected[i]).epsilon(1e-12));
    // A smaller budget takes the first nodes of the same construction.
    sd::sparse_tree const small = sd::sparse_tree::build(acc, 8);
    CHECK(small.size() == 8);
    sd::tree_choices const all = built.choices();
    for (auto const& path : small.choices())
      CHECK(std::find(all.begin(), all.end(), path) != all.end());
    CHECK(sd::sparse_tree::build(acc, 0).size() == 0);
  }
  // Fewer nodes when the ranks run out: 1 head of 3 ranks holds 3 nodes.
  CHECK(sd::sparse_tree::build(sd::head_accuracy({{0.5, 0.2, 0.1}}), 10).size() == 3);
}

TEST_CASE("head_accuracy: ranks with ties to the lower id, tables") {
  sd::head_accuracy acc(2, 3);
  std::vector<float> const logits{1.0f, 3.0f, 3.0f, 0.5f};
  acc.add(0, logits, 1);  // rank 0 (tie with 2: the lower id first)
  acc.add(0, logits, 2);  // rank 1
  acc.add(0, logits, 3);  // rank 3: beyond the ranks counted
  acc.add(1, logits, 0);  // rank 2
  CHECK(acc.positions(0) == 3);
  CHECK(acc.at(0, 0) == doctest::Approx(1.0 / 3));
  CHECK(acc.at(0, 1) == doctest::Approx(1.0 / 3));
  CHECK(acc.at(0, 2) == 0.0);
  CHECK(acc.at(1, 2) == 1.0);
  CHECK(sd::head_accuracy(acc.table()).at(0, 1) == doctest::Approx(1.0 / 3));
  check_error(
      [] {
        (void)sd::head_accuracy({{0.5, 1.5}});
      },
      sd::errc::invalid_argument, "accuracy 1.5 of head 0 at rank 1 is not in [0, 1]");
  check_error(
      [] {
        (void)sd::head_accuracy({{0.5, 0.1}, {0.5}});
      },
      sd::errc::invalid_argument, "head 1 has 1 ranks");
}

TEST_CASE("top_ranks: descending, ties to the lower id, NaN refused") {
  std::vector<float> const row{0.5f, 2.0f, -1.0f, 2.0f, 7.0f, 0.5f};
  std::vector<sd::token_id> out(4);
  sd::detail::top_ranks(row, 4, out, "test");
  CHECK(out == std::vector<sd::token_id>{4, 1, 3, 0});
  sd::detail::top_ranks(row, 1, out, "test");
  CHECK(out[0] == 4);
  std::vector<float> nan = row;
  nan[2] = std::numeric_limits<float>::quiet_NaN();
  check_error([&] { sd::detail::top_ranks(nan, 2, out, "medusa_proposer"); }, sd::errc::numerical,
              "medusa_proposer: a head produced NaN logits");
  CHECK(sd::detail::log_sum_exp(std::vector<float>{0.0f, 0.0f}) == doctest::Approx(std::log(2.0)));
}

TEST_CASE("sparse_tree_writer: every node within the budget, else the most probable subtree") {
  sd::sparse_tree const shape = sd::sparse_tree::from_choices({{0}, {1}, {0, 0}, {0, 1}, {1, 0}});
  // Nodes 1..5: [0], [1], [0, 0], [0, 1], [1, 0].
  std::vector<sd::token_id> const tokens{7, 10, 11, 12, 13, 14};
  std::vector<double> const log_prob{0.0, -0.1, -1.0, -0.3, -2.0, -1.05};
  sd::detail::sparse_tree_writer writer;
  sd::draft_tree out(16);
  out.reset(7);
  writer.write(shape, tokens, log_prob, 5, out);
  CHECK(out.size() == 6);
  CHECK(out.token(3) == 12);
  CHECK(out.parent(5) == 2);

  out.reset(7);
  writer.write(shape, tokens, log_prob, 3, out);  // [0], [0, 0], [1]
  REQUIRE(out.size() == 4);
  CHECK(out.token(1) == 10);
  CHECK(out.token(2) == 11);
  CHECK(out.token(3) == 12);
  CHECK(out.parent(3) == 1);

  out.reset(7);
  writer.write(shape, tokens, log_prob, 0, out);
  CHECK(out.size() == 1);
}
