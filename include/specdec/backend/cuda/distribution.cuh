#pragma once
//! \file
//! The policy's distribution on the device (`launch_distribution`), `sampler::distribution` step
//! for step: temperature, top-k (exactly k, ties toward the lower id), top-p (shortest
//! most-probable prefix reaching p * mass, ties toward the lower id), min-p, renormalisation; the
//! floats written equal what `sampler::distribution` writes up to the order of double additions.
//! `launch_distribution` finds the thresholds by the pivot search (pivot_sampling.cuh: a few
//! passes, a row shared by a cluster of blocks); `launch_distribution_radix`, the earlier kernel
//! kept for comparison, by radix selection in one 1024-thread block per row (four passes of
//! 256-bin histograms per threshold).
//!
//! The kernels are templates (`template <int Unused = 0>`): common.cuh says why.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/pivot_sampling.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/row_stats.cuh"

namespace specdec::cuda {

//! Inputs of `launch_distribution`: rows of (processed) logits -> rows of probabilities.
struct distribution_params {
  float const* z = nullptr;  //!< [rows, z_stride] (processed) logits
  std::int64_t z_stride = 0;
  float* probs = nullptr;  //!< [rows, probs_stride] out; may be z itself (in place)
  std::int64_t probs_stride = 0;
  std::int32_t rows = 0;
  std::int32_t vocab = 0;
  device_policy policy;
  std::int32_t* row_flags = nullptr;  //!< [rows] (or null): `device_error` bits per row
};

namespace detail {

#if defined(__CUDACC__)

//! Threads of the distribution kernel.
inline constexpr int dist_threads = 1024;

//! Radix selection over 32-bit keys, highest first, in four 8-bit digits. `key(i)` returns the
//! key of entry i and whether it takes part. Count mode (Mass = false): finds the key of the
//! `want`-th largest entry and returns in `want` how many entries equal to it are needed. Mass
//! mode: `mass(i)` weights; finds the key where the running mass (largest first) reaches
//! `target`, returns the mass strictly above it in `above` and the number of entries equal to it
//! in `equal`.
template <bool Mass, class Key, class MassOf>
__device__ std::uint32_t radix_select(std::int32_t vocab, Key const& key, MassOf const& mass,
                                      std::int64_t& want, double target, double& above,
                                      std::int32_t& equal) {
  __shared__ std::int32_t hist[256];
  __shared__ double hmass[256];
  __shared__ double dscratch[32];
  __shared__ std::int64_t iscratch[32];
  __shared__ std::int32_t s_digit;
  __shared__ double s_above;
  __shared__ std::int64_t s_before;
  __shared__ double stage[dist_threads / 32][32];
  std::int32_t const tid = static_cast<std::int32_t>(threadIdx.x);
  std::uint32_t prefix = 0, mask = 0;
  above = 0.0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    __syncthreads();
    if (tid < 256) {
      hist[tid] = 0;
      if (Mass) hmass[tid] = 0.0;
    }
    if (tid == 0) s_digit = -1;
    __syncthreads();
    // Warp-aggregated histogram: lanes with the same digit combine before one atomic per digit
    // and warp (rows concentrate in few digits, where plain atomics would serialise).
    std::int32_t const lane = tid & 31, warp = tid >> 5;
    for (std::int32_t base = 0; base < vocab; base += dist_threads) {
      std::int32_t const i = base + tid;
      bool take = false;
      std::uint32_t k = 0;
      if (i < vocab) k = key(i, take);
      take = take && (k & mask) == prefix;
      std::int32_t const digit = take ? static_cast<std::int32_t>((k >> shift) & 255u) : 256;
      double ms = (Mass && take) ? static_cast<double>(mass(i)) : 0.0;
      unsigned const peers = __match_any_sync(0xffffffffu, digit);
      std::int32_t const leader = __ffs(static_cast<int>(peers)) - 1;
      if (Mass) {
        if (__all_sync(0xffffffffu, peers == 0xffffffffu)) {
          ms = warp_sum(ms);
        } else {
          stage[warp][lane] = ms;
          __syncwarp();
          if (lane == leader) {
            double sum = 0.0;
            for (unsigned m = peers; m != 0u; m &= m - 1u)
              sum += stage[warp][__ffs(static_cast<int>(m)) - 1];
            ms = sum;
          }
          __syncwarp();
        }
      }
      if (lane == leader && digit < 256) {
        atomicAdd(&hist[digit], __popc(peers));
        if (Mass) atomicAdd(&hmass[digit], ms);
      }
    }
    __syncthreads();
    // Thread t looks at digit 255 - t: inclusive scans give counts / masses of digits >= it.
    std::int32_t const d = 255 - tid;
    std::int64_t const cnt = tid < 256 ? hist[d] : 0;
    double const ms = (Mass && tid < 256) ? hmass[d] : 0.0;
    std::int64_t ctotal = 0;
    std::int64_t const cincl = block_inclusive_scan(cnt, iscratch, ctotal);
    double mtotal = 0.0;
    double const mincl = Mass ? block_inclusive_scan(ms, dscratch, mtotal) : 0.0;
    bool const hit = tid < 256 && cnt > 0 && (Mass ? above + mincl >= target : cincl >= want);
    if (hit) atomicMax(&s_digit, d);  // the highest digit that reaches: first in scan order
    __syncthreads();
    if (s_digit < 0 && tid < 256 && cnt > 0 && cincl == ctotal) {
      // Not reached (rounding in mass mode): take the lowest non-empty digit, i.e. everything.
      s_digit = d;
    }
    __syncthreads();
    if (tid < 256 && d == s_digit) {
      s_above = above + (mincl - ms);
      s_before = cincl - cnt;
    }
    __syncthreads();
    std::uint32_t const digit = static_cast<std::uint32_t>(s_digit);
    if (Mass)
      above = s_above;
    else
      want -= s_before;
    prefix |= digit << shift;
    mask |= 255u << shift;
    if (shift == 0) {
      __syncthreads();
      if (tid < 256 && d == s_digit) s_before = cnt;
      __syncthreads();
      equal = static_cast<std::int32_t>(s_before);
    }
  }
  __syncthreads();
  return prefix;
}

//! For the entries equal to `value` (as `eq(i)` says), in index order: writes keep(i) for the
//! first `ties` of them via `apply(i, keep_tie)`, applied to every entry (others get false).
//! Entries are processed in tiles of dist_threads * 4 with four consecutive entries per thread.
template <class Eq, class Apply>
__device__ void rank_ties(std::int32_t vocab, Eq const& eq, std::int64_t ties, Apply const& apply) {
  __shared__ std::int64_t iscratch[32];
  std::int32_t const tid = static_cast<std::int32_t>(threadIdx.x);
  std::int64_t carry = 0;
  for (std::int32_t base = 0; base < vocab; base += dist_threads * 4) {
    std::int32_t const i0 = base + tid * 4;
    bool e[4];
    std::int64_t mine = 0;
    for (int k = 0; k < 4; ++k) {
      e[k] = i0 + k < vocab && eq(i0 + k);
      mine += e[k] ? 1 : 0;
    }
    std::int64_t tile = 0;
    std::int64_t const incl = block_inclusive_scan(mine, iscratch, tile);
    std::int64_t rank = carry + incl - mine;
    for (int k = 0; k < 4; ++k) {
      if (i0 + k >= vocab) break;
      bool keep_tie = false;
      if (e[k]) {
        keep_tie = rank < ties;
        ++rank;
      }
      apply(i0 + k, keep_tie);
    }
    carry += tile;
  }
  __syncthreads();
}

//! The host's blocked exp-sum over rows already holding exp values (16 float lanes per block of
//! 512, blocks in double). 1024 threads = 64 groups of 16 lanes.
__device__ __forceinline__ double blocked_sum(float const* e, std::int32_t vocab,
                                              double* dscratch) {
  std::int32_t const lane = static_cast<std::int32_t>(threadIdx.x) & 15;
  std::int32_t const group = static_cast<std::int32_t>(threadIdx.x) >> 4;
  std::int32_t const n16 = vocab - vocab % host_row_lanes;
  double total = 0.0;
  for (std::int32_t k = 0;; ++k) {
    std::int32_t const start = (group + 64 * k) * host_row_block;
    bool const active = start < n16;
    if (!__any_sync(0xffffffffu, active)) break;
    float acc = 0.0f;
    if (active) {
      std::int32_t const stop = min(start + host_row_block, n16);
      for (std::int32_t i = start + lane; i < stop; i += host_row_lanes) acc = __fadd_rn(acc, e[i]);
    }
    double block = 0.0;
    for (int j = 0; j < host_row_lanes; ++j)
      block += static_cast<double>(__shfl_sync(0xffffffffu, acc, j, 16));
    if (active && lane == 0) total += block;
  }
  for (std::int32_t i = n16 + static_cast<std::int32_t>(threadIdx.x); i < vocab; i += dist_threads)
    total += static_cast<double>(e[i]);
  return block_sum(total, dscratch);
}

//! One block of 1024 threads per row: `sampler::distribution`, step for step.
template <int Unused = 0>
__global__ void __launch_bounds__(1024) distribution_kernel(distribution_params p) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  __shared__ std::int64_t iscratch[32];
  __shared__ arg_max_pair ascratch[32];
  __shared__ int bad;
  std::int32_t const r = static_cast<std::int32_t>(blockIdx.x);
  std::int32_t const tid = static_cast<std::int32_t>(threadIdx.x);
  std::int32_t const v = p.vocab;
  float const* z = p.z + r * p.z_stride;
  float* out = p.probs + r * p.probs_stride;
  device_policy const& pol = p.policy;

