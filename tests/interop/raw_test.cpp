#include "specdec/interop/raw.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "support/errors.hpp"

namespace sd = specdec;
namespace si = specdec::interop;

using test_support::code_of;

TEST_CASE("raw_span and raw_matrix view caller memory and reject null or overflowing shapes") {
  float buf[12] = {};
  for (int i = 0; i < 12; ++i) buf[i] = static_cast<float>(i);
  auto const s = si::raw_span(buf, 12);
  CHECK(s.data() == buf);
  CHECK(s.size() == 12);
  CHECK(si::raw_span<float>(nullptr, 0).empty());
  CHECK(code_of([] { (void)si::raw_span<float>(nullptr, 3, "logits"); }) ==
        sd::errc::invalid_argument);

  sd::matrix_view<float const> const m = si::raw_matrix<float const>(buf, 3, 4);
  CHECK(m.rows() == 3);
  CHECK(m(2, 3) == 11.0f);
  auto const strided = si::raw_matrix<float const>(buf, 2, 3, 5);
  CHECK(strided(1, 2) == 7.0f);
  CHECK(si::raw_matrix<float>(nullptr, 0, 7).empty());
  CHECK(si::raw_matrix<float>(nullptr, 5, 0).empty());
  CHECK(code_of([] { (void)si::raw_matrix<float>(nullptr, 2, 3); }) == sd::errc::invalid_argument);
  CHECK(code_of([&] { (void)si::raw_matrix(buf, 2, 5, 4); }) == sd::errc::invalid_argument);
  constexpr std::size_t huge = std::numeric_limits<std::size_t>::max() / 2;
  CHECK(code_of([&] { (void)si::raw_matrix(buf, huge, 4); }) == sd::errc::invalid_argument);
}

TEST_CASE("make_forward_request wraps C arrays and validates them") {
  sd::token_id const tokens[3] = {5, 6, 7};
  sd::position_t const positions[3] = {10, 11, 11};
  // Node 2 sees node 0 and itself (a tree: 0 -> 1, 0 -> 2).
  std::uint64_t const mask[3] = {0b001, 0b011, 0b101};
  std::int32_t const rows[2] = {1, 2};
  sd::forward_request const req = si::make_forward_request({.tokens = tokens,
                                                            .positions = positions,
                                                            .n = 3,
                                                            .mask = mask,
                                                            .logits_rows = rows,
                                                            .num_logits_rows = 2},
                                                           16, 64);
  CHECK(req.tokens.size() == 3);
  CHECK(req.tokens.data() == tokens);
  CHECK(req.mask_stride == 1);
  CHECK(req.mask.size() == 3);
  CHECK(req.visible(2, 0));
  CHECK(!req.visible(2, 1));
  CHECK(req.logits_rows.size() == 2);
  CHECK(!req.want_hidden);

  // Causal batch: no mask.
  sd::forward_request const causal =
      si::make_forward_request({.tokens = tokens, .positions = positions, .n = 2});
  CHECK(causal.mask.empty());
  CHECK(causal.visible(1, 0));

  // Errors: empty batch, null arrays, a mask stride without a mask or too short, out of vocabulary
  // or context (checked by the validating overload), bad logits rows.
  CHECK(code_of([&] {
          (void)si::make_forward_request({.tokens = tokens, .positions = positions});
        }) == sd::errc::invalid_argument);
  CHECK(code_of([&] {
          (void)si::make_forward_request({.tokens = nullptr, .positions = positions, .n = 3});
        }) == sd::errc::invalid_argument);
  CHECK(code_of([&] {
          (void)si::make_forward_request(
              {.tokens = tokens, .positions = positions, .n = 3, .mask_stride = 1});
        }) == sd::errc::invalid_argument);
  // Mask stride 0 means dense rows of mask_words(n) words; a wider stride is kept.
  std::vector<std::uint64_t> wide(3 * 2, 1);
  CHECK(
      si::make_forward_request(
          {.tokens = tokens, .positions = positions, .n = 3, .mask = wide.data(), .mask_stride = 2})
          .mask.size() == 6);
  CHECK(code_of([&] {
          (void)si::make_forward_request({.tokens = tokens, .positions = positions, .n = 3}, 7, 64);
        }) == sd::errc::out_of_range);
  CHECK(code_of([&] {
          (void)si::make_forward_request({.tokens = tokens, .positions = positions, .n = 3}, 16,
                                         11);
        }) == sd::errc::context_overflow);
  std::int32_t const bad_rows[1] = {3};
  CHECK(code_of([&] {
          (void)si::make_forward_request({.tokens = tokens,
                                          .positions = positions,
                                          .n = 3,
                                          .logits_rows = bad_rows,
                                          .num_logits_rows = 1},
                                         16, 64);
        }) == sd::errc::out_of_range);
  CHECK(code_of([&] {
          (void)si::make_forward_request(
              {.tokens = tokens, .positions = positions, .n = 3, .num_logits_rows = 1});
        }) == sd::errc::invalid_argument);
}

