#pragma once
//! \file
//! The pivot search for the top-k and top-p thresholds of a row, without a sort (FlashInfer's
//! idea: search the threshold by passes over the row that measure it at pivots, instead of ordering
//! the row). The decisions -- where the pivots go, how a pass narrows the bracket, when to stop,
//! and the exact cut among the few entries left -- are written once here as `SPECDEC_HOST_DEVICE`
//! functions; the CUDA kernel (backend/cuda/pivot_sampling.cuh) measures its passes in parallel and
//! the host twin (reference/pivot.hpp) serially, and both call these. Internals, not API.
//!
//! The search, for a weight w (top-k: 1 per entry, on the logits; top-p: the entry itself, on the
//! unnormalised probabilities) and a target W (top-k: k; top-p: p times the total mass):
//! - a bracket [lo, hi) holds the cut value t: weight(>= lo) >= W > weight(>= hi);
//! - each pass measures weight(>= p_j) and count(>= p_j) at `pivot_count` pivots strictly inside
//!   the bracket (`place_pivots`), and the bracket becomes the gap between the last pivot that
//!   reaches the target and the first that does not (`narrow`);
//! - pivots are evenly spaced in value on even passes (when both ends are finite) and in float
//!   order on odd ones, so that the bracket's float range shrinks by pivot_count + 1 at least every
//!   other pass: at most 2 * ceil(32 / log2(pivot_count + 1)) passes, typically two or three;
//! - once at most `gather_cap` entries lie in the bracket (`done`), they are gathered, ordered by
//!   value descending then id ascending (`rank_of`: the count of better entries, no sort) and the
//!   cut is found among them (`cut_in`): the entries above the bracket are all kept, then the
//!   gathered ones in order until the weight reaches the target. When the bracket's ends are
//!   adjacent floats, every gathered entry has the same value.
//!
//! The kept set is then {x > t} plus the entries equal to t with an id up to `last_id`: exactly
//! `sampler`'s (sampling/policy.hpp: top-k keeps k entries, ties to the lower id; top-p the
//! shortest prefix reaching the target), with the masses summed in another order (a decision can
//! differ from the host's only where a cumulative mass lies within rounding of the target).

#include <cstdint>

#include "specdec/core/host_device.hpp"

#if !defined(__CUDA_ARCH__)
#include <bit>
#endif

