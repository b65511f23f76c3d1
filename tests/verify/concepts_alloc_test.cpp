// Every verifier models specdec::verifier with the library's policies, declares its traits, and
// stops allocating once warm: a second verification of the same shapes performs no allocation
// (counted by the replacement global operator new of tests/support/allocation_counter.hpp).

#include "support/doctest.hpp"

#include <vector>

#include "random_cases.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"
#include "support/allocation_counter.hpp"

namespace {

using namespace verify_test;

static_assert(specdec::verifier<specdec::greedy_verifier, specdec::sampler>);
static_assert(specdec::verifier<specdec::greedy_verifier, specdec::greedy>);
static_assert(specdec::verifier<specdec::speculative_sampling_verifier, specdec::sampler>);
static_assert(specdec::verifier<specdec::speculative_sampling_verifier, specdec::greedy>);
static_assert(specdec::verifier<specdec::tree_verifier, specdec::sampler>);
static_assert(specdec::verifier<specdec::tree_verifier, specdec::greedy>);
static_assert(specdec::verifier<specdec::typical_acceptance_verifier, specdec::sampler>);
static_assert(!specdec::verifier<specdec::tree_verifier, int>);

static_assert(specdec::greedy_verifier::greedy_only && specdec::greedy_verifier::lossless);
static_assert(!specdec::speculative_sampling_verifier::supports_trees);
static_assert(specdec::tree_verifier::supports_trees && specdec::tree_verifier::lossless);
static_assert(!specdec::typical_acceptance_verifier::lossless);

// Verifies `c` twice with fresh generators; returns the allocations of the second call.
template <class Verifier>
std::size_t second_call_allocations(Verifier& v, random_case const& c, bool probs) {
  specdec::sampler const policy(c.params);
  std::vector<float> p(c.logits.size());
  for (std::size_t i = 0; i < c.tree.size(); ++i)
    policy.distribution(c.rows().row(i), c.history,
                        std::span<float>(p).subspan(i * c.vocab, c.vocab));
  specdec::matrix_view<float const> const pv(p.data(), c.tree.size(), c.vocab);
  specdec::verify_result out;
  std::size_t made = 0;
  for (int round = 0; round < 2; ++round) {
    specdec::philox rng(7);  // the same walk both times: the policy's own scratch is warm too
    std::size_t const before = test_support::allocations();
    if (probs)
      v.verify_probs(c.tree, pv, rng, out);
    else
      v.verify(c.tree, c.rows(), policy, c.history, rng, out);
    made = test_support::allocations() - before;
  }
  return made;
}

}  // namespace

TEST_CASE("verifiers do not allocate once warm") {
  case_generator gen(99);
  for (int i = 0; i < 40; ++i) {
    bool const with_q = i % 2 == 0;
    random_case c = gen.make(i % 3 == 0 ? 1000 : 17, 12, i % 4 == 0, with_q);
    INFO("case " << i);
    if (c.tree.is_chain()) {
      specdec::speculative_sampling_verifier v;
      CHECK(second_call_allocations(v, c, false) == 0);
      CHECK(second_call_allocations(v, c, true) == 0);
    }
    specdec::tree_verifier t;
    CHECK(second_call_allocations(t, c, false) == 0);
    CHECK(second_call_allocations(t, c, true) == 0);
    specdec::typical_acceptance_verifier ta;
    CHECK(second_call_allocations(ta, c, false) == 0);
    CHECK(second_call_allocations(ta, c, true) == 0);
    c.params.temperature = 0.0f;
    specdec::greedy_verifier g;
    CHECK(second_call_allocations(g, c, false) == 0);
    CHECK(second_call_allocations(g, c, true) == 0);
  }
}
