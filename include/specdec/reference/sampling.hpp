#pragma once
//! \file
//! Slow, obviously-correct reference versions of every sampling step, in double precision with
//! full sorts. Tests compare the fast policies of sampling/ against these; nothing else should
//! call them.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/sampling/params.hpp"

namespace specdec {

//! Throws `errc::numerical` for a NaN or +inf entry or a row with no finite entry.
inline void reference_check_row(std::span<double const> z) {
  bool any_finite = false;
  for (std::size_t i = 0; i < z.size(); ++i) {
    SPECDEC_CHECK(!std::isnan(z[i]) && z[i] != std::numeric_limits<double>::infinity(), numerical,
                  "reference: logit ", i, " is ", z[i]);
    any_finite = any_finite || std::isfinite(z[i]);
  }
  SPECDEC_CHECK(any_finite, numerical, "reference: no finite logit in a row of ", z.size());
}

//! softmax(logits) in double: exp(l - max) / sum.
[[nodiscard]] inline std::vector<double> reference_softmax(std::span<double const> logits) {
  reference_check_row(logits);
  double const m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> q(logits.size());
  double total = 0.0;
  for (std::size_t i = 0; i < q.size(); ++i) total += q[i] = std::exp(logits[i] - m);
  for (double& v : q) v /= total;
  return q;
}

//! softmax of a float row, in double.
[[nodiscard]] inline std::vector<double> reference_softmax(std::span<float const> logits) {
  std::vector<double> const z(logits.begin(), logits.end());
  return reference_softmax(std::span<double const>(z));
}

//! Steps 1 and 2 of `sampler`: logit bias, then repetition, frequency and presence penalties
//! over `history` (its last `penalty_last_n` tokens when set), in double. Throws
//! `errc::out_of_range` for a token id outside [0, V).
[[nodiscard]] inline std::vector<double> reference_processed_logits(
    sampling_params const& params, std::span<float const> logits,
    std::span<token_id const> history) {
  std::size_t const vocab = logits.size();
  std::vector<double> z(logits.begin(), logits.end());
  for (auto const& [token, bias] : params.logit_bias) {
    SPECDEC_CHECK(token >= 0 && static_cast<std::size_t>(token) < vocab, out_of_range,
                  "reference: logit_bias token ", token, " outside [0, ", vocab, ")");
    z[static_cast<std::size_t>(token)] += static_cast<double>(bias);
  }
  std::vector<std::int64_t> count(vocab, 0);
  for (token_id t : history)
    SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < vocab, out_of_range,
                  "reference: history token ", t, " outside [0, ", vocab, ")");
  std::size_t const from = params.penalty_last_n == 0 || history.size() <= params.penalty_last_n
                               ? 0
                               : history.size() - params.penalty_last_n;
  for (std::size_t i = from; i < history.size(); ++i) ++count[static_cast<std::size_t>(history[i])];
  double const r = params.repetition_penalty;
  double const f = params.frequency_penalty;
  double const p = params.presence_penalty;
  for (std::size_t i = 0; i < vocab; ++i) {
    if (count[i] == 0) continue;
    double l = z[i];
    l = l > 0.0 ? l / r : l * r;
    l -= f * static_cast<double>(count[i]);
    l -= p;
    z[i] = l;
  }
  return z;
}

//! Token ids sorted by `key` descending, ties by lower id first.
[[nodiscard]] inline std::vector<std::size_t> reference_order(std::span<double const> key) {
  std::vector<std::size_t> order(key.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return key[a] > key[b]; });
  return order;
}

//! Top-k: keep[i] is cleared for every token outside the k largest `z` (ties by lower id).
inline void reference_top_k(std::span<double const> z, std::int32_t k, std::vector<bool>& keep) {
  if (k <= 0 || static_cast<std::size_t>(k) >= z.size()) return;
  std::vector<std::size_t> const order = reference_order(z);
  for (std::size_t rank = static_cast<std::size_t>(k); rank < order.size(); ++rank)
    keep[order[rank]] = false;
}

