// The CUDA heads runners (backend/cuda/heads.cuh) against the slow reference (reference/heads.hpp)
// on the fixture's trained heads and random heads of other shapes, and Medusa and Hydra end to end
// on the CUDA model: greedy speculative decoding with the committed trees emits exactly the CUDA
// model's greedy autoregressive output, with the acceptance the CPU reaches.
//
// The prompts are those of decoder_test.cu, whose greedy decisions all have a clear margin (so
// that a tree forward and a one-token forward, which sum in different orders, cannot disagree on
// an argmax by rounding).

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/cuda/test_util.cuh"
#include "specdec/backend/cuda/heads.cuh"
#include "specdec/backend/cuda/llama.cuh"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/hydra.hpp"
#include "specdec/propose/medusa.hpp"
#include "specdec/reference/heads.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "support/fixture.hpp"
#include "support/heads.hpp"

namespace {

namespace sd = specdec;

static_assert(sd::medusa_heads_runner<sd::cuda_medusa_heads>);
static_assert(sd::hydra_heads_runner<sd::cuda_hydra_heads>);

}  // namespace

TEST_CASE("cuda heads: Medusa logits match the reference") {
  for (auto const& heads :
       {test_support::fixture_medusa(), test_support::random_medusa(20, 37, 3, 1, 7),
        test_support::random_medusa(70, 300, 2, 3, 8)}) {
    sd::cuda_medusa_heads runner(*heads);
    std::size_t const d = runner.hidden_size(), v = runner.vocab_size(), k = runner.num_heads();
    std::vector<float> logits(k * v);
    std::vector<float> const h = test_support::random_floats(d, 3, 2.0f);
    runner.run(h, sd::matrix_view<float>(logits.data(), k, v));
    for (std::size_t i = 0; i < k; ++i)
      test_support::check_logits_close(std::span<float const>(logits).subspan(i * v, v),
                                       sd::reference_medusa_logits(*heads, i, h), 2e-4);
  }
}

TEST_CASE("cuda heads: Hydra logits match the reference for a batch of paths") {
  auto const target = fixture::stories260k();
  struct shape {
    std::shared_ptr<sd::hydra_weights const> heads;
    std::shared_ptr<sd::llama_weights const> target;
  };
  for (shape const& s :
       {shape{test_support::fixture_hydra(), target},
        shape{test_support::random_hydra(20, 37, 3, 1, 7), test_support::embedding_only(20, 37)}}) {
    sd::cuda_hydra_heads runner(*s.heads, *s.target);
    std::size_t const d = runner.hidden_size(), v = runner.vocab_size();
    std::vector<float> const h = test_support::random_floats(d, 3, 2.0f);
    for (std::size_t head = 0; head < runner.num_heads(); ++head) {
      std::size_t const n = 5;
      std::vector<sd::token_id> paths(n * (head + 1));
      for (std::size_t i = 0; i < paths.size(); ++i)
        paths[i] = static_cast<sd::token_id>((i * 31 + head * 7 + 3) % v);
      std::vector<float> logits(n * v);
      runner.run(head, h, sd::matrix_view<sd::token_id const>(paths.data(), n, head + 1),
                 sd::matrix_view<float>(logits.data(), n, v));
      for (std::size_t r = 0; r < n; ++r)
        test_support::check_logits_close(
            std::span<float const>(logits).subspan(r * v, v),
            sd::reference_hydra_logits(
                *s.heads, s.target->token_embedding, head, h,
                std::span<sd::token_id const>(paths.data() + r * (head + 1), head + 1)),
            2e-4);
    }
  }
}

TEST_CASE("cuda heads: Medusa and Hydra greedy on the CUDA model == its greedy decoding") {
  auto const weights = fixture::stories260k();
  sd::cuda_llama target(weights);
  sd::cuda_medusa_heads medusa_heads(*test_support::fixture_medusa());
  sd::cuda_hydra_heads hydra_heads(*test_support::fixture_hydra(), *weights);
  sd::medusa_proposer medusa(medusa_heads, test_support::fixture_tree("medusa"));
  sd::hydra_proposer hydra(hydra_heads, test_support::fixture_tree("hydra"));
  sd::decode_config config;
  config.max_new_tokens = 128;
  sd::autoregressive_decoder ar(target, sd::greedy{}, config);
  sd::speculative_decoder dm(target, medusa, sd::greedy_verifier{}, sd::greedy{}, config);
  sd::speculative_decoder dh(target, hydra, sd::greedy_verifier{}, sd::greedy{}, config);
  std::vector<std::vector<sd::token_id>> prompts{fixture::once_upon_a_time()};
  auto const encoded = fixture::encoded_prompts();
  for (std::size_t i : {1, 2, 3, 4, 6, 12}) prompts.push_back(encoded[i]);
  std::size_t m_steps = 0, h_steps = 0, tokens = 0;
  for (auto const& p : prompts) {
    auto const expected = ar.generate(p).tokens;
    auto const rm = dm.generate(p);
    auto const rh = dh.generate(p);
    CHECK(rm.tokens == expected);
    CHECK(rh.tokens == expected);
    m_steps += rm.stats.steps;
    h_steps += rh.stats.steps;
    tokens += expected.size();
  }
  double const m_len = static_cast<double>(tokens) / static_cast<double>(m_steps);
  double const h_len = static_cast<double>(tokens) / static_cast<double>(h_steps);
  MESSAGE("CUDA: tokens per target forward, Medusa " << m_len << ", Hydra " << h_len);
  CHECK(m_len >= 2.2);
  CHECK(h_len >= m_len + 0.2);
}
