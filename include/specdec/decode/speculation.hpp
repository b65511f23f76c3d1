#pragma once
//! \file
//! How much to speculate under load: the `speculation_policy` concept by which `batch_decoder`
//! chooses each step's draft length per request, a fixed policy (`fixed_speculation`) and the
//! adaptive one (`adaptive_speculation`), which maximises goodput -- committed tokens per second
//! -- from measured costs and each request's recent acceptance.
//!
//! The rule (docs/batching.md): a chain of k drafted tokens, each accepted with probability a
//! given its predecessors were, commits (1 - a^(k+1)) / (1 - a) tokens in expectation (the
//! accepted prefix plus the bonus token). A step over requests i = 1..n with draft lengths k_i
//! scores R = sum_i (1 + k_i + p_i) rows (p_i: prompt rows of a request's first step) and takes
//! T(R) + c_d sum_i k_i + c_r n seconds: T the target forward's time as a function of its rows,
//! c_d the proposer's cost per drafted token, c_r the rest per request. The policy picks the k_i
//! maximising sum_i E_i(k_i) / step time. E_i's increments a_i^j (j = 1, 2, ...) decrease, so for
//! each total D of drafted tokens the best split gives the D largest increments over all requests;
//! the policy scans D = 0, 1, ... (the time depends on D only) and keeps the best. D = 0 -- no
//! speculation -- wins when the forward is compute-bound and acceptance is low. A step that also
//! scores prompts keeps the drafts whose tokens come at the rate of the step without them; the
//! a_i are the requests' estimates drawn to the batch's mean as far as they are noise.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/batch_forward.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/decode/detail/phase_timer.hpp"
#include "specdec/decode/forward_cost.hpp"

namespace specdec {

//! The expected tokens a step commits when it drafts a chain of k tokens, each accepted with
//! probability a given its predecessors were: (1 - a^(k+1)) / (1 - a), k + 1 when a = 1 (the
//! accepted prefix plus the bonus token). a is clamped to [0, 1].
[[nodiscard]] inline double expected_accepted_length(double a, std::size_t k) noexcept {
  a = std::clamp(a, 0.0, 1.0);
  if (a >= 1.0) return static_cast<double>(k + 1);
  return (1.0 - std::pow(a, static_cast<double>(k + 1))) / (1.0 - a);
}

//! What a speculation policy sees of one request at the start of a step.
struct speculation_request {
  std::size_t slot = 0;        //!< the request's slot (stable while it lives)
  std::size_t max_draft = 0;   //!< most draft tokens the step may score for it (budget, context,
                               //!< tokens still allowed)
  std::size_t other_rows = 1;  //!< rows it adds besides its draft: its root, and its prompt on
                               //!< its first step
  double acceptance = 0.5;     //!< its recent per-token acceptance rate, in [0, 1]
  double tested = 0.0;         //!< its draft tokens tested so far (decayed as `acceptance`'s
                               //!< evidence); 0 while none was
};

//! What one step cost, as the decoder measured it.
struct step_cost {
  std::size_t requests = 0;        //!< requests in the step
  std::size_t rows = 0;            //!< rows of the target forward
  std::size_t drafted = 0;         //!< draft tokens over all requests
  double forward_seconds = 0.0;    //!< the target forward
  double propose_seconds = 0.0;    //!< the proposer
  double remaining_seconds = 0.0;  //!< everything else (verify, commit, bookkeeping)
};

//! How a decoder estimates each request's acceptance rate for its speculation policy
//! (`acceptance_estimator`).
struct acceptance_options {
  //! The accepted draft tokens over the tested ones (accepted, plus the first rejected), both
  //! counts decayed by this factor per step, in [0, 1).
  double decay = 0.9;
  //! The prior of the decoder-wide rate (the same counts over every request), in [0, 1].
  double prior = 0.5;
  //! How many tested tokens a prior counts as, >= 0.
  double prior_weight = 2.0;

