// Edge cases of every verifier: q = 0 for a drafted token, p = q, a residual with no mass,
// one-hot targets, a vocabulary of 1, an empty draft, NaN/Inf inputs, token ids >= vocab, shape
// errors, and the RNG contract (which word decides what; advance by tree.size()).

#include "support/doctest.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "sampling/rows.hpp"
#include "specdec/core/error.hpp"
#include "specdec/sampling/draw.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"
#include "support/errors.hpp"

namespace {

using specdec::draft_tree;
using specdec::errc;
using specdec::matrix_view;
using specdec::node_index;
using specdec::philox;
using specdec::sampler;
using specdec::sampling_params;
using specdec::token_id;
using specdec::verify_result;

using sampling_test::ninf;

sampler temperature_one() {
  return sampler(sampling_params{});
}
sampler greedy_policy() {
  sampling_params p;
  p.temperature = 0.0f;
  return sampler(p);
}

// Logits whose softmax is exactly proportional to `p` (log p; -inf where p = 0).
std::vector<float> logits_of(std::vector<float> const& p) {
  std::vector<float> out;
  for (float x : p) out.push_back(x > 0.0f ? std::log(x) : ninf);
  return out;
}

// `rows` copies of the same row.
std::vector<float> repeat(std::vector<float> const& row, std::size_t rows) {
  std::vector<float> out;
  for (std::size_t i = 0; i < rows; ++i) out.insert(out.end(), row.begin(), row.end());
  return out;
}

matrix_view<float const> view(std::vector<float> const& data, std::size_t vocab) {
  return matrix_view<float const>(data.data(), data.size() / vocab, vocab);
}

// A chain root -> drafts with every q row set to `q`.
draft_tree chain_with_q(token_id root, std::vector<token_id> const& drafts,
                        std::vector<float> const& q) {
  draft_tree t(drafts.size() + 1);
  t.enable_q(q.size());
  t.reset(root);
  node_index prev = 0;
  for (token_id d : drafts) {
    std::copy(q.begin(), q.end(), t.q_row(prev).begin());
    prev = t.add_node(prev, d);
  }
  return t;
}

using test_support::code_of;

}  // namespace

TEST_CASE("a drafted token with q = 0 is accepted iff p > 0, without dividing by zero") {
  std::vector<float> const q{0.5f, 0.5f, 0.0f, 0.0f};
  std::vector<float> const p{0.25f, 0.25f, 0.5f, 0.0f};
  auto const logits = repeat(logits_of(p), 2);
  sampler const policy = temperature_one();
  std::vector<token_id> const history{0};
  verify_result out;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    {  // p(2) = 0.5 > 0 = q(2): always accepted
      auto const tree = chain_with_q(0, {2}, q);
      philox rng(seed);
      specdec::speculative_sampling_verifier v;
      v.verify(tree, view(logits, 4), policy, history, rng, out);
      REQUIRE(out.num_accepted() == 1);
      CHECK(out.tokens[0] == 2);
      specdec::tree_verifier tv;
      philox rng2(seed);
      tv.verify(tree, view(logits, 4), policy, history, rng2, out);
      CHECK(out.num_accepted() == 1);
    }
    {  // p(3) = 0 = q(3): always rejected; the residual max(p - q, 0) = {0, 0, .5, 0} gives 2
      auto const tree = chain_with_q(0, {3}, q);
      philox rng(seed);
      specdec::speculative_sampling_verifier v;
      v.verify(tree, view(logits, 4), policy, history, rng, out);
      CHECK(out.num_accepted() == 0);
      REQUIRE(out.tokens.size() == 1);
      CHECK(out.tokens[0] == 2);
    }
  }
}

