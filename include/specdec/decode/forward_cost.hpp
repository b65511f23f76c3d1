#pragma once
//! \file
//! `forward_cost_model`: a target forward's time as a function of its rows, measured on this
//! machine (`calibrate`, for a `batched_lm` or a `causal_lm`) and refined by every step -- what
//! `adaptive_speculation` (decode/speculation.hpp) weighs drafts against.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/core/batch_forward.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/types.hpp"
#include "specdec/decode/detail/phase_timer.hpp"

namespace specdec {

//! The target forward's time as a function of its rows. Two ways to learn it:
//! - calibrated (`calibrate`): measured points (rows, seconds) give the curve's shape, and every
//!   later observation only moves a common scale (a moving average of observed / predicted), so
//!   that a machine that gets slower or faster as a whole (other processes, frequency) keeps the
//!   curve's shape, which is what the choice of draft lengths rests on;
//! - otherwise each observation is a point of the curve (a moving average per row count).
//! Between points the curve is linear; below the first it is flat (a forward of fewer rows costs
//! no less: the weights are read either way); beyond the last it follows the slope of the last
//! two (in proportion to the rows with a single point).
class forward_cost_model {
 public:
  //! Adds a measurement of a forward over `rows` rows that took `seconds` (see the class comment;
  //! `weight` is the moving averages' step, in [0, 1]). Non-positive or non-finite times are
  //! ignored.
  void observe(std::size_t rows, double seconds, double weight = 0.2) {
    if (rows == 0 || !(seconds > 0.0) || !std::isfinite(seconds)) return;
    weight = std::clamp(weight, 0.0, 1.0);
    if (calibrated_) {
      double const curve = shape(rows);
      if (curve > 0.0) scale_ += weight * (seconds / curve - scale_);
      return;
    }
    auto const it = std::lower_bound(points_.begin(), points_.end(), rows,
                                     [](point const& p, std::size_t r) { return p.rows < r; });
    if (it != points_.end() && it->rows == rows) {
      it->seconds += weight * (seconds - it->seconds);
      return;
    }
    points_.insert(it, point{rows, seconds});
  }

  //! The predicted time of a forward over `rows` rows (0 without any measurement).
  [[nodiscard]] double predict(std::size_t rows) const noexcept { return scale_ * shape(rows); }

  //! Whether no forward has been measured.
  [[nodiscard]] bool empty() const noexcept { return points_.empty(); }
  //! Whether the curve comes from `calibrate` (observations then move its scale only).
  [[nodiscard]] bool calibrated() const noexcept { return calibrated_; }
  //! The scale observations put on a calibrated curve (1 after `calibrate`).
  [[nodiscard]] double scale() const noexcept { return scale_; }
  //! Measured row counts.
  [[nodiscard]] std::size_t size() const noexcept { return points_.size(); }

  //! Measures `model`'s forward over each row count of `rows`, as a decode step of many requests
  //! has them: in up to `max_segments` slots it acquires (and releases) -- the free ones -- each
  //! holding `context` tokens, a forward of r rows is r causal tokens spread over min(r, slots)
  //! segments, cut back after it. The row counts are measured in turn, `rounds` times after one
  //! warm-up round, each forward right after one of the smallest row count (the reference): a
  //! point is the median of its rounds' ratios to their reference times the median reference
  //! time, so that a machine whose speed drifts during the calibration (memory bandwidth shared
  //! with other machines, the clock) keeps the curve's shape. Row counts whose forward takes at
  //! most 4 reference forwards get 3 times the rounds: they are cheap, and where the forward
  //! turns compute-bound the choice of draft lengths rests on their ratios, a few percent apart.
  //! The points are then made convex where compute-bound and non-decreasing (`make_convex`).
  //! Replaces what was learnt. Throws what the model throws (no free slot:
  //! `errc::context_overflow`).
  template <batched_lm Model>
  void calibrate(Model& model, std::span<std::size_t const> rows, std::size_t context = 64,
                 std::size_t rounds = 3, std::size_t max_segments = 32) {
    std::size_t most = 1;
    for (std::size_t r : rows) most = std::max(most, r);
    std::size_t const count = std::clamp<std::size_t>(std::min(model.free_slots(), max_segments), 1,
                                                      std::max<std::size_t>(1, most));
    std::vector<std::size_t> slots;
    struct release_on_exit {
      Model& m;
      std::vector<std::size_t>& s;
      ~release_on_exit() {
        for (std::size_t slot : s) m.release_slot(slot);
      }
    } release{model, slots};
    for (std::size_t i = 0; i < count; ++i) slots.push_back(model.acquire_slot());
    std::size_t const capacity =
        std::min<std::size_t>(model.max_context(), model.cache(slots[0]).capacity());
    std::size_t const per_segment = (most + count - 1) / count;
    context = std::min(context, capacity > per_segment ? capacity - per_segment : 0);
    std::vector<token_id> tokens;
    std::vector<position_t> positions;
    calibration_sequence(context + per_segment, model.vocab_size(), tokens, positions);
    std::span<token_id const> const all_tokens(tokens);
    std::span<position_t const> const all_positions(positions);
    batch_forward_result out;
    std::vector<batch_segment> segments;
    std::int32_t const last = 0;
    if (context > 0) {
      for (std::size_t s : slots)
        segments.push_back({.slot = s,
                            .request = {.tokens = all_tokens.first(context),
                                        .positions = all_positions.first(context),
                                        .logits_rows = std::span<std::int32_t const>(&last, 1)}});
      model.forward({.segments = segments}, out);
    }
    auto time_forward = [&](std::size_t r) {
      std::size_t const n = std::min(r, count);
      segments.clear();
      for (std::size_t s = 0; s < n; ++s) {
        std::size_t const len = r / n + (s < r % n ? 1 : 0);
        segments.push_back({.slot = slots[s],
                            .request = {.tokens = all_tokens.subspan(context, len),
                                        .positions = all_positions.subspan(context, len)}});
      }
      auto const t0 = std::chrono::steady_clock::now();
      model.forward({.segments = segments}, out);
      double const seconds = detail::seconds_since(t0);
      for (std::size_t s = 0; s < n; ++s) model.cache(slots[s]).truncate(context);
      return seconds;
    };
    measure(rows, rounds, time_forward);
  }