  //! Throws `errc::invalid_argument` naming the field out of its domain (`who`: the caller).
  void validate(char const* who = "acceptance_options") const {
    SPECDEC_CHECK(decay >= 0.0 && decay < 1.0, invalid_argument, who, ": acceptance decay ", decay,
                  " is outside [0, 1)");
    SPECDEC_CHECK(prior >= 0.0 && prior <= 1.0, invalid_argument, who, ": acceptance prior ", prior,
                  " is outside [0, 1]");
    SPECDEC_CHECK(prior_weight >= 0.0, invalid_argument, who, ": acceptance prior weight ",
                  prior_weight, " is negative");
  }
};

//! The acceptance estimates both decoders give their speculation policy. A request's estimate is
//! its accepted draft tokens over its tested ones (the accepted, plus the first rejected), both
//! counts decayed once per step; its prior, counted as `prior_weight` tested tokens, is the
//! decoder's own rate (the same counts over every request, decayed per step), which has `prior` as
//! its prior with the same weight: a request that has drafted little borrows the rate of the
//! others, and when all were unlucky (a decoder of one sequence, say) the estimates drift back to
//! `prior` as the evidence decays, so one unlucky step does not switch speculation off for long.
class acceptance_estimator {
 public:
  //! One request's decayed counts.
  struct counts {
    double accepted = 0.0;
    double tested = 0.0;
  };

  //! An estimator with `options` (validated) and no evidence.
  explicit acceptance_estimator(acceptance_options options = {}) : options_(options) {
    options_.validate();
  }

  //! What the policy sees of a request with counts `c`, in slot `slot`, allowed `max_draft` draft
  //! tokens and adding `other_rows` other rows to the step.
  [[nodiscard]] speculation_request request(counts const& c, std::size_t slot,
                                            std::size_t max_draft,
                                            std::size_t other_rows) const noexcept {
    double const w = options_.prior_weight;
    double const prior = all_.tested + w > 0.0
                             ? (all_.accepted + options_.prior * w) / (all_.tested + w)
                             : options_.prior;
    return {.slot = slot,
            .max_draft = max_draft,
            .other_rows = other_rows,
            .acceptance =
                c.tested + w > 0.0 ? (c.accepted + prior * w) / (c.tested + w) : options_.prior,
            .tested = c.tested};
  }

  //! Decays a request's counts (once per step, whether it drafts or not: evidence that is not
  //! renewed fades toward the decoder's rate).
  void decay(counts& c) const noexcept {
    c.accepted *= options_.decay;
    c.tested *= options_.decay;
  }

  //! Decays the decoder-wide counts (once per step).
  void decay_all() noexcept { decay(all_); }

  //! Adds a step's outcome for a request: `accepted` of a draft of depth `depth` (nothing when it
  //! drafted nothing).
  void record(counts& c, std::size_t accepted, std::size_t depth) noexcept {
    if (depth == 0) return;
    auto const a = static_cast<double>(accepted);
    auto const tested = static_cast<double>(accepted + (accepted < depth ? 1 : 0));
    c.accepted += a;
    c.tested += tested;
    all_.accepted += a;
    all_.tested += tested;
  }

  //! The options.
  [[nodiscard]] acceptance_options const& options() const noexcept { return options_; }

 private:
  acceptance_options options_;
  counts all_;
};

//! A policy that chooses each step's draft length per request.
//!
//! Requirements:
//! - `s.choose(requests, draft)` writes draft[i] in [0, requests[i].max_draft] for every request
//!   of the step. Why: the decoder asks once per step, for the whole batch, since the best length
//!   of one request depends on the others (they share the forward's cost).
//! - `s.observe(cost)` is told what the step cost. Why: adaptive policies learn the costs online.
//! A policy may also have `prepare(model)`, which the decoder calls before its first step (an
//! adaptive policy measures the model's forward costs there).
template <class S>
concept speculation_policy = requires(S& s, std::span<speculation_request const> requests,
                                      std::span<std::size_t> draft, step_cost const& cost) {
  s.choose(requests, draft);
  s.observe(cost);
};

//! Every request drafts min(k, its limit) tokens per step: k = the most (the default) drafts the
//! proposer's whole budget, as `speculative_decoder` does; k = 0 decodes autoregressively.
class fixed_speculation {
 public:
  //! The whole budget of every request, every step.
  fixed_speculation() noexcept = default;
  //! Draft length k per request and step.
  explicit fixed_speculation(std::size_t k) noexcept : k_(k) {}

  //! draft[i] = min(k, requests[i].max_draft).
  void choose(std::span<speculation_request const> requests,
              std::span<std::size_t> draft) const noexcept {
    for (std::size_t i = 0; i < requests.size() && i < draft.size(); ++i)
      draft[i] = std::min(k_, requests[i].max_draft);
  }
  //! Learns nothing.
  void observe(step_cost const&) const noexcept {}
  //! The draft length.
  [[nodiscard]] std::size_t k() const noexcept { return k_; }