TEST_CASE("p = q accepts every drafted token; the bonus comes from the last row") {
  std::vector<float> const p{0.1f, 0.2f, 0.3f, 0.4f};
  auto const logits = repeat(logits_of(p), 4);
  sampler const policy = temperature_one();
  // q must be the policy's own p for the test to mean p = q exactly.
  std::vector<float> pf(4);
  policy.distribution(logits_of(p), std::vector<token_id>{1}, pf);
  verify_result out;
  for (std::uint64_t seed = 0; seed < 300; ++seed) {
    auto const tree = chain_with_q(1, {3, 0, 2}, pf);
    philox rng(seed);
    specdec::speculative_sampling_verifier v;
    v.verify(tree, view(logits, 4), policy, std::vector<token_id>{1}, rng, out);
    REQUIRE(out.num_accepted() == 3);
    philox const r0(seed);
    CHECK(out.bonus() == specdec::sample_from(pf, r0.uniform_at(0)));
  }
}

TEST_CASE("a residual with no mass falls back to p") {
  // p = q, and the drafted token has p = q = 0: it is rejected, max(p - q, 0) = 0, so the token
  // is drawn from p with word 0.
  std::vector<float> const p{0.5f, 0.0f, 0.25f, 0.25f};
  sampler const policy = temperature_one();
  std::vector<float> pf(4);
  policy.distribution(logits_of(p), std::vector<token_id>{0}, pf);
  auto const logits = repeat(logits_of(p), 2);
  verify_result out;
  for (std::uint64_t seed = 0; seed < 300; ++seed) {
    auto const tree = chain_with_q(0, {1}, pf);
    philox rng(seed);
    specdec::speculative_sampling_verifier v;
    v.verify(tree, view(logits, 4), policy, std::vector<token_id>{0}, rng, out);
    CHECK(out.num_accepted() == 0);
    philox const r0(seed);
    CHECK(out.bonus() == specdec::sample_from(pf, r0.uniform_at(0)));
    // The same through the probability rows and the tree verifier.
    auto const probs = repeat(pf, 2);
    philox rng2(seed);
    specdec::tree_verifier tv;
    tv.verify_probs(tree, view(probs, 4), rng2, out);
    CHECK(out.num_accepted() == 0);
    CHECK(out.bonus() == specdec::sample_from(pf, r0.uniform_at(0)));
  }
}

TEST_CASE("point masses covering the whole support: the last one is always accepted") {
  // Three candidates for a vocabulary of 3: after two rejections the third holds all the mass.
  std::vector<float> const p{0.2f, 0.3f, 0.5f};
  sampler const policy = temperature_one();
  auto const tree = draft_tree::from_parents(std::vector<token_id>{0, 0, 1, 2},
                                             std::vector<node_index>{-1, 0, 0, 0});
  auto const logits = repeat(logits_of(p), 4);
  verify_result out;
  std::size_t accepted[3] = {0, 0, 0};
  for (std::uint64_t seed = 0; seed < 3000; ++seed) {
    philox rng(seed);
    specdec::tree_verifier v;
    v.verify(tree, view(logits, 3), policy, std::vector<token_id>{0}, rng, out);
    REQUIRE(out.num_accepted() == 1);  // never "all rejected"
    ++accepted[out.tokens[0]];
  }
  // Loose sanity on the frequencies (the lossless suite does the real test).
  CHECK(accepted[0] > 450);
  CHECK(accepted[1] > 750);
  CHECK(accepted[2] > 1300);
}

TEST_CASE("one-hot targets: only the target token is accepted, and it is the bonus") {
  std::vector<float> const row{ninf, 2.0f, ninf, ninf, ninf};  // p = one-hot at 1
  auto const logits = repeat(row, 4);
  sampler const policy = temperature_one();
  std::vector<float> const q{0.2f, 0.2f, 0.2f, 0.2f, 0.2f};
  verify_result out;
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    {
      auto const tree = chain_with_q(1, {1, 1, 3}, q);
      philox rng(seed);
      specdec::speculative_sampling_verifier v;
      v.verify(tree, view(logits, 5), policy, std::vector<token_id>{1}, rng, out);
      CHECK(out.num_accepted() == 2);
      CHECK(out.tokens == std::vector<token_id>{1, 1, 1});
    }
    {  // point masses, a tree: only child 1 of the root can be accepted
      auto const tree = draft_tree::from_parents(std::vector<token_id>{1, 4, 1, 0, 1},
                                                 std::vector<node_index>{-1, 0, 0, 2, 2});
      philox rng(seed);
      specdec::tree_verifier v;
      v.verify(tree, view(repeat(row, 5), 5), policy, std::vector<token_id>{1}, rng, out);
      CHECK(out.accepted_nodes == std::vector<node_index>{2, 4});
      CHECK(out.tokens == std::vector<token_id>{1, 1, 1});
    }
  }
}

