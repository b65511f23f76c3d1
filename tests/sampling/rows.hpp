#pragma once
// Test rows and the fast-versus-reference comparison shared by the sampling tests.

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "specdec/reference/sampling.hpp"
#include "specdec/sampling/policy.hpp"

namespace sampling_test {

namespace sd = specdec;

inline constexpr float ninf = -std::numeric_limits<float>::infinity();

// Row shapes the comparisons run on.
enum class row_kind {
  flat,     // uniform in [-1, 1]
  peaked,   // N(0, 3) plus a few spikes of +10..+25
  ties,     // values from a set of 5, so nearly every entry ties with many others
  neg_inf,  // N(0, 2) with about a quarter of the entries -inf
  grid,     // multiples of 1/256 in [-32, 32]: bias and penalties on them are exact in float
  huge,     // N(0, 5) shifted by 1e4: tests stability
};

inline char const* name(row_kind k) {
  switch (k) {
    case row_kind::flat:
      return "flat";
    case row_kind::peaked:
      return "peaked";
    case row_kind::ties:
      return "ties";
    case row_kind::neg_inf:
      return "neg_inf";
    case row_kind::grid:
      return "grid";
    case row_kind::huge:
      return "huge";
  }
  return "?";
}

// Whether float arithmetic on bias and penalties (multiples of 1/16, penalties 0.5 / 2) is exact
// for this kind, so that the processed logits of the fast path equal the reference's.
inline bool exact_processing(row_kind k) {
  return k == row_kind::ties || k == row_kind::grid;
}

inline std::vector<float> make_row(row_kind kind, std::size_t vocab, std::mt19937_64& gen) {
  std::vector<float> row(vocab);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (kind) {
    case row_kind::flat:
      for (float& v : row) v = uni(gen);
      break;
    case row_kind::peaked: {
      for (float& v : row) v = 3.0f * normal(gen);
      std::uniform_int_distribution<std::size_t> pick(0, vocab - 1);
      for (int s = 0; s < 4; ++s) row[pick(gen)] += 10.0f + 15.0f * (uni(gen) + 1.0f) / 2.0f;
      break;
    }
    case row_kind::ties: {
      std::uniform_int_distribution<int> pick(0, 4);
      for (float& v : row) v = static_cast<float>(pick(gen)) * 0.75f - 1.0f;
      break;
    }
    case row_kind::neg_inf: {
      std::uniform_int_distribution<int> pick(0, 3);
      for (float& v : row) v = pick(gen) == 0 ? ninf : 2.0f * normal(gen);
      // At least one finite entry.
      if (std::none_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); }))
        row[0] = 0.0f;
      break;
    }
    case row_kind::grid: {
      std::uniform_int_distribution<int> pick(-32 * 256, 32 * 256);
      for (float& v : row) v = static_cast<float>(pick(gen)) / 256.0f;
      break;
    }
    case row_kind::huge:
      for (float& v : row) v = 1.0e4f + 5.0f * normal(gen);
      break;
  }
  return row;
}

// Random parameters. With `exact`, bias and penalty values keep float processing exact.
inline sd::sampling_params make_params(std::size_t vocab, bool exact, std::mt19937_64& gen) {
  std::uniform_int_distribution<int> coin(0, 1);
  std::uniform_int_distribution<int> die(0, 5);
  sd::sampling_params p;
  float const temps[] = {0.0f, 0.25f, 0.7f, 1.0f, 1.0f, 1.5f};
  p.temperature = temps[die(gen)];
  std::int32_t const ks[] = {0, 0, 1, 2, 5, 50};
  p.top_k = ks[die(gen)];
  float const tps[] = {1.0f, 1.0f, 0.9f, 0.5f, 0.99f, 0.2f};
  p.top_p = tps[die(gen)];
  float const mps[] = {0.0f, 0.0f, 0.0f, 0.05f, 0.2f, 0.01f};
  p.min_p = mps[die(gen)];
  if (exact) {
    float const reps[] = {1.0f, 1.0f, 2.0f, 0.5f, 4.0f, 1.0f};
    p.repetition_penalty = reps[die(gen)];
    p.frequency_penalty = coin(gen) ? static_cast<float>(die(gen) - 2) / 8.0f : 0.0f;
    p.presence_penalty = coin(gen) ? static_cast<float>(die(gen) - 2) / 4.0f : 0.0f;
    if (coin(gen)) {
      std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(vocab) - 1);
      int const n = die(gen);
      for (int i = 0; i < n; ++i)
        p.logit_bias.emplace_back(tok(gen), static_cast<float>(die(gen) * 4 - 10) / 16.0f);
    }
  }
  return p;
}

inline std::vector<sd::token_id> make_history(std::size_t vocab, std::size_t length,
                                              std::mt19937_64& gen) {
  // Draw from a small pool so that tokens repeat (frequency counts above 1).
  std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(vocab) - 1);
  std::vector<sd::token_id> pool(8);
  for (auto& t : pool) t = tok(gen);
  std::uniform_int_distribution<std::size_t> pick(0, pool.size() - 1);
  std::vector<sd::token_id> h(length);
  for (auto& t : h) t = pool[pick(gen)];
  return h;
}

// Tolerances of the fast path against the double reference (see docs/sampling.md):
// a kept probability agrees within rel_tol + slope * |s| relative (s = (z - max) / T, the
// scaled logit) plus abs_tol absolute; top-p and min-p decisions may differ only for tokens
// whose reference mass or ratio lies within boundary_tol of the threshold.
inline constexpr double rel_tol = 1e-5;
inline constexpr double slope = 5e-7;
inline constexpr double abs_tol = 1e-12;
inline constexpr double boundary_tol = 2e-5;
inline constexpr double cdf_tol = 1e-5;

