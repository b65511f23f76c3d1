// Typical acceptance on hand-built cases: the documented rule p(x) > min(epsilon, delta *
// exp(-H(p))), the longest accepted path (ties to the lowest node index), the bonus drawn from p
// at the last node with word 0, greedy policies, and the RNG advance.

#include "support/doctest.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

#include "specdec/sampling/draw.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/typical_acceptance.hpp"

namespace {

using specdec::draft_tree;
using specdec::matrix_view;
using specdec::node_index;
using specdec::philox;
using specdec::token_id;
using specdec::typical_acceptance_params;
using specdec::typical_acceptance_verifier;
using specdec::verify_result;

double threshold(std::vector<float> const& p, double eps, double delta) {
  double h = 0.0;
  for (float x : p)
    if (x > 0.0f) h -= static_cast<double>(x) * std::log(static_cast<double>(x));
  return std::min(eps, delta * std::exp(-h));
}

std::vector<float> flat(std::size_t n) {
  return std::vector<float>(n, 1.0f / static_cast<float>(n));
}

// Rows for a tree: row i = rows[i].
std::vector<float> stack(std::vector<std::vector<float>> const& rows) {
  std::vector<float> out;
  for (auto const& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

}  // namespace

TEST_CASE("typical acceptance: the threshold min(epsilon, delta * exp(-H))") {
  // Flat over 10: H = ln 10, delta * exp(-H) = 0.03 < epsilon = 0.09: every token (p = 0.1) passes.
  {
    auto const p = flat(10);
    CHECK(threshold(p, 0.09, 0.3) == doctest::Approx(0.03));
    auto const tree = draft_tree::chain(0, std::vector<token_id>{7});
    auto const rows = stack({p, p});
    typical_acceptance_verifier v;
    verify_result out;
    philox rng(1);
    v.verify_probs(tree, matrix_view<float const>(rows.data(), 2, 10), rng, out);
    CHECK(out.accepted_nodes == std::vector<node_index>{1});
  }
  // Peaked {0.9, 0.05, 0.05}: H = 0.394, delta * exp(-H) = 0.202 > epsilon: threshold 0.09, so
  // 0.05 fails and 0.9 passes.
  {
    std::vector<float> const p{0.9f, 0.05f, 0.05f};
    CHECK(threshold(p, 0.09, 0.3) == doctest::Approx(0.09));
    auto const rows = stack({p, p});
    typical_acceptance_verifier v;
    verify_result out;
    philox rng(1);
    v.verify_probs(draft_tree::chain(0, std::vector<token_id>{1}),
                   matrix_view<float const>(rows.data(), 2, 3), rng, out);
    CHECK(out.num_accepted() == 0);
    v.verify_probs(draft_tree::chain(0, std::vector<token_id>{0}),
                   matrix_view<float const>(rows.data(), 2, 3), rng, out);
    CHECK(out.num_accepted() == 1);
  }
  // Just above and just below the threshold, with other parameters. The threshold depends on
  // the row itself, so the row is found by a fixed-point iteration: p(3) = factor * thr(row).
  {
    typical_acceptance_params const params{0.5f, 0.25f};
    std::vector<float> const base{0.4f, 0.3f, 0.2f, 0.1f};
    CHECK(threshold(base, 0.5, 0.25) == doctest::Approx(0.0695).epsilon(1e-3));
    auto const row_at = [&](double factor) {
      std::vector<float> q = base;
      double x = 0.1;
      for (int it = 0; it < 60; ++it) {
        q[3] = static_cast<float>(x);
        q[0] = 0.5f - q[3];
        x = factor * threshold(q, 0.5, 0.25);
      }
      return q;
    };
    typical_acceptance_verifier v(params);
    verify_result out;
    philox rng(2);
    for (double factor : {1.001, 0.999}) {
      auto const q = row_at(factor);
      bool const above = static_cast<double>(q[3]) > threshold(q, 0.5, 0.25);
      REQUIRE(above == (factor > 1.0));
      auto const rows = stack({q, q});
      v.verify_probs(draft_tree::chain(0, std::vector<token_id>{3}),
                     matrix_view<float const>(rows.data(), 2, 4), rng, out);
      CHECK(out.num_accepted() == (above ? 1u : 0u));
    }
  }
}

TEST_CASE("typical acceptance: the longest accepted path wins; ties go to the lowest node") {
  // Vocabulary 4. Root children: node 1 (token 0, accepted), node 2 (token 1, accepted),
  // node 3 (token 3, p = 0: rejected). Node 1 has child 4 (token 2, rejected);
  // node 2 has child 5 (token 0, accepted) which has child 6 (token 3, p = 0: rejected);
  // node 3's subtree (7) is unreachable.
  std::vector<float> const good{0.45f, 0.45f, 0.1f, 0.0f};  // H ~ 0.95: thr = min(.09, .116)
  std::vector<float> const only0{0.97f, 0.01f, 0.01f, 0.01f};
  auto const tree = draft_tree::from_parents(std::vector<token_id>{2, 0, 1, 3, 2, 0, 3, 0},
                                             std::vector<node_index>{-1, 0, 0, 0, 1, 2, 5, 3});
  auto const rows = stack({good, only0, good, good, good, good, good, good});
  typical_acceptance_verifier v;
  verify_result out;
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    philox const start(seed);
    philox rng = start;
    v.verify_probs(tree, matrix_view<float const>(rows.data(), 8, 4), rng, out);
    CHECK(out.accepted_nodes == std::vector<node_index>{2, 5});
    REQUIRE(out.tokens.size() == 3);
    CHECK(out.tokens[0] == 1);
    CHECK(out.tokens[1] == 0);
    CHECK(out.tokens[2] == specdec::sample_from(good, start.uniform_at(0)));  // p at node 5
    CHECK(rng.offset() == start.offset() + 8);
  }
  // Two accepted paths of equal depth: the one through the lower node index.
  auto const tie = draft_tree::from_parents(std::vector<token_id>{2, 0, 1, 1, 0},
                                            std::vector<node_index>{-1, 0, 0, 1, 2});
  auto const tie_rows = stack({good, good, good, good, good});
  philox rng(3);
  v.verify_probs(tie, matrix_view<float const>(tie_rows.data(), 5, 4), rng, out);
  CHECK(out.accepted_nodes == std::vector<node_index>{1, 3});
}

TEST_CASE("typical acceptance through logits and a policy; greedy policies accept the argmax") {
  std::vector<float> const p{0.6f, 0.3f, 0.1f};
  std::vector<float> logits;
  for (int i = 0; i < 3; ++i)
    for (float x : p) logits.push_back(std::log(x));
  auto const tree = draft_tree::from_parents(std::vector<token_id>{0, 2, 1, 0},
                                             std::vector<node_index>{-1, 0, 0, 2});
  std::vector<token_id> const history{0};
  typical_acceptance_verifier v;
  verify_result out;
  {
    specdec::sampler const policy{specdec::sampling_params{}};
    philox rng(5);
    v.verify(tree, matrix_view<float const>(logits.data(), 4, 3), policy, history, rng, out);
    // Token 2 (p = 0.1 > thr = min(.09, .3 * exp(-0.898)) = .09) is accepted at the root, as is
    // token 1 (node 2) whose child 0 makes the deeper path.
    CHECK(out.accepted_nodes == std::vector<node_index>{2, 3});
  }
  {
    specdec::sampling_params g;
    g.temperature = 0.0f;
    specdec::sampler const policy{g};
    philox rng(5);
    v.verify(tree, matrix_view<float const>(logits.data(), 4, 3), policy, history, rng, out);
    CHECK(out.num_accepted() == 0);  // the argmax (0) is not a child of the root
    CHECK(out.tokens == std::vector<token_id>{0});
    CHECK(rng.offset() == 4);
  }
  {  // epsilon = delta = 0: every child with p > 0 passes.
    typical_acceptance_verifier zero({0.0f, 0.0f});
    specdec::sampler const policy{specdec::sampling_params{}};
    philox rng(5);
    zero.verify(tree, matrix_view<float const>(logits.data(), 4, 3), policy, history, rng, out);
    CHECK(out.accepted_nodes == std::vector<node_index>{2, 3});
  }
}
