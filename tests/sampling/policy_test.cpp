// sampler and greedy: the concept, each parameter's effect, the order of operations, errors,
// agreement with the double reference on many random rows, thread safety and allocation.
#include "specdec/sampling/policy.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rows.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/reference/sampling.hpp"
#include "support/errors.hpp"

namespace sd = specdec;
using sampling_test::ninf;
using test_support::check_error;

static_assert(specdec::sampling_policy<specdec::sampler>);
static_assert(specdec::sampling_policy<specdec::greedy>);
static_assert(!specdec::sampling_policy<specdec::sampling_params>);

namespace {

std::vector<float> run(sd::sampling_params const& params, std::vector<float> const& logits,
                       std::vector<sd::token_id> const& history = {}) {
  std::vector<float> probs(logits.size(), -1.0f);
  sd::sampler(params).distribution(logits, history, probs);
  return probs;
}

// Logits whose softmax is exactly proportional to `weights`.
std::vector<float> logits_of(std::vector<double> const& weights) {
  std::vector<float> l;
  for (double w : weights) l.push_back(w > 0 ? static_cast<float>(std::log(w)) : ninf);
  return l;
}

void check_probs(std::vector<float> const& got, std::vector<double> const& want) {
  REQUIRE(got.size() == want.size());
  double total = 0.0;
  for (double w : want) total += w;
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("token ", i, ": ", got[i], " vs ", want[i] / total);
    if (want[i] == 0.0)
      CHECK(got[i] == 0.0f);
    else
      CHECK(got[i] == doctest::Approx(want[i] / total).epsilon(2e-6));
  }
}

sd::sampling_params with(auto&& edit) {
  sd::sampling_params p;
  edit(p);
  return p;
}

}  // namespace

TEST_CASE("default parameters give the plain softmax") {
  std::vector<float> const l = {0.5f, -1.0f, 2.0f, 0.0f};
  std::vector<float> soft(l.size());
  sd::softmax(l, soft);
  CHECK(run({}, l) == soft);
  CHECK_FALSE(sd::sampler({}).is_greedy());
}

TEST_CASE("temperature scales the logits") {
  std::vector<float> const l = {0.0f, 1.0f, 2.0f};
  for (float t : {0.25f, 0.5f, 2.0f, 10.0f}) {
    INFO("T = ", t);
    std::vector<double> w;
    for (float v : l) w.push_back(std::exp(v / t));
    check_probs(run(with([&](auto& p) { p.temperature = t; }), l), w);
  }
  // Extreme temperatures stay finite: a tiny T is (almost) greedy, a huge T (almost) uniform.
  auto const cold = run(with([](auto& p) { p.temperature = 1e-30f; }), {1.0f, 1.0001f, 0.5f});
  CHECK(cold == std::vector<float>{0.0f, 1.0f, 0.0f});
  auto const hot = run(with([](auto& p) { p.temperature = 1e30f; }), {1.0f, 50.0f, -50.0f});
  for (float v : hot) CHECK(v == doctest::Approx(1.0 / 3.0));
}

TEST_CASE("temperature 0 is greedy: one-hot at the argmax of the processed logits") {
  sd::sampler const s(with([](auto& p) { p.temperature = 0.0f; }));
  CHECK(s.is_greedy());
  std::vector<float> const l = {1.0f, 3.0f, 3.0f, 2.0f};
  CHECK(run(s.params(), l) == std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f});  // tie: lowest id
  CHECK(s.greedy_token(l, {}) == 1);
  // Bias and penalties apply before the argmax; top-k/top-p/min-p do not change it.
  sd::sampler const b(with([](auto& p) {
    p.temperature = 0.0f;
    p.logit_bias = {{3, 1.5f}};
    p.top_k = 1;
    p.top_p = 0.1f;
  }));
  CHECK(b.greedy_token(l, {}) == 3);
  sd::sampler const r(with([](auto& p) {
    p.temperature = 0.0f;
    p.presence_penalty = 0.5f;
  }));
  std::vector<sd::token_id> const h = {1, 2};
  CHECK(r.greedy_token(l, h) == 1);  // 2.5, 2.5 tie with 3 -> 2.0: lowest id wins
  CHECK(run(r.params(), l, h) == std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f});
  // One word per sample even when greedy.
  sd::philox rng(1);
  std::vector<float> const hot = {0.0f, 0.0f, 1.0f};
  CHECK(s.sample(hot, rng) == 2);
  CHECK(rng.offset() == 1);
}

