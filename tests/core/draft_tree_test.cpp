#include "specdec/core/draft_tree.hpp"

#include "support/doctest.hpp"

#include <string>
#include <vector>

using specdec::draft_tree;
using specdec::node_index;
using specdec::token_id;

TEST_CASE("a chain is a tree with one child per node") {
  std::vector<token_id> drafts{5, 6, 7};
  auto t = draft_tree::chain(4, drafts);
  CHECK(t.size() == 4);
  CHECK(t.num_drafted() == 3);
  CHECK(t.root() == 4);
  CHECK(t.is_chain());
  CHECK(t.max_depth() == 3);
  for (node_index i = 1; i < 4; ++i) {
    CHECK(t.parent(i) == i - 1);
    CHECK(t.depth(i) == i);
    CHECK(t.token(i) == 4 + i);
  }
  // Causal mask: node i sees nodes 0..i.
  for (node_index i = 0; i < 4; ++i)
    for (node_index j = 0; j < 4; ++j) CHECK(t.is_ancestor_or_self(j, i) == (j <= i));
  auto empty = draft_tree::chain(9, {});
  CHECK(empty.size() == 1);
  CHECK(empty.is_chain());
}

TEST_CASE("from_paths merges shared prefixes; the mask is the ancestor relation") {
  std::vector<std::vector<token_id>> paths{{1, 2, 3}, {1, 4}, {5}, {1, 2, 6}};
  auto t = draft_tree::from_paths(0, paths);
  // nodes: 0 root, 1:1, 2:2, 3:3, 4:4, 5:5, 6:6
  CHECK(t.size() == 7);
  CHECK(!t.is_chain());
  CHECK(t.num_children(0) == 2);
  CHECK(t.num_children(1) == 2);
  CHECK(t.find_child(2, 6) == 6);
  CHECK(t.find_child(2, 7) == -1);
  CHECK(t.first_child(1) == 2);
  CHECK(t.next_sibling(2) == 4);
  CHECK(t.next_sibling(4) == -1);
  CHECK(t.is_ancestor_or_self(1, 6));
  CHECK(t.is_ancestor_or_self(2, 6));
  CHECK(!t.is_ancestor_or_self(4, 6));
  CHECK(!t.is_ancestor_or_self(6, 2));
  CHECK(t.depth(6) == 3);
  CHECK(t.mask().size() == t.size() * t.mask_stride());
}

TEST_CASE("from_parents rejects bad parents and cycles") {
  std::vector<token_id> tokens{0, 1, 2, 3};
  CHECK_NOTHROW((void)draft_tree::from_parents(tokens, std::vector<node_index>{-1, 0, 1, 0}));
  CHECK_THROWS_AS((void)draft_tree::from_parents(tokens, std::vector<node_index>{0, 0, 1, 0}),
                  specdec::error);
  CHECK_THROWS_AS((void)draft_tree::from_parents(tokens, std::vector<node_index>{-1, 0, 7, 0}),
                  specdec::error);
  CHECK_THROWS_AS((void)draft_tree::from_parents(tokens, std::vector<node_index>{-1, -1, 1, 0}),
                  specdec::error);
  try {
    (void)draft_tree::from_parents(tokens, std::vector<node_index>{-1, 3, 1, 2});
    FAIL("cycle accepted");
  } catch (specdec::error const& e) {
    CHECK(std::string(e.what()).find("cycle") != std::string::npos);
  }
  try {
    (void)draft_tree::from_parents(tokens, std::vector<node_index>{-1, 2, 0, 0});
    FAIL("order accepted");
  } catch (specdec::error const& e) {
    CHECK(std::string(e.what()).find("topological") != std::string::npos);
  }
  CHECK_THROWS_AS((void)draft_tree::from_parents(tokens, std::vector<node_index>{-1, 0}),
                  specdec::error);
}

