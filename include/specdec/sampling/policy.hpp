#pragma once
//! \file
//! Sampling policies: the general `sampler` (logit bias, repetition /
//! frequency / presence penalties, temperature, top-k, top-p, min-p) and the pure `greedy`
//! policy. Both model `specdec::sampling_policy` (core/concepts.hpp).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/detail/rows.hpp"
#include "specdec/sampling/draw.hpp"
#include "specdec/sampling/params.hpp"
#include "specdec/sampling/select.hpp"
#include "specdec/sampling/softmax.hpp"

namespace specdec {

namespace detail {

//! Per-thread scratch of `T`, grown to the largest size asked for and never shrunk, so that the
//! hot path stops allocating after the first rows. Not shared between threads.
template <class T, int Tag>
[[nodiscard]] inline std::vector<T>& thread_scratch(std::size_t size) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < size) buffer.resize(size);
  return buffer;
}

//! Throws `errc::out_of_range` unless every token of `history` is in [0, vocab). One branch-free
//! (vectorised) pass: the largest id read as unsigned, which a negative id makes huge; the first
//! offending index is looked for only on failure.
inline void check_history(std::span<token_id const> history, std::size_t vocab, char const* who) {
  std::uint32_t largest = 0;
  for (token_id const t : history) largest = std::max(largest, static_cast<std::uint32_t>(t));
  if (history.empty() || static_cast<std::size_t>(largest) < vocab) [[likely]]
    return;
  for (std::size_t i = 0; i < history.size(); ++i) {
    token_id const t = history[i];
    SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < vocab, out_of_range, who, ": history[", i,
                  "] = ", t, " is not a token of a vocabulary of ", vocab);
  }
}

//! Checks the shapes of a distribution() call.
inline void check_row_shapes(std::span<float const> logits, std::span<float> probs,
                             char const* who) {
  SPECDEC_CHECK(logits.size() == probs.size(), invalid_argument, who, ": ", logits.size(),
                " logits but ", probs.size(), " probabilities");
  SPECDEC_CHECK(!logits.empty(), invalid_argument, who, ": empty logits row");
  SPECDEC_CHECK(logits.size() <= static_cast<std::size_t>(std::numeric_limits<token_id>::max()),
                invalid_argument, who, ": a row of ", logits.size(),
                " logits has more entries than token ids");
  SPECDEC_CHECK(!partially_overlap(logits.data(), logits.size(), probs.data(), probs.size()),
                invalid_argument, who, ": logits and probs partially overlap");
}

}  // namespace detail

//! The general sampling policy. `distribution()` turns a logits row into the exact distribution
//! `sample()` draws from, in this order (as in HF transformers and vLLM):
//!
//! 1. logit bias: z = logit + bias (each `logit_bias` entry in order);
//! 2. penalties, per distinct token t of `history` (its last `penalty_last_n` tokens when set)
//!    with c occurrences: repetition (z > 0 ? z / r : z * r), then frequency (z -= f * c), then
//!    presence (z -= p);
//! 3. temperature: s = (z - max z) / T; T = 0 makes the policy greedy: a one-hot row at
//!    `greedy_token` (argmax of z, ties to the lowest id) and steps 4-7 do not apply;
//! 4. top-k (k > 0): keep exactly min(k, V) tokens, the k largest z, ties at the boundary broken
//!    toward the lower token id;
//! 5. top-p (p < 1): with q = softmax(s) over the tokens top-k kept, sort them by q descending
//!    (ties: lower id first) and keep the shortest prefix whose mass reaches p * sum(q); at least
//!    one token;
//! 6. min-p (> 0): drop the tokens with q < min_p * max q;
//! 7. renormalise the kept probabilities to sum to 1; every other token gets exactly 0.
//!
//! Errors: a token id of `history` or `logit_bias` outside [0, V) throws `errc::out_of_range`; a
//! NaN or +inf logit (before or after bias and penalties), or a row with no finite logit, throws
//! `errc::numerical`.
//!
//! Thread safety: all members are const and may run concurrently on one sampler; scratch buffers
//! are per thread and stop growing after the largest row seen (no allocation after warm-up).
class sampler {
 public:
  //! The CUDA backend implements every parameter (core/traits.hpp).
  static constexpr bool device_supported = true;