TEST_CASE("top-k keeps exactly k tokens, ties broken toward the lower id") {
  std::vector<float> const l = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f, 0.0f};
  auto const k = [&](std::int32_t kk) { return run(with([&](auto& p) { p.top_k = kk; }), l); };
  auto const e = [](float x) { return std::exp(static_cast<double>(x)); };
  check_probs(k(1), {0, e(3), 0, 0, 0, 0});
  check_probs(k(2), {0, e(3), 0, e(3), 0, 0});
  check_probs(k(3), {0, e(3), e(2), e(3), 0, 0});  // tie at 2: token 2 (lower id) kept
  check_probs(k(4), {0, e(3), e(2), e(3), e(2), 0});
  std::vector<float> soft(l.size());
  sd::softmax(l, soft);
  CHECK(k(6) == soft);
  CHECK(k(1000) == soft);
  // More tokens asked for than finite logits: the -inf ones stay at 0.
  std::vector<float> const m = {ninf, 1.0f, ninf, 0.0f};
  auto const km = run(with([](auto& p) { p.top_k = 3; }), m);
  check_probs(km, {0, e(1), 0, e(0)});
  // All tied: the k lowest ids.
  auto const flat = run(with([](auto& p) { p.top_k = 3; }), std::vector<float>(40, 0.5f));
  for (std::size_t i = 0; i < flat.size(); ++i) CHECK(flat[i] == (i < 3 ? 1.0f / 3.0f : 0.0f));
}

TEST_CASE("top-p keeps the smallest most-probable set whose mass reaches p") {
  std::vector<float> const l = logits_of({0.15, 0.5, 0.05, 0.3});
  auto const p = [&](float pp) { return run(with([&](auto& q) { q.top_p = pp; }), l); };
  check_probs(p(0.49f), {0, 0.5, 0, 0});
  check_probs(p(0.51f), {0, 0.5, 0, 0.3});
  check_probs(p(0.79f), {0, 0.5, 0, 0.3});
  check_probs(p(0.81f), {0.15, 0.5, 0, 0.3});
  check_probs(p(0.96f), {0.15, 0.5, 0.05, 0.3});
  check_probs(p(1e-6f), {0, 0.5, 0, 0});  // always at least one token
  // Ties at the boundary: lower ids first.
  std::vector<float> const t = logits_of({0.2, 0.2, 0.2, 0.2, 0.2});
  check_probs(run(with([](auto& q) { q.top_p = 0.5f; }), t), {1, 1, 1, 0, 0});
  check_probs(run(with([](auto& q) { q.top_p = 0.3f; }), t), {1, 1, 0, 0, 0});
}

TEST_CASE("min-p drops tokens below min_p times the largest probability") {
  std::vector<float> const l = logits_of({0.15, 0.5, 0.05, 0.3});
  auto const m = [&](float mp) { return run(with([&](auto& q) { q.min_p = mp; }), l); };
  check_probs(m(0.2f), {0.15, 0.5, 0, 0.3});        // threshold 0.1
  check_probs(m(0.31f), {0, 0.5, 0, 0.3});          // threshold 0.155
  check_probs(m(0.61f), {0, 0.5, 0, 0});            // threshold 0.305
  check_probs(m(1.0f), {0, 0.5, 0, 0});             // only the maximum
  check_probs(m(0.0999f), {0.15, 0.5, 0.05, 0.3});  // 0.05 >= 0.04995: kept
}