TEST_CASE("a vocabulary of 1 works for every verifier") {
  auto const tree = draft_tree::chain(0, std::vector<token_id>{0, 0});
  std::vector<float> const logits{0.5f, -1.0f, 3.0f};
  sampler const policy = temperature_one();
  sampler const greedy = greedy_policy();
  std::vector<token_id> const history{0};
  verify_result out;
  philox rng(5);
  specdec::greedy_verifier g;
  g.verify(tree, view(logits, 1), greedy, history, rng, out);
  CHECK(out.tokens == std::vector<token_id>{0, 0, 0});
  specdec::speculative_sampling_verifier s;
  s.verify(tree, view(logits, 1), policy, history, rng, out);
  CHECK(out.tokens == std::vector<token_id>{0, 0, 0});
  specdec::tree_verifier t;
  t.verify(tree, view(logits, 1), policy, history, rng, out);
  CHECK(out.tokens == std::vector<token_id>{0, 0, 0});
  specdec::typical_acceptance_verifier ta;
  ta.verify(tree, view(logits, 1), policy, history, rng, out);
  CHECK(out.tokens == std::vector<token_id>{0, 0, 0});
  CHECK(rng.offset() == 12);
  // With q rows of one entry.
  auto const tq = chain_with_q(0, {0, 0}, std::vector<float>{1.0f});
  s.verify(tq, view(logits, 1), policy, history, rng, out);
  CHECK(out.tokens == std::vector<token_id>{0, 0, 0});
}

TEST_CASE("an empty draft yields the bonus token only, drawn with word 0") {
  std::vector<float> const p{0.1f, 0.6f, 0.3f};
  auto const logits = logits_of(p);
  sampler const policy = temperature_one();
  std::vector<float> pf(3);
  policy.distribution(logits, std::vector<token_id>{2}, pf);
  draft_tree tree(4);
  tree.reset(2);
  verify_result out;
  for (std::uint64_t seed = 0; seed < 100; ++seed) {
    philox const start(seed, 1, 17);
    token_id const expected = specdec::sample_from(pf, start.uniform_at(0));
    philox rng = start;
    specdec::speculative_sampling_verifier s;
    s.verify(tree, view(logits, 3), policy, std::vector<token_id>{2}, rng, out);
    CHECK(out.num_accepted() == 0);
    CHECK(out.tokens == std::vector<token_id>{expected});
    CHECK(rng.offset() == start.offset() + 1);
    specdec::tree_verifier t;
    t.verify(tree, view(logits, 3), policy, std::vector<token_id>{2}, rng, out);
    CHECK(out.tokens.size() == 1);
    specdec::typical_acceptance_verifier ta;
    rng = start;
    ta.verify(tree, view(logits, 3), policy, std::vector<token_id>{2}, rng, out);
    CHECK(out.tokens == std::vector<token_id>{expected});
  }
  philox rng(1);
  specdec::greedy_verifier g;
  g.verify(tree, view(logits, 3), greedy_policy(), std::vector<token_id>{2}, rng, out);
  CHECK(out.tokens == std::vector<token_id>{1});
  CHECK(rng.offset() == 1);
}

