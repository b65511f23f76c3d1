#pragma once
// Shared pieces of the verifier tests: a toy target (a fixed function from history to logits),
// draft builders (good, bad, adversarial; sampled with q rows or deterministic candidates), the
// sampling policies every lossless test runs, and a chi-square goodness-of-fit test.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/sampling/policy.hpp"

namespace verify_test {

using specdec::node_index;
using specdec::token_id;

// ---------------------------------------------------------------------------------------------
// Hashing to deterministic pseudo-random numbers.

inline std::uint64_t mix(std::uint64_t x) noexcept {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}
inline double unit(std::uint64_t h) noexcept {  // [0, 1)
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}
inline double gaussian(std::uint64_t h) noexcept {  // approximately N(0, 1), Box-Muller
  double const a = unit(mix(h)) + 1e-12;
  double const b = unit(mix(h ^ 0x9e3779b97f4a7c15ULL));
  return std::sqrt(-2.0 * std::log(a)) * std::cos(6.283185307179586 * b);
}

// ---------------------------------------------------------------------------------------------
// The toy target: logits are a fixed function of the last two tokens of the history. About one
// token in seven is banned (-inf) in each context, never all of them, so "target has no mass"
// occurs under every policy; scales vary by context so some rows are peaked and some flat.

struct toy_target {
  std::size_t vocab = 17;
  std::uint64_t seed = 1;

  void logits(std::span<token_id const> history, std::span<float> out) const {
    std::uint64_t const a =
        history.size() >= 2 ? static_cast<std::uint64_t>(history[history.size() - 2]) : 7777u;
    std::uint64_t const b = history.empty() ? 9999u : static_cast<std::uint64_t>(history.back());
    std::uint64_t const ctx = mix(seed * 0x100000001b3ULL + a * 1000003u + b);
    double const scale = 0.8 + 2.5 * unit(mix(ctx + 17));
    bool any = false;
    for (std::size_t v = 0; v < vocab; ++v) {
      std::uint64_t const h = mix(ctx ^ (v * 0x9e3779b97f4a7c15ULL + 5));
      bool const banned = vocab > 1 && (h % 7u) == 3u;
      out[v] = banned ? -std::numeric_limits<float>::infinity()
                      : static_cast<float>(scale * gaussian(h));
      any = any || !banned;
    }
    if (!any) out[static_cast<std::size_t>(ctx % vocab)] = 0.0f;
  }
  [[nodiscard]] std::vector<float> logits(std::span<token_id const> history) const {
    std::vector<float> out(vocab);
    logits(history, out);
    return out;
  }
};

// ---------------------------------------------------------------------------------------------
// The policies of the lossless tests.

struct named_policy {
  std::string name;
  specdec::sampling_params params;
};

inline std::vector<named_policy> all_policies() {
  std::vector<named_policy> out;
  auto add = [&](std::string n, auto&& set) {
    specdec::sampling_params p;
    set(p);
    out.push_back({std::move(n), std::move(p)});
  };
  add("greedy", [](auto& p) { p.temperature = 0.0f; });
  add("temperature 0.7", [](auto& p) { p.temperature = 0.7f; });
  add("temperature 1.0", [](auto& p) { p.temperature = 1.0f; });
  add("top-k 5", [](auto& p) { p.top_k = 5; });
  add("top-p 0.9", [](auto& p) { p.top_p = 0.9f; });
  add("min-p 0.05", [](auto& p) { p.min_p = 0.05f; });
  add("repetition penalty 1.8", [](auto& p) { p.repetition_penalty = 1.8f; });
  return out;
}

// ---------------------------------------------------------------------------------------------
// Distributions as double vectors.

inline std::vector<double> policy_distribution(specdec::sampler const& policy,
                                               toy_target const& target,
                                               std::span<token_id const> history) {
  std::vector<float> logits = target.logits(history);
  std::vector<float> probs(target.vocab);
  policy.distribution(logits, history, probs);
  return std::vector<double>(probs.begin(), probs.end());
}

// ---------------------------------------------------------------------------------------------
// Drafts.

enum class draft_kind { good, bad, adversarial };

inline char const* to_string(draft_kind k) {
  switch (k) {
    case draft_kind::good:
      return "good";
    case draft_kind::bad:
      return "bad";
    case draft_kind::adversarial:
      return "adversarial";
  }
  return "?";
}

// A draft distribution q for a context whose target distribution is p: good = close to p (with
// some mass where p has none), bad = unrelated, adversarial = most mass where p has none (or on the
// least likely tokens when p has full support).
inline std::vector<double> draft_q(draft_kind kind, std::vector<double> const& p,
                                   std::uint64_t context) {
  std::size_t const n = p.size();
  std::vector<double> q(n, 0.0);
  std::vector<double> r(n);
  double rs = 0.0;
  for (std::size_t v = 0; v < n; ++v) {
    r[v] = std::exp(2.0 * gaussian(mix(context * 31 + v)));
    rs += r[v];
  }
  for (double& x : r) x /= rs;
  switch (kind) {
    case draft_kind::good:
      for (std::size_t v = 0; v < n; ++v) q[v] = 0.85 * p[v] + 0.15 * r[v];
      break;
    case draft_kind::bad:
      q = r;
      break;
    case draft_kind::adversarial: {
      std::vector<std::size_t> zero;
      for (std::size_t v = 0; v < n; ++v)
        if (p[v] == 0.0) zero.push_back(v);
      if (zero.empty()) {
        double lo = 2.0;
        for (std::size_t v = 0; v < n; ++v) lo = std::min(lo, p[v]);
        for (std::size_t v = 0; v < n; ++v)
          if (p[v] == lo) zero.push_back(v);
      }
      for (std::size_t v = 0; v < n; ++v) q[v] = 0.1 * r[v];
      for (std::size_t v : zero) q[v] += 0.9 / static_cast<double>(zero.size());
      break;
    }
  }
  double s = 0.0;
  for (double x : q) s += x;
  for (double& x : q) x /= s;
  return q;
}

// Up to `count` distinct deterministic candidates for a context with target distribution p.
inline std::vector<token_id> draft_candidates(draft_kind kind, std::vector<double> const& p,
                                              std::size_t count, std::uint64_t context) {
  std::size_t const n = p.size();
  std::vector<token_id> order(n);
  for (std::size_t v = 0; v < n; ++v) order[v] = static_cast<token_id>(v);
  switch (kind) {
    case draft_kind::good:  // most likely first
      std::stable_sort(order.begin(), order.end(), [&](token_id a, token_id b) {
        return p[static_cast<std::size_t>(a)] > p[static_cast<std::size_t>(b)];
      });
      break;
    case draft_kind::bad:  // a fixed pseudo-random order
      std::stable_sort(order.begin(), order.end(), [&](token_id a, token_id b) {
        return mix(context + static_cast<std::uint64_t>(a)) <
               mix(context + static_cast<std::uint64_t>(b));
      });
      break;
    case draft_kind::adversarial:  // tokens the target cannot emit first, then least likely
      std::stable_sort(order.begin(), order.end(), [&](token_id a, token_id b) {
        return p[static_cast<std::size_t>(a)] < p[static_cast<std::size_t>(b)];
      });
      break;
  }
  order.resize(std::min(count, n));
  return order;
}

// ---------------------------------------------------------------------------------------------
// Chi-square goodness of fit.

// Regularised upper incomplete gamma Q(a, x) (series for x < a + 1, else Lentz's continued
// fraction).
inline double gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  double const log_front = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double ap = a, term = 1.0 / a, sum = term;
    for (int n = 0; n < 100000; ++n) {
      ap += 1.0;
      term *= x / ap;
      sum += term;
      if (std::abs(term) < std::abs(sum) * 1e-15) break;
    }
    return std::max(0.0, 1.0 - sum * std::exp(log_front));
  }
  double const tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 100000; ++i) {
    double const an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1.0 / d;
    double const del = d * c;
    h *= del;
    if (std::abs(del - 1.0) < 1e-15) break;
  }
  return std::exp(log_front) * h;
}

