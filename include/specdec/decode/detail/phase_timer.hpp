#pragma once
//! \file
//! The decoders' phase timer: the phases of a request (prefill, propose, score, verify, commit)
//! timed back to back with a cheap tick counter. Internals, not API.

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "specdec/core/stats.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <x86intrin.h>
#endif

namespace specdec::detail {

//! Seconds elapsed since `start` on the steady clock.
[[nodiscard]] inline double seconds_since(std::chrono::steady_clock::time_point start) noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

//! A cheap monotonic tick counter: the processor's time-stamp counter on x86 (one instruction,
//! about half the cost of a steady_clock read; invariant on the processors this library runs on),
//! steady_clock nanoseconds elsewhere.
[[nodiscard]] inline std::uint64_t tick_count() noexcept {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
#endif
}

//! The phases a decoder times.
enum class phase : std::size_t { prefill, propose, score, verify, commit };

//! Times the phases of one request back to back, one `tick_count()` per phase boundary, so that
//! they cover the whole decode loop: `lap(p)` adds the ticks since the previous boundary to phase
//! p and makes now the next boundary. `finish` converts ticks to seconds at the rate measured
//! against steady_clock over the timer's life (a steady_clock read at each end) and writes the
//! phase totals and `total_seconds` into the request's statistics.
class phase_timer {
 public:
  //! A timer whose first phase starts now.
  phase_timer() noexcept
      : start_time_(std::chrono::steady_clock::now()), start_(tick_count()), last_(start_) {}

  //! Ends the current phase, counting it as `p`; the next phase starts now.
  void lap(phase p) noexcept {
    std::uint64_t const now = tick_count();
    // A counter read on another core may lag by a few ticks: such a phase counts as 0.
    ticks_[static_cast<std::size_t>(p)] += now > last_ ? now - last_ : 0;
    last_ = now;
  }

  //! Writes the phase seconds into `stats` and `total_seconds` since `request_start`.
  void finish(request_stats& stats, std::chrono::steady_clock::time_point request_start) const {
    std::uint64_t const end = tick_count();
    auto const end_time = std::chrono::steady_clock::now();
    double const elapsed = std::chrono::duration<double>(end_time - start_time_).count();
    double const per_tick = end > start_ ? elapsed / static_cast<double>(end - start_) : 0.0;
    auto const seconds = [&](phase p) {
      return static_cast<double>(ticks_[static_cast<std::size_t>(p)]) * per_tick;
    };
    stats.prefill_seconds = seconds(phase::prefill);
    stats.propose_seconds = seconds(phase::propose);
    stats.score_seconds = seconds(phase::score);
    stats.verify_seconds = seconds(phase::verify);
    stats.commit_seconds = seconds(phase::commit);
    stats.total_seconds = std::chrono::duration<double>(end_time - request_start).count();
  }

 private:
  std::chrono::steady_clock::time_point start_time_;
  std::uint64_t start_;
  std::uint64_t last_;
  std::uint64_t ticks_[5] = {};
};

}  // namespace specdec::detail
