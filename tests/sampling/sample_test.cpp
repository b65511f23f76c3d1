// sample_from (inverse CDF) and argmax: exact semantics, errors, agreement with the sequential
// double reference, and a chi-square test of sampler::sample over 100,000 Philox draws.
#include "specdec/sampling/draw.hpp"

#include "support/doctest.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "rows.hpp"
#include "specdec/reference/sampling.hpp"
#include "specdec/sampling/policy.hpp"
#include "support/errors.hpp"

namespace sd = specdec;
using sampling_test::ninf;
using test_support::check_error;

TEST_CASE("sample_from returns the first index whose cumulative mass exceeds u * total") {
  std::vector<float> const p = {0.25f, 0.0f, 0.25f, 0.5f};
  CHECK(sd::sample_from(p, 0.0f) == 0);
  CHECK(sd::sample_from(p, 0.2499f) == 0);
  CHECK(sd::sample_from(p, 0.25f) == 2);  // cumsum(0..1) = 0.25 is not > 0.25; 1 has prob 0
  CHECK(sd::sample_from(p, 0.4999f) == 2);
  CHECK(sd::sample_from(p, 0.5f) == 3);
  CHECK(sd::sample_from(p, 0.99999994f) == 3);
  // Unnormalised rows: u is scaled by the total.
  std::vector<float> const q = {2.0f, 6.0f};
  CHECK(sd::sample_from(q, 0.2499f) == 0);
  CHECK(sd::sample_from(q, 0.25f) == 1);
  // Zero entries are never returned: leading, trailing and interior zeros.
  CHECK(sd::sample_from(std::vector<float>{0.0f, 0.0f, 1.0f}, 0.0f) == 2);
  CHECK(sd::sample_from(std::vector<float>{1.0f, 0.0f, 0.0f}, 0.99999994f) == 0);
  CHECK(sd::sample_from(std::vector<float>{1.0f}, 0.5f) == 0);
  // A one-hot row always gives its token, whatever u.
  std::vector<float> hot(5000, 0.0f);
  hot[4321] = 1.0f;
  for (float u : {0.0f, 0.3f, 0.99999994f}) CHECK(sd::sample_from(hot, u) == 4321);
  // Subnormal mass still counts.
  CHECK(sd::sample_from(std::vector<float>{0.0f, 1e-44f, 0.0f}, 0.5f) == 1);
}

TEST_CASE("sample_from agrees with the sequential double reference across blocks") {
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (std::size_t n : {1u, 7u, 63u, 64u, 65u, 200u, 512u, 1023u, 1024u, 1025u, 5000u, 40000u}) {
    std::vector<float> p(n);
    for (float& v : p) v = uni(gen) < 0.3f ? 0.0f : uni(gen);
    p[n / 2] = 1.0f;
    std::vector<double> const pd(p.begin(), p.end());
    for (int k = 0; k < 200; ++k) {
      float const u = uni(gen) * 0.99999994f;
      sd::token_id const a = sd::sample_from(p, u);
      sd::token_id const b = sd::reference_sample(pd, u);
      INFO("n ", n, " u ", u);
      CHECK(a == b);
      CHECK(p[static_cast<std::size_t>(a)] > 0.0f);
    }
  }
}

TEST_CASE("sample_from skips zero groups and lands in the crossing group") {
  // 512 entries: mass only at 70, 200 and 511 (the last entry of the last group).
  std::vector<float> p(512, 0.0f);
  p[70] = 0.25f;
  p[200] = 0.25f;
  p[511] = 0.5f;
  CHECK(sd::sample_from(p, 0.0f) == 70);
  CHECK(sd::sample_from(p, 0.2499f) == 70);
  CHECK(sd::sample_from(p, 0.25f) == 200);
  CHECK(sd::sample_from(p, 0.4999f) == 200);
  CHECK(sd::sample_from(p, 0.5f) == 511);
  CHECK(sd::sample_from(p, 0.99999994f) == 511);
}

TEST_CASE("sample_from rejects bad uniforms and bad rows") {
  std::vector<float> const p = {0.5f, 0.5f};
  check_error([&] { (void)sd::sample_from(p, 1.0f); }, sd::errc::invalid_argument,
              "outside [0, 1)");
  check_error([&] { (void)sd::sample_from(p, -0.1f); }, sd::errc::invalid_argument,
              "outside [0, 1)");
  check_error([&] { (void)sd::sample_from(p, std::numeric_limits<float>::quiet_NaN()); },
              sd::errc::invalid_argument, "outside [0, 1)");
  check_error(
      [&] {
        (void)sd::sample_from(std::vector<float>{0.5f, -0.1f, 0.6f}, 0.5f);
      },
      sd::errc::numerical, "probability 1 of 3");
  check_error(
      [&] {
        (void)sd::sample_from(std::vector<float>{0.5f, std::numeric_limits<float>::quiet_NaN()},
                              0.5f);
      },
      sd::errc::numerical, "probability 1 of 2");
  check_error([&] { (void)sd::sample_from(std::vector<float>(40, 0.0f), 0.5f); },
              sd::errc::numerical, "total mass 0");
  check_error([&] { (void)sd::sample_from(std::vector<float>{}, 0.5f); }, sd::errc::numerical,
              "total mass");
  check_error(
      [&] {
        (void)sd::sample_from(std::vector<float>{std::numeric_limits<float>::infinity(), 1.0f},
                              0.5f);
      },
      sd::errc::numerical, "total mass inf");
}

