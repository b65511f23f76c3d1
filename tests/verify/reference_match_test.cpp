// Optimised verifiers against the reference verifiers (reference/verify.hpp) on many random
// trees: with the same target distributions and the same Philox inputs they must produce the same
// accepted path and tokens, except where a decision lies within rounding of its threshold. Such
// cases are recognised by the reference's recorded margin (< 1e-5), counted and bounded (at most
// 0.5% of the cases). Also: the logits and probability entry points agree exactly, and every
// verifier advances the generator by exactly tree.size() words.

#include "support/doctest.hpp"

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "random_cases.hpp"
#include "specdec/reference/verify.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"

namespace {

using namespace verify_test;
using specdec::matrix_view;
using specdec::philox;
using specdec::sampler;
using specdec::verify_result;
namespace ref = specdec::reference;

constexpr double rounding_margin = 1e-5;

std::string show(verify_result const& r) {
  std::ostringstream s;
  s << "nodes [";
  for (auto n : r.accepted_nodes) s << ' ' << n;
  s << " ] tokens [";
  for (auto t : r.tokens) s << ' ' << t;
  s << " ]";
  return s.str();
}

bool same(verify_result const& a, verify_result const& b) {
  return a.accepted_nodes == b.accepted_nodes && a.tokens == b.tokens;
}

std::size_t pick_vocab(case_generator& g) {
  static constexpr std::size_t vocabs[] = {1, 2, 3, 5, 17, 17, 111, 111, 1000};
  return vocabs[g.below(sizeof(vocabs) / sizeof(vocabs[0]))];
}

struct tally {
  std::size_t cases = 0;
  std::size_t rounding = 0;
};

// Runs `cases` random cases through `verifier` and `reference(c, p_rows, rng, trace)`.
template <class Verifier, class Reference>
tally compare(Verifier& verifier, Reference const& reference, std::uint64_t seed, std::size_t cases,
              bool chains_only, bool greedy_only) {
  case_generator gen(seed);
  tally t;
  verify_result fast, fast_probs;
  for (std::size_t i = 0; i < cases; ++i) {
    std::size_t const vocab = pick_vocab(gen);
    std::size_t const nodes = 1 + gen.below(24);
    bool const chain = chains_only || gen.below(3) == 0;
    bool const with_q = gen.below(2) == 0;
    random_case c = gen.make(vocab, nodes, chain, with_q);
    if (greedy_only) c.params.temperature = 0.0f;
    sampler const policy(c.params);
    philox const start(seed * 1000 + i, 3, gen.below(1000));

    philox r_fast = start;
    verifier.verify(c.tree, c.rows(), policy, c.history, r_fast, fast);
    CHECK(r_fast.offset() == start.offset() + c.tree.size());

    // The probability entry point on the policy's distributions makes the same decisions.
    auto const p = ref::target_distributions(c.tree, c.rows(), policy, c.history);
    std::vector<float> probs;
    for (auto const& row : p)
      for (double x : row) probs.push_back(static_cast<float>(x));
    philox r_probs = start;
    verifier.verify_probs(c.tree, matrix_view<float const>(probs.data(), c.tree.size(), vocab),
                          r_probs, fast_probs);
    CHECK(r_probs.offset() == r_fast.offset());
    bool const probs_same = same(fast, fast_probs);
    if (!probs_same) {
      // Only the greedy path differs from the one-hot rows in how ties are resolved (none here).
      INFO("case " << i << ": verify " << show(fast) << " vs verify_probs " << show(fast_probs));
      CHECK(probs_same);
    }

    philox r_ref = start;
    ref::verify_trace trace;
    verify_result const slow = reference(c, p, policy, r_ref, trace);
    CHECK(r_ref.offset() == r_fast.offset());
    ++t.cases;
    if (same(fast, slow)) continue;
    if (trace.min_margin < rounding_margin) {
      ++t.rounding;
      continue;
    }
    INFO("case " << i << " (vocab " << vocab << ", " << c.tree.size() << " nodes, q rows " << with_q
                 << ", temperature " << c.params.temperature << "): optimised " << show(fast)
                 << " vs reference " << show(slow) << ", margin " << trace.min_margin);
    CHECK(same(fast, slow));
  }
  return t;
}

void check_tally(tally const& t, std::string const& who) {
  MESSAGE(who << ": " << t.cases << " random cases, " << t.rounding
              << " differ within rounding of a threshold");
  CHECK(t.rounding * 200 <= t.cases);
}

}  // namespace

TEST_CASE("greedy_verifier matches the reference") {
  specdec::greedy_verifier v;
  auto const r = compare(
      v,
      [](random_case const& c, ref::distribution_rows const&, sampler const& policy, philox& rng,
         ref::verify_trace&) { return ref::greedy(c.tree, c.rows(), policy, c.history, rng); },
      11, 1200, false, true);
  check_tally(r, "greedy_verifier");
  CHECK(r.rounding == 0);
}

TEST_CASE("speculative_sampling_verifier matches the reference") {
  specdec::speculative_sampling_verifier v;
  auto const r = compare(
      v,
      [](random_case const& c, ref::distribution_rows const& p, sampler const&, philox& rng,
         ref::verify_trace& trace) { return ref::speculative_sampling(c.tree, p, rng, &trace); },
      12, 1500, true, false);
  check_tally(r, "speculative_sampling_verifier");
}

TEST_CASE("tree_verifier matches the reference") {
  specdec::tree_verifier v;
  auto const r = compare(
      v,
      [](random_case const& c, ref::distribution_rows const& p, sampler const&, philox& rng,
         ref::verify_trace& trace) { return ref::tree_sampling(c.tree, p, rng, &trace); },
      13, 2000, false, false);
  check_tally(r, "tree_verifier");
}

TEST_CASE("typical_acceptance_verifier matches the reference") {
  for (auto const params : {specdec::typical_acceptance_params{0.09f, 0.3f},
                            specdec::typical_acceptance_params{0.3f, 0.6f},
                            specdec::typical_acceptance_params{0.0f, 0.0f}}) {
    specdec::typical_acceptance_verifier v(params);
    auto const r = compare(
        v,
        [&](random_case const& c, ref::distribution_rows const& p, sampler const&, philox& rng,
            ref::verify_trace& trace) {
          return ref::typical_acceptance(c.tree, p, params.epsilon, params.delta, rng, &trace);
        },
        14, 700, false, false);
    check_tally(r, "typical_acceptance_verifier");
  }
}