namespace specdec::detail::pivot {

//! +inf (a builtin: std::numeric_limits is not usable in device code without relaxed constexpr).
inline constexpr float infinity = __builtin_huge_valf();

//! Pivots measured per pass.
inline constexpr int pivot_count = 7;
//! Most entries gathered for the exact cut.
inline constexpr int gather_cap = 256;
//! A bound on the passes of one search: float-order passes (every other pass) divide the
//! bracket's range of float keys (at most 2^32) by at least pivot_count + 1, so 22 passes reach
//! adjacent ends; loops stop here in any case.
inline constexpr int max_passes = 32;

//! What a search weighs.
enum class mode {
  count,  //!< top-k: every entry weighs 1 (on the logits)
  mass,   //!< top-p: every entry weighs its value (on the unnormalised probabilities)
};

//! An unsigned key with the float order (-inf lowest, +inf highest); -0 and +0 map to one key.
[[nodiscard]] SPECDEC_HOST_DEVICE inline std::uint32_t order_key(float f) noexcept {
  float const g = f == 0.0f ? 0.0f : f;
#if defined(__CUDA_ARCH__)
  std::uint32_t const u = __float_as_uint(g);
#else
  auto const u = std::bit_cast<std::uint32_t>(g);
#endif
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

//! The float of key `k` (the inverse of `order_key`).
[[nodiscard]] SPECDEC_HOST_DEVICE inline float key_value(std::uint32_t k) noexcept {
  std::uint32_t const u = (k & 0x80000000u) != 0 ? (k & 0x7fffffffu) : ~k;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return std::bit_cast<float>(u);
#endif
}

//! The next float above `f` in float order (+inf stays +inf).
[[nodiscard]] SPECDEC_HOST_DEVICE inline float next_up(float f) noexcept {
  std::uint32_t const k = order_key(f);
  return k == order_key(infinity) ? f : key_value(k + 1);
}

//! The bracket of the cut value (see the file comment).
struct bracket {
  float lo = 0.0f;        //!< weight(>= lo) >= target
  float hi = 0.0f;        //!< weight(>= hi) < target; lo < hi
  double w_hi = 0.0;      //!< weight of the entries >= hi
  std::int64_t c_lo = 0;  //!< entries >= lo
  std::int64_t c_hi = 0;  //!< entries >= hi
  int passes = 0;         //!< passes measured so far

  //! Entries inside the bracket.
  [[nodiscard]] SPECDEC_HOST_DEVICE std::int64_t inside() const noexcept { return c_lo - c_hi; }
};

//! Whether the ends of `b` are adjacent floats (every entry inside equals lo).
[[nodiscard]] SPECDEC_HOST_DEVICE inline bool adjacent(bracket const& b) noexcept {
  return order_key(b.hi) - order_key(b.lo) <= 1;
}

//! Whether the search may stop: few enough entries inside to gather, adjacent ends (nothing can
//! be placed between them), or the pass bound.
[[nodiscard]] SPECDEC_HOST_DEVICE inline bool done(bracket const& b) noexcept {
  return b.inside() <= gather_cap || adjacent(b) || b.passes >= max_passes;
}

//! Writes the pivots of the next pass into p[0, n), strictly increasing and strictly inside
//! (lo, hi), and returns n (0 when lo and hi are adjacent floats). The first pass of a mass search
//! uses a ladder of powers of two below hi (the unnormalised probabilities of a row spread over
//! binades, the cut mostly a few binades below the maximum); then even passes space the pivots
//! evenly in value (both ends finite), odd passes in float order.
[[nodiscard]] SPECDEC_HOST_DEVICE inline int place_pivots(bracket const& b, mode m,
                                                          float (&p)[pivot_count]) noexcept {
  int n = 0;
  if (m == mode::mass && b.passes == 0) {
    constexpr int ladder[pivot_count] = {14, 10, 7, 5, 3, 2, 1};  // hi * 2^-ladder[j]
    for (int j = 0; j < pivot_count; ++j) {
      float const v = b.hi * (1.0f / static_cast<float>(1u << ladder[j]));
      if (v > b.lo && v < b.hi && (n == 0 || v > p[n - 1])) p[n++] = v;
    }
    if (n > 0) return n;
  }
  bool const finite = b.lo > -infinity && b.hi < infinity;
  if (b.passes % 2 == 0 && finite) {
    double const lo = b.lo, span = static_cast<double>(b.hi) - lo;
    for (int j = 1; j <= pivot_count; ++j) {
      auto const v = static_cast<float>(lo + span * j / (pivot_count + 1));
      if (v > b.lo && v < b.hi && (n == 0 || v > p[n - 1])) p[n++] = v;
    }
    if (n > 0) return n;
  }
  std::uint32_t const klo = order_key(b.lo), khi = order_key(b.hi);
  std::uint64_t const range = static_cast<std::uint64_t>(khi) - klo;
  for (int j = 1; j <= pivot_count; ++j) {
    auto const k =
        static_cast<std::uint32_t>(klo + range * static_cast<std::uint64_t>(j) / (pivot_count + 1));
    float const v = key_value(k);
    if (k > klo && k < khi && (n == 0 || v > p[n - 1])) p[n++] = v;
  }
  return n;
}

//! Narrows `b` after a pass that measured, at pivots p[0, n), the weights w[j] and counts c[j] of
//! the entries >= p[j].
SPECDEC_HOST_DEVICE inline void narrow(bracket& b, float const* p, double const* w,
                                       std::int64_t const* c, int n, double target) noexcept {
  // Weights decrease with the pivot: the last pivot that still reaches the target is the new lo,
  // the one after it the new hi.
  int reach = -1;
  for (int j = 0; j < n; ++j)
    if (w[j] >= target) reach = j;
  if (reach >= 0) {
    b.lo = p[reach];
    b.c_lo = c[reach];
  }
  if (reach + 1 < n) {
    b.hi = p[reach + 1];
    b.w_hi = w[reach + 1];
    b.c_hi = c[reach + 1];
  }
  ++b.passes;
}

//! Whether gathered entry (va, ia) comes before (vb, ib): value descending, then id ascending.
[[nodiscard]] SPECDEC_HOST_DEVICE inline bool before(float va, std::int32_t ia, float vb,
                                                     std::int32_t ib) noexcept {
  return va > vb || (va == vb && ia < ib);
}

//! The cut found among the gathered entries.
struct cut {
  float t = 0.0f;            //!< the cut value: entries > t are kept
  std::int32_t last_id = 0;  //!< entries equal to t are kept up to this id
  double mass = 0.0;         //!< weight of the kept entries (top-p; the entries' own values)
};

//! Whether entry (x, i) is kept under cut `c`.
[[nodiscard]] SPECDEC_HOST_DEVICE inline bool kept(float x, std::int32_t i, cut const& c) noexcept {
  return x > c.t || (x == c.t && i <= c.last_id);
}

//! The cut among the m entries gathered from a bracket that holds at most gather_cap of them,
//! given in order (`before`): the (target - c_hi)-th for a count search; for a mass search the
//! first where the mass of the entries above the bracket plus theirs, in order, reaches the
//! target (the last one when rounding leaves it unreached).
[[nodiscard]] SPECDEC_HOST_DEVICE inline cut cut_sorted(float const* v, std::int32_t const* id,
                                                        int m, bracket const& b, mode md,
                                                        double target) noexcept {
  if (m <= 0) return cut{b.lo, -1, b.w_hi};
  if (md == mode::count) {
    std::int64_t r = static_cast<std::int64_t>(target) - b.c_hi - 1;
    r = r < 0 ? 0 : (r >= m ? m - 1 : r);
    return cut{v[r], id[r], 0.0};
  }
  double acc = b.w_hi;
  for (int i = 0; i < m; ++i) {
    acc += static_cast<double>(v[i]);
    if (acc >= target) return cut{v[i], id[i], acc};
  }
  return cut{v[m - 1], id[m - 1], acc};
}

//! How many entries equal to lo a bracket with adjacent ends keeps (every entry inside equals
//! lo): the target less the entries above it for a count search; for a mass search the fewest
//! whose mass added to the mass above reaches the target, as the host's top-p rounds it (at least
//! one, at most all).
[[nodiscard]] SPECDEC_HOST_DEVICE inline std::int64_t ties_needed(bracket const& b, mode md,
                                                                  double target) noexcept {
  std::int64_t const inside = b.inside();
  double need = 0.0;
  if (md == mode::count) {
    need = target - static_cast<double>(b.c_hi);
  } else {
    need =
        b.lo > 0.0f ? (target - b.w_hi) / static_cast<double>(b.lo) : static_cast<double>(inside);
    double const whole = static_cast<double>(static_cast<std::int64_t>(need));
    need = whole < need ? whole + 1.0 : whole;  // ceil
  }
  need = need < 1.0 ? 1.0 : need;
  return need > static_cast<double>(inside) ? inside : static_cast<std::int64_t>(need);
}

}  // namespace specdec::detail::pivot