//! Top-p over the kept tokens: sort them by q descending (ties by lower id) and keep the
//! shortest prefix whose mass reaches p * (their total mass); at least one token.
inline void reference_top_p(std::span<double const> q, double p, std::vector<bool>& keep) {
  if (p >= 1.0) return;
  std::vector<double> masked(q.size(), -1.0);  // removed tokens sort last
  double total = 0.0;
  for (std::size_t i = 0; i < q.size(); ++i) {
    if (keep[i]) {
      masked[i] = q[i];
      total += q[i];
    }
  }
  std::vector<std::size_t> const order = reference_order(masked);
  double cumulative = 0.0;
  bool reached = false;
  for (std::size_t i : order) {
    if (!keep[i]) break;
    if (reached) {
      keep[i] = false;
      continue;
    }
    cumulative += q[i];
    reached = cumulative >= p * total;
  }
}

//! Min-p over the kept tokens: clears tokens with q < min_p * (max q over the kept tokens).
inline void reference_min_p(std::span<double const> q, double min_p, std::vector<bool>& keep) {
  if (min_p <= 0.0) return;
  double max_q = 0.0;
  for (std::size_t i = 0; i < q.size(); ++i)
    if (keep[i]) max_q = std::max(max_q, q[i]);
  for (std::size_t i = 0; i < q.size(); ++i)
    if (keep[i] && q[i] < min_p * max_q) keep[i] = false;
}

//! The token a greedy sampler emits: argmax of the processed logits, ties to the lowest id.
[[nodiscard]] inline token_id reference_greedy_token(sampling_params const& params,
                                                     std::span<float const> logits,
                                                     std::span<token_id const> history) {
  std::vector<double> const z = reference_processed_logits(params, logits, history);
  reference_check_row(z);
  return static_cast<token_id>(reference_order(z).front());
}

//! The distribution `sampler(params).distribution(logits, history, .)` must produce, in double:
//! bias, penalties, temperature, top-k, top-p, min-p, renormalise (see `sampler`).
[[nodiscard]] inline std::vector<double> reference_distribution(sampling_params const& params,
                                                                std::span<float const> logits,
                                                                std::span<token_id const> history) {
  params.validate();
  std::vector<double> const z = reference_processed_logits(params, logits, history);
  reference_check_row(z);
  std::vector<double> out(z.size(), 0.0);
  if (params.temperature == 0.0f) {
    out[static_cast<std::size_t>(reference_greedy_token(params, logits, history))] = 1.0;
    return out;
  }
  double const m = *std::max_element(z.begin(), z.end());
  double const t = params.temperature;
  std::vector<bool> keep(z.size(), true);
  reference_top_k(z, params.top_k, keep);
  std::vector<double> q(z.size(), 0.0);  // unnormalised: exp((z - max) / T)
  for (std::size_t i = 0; i < z.size(); ++i) q[i] = keep[i] ? std::exp((z[i] - m) / t) : 0.0;
  reference_top_p(q, params.top_p, keep);
  reference_min_p(q, params.min_p, keep);
  double total = 0.0;
  for (std::size_t i = 0; i < z.size(); ++i)
    if (keep[i]) total += q[i];
  for (std::size_t i = 0; i < z.size(); ++i) out[i] = keep[i] ? q[i] / total : 0.0;
  return out;
}

//! Inverse-CDF draw: the first index i with sum(probs[0..i]) > u * sum(probs), accumulated
//! sequentially in double, skipping zero entries.
[[nodiscard]] inline token_id reference_sample(std::span<double const> probs, double u) {
  double total = 0.0;
  for (double v : probs) total += v;
  SPECDEC_CHECK(total > 0.0, numerical, "reference_sample: no mass");
  double const target = u * total;
  double c = 0.0;
  std::size_t last = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0) continue;
    c += probs[i];
    last = i;
    if (c > target) return static_cast<token_id>(i);
  }
  return static_cast<token_id>(last);
}

//! Argmax with ties to the lowest index.
[[nodiscard]] inline token_id reference_argmax(std::span<float const> values) {
  SPECDEC_CHECK(!values.empty(), invalid_argument, "reference_argmax: empty row");
  std::size_t best = 0;
  for (std::size_t i = 1; i < values.size(); ++i)
    if (values[i] > values[best]) best = i;
  return static_cast<token_id>(best);
}

}  // namespace specdec