TEST_CASE("repetition, frequency and presence penalties follow the HF / OpenAI rules") {
  std::vector<float> const l = {2.0f, -2.0f, 1.0f, 0.0f};
  std::vector<sd::token_id> const h = {0, 1, 0, 0, 3};  // token 0 three times, 1 and 3 once
  auto const e = [](double x) { return std::exp(x); };
  // Repetition: positive logits divided, negative multiplied, once per token whatever the count.
  check_probs(run(with([](auto& p) { p.repetition_penalty = 2.0f; }), l, h),
              {e(1.0), e(-4.0), e(1.0), e(0.0)});
  check_probs(run(with([](auto& p) { p.repetition_penalty = 0.5f; }), l, h),
              {e(4.0), e(-1.0), e(1.0), e(0.0)});
  // Frequency: minus f per occurrence.
  check_probs(run(with([](auto& p) { p.frequency_penalty = 0.5f; }), l, h),
              {e(0.5), e(-2.5), e(1.0), e(-0.5)});
  // Presence: minus p once; negative values reward.
  check_probs(run(with([](auto& p) { p.presence_penalty = -1.0f; }), l, h),
              {e(3.0), e(-1.0), e(1.0), e(1.0)});
  // All three, in order: repetition, frequency, presence.
  check_probs(run(with([](auto& p) {
                    p.repetition_penalty = 2.0f;
                    p.frequency_penalty = 0.25f;
                    p.presence_penalty = 0.5f;
                  }),
                  l, h),
              {e(1.0 - 0.75 - 0.5), e(-4.0 - 0.25 - 0.5), e(1.0), e(0.0 - 0.25 - 0.5)});
  // No history: no effect.
  std::vector<float> soft(l.size());
  sd::softmax(l, soft);
  CHECK(run(with([](auto& p) { p.frequency_penalty = 3.0f; }), l) == soft);
}

TEST_CASE("penalty_last_n: the penalties count only the last N tokens of the history") {
  std::vector<float> const l = {2.0f, -2.0f, 1.0f, 0.0f};
  std::vector<sd::token_id> const h = {0, 1, 0, 0, 3};  // the last 2: 0 and 3, once each
  auto const e = [](double x) { return std::exp(x); };
  auto const window = [](std::size_t n) {
    return with([n](auto& p) {
      p.frequency_penalty = 0.5f;
      p.repetition_penalty = 2.0f;
      p.penalty_last_n = n;
    });
  };
  check_probs(run(window(2), l, h), {e(1.0 - 0.5), e(-2.0), e(1.0), e(-0.5)});
  check_probs(run(window(1), l, h), {e(2.0), e(-2.0), e(1.0), e(-0.5)});
  // A window of the whole history or more, and 0, count every token.
  auto const whole = run(window(0), l, h);
  check_probs(whole, {e(1.0 - 1.5), e(-4.0 - 0.5), e(1.0), e(-0.5)});
  CHECK(run(window(5), l, h) == whole);
  CHECK(run(window(1000), l, h) == whole);
  // Greedy decoding sees the same window, and the double reference agrees.
  sd::sampling_params greedy = window(1);
  greedy.temperature = 0.0f;
  CHECK(sd::sampler(greedy).greedy_token(l, h) == 0);
  greedy.penalty_last_n = 0;
  CHECK(sd::sampler(greedy).greedy_token(l, h) == 2);
  for (std::size_t n : {0, 1, 2, 3, 7}) {
    CAPTURE(n);
    auto const want = sd::reference_distribution(window(n), l, h);
    auto const got = run(window(n), l, h);
    for (std::size_t i = 0; i < l.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]));
  }
}

TEST_CASE("logit bias adds to the logits; -inf bans a token; repeated entries add up") {
  std::vector<float> const l = {0.0f, 0.0f, 0.0f};
  auto const e = [](double x) { return std::exp(x); };
  check_probs(run(with([](auto& p) { p.logit_bias = {{2, 1.0f}}; }), l), {1, 1, e(1)});
  check_probs(run(with([](auto& p) { p.logit_bias = {{0, ninf}}; }), l), {0, 1, 1});
  check_probs(run(with([](auto& p) {
                    p.logit_bias = {{1, 0.5f}, {1, 0.25f}};
                  }),
                  l),
              {1, e(0.75), 1});
}

