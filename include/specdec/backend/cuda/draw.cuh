#pragma once
//! \file
//! The final inverse-CDF draw on the device, the counterpart of sampling/draw.hpp: the row a walk
//! draws from (`dist_row`: given probabilities, or the softmax of logits from their row
//! statistics), the draw weights (p, max(p - q, 0), or p without rejected tokens) summed per
//! chunk, and the search for the chunk and the entry where the running sum crosses u * total.
//! Used by the sampling walk (walk.cuh).

#include <cuda_runtime.h>

#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/core/types.hpp"

namespace specdec::cuda::detail {

#if defined(__CUDACC__)

//! Whether a float is finite.
__device__ __forceinline__ bool is_finite(float v) noexcept {
  return v - v == 0.0f;
}

//! The current distribution of a walk: explicit probabilities, or the softmax of a logits row
//! given its maximum and the host's float(1 / total).
struct dist_row {
  float const* z = nullptr;     //!< logits (implicit) or probabilities (explicit)
  float max = 0.0f;             //!< implicit: row maximum
  float inv_t = 1.0f;           //!< implicit: 1 / T
  float inv_total = 1.0f;       //!< implicit: float(1 / sum of exp)
  bool explicit_probs = false;  //!< whether z holds probabilities

  //! The stored entry i (a logit or a probability).
  __device__ __forceinline__ float load(std::int32_t i) const noexcept { return z[i]; }
  //! The probability of a stored entry.
  __device__ __forceinline__ float from(float raw) const noexcept {
    return explicit_probs ? raw : __fmul_rn(exp_shifted1(raw, max, inv_t), inv_total);
  }
  __device__ __forceinline__ float operator()(std::int32_t i) const noexcept {
    return from(load(i));
  }
};

//! Draw modes: from p, from max(p - q, 0) (falling back to p), or from p without some tokens.
enum draw_mode : std::int32_t { draw_plain = 0, draw_residual = 1, draw_excluding = 2 };

//! max(p - q, 0), NaN-propagating, as sampling/draw.hpp's `residual_weight`.
__device__ __forceinline__ float residual_weight(float p, float q) noexcept {
  float const d = __fsub_rn(p, q);
  return d < 0.0f ? 0.0f : d;
}

//! Whether `t` is in the ascending list rej[0..n).
__device__ __forceinline__ bool in_sorted(token_id const* rej, std::int32_t n,
                                          token_id t) noexcept {
  std::int32_t lo = 0, hi = n;
  while (lo < hi) {
    std::int32_t const mid = (lo + hi) / 2;
    if (rej[mid] < t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && rej[lo] == t;
}

//! Sums over [lo, hi) of the draw weights: out[0] = the mode's weights (residual, or p), out[1]
//! = p, out[2] = 1 when a non-finite p (or q in residual mode) was seen. Block-uniform result.
inline __device__ void chunk_weight_sums(dist_row const& cur, float const* q, std::int32_t mode,
                                         std::int32_t lo, std::int32_t hi, double out[3]) {
  __shared__ double dscratch[96];
  double w = 0.0, pp = 0.0;
  bool local_bad = false;
  auto const add = [&](float raw, float qi) {
    float const pi = cur.from(raw);
    local_bad = local_bad || !is_finite(pi);
    pp += static_cast<double>(pi);
    if (mode == draw_residual) {
      local_bad = local_bad || !is_finite(qi);
      w += static_cast<double>(residual_weight(pi, qi));
    }
  };
  std::int32_t const nt = static_cast<std::int32_t>(blockDim.x);
  // Eight entries (and q entries) in flight per thread before any is used.
  constexpr std::int32_t unroll = 8;
  for (std::int32_t i = lo + static_cast<std::int32_t>(threadIdx.x); i < hi; i += unroll * nt) {
    float raw[unroll], qv[unroll];
#pragma unroll
    for (std::int32_t u = 0; u < unroll; ++u) {
      bool const in = i + u * nt < hi;
      raw[u] = in ? cur.load(i + u * nt) : 0.0f;
      qv[u] = in && mode == draw_residual ? q[i + u * nt] : 0.0f;
    }
#pragma unroll
    for (std::int32_t u = 0; u < unroll; ++u)
      if (i + u * nt < hi) add(raw[u], qv[u]);
  }
  double flag = local_bad ? 1.0 : 0.0;  // summed: nonzero when any thread saw a bad entry
  block_sum3(w, pp, flag, dscratch);
  out[0] = mode == draw_residual ? w : pp;
  out[1] = pp;
  out[2] = flag != 0.0 ? 1.0 : 0.0;
}

//! The first index i in [lo, hi) with w(i) > 0 (not in rej) whose running sum, starting at
//! `base`, exceeds `target`; -1 if none. The range is read in tiles of `crossing_per_lane`
//! entries per thread, all loads of a tile in flight together: thread t of the block takes the
//! t-th run of the tile, a warp scan and the warps' sums give each thread the running sum before
//! its run, and the thread holding the crossing scans its run in index order.
//! blockDim.x is a multiple of 32. Block-uniform result.
inline constexpr std::int32_t crossing_per_lane = 8;

template <class W>
inline __device__ std::int32_t find_crossing_in(W const& w, token_id const* rej, std::int32_t nrej,
                                                std::int32_t lo, std::int32_t hi, double base,
                                                double target) {
  constexpr std::int32_t per = crossing_per_lane;
  __shared__ double warp_total[32];
  __shared__ std::int32_t found;
  std::int32_t const lane = static_cast<std::int32_t>(threadIdx.x) & 31;
  std::int32_t const warp = static_cast<std::int32_t>(threadIdx.x) >> 5;
  std::int32_t const warps = static_cast<std::int32_t>(blockDim.x) >> 5;
  std::int32_t const tile = warps * 32 * per;
  __syncthreads();  // `found` may still be read by a previous call
  if (threadIdx.x == 0) found = INT32_MAX;
  double carry = base;
  for (std::int32_t t0 = lo; t0 < hi; t0 += tile) {
    std::int32_t const l0 = t0 + (warp * 32 + lane) * per;  // this thread's run [l0, l0 + per)
    float x[per];
#pragma unroll
    for (std::int32_t j = 0; j < per; ++j) x[j] = l0 + j < hi ? w(l0 + j) : 0.0f;
#pragma unroll
    for (std::int32_t j = 0; j < per; ++j)
      if (!(x[j] > 0.0f) || (nrej != 0 && in_sorted(rej, nrej, l0 + j))) x[j] = 0.0f;
    double mine = 0.0;
#pragma unroll
    for (std::int32_t j = 0; j < per; ++j) mine += static_cast<double>(x[j]);
    double incl = mine;  // inclusive scan over the warp's runs (in index order)
    for (int o = 1; o < 32; o <<= 1) {
      double const y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    double const wsum = __shfl_sync(0xffffffffu, incl, 31);
    __syncthreads();  // warp_total may still be read by the previous tile
    if (lane == 0) warp_total[warp] = wsum;
    __syncthreads();
    double before = carry, tile_total = 0.0;
    for (std::int32_t k = 0; k < warps; ++k) {
      double const v = warp_total[k];
      if (k < warp) before += v;
      tile_total += v;
    }
    double run = before + (incl - mine);
    if (run + mine > target) {  // the crossing may lie in this thread's run
      bool hit = false;         // no early exit: x stays in registers only with constant indices
#pragma unroll
      for (std::int32_t j = 0; j < per; ++j) {
        if (!hit && x[j] > 0.0f) {
          run += static_cast<double>(x[j]);
          if (run > target) {
            atomicMin(&found, l0 + j);
            hit = true;
          }
        }
      }
    }
    __syncthreads();
    if (found != INT32_MAX) break;  // block-uniform
    carry += tile_total;
  }
  __syncthreads();
  std::int32_t const r = found;
  __syncthreads();
  return r == INT32_MAX ? -1 : r;
}

//! The last index in [0, vocab) with w(i) > 0 (not in rej), or -1. Block-uniform result.
template <class W>
inline __device__ std::int32_t last_positive(W const& w, token_id const* rej, std::int32_t nrej,
                                             std::int32_t vocab) {
  __shared__ std::int32_t found;
  if (threadIdx.x == 0) found = -1;
  __syncthreads();
  for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < vocab;
       i += static_cast<std::int32_t>(blockDim.x)) {
    if (w(i) > 0.0f && (nrej == 0 || !in_sorted(rej, nrej, i))) atomicMax(&found, i);
  }
  __syncthreads();
  std::int32_t const r = found;
  __syncthreads();
  return r;
}

//! Given per-chunk sums parts[c * 3 + k] (k = which; shared memory or a buffer the block wrote
//! itself), finds the chunk where the running sum
//! crosses `target` and the index inside it (or -1). Block-uniform.
template <class W>
inline __device__ std::int32_t find_crossing(W const& w, token_id const* rej, std::int32_t nrej,
                                             double const* parts, std::int32_t which,
                                             chunk_plan plan, std::int32_t vocab, double target) {
  __shared__ double dscratch[32];
  __shared__ std::int32_t chunk;
  __shared__ double chunk_base;
  if (threadIdx.x == 0) chunk = INT32_MAX;
  __syncthreads();
  double carry = 0.0;
  std::int32_t const nt = static_cast<std::int32_t>(blockDim.x);
  for (std::int32_t c0 = 0; c0 < plan.count; c0 += nt) {
    std::int32_t const c = c0 + static_cast<std::int32_t>(threadIdx.x);
    double const v = c < plan.count ? parts[static_cast<std::int64_t>(c) * 3 + which] : 0.0;
    double tile_total = 0.0;
    double const incl = block_inclusive_scan(v, dscratch, tile_total);
    if (c < plan.count && carry + incl > target && v > 0.0) {
      // first such chunk within the tile (and overall: earlier tiles did not cross)
      atomicMin(&chunk, c);
    }
    __syncthreads();
    if (chunk != INT32_MAX) {
      if (c == chunk) chunk_base = carry + incl - v;
      __syncthreads();
      break;
    }
    carry += tile_total;
  }
  __syncthreads();
  std::int32_t const cc = chunk;
  double const base = chunk_base;
  __syncthreads();
  if (cc == INT32_MAX) return -1;
  std::int32_t const lo = cc * plan.size;
  std::int32_t const hi = min(vocab, lo + plan.size);
  return find_crossing_in(w, rej, nrej, lo, hi, base, target);
}

#endif  // __CUDACC__

}  // namespace specdec::cuda::detail