  // 1. Summary: max, finite count, NaN / +inf.
  if (tid == 0) bad = 0;
  __syncthreads();
  float mx = -INFINITY;
  std::int64_t finite = 0;
  arg_max_pair best{-INFINITY, INT32_MAX};
  bool local_bad = false;
  for (std::int32_t i = tid; i < v; i += dist_threads) {
    float const x = z[i];
    local_bad = local_bad || x != x || x == INFINITY;
    if (x > mx) mx = x;
    finite += (x > -INFINITY && x < INFINITY) ? 1 : 0;
    if (x > best.value || (x == best.value && i < best.index)) best = arg_max_pair{x, i};
  }
  if (local_bad) bad = 1;
  mx = block_max(mx, fscratch);
  std::int64_t total_finite = 0;
  (void)block_inclusive_scan(finite, iscratch, total_finite);
  if (bad || total_finite == 0) {
    // NaN rows: a walk that reads this row flags its sequence.
    for (std::int32_t i = tid; i < v; i += dist_threads) out[i] = NAN;
    if (tid == 0 && p.row_flags != nullptr) p.row_flags[r] |= non_finite_logit;
    return;
  }
  if (pol.greedy) {
    best = block_argmax(best, ascratch);
    for (std::int32_t i = tid; i < v; i += dist_threads) out[i] = i == best.index ? 1.0f : 0.0f;
    return;
  }