  //! The same measurement for a model of one sequence (`causal_lm`): a forward of r rows is r
  //! causal tokens after `context` tokens in the model's own cache, cut back after it. Row counts
  //! that do not fit the cache are left out. Clears the model's cache (before and after).
  template <causal_lm Model>
  requires(!batched_lm<Model>) void calibrate(Model& model, std::span<std::size_t const> rows,
                                              std::size_t context = 64, std::size_t rounds = 3) {
    auto& cache = model.cache();
    std::size_t const capacity = std::min<std::size_t>(model.max_context(), cache.capacity());
    std::vector<std::size_t> fit;
    for (std::size_t r : rows)
      if (r > 0 && r <= capacity) fit.push_back(r);
    std::size_t most = 1;
    for (std::size_t r : fit) most = std::max(most, r);
    context = std::min(context, capacity > most ? capacity - most : 0);
    std::vector<token_id> tokens;
    std::vector<position_t> positions;
    calibration_sequence(context + most, model.vocab_size(), tokens, positions);
    std::span<token_id const> const all_tokens(tokens);
    std::span<position_t const> const all_positions(positions);
    struct clear_on_exit {
      decltype(cache)& c;
      ~clear_on_exit() { c.truncate(0); }
    } clear{cache};
    cache.truncate(0);
    forward_result out;
    std::int32_t const last = 0;
    if (context > 0)
      model.forward({.tokens = all_tokens.first(context),
                     .positions = all_positions.first(context),
                     .logits_rows = std::span<std::int32_t const>(&last, 1)},
                    out);
    auto time_forward = [&](std::size_t r) {
      auto const t0 = std::chrono::steady_clock::now();
      model.forward({.tokens = all_tokens.subspan(context, r),
                     .positions = all_positions.subspan(context, r)},
                    out);
      double const seconds = detail::seconds_since(t0);
      cache.truncate(context);
      return seconds;
    };
    measure(fit, rounds, time_forward);
  }