  //! A sampler with `params`, validated (see `sampling_params::validate`).
  explicit sampler(sampling_params params) : params_(std::move(params)) {
    params_.validate();
    for (auto const& [token, bias] : params_.logit_bias) {
      (void)bias;
      max_bias_token_ = std::max(max_bias_token_, token);
    }
    penalties_ = params_.repetition_penalty != 1.0f || params_.frequency_penalty != 0.0f ||
                 params_.presence_penalty != 0.0f;
    double const inv = params_.temperature > 0.0f ? 1.0 / params_.temperature : 0.0;
    inv_temperature_ = static_cast<float>(std::min(inv, double{std::numeric_limits<float>::max()}));
  }

  //! Writes into `probs` ([V], same size as `logits`, may be the same buffer) the distribution
  //! this policy samples from given `logits` ([V]) and `history` (every token so far, for the
  //! penalties). Sums to 1; one-hot when `is_greedy()`. The history's ids are checked against the
  //! vocabulary unless it is a checked history (`token_history::checked`) and the sampler has no
  //! penalties (then it reads no id of it): the same row either way.
  void distribution(std::span<float const> logits, token_history history,
                    std::span<float> probs) const {
    distribution_impl(logits, history.tokens(), probs, penalties_ || !history.is_checked());
  }

 private:
  //! `distribution`, with the history's range check when `check_history`.
  void distribution_impl(std::span<float const> logits, std::span<token_id const> history,
                         std::span<float> probs, bool check_history) const {
    constexpr char const* who = "sampler::distribution";
    detail::check_row_shapes(logits, probs, who);
    std::size_t const vocab = logits.size();
    check_tokens(check_history ? history : std::span<token_id const>(), vocab, who);
    if (is_greedy()) {
      token_id const t = greedy_token(logits, history);
      std::fill(probs.begin(), probs.end(), 0.0f);
      probs[static_cast<std::size_t>(t)] = 1.0f;
      return;
    }
    // Steps 1-2: the processed logits z, materialised in `probs` only when something changes.
    float const* z = logits.data();
    if (has_processing(history)) {
      if (probs.data() != logits.data()) std::copy(logits.begin(), logits.end(), probs.data());
      apply_processing(probs.data(), vocab, history);
      z = probs.data();
    }
    float const zmax =
        detail::summarize_row(std::span<float const>(z, vocab),
                              "sampler::distribution (after logit bias and penalties)")
            .max;
    // Step 4, top-k (before the exp: it ranks logits). A small kept set is finished sparsely.
    float zfloor = -std::numeric_limits<float>::infinity();
    auto const k = static_cast<std::size_t>(params_.top_k);
    if (k > 0 && k < vocab) {
      detail::select_scratch& scratch = detail::thread_select_scratch();
      detail::top_k_result const tk = detail::select_top_k(z, vocab, k, zmax, scratch);
      if (tk.sparse) {
        finish_sparse(scratch, k, zmax, probs);
        return;
      }
      zfloor = tk.t;
      if (tk.ties_kept < tk.ties_total) {
        // Rare: more entries equal the cut than fit. Ban the extra ones (highest ids) by hand.
        if (z != probs.data()) {
          std::copy(logits.begin(), logits.end(), probs.data());
          z = probs.data();
        }
        std::size_t keep = tk.ties_kept;
        for (std::size_t i = 0; i < vocab; ++i) {
          if (probs[i] != tk.t) continue;
          if (keep > 0)
            --keep;
          else
            probs[i] = -std::numeric_limits<float>::infinity();
        }
      }
    }

    // Step 3: e = exp((z - max) / T) on the kept tokens (the maximum maps to exactly 1).
    float* e = probs.data();
    bool const min_p = params_.min_p > 0.0f;
    float const min_p_floor = params_.min_p;  // q >= min_p * max q  <=>  e >= min_p
    detail::exp_sums const sums =
        min_p ? detail::exp_masked<true>(z, e, vocab, zmax, inv_temperature_, zfloor, min_p_floor)
              : detail::exp_masked<false>(z, e, vocab, zmax, inv_temperature_, zfloor, 0.0f);

    // Steps 5-7: top-p, min-p, renormalise.
    if (params_.top_p < 1.0f) {
      detail::select_scratch& scratch = detail::thread_select_scratch();
      detail::top_p_result const tp =
          detail::select_top_p(e, vocab, sums.total, static_cast<double>(params_.top_p), scratch);
      if (tp.complete) {
        // Every kept entry is listed: apply min-p to the list and write it.
        std::size_t kept = tp.kept;
        if (min_p) kept = keep_at_least(scratch.list.data(), kept, min_p_floor);
        write_list(scratch.list.data(), kept, probs);
        return;
      }
      if (!(min_p && min_p_floor > tp.t)) {
        // Top-p binds: keep e > t and the first ties_kept entries equal to t.
        if (tp.ties_kept < tp.ties_total) {
          std::size_t keep = tp.ties_kept;
          for (std::size_t i = 0; i < vocab; ++i) {
            if (e[i] != tp.t) continue;
            if (keep > 0)
              --keep;
            else
              e[i] = 0.0f;
          }
        }
        detail::scale_at_least(e, e, vocab, tp.t, static_cast<float>(1.0 / tp.kept_mass));
        return;
      }
    }
    if (min_p) {
      detail::scale_at_least(e, e, vocab, min_p_floor,
                             static_cast<float>(1.0 / sums.at_least_floor));
      return;
    }
    detail::scale_row(e, e, vocab, static_cast<float>(1.0 / sums.total));
  }

