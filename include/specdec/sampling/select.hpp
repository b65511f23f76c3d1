#pragma once
//! \file
//! Sort-free threshold selection for top-k (by count, on logits) and top-p (by mass, on
//! unnormalised probabilities). Internals of `sampler` (namespace `specdec::detail`), not API.
//! One topic (the two threshold searches share their bracket and passes) needs just over 600
//! lines here.
//!
//! Both find a cut value t and how many entries equal to t to keep (the lowest ids), such that
//! the kept set is {x > t} plus those ties. The search keeps a bracket [lo, hi) that contains t:
//! the weight (count or mass) of the entries >= lo reaches the target and that of the entries
//! >= hi does not. Each pass over the row measures the weight at up to `select_thresholds`
//! thresholds at once (one vectorised pass, no sort) and narrows the bracket to one gap. The
//! first thresholds come from a strided sample of the row (top-k; top-p on rows whose mass the
//! sample accounts for) or from a geometric ladder below the maximum (top-p on peaked rows);
//! later ones from a model of the bracket, or evenly spaced when the model misses. Once the
//! bracket holds at most `select_gather_cap` entries they are gathered and the cut is found by
//! a (weighted) quickselect. Typical rows need one pass; the number of passes is bounded because
//! even spacing divides the bracket's float range by 9 per pass.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "specdec/detail/rows.hpp"