TEST_CASE("NaN and Inf logits raise specdec::error and leave the generator untouched") {
  auto const tree = draft_tree::chain(0, std::vector<token_id>{1, 2});
  sampler const policy = temperature_one();
  sampler const greedy = greedy_policy();
  std::vector<token_id> const history{0};
  float const nan = std::numeric_limits<float>::quiet_NaN();
  float const inf = std::numeric_limits<float>::infinity();
  for (float bad : {nan, inf}) {
    for (std::size_t at : {0u, 2u, 4u}) {
      std::vector<float> logits(3 * 5, 0.5f);
      logits[at] = bad;  // in the root row, which every verifier processes
      verify_result out;
      philox rng(1, 0, 10);
      specdec::greedy_verifier g;
      CHECK(code_of([&] { g.verify(tree, view(logits, 5), greedy, history, rng, out); }) ==
            errc::numerical);
      specdec::speculative_sampling_verifier s;
      CHECK(code_of([&] { s.verify(tree, view(logits, 5), policy, history, rng, out); }) ==
            errc::numerical);
      specdec::tree_verifier t;
      CHECK(code_of([&] { t.verify(tree, view(logits, 5), policy, history, rng, out); }) ==
            errc::numerical);
      specdec::typical_acceptance_verifier ta;
      CHECK(code_of([&] { ta.verify(tree, view(logits, 5), policy, history, rng, out); }) ==
            errc::numerical);
      CHECK(rng.offset() == 10);
    }
  }
  // NaN / Inf in probability rows and q rows.
  std::vector<float> probs(3 * 5, 0.2f);
  verify_result out;
  philox rng(2);
  specdec::speculative_sampling_verifier s;
  probs[1] = nan;  // gathered: the drafted token 1 at the root
  CHECK(code_of([&] { s.verify_probs(tree, view(probs, 5), rng, out); }) == errc::numerical);
  probs[1] = 0.2f;
  probs[3] = inf;   // not gathered, but read by the final draw at the root when token 1 is rejected
  probs[1] = 0.0f;  // ... which it is (p = 0)
  CHECK(code_of([&] { s.verify_probs(tree, view(probs, 5), rng, out); }) == errc::numerical);
  auto tq = chain_with_q(0, {1, 2}, std::vector<float>(5, 0.2f));
  tq.q_row(0)[4] = nan;
  std::vector<float> logits(3 * 5, 0.5f);
  CHECK(code_of([&] { s.verify(tq, view(logits, 5), policy, history, rng, out); }) ==
        errc::numerical);
  CHECK(rng.offset() == 0);
}

TEST_CASE("token ids >= vocab and shape mismatches raise specdec::error") {
  std::vector<float> logits(3 * 5, 0.5f);
  sampler const policy = temperature_one();
  sampler const greedy = greedy_policy();
  std::vector<token_id> const history{0};
  verify_result out;
  philox rng(3);
  auto const bad_token = draft_tree::chain(0, std::vector<token_id>{1, 5});
  specdec::greedy_verifier g;
  specdec::speculative_sampling_verifier s;
  specdec::tree_verifier t;
  specdec::typical_acceptance_verifier ta;
  CHECK(code_of([&] { g.verify(bad_token, view(logits, 5), greedy, history, rng, out); }) ==
        errc::out_of_range);
  CHECK(code_of([&] { s.verify(bad_token, view(logits, 5), policy, history, rng, out); }) ==
        errc::out_of_range);
  CHECK(code_of([&] { t.verify(bad_token, view(logits, 5), policy, history, rng, out); }) ==
        errc::out_of_range);
  CHECK(code_of([&] { ta.verify(bad_token, view(logits, 5), policy, history, rng, out); }) ==
        errc::out_of_range);
  CHECK(code_of([&] { s.verify_probs(bad_token, view(logits, 5), rng, out); }) ==
        errc::out_of_range);
  CHECK(code_of([&] { ta.verify_probs(bad_token, view(logits, 5), rng, out); }) ==
        errc::out_of_range);
  // A bad root token, too.
  auto const bad_root = draft_tree::chain(9, std::vector<token_id>{});
  matrix_view<float const> const one_row(logits.data(), 1, 5);
  CHECK(code_of([&] { t.verify(bad_root, one_row, policy, history, rng, out); }) ==
        errc::out_of_range);

  auto const chain = draft_tree::chain(0, std::vector<token_id>{1});  // 2 nodes, 3 rows
  CHECK(code_of([&] { s.verify(chain, view(logits, 5), policy, history, rng, out); }) ==
        errc::invalid_argument);
  CHECK(code_of([&] { g.verify_probs(chain, view(logits, 5), rng, out); }) ==
        errc::invalid_argument);
  auto const tree =
      draft_tree::from_parents(std::vector<token_id>{0, 1, 2}, std::vector<node_index>{-1, 0, 0});
  CHECK(code_of([&] { s.verify(tree, view(logits, 5), policy, history, rng, out); }) ==
        errc::invalid_argument);  // not a chain
  CHECK(code_of([&] { g.verify(tree, view(logits, 5), policy, history, rng, out); }) ==
        errc::invalid_argument);  // policy not greedy
  auto const q4 = chain_with_q(0, {1, 2}, std::vector<float>(4, 0.25f));
  CHECK(code_of([&] { s.verify(q4, view(logits, 5), policy, history, rng, out); }) ==
        errc::invalid_argument);  // q vocabulary 4, rows of 5
  CHECK(code_of([&] { s.verify_probs(q4, view(logits, 5), rng, out); }) == errc::invalid_argument);
  CHECK(code_of([] {
          specdec::typical_acceptance_verifier bad({1.0f, 0.3f});
        }) == errc::invalid_argument);
  CHECK(code_of([] {
          specdec::typical_acceptance_verifier bad({0.1f, -1.0f});
        }) == errc::invalid_argument);
  CHECK(rng.offset() == 0);
}