TEST_CASE("the steps run in the documented order") {
  auto const e = [](double x) { return std::exp(x); };
  // Bias before penalties: -1 + 2 = 1 > 0 is then divided by 2 (penalties first would give 0).
  check_probs(run(with([](auto& p) {
                    p.logit_bias = {{0, 2.0f}};
                    p.repetition_penalty = 2.0f;
                  }),
                  {-1.0f, 0.0f}, {0}),
              {e(0.5), e(0.0)});
  // Penalties before temperature: the presence penalty is scaled by 1 / T too.
  check_probs(run(with([](auto& p) {
                    p.presence_penalty = 1.0f;
                    p.temperature = 0.5f;
                  }),
                  {0.0f, 0.0f}, {0}),
              {e(-2.0), e(0.0)});
  // Top-k before top-p: top-p measures mass within the k kept tokens (4/7 >= 0.5 keeps one).
  std::vector<float> const l = logits_of({0.4, 0.3, 0.2, 0.1});
  check_probs(run(with([](auto& p) { p.top_p = 0.5f; }), l), {0.4, 0.3, 0, 0});
  check_probs(run(with([](auto& p) {
                    p.top_k = 2;
                    p.top_p = 0.5f;
                  }),
                  l),
              {1, 0, 0, 0});
  // Temperature before top-p: sharpening concentrates mass (T = 0.5 squares the weights:
  // 0.16, 0.09, 0.04, 0.01 -> 0.16 / 0.30 = 0.533 >= 0.5 keeps one).
  check_probs(run(with([](auto& p) {
                    p.temperature = 0.5f;
                    p.top_p = 0.5f;
                  }),
                  l),
              {1, 0, 0, 0});
  // Min-p after top-p: both apply (intersection), min-p relative to the largest probability.
  check_probs(run(with([](auto& p) {
                    p.top_p = 0.95f;
                    p.min_p = 0.4f;
                  }),
                  l),
              {0.4, 0.3, 0.2, 0});
}

TEST_CASE("a vocabulary of one works for every setting") {
  std::vector<float> const l = {-3.0f};
  std::vector<sd::token_id> const h = {0, 0};
  for (auto const& params :
       {sd::sampling_params{}, with([](auto& p) { p.temperature = 0.0f; }), with([](auto& p) {
          p.top_k = 1;
          p.top_p = 0.1f;
          p.min_p = 0.9f;
          p.repetition_penalty = 1.3f;
          p.frequency_penalty = 1.0f;
          p.presence_penalty = 1.0f;
          p.logit_bias = {{0, 2.0f}};
        })}) {
    sd::sampler const s(params);
    std::vector<float> probs(1);
    s.distribution(l, h, probs);
    CHECK(probs[0] == 1.0f);
    sd::philox rng(9);
    CHECK(s.sample(probs, rng) == 0);
    CHECK(s.greedy_token(l, h) == 0);
  }
  sd::greedy const g;
  std::vector<float> probs(1);
  g.distribution(l, {}, probs);
  CHECK(probs[0] == 1.0f);
}

