#pragma once
//! \file
//! The row passes of the sampling, drawing and verification kernels: checked maximum,
//! exp-and-sum, scaling, a validation sum, the inverse-CDF crossing search, threshold statistics,
//! gathers and argmax; and the finiteness check of model weights. Internals (namespace
//! `specdec::detail`), not API. Every reduction runs over `row_lanes` logical lanes in a fixed
//! order, so results do not depend on the vector width (see detail/simd.hpp).
//!
//! The passes are written once (detail/kernels/rows.inl, on the vectors of kernels/simd.inl) and
//! compiled once per CPU target (core/cpu_target.hpp), each copy in a namespace of its own
//! (`specdec::detail::baseline`, `::avx2`, `::avx512`) under a target pragma. Every copy gives
//! the same bits: the reductions run over the same logical lanes in the same order, and the exp's
//! products are never fused with the additions that follow them (`scalar_exp_ops::mul`), which
//! the baseline could not match. The functions of this header have the names and signatures of
//! the passes and call the copy of the active target (`active_cpu_target`, read at each call).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>

#include "specdec/core/cpu_target.hpp"
#include "specdec/core/error.hpp"
#include "specdec/detail/exp.hpp"
#include "specdec/detail/simd.hpp"

namespace specdec::detail {

//! Summary of one logits row.
struct row_summary {
  float max = -std::numeric_limits<float>::infinity();  //!< largest entry
};

//! Throws `errc::numerical` naming the first NaN or +inf entry of x[0..n), or saying that no
//! entry is finite. Cold path of `summarize_row`.
[[noreturn]] inline void throw_bad_row(float const* x, std::size_t n, char const* who) {
  for (std::size_t k = 0; k < n; ++k) {
    SPECDEC_CHECK(!std::isnan(x[k]), numerical, who, ": logit ", k, " of ", n, " is NaN");
    SPECDEC_CHECK(x[k] != std::numeric_limits<float>::infinity(), numerical, who, ": logit ", k,
                  " of ", n, " is +inf");
  }
  SPECDEC_THROW(numerical, who, ": no finite logit in a row of ", n,
                " (every entry is -inf, or the row is empty)");
}

//! What `exp_masked` returns.
struct exp_sums {
  double total = 0.0;           //!< sum of every written value
  double at_least_floor = 0.0;  //!< sum of the written values >= `efloor` (when requested)
};

//! The sequential definition of `first_crossing`: the first j in [0, len) at which
//! c = running + w[0] + ... + w[j], added one entry at a time in double with w[j] = max(x[j], 0),
//! exceeds `target`; `len` when none does.
[[nodiscard]] inline std::size_t first_crossing_sequential(float const* x, std::size_t len,
                                                           double running, double target) noexcept {
  double c = running;
  for (std::size_t j = 0; j < len; ++j) {
    c += static_cast<double>(positive_part(x[j]));
    if (c > target) return j;
  }
  return len;
}

//! Entries `first_crossing` searches with vectors (other runs take the sequential loop).
inline constexpr std::size_t crossing_block = 64;

//! True when [a, a + an) and [b, b + bn) share memory but do not start at the same address.
template <class T, class U>
[[nodiscard]] inline bool partially_overlap(T const* a, std::size_t an, U const* b,
                                            std::size_t bn) noexcept {
  auto const pa = reinterpret_cast<std::uintptr_t>(a);
  auto const pb = reinterpret_cast<std::uintptr_t>(b);
  if (pa == pb) return false;
  return pa < pb + bn * sizeof(U) && pb < pa + an * sizeof(T);
}

}  // namespace specdec::detail

// ---- the passes, once per compiled target.
#define SPECDEC_EACH_TARGET_NAMESPACE specdec::detail
#define SPECDEC_EACH_TARGET_BODY "specdec/detail/kernels/row_bodies.inl"
#include "specdec/detail/kernels/each_target.inl"

#if SPECDEC_TARGET_AVX512
#define SPECDEC_DETAIL_ROWS_AVX512(...) \
  case cpu_target::avx512:              \
    return avx512::__VA_ARGS__;
#else
#define SPECDEC_DETAIL_ROWS_AVX512(...)
#endif
#if SPECDEC_TARGET_AVX2
#define SPECDEC_DETAIL_ROWS_AVX2(...) \
  case cpu_target::avx2:              \
    return avx2::__VA_ARGS__;
#else
#define SPECDEC_DETAIL_ROWS_AVX2(...)
#endif
#if SPECDEC_TARGET_BASELINE
#define SPECDEC_DETAIL_ROWS_BASELINE(...) return baseline::__VA_ARGS__;
#else
#define SPECDEC_DETAIL_ROWS_BASELINE(...) SPECDEC_UNREACHABLE_ROWS
#endif
#if defined(__GNUC__) || defined(__clang__)
#define SPECDEC_UNREACHABLE_ROWS __builtin_unreachable();
#else
#define SPECDEC_UNREACHABLE_ROWS std::abort();
#endif

//! `return <target>::call;` for the active target (a target the build did not compile is never
//! active: `set_cpu_target` and the environment refuse it).
#define SPECDEC_DETAIL_ROWS(...)            \
  switch (::specdec::active_cpu_target()) { \
    SPECDEC_DETAIL_ROWS_AVX512(__VA_ARGS__) \
    SPECDEC_DETAIL_ROWS_AVX2(__VA_ARGS__)   \
    default:                                \
      break;                                \
  }                                         \
  SPECDEC_DETAIL_ROWS_BASELINE(__VA_ARGS__)