 public:
  //! Draws a token from `probs` (as given, e.g. from `distribution()`), reading exactly one word
  //! of `rng`: `sample_from(probs, rng.uniform())`.
  [[nodiscard]] token_id sample(std::span<float const> probs, philox& rng) const {
    return sample_from(probs, rng.uniform());
  }

  //! Whether the policy is greedy (temperature 0): `distribution()` is then one-hot.
  [[nodiscard]] bool is_greedy() const noexcept { return params_.temperature == 0.0f; }

  //! The argmax of the logits after logit bias and penalties, ties to the lowest id (the token a
  //! greedy sampler emits). Same errors as `distribution()`.
  [[nodiscard]] token_id greedy_token(std::span<float const> logits, token_history history) const {
    constexpr char const* who = "sampler::greedy_token";
    SPECDEC_CHECK(!logits.empty(), invalid_argument, who, ": empty logits row");
    std::size_t const vocab = logits.size();
    // The logit bias's ids are always checked; the history's unless it is checked and unread.
    check_tokens(
        penalties_ || !history.is_checked() ? history.tokens() : std::span<token_id const>(), vocab,
        who);
    std::span<float const> row = logits;
    if (has_processing(history)) {
      std::vector<float>& tmp = detail::thread_scratch<float, 2>(vocab);
      std::copy(logits.begin(), logits.end(), tmp.begin());
      apply_processing(tmp.data(), vocab, history);
      row = std::span<float const>(tmp.data(), vocab);
    }
    detail::row_summary const s =
        detail::summarize_row(row, "sampler::greedy_token (after logit bias and penalties)");
    return static_cast<token_id>(detail::first_equal(row.data(), vocab, s.max));
  }

  //! The parameters this sampler was built with.
  [[nodiscard]] sampling_params const& params() const noexcept { return params_; }

 private:
  [[nodiscard]] bool has_processing(std::span<token_id const> history) const noexcept {
    return !params_.logit_bias.empty() || (penalties_ && !history.empty());
  }

  void check_tokens(std::span<token_id const> history, std::size_t vocab, char const* who) const {
    if (!params_.logit_bias.empty()) {
      SPECDEC_CHECK(static_cast<std::size_t>(max_bias_token_) < vocab, out_of_range, who,
                    ": logit_bias names token ", max_bias_token_,
                    ", not a token of a vocabulary of ", vocab);
    }
    detail::check_history(history, vocab, who);
  }

  //! Steps 1 and 2 (bias, penalties) in place on z[0..vocab). Token ids are already checked.
  void apply_processing(float* z, std::size_t vocab, std::span<token_id const> history) const {
    for (auto const& [token, bias] : params_.logit_bias) z[token] += bias;
    if (!penalties_ || history.empty()) return;
    history = params_.penalty_window(history);
    std::vector<std::int32_t>& counts = detail::thread_scratch<std::int32_t, 3>(vocab);
    for (token_id t : history) ++counts[static_cast<std::size_t>(t)];
    float const r = params_.repetition_penalty;
    float const f = params_.frequency_penalty;
    float const p = params_.presence_penalty;
    for (token_id t : history) {
      auto const at = static_cast<std::size_t>(t);
      std::int32_t const c = counts[at];
      if (c == 0) continue;  // already applied
      counts[at] = 0;        // leaves the scratch all-zero for the next call
      float l = z[at];
      if (r != 1.0f) l = l > 0.0f ? l / r : l * r;
      l -= f * static_cast<float>(c);
      l -= p;
      z[at] = l;
    }
  }