TEST_CASE("assign_draft_tree builds a tree from token and parent arrays") {
  // Root 9 with children 4 (node 1) and 5 (node 2); node 3 (token 6) under node 1.
  sd::token_id const tokens[4] = {9, 4, 5, 6};
  sd::node_index const parents[4] = {-1, 0, 0, 1};
  sd::draft_tree const tree = si::make_draft_tree(tokens, parents, 4);
  CHECK(tree.size() == 4);
  CHECK(tree.root() == 9);
  CHECK(tree.parent(3) == 1);
  CHECK(tree.depth(3) == 2);
  CHECK(tree.num_children(0) == 2);
  CHECK(tree.is_ancestor_or_self(1, 3));
  CHECK(!tree.is_ancestor_or_self(2, 3));
  // It equals the same tree built through the core API.
  sd::draft_tree const core = sd::draft_tree::from_parents(
      std::span<sd::token_id const>(tokens), std::span<sd::node_index const>(parents));
  CHECK(std::ranges::equal(tree.mask(), core.mask()));

  // Refilling a tree with enough capacity reuses it; q rows are copied when given.
  sd::draft_tree reused(16);
  float q[4 * 10] = {};
  for (int i = 0; i < 4; ++i) q[i * 10 + i] = 1.0f;
  si::assign_draft_tree(reused, tokens, parents, 4, q, 10);
  CHECK(reused.capacity() == 16);
  CHECK(reused.q_vocab() == 10);
  CHECK(reused.q_row(2)[2] == 1.0f);
  CHECK_NOTHROW(reused.validate(10));
  // With q rows, duplicate siblings are allowed (children drawn i.i.d.).
  sd::token_id const dup_tokens[3] = {1, 3, 3};
  sd::node_index const dup_parents[3] = {-1, 0, 0};
  CHECK_NOTHROW(si::assign_draft_tree(reused, dup_tokens, dup_parents, 3, q, 10));
  CHECK(reused.size() == 3);
  // Back to no q rows: the same duplicate is then an error and the tree is unchanged.
  CHECK(code_of([&] { si::assign_draft_tree(reused, dup_tokens, dup_parents, 3); }) ==
        sd::errc::invalid_argument);
  CHECK(reused.size() == 3);
  CHECK(reused.q_vocab() == 10);
  // A tree that needs more room grows.
  sd::draft_tree small(2);
  si::assign_draft_tree(small, tokens, parents, 4);
  CHECK(small.size() == 4);
  CHECK(small.capacity() >= 4);
}

TEST_CASE("assign_draft_tree rejects malformed arrays and leaves the tree unchanged") {
  sd::token_id const tokens[4] = {9, 4, 5, 6};
  sd::draft_tree tree(8);
  si::assign_draft_tree(tree, tokens, std::array<sd::node_index, 2>{-1, 0}.data(), 2);
  REQUIRE(tree.size() == 2);
  auto const rejects = [&](sd::token_id const* t, sd::node_index const* p, std::size_t n,
                           float const* q = nullptr, std::size_t vocab = 0) {
    sd::errc const code = code_of([&] { si::assign_draft_tree(tree, t, p, n, q, vocab); });
    CHECK(tree.size() == 2);  // untouched
    CHECK(tree.token(1) == 4);
    return code;
  };
  sd::node_index const root_with_parent[2] = {0, 0};
  sd::node_index const forward_parent[3] = {-1, 2, 0};
  sd::node_index const self_parent[3] = {-1, 0, 2};
  sd::node_index const negative_parent[3] = {-1, 0, -4};
  sd::node_index const ok[4] = {-1, 0, 0, 1};
  sd::token_id const negative_token[2] = {1, -3};
  CHECK(rejects(tokens, ok, 0) == sd::errc::invalid_argument);
  CHECK(rejects(nullptr, ok, 4) == sd::errc::invalid_argument);
  CHECK(rejects(tokens, nullptr, 4) == sd::errc::invalid_argument);
  CHECK(rejects(tokens, root_with_parent, 2) == sd::errc::invalid_argument);
  CHECK(rejects(tokens, forward_parent, 3) == sd::errc::invalid_argument);
  CHECK(rejects(tokens, self_parent, 3) == sd::errc::invalid_argument);
  CHECK(rejects(tokens, negative_parent, 3) == sd::errc::invalid_argument);
  CHECK(rejects(negative_token, ok, 2) == sd::errc::out_of_range);
  float q[4 * 6] = {};
  CHECK(rejects(tokens, ok, 4, q, 6) == sd::errc::out_of_range);  // token 9 >= vocab 6
  CHECK(rejects(tokens, ok, 4, q, 0) == sd::errc::invalid_argument);
  CHECK(rejects(tokens, ok, sd::max_tree_nodes + 1) == sd::errc::context_overflow);
}

