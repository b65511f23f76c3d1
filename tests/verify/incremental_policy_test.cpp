// Incremental sampling policies (core/concepts.hpp `incremental_policy`) in the verifiers: a
// policy that keeps a state advanced token by token gets exactly the decisions of the same policy
// scored from histories, on random chains and trees under every verifier, while its state is
// begun once per tree and advanced once per node the walk reaches (never re-run from the history,
// which a grammar constraint could not afford).

#include "support/doctest.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "random_cases.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"

namespace {

using namespace verify_test;
using specdec::philox;
using specdec::sampler;
using specdec::token_history;
using specdec::verify_result;

// A policy that discourages repeating the token just emitted (its logit lowered by 4), over a
// `sampler`: what it needs of the past is one token. This form reads it from the history.
class no_repeat {
 public:
  explicit no_repeat(specdec::sampling_params params) : inner_(std::move(params)) {}

  void distribution(std::span<float const> logits, token_history history,
                    std::span<float> probs) const {
    inner_.distribution(lowered(logits, last_of(history)), token_history(), probs);
  }
  [[nodiscard]] token_id greedy_token(std::span<float const> logits, token_history history) const {
    return inner_.greedy_token(lowered(logits, last_of(history)), token_history());
  }
  [[nodiscard]] token_id sample(std::span<float const> probs, philox& rng) const {
    return inner_.sample(probs, rng);
  }
  [[nodiscard]] bool is_greedy() const noexcept { return inner_.is_greedy(); }

 protected:
  [[nodiscard]] static token_id last_of(token_history history) {
    return history.empty() ? specdec::no_token : history.tokens().back();
  }
  [[nodiscard]] std::span<float const> lowered(std::span<float const> logits, token_id last) const {
    row_.assign(logits.begin(), logits.end());
    if (last >= 0 && static_cast<std::size_t>(last) < row_.size()) row_[last] -= 4.0f;
    return row_;
  }

  sampler inner_;
  mutable std::vector<float> row_;
};

// The same policy with its state: the last token. Counts the calls.
class incremental_no_repeat : public no_repeat {
 public:
  using state_type = token_id;

  struct counts {
    std::size_t begins = 0;
    std::size_t advances = 0;
  };

  incremental_no_repeat(specdec::sampling_params params, counts& c)
      : no_repeat(std::move(params)), counts_(&c) {}

  using no_repeat::distribution;
  using no_repeat::greedy_token;

  [[nodiscard]] state_type begin(token_history history) const {
    ++counts_->begins;
    return last_of(history);
  }
  void advance(state_type& state, token_id token) const {
    ++counts_->advances;
    state = token;
  }
  void distribution(std::span<float const> logits, state_type const& last,
                    std::span<float> probs) const {
    inner_.distribution(lowered(logits, last), token_history(), probs);
  }
  [[nodiscard]] token_id greedy_token(std::span<float const> logits, state_type const& last) const {
    return inner_.greedy_token(lowered(logits, last), token_history());
  }

 private:
  counts* counts_;
};

static_assert(specdec::incremental_policy<incremental_no_repeat>);
static_assert(!specdec::incremental_policy<no_repeat>);

// Runs `cases` random cases through `verifier` under both forms; they must agree exactly, and the
// state must be begun once per tree and advanced at most once per node (`exact_advances`: exactly
// once per accepted node, for walks that score only the path they take).
template <class Verifier>
void compare(Verifier& verifier, std::uint64_t seed, bool chains, bool with_q, bool greedy_only,
             bool exact_advances) {
  case_generator gen(seed);
  static constexpr std::size_t vocabs[] = {2, 5, 17, 111};
  std::size_t walked_deep = 0;
  for (std::size_t i = 0; i < 400; ++i) {
    std::size_t const vocab = vocabs[gen.below(4)];
    std::size_t const nodes = 1 + gen.below(24);
    random_case c = gen.make(vocab, nodes, chains, with_q);
    if (greedy_only) c.params.temperature = 0.0f;
    c.params.repetition_penalty = 1.0f;  // the inner sampler reads no history
    c.params.frequency_penalty = 0.0f;
    c.params.presence_penalty = 0.0f;
    incremental_no_repeat::counts counts;
    no_repeat const plain(c.params);
    incremental_no_repeat const incremental(c.params, counts);
    philox rng_a(seed + i, 3), rng_b(seed + i, 3);
    verify_result a, b;
    verifier.verify(c.tree, c.rows(), plain, token_history(c.history), rng_a, a);
    verifier.verify(c.tree, c.rows(), incremental, token_history(c.history), rng_b, b);
    INFO("case ", i, " vocab ", vocab, " nodes ", c.tree.size());
    CHECK(a.accepted_nodes == b.accepted_nodes);
    CHECK(a.tokens == b.tokens);
    CHECK(rng_a.offset() == rng_b.offset());
    CHECK(counts.begins == 1);
    CHECK(counts.advances <= c.tree.size() - 1);
    if (exact_advances) CHECK(counts.advances == b.accepted_nodes.size());
    if (b.accepted_nodes.size() >= 2) ++walked_deep;
  }
  CHECK(walked_deep >= 40);  // the walks went deep, so the states along paths were exercised
}

}  // namespace

TEST_CASE("incremental policy: greedy verifier, same decisions, one advance per walked node") {
  specdec::greedy_verifier v;
  compare(v, 11, false, false, true, true);
}

TEST_CASE("incremental policy: speculative sampling, chains with q rows") {
  specdec::speculative_sampling_verifier v;
  compare(v, 12, true, true, false, true);
}

TEST_CASE("incremental policy: tree verifier, point masses and sampled children") {
  specdec::tree_verifier v;
  compare(v, 13, false, false, false, true);
  compare(v, 14, false, true, false, true);
}

TEST_CASE("incremental policy: typical acceptance advances only reached nodes") {
  specdec::typical_acceptance_verifier v;
  compare(v, 15, false, false, false, false);
}