  // 2. Top-k on z: keep z > kth and the first `ties` entries equal to kth.
  bool const top_k = pol.top_k > 0 && static_cast<std::int64_t>(pol.top_k) < total_finite;
  float kth = -INFINITY;
  std::int64_t ties = 0;
  if (top_k) {
    std::int64_t want = pol.top_k;
    double above = 0.0;
    std::int32_t equal = 0;
    auto const key = [&](std::int32_t i, bool& take) {
      take = true;
      return float_key(z[i]);
    };
    auto const no_mass = [](std::int32_t) { return 0.0f; };
    std::uint32_t const k = radix_select<false>(v, key, no_mass, want, 0.0, above, equal);
    kth = key_float(k);
    ties = want;
  }
  // 3. exp((z - max) * 1/T) of the kept entries into out (0 for the dropped ones).
  float const inv_t = pol.inv_temperature;
  if (top_k) {
    rank_ties(
        v, [&](std::int32_t i) { return z[i] == kth; }, ties,
        [&](std::int32_t i, bool keep_tie) {
          float const x = z[i];
          bool const keep = x > kth || keep_tie;
          out[i] = keep ? exp_shifted1(x, mx, inv_t) : 0.0f;
        });
  } else {
    for (std::int32_t i = tid; i < v; i += dist_threads) out[i] = exp_shifted1(z[i], mx, inv_t);
    __syncthreads();
  }
  double total = blocked_sum(out, v, dscratch);