struct chi_square_result {
  double statistic = 0.0;
  std::size_t df = 0;
  double p_value = 1.0;
  std::size_t impossible = 0;  // observations in cells of expected probability 0
  std::string describe() const {
    return "chi2 = " + std::to_string(statistic) + ", df = " + std::to_string(df) +
           ", p = " + std::to_string(p_value) +
           ", observations of impossible outcomes = " + std::to_string(impossible);
  }
};

// Goodness of fit of `observed` counts to probabilities `expected` (same cells). Cells with an
// expected count below 5 are pooled into one cell; if that pool is still below 5 it is merged
// with the smallest remaining cell. Observations in cells of probability 0 are counted apart
// (any is a failure: the verifier emitted something the target cannot).
inline chi_square_result chi_square(std::vector<std::uint64_t> const& observed,
                                    std::vector<double> const& expected) {
  chi_square_result r;
  double n = 0.0;
  for (auto o : observed) n += static_cast<double>(o);
  double psum = 0.0;
  for (double e : expected) psum += e;
  std::vector<std::pair<double, double>> cells;  // (expected count, observed)
  double pool_e = 0.0, pool_o = 0.0;
  for (std::size_t i = 0; i < observed.size(); ++i) {
    double const e = n * expected[i] / psum;
    if (expected[i] <= 0.0) {
      r.impossible += observed[i];
      continue;
    }
    if (e < 5.0) {
      pool_e += e;
      pool_o += static_cast<double>(observed[i]);
    } else {
      cells.emplace_back(e, static_cast<double>(observed[i]));
    }
  }
  if (pool_e > 0.0) {
    if (pool_e < 5.0 && !cells.empty()) {
      auto it = std::min_element(cells.begin(), cells.end());
      it->first += pool_e;
      it->second += pool_o;
    } else {
      cells.emplace_back(pool_e, pool_o);
    }
  }
  for (auto const& [e, o] : cells) r.statistic += (o - e) * (o - e) / e;
  r.df = cells.size() > 1 ? cells.size() - 1 : 0;
  r.p_value = r.df == 0 ? 1.0 : gamma_q(0.5 * static_cast<double>(r.df), 0.5 * r.statistic);
  return r;
}

}  // namespace verify_test
