// The ragged batched entry points equal per-sequence calls with the same generators, for every
// verifier, through both the logits and the probability entry points; malformed batches throw.

#include "support/doctest.hpp"

#include <cstdint>
#include <span>
#include <vector>

#include "random_cases.hpp"
#include "specdec/core/error.hpp"
#include "specdec/reference/verify.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"
#include "support/errors.hpp"

namespace {

using namespace verify_test;
using specdec::matrix_view;
using specdec::philox;
using specdec::sampler;
using specdec::verify_result;

struct batch {
  std::size_t vocab = 0;
  std::vector<random_case> cases;
  std::vector<specdec::draft_tree const*> trees;
  std::vector<float> logits;  // [num_tokens, vocab]
  std::vector<float> probs;   // [num_tokens, vocab]
  std::vector<std::int32_t> cu_nodes{0};
  std::vector<std::span<token_id const>> histories;
  std::vector<philox> rngs;
};

// A ragged batch of `size` random sequences sharing `params`.
batch make_batch(std::uint64_t seed, std::size_t size, std::size_t vocab, bool chains,
                 specdec::sampling_params const& params) {
  case_generator gen(seed);
  batch b;
  b.vocab = vocab;
  sampler const policy(params);
  for (std::size_t i = 0; i < size; ++i) {
    b.cases.push_back(
        gen.make(vocab, 1 + gen.below(12), chains || gen.below(2) == 0, gen.below(2) == 0));
    b.cases.back().params = params;
  }
  for (auto const& c : b.cases) {
    b.trees.push_back(&c.tree);
    b.logits.insert(b.logits.end(), c.logits.begin(), c.logits.end());
    auto const p = specdec::reference::target_distributions(c.tree, c.rows(), policy, c.history);
    for (auto const& row : p)
      for (double x : row) b.probs.push_back(static_cast<float>(x));
    b.cu_nodes.push_back(b.cu_nodes.back() + static_cast<std::int32_t>(c.tree.size()));
    b.histories.emplace_back(c.history);
    b.rngs.emplace_back(seed, b.rngs.size(), 40 * b.rngs.size());
  }
  return b;
}

template <class Verifier>
void check_batch_equals_singles(Verifier& v, batch const& b,
                                specdec::sampling_params const& params) {
  sampler const policy(params);
  std::size_t const n = b.cases.size();
  auto const rows = static_cast<std::size_t>(b.cu_nodes.back());
  matrix_view<float const> const logits(b.logits.data(), rows, b.vocab);
  matrix_view<float const> const probs(b.probs.data(), rows, b.vocab);

  std::vector<philox> rngs = b.rngs;
  std::vector<verify_result> out(n);
  v.verify_batch(b.trees, logits, b.cu_nodes, policy, b.histories, rngs, out);
  std::vector<philox> prngs = b.rngs;
  std::vector<verify_result> pout(n);
  v.verify_probs_batch(b.trees, probs, b.cu_nodes, prngs, pout);
  for (std::size_t i = 0; i < n; ++i) {
    philox r = b.rngs[i];
    verify_result single;
    v.verify(b.cases[i].tree, b.cases[i].rows(), policy, b.cases[i].history, r, single);
    CHECK(single.accepted_nodes == out[i].accepted_nodes);
    CHECK(single.tokens == out[i].tokens);
    CHECK(r.offset() == rngs[i].offset());
    philox pr = b.rngs[i];
    auto const first = static_cast<std::size_t>(b.cu_nodes[i]);
    v.verify_probs(b.cases[i].tree, probs.subrows(first, b.cases[i].tree.size()), pr, single);
    CHECK(single.accepted_nodes == pout[i].accepted_nodes);
    CHECK(single.tokens == pout[i].tokens);
    CHECK(pr.offset() == prngs[i].offset());
  }
}

using test_support::code_of;

}  // namespace

TEST_CASE("batched entry points equal per-sequence calls") {
  specdec::sampling_params sampled;
  sampled.temperature = 0.8f;
  sampled.top_p = 0.95f;
  specdec::sampling_params penalised;
  penalised.repetition_penalty = 1.5f;
  specdec::sampling_params greedy;
  greedy.temperature = 0.0f;
  for (std::size_t vocab : {3u, 111u}) {
    for (auto const* params : {&sampled, &penalised, &greedy}) {
      {
        specdec::speculative_sampling_verifier v;
        check_batch_equals_singles(v, make_batch(vocab + 1, 32, vocab, true, *params), *params);
      }
      {
        specdec::tree_verifier v;
        check_batch_equals_singles(v, make_batch(vocab + 2, 32, vocab, false, *params), *params);
      }
      {
        specdec::typical_acceptance_verifier v;
        check_batch_equals_singles(v, make_batch(vocab + 3, 32, vocab, false, *params), *params);
      }
    }
    specdec::greedy_verifier v;
    check_batch_equals_singles(v, make_batch(vocab + 4, 32, vocab, false, greedy), greedy);
  }
}

TEST_CASE("malformed batches throw before verifying anything") {
  specdec::sampling_params params;
  batch b = make_batch(9, 4, 17, false, params);
  sampler const policy(params);
  specdec::tree_verifier v;
  auto const rows = static_cast<std::size_t>(b.cu_nodes.back());
  matrix_view<float const> const logits(b.logits.data(), rows, 17);
  std::vector<verify_result> out(4);
  std::vector<philox> rngs = b.rngs;

  auto cu = b.cu_nodes;
  cu.pop_back();  // too short
  CHECK(code_of([&] { v.verify_batch(b.trees, logits, cu, policy, b.histories, rngs, out); }) ==
        specdec::errc::invalid_argument);
  cu = b.cu_nodes;
  cu[1] += 1;  // sequence 0 claims a row of sequence 1
  CHECK(code_of([&] { v.verify_batch(b.trees, logits, cu, policy, b.histories, rngs, out); }) ==
        specdec::errc::invalid_argument);
  cu = b.cu_nodes;
  cu[0] = 1;
  CHECK(code_of([&] { v.verify_batch(b.trees, logits, cu, policy, b.histories, rngs, out); }) ==
        specdec::errc::invalid_argument);
  std::vector<philox> few(3, philox(1));
  CHECK(code_of([&] {
          v.verify_batch(b.trees, logits, b.cu_nodes, policy, b.histories, few, out);
        }) == specdec::errc::invalid_argument);
  auto hist = b.histories;
  hist.pop_back();
  CHECK(code_of([&] { v.verify_batch(b.trees, logits, b.cu_nodes, policy, hist, rngs, out); }) ==
        specdec::errc::invalid_argument);
  auto trees = b.trees;
  trees[2] = nullptr;
  CHECK(code_of([&] {
          v.verify_batch(trees, logits, b.cu_nodes, policy, b.histories, rngs, out);
        }) == specdec::errc::invalid_argument);
  matrix_view<float const> const short_rows(b.logits.data(), rows - 1, 17);
  CHECK(code_of([&] { v.verify_probs_batch(b.trees, short_rows, b.cu_nodes, rngs, out); }) ==
        specdec::errc::invalid_argument);
  for (std::size_t i = 0; i < 4; ++i) CHECK(rngs[i].offset() == b.rngs[i].offset());

  // An empty batch is fine.
  std::vector<std::int32_t> const zero{0};
  v.verify_probs_batch({}, matrix_view<float const>(), zero, {}, {});
}