inline std::vector<bool> support(std::span<double const> q) {
  std::vector<bool> s(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) s[i] = q[i] > 0.0;
  return s;
}

struct comparison {
  bool same_support = true;
  std::size_t boundary_differences = 0;  // tokens kept by one side only, all within tolerance
};

// Compares sampler(params).distribution with reference_distribution on one row, including the
// tokens drawn for a set of uniforms. Returns what it found (for statistics in the caller).
inline comparison compare_with_reference(sd::sampling_params const& params,
                                         std::vector<float> const& logits,
                                         std::vector<sd::token_id> const& history,
                                         std::string const& what) {
  INFO(what);
  comparison out;
  sd::sampler const s(params);
  std::size_t const vocab = logits.size();
  std::vector<float> probs(vocab, -1.0f);
  s.distribution(logits, history, probs);
  std::vector<double> const ref = sd::reference_distribution(params, logits, history);

  double sum = 0.0;
  for (float v : probs) {
    REQUIRE(v >= 0.0f);
    sum += v;
  }
  CHECK(std::abs(sum - 1.0) < 1e-5);

  if (s.is_greedy()) {
    sd::token_id const t = sd::reference_greedy_token(params, logits, history);
    CHECK(s.greedy_token(logits, history) == t);
    for (std::size_t i = 0; i < vocab; ++i)
      CHECK(probs[i] == (static_cast<sd::token_id>(i) == t ? 1.0f : 0.0f));
    return out;
  }

  // Scaled logits of the reference, for the tolerance.
  std::vector<double> const z = sd::reference_processed_logits(params, logits, history);
  double const zmax = *std::max_element(z.begin(), z.end());
  auto const scaled = [&](std::size_t i) {
    return std::isfinite(z[i]) ? (zmax - z[i]) / static_cast<double>(params.temperature)
                               : std::numeric_limits<double>::infinity();
  };

  // Support: must lie between the reference's with the thresholds moved by boundary_tol.
  std::vector<bool> kf(vocab);
  for (std::size_t i = 0; i < vocab; ++i) kf[i] = probs[i] > 0.0f;
  // Tokens whose reference scaled logit is below float's normal range are flushed to 0 by the
  // fast path; they are left out of the support comparison.
  std::vector<bool> kr = support(ref);
  for (std::size_t i = 0; i < vocab; ++i)
    if (kr[i] && !kf[i] && scaled(i) > 87.0) kr[i] = false;
  if (kf != kr) {
    out.same_support = false;
    sd::sampling_params lo = params;  // keeps fewer tokens
    lo.top_p = params.top_p < 1.0f
                   ? std::max(1e-6f, params.top_p - static_cast<float>(boundary_tol))
                   : 1.0f;
    lo.min_p = params.min_p > 0.0f
                   ? std::min(1.0f, params.min_p * static_cast<float>(1.0 + boundary_tol))
                   : 0.0f;
    sd::sampling_params hi = params;  // keeps more tokens
    hi.top_p = std::min(1.0f, params.top_p + static_cast<float>(boundary_tol));
    hi.min_p = params.min_p * static_cast<float>(1.0 - boundary_tol);
    std::vector<bool> const klo = support(sd::reference_distribution(lo, logits, history));
    std::vector<bool> const khi = support(sd::reference_distribution(hi, logits, history));
    for (std::size_t i = 0; i < vocab; ++i) {
      if (kf[i] != kr[i]) ++out.boundary_differences;
      // Tokens whose reference probability is below float's normal range are flushed to 0.
      bool const flushed = scaled(i) > 87.0;
      INFO("token ", i, " fast ", probs[i], " ref ", ref[i]);
      if (klo[i] && !flushed) CHECK(kf[i]);
      if (kf[i]) CHECK(khi[i]);
    }
  }

  // Probabilities over the common support, each side renormalised over it.
  double mf = 0.0, mr = 0.0;
  for (std::size_t i = 0; i < vocab; ++i) {
    if (kf[i] && kr[i]) {
      mf += probs[i];
      mr += ref[i];
    }
  }
  REQUIRE(mf > 0.0);
  for (std::size_t i = 0; i < vocab; ++i) {
    if (!(kf[i] && kr[i])) continue;
    double const a = probs[i] / mf, b = ref[i] / mr;
    double const tol = (rel_tol + slope * scaled(i)) * b + abs_tol;
    INFO("token ", i, " fast ", a, " ref ", b, " scaled logit ", -scaled(i));
    CHECK(std::abs(a - b) <= tol);
  }
  // Probabilities that the fast path flushes are negligible.
  for (std::size_t i = 0; i < vocab; ++i)
    if (ref[i] > 0.0 && !kf[i] && scaled(i) > 87.0) CHECK(ref[i] < 1e-30);

  // Same uniform, same token, unless the reference's CDF is within cdf_tol of u.
  if (out.same_support) {
    std::vector<double> cdf(vocab);
    double c = 0.0;
    for (std::size_t i = 0; i < vocab; ++i) cdf[i] = c += ref[i];
    float const us[] = {0.0f, 1e-6f, 0.1f, 0.25f, 0.5f, 0.75f, 0.9f, 0.999f, 0.99999994f};
    for (float u : us) {
      sd::token_id const tf = sd::sample_from(probs, u);
      sd::token_id const tr = sd::reference_sample(ref, u);
      CHECK(ref[static_cast<std::size_t>(tf)] > 0.0);
      if (tf != tr) {
        auto const lo_tok = static_cast<std::size_t>(std::min(tf, tr));
        INFO("u ", u, " fast ", tf, " ref ", tr, " cdf ", cdf[lo_tok]);
        CHECK(std::abs(cdf[lo_tok] - static_cast<double>(u)) <= cdf_tol);
      }
    }
  }
  return out;
}

}  // namespace sampling_test