 private:
  std::size_t k_ = std::numeric_limits<std::size_t>::max();
};

//! Options of `adaptive_speculation`.
struct adaptive_speculation_options {
  //! Most draft tokens per request and step (also capped by each request's limit).
  std::size_t max_k = 8;
  //! Weight of each new step in the moving averages of the costs, in (0, 1].
  double cost_weight = 0.2;
  //! A request that drafted nothing for this many steps drafts one token (when allowed), so that
  //! its acceptance estimate follows its text; 0 never probes. Probes (this and `probe_new`) are
  //! made only where the request's drafts could raise the step's goodput were they all accepted.
  std::size_t probe_interval = 16;
  //! A request none of whose draft tokens was tested yet (a new one) drafts one token (when
  //! allowed), so that its estimate starts from its own text: a batch whose prior makes
  //! speculation look unprofitable would otherwise learn nothing until the first periodic probe.
  bool probe_new = true;
  //! Speculation must be predicted to raise the step's goodput by at least this fraction over no
  //! speculation, or the step drafts nothing (probes aside): the predictions rest on a measured
  //! curve whose slope, where the forward is compute-bound, is known to a few percent, and a
  //! predicted gain within that error is as likely a loss. >= 0.
  double min_gain = 0.05;
  //! Row counts `prepare` measures when the cost model is empty (see
  //! `forward_cost_model::calibrate`), the context it measures them at and its rounds. 8 and 9
  //! bracket the end of the CPU kernel's one-pass batches (8 tokens with AVX-512), where the
  //! curve bends.
  std::vector<std::size_t> calibration_rows = {1,  2,  3,  4,  6,  8,  9,   10,
                                               12, 16, 24, 32, 48, 64, 128, 256};
  std::size_t calibration_context = 64;
  std::size_t calibration_rounds = 5;

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    SPECDEC_CHECK(max_k < max_tree_nodes, invalid_argument, "adaptive_speculation: max_k ", max_k,
                  " must be below ", max_tree_nodes);
    SPECDEC_CHECK(cost_weight > 0.0 && cost_weight <= 1.0, invalid_argument,
                  "adaptive_speculation: cost_weight ", cost_weight, " is outside (0, 1]");
    SPECDEC_CHECK(min_gain >= 0.0 && std::isfinite(min_gain), invalid_argument,
                  "adaptive_speculation: min_gain ", min_gain, " must be finite and >= 0");
  }
};

//! Chooses each request's draft length to maximise the step's goodput (see the file comment),
//! from the forward's measured time as a function of its rows (`forward_cost_model`: calibrated
//! by `prepare` or `calibrate`, refined by every step), the proposer's measured cost per drafted
//! token, the rest of a step's cost per request, and each request's recent acceptance rate.
class adaptive_speculation {
 public:
  //! A policy with `options` (validated) and no cost measured yet.
  explicit adaptive_speculation(adaptive_speculation_options options = {})
      : options_(std::move(options)) {
    options_.validate();
  }

  //! Measures the forward costs of `model` unless some are known (called by the decoder before its
  //! first step; a `batched_lm` needs a free slot, a `causal_lm`'s cache is cleared).
  template <class Model>
  requires batched_lm<Model> || causal_lm<Model>
  void prepare(Model& model) {
    if (costs_.empty()) calibrate(model);
  }

  //! Measures the forward costs of `model` at `options().calibration_rows`: all of them for a
  //! `batched_lm`; for a `causal_lm` (one sequence: a step scores at most max_k + 1 rows, and a
  //! few auxiliary ones) those up to max_k + 1 and the next one above.
  template <class Model>
  requires batched_lm<Model> || causal_lm<Model>
  void calibrate(Model& model) {
    if constexpr (batched_lm<Model>) {
      costs_.calibrate(model, options_.calibration_rows, options_.calibration_context,
                       options_.calibration_rounds);
    } else {
      std::vector<std::size_t> rows;
      std::size_t above = 0;  // the smallest row count above max_k + 1
      for (std::size_t r : options_.calibration_rows) {
        if (r <= options_.max_k + 1)
          rows.push_back(r);
        else if (above == 0 || r < above)
          above = r;
      }
      if (above != 0) rows.push_back(above);
      costs_.calibrate(model, rows, options_.calibration_context, options_.calibration_rounds);
    }
  }