TEST_CASE("bad parameters are rejected with the field and value") {
  auto const bad = [](auto edit, sd::errc code, std::string const& what) {
    check_error([&] { sd::sampler s(with(edit)); }, code, what);
  };
  float const nan = std::numeric_limits<float>::quiet_NaN();
  float const inf = std::numeric_limits<float>::infinity();
  bad([](auto& p) { p.temperature = -0.5f; }, sd::errc::invalid_argument, "temperature = -0.5");
  bad([&](auto& p) { p.temperature = nan; }, sd::errc::invalid_argument, "temperature = nan");
  bad([&](auto& p) { p.temperature = inf; }, sd::errc::invalid_argument, "temperature = inf");
  bad([](auto& p) { p.top_k = -1; }, sd::errc::invalid_argument, "top_k = -1");
  bad([](auto& p) { p.top_p = 0.0f; }, sd::errc::invalid_argument, "top_p = 0");
  bad([](auto& p) { p.top_p = 1.5f; }, sd::errc::invalid_argument, "top_p = 1.5");
  bad([&](auto& p) { p.top_p = nan; }, sd::errc::invalid_argument, "top_p = nan");
  bad([](auto& p) { p.min_p = -0.1f; }, sd::errc::invalid_argument, "min_p = -0.1");
  bad([](auto& p) { p.min_p = 1.1f; }, sd::errc::invalid_argument, "min_p = 1.1");
  bad([](auto& p) { p.repetition_penalty = 0.0f; }, sd::errc::invalid_argument,
      "repetition_penalty = 0");
  bad([&](auto& p) { p.repetition_penalty = inf; }, sd::errc::invalid_argument,
      "repetition_penalty = inf");
  bad([&](auto& p) { p.frequency_penalty = nan; }, sd::errc::invalid_argument,
      "frequency_penalty = nan");
  bad([&](auto& p) { p.presence_penalty = -inf; }, sd::errc::invalid_argument,
      "presence_penalty = -inf");
  bad(
      [](auto& p) {
        p.logit_bias = {{1, 0.5f}, {-3, 1.0f}};
      },
      sd::errc::out_of_range, "logit_bias[1] has token id -3");
  bad(
      [&](auto& p) {
        p.logit_bias = {{4, nan}};
      },
      sd::errc::invalid_argument, "logit_bias[0] (token 4) = nan");
  bad(
      [&](auto& p) {
        p.logit_bias = {{4, inf}};
      },
      sd::errc::invalid_argument, "logit_bias[0] (token 4) = inf");
  CHECK_NOTHROW(sd::sampler(with([&](auto& p) { p.logit_bias = {{4, -inf}}; })));
}

TEST_CASE("bad rows and token ids are rejected") {
  std::vector<float> const l = {0.0f, 1.0f, 2.0f};
  std::vector<float> probs(3);
  float const nan = std::numeric_limits<float>::quiet_NaN();
  float const inf = std::numeric_limits<float>::infinity();
  sd::sampler const s({});
  sd::sampler const g(with([](auto& p) { p.temperature = 0.0f; }));
  sd::sampler const k(with([](auto& p) { p.top_k = 2; }));
  for (sd::sampler const* x : {&s, &g, &k}) {
    check_error(
        [&] {
          x->distribution(std::vector<float>{0, nan, 1}, {}, probs);
        },
        sd::errc::numerical, "logit 1 of 3 is NaN");
    check_error(
        [&] {
          x->distribution(std::vector<float>{0, 1, inf}, {}, probs);
        },
        sd::errc::numerical, "logit 2 of 3 is +inf");
    check_error([&] { x->distribution(std::vector<float>(3, ninf), {}, probs); },
                sd::errc::numerical, "no finite logit");
    check_error(
        [&] {
          x->distribution(l, std::vector<sd::token_id>{0, 3}, probs);
        },
        sd::errc::out_of_range, "history[1] = 3");
    check_error([&] { x->distribution(l, std::vector<sd::token_id>{-1}, probs); },
                sd::errc::out_of_range, "history[0] = -1");
    check_error([&] { (void)x->greedy_token(l, std::vector<sd::token_id>{7}); },
                sd::errc::out_of_range, "history[0] = 7");
    check_error([&] { x->distribution(l, {}, std::span<float>(probs.data(), 2)); },
                sd::errc::invalid_argument, "3 logits but 2 probabilities");
    check_error([&] { x->distribution(std::vector<float>{}, {}, std::span<float>{}); },
                sd::errc::invalid_argument, "empty");
  }
  sd::sampler const biased(with([](auto& p) { p.logit_bias = {{5, 1.0f}}; }));
  check_error([&] { biased.distribution(l, {}, probs); }, sd::errc::out_of_range,
              "logit_bias names token 5");
  check_error([&] { (void)biased.greedy_token(l, {}); }, sd::errc::out_of_range,
              "logit_bias names token 5");
  // +inf logit banned by a -inf bias is NaN after processing: still an error.
  sd::sampler const ban(with([](auto& p) { p.logit_bias = {{2, ninf}}; }));
  check_error(
      [&] {
        ban.distribution(std::vector<float>{0, 1, inf}, {}, probs);
      },
      sd::errc::numerical, "logit 2 of 3 is NaN");
  // Banning every token leaves no finite logit.
  sd::sampler const ban_all(with([](auto& p) {
    p.logit_bias = {{0, ninf}, {1, ninf}, {2, ninf}};
  }));
  check_error([&] { ban_all.distribution(l, {}, probs); }, sd::errc::numerical, "no finite logit");
  // The greedy policy checks rows too.
  sd::greedy const gr;
  check_error(
      [&] {
        gr.distribution(std::vector<float>{nan, 0, 0}, {}, probs);
      },
      sd::errc::numerical, "logit 0 of 3 is NaN");
  check_error([&] { (void)gr.greedy_token(l, std::vector<sd::token_id>{3}); },
              sd::errc::out_of_range, "history[0] = 3");
}