  //! Makes the curve convex (its slope never falls as the rows grow) where it is compute-bound
  //! -- from the first point whose time is at least `compute_bound` times the first point's --
  //! and non-decreasing throughout: wherever the slopes between consecutive points there dip, the
  //! stretch is replaced by the chord between its ends (the slopes' isotonic regression, weighted
  //! by the rows between the points, which keeps the ends' times). `calibrate` calls it: there a
  //! slope set by two neighbouring noisy points can be tens of percent off, and the choice of
  //! draft lengths rests on the slope. Below, the points are kept as measured: a kernel whose
  //! one-pass batches end at some row count (8 tokens on the CPU with AVX-512) steps up there and
  //! rises more slowly after, and a chord across the step would price the rows above it too low.
  void make_convex(double compute_bound = 2.0) {
    std::size_t const n = points_.size();
    if (n < 2) return;
    std::size_t first = 0;
    while (first < n && points_[first].seconds < compute_bound * points_[0].seconds) ++first;
    if (first + 2 < n) {
      struct block {
        double slope, weight;
        std::size_t count;
      };
      std::vector<block> blocks;
      for (std::size_t i = first + 1; i < n; ++i) {
        double const w = static_cast<double>(points_[i].rows - points_[i - 1].rows);
        blocks.push_back({(points_[i].seconds - points_[i - 1].seconds) / w, w, 1});
        while (blocks.size() > 1 && blocks[blocks.size() - 2].slope > blocks.back().slope) {
          block const b = blocks.back();
          blocks.pop_back();
          block& a = blocks.back();
          a.slope = (a.slope * a.weight + b.slope * b.weight) / (a.weight + b.weight);
          a.weight += b.weight;
          a.count += b.count;
        }
      }
      std::size_t i = first + 1;
      for (block const& b : blocks) {
        for (std::size_t j = 0; j < b.count; ++j, ++i)
          points_[i].seconds = points_[i - 1].seconds +
                               b.slope * static_cast<double>(points_[i].rows - points_[i - 1].rows);
      }
    }
    for (std::size_t i = 1; i < n; ++i)
      points_[i].seconds = std::max(points_[i].seconds, points_[i - 1].seconds);
  }

 private:
  struct point {
    std::size_t rows;
    double seconds;
  };

  // `n` tokens spread over the vocabulary at positions 0..n-1: what `calibrate` scores.
  static void calibration_sequence(std::size_t n, std::size_t vocab, std::vector<token_id>& tokens,
                                   std::vector<position_t>& positions) {
    tokens.resize(n);
    positions.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      tokens[i] = static_cast<token_id>((i * 7919 + 13) % vocab);
      positions[i] = static_cast<position_t>(i);
    }
  }

  // The rounds of `calibrate` over `rows` with `time_forward(r)` (seconds of a forward of r
  // rows), then the points (see `calibrate`).
  template <class TimeForward>
  void measure(std::span<std::size_t const> rows, std::size_t rounds, TimeForward&& time_forward) {
    std::size_t most = 1;
    for (std::size_t r : rows) most = std::max(most, r);
    std::size_t reference = most;
    for (std::size_t r : rows)
      if (r > 0) reference = std::min(reference, r);
    std::vector<std::vector<double>> ratios(rows.size());
    std::vector<double> references;
    for (std::size_t round = 0; round <= 3 * rounds; ++round) {
      for (std::size_t i = 0; i < rows.size(); ++i) {
        if (rows[i] == 0) continue;
        bool const cheap = !ratios[i].empty() && ratios[i].front() <= 4.0;
        if (round > rounds && !cheap) continue;
        double const base = time_forward(reference);
        double const seconds = rows[i] == reference ? base : time_forward(rows[i]);
        if (round == 0 || !(base > 0.0)) continue;  // the first round warms the buffers
        ratios[i].push_back(seconds / base);
        references.push_back(base);
      }
    }
    points_.clear();
    calibrated_ = false;
    if (!references.empty()) {
      auto median = [](std::vector<double>& v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      double const base = median(references);
      for (std::size_t i = 0; i < rows.size(); ++i)
        if (!ratios[i].empty()) observe(rows[i], median(ratios[i]) * base, 1.0);
      make_convex();
    }
    calibrated_ = !points_.empty();
    scale_ = 1.0;
  }

  //! The curve of the points, unscaled.
  [[nodiscard]] double shape(std::size_t rows) const noexcept {
    if (points_.empty()) return 0.0;
    if (rows <= points_.front().rows) return points_.front().seconds;
    auto const r = static_cast<double>(rows);
    if (rows >= points_.back().rows) {
      point const& b = points_.back();
      if (points_.size() == 1) return b.seconds * r / static_cast<double>(b.rows);
      point const& a = points_[points_.size() - 2];
      double const slope =
          std::max(0.0, (b.seconds - a.seconds) / static_cast<double>(b.rows - a.rows));
      return b.seconds + slope * (r - static_cast<double>(b.rows));
    }
    auto const hi = std::lower_bound(points_.begin(), points_.end(), rows,
                                     [](point const& p, std::size_t x) { return p.rows < x; });
    auto const lo = hi - 1;
    double const f = (r - static_cast<double>(lo->rows)) / static_cast<double>(hi->rows - lo->rows);
    return lo->seconds + f * (hi->seconds - lo->seconds);
  }

  std::vector<point> points_;  // ascending rows
  bool calibrated_ = false;
  double scale_ = 1.0;
};

}  // namespace specdec