namespace specdec::detail {

//! Thresholds measured per pass.
inline constexpr std::size_t select_thresholds = 8;
//! Most entries gathered (and selected from in linear expected time) once the bracket is narrow
//! enough.
inline constexpr std::size_t select_gather_cap = 4096;
//! Rows up to this size skip the passes: every entry is gathered.
inline constexpr std::size_t select_small_row = 4096;
//! Entries sampled (at a fixed stride) to place the first top-k thresholds.
inline constexpr std::size_t select_sample = 512;
//! Most entries sampled to place the first top-p thresholds on rows whose mass is spread out
//! (one in 64 entries, at least `select_sample`).
inline constexpr std::size_t select_sample_mass = 2048;

//! Maps floats to unsigned integers with the same order (-inf lowest, +inf highest).
[[nodiscard]] inline std::uint32_t float_order(float f) noexcept {
  auto const u = std::bit_cast<std::uint32_t>(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}
//! Inverse of `float_order`.
[[nodiscard]] inline float order_float(std::uint32_t o) noexcept {
  return std::bit_cast<float>((o & 0x80000000u) != 0 ? (o & 0x7FFFFFFFu) : ~o);
}

//! A value with its token id; sorted by value descending, then id ascending.
struct scored {
  float value;
  std::int32_t id;
};
[[nodiscard]] inline bool before(scored const& a, scored const& b) noexcept {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

//! Per-thread buffers of the selection (grown once, never shrunk).
struct select_scratch {
  std::vector<float> values;
  std::vector<std::int32_t> ids;
  std::vector<scored> list;
  std::vector<float> sample;
  std::vector<std::uint32_t> sample_keys;  //!< `sort_sample` scratch, two halves

  void reserve(std::size_t n) {
    if (values.size() < n) {
      values.resize(n);
      ids.resize(n);
      list.resize(n);
    }
    if (sample.size() < select_sample_mass) {
      sample.resize(select_sample_mass);
      sample_keys.resize(2 * select_sample_mass);
    }
  }

  //! Sorts sample[0, n) (n <= select_sample_mass, no NaN) in descending order: an LSD radix
  //! sort of order-preserving 32-bit keys (4 passes of 8 bits). The sample is a strided read of
  //! a row, so its order is random and a comparison sort would mispredict most branches.
  void sort_sample(std::size_t n) noexcept {
    std::uint32_t* a = sample_keys.data();
    std::uint32_t* b = a + select_sample_mass;
    // Keys ascending in value (negative floats: every bit flipped; others: the sign bit set),
    // then complemented so that an ascending sort gives descending values.
    for (std::size_t i = 0; i < n; ++i) {
      auto const bits = std::bit_cast<std::uint32_t>(sample[i]);
      std::uint32_t const up = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
      a[i] = ~up;
    }
    for (unsigned shift = 0; shift < 32; shift += 8) {
      std::uint32_t count[257] = {};
      for (std::size_t i = 0; i < n; ++i) ++count[((a[i] >> shift) & 0xFFu) + 1];
      for (std::size_t d = 1; d < 257; ++d) count[d] += count[d - 1];
      for (std::size_t i = 0; i < n; ++i) b[count[(a[i] >> shift) & 0xFFu]++] = a[i];
      std::swap(a, b);
    }
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t const up = ~a[i];
      std::uint32_t const bits = (up & 0x80000000u) != 0 ? up ^ 0x80000000u : ~up;
      sample[i] = std::bit_cast<float>(bits);
    }
  }

  //! Gathers lo <= x[i] < hi (at most `cap`, the caller knows there are no more) into `list`.
  std::size_t gather(float const* x, std::size_t n, float lo, float hi, std::size_t cap) {
    reserve(cap);
    std::size_t const found = gather_range(x, n, lo, hi, values.data(), ids.data(), cap);
    std::size_t const m = std::min(found, cap);
    for (std::size_t i = 0; i < m; ++i) list[i] = {values[i], ids[i]};
    return m;
  }
};

//! The scratch of the calling thread.
[[nodiscard]] inline select_scratch& thread_select_scratch() {
  thread_local select_scratch s;
  return s;
}

//! A bracket [lo, hi) of the cut value: weight(>= lo) >= target > weight(>= hi).
struct bracket {
  float lo = 0.0f;
  float hi = 0.0f;
  double w_lo = 0.0;  //!< weight (count or mass) of the entries >= lo
  double w_hi = 0.0;  //!< weight of the entries >= hi
  double c_lo = 0.0;  //!< number of entries >= lo
  double c_hi = 0.0;  //!< number of entries >= hi
};

//! Position `frac` in [0, 1] of the way from lo to hi: in value (`linear`, lo and hi finite) or
//! in float order (roughly geometric for positive values).
[[nodiscard]] inline float bracket_point(float lo, float hi, double frac, bool linear) noexcept {
  if (linear && std::isfinite(lo) && std::isfinite(hi)) {
    double const a = lo, b = hi;
    return static_cast<float>(a + (b - a) * frac);
  }
  double const olo = float_order(lo), ohi = float_order(hi);
  return order_float(static_cast<std::uint32_t>(std::floor(olo + (ohi - olo) * frac)));
}

//! Up to K thresholds strictly inside (lo, hi), strictly increasing, at the fractions `fracs`
//! (ascending) of the bracket; duplicates and points outside are dropped. Returns how many.
template <std::size_t K>
[[nodiscard]] inline std::size_t place_thresholds(float lo, float hi, bool linear,
                                                  double const (&fracs)[K], float (&th)[K]) {
  std::size_t m = 0;
  for (double f : fracs) {
    float const x = bracket_point(lo, hi, f, linear);
    if (x > lo && x < hi && (m == 0 || x > th[m - 1])) th[m++] = x;
  }
  return m;
}

//! K thresholds evenly spaced inside (lo, hi), in value (`linear`) or in float order; falls back
//! to float order when value spacing does not give K distinct floats. Returns how many (0 when
//! lo and hi are adjacent floats).
template <std::size_t K>
[[nodiscard]] inline std::size_t split_even(float lo, float hi, bool linear, float (&th)[K]) {
  double fracs[K];
  for (std::size_t j = 0; j < K; ++j) fracs[j] = static_cast<double>(j + 1) / (K + 1);
  if (linear) {
    std::size_t const m = place_thresholds(lo, hi, true, fracs, th);
    if (m == K) return m;
  }
  return place_thresholds(lo, hi, false, fracs, th);
}

//! K thresholds around where the cut is expected if weight and count fall linearly across the
//! bracket: the gaps next to the estimate hold about cap / 4 entries each and grow fourfold
//! outwards, so a rough estimate still leaves a small bracket after one pass.
template <std::size_t K>
[[nodiscard]] inline std::size_t split_model(bracket const& b, double target, std::size_t cap,
                                             bool linear, float (&th)[K]) {
  static_assert(K == 8);
  double const inside = b.c_lo - b.c_hi;
  double const t = std::clamp((b.w_lo - target) / (b.w_lo - b.w_hi), 0.0, 1.0);
  double const d = static_cast<double>(cap) / 4.0 / inside;
  double const steps[K] = {-21.0, -5.0, -1.0, -0.25, 0.25, 1.0, 5.0, 21.0};
  double fracs[K];
  for (std::size_t j = 0; j < K; ++j) fracs[j] = std::clamp(t + d * steps[j], 0.0, 1.0);
  return place_thresholds(b.lo, b.hi, linear, fracs, th);
}

//! Mass mode (values > 0): K thresholds around the cut predicted by a model in which the
//! number of entries per unit of log(value) varies exponentially across the bracket, fitted to
//! the bracket's count and mass (so its mean value). The thresholds sit about 48, 200, 500 and
//! 2000 entries on either side of the prediction; returns how many are usable (strictly
//! inside, increasing).
template <std::size_t K>
[[nodiscard]] inline std::size_t split_model_mass(bracket const& b, double target, float (&th)[K]) {
  static_assert(K == 8);
  if (!(b.lo > 0.0f) || !(b.hi > b.lo) || !std::isfinite(b.hi)) return 0;
  double const lo = b.lo, len = std::log(static_cast<double>(b.hi) / lo);
  double const count = b.c_lo - b.c_hi, mass = b.w_lo - b.w_hi;
  if (!(len > 0.0) || !(count > 0.0) || !(mass > 0.0)) return 0;
  // Mean value relative to lo, as a function of the slope beta of log-density over [0, len].
  auto const integral = [len](double g) {  // integral of exp(g u) over [0, len]
    return std::abs(g * len) < 1e-8 ? len : std::expm1(g * len) / g;
  };
  double const mean = mass / count / lo;
  double blo = -700.0 / len, bhi = 700.0 / len;
  for (int it = 0; it < 100; ++it) {
    double const beta = 0.5 * (blo + bhi);
    // Compare integral(beta + 1) / integral(beta) with mean, scaled to avoid overflow.
    double const ratio = integral(beta + 1.0) / integral(beta);
    (ratio < mean ? blo : bhi) = beta;
  }
  double const beta = 0.5 * (blo + bhi), gamma = beta + 1.0;
  // Cut position u* (log distance above lo): the mass above it is `need`.
  double const f = std::clamp((target - b.w_hi) / mass, 0.0, 1.0);
  double u = 0.0;
  if (std::abs(gamma * len) < 1e-8) {
    u = len * (1.0 - f);
  } else {
    // exp(gamma u) = exp(gamma len) - f (exp(gamma len) - 1), evaluated stably.
    double const top = gamma * len;
    double const inner =
        top > 0.0 ? std::log1p(-f * -std::expm1(-top)) + top : std::log1p(-f * std::expm1(top));
    u = std::clamp(inner / gamma, 0.0, len);
  }
  // Entries per unit of u at the cut, then thresholds at fixed entry offsets from it.
  double const density = std::max(count * std::exp(beta * u) / integral(beta), 1e-300);
  double const offsets[K] = {-2000.0, -500.0, -200.0, -48.0, 48.0, 200.0, 500.0, 2000.0};
  std::size_t m = 0;
  for (double off : offsets) {
    double const uu = u + off / density;
    if (!(uu > 0.0 && uu < len)) continue;
    auto const x = static_cast<float>(lo * std::exp(uu));
    if (x > b.lo && x < b.hi && (m == 0 || x > th[m - 1])) th[m++] = x;
  }
  return m;
}

//! Measures the weight at `m` ascending thresholds (padding the rest) and narrows `b` to the gap
//! that holds the cut.
template <bool Mass, std::size_t K>
inline void measure_and_narrow(float const* x, std::size_t n, float (&th)[K], std::size_t m,
                               double target, bracket& b) {
  for (std::size_t j = m; j < K; ++j) th[j] = th[m - 1];
  double mass[K], count[K];
  threshold_stats<Mass, K>(x, n, th, mass, count);
  for (std::size_t j = 0; j < m; ++j) {
    double const w = Mass ? mass[j] : count[j];
    if (w >= target) {
      if (th[j] > b.lo) {
        b.lo = th[j];
        b.w_lo = w;
        b.c_lo = count[j];
      }
    } else {
      if (th[j] < b.hi) {
        b.hi = th[j];
        b.w_hi = w;
        b.c_hi = count[j];
      }
      break;
    }
  }
}

//! Narrows `b` until it holds at most `cap` entries; returns false if it stopped earlier because
//! lo and hi are adjacent floats (every entry of the bracket then equals lo). Each pass places
//! its thresholds from a linear model of the bracket, or evenly when the previous pass did not
//! halve the bracket, so the loop ends within a few dozen passes at worst.
template <bool Mass>
[[nodiscard]] inline bool narrow(float const* x, std::size_t n, double target, std::size_t cap,
                                 bool linear, bracket& b) {
  constexpr std::size_t K = select_thresholds;
  bool model = true;
  while (b.c_lo - b.c_hi > static_cast<double>(cap)) {
    double const before = b.c_lo - b.c_hi;
    float th[K];
    std::size_t m = 0;
    if (model) m = Mass ? split_model_mass(b, target, th) : split_model(b, target, cap, linear, th);
    if (m < 2) m = split_even(b.lo, b.hi, linear, th);
    if (m == 0) return false;
    measure_and_narrow<Mass, K>(x, n, th, m, target, b);
    model = b.c_lo - b.c_hi <= 0.5 * before;
  }
  return true;
}

//! Reorders list[0..count) so that list[0..pos) are the first `pos` entries in `before` order
//! (value descending, id ascending; not sorted among themselves), where pos is the smallest
//! number whose mass (sum of values, in double) reaches `need`, at least 1; all of them when the
//! list falls short. Returns pos and sets `mass` to the mass of list[0..pos). Weighted
//! quickselect: expected linear time. Ids must be distinct.
[[nodiscard]] inline std::size_t weighted_cut(scored* list, std::size_t count, double need,
                                              double& mass) {
  std::size_t lo = 0, hi = count;  // list[0..lo) kept, with mass `acc`; the cut is in [lo, hi]
  double acc = 0.0;
  while (hi - lo > 24) {
    scored const& a = list[lo];
    scored const& b = list[lo + (hi - lo) / 2];
    scored const& c = list[hi - 1];
    scored const pivot = before(a, b) ? (before(b, c) ? b : (before(a, c) ? c : a))
                                      : (before(a, c) ? a : (before(b, c) ? c : b));
    scored* const mid =
        std::partition(list + lo, list + hi, [&](scored const& x) { return before(x, pivot); });
    auto const m = static_cast<std::size_t>(mid - list);
    double head = 0.0;
    for (std::size_t i = lo; i < m; ++i) head += static_cast<double>(list[i].value);
    if (acc + head >= need) {
      hi = m;  // the cut is among the entries before the pivot
      continue;
    }
    std::iter_swap(mid,
                   std::find_if(mid, list + hi, [&](scored const& x) { return x.id == pivot.id; }));
    acc += head + static_cast<double>(pivot.value);
    lo = m + 1;
    if (acc >= need) {
      mass = acc;
      return lo;
    }
  }
  std::sort(list + lo, list + hi, before);
  for (std::size_t i = lo; i < hi; ++i) {
    acc += static_cast<double>(list[i].value);
    if (acc >= need) {
      mass = acc;
      return i + 1;
    }
  }
  mass = acc;
  return hi;
}

//! Result of a top-k selection.
struct top_k_result {
  //! true: `list[0..k)` holds the kept entries (logit, id), unordered; false: keep {z > t} plus the
  //! first `ties_kept` (by id) of the `ties_total` entries equal to t.
  bool sparse = false;
  float t = 0.0f;
  std::size_t ties_kept = 0;
  std::size_t ties_total = 0;
};

//! Top-k by logit, ties toward the lower id, over z[0..n) (no NaN; -inf allowed); 0 < k < n.
[[nodiscard]] inline top_k_result select_top_k(float const* z, std::size_t n, std::size_t k,
                                               float zmax, select_scratch& s) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  top_k_result r;
  auto const take_top = [&](std::size_t count) {
    auto const first = s.list.begin();
    if (k < count)
      std::nth_element(first, first + static_cast<std::ptrdiff_t>(k - 1),
                       first + static_cast<std::ptrdiff_t>(count), before);
    r.sparse = true;
  };
  if (n <= select_small_row) {
    take_top(s.gather(z, n, -inf, inf, n));
    return r;
  }
  // Place the first thresholds from a strided sample of the finite entries.
  s.reserve(select_gather_cap);
  std::size_t ns = 0;
  for (std::size_t j = 0; j < select_sample; ++j) {
    float const v = z[j * n / select_sample];
    if (v > -inf) s.sample[ns++] = v;
  }
  s.sort_sample(ns);
  constexpr std::size_t K = select_thresholds;
  float th[K];
  std::size_t m = 0;
  if (ns == 0) {
    th[m++] = zmax;
  } else {
    // Expected rank of the k-th largest entry within the sample; thresholds around it.
    double const q = static_cast<double>(k) * static_cast<double>(ns) / static_cast<double>(n);
    long const base = static_cast<long>(q);
    long const offsets[K] = {12, 6, 3, 1, 0, -1, -2, -4};  // ascending values = descending ranks
    for (long off : offsets) {
      long const rank = std::clamp(base + off, 0L, static_cast<long>(ns) - 1);
      float const v = s.sample[static_cast<std::size_t>(rank)];
      if (m == 0 || v > th[m - 1]) th[m++] = v;
    }
  }
  bracket b;
  b.lo = -inf;
  b.w_lo = b.c_lo = static_cast<double>(n);
  b.hi = std::nextafter(zmax, inf);  // no entry is above the maximum
  b.w_hi = b.c_hi = 0.0;
  auto const target = static_cast<double>(k);
  measure_and_narrow<false, K>(z, n, th, m, target, b);
  if (b.lo == -inf) {
    // Every sampled threshold was too high: search downwards, doubling the step below hi.
    float step = std::max(1.0f, zmax - b.hi);
    while (b.lo == -inf) {
      float dth[K];
      std::size_t dm = 0;
      for (std::size_t j = K; j-- > 0;) {
        float const v = b.hi - step * static_cast<float>(std::size_t{1} << j);
        if (dm == 0 || v > dth[dm - 1]) dth[dm++] = v;
      }
      measure_and_narrow<false, K>(z, n, dth, dm, target, b);
      if (b.lo == -inf) {
        if (!(dth[0] > -inf)) break;  // the whole row is needed; cannot happen for k < n
        step *= 512.0f;
      }
    }
  }
  if (b.c_lo <= static_cast<double>(select_gather_cap)) {
    take_top(s.gather(z, n, b.lo, inf, select_gather_cap));
    return r;
  }
  bool const narrowed = narrow<false>(z, n, target, select_gather_cap, true, b);
  if (b.c_lo <= static_cast<double>(select_gather_cap)) {
    take_top(s.gather(z, n, b.lo, inf, select_gather_cap));
    return r;
  }
  auto const above = static_cast<std::size_t>(b.c_hi);  // entries >= hi, all kept
  auto const inside = static_cast<std::size_t>(b.c_lo - b.c_hi);
  if (!narrowed) {
    // lo and hi are adjacent floats: every entry of the bracket equals lo.
    r.t = b.lo;
    r.ties_total = inside;
    r.ties_kept = k - above;
    return r;
  }
  std::size_t const got = s.gather(z, n, b.lo, b.hi, select_gather_cap);
  auto const first = s.list.begin();
  std::size_t const need = k - above;  // in [1, got]
  std::nth_element(first, first + static_cast<std::ptrdiff_t>(need - 1),
                   first + static_cast<std::ptrdiff_t>(got),
                   [](scored const& a, scored const& c) { return a.value > c.value; });
  r.t = s.list[need - 1].value;
  std::size_t greater = 0, equal = 0;
  for (std::size_t i = 0; i < got; ++i) {
    greater += s.list[i].value > r.t ? 1u : 0u;
    equal += s.list[i].value == r.t ? 1u : 0u;
  }
  r.ties_total = equal;
  r.ties_kept = k - above - greater;
  return r;
}

//! Result of a top-p selection.
struct top_p_result {
  //! true: `list[0..kept)` holds every kept entry (value, id), unordered; false: keep {e > t} plus
  //! the first `ties_kept` (by id) of the `ties_total` entries equal to t.
  bool complete = false;
  std::size_t kept = 0;
  float t = 0.0f;
  std::size_t ties_kept = 0;
  std::size_t ties_total = 0;
  double kept_mass = 0.0;  //!< mass of the kept entries
};

//! The end of a top-p selection once the first pass has set bracket `b`: gathers every entry
//! >= lo when few enough (a complete list), else narrows the bracket and gathers it, or resolves
//! ties when its ends are adjacent floats. `walk(count, base)` cuts the gathered list.
template <class Walk>
inline void finish_top_p(float const* e, std::size_t n, double target, bracket& b,
                         select_scratch& s, Walk const& walk, top_p_result& r) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  if (b.c_lo <= static_cast<double>(select_gather_cap)) {
    r.complete = true;
    walk(s.gather(e, n, b.lo, inf, select_gather_cap), 0.0);
    return;
  }
  bool const narrowed = narrow<true>(e, n, target, select_gather_cap, false, b);
  if (b.c_lo <= static_cast<double>(select_gather_cap)) {
    r.complete = true;
    walk(s.gather(e, n, b.lo, inf, select_gather_cap), 0.0);
    return;
  }
  auto const inside = static_cast<std::size_t>(b.c_lo - b.c_hi);
  if (!narrowed) {
    // lo and hi are adjacent floats: every entry of the bracket equals lo.
    r.t = b.lo;
    r.ties_total = inside;
    double const need = r.t > 0.0f ? std::ceil((target - b.w_hi) / static_cast<double>(r.t))
                                   : static_cast<double>(inside);
    r.ties_kept = static_cast<std::size_t>(std::clamp(need, 1.0, static_cast<double>(inside)));
    r.kept_mass = b.w_hi + static_cast<double>(r.ties_kept) * static_cast<double>(r.t);
    return;
  }
  walk(s.gather(e, n, b.lo, b.hi, select_gather_cap), b.w_hi);
}