  //! The draft lengths of the step that maximise the predicted goodput (see the file comment).
  void choose(std::span<speculation_request const> requests, std::span<std::size_t> draft) {
    std::size_t const n = std::min(requests.size(), draft.size());
    std::size_t base_rows = 0;
    shrink_acceptance(requests.first(n));
    increments_.clear();
    for (std::size_t i = 0; i < n; ++i) {
      speculation_request const& r = requests[i];
      draft[i] = 0;
      base_rows += r.other_rows;
      std::size_t const k = std::min(options_.max_k, r.max_draft);
      double const a = acceptance_[i];
      double gain = 1.0;
      for (std::size_t j = 1; j <= k; ++j) {
        gain *= a;  // E(j) - E(j - 1) = a^j
        if (gain <= 0.0) break;
        increments_.push_back({gain, i});
      }
    }
    if (n == 0) return;
    std::stable_sort(increments_.begin(), increments_.end(),
                     [](increment const& x, increment const& y) { return x.gain > y.gain; });
    double const count = static_cast<double>(n);
    double const bar = goodput(count, n, 0, n) * (1.0 + options_.min_gain);  // none, the margin
    // A step that also scores prompts keeps the drafts whose tokens come at the rate r of the step
    // without them (one row per request: its best goodput, at least `bar`); its own goodput would
    // favour drafts the prompt rows' time makes look cheap, which a decode step would put to
    // better use. Without prompts the score is the step's goodput.
    bool const prompts = base_rows > n;
    double rate = bar, t0 = 0.0;
    if (prompts) {
      t0 = step_seconds(base_rows, 0, n);
      double tokens = count;
      for (std::size_t d = 0; d < increments_.size(); ++d) {
        tokens += increments_[d].gain;
        rate = std::max(rate, goodput(tokens, n + d + 1, d + 1, n));
      }
    }
    auto const score = [&](double t, std::size_t d) {
      return prompts ? (t - count) - rate * (step_seconds(base_rows + d, d, n) - t0)
                     : goodput(t, base_rows + d, d, n);
    };
    // The D largest increments, for every D; keep the D of the best score, if it beats no
    // speculation (with the margin).
    double best = prompts ? 0.0 : bar;
    double best_tokens = count, tokens = count;
    std::size_t best_d = 0;
    for (std::size_t d = 0; d < increments_.size(); ++d) {
      tokens += increments_[d].gain;
      double const g = score(tokens, d + 1);
      if (g > best) {
        best = g;
        best_tokens = tokens;
        best_d = d + 1;
      }
    }
    for (std::size_t d = 0; d < best_d; ++d) ++draft[increments_[d].request];
    // A new request, or one left without speculation for a while, probes with one token -- if
    // its drafts could pay in this step were all of them accepted: where the forward is
    // compute-bound, what a probe would learn cannot change the choice, and the probe's row
    // costs what it does. The fewest such drafts that would pay is the same for every request.
    std::size_t pays_from = options_.max_k + 1;
    if (options_.probe_interval > 0 || options_.probe_new)
      for (std::size_t j = 1; j <= options_.max_k && pays_from > options_.max_k; ++j)
        if (score(best_tokens + static_cast<double>(j), best_d + j) > best) pays_from = j;
    for (std::size_t i = 0; i < n; ++i) {
      speculation_request const& r = requests[i];
      if (idle_.size() <= r.slot) idle_.resize(r.slot + 1, 0);
      if (draft[i] > 0) {
        idle_[r.slot] = 0;
        continue;
      }
      bool const due = options_.probe_interval > 0 && ++idle_[r.slot] > options_.probe_interval;
      bool const fresh = options_.probe_new && !(r.tested > 0.0);
      if ((due || fresh) && std::min(options_.max_k, r.max_draft) >= pays_from) {
        draft[i] = 1;
        idle_[r.slot] = 0;
      }
    }
  }

  //! Learns the step's costs: the forward's time at its rows, the proposer's per drafted token,
  //! the rest per request.
  void observe(step_cost const& c) {
    double const w = options_.cost_weight;
    costs_.observe(c.rows, c.forward_seconds, w);
    if (c.drafted > 0) {
      double const per = c.propose_seconds / static_cast<double>(c.drafted);
      per_draft_ = seen_draft_ ? per_draft_ + w * (per - per_draft_) : per;
      seen_draft_ = true;
    }
    if (c.requests > 0) {
      double const per = c.remaining_seconds / static_cast<double>(c.requests);
      per_request_ = seen_request_ ? per_request_ + w * (per - per_request_) : per;
      seen_request_ = true;
    }
  }