TEST_CASE("RNG contract: node j's test reads word offset + j, the final draw word offset + 0") {
  // Point-mass chain over a vocabulary of 2 with p = {0.6, 0.4} at every node: node j (token 0)
  // is accepted iff uniform_at(j) < 0.6 (mass 1); after a rejection at node j the token is 1.
  std::vector<float> const p{0.6f, 0.4f};
  sampler const policy = temperature_one();
  std::vector<float> pf(2);
  policy.distribution(logits_of(p), std::vector<token_id>{0}, pf);
  auto const tree = draft_tree::chain(0, std::vector<token_id>{0, 0, 0, 0});
  auto const logits = repeat(logits_of(p), 5);
  verify_result out;
  for (std::uint64_t seed = 0; seed < 500; ++seed) {
    philox const start(seed, 9, 3 * seed);
    std::vector<token_id> expected;
    std::size_t j = 1;
    for (; j <= 4; ++j) {
      if (start.uniform_at(j) * 1.0f < pf[0]) {
        expected.push_back(0);
      } else {
        break;
      }
    }
    if (j <= 4) {
      expected.push_back(1);  // residual: p with token 0 removed
    } else {
      expected.push_back(specdec::sample_from(pf, start.uniform_at(0)));
    }
    philox rng = start;
    specdec::speculative_sampling_verifier v;
    v.verify(tree, view(logits, 2), policy, std::vector<token_id>{0}, rng, out);
    CHECK(out.tokens == expected);
    CHECK(rng.offset() == start.offset() + 5);
  }
}

TEST_CASE("penalty-aware policies see the history extended by the path to each node") {
  // Repetition penalty 100, greedy: a token already in the history (or on the path) loses. Every
  // row prefers token 0, then 1, then 2, ...; the root is 4.
  sampling_params sp;
  sp.temperature = 0.0f;
  sp.repetition_penalty = 100.0f;
  sampler const policy(sp);
  std::vector<float> const row{5.0f, 4.0f, 3.0f, 2.0f, 1.0f};
  auto const tree = draft_tree::chain(4, std::vector<token_id>{0, 1, 2});
  auto const logits = repeat(row, 4);
  verify_result out;
  philox rng(1);
  specdec::greedy_verifier g;
  g.verify(tree, view(logits, 5), policy, std::vector<token_id>{4}, rng, out);
  CHECK(out.tokens == std::vector<token_id>{0, 1, 2, 3});
  // A draft that repeats a path token is rejected there.
  auto const repeat_tree = draft_tree::chain(4, std::vector<token_id>{0, 0});
  g.verify(repeat_tree, view(repeat(row, 3), 5), policy, std::vector<token_id>{4}, rng, out);
  CHECK(out.tokens == std::vector<token_id>{0, 1});
}