//! Top-p over unnormalised probabilities e[0..n) (>= 0, max exactly 1, sum `total`), p < 1:
//! the shortest prefix, in order of e descending then id ascending, whose mass reaches
//! p * total.
[[nodiscard]] inline top_p_result select_top_p(float const* e, std::size_t n, double total,
                                               double p, select_scratch& s) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  double const target = p * total;
  top_p_result r;
  // Cuts list[0..count) (entries below the bracket top; those above hold mass `base`) where
  // the mass reaches the target, and records the cut value and its ties.
  auto const walk = [&](std::size_t count, double base) {
    double mass = 0.0;
    std::size_t const kept = weighted_cut(s.list.data(), count, target - base, mass);
    r.kept = kept;
    r.kept_mass = base + mass;
    // The cut value: the last kept entry in order (smallest value, then largest id).
    scored last = s.list[0];
    for (std::size_t j = 1; j < kept; ++j)
      if (before(last, s.list[j])) last = s.list[j];
    r.t = last.value;
    std::size_t kept_ties = 0, all_ties = 0;
    for (std::size_t j = 0; j < count; ++j) {
      bool const tie = s.list[j].value == r.t;
      all_ties += tie ? 1u : 0u;
      kept_ties += tie && j < kept ? 1u : 0u;
    }
    r.ties_kept = kept_ties;
    r.ties_total = all_ties;
  };
  if (n <= select_small_row) {
    r.complete = true;
    walk(s.gather(e, n, std::numeric_limits<float>::denorm_min(), inf, n), 0.0);
    return r;
  }
  // First pass. A strided sample estimates the mass above each sampled value; the mass it does
  // not account for belongs to rare large entries it missed. When the sample accounts for most
  // of the mass (a flat row), thresholds go around the estimated cut, at sampled values; else
  // (a peaked row) they are spaced geometrically from a floor, below which the whole tail holds
  // less than half the excluded mass, up to the maximum 1.
  constexpr std::size_t K = select_thresholds;
  float th[K];
  std::size_t m = 0;
  s.reserve(select_gather_cap);
  double sampled = 0.0;
  std::size_t const ns = std::clamp<std::size_t>(n / 64, select_sample, select_sample_mass);
  for (std::size_t j = 0; j < ns; ++j) {
    s.sample[j] = e[j * n / ns];
    sampled += static_cast<double>(s.sample[j]);
  }
  double const unexplained = total - static_cast<double>(n) / static_cast<double>(ns) * sampled;
  if (unexplained < 0.5 * total) {
    s.sort_sample(ns);
    // Ratio estimate: the mass above a value is total times the sampled share above it.
    double const sample_target = p * sampled;
    double c = 0.0;
    std::size_t cut = 0;
    while (cut + 1 < ns && c + static_cast<double>(s.sample[cut]) < sample_target)
      c += static_cast<double>(s.sample[cut++]);
    // Four thresholds suffice here (half the work of a pass of eight): the estimate is good to
    // a few percent of the entries, and the gaps next to it hold under `select_gather_cap`.
    constexpr std::size_t K4 = select_thresholds / 2;
    long const scale = static_cast<long>(ns) / static_cast<long>(select_sample);
    // Thresholds at sampled ranks cut + off * ns / 512, ascending in value.
    auto const at_ranks = [&](std::initializer_list<long> offs, float(&out)[K4]) {
      std::size_t got = 0;
      for (long off512 : offs) {
        long const rank =
            std::clamp(static_cast<long>(cut) + off512 * scale, 0L, static_cast<long>(ns) - 1);
        float const v = s.sample[static_cast<std::size_t>(rank)];
        if (v > 0.0f && (got == 0 || v > out[got - 1])) out[got++] = v;
      }
      return got;
    };
    float th4[K4];
    std::size_t const m4 = at_ranks({12, 4, -4, -12}, th4);
    if (m4 > 0) {
      bracket b;
      b.lo = 0.0f;  // every entry is >= 0
      b.w_lo = total;
      b.c_lo = static_cast<double>(n);
      b.hi = std::nextafter(1.0f, 2.0f);
      b.w_hi = b.c_hi = 0.0;
      measure_and_narrow<true, K4>(e, n, th4, m4, target, b);
      if (b.c_lo - b.c_hi > static_cast<double>(select_gather_cap)) {
        // The estimate missed: one more sampled pass further out on the side of the cut.
        std::size_t m2 = 0;
        if (b.hi == th4[0])
          m2 = at_ranks({160, 64, 32, 20}, th4);  // the cut is below every threshold
        else if (b.lo == th4[m4 - 1])
          m2 = at_ranks({-20, -32, -64, -160}, th4);  // above every threshold
        for (std::size_t j = 0; j < m2; ++j) {        // keep those strictly inside the bracket
          if (!(th4[j] > b.lo && th4[j] < b.hi)) {
            m2 = 0;
            break;
          }
        }
        if (m2 > 0) measure_and_narrow<true, K4>(e, n, th4, m2, target, b);
      }
      finish_top_p(e, n, target, b, s, walk, r);
      return r;
    }
  }
  if (m == 0) {
    double const floor_value = std::max(0.5 * (1.0 - p) * total / static_cast<double>(n),
                                        static_cast<double>(std::numeric_limits<float>::min()));
    for (std::size_t j = 0; j < K; ++j) {
      double const frac = static_cast<double>(j) / static_cast<double>(K - 1);
      auto const v = static_cast<float>(std::pow(floor_value, 1.0 - frac));
      if (m == 0 || v > th[m - 1]) th[m++] = v;
    }
    th[m - 1] = 1.0f;
  }
  bracket b;
  b.lo = 0.0f;  // every entry is >= 0
  b.w_lo = total;
  b.c_lo = static_cast<double>(n);
  b.hi = std::nextafter(1.0f, 2.0f);
  b.w_hi = b.c_hi = 0.0;
  measure_and_narrow<true, K>(e, n, th, m, target, b);
  finish_top_p(e, n, target, b, s, walk, r);
  return r;
}

}  // namespace specdec::detail