  // 4. Top-p over the kept entries: the shortest prefix (largest first, ties to the lower id)
  //    whose mass reaches top_p * total.
  if (pol.top_p < 1.0f) {
    double const target = static_cast<double>(pol.top_p) * total;
    std::int64_t unused = 0;
    double above = 0.0;
    std::int32_t equal = 0;
    auto const key = [&](std::int32_t i, bool& take) {
      float const e = out[i];
      take = e > 0.0f;
      return __float_as_uint(e);
    };
    auto const mass = [&](std::int32_t i) { return out[i]; };
    std::uint32_t const k = radix_select<true>(v, key, mass, unused, target, above, equal);
    float const cut = __uint_as_float(k);
    double const need = target - above;
    std::int64_t m =
        need <= 0.0 ? 1 : static_cast<std::int64_t>(ceil(need / static_cast<double>(cut)));
    // The host adds `cut` one at a time; step m down / up where the rounded sums say so.
    if (m > 1 && above + static_cast<double>(m - 1) * cut >= target) --m;
    m = m < 1 ? 1 : (m > equal ? std::int64_t{equal} : m);
    rank_ties(
        v, [&](std::int32_t i) { return out[i] == cut; }, m,
        [&](std::int32_t i, bool keep_tie) {
          float const e = out[i];
          if (!(e > cut || keep_tie)) out[i] = 0.0f;
        });
  }
  // 5. Min-p: drop e < min_p (the maximum has e = 1). After top-p or min-p the host normalises
  //    by the (double) mass of what is kept; after top-k alone, by the blocked sum above.
  if (pol.top_p < 1.0f || pol.min_p > 0.0f) {
    double sum = 0.0;
    for (std::int32_t i = tid; i < v; i += dist_threads) {
      float e = out[i];
      if (pol.min_p > 0.0f && e < pol.min_p) {
        e = 0.0f;
        out[i] = 0.0f;
      }
      sum += static_cast<double>(e);
    }
    total = block_sum(sum, dscratch);
  }
  // 6. Normalise.
  float const inv = static_cast<float>(1.0 / total);
  for (std::int32_t i = tid; i < v; i += dist_threads) out[i] = __fmul_rn(out[i], inv);
}

#endif  // __CUDACC__

}  // namespace detail

#if defined(__CUDACC__)

//! Writes the policy's distribution of each row (see `distribution_params`) by radix selection
//! (see the file comment). row_flags, when given, must be zeroed by the caller.
inline launch_status launch_distribution_radix(distribution_params const& p,
                                               cudaStream_t stream) noexcept {
  if (p.rows == 0) return {};
  if (p.z == nullptr || p.probs == nullptr || p.rows < 0 || p.vocab <= 0 || p.z_stride < p.vocab ||
      p.probs_stride < p.vocab)
    return fail(status::invalid_argument, "launch_distribution: rows, vocab or stride");
  if (p.z != p.probs && p.z < p.probs + p.rows * p.probs_stride &&
      p.probs < p.z + p.rows * p.z_stride)
    return fail(status::invalid_argument, "launch_distribution: z and probs partially overlap");
  if (!p.policy.greedy && !(p.policy.inv_temperature > 0.0f))
    return fail(status::invalid_argument, "launch_distribution: inverse temperature");
  if (p.policy.top_k < 0 || !(p.policy.top_p > 0.0f && p.policy.top_p <= 1.0f) ||
      !(p.policy.min_p >= 0.0f && p.policy.min_p <= 1.0f))
    return fail(status::invalid_argument, "launch_distribution: top_k, top_p or min_p");
  detail::distribution_kernel<<<static_cast<unsigned>(p.rows), detail::dist_threads, 0, stream>>>(
      p);
  return last_launch_status("launch_distribution_radix");
}

//! Writes the policy's distribution of each row (see `distribution_params`) by the pivot search
//! (`launch_pivot_distribution`). row_flags, when given, must be zeroed by the caller.
inline launch_status launch_distribution(distribution_params const& p,
                                         cudaStream_t stream) noexcept {
  if (p.rows == 0) return {};
  if (p.z == nullptr || p.probs == nullptr || p.rows < 0 || p.vocab <= 0 || p.z_stride < p.vocab ||
      p.probs_stride < p.vocab)
    return fail(status::invalid_argument, "launch_distribution: rows, vocab or stride");
  pivot_params q;
  q.z = p.z;
  q.z_stride = p.z_stride;
  q.rows = p.rows;
  q.vocab = p.vocab;
  q.policy = p.policy;
  // Bias and penalties were applied to z before (as for the radix kernel, which ignores them).
  q.policy.num_bias = 0;
  q.policy.repetition_penalty = 1.0f;
  q.policy.frequency_penalty = 0.0f;
  q.policy.presence_penalty = 0.0f;
  q.probs = p.probs;
  q.probs_stride = p.probs_stride;
  q.error_flags = p.row_flags;
  return launch_pivot_distribution(q, stream);
}

#endif  // __CUDACC__

}  // namespace specdec::cuda