TEST_CASE("q rows the walk uses are validated; unreached ones are not read") {
  sampler const policy = temperature_one();
  std::vector<token_id> const history{0};
  std::vector<float> logits(3 * 4, 0.0f);
  verify_result out;
  specdec::speculative_sampling_verifier s;
  specdec::tree_verifier t;
  auto bad_sum = chain_with_q(0, {1, 2}, std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f});
  bad_sum.q_row(0)[0] = 0.5f;  // the root's q row sums to 1.25
  philox rng(4);
  CHECK(code_of([&] { s.verify(bad_sum, view(logits, 4), policy, history, rng, out); }) ==
        errc::numerical);
  auto negative = chain_with_q(0, {1, 2}, std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f});
  negative.q_row(0)[0] = -0.25f;
  negative.q_row(0)[3] = 0.75f;  // sums to 1 but has a negative entry
  CHECK(code_of([&] { t.verify(negative, view(logits, 4), policy, history, rng, out); }) ==
        errc::numerical);
  CHECK(rng.offset() == 0);
  // A broken q row below a rejected draft is never used, so it is not read: the root's draft
  // (token 3, p = 0 under these logits) is always rejected.
  std::vector<float> row{0.0f, 0.0f, 0.0f, -std::numeric_limits<float>::infinity()};
  auto unreached = chain_with_q(0, {3, 2}, std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f});
  unreached.q_row(1)[0] = std::numeric_limits<float>::quiet_NaN();
  s.verify(unreached, view(repeat(row, 3), 4), policy, history, rng, out);
  CHECK(out.num_accepted() == 0);
  CHECK(rng.offset() == 3);
}

TEST_CASE("a negative or NaN q entry is found wherever it sits in the row") {
  // 200 entries: three full 64-entry blocks of the vectorised check and a tail of 8.
  constexpr std::size_t vocab = 200;
  sampler const policy = temperature_one();
  std::vector<token_id> const history{0};
  std::vector<float> const logits(3 * vocab, 0.0f);
  specdec::speculative_sampling_verifier s;
  verify_result out;
  for (std::size_t at : {std::size_t{0}, std::size_t{17}, std::size_t{64}, std::size_t{133},
                         std::size_t{191}, std::size_t{192}, std::size_t{199}}) {
    for (bool nan : {false, true}) {
      std::vector<float> q(vocab, 1.0f / static_cast<float>(vocab));
      auto tree = chain_with_q(0, {1, 2}, q);
      std::size_t const other = at == 5 ? 6 : 5;
      if (nan) {
        tree.q_row(0)[at] = std::numeric_limits<float>::quiet_NaN();
      } else {
        float const was = tree.q_row(0)[at];
        tree.q_row(0)[at] = -0.25f;  // moved elsewhere: the sum stays 1
        tree.q_row(0)[other] += 0.25f + was;
      }
      philox rng(4);
      CAPTURE(at);
      CAPTURE(nan);
      CHECK(code_of([&] { s.verify(tree, view(logits, vocab), policy, history, rng, out); }) ==
            errc::numerical);
      CHECK(rng.offset() == 0);
    }
  }
  // The same row without the bad entry passes.
  std::vector<float> const q(vocab, 1.0f / static_cast<float>(vocab));
  philox rng(4);
  s.verify(chain_with_q(0, {1, 2}, q), view(logits, vocab), policy, history, rng, out);
  CHECK(rng.offset() == 3);
}

TEST_CASE("the walk's uniform reader gives uniform_at's values in any order of offsets") {
  // It keeps one Philox block; jumping between blocks and back must never return a kept word
  // for another position.
  for (std::uint64_t offset :
       {std::uint64_t{0}, std::uint64_t{3}, std::uint64_t{5}, (std::uint64_t{1} << 34) + 2}) {
    philox const rng(77, 5, offset);
    specdec::detail::uniform_reader reader(rng);
    for (std::uint64_t delta : {0, 1, 2, 3, 4, 9, 1, 0, 17, 16, 5, 4, 63, 0}) {
      INFO("offset ", offset, " delta ", delta);
      CHECK(reader.at(delta) == rng.uniform_at(delta));
    }
  }
}