  //! The acceptance rates the last `choose` used, by request: each request's estimate drawn
  //! towards the batch's mean as far as its noise exceeds the spread between requests (see
  //! `shrink_acceptance`).
  [[nodiscard]] std::span<double const> acceptance() const noexcept { return acceptance_; }

  //! The forward cost model (calibrated, refined online).
  [[nodiscard]] forward_cost_model const& costs() const noexcept { return costs_; }
  //! The forward cost model, to calibrate or seed from measurements made elsewhere.
  [[nodiscard]] forward_cost_model& costs() noexcept { return costs_; }
  //! The proposer's measured seconds per drafted token.
  [[nodiscard]] double seconds_per_draft() const noexcept { return per_draft_; }
  //! The options (validated).
  [[nodiscard]] adaptive_speculation_options const& options() const noexcept { return options_; }

  //! The predicted goodput (tokens / second) of a step committing `tokens` expected tokens with
  //! `rows` forward rows, `drafted` drafted tokens and `requests` requests.
  [[nodiscard]] double goodput(double tokens, std::size_t rows, std::size_t drafted,
                               std::size_t requests) const noexcept {
    double const t = step_seconds(rows, drafted, requests);
    return t > 0.0 ? tokens / t : 0.0;
  }

  //! The predicted time of a step with `rows` forward rows, `drafted` drafted tokens and
  //! `requests` requests (without a measured forward, a forward's time counts as its rows).
  [[nodiscard]] double step_seconds(std::size_t rows, std::size_t drafted,
                                    std::size_t requests) const noexcept {
    double const forward = costs_.empty() ? static_cast<double>(rows) : costs_.predict(rows);
    return forward + per_draft_ * static_cast<double>(drafted) +
           per_request_ * static_cast<double>(requests);
  }

 private:
  //! Sets acceptance_[i] for every request: the empirical-Bayes estimate of its rate. A request's
  //! estimate rests on a few recently tested tokens (`tested`), so it is noisy, with variance
  //! about m (1 - m) / (tested + 1) around its true rate (m: the batch's mean, weighted by
  //! tested); picking the largest of noisy estimates picks their errors too, and a batch whose
  //! requests all accept alike would spread its drafts unevenly and commit fewer tokens than an
  //! even split. The spread of the true rates is estimated as the estimates' variance less the
  //! noise's (at least 0), and each estimate is drawn to the mean by the fraction of its variance
  //! that is noise. Fewer than 3 requests keep their estimates.
  void shrink_acceptance(std::span<speculation_request const> requests) {
    std::size_t const n = requests.size();
    acceptance_.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      acceptance_[i] = std::clamp(requests[i].acceptance, 0.0, 1.0);
    if (n < 3) return;
    auto const evidence = [&](std::size_t i) { return std::max(0.0, requests[i].tested) + 1.0; };
    double weight = 0.0, sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      weight += evidence(i);
      sum += evidence(i) * acceptance_[i];
    }
    double const mean = sum / weight;
    auto const noise = [&](std::size_t i) { return mean * (1.0 - mean) / evidence(i); };
    double spread = 0.0, noises = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      double const d = acceptance_[i] - mean;
      spread += d * d;
      noises += noise(i);
    }
    double const between = std::max(0.0, (spread - noises) / static_cast<double>(n));
    for (std::size_t i = 0; i < n; ++i) {
      double const v = noise(i);
      double const keep = between + v > 0.0 ? between / (between + v) : 1.0;
      acceptance_[i] = mean + keep * (acceptance_[i] - mean);
    }
  }

  struct increment {
    double gain;          // a^j: the expected tokens one more draft token adds
    std::size_t request;  // index into the step's requests
  };
  adaptive_speculation_options options_;
  forward_cost_model costs_;
  double per_draft_ = 0.0, per_request_ = 0.0;
  bool seen_draft_ = false, seen_request_ = false;
  std::vector<increment> increments_;
  std::vector<double> acceptance_;  // [request of the last step] the rates `choose` used
  std::vector<std::size_t> idle_;   // [slot] steps without a draft
};

static_assert(speculation_policy<fixed_speculation>);
static_assert(speculation_policy<adaptive_speculation>);

}  // namespace specdec