namespace specdec::detail {
inline namespace SPECDEC_TARGETS_NAMESPACE {

//! The maximum of x[0..n) as `summarize_row` defines it, one step of `row_lanes` at a time into
//! one set of lane maxima (each lane keeps the first of equal values), merged lane by lane in
//! order, then the tail; `bad` is set when an entry is NaN. Resolves the sign of a zero maximum.
[[nodiscard]] inline float ordered_row_max(float const* x, std::size_t n, bool& bad) noexcept {
  SPECDEC_DETAIL_ROWS(ordered_row_max(x, n, bad))
}

//! The maximum of `row`; throws `errc::numerical` naming the index of the first NaN or +inf, or
//! when no entry is finite (an empty row included). `who` names the caller in the message.
[[nodiscard]] inline row_summary summarize_row(std::span<float const> row, char const* who) {
  SPECDEC_DETAIL_ROWS(summarize_row(row, who))
}

//! `exp_masked`, with the test against `zfloor` only when `Masked` (see kernels/rows.inl).
template <bool WithFloor, bool Masked, bool Scaled>
[[nodiscard]] inline exp_sums exp_masked_pass(float const* x, float* out, std::size_t n,
                                              float shift, float scale, float zfloor,
                                              float efloor) noexcept {
  SPECDEC_DETAIL_ROWS(
      exp_masked_pass<WithFloor, Masked, Scaled>(x, out, n, shift, scale, zfloor, efloor))
}

//! Writes out[i] = x[i] >= zfloor ? exp((x[i] - shift) * scale) : 0 for every i and returns the
//! sums of the written values (see kernels/rows.inl). `out` may be `x` itself.
template <bool WithFloor>
[[nodiscard]] inline exp_sums exp_masked(float const* x, float* out, std::size_t n, float shift,
                                         float scale, float zfloor, float efloor) noexcept {
  SPECDEC_DETAIL_ROWS(exp_masked<WithFloor>(x, out, n, shift, scale, zfloor, efloor))
}

//! Writes out[i] = exp((x[i] - shift) * scale) for every i and returns the sum of the written
//! values (see `exp_masked`). `out` may be `x` itself.
inline double exp_shifted(float const* x, float* out, std::size_t n, float shift, float scale) {
  SPECDEC_DETAIL_ROWS(exp_shifted(x, out, n, shift, scale))
}

//! out[i] = x[i] * factor. `out` may be `x` itself.
inline void scale_row(float const* x, float* out, std::size_t n, float factor) noexcept {
  SPECDEC_DETAIL_ROWS(scale_row(x, out, n, factor))
}

//! out[i] = x[i] >= floor ? x[i] * factor : 0. `out` may be `x` itself.
inline void scale_at_least(float const* x, float* out, std::size_t n, float floor,
                           float factor) noexcept {
  SPECDEC_DETAIL_ROWS(scale_at_least(x, out, n, floor, factor))
}

//! Adds x[from..n) to `total` in order, in double; returns whether an entry is negative or NaN.
[[nodiscard]] inline bool add_tail_checked(float const* x, std::size_t from, std::size_t n,
                                           double& total) noexcept {
  SPECDEC_DETAIL_ROWS(add_tail_checked(x, from, n, total))
}

//! Sum of x[0..n) for validation (see kernels/rows.inl); `bad` is set when an entry is negative
//! or NaN.
[[nodiscard]] inline double sum_checked(float const* x, std::size_t n, bool& bad) noexcept {
  SPECDEC_DETAIL_ROWS(sum_checked(x, n, bad))
}

//! `first_crossing_sequential` (the same index, always), for x[0..len) without NaN and
//! 0 <= running <= target.
[[nodiscard]] inline std::size_t first_crossing(float const* x, std::size_t len, double running,
                                                double target) noexcept {
  SPECDEC_DETAIL_ROWS(first_crossing(x, len, running, target))
}

//! For each of the K thresholds th[k]: count[k] = #{i : x[i] >= th[k]} and, with `Mass`,
//! mass[k] = sum of those x[i] (see kernels/rows.inl).
template <bool Mass, std::size_t K>
inline void threshold_stats(float const* x, std::size_t n, float const (&th)[K], double (&mass)[K],
                            double (&count)[K]) noexcept {
  SPECDEC_DETAIL_ROWS(threshold_stats<Mass, K>(x, n, th, mass, count))
}

//! Copies (x[i], i) for every i with lo <= x[i] < hi, in index order, into vals / ids (at most
//! `capacity` of them) and returns how many entries are in the range.
[[nodiscard]] inline std::size_t gather_range(float const* x, std::size_t n, float lo, float hi,
                                              float* vals, std::int32_t* ids,
                                              std::size_t capacity) noexcept {
  SPECDEC_DETAIL_ROWS(gather_range(x, n, lo, hi, vals, ids, capacity))
}

//! The index of the largest entry of x[0..n) (see kernels/rows.inl).
[[nodiscard]] inline std::int64_t argmax_index(float const* x, std::size_t n) noexcept {
  SPECDEC_DETAIL_ROWS(argmax_index(x, n))
}

//! The first index i with x[i] == value (see kernels/rows.inl).
[[nodiscard]] inline std::size_t first_equal(float const* x, std::size_t n, float value) noexcept {
  SPECDEC_DETAIL_ROWS(first_equal(x, n, value))
}

//! The index of the first NaN or infinite entry of x[0..n), n when none.
[[nodiscard]] inline std::size_t first_non_finite(float const* x, std::size_t n) noexcept {
  SPECDEC_DETAIL_ROWS(first_non_finite(x, n))
}

}  // namespace SPECDEC_TARGETS_NAMESPACE
}  // namespace specdec::detail

#undef SPECDEC_DETAIL_ROWS
#undef SPECDEC_DETAIL_ROWS_AVX512
#undef SPECDEC_DETAIL_ROWS_AVX2
#undef SPECDEC_DETAIL_ROWS_BASELINE
#undef SPECDEC_UNREACHABLE_ROWS