TEST_CASE("greedy writes a one-hot row at the argmax, ties to the lowest id") {
  sd::greedy const g;
  CHECK(g.is_greedy());
  CHECK(g.params().temperature == 0.0f);
  std::vector<float> const l = {1.0f, 4.0f, ninf, 4.0f};
  std::vector<float> probs(4, -1.0f);
  g.distribution(l, std::vector<sd::token_id>{1, 1}, probs);  // greedy applies no penalties
  CHECK(probs == std::vector<float>{0.0f, 1.0f, 0.0f, 0.0f});
  CHECK(g.greedy_token(l, {}) == 1);
  sd::philox rng(4, 2);
  CHECK(g.sample(probs, rng) == 1);
  CHECK(rng.offset() == 1);
  // Agrees with a temperature-0 sampler without processing on random rows.
  sd::sampler const s(with([](auto& p) { p.temperature = 0.0f; }));
  std::mt19937_64 gen(1);
  for (auto kind : {sampling_test::row_kind::ties, sampling_test::row_kind::neg_inf}) {
    std::vector<float> const r = sampling_test::make_row(kind, 5000, gen);
    CHECK(g.greedy_token(r, {}) == s.greedy_token(r, {}));
    CHECK(g.greedy_token(r, {}) == sd::reference_argmax(r));
  }
}

TEST_CASE("a checked history gives the same row and skips only an unread history's check") {
  std::mt19937_64 gen(81);
  std::vector<float> const l = sampling_test::make_row(sampling_test::row_kind::peaked, 700, gen);
  std::vector<sd::token_id> const h = {1, 2, 3, 1, 650};
  for (bool penalties : {false, true}) {
    sd::sampler const s(with([&](auto& p) {
      p.temperature = 0.8f;
      p.top_p = penalties ? 0.9f : 1.0f;
      if (penalties) p.repetition_penalty = 1.3f;
    }));
    std::vector<float> a(l.size()), b(l.size());
    s.distribution(l, h, a);
    s.distribution(l, sd::token_history::checked(h), b);
    CHECK(a == b);
    // A bad history: an unchecked one always says so; a checked one only where the history is
    // read (penalties), since the caller vouched for it.
    std::vector<sd::token_id> const bad = {1, 700};
    check_error([&] { s.distribution(l, bad, a); }, sd::errc::out_of_range, "history[1] = 700");
    if (penalties)
      check_error([&] { s.distribution(l, sd::token_history::checked(bad), b); },
                  sd::errc::out_of_range, "history[1] = 700");
    else
      CHECK_NOTHROW(s.distribution(l, sd::token_history::checked(bad), b));
  }
}

TEST_CASE("distribution can run in place") {
  std::mt19937_64 gen(8);
  std::vector<float> const l = sampling_test::make_row(sampling_test::row_kind::peaked, 3000, gen);
  sd::sampler const s(with([](auto& p) {
    p.top_k = 100;
    p.top_p = 0.9f;
    p.frequency_penalty = 0.5f;
    p.logit_bias = {{5, 3.0f}};
  }));
  std::vector<sd::token_id> const h = {1, 2, 3, 1};
  std::vector<float> out(l.size());
  s.distribution(l, h, out);
  std::vector<float> inplace = l;
  s.distribution(inplace, h, inplace);
  CHECK(inplace == out);
}