TEST_CASE("argmax breaks ties toward the lowest index and never picks NaN") {
  CHECK(sd::argmax(std::vector<float>{1.0f}) == 0);
  CHECK(sd::argmax(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}) == 1);
  std::vector<float> row(100, 0.0f);
  row[17] = 5.0f;
  row[33] = 5.0f;  // same lane, later
  row[34] = 5.0f;  // another lane
  row[98] = 5.0f;  // the scalar tail
  CHECK(sd::argmax(row) == 17);
  row[17] = 4.0f;
  CHECK(sd::argmax(row) == 33);
  row[33] = 4.0f;
  row[34] = 4.0f;
  CHECK(sd::argmax(row) == 98);
  row[2] = std::numeric_limits<float>::quiet_NaN();
  CHECK(sd::argmax(row) == 98);
  CHECK(sd::argmax(std::vector<float>{ninf, ninf}) == 0);
  CHECK(sd::argmax(std::vector<float>{std::numeric_limits<float>::quiet_NaN(), ninf}) == 1);
  CHECK(sd::argmax(std::vector<float>{ninf, std::numeric_limits<float>::infinity()}) == 1);
  check_error([] { (void)sd::argmax(std::vector<float>{}); }, sd::errc::invalid_argument, "empty");
  check_error(
      [] { (void)sd::argmax(std::vector<float>(3, std::numeric_limits<float>::quiet_NaN())); },
      sd::errc::numerical, "NaN");
  std::mt19937_64 gen(5);
  for (auto kind : {sampling_test::row_kind::ties, sampling_test::row_kind::neg_inf,
                    sampling_test::row_kind::peaked}) {
    for (std::size_t n : {1u, 17u, 111u, 32000u}) {
      std::vector<float> const r = sampling_test::make_row(kind, n, gen);
      CHECK(sd::argmax(r) == sd::reference_argmax(r));
    }
  }
}

namespace {

// Upper quantile of the chi-square distribution with `df` degrees of freedom at standard normal
// quantile z (Wilson-Hilferty approximation; accurate to about 1% for df >= 10).
double chi_square_quantile(double df, double z) {
  double const a = 2.0 / (9.0 * df);
  double const t = 1.0 - a + z * std::sqrt(a);
  return df * t * t * t;
}

// Chi-square statistic of `counts` against `probs` (draws in total), pooling categories whose
// expected count is below 5 into one. Returns {statistic, degrees of freedom}.
std::pair<double, double> chi_square(std::vector<std::int64_t> const& counts,
                                     std::vector<float> const& probs, std::int64_t draws) {
  double stat = 0.0, pooled_expected = 0.0, pooled_observed = 0.0;
  int cells = 0;
  double total = 0.0;
  for (float p : probs) total += p;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    double const expected = static_cast<double>(draws) * probs[i] / total;
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_observed += static_cast<double>(counts[i]);
      CHECK((probs[i] > 0.0f || counts[i] == 0));  // never a zero-probability token
      continue;
    }
    double const d = static_cast<double>(counts[i]) - expected;
    stat += d * d / expected;
    ++cells;
  }
  if (pooled_expected > 0.0) {
    double const d = pooled_observed - pooled_expected;
    stat += d * d / std::max(pooled_expected, 1e-300);
    ++cells;
  }
  return {stat, cells - 1};
}

}  // namespace

TEST_CASE("sampler::sample over 100,000 Philox draws matches the distribution (chi-square)") {
  // Fixed seed; the statistic must stay below the chi-square quantile at p = 1e-4 (z = 3.719).
  std::mt19937_64 gen(2024);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(400);
  for (float& v : logits) v = normal(gen);
  struct config {
    char const* name;
    sd::sampling_params params;
  };
  sd::sampling_params plain;
  plain.temperature = 2.0f;
  sd::sampling_params truncated;
  truncated.temperature = 1.5f;
  truncated.top_k = 60;
  truncated.top_p = 0.95f;
  truncated.min_p = 0.001f;
  for (auto const& cfg :
       {config{"temperature 2", plain}, config{"top-k 60, top-p 0.95, min-p 0.001", truncated}}) {
    std::string const name = cfg.name;
    sd::sampling_params const& params = cfg.params;
    INFO(name);
    sd::sampler const s(params);
    std::vector<float> probs(logits.size());
    s.distribution(logits, {}, probs);
    constexpr std::int64_t draws = 100000;
    std::vector<std::int64_t> counts(probs.size(), 0);
    sd::philox rng(0x5eed, 3);
    for (std::int64_t d = 0; d < draws; ++d)
      ++counts[static_cast<std::size_t>(s.sample(probs, rng))];
    CHECK(rng.offset() == static_cast<std::uint64_t>(draws));  // one word per draw
    auto const result = chi_square(counts, probs, draws);
    double const stat = result.first, df = result.second;
    INFO("chi-square ", stat, " with ", df, " degrees of freedom");
    CHECK(df >= 10);
    CHECK(stat < chi_square_quantile(df, 3.719));
  }
}
