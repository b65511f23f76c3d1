#include "specdec/core/stats.hpp"

#include "support/doctest.hpp"

TEST_CASE("request_stats accumulates steps and acceptance by depth") {
  specdec::request_stats r;
  r.add({.tree_size = 4, .tree_depth = 4, .accepted = 2, .emitted = 3});
  r.add({.tree_size = 4, .tree_depth = 4, .accepted = 4, .emitted = 5});
  r.add({.tree_size = 6, .tree_depth = 2, .accepted = 0, .emitted = 1});
  CHECK(r.steps == 3);
  CHECK(r.drafted == 14);
  CHECK(r.accepted == 6);
  CHECK(r.generated == 9);
  CHECK(r.max_tree_size == 6);
  CHECK(r.mean_accepted_length() == doctest::Approx(3.0));
  CHECK(r.acceptance_rate() == doctest::Approx(6.0 / 14.0));
  REQUIRE(r.drafted_at_depth.size() == 4);
  CHECK(r.drafted_at_depth[0] == 3);
  CHECK(r.drafted_at_depth[3] == 2);
  CHECK(r.accepted_at_depth[0] == 2);
  CHECK(r.accepted_at_depth[1] == 2);
  CHECK(r.accepted_at_depth[2] == 1);
  CHECK(r.accepted_at_depth[3] == 1);
  r.total_seconds = 3.0;
  CHECK(r.tokens_per_second() == doctest::Approx(3.0));
  CHECK(specdec::request_stats{}.mean_accepted_length() == 0.0);
}