TEST_CASE("assign_chain and copy_accepted round-trip a verification through C arrays") {
  // The engine's draft and target logits as C arrays.
  constexpr std::size_t vocab = 8;
  sd::token_id const drafts[3] = {3, 5, 1};
  float logits[4 * vocab] = {};
  logits[0 * vocab + 3] = 4.0f;  // accepts 3
  logits[1 * vocab + 5] = 4.0f;  // accepts 5
  logits[2 * vocab + 2] = 4.0f;  // rejects 1, bonus 2
  logits[3 * vocab + 7] = 4.0f;
  sd::draft_tree tree(8);
  si::assign_chain(tree, 6, drafts, 3, vocab);
  CHECK(tree.is_chain());
  CHECK(tree.size() == 4);
  sd::token_id const history[2] = {0, 6};
  sd::greedy_verifier verifier;
  sd::philox rng(3);
  sd::verify_result result;
  verifier.verify(tree, si::raw_matrix<float const>(logits, 4, vocab), sd::greedy{},
                  si::raw_span(history, 2), rng, result);
  sd::token_id out[8];
  sd::node_index nodes[8];
  std::size_t const n = si::copy_accepted(result, out, 8, nodes);
  REQUIRE(n == 3);
  CHECK(out[0] == 3);
  CHECK(out[1] == 5);
  CHECK(out[2] == 2);
  CHECK(nodes[0] == 1);
  CHECK(nodes[1] == 2);
  CHECK(code_of([&] { (void)si::copy_accepted(result, out, 2); }) == sd::errc::invalid_argument);
  CHECK(code_of([&] { (void)si::copy_accepted(result, nullptr, 8); }) ==
        sd::errc::invalid_argument);
  CHECK(code_of([&] { (void)si::copy_accepted(sd::verify_result{}, out, 8); }) ==
        sd::errc::invalid_argument);

  // Chains: bad tokens rejected, a zero-length chain is the root alone, q rows dropped.
  sd::token_id const bad[2] = {3, 9};
  CHECK(code_of([&] { si::assign_chain(tree, 6, bad, 2, vocab); }) == sd::errc::out_of_range);
  CHECK(code_of([&] { si::assign_chain(tree, 6, nullptr, 2); }) == sd::errc::invalid_argument);
  tree.enable_q(vocab);
  si::assign_chain(tree, 6, nullptr, 0);
  CHECK(tree.size() == 1);
  CHECK(!tree.has_q());

  // A sampled tree from C arrays verifies like one built through the core API.
  sd::token_id const t2[3] = {6, 3, 3};
  sd::node_index const p2[3] = {-1, 0, 0};
  float q2[3 * vocab] = {};
  q2[3] = 0.5f;
  q2[4] = 0.5f;
  for (std::size_t i = 1; i < 3; ++i) q2[i * vocab] = 1.0f;
  sd::draft_tree sampled(4);
  si::assign_draft_tree(sampled, t2, p2, 3, q2, vocab);
  sd::draft_tree core(4);
  core.enable_q(vocab);
  core.reset(6);
  (void)core.add_node(0, 3);
  (void)core.add_node(0, 3);
  core.q_row(0)[3] = 0.5f;
  core.q_row(0)[4] = 0.5f;
  core.q_row(1)[0] = 1.0f;
  core.q_row(2)[0] = 1.0f;
  sd::sampler const policy(sd::sampling_params{});  // temperature 1
  sd::tree_verifier tv;
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    sd::philox ra(seed);
    sd::philox rb(seed);
    sd::verify_result a;
    sd::verify_result b;
    tv.verify(sampled, si::raw_matrix<float const>(logits, 3, vocab), policy,
              si::raw_span(history, 2), ra, a);
    tv.verify(core, si::raw_matrix<float const>(logits, 3, vocab), policy, si::raw_span(history, 2),
              rb, b);
    CHECK(a.tokens == b.tokens);
  }
}
