// sparse_kv_proposer's selections: SnapKV's pooled top positions and TriForce's chunk retrieval
// against obvious references (ties included); the selection a proposer makes on the target equals
// the one computed from the prompt's own attention statistics (SnapKV: the prefill's last window
// of queries; retrieval: the root's query); configuration errors; a target that returns no
// attention statistics is refused with a clear error.
#include "specdec/propose/sparse_kv.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "decode/one_thread.hpp"
#include "propose/context.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/target_handle.hpp"
#include "specdec/sampling/policy.hpp"
#include "support/errors.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

namespace {

// Random small integers as floats: sums and means are exact, so ties are real ties.
std::vector<float> integer_scores(std::mt19937_64& rng, std::size_t n, std::uint64_t range) {
  std::vector<float> s(n);
  for (float& x : s) x = static_cast<float>(rng() % range);
  return s;
}

// The `keep` positions of [0, horizon) ranked by key (descending, ties to the earlier), ascending;
// positions below `first` always kept and ranked apart.
std::vector<std::int32_t> best(std::vector<float> const& key, std::size_t keep,
                               std::size_t first = 0) {
  std::vector<std::int32_t> idx(key.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin() + static_cast<std::ptrdiff_t>(first), idx.end(),
                   [&](std::int32_t a, std::int32_t b) {
                     return key[static_cast<std::size_t>(a)] > key[static_cast<std::size_t>(b)];
                   });
  idx.resize(keep);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

TEST_CASE("snapkv_select: the pooled top positions of each list, against a reference") {
  std::mt19937_64 rng(3);
  for (int round = 0; round < 300; ++round) {
    CAPTURE(round);
    std::size_t const lists = 1 + rng() % 4, horizon = 1 + rng() % 40;
    std::size_t const stride = horizon + rng() % 5, keep = 1 + rng() % horizon;
    std::size_t const pool = 1 + 2 * (rng() % 4);
    std::vector<float> const scores = integer_scores(rng, lists * stride, 1 + rng() % 6);
    std::vector<std::int32_t> got;
    sd::snapkv_select(scores, stride, horizon, keep, pool, got);
    REQUIRE(got.size() == lists * keep);
    for (std::size_t i = 0; i < lists; ++i) {
      std::vector<float> pooled(horizon, 0.0f);
      for (std::size_t j = 0; j < horizon; ++j)
        for (std::size_t a = 0; a < horizon; ++a)
          if (a + pool / 2 >= j && a <= j + pool / 2) pooled[j] += scores[i * stride + a];
      std::vector<std::int32_t> const want = best(pooled, keep);
      CHECK(std::vector<std::int32_t>(got.begin() + static_cast<std::ptrdiff_t>(i * keep),
                                      got.begin() + static_cast<std::ptrdiff_t>((i + 1) * keep)) ==
            want);
    }
  }
}

TEST_CASE("retrieval_select: chunk 0 and the best chunks by mean logit, against a reference") {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 300; ++round) {
    CAPTURE(round);
    std::size_t const lists = 1 + rng() % 4, chunk = 1 + rng() % 5;
    std::size_t const horizon = chunk + rng() % 40;  // at least one whole chunk
    std::size_t const total = horizon / chunk, chunks = 1 + rng() % total;
    std::size_t const stride = horizon + rng() % 5;
    std::vector<float> const logits = integer_scores(rng, lists * stride, 1 + rng() % 8);
    std::vector<std::int32_t> got;
    sd::retrieval_select(logits, stride, horizon, chunk, chunks, got);
    REQUIRE(got.size() == lists * chunks * chunk);
    for (std::size_t i = 0; i < lists; ++i) {
      std::vector<float> mean(total, 0.0f);
      for (std::size_t c = 0; c < total; ++c) {
        float sum = 0.0f;
        for (std::size_t j = c * chunk; j < (c + 1) * chunk; ++j) sum += logits[i * stride + j];
        mean[c] = sum / static_cast<float>(chunk);
      }
      std::vector<std::int32_t> want;
      for (std::int32_t const c : best(mean, chunks, 1))
        for (std::size_t j = 0; j < chunk; ++j)
          want.push_back(static_cast<std::int32_t>(static_cast<std::size_t>(c) * chunk + j));
      CHECK(std::vector<std::int32_t>(
                got.begin() + static_cast<std::ptrdiff_t>(i * chunks * chunk),
                got.begin() + static_cast<std::ptrdiff_t>((i + 1) * chunks * chunk)) == want);
      CHECK(got[i * chunks * chunk] == 0);  // chunk 0 is always kept
    }
  }
}

TEST_CASE("sparse_kv_proposer: the selection is the one the prompt's attention gives") {
  // The decoder's part, played here: the target's cache holds the prompt but its last token (the
  // root); the proposer selects its view at its first draft.
  auto const weights = fixture::stories260k();
  std::vector<sd::token_id> prompt = fixture::once_upon_a_time();
  std::vector<sd::token_id> const more = fixture::reference_continuation();
  prompt.insert(prompt.end(), more.begin(), more.begin() + 80);
  std::size_t const t = prompt.size(), window = 8, budget = 40, keep = budget - window;
  std::size_t const horizon = t - 1 - window;
  auto const prefill = [&](sd::cpu_llama& m, std::size_t n) {
    std::vector<sd::position_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    sd::forward_result out;
    m.forward({.tokens = std::span<sd::token_id const>(prompt).first(n), .positions = pos}, out);
  };
  // A context of t + 4 leaves room for 5 observed rows only: SnapKV observes those.
  for (std::size_t const context : {std::size_t{0}, t + 4})
    for (sd::kv_policy const policy : {sd::kv_policy::snapkv, sd::kv_policy::retrieval}) {
      CAPTURE(static_cast<int>(policy));
      CAPTURE(context);
      bool const snap = policy == sd::kv_policy::snapkv;
      sd::cpu_llama target(weights, {.threads = 1, .max_context = context});
      prefill(target, t - 1);
      sd::target_handle handle(target);
      handle.set_committed(t - 1);
      sd::sparse_kv_proposer<sd::greedy> p({.policy = policy, .budget = budget, .window = window},
                                           sd::greedy{});
      p.begin(prompt);
      CHECK(p.view().positions.empty());
      sd::draft_tree tree(9);
      sd::propose_context ctx = propose_test::make_ctx(prompt, 8);
      ctx.target = &handle;
      p.propose(ctx, tree);
      CHECK(target.cache().size() == t - 1);  // the observation and the drafts are gone
      CHECK(tree.num_drafted() > 0);
      // The same statistics from a model that prefilled the prompt up to the observed rows and then
      // scored them: SnapKV's last `window` prompt tokens, retrieval's root.
      std::size_t const rows = snap ? (context == 0 ? window : 5) : 1;
      sd::cpu_llama other(weights, decode_test::one_thread());
      prefill(other, t - rows);
      std::vector<sd::position_t> pos(rows);
      std::iota(pos.begin(), pos.end(), static_cast<sd::position_t>(t - rows));
      sd::forward_result out;
      other.forward(
          {.tokens = std::span<sd::token_id const>(prompt).last(rows),
           .positions = pos,
           .kv_scores = {.kind = snap ? sd::kv_score_kind::probability : sd::kv_score_kind::logit,
                         .rows = rows}},
          out);
      std::vector<std::int32_t> want;
      if (snap)
        sd::snapkv_select(out.kv_scores, out.kv_score_positions, horizon, keep, 5, want);
      else
        sd::retrieval_select(out.kv_scores, out.kv_score_positions, horizon, 8, keep / 8, want);
      sd::kv_view const view = p.view();
      CHECK(view.per_head == keep);
      CHECK(view.window == window);
      CHECK(view.sinks == 0);
      CHECK(std::vector<std::int32_t>(view.positions.begin(), view.positions.end()) == want);
      // A new request selects again.
      p.begin(prompt);
      CHECK(p.view().positions.empty());
    }
}

namespace {

// cpu_llama that claims views but returns no attention statistics.
struct no_scores_model {
  sd::cpu_llama m;
  void forward(sd::forward_request const& req, sd::forward_result& out) {
    m.forward(req, out);
    out.kv_scores.clear();
    out.kv_score_positions = 0;
  }
  sd::contiguous_cache& cache() { return m.cache(); }
  [[nodiscard]] std::size_t vocab_size() const { return m.vocab_size(); }
  [[nodiscard]] std::size_t max_context() const { return m.max_context(); }
};

}  // namespace

TEST_CASE("sparse_kv_proposer: a target without attention statistics is refused") {
  no_scores_model target{sd::cpu_llama(fixture::stories260k(), decode_test::one_thread())};
  std::vector<sd::token_id> prompt = fixture::reference_continuation();
  prompt.resize(60);
  std::vector<sd::position_t> pos(59);
  std::iota(pos.begin(), pos.end(), 0);
  sd::forward_result out;
  target.forward({.tokens = std::span<sd::token_id const>(prompt).first(59), .positions = pos},
                 out);
  sd::target_handle handle(target);
  handle.set_committed(59);
  sd::sparse_kv_proposer<sd::greedy> p({.policy = sd::kv_policy::snapkv, .budget = 24, .window = 8},
                                       sd::greedy{});
  p.begin(prompt);
  sd::draft_tree tree(9);
  sd::propose_context ctx = propose_test::make_ctx(prompt, 8);
  ctx.target = &handle;
  CHECK(test_support::expect_error([&] { p.propose(ctx, tree); }, sd::errc::invalid_argument)
            .find("no attention statistics") != std::string::npos);
  CHECK(target.cache().size() == 59);
  // Drafting again fails again: no draft over a view that was never selected.
  test_support::expect_error([&] { p.propose(ctx, tree); }, sd::errc::invalid_argument);
  CHECK(target.cache().size() == 59);
}

TEST_CASE("sparse_kv_config: out-of-domain fields are refused") {
  using sd::kv_policy;
  using test_support::expect_error;
  sd::sparse_kv_config{}.validate();
  sd::sparse_kv_config{.policy = kv_policy::snapkv}.validate();
  sd::sparse_kv_config{.policy = kv_policy::retrieval}.validate();
  CHECK(expect_error([] { sd::sparse_kv_config{.sinks = 16, .budget = 16}.validate(); },
                     sd::errc::invalid_argument)
            .find("must exceed sinks") != std::string::npos);
  for (kv_policy const policy : {kv_policy::snapkv, kv_policy::retrieval}) {
    expect_error([&] { sd::sparse_kv_config{.policy = policy, .budget = 32}.validate(); },
                 sd::errc::invalid_argument);  // budget 32 = window 32
    expect_error([&] { sd::sparse_kv_config{.policy = policy, .window = 0}.validate(); },
                 sd::errc::invalid_argument);
  }
  CHECK(
      expect_error([] { sd::sparse_kv_config{.policy = kv_policy::snapkv, .pool = 4}.validate(); },
                   sd::errc::invalid_argument)
          .find("odd") != std::string::npos);
  CHECK(expect_error(
            [] {
              sd::sparse_kv_config{.policy = kv_policy::retrieval, .budget = 36, .chunk = 8}
                  .validate();
            },
            sd::errc::invalid_argument)
            .find("chunk") != std::string::npos);
  expect_error([] { sd::sparse_kv_config{.policy = kv_policy::retrieval, .chunk = 0}.validate(); },
               sd::errc::invalid_argument);
  expect_error([] { sd::sparse_kv_proposer<sd::greedy>({.sinks = 4, .budget = 4}, {}); },
               sd::errc::invalid_argument);
}
