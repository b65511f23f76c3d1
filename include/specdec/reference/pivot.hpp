#pragma once
//! \file
//! The host twin of the CUDA sampling kernel's threshold search (backend/cuda/pivot_sampling.cuh):
//! `sampler::distribution`'s steps 3-7 (temperature, top-k, top-p, min-p, renormalisation) with
//! the top-k and top-p cuts found by the pivot search of detail/pivot.hpp, each pass measured
//! serially where the kernel measures it in parallel, and the same decision functions deciding.
//! Tests compare it with `sampler` on many rows (the same kept sets, the same probabilities up to
//! the order of the mass sums), which checks the kernel's algorithm on the host; nothing else
//! should call it.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/detail/exp.hpp"
#include "specdec/detail/pivot.hpp"
#include "specdec/sampling/params.hpp"

namespace specdec {

//! What the twin did besides writing the row (for tests of the search itself).
struct pivot_trace {
  int top_k_passes = 0;     //!< passes of the top-k search (0: no top-k)
  int top_p_passes = 0;     //!< passes of the top-p search (0: no top-p)
  bool top_k_ties = false;  //!< the top-k bracket ended on adjacent floats (a run of ties)
  bool top_p_ties = false;  //!< likewise for top-p
};

namespace detail::pivot {

//! One search over x[0, n) (see detail/pivot.hpp): the cut of weight `target` below bracket `b`,
//! with the passes counted in `passes`. Entries equal to -inf or 0 never reach a bracket (brackets
//! start above them).
inline cut search(float const* x, std::size_t n, bracket b, mode md, double target, int& passes,
                  bool& ties) {
  while (!done(b)) {
    float p[pivot_count];
    int const np = place_pivots(b, md, p);
    double w[pivot_count] = {};
    std::int64_t c[pivot_count] = {};
    for (std::size_t i = 0; i < n; ++i) {
      for (int j = 0; j < np; ++j) {
        if (x[i] >= p[j]) {
          ++c[j];
          w[j] += md == mode::count ? 1.0 : static_cast<double>(x[i]);
        }
      }
    }
    narrow(b, p, w, c, np, target);
  }
  passes = b.passes;
  ties = b.inside() > gather_cap;
  if (ties) {
    // Adjacent ends: every entry inside equals lo; keep the first ones by id.
    std::int64_t const need = ties_needed(b, md, target);
    std::int64_t seen = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (x[i] == b.lo && ++seen == need)
        return cut{b.lo, static_cast<std::int32_t>(i),
                   b.w_hi + static_cast<double>(need) * static_cast<double>(b.lo)};
    return cut{b.lo, static_cast<std::int32_t>(n), b.w_hi};
  }
  // Gather the bracket and order it by rank (the count of entries before each), as the kernel.
  std::vector<float> v;
  std::vector<std::int32_t> id;
  for (std::size_t i = 0; i < n; ++i) {
    if (x[i] >= b.lo && x[i] < b.hi) {
      v.push_back(x[i]);
      id.push_back(static_cast<std::int32_t>(i));
    }
  }
  std::size_t const m = v.size();
  std::vector<float> sv(m);
  std::vector<std::int32_t> sid(m);
  for (std::size_t a = 0; a < m; ++a) {
    std::size_t rank = 0;
    for (std::size_t o = 0; o < m; ++o) rank += before(v[o], id[o], v[a], id[a]) ? 1u : 0u;
    sv[rank] = v[a];
    sid[rank] = id[a];
  }
  return cut_sorted(sv.data(), sid.data(), static_cast<int>(m), b, md, target);
}

}  // namespace detail::pivot

//! `sampler(params).distribution(z, {}, probs)` for parameters without logit bias or penalties
//! (those run before, on the row), computed with the pivot search (see the file comment): writes
//! the distribution into `probs` (same size as `z`, not overlapping it) and returns what the
//! search did. Throws `errc::invalid_argument` for bias or penalties or mismatched sizes,
//! `errc::numerical` for a NaN or +inf entry or a row without a finite one.
inline pivot_trace reference_pivot_distribution(std::span<float const> z,
                                                sampling_params const& params,
                                                std::span<float> probs) {
  namespace pv = detail::pivot;
  params.validate();
  SPECDEC_CHECK(params.logit_bias.empty() && params.repetition_penalty == 1.0f &&
                    params.frequency_penalty == 0.0f && params.presence_penalty == 0.0f,
                invalid_argument, "reference_pivot_distribution: bias and penalties run before");
  std::size_t const n = z.size();
  SPECDEC_CHECK(n > 0 && probs.size() == n, invalid_argument,
                "reference_pivot_distribution: rows of ", n, " and ", probs.size());
  constexpr float inf = std::numeric_limits<float>::infinity();
  // The statistics pass: maximum (first of ties), smallest finite entry, finite count.
  float zmax = -inf, zmin = inf;
  std::size_t arg = 0;
  std::int64_t finite = 0;
  for (std::size_t i = 0; i < n; ++i) {
    SPECDEC_CHECK(!std::isnan(z[i]) && z[i] != inf, numerical,
                  "reference_pivot_distribution: logit ", i, " is ", z[i]);
    if (z[i] > zmax) {
      zmax = z[i];
      arg = i;
    }
    if (z[i] > -inf) {
      zmin = std::min(zmin, z[i]);
      ++finite;
    }
  }
  SPECDEC_CHECK(finite > 0, numerical, "reference_pivot_distribution: no finite logit");
  pivot_trace trace;
  if (params.temperature == 0.0f) {
    std::fill(probs.begin(), probs.end(), 0.0f);
    probs[arg] = 1.0f;
    return trace;
  }
  double const inv = 1.0 / params.temperature;
  auto const inv_t = static_cast<float>(std::min(inv, double{std::numeric_limits<float>::max()}));

  // Top-k on the logits (a count search); a k at or above the finite entries keeps them all.
  pv::cut top_k{-inf, std::numeric_limits<std::int32_t>::max(), 0.0};
  if (params.top_k > 0 && params.top_k < finite) {
    pv::bracket b;
    b.lo = zmin;
    b.hi = pv::next_up(zmax);
    b.c_lo = finite;
    top_k = pv::search(z.data(), n, b, pv::mode::count, static_cast<double>(params.top_k),
                       trace.top_k_passes, trace.top_k_ties);
  }
  // e = exp((z - max) / T) on the kept entries (the maximum maps to exactly 1), as the host.
  double total = 0.0;
  std::int64_t positive = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float e = 0.0f;
    if (pv::kept(z[i], static_cast<std::int32_t>(i), top_k)) {
      float d = z[i] - zmax;
      if (inv_t != 1.0f) d *= inv_t;
      e = detail::exp_nonpositive(d);
    }
    probs[i] = e;
    total += static_cast<double>(e);
    positive += e > 0.0f ? 1 : 0;
  }
  // Top-p on e (a mass search): brackets start above 0, which carries no mass.
  pv::cut top_p{0.0f, -1, total};
  if (params.top_p < 1.0f) {
    pv::bracket b;
    b.lo = std::numeric_limits<float>::denorm_min();
    b.hi = pv::next_up(1.0f);
    b.c_lo = positive;
    top_p =
        pv::search(probs.data(), n, b, pv::mode::mass, static_cast<double>(params.top_p) * total,
                   trace.top_p_passes, trace.top_p_ties);
  }
  // Min-p, then the mass of what is kept and the renormalisation.
  double mass = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    float const e = probs[i];
    bool const keep = e > 0.0f &&
                      (params.top_p >= 1.0f || pv::kept(e, static_cast<std::int32_t>(i), top_p)) &&
                      !(params.min_p > 0.0f && e < params.min_p);
    probs[i] = keep ? e : 0.0f;
    mass += static_cast<double>(probs[i]);
  }
  auto const scale = static_cast<float>(1.0 / mass);
  for (float& p : probs) p *= scale;
  return trace;
}

}  // namespace specdec