TEST_CASE("duplicate siblings, overflow and bad tokens are errors") {
  draft_tree t(3);
  t.reset(0);
  t.add_node(0, 1);
  CHECK_THROWS_AS(t.add_node(0, 1), specdec::error);
  CHECK_THROWS_AS(t.add_node(5, 2), specdec::error);
  CHECK_THROWS_AS(t.add_node(0, -3), specdec::error);
  t.add_node(0, 2);
  try {
    t.add_node(0, 3);
    FAIL("overflow accepted");
  } catch (specdec::error const& e) {
    CHECK(e.code() == specdec::errc::context_overflow);
  }
  CHECK_THROWS_AS(draft_tree(0), specdec::error);
  CHECK_THROWS_AS(draft_tree(specdec::max_tree_nodes + 1), specdec::error);
  t.validate(3);
  CHECK_THROWS_AS(t.validate(2), specdec::error);
  draft_tree none;
  CHECK_THROWS_AS(none.add_node(0, 1), specdec::error);
  CHECK_THROWS_AS(none.validate(3), specdec::error);
}

TEST_CASE("sampled trees keep duplicate siblings and q rows") {
  draft_tree t(4);
  t.enable_q(3);
  t.reset(0);
  auto q = t.q_row(0);
  q[0] = 0.5f;
  q[1] = 0.5f;
  q[2] = 0.0f;
  t.add_node(0, 1);
  t.add_node(0, 1);
  CHECK(t.size() == 3);
  CHECK(t.num_children(0) == 2);
  CHECK_NOTHROW(t.validate(3));
  t.q_row(0)[2] = 0.5f;
  CHECK_THROWS_AS(t.validate(3), specdec::error);
  t.q_row(0)[2] = -0.0f;
  t.q_row(0)[1] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(t.validate(3), specdec::error);
  CHECK_THROWS_AS(t.validate(4), specdec::error);
  CHECK(t.q_rows().rows() == 3);
}

TEST_CASE("reserve grows a tree and keeps its mask; reset reuses it") {
  draft_tree t(2);
  t.reset(0);
  t.add_node(0, 1);
  t.reserve(200);
  node_index prev = 1;
  for (token_id k = 2; k < 150; ++k) prev = t.add_node(prev, k);
  CHECK(t.size() == 150);
  CHECK(t.mask_stride() == 4);
  CHECK(t.is_ancestor_or_self(1, 149));
  CHECK(t.is_ancestor_or_self(100, 149));
  CHECK(!t.is_ancestor_or_self(149, 100));
  t.reset(7);
  CHECK(t.size() == 1);
  CHECK(t.root() == 7);
  CHECK(t.capacity() == 200);
  CHECK(t.is_ancestor_or_self(0, 0));
}

TEST_CASE("to_dot names every node and edge") {
  std::vector<std::vector<token_id>> paths{{1, 2}, {3}};
  auto t = draft_tree::from_paths(0, paths);
  std::string dot = t.to_dot([](token_id id) { return id == 3 ? std::string("\"q\"") : "t"; });
  CHECK(dot.find("digraph") == 0);
  CHECK(dot.find("n0 -> n1") != std::string::npos);
  CHECK(dot.find("n1 -> n2") != std::string::npos);
  CHECK(dot.find("n0 -> n3") != std::string::npos);
  CHECK(dot.find("\\\"q\\\"") != std::string::npos);
}

TEST_CASE("positions and path_to: where a tree is scored and what accepting a node accepts") {
  // 0 -> 1 -> 3, 0 -> 2
  specdec::draft_tree t(4);
  t.reset(10);
  auto const a = t.add_node(0, 11);
  auto const b = t.add_node(0, 12);
  auto const c = t.add_node(a, 13);
  std::vector<specdec::position_t> pos;
  t.positions(7, pos);
  CHECK(pos == std::vector<specdec::position_t>{7, 8, 8, 9});
  std::vector<specdec::node_index> path;
  t.path_to(c, path);
  CHECK(path == std::vector<specdec::node_index>{a, c});
  t.path_to(b, path);
  CHECK(path == std::vector<specdec::node_index>{b});
  t.path_to(0, path);
  CHECK(path.empty());
}