TEST_CASE("the sampler matches the double reference on random rows") {
  using sampling_test::row_kind;
  std::mt19937_64 gen(20240601);
  std::size_t rows = 0, same_support = 0, boundary = 0;
  auto const one = [&](std::size_t vocab, row_kind kind, int trials) {
    for (int trial = 0; trial < trials; ++trial) {
      std::vector<float> const l = sampling_test::make_row(kind, vocab, gen);
      bool const exact = sampling_test::exact_processing(kind);
      sd::sampling_params const params = sampling_test::make_params(vocab, exact, gen);
      std::vector<sd::token_id> const h =
          exact ? sampling_test::make_history(vocab, static_cast<std::size_t>(trial % 40), gen)
                : std::vector<sd::token_id>{};
      std::string const what = std::string("vocab ") + std::to_string(vocab) + " kind " +
                               sampling_test::name(kind) + " trial " + std::to_string(trial) +
                               " T " + std::to_string(params.temperature) + " k " +
                               std::to_string(params.top_k) + " p " + std::to_string(params.top_p) +
                               " min_p " + std::to_string(params.min_p);
      auto const c = sampling_test::compare_with_reference(params, l, h, what);
      ++rows;
      same_support += c.same_support ? 1 : 0;
      boundary += c.boundary_differences;
    }
  };
  for (std::size_t vocab : {1u, 3u, 17u, 111u}) {
    for (auto kind : {row_kind::flat, row_kind::peaked, row_kind::ties, row_kind::neg_inf,
                      row_kind::grid, row_kind::huge})
      one(vocab, kind, 60);
  }
  for (auto kind : {row_kind::flat, row_kind::peaked, row_kind::ties, row_kind::neg_inf,
                    row_kind::grid, row_kind::huge})
    one(32000, kind, 6);
  MESSAGE(rows, " rows compared; ", same_support, " with identical support; ", boundary,
          " boundary tokens kept by one side only");
  CHECK(same_support * 100 >= rows * 98);  // boundary cases are rare
}

