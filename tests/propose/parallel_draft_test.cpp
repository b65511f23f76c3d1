// The parallel draft proposer (propose/parallel_draft.hpp, PARD) with the CPU backend: the chain it
// drafts is the greedy tokens of the last k rows of one forward over the committed tokens and k - 1
// mask tokens (checked against a fresh model run without a cache); the draft cache holds committed
// tokens only after each step, whatever was accepted and after an edited history; sampled drafts
// carry their rows' distributions as q rows; errors.
#include "support/doctest.hpp"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

#include "propose/context.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/propose/parallel_draft.hpp"
#include "specdec/sampling/policy.hpp"
#include "support/errors.hpp"
#include "support/fixture.hpp"

namespace parallel_draft_test {

namespace sd = specdec;
using greedy_pard = sd::parallel_draft_proposer<sd::cpu_llama, sd::greedy>;
using sampled_pard =
    sd::parallel_draft_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample>;
static_assert(sd::proposer<greedy_pard> && sd::proposer<sampled_pard>);
static_assert(!sd::produces_trees_v<greedy_pard> && !sd::needs_target_hidden_v<greedy_pard>);
static_assert(!sd::samples_drafts_v<greedy_pard> && sd::samples_drafts_v<sampled_pard>);

// The greedy tokens of the last k rows of one forward of a fresh model over `tokens` + k - 1 masks.
inline std::vector<sd::token_id> expected_chain(std::vector<sd::token_id> const& tokens,
                                                std::size_t k, sd::token_id mask) {
  sd::cpu_llama m(fixture::pard_draft(), {.threads = 1});
  std::vector<sd::token_id> in = tokens;
  in.insert(in.end(), k - 1, mask);
  std::vector<sd::position_t> pos(in.size());
  std::iota(pos.begin(), pos.end(), sd::position_t{0});
  sd::forward_result r;
  m.forward({.tokens = in, .positions = pos}, r);
  std::vector<sd::token_id> out;
  for (std::size_t j = 0; j < k; ++j) {
    std::span<float const> const row = r.logits_view().at_row(in.size() - k + j);
    out.push_back(
        static_cast<sd::token_id>(std::max_element(row.begin(), row.end()) - row.begin()));
  }
  return out;
}

inline std::vector<sd::token_id> chain_of(sd::draft_tree const& tree) {
  std::vector<sd::token_id> out;
  for (sd::node_index i = 1; static_cast<std::size_t>(i) < tree.size(); ++i) {
    REQUIRE(tree.parent(i) == i - 1);
    out.push_back(tree.token(i));
  }
  return out;
}

}  // namespace parallel_draft_test

TEST_CASE("parallel draft proposer: one forward's rows, the cache, acceptance and edits") {
  using namespace parallel_draft_test;
  sd::cpu_llama draft(fixture::pard_draft(), {.threads = 1});
  greedy_pard p(draft, 512, sd::greedy{}, {.k = 6, .mask_token = 0});
  CHECK(p.max_nodes() == 6);
  std::vector<sd::token_id> seq = fixture::reference_ids();
  seq.resize(40);
  p.begin(std::span<sd::token_id const>(seq).first(5));
  sd::draft_tree tree(64);
  // Step 1: the prompt of 5 tokens; the chain is the one forward's last 6 rows' greedy tokens.
  std::span<sd::token_id const> ctx_tokens = std::span<sd::token_id const>(seq).first(5);
  p.propose(propose_test::make_ctx(ctx_tokens, 64), tree);
  CHECK(chain_of(tree) == expected_chain({seq.begin(), seq.begin() + 5}, 6, 0));
  CHECK(p.cached() == 5);
  CHECK(draft.cache().size() == 5);  // the masks left the cache
  // Two accepted, then the next step from 8 committed tokens.
  p.accept({});
  p.propose(propose_test::make_ctx(std::span<sd::token_id const>(seq).first(8), 64), tree);
  CHECK(chain_of(tree) == expected_chain({seq.begin(), seq.begin() + 8}, 6, 0));
  CHECK(draft.cache().size() == 8);
  // A budget of 2, then an edited history (token 6 changed, the tokens after it the same): the
  // cache is cut back to the edit.
  p.propose(propose_test::make_ctx(std::span<sd::token_id const>(seq).first(12), 2), tree);
  std::vector<sd::token_id> const twelve = expected_chain({seq.begin(), seq.begin() + 12}, 6, 0);
  CHECK(chain_of(tree) == std::vector<sd::token_id>(twelve.begin(), twelve.begin() + 2));
  std::vector<sd::token_id> edited(seq.begin(), seq.begin() + 14);
  edited[6] = edited[6] == 300 ? 301 : 300;
  p.propose(propose_test::make_ctx(edited, 64), tree);
  CHECK(chain_of(tree) == expected_chain(edited, 6, 0));
  CHECK(draft.cache().size() == 14);
}

TEST_CASE("parallel draft proposer: sampled drafts carry their rows' distributions") {
  using namespace parallel_draft_test;
  sd::cpu_llama draft(fixture::pard_draft(), {.threads = 1});
  sd::sampling_params params;
  params.temperature = 1.0f;
  sampled_pard p(draft, 512, sd::sampler(params), {.k = 4, .mask_token = 0});
  std::vector<sd::token_id> const prompt = fixture::once_upon_a_time();
  p.begin(prompt);
  sd::draft_tree tree(64);
  sd::philox rng(3, 0);
  p.propose(propose_test::make_ctx(prompt, 64, &rng), tree);
  REQUIRE(tree.size() == 5);
  REQUIRE(tree.has_q());
  // Row j's q is the softmax of the one forward's row j, whatever was drawn before it.
  sd::cpu_llama m(fixture::pard_draft(), {.threads = 1});
  std::vector<sd::token_id> in = prompt;
  in.insert(in.end(), 3, 0);
  std::vector<sd::position_t> pos(in.size());
  std::iota(pos.begin(), pos.end(), sd::position_t{0});
  sd::forward_result r;
  m.forward({.tokens = in, .positions = pos}, r);
  for (std::size_t j = 0; j < 4; ++j) {
    CAPTURE(j);
    std::span<float const> const row = r.logits_view().at_row(prompt.size() - 1 + j);
    float const top = *std::max_element(row.begin(), row.end());
    double sum = 0.0;
    for (float x : row) sum += std::exp(static_cast<double>(x - top));
    std::span<float const> const q = tree.q_row(static_cast<sd::node_index>(j));
    double worst = 0.0;
    for (std::size_t v = 0; v < row.size(); ++v)
      worst = std::max(worst, std::abs(q[v] - std::exp(static_cast<double>(row[v] - top)) / sum));
    CHECK(worst < 1e-5);
    CHECK(q[static_cast<std::size_t>(tree.token(static_cast<sd::node_index>(j + 1)))] > 0.0f);
  }
}

TEST_CASE("parallel draft proposer: errors") {
  using namespace parallel_draft_test;
  using test_support::check_error;
  sd::cpu_llama draft(fixture::pard_draft(), {.threads = 1});
  check_error([&] { greedy_pard p(draft, 1000, sd::greedy{}, {.k = 4}); },
              sd::errc::invalid_argument, "a draft of 512 tokens for a target of 1000");
  check_error([&] { greedy_pard p(draft, 512, sd::greedy{}, {.k = 4, .mask_token = 512}); },
              sd::errc::invalid_argument, "mask token 512 is outside the vocabulary of 512");
  check_error([&] { greedy_pard p(draft, 512, sd::greedy{}, {.k = 0}); },
              sd::errc::invalid_argument, "k = 0 is outside");
}