  //! Finishes a row whose top-k set is small: `scratch.list[0..k)` holds the kept (logit, id)
  //! pairs. Applies temperature, top-p and min-p to the list and writes the row (zeros
  //! elsewhere).
  void finish_sparse(detail::select_scratch& scratch, std::size_t k, float zmax,
                     std::span<float> probs) const {
    detail::scored* list = scratch.list.data();
    double total = 0.0;
    for (std::size_t i = 0; i < k; ++i) {
      list[i].value = detail::exp_nonpositive((list[i].value - zmax) * inv_temperature_);
      total += static_cast<double>(list[i].value);
    }
    std::size_t kept = k;
    if (params_.top_p < 1.0f) {
      double mass = 0.0;
      kept = detail::weighted_cut(list, k, static_cast<double>(params_.top_p) * total, mass);
    }
    if (params_.min_p > 0.0f) kept = keep_at_least(list, kept, params_.min_p);
    write_list(list, kept, probs);
  }

  //! Compacts list[0..count) to the entries with value >= floor (keeping at least the largest)
  //! and returns how many remain.
  static std::size_t keep_at_least(detail::scored* list, std::size_t count, float floor) {
    std::size_t m = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (list[i].value >= floor) list[m++] = list[i];
    return m;
  }

  //! Writes list[0..kept) (unnormalised probabilities with ids), normalised, into a zeroed row.
  static void write_list(detail::scored const* list, std::size_t kept, std::span<float> probs) {
    double mass = 0.0;
    for (std::size_t i = 0; i < kept; ++i) mass += static_cast<double>(list[i].value);
    std::fill(probs.begin(), probs.end(), 0.0f);
    auto const inv = static_cast<float>(1.0 / mass);
    for (std::size_t i = 0; i < kept; ++i)
      probs[static_cast<std::size_t>(list[i].id)] = list[i].value * inv;
  }

  sampling_params params_;
  token_id max_bias_token_ = 0;
  bool penalties_ = false;
  float inv_temperature_ = 0.0f;
};

//! The pure greedy policy: no logit processing; `distribution()` writes a one-hot row at the
//! argmax of the logits (ties to the lowest id). Same errors as `sampler` for NaN / +inf logits
//! and bad history ids.
class greedy {
 public:
  //! The CUDA backend implements it (core/traits.hpp).
  static constexpr bool device_supported = true;

  //! Writes the one-hot row at `greedy_token(logits, history)` into `probs` ([V], same size).
  void distribution(std::span<float const> logits, token_history history,
                    std::span<float> probs) const {
    detail::check_row_shapes(logits, probs, "greedy::distribution");
    token_id const t = greedy_token(logits, history);
    std::fill(probs.begin(), probs.end(), 0.0f);
    probs[static_cast<std::size_t>(t)] = 1.0f;
  }

  //! `sample_from(probs, rng.uniform())`: one word of `rng`; on a one-hot row, its hot token.
  [[nodiscard]] token_id sample(std::span<float const> probs, philox& rng) const {
    return sample_from(probs, rng.uniform());
  }

  //! Always true.
  [[nodiscard]] bool is_greedy() const noexcept { return true; }

  //! The argmax of `logits`, ties to the lowest id. Throws `errc::numerical` for a NaN or +inf
  //! logit or a row with no finite entry, `errc::out_of_range` for a history token outside [0, V).
  [[nodiscard]] token_id greedy_token(std::span<float const> logits, token_history history) const {
    SPECDEC_CHECK(!logits.empty(), invalid_argument, "greedy::greedy_token: empty logits row");
    if (!history.is_checked())
      detail::check_history(history, logits.size(), "greedy::greedy_token");
    detail::row_summary const s = detail::summarize_row(logits, "greedy::greedy_token");
    return static_cast<token_id>(detail::first_equal(logits.data(), logits.size(), s.max));
  }

  //! Parameters equivalent to this policy: temperature 0, nothing else.
  [[nodiscard]] sampling_params const& params() const noexcept {
    static sampling_params const p = [] {
      sampling_params q;
      q.temperature = 0.0f;
      return q;
    }();
    return p;
  }
};

}  // namespace specdec