TEST_CASE("distribution is safe to call concurrently on one sampler") {
  sd::sampler const s(with([](auto& p) {
    p.top_k = 40;
    p.top_p = 0.9f;
    p.min_p = 0.01f;
    p.repetition_penalty = 1.2f;
    p.frequency_penalty = 0.3f;
  }));
  std::mt19937_64 gen(99);
  constexpr int rows = 8;
  std::vector<std::vector<float>> logits, expected;
  std::vector<std::vector<sd::token_id>> hist;
  for (int r = 0; r < rows; ++r) {
    logits.push_back(sampling_test::make_row(sampling_test::row_kind::peaked,
                                             2000 + static_cast<std::size_t>(r) * 777, gen));
    hist.push_back(sampling_test::make_history(logits.back().size(), 50, gen));
    expected.emplace_back(logits.back().size());
    s.distribution(logits.back(), hist.back(), expected.back());
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        auto const r = static_cast<std::size_t>((t + rep) % rows);
        std::vector<float> out(logits[r].size());
        s.distribution(logits[r], hist[r], out);
        if (out != expected[r]) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(mismatches.load() == 0);
}

TEST_CASE("every top-k / top-p selection path agrees with the reference") {
  // Rows large enough for the threshold passes, the sparse and dense top-k finishes, the
  // narrowing passes of top-p on flat rows, and massive ties at the cut (the `ties` rows).
  using sampling_test::row_kind;
  std::mt19937_64 gen(31337);
  std::size_t rows = 0, same_support = 0;
  auto const check = [&](sd::sampling_params const& params, std::vector<float> const& l,
                         std::string const& what) {
    auto const c = sampling_test::compare_with_reference(params, l, {}, what);
    ++rows;
    same_support += c.same_support ? 1 : 0;
  };
  for (std::size_t vocab : {600u, 5000u, 32000u}) {
    for (auto kind :
         {row_kind::flat, row_kind::peaked, row_kind::ties, row_kind::neg_inf, row_kind::grid}) {
      std::vector<float> const l = sampling_test::make_row(kind, vocab, gen);
      std::string const where =
          "vocab " + std::to_string(vocab) + " kind " + sampling_test::name(kind);
      for (std::int32_t k :
           {1, 7, 50, 400, 513, 1500, 5000, 20000, static_cast<std::int32_t>(vocab) - 1}) {
        if (static_cast<std::size_t>(k) >= vocab) continue;
        check(with([&](auto& p) { p.top_k = k; }), l, where + " top_k " + std::to_string(k));
      }
      for (float tp : {0.05f, 0.3f, 0.9f, 0.999f}) {
        check(with([&](auto& p) {
                p.top_p = tp;
                p.temperature = 0.7f;
              }),
              l, where + " top_p " + std::to_string(tp));
        check(with([&](auto& p) {
                p.top_p = tp;
                p.min_p = 0.3f;
              }),
              l, where + " top_p " + std::to_string(tp) + " min_p 0.3");
        check(with([&](auto& p) {
                p.top_p = tp;
                p.top_k = 3000;
              }),
              l, where + " top_p " + std::to_string(tp) + " top_k 3000");
      }
      check(with([](auto& p) { p.min_p = 0.5f; }), l, where + " min_p 0.5");
    }
  }
  // Rows that mislead the strided sample that places the first top-p thresholds: the sampled
  // positions hold unusually large or small values, or a few spikes hold much of the mass.
  for (std::size_t vocab : {32000u, 40000u}) {
    std::size_t const ns = std::clamp<std::size_t>(vocab / 64, sd::detail::select_sample,
                                                   sd::detail::select_sample_mass);
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<float> l = sampling_test::make_row(row_kind::flat, vocab, gen);
      if (variant < 2) {
        for (std::size_t j = 0; j < ns; ++j) l[j * vocab / ns] += variant == 0 ? 2.0f : -3.0f;
      } else {
        for (std::size_t j = 0; j < 3; ++j) l[(j * 7919 + 11) % vocab] = 10.5f;
      }
      std::string const where =
          "vocab " + std::to_string(vocab) + " misleading sample " + std::to_string(variant);
      for (float tp : {0.3f, 0.6f, 0.9f, 0.97f})
        check(with([&](auto& p) { p.top_p = tp; }), l, where + " top_p " + std::to_string(tp));
    }
  }
  // Constant rows: every token ties.
  for (std::size_t vocab : {5u, 1000u, 32000u}) {
    std::vector<float> const l(vocab, 0.25f);
    std::string const where = "constant row of " + std::to_string(vocab);
    check(with([](auto& p) { p.top_k = 3; }), l, where + " top_k 3");
    check(with([](auto& p) { p.top_p = 0.5f; }), l, where + " top_p 0.5");
    check(with([](auto& p) { p.min_p = 1.0f; }), l, where + " min_p 1");
    if (vocab > 700) check(with([](auto& p) { p.top_k = 700; }), l, where + " top_k 700");
  }
  MESSAGE(rows, " rows compared; ", same_support, " with identical support");
  CHECK(same_support * 100 >= rows * 97);
}

TEST_CASE("the threshold sample's radix sort orders like std::sort, descending") {
  std::mt19937_64 gen(5);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_int_distribution<int> special(0, 19);
  specdec::detail::select_scratch s;
  s.reserve(1);
  for (std::size_t n : {0u, 1u, 2u, 17u, 512u, 2048u}) {
    CAPTURE(n);
    for (int round = 0; round < 5; ++round) {
      std::vector<float> v(n);
      for (float& x : v) {
        int const k = special(gen);
        x = k == 0   ? 0.0f
            : k == 1 ? -0.0f
            : k == 2 ? std::numeric_limits<float>::infinity()
            : k == 3 ? -std::numeric_limits<float>::infinity()
            : k == 4 ? std::numeric_limits<float>::denorm_min()
            : k < 10 ? std::abs(normal(gen))
                     : normal(gen);
      }
      std::copy(v.begin(), v.end(), s.sample.begin());
      s.sort_sample(n);
      std::sort(v.begin(), v.end(), std::greater<float>());
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i);
        CHECK(s.sample[i] == v[i]);  // equal values (+0 and -0 alike)
      }
    }
  }
}