TEST_CASE("verify with a checked history decides as with an unchecked one, chains and trees") {
  // A checked history only spares the policy its history check; decisions and generator use must
  // not change, whatever the rows.
  constexpr std::size_t vocab = 50;
  std::mt19937_64 gen(91);
  std::normal_distribution<float> logit(0.0f, 2.0f);
  sampler const policy = temperature_one();
  specdec::speculative_sampling_verifier s;
  specdec::tree_verifier t;
  std::vector<token_id> const history{3, 7, 11};
  for (int rep = 0; rep < 200; ++rep) {
    std::vector<float> q(vocab);
    std::vector<float> ql(vocab);
    for (float& v : ql) v = logit(gen);
    policy.distribution(ql, history, q);
    std::vector<token_id> drafts;
    for (int d = 0; d < 4; ++d) drafts.push_back(static_cast<token_id>(gen() % vocab));
    auto const tree = chain_with_q(history.back(), drafts, q);
    std::vector<float> logits(tree.size() * vocab);
    for (float& v : logits) v = logit(gen);
    philox r1(static_cast<std::uint64_t>(rep)), r2 = r1, r3 = r1, r4 = r1;
    verify_result a, b, c, d;
    s.verify(tree, view(logits, vocab), policy, history, r1, a);
    s.verify(tree, view(logits, vocab), policy, specdec::token_history::checked(history), r2, b);
    t.verify(tree, view(logits, vocab), policy, history, r3, c);
    t.verify(tree, view(logits, vocab), policy, specdec::token_history::checked(history), r4, d);
    CHECK(a.tokens == b.tokens);
    CHECK(a.accepted_nodes == b.accepted_nodes);
    CHECK(c.tokens == d.tokens);
    CHECK(r1.offset() == r2.offset());
    CHECK(r3.offset() == r4.offset());
  }
}

TEST_CASE("verifiers refuse a history that does not end with the tree's root") {
  // Root 3 with children 1 and 2; vocabulary 5; uniform rows.
  draft_tree tree(4);
  tree.reset(3);
  tree.add_node(0, 1);
  tree.add_node(0, 2);
  std::vector<float> logits(3 * 5, 0.0f);
  matrix_view<float const> const rows(logits.data(), 3, 5);
  std::vector<token_id> const wrong = {0, 4};  // ends with 4, not the root 3
  std::vector<token_id> const right = {0, 3};
  verify_result out;
  philox rng(1);
  specdec::greedy_verifier greedy;
  specdec::tree_verifier tree_v;
  specdec::speculative_sampling_verifier chain_v;
  specdec::typical_acceptance_verifier typical;
  auto const check = [&](auto& v, char const* who) {
    CAPTURE(who);
    CHECK_THROWS_WITH_AS(
        v.verify(tree, rows, specdec::greedy{}, specdec::token_history(wrong), rng, out),
        doctest::Contains("history ends with token 4, not with the tree's root 3"), specdec::error);
    CHECK_NOTHROW(v.verify(tree, rows, specdec::greedy{}, specdec::token_history(right), rng, out));
    CHECK_NOTHROW(v.verify(tree, rows, specdec::greedy{}, specdec::token_history(), rng, out));
  };
  check(greedy, "greedy");
  check(tree_v, "tree");
  check(typical, "typical");
  draft_tree chain(3);
  chain.reset(3);
  chain.add_node(0, 1);
  CHECK_THROWS_WITH_AS(chain_v.verify(chain, matrix_view<float const>(logits.data(), 2, 5),
                                      specdec::greedy{}, specdec::token_history(wrong), rng, out),
                       doctest::Contains("not with the tree's root 3"), specdec::error);
}
