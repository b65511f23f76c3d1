#pragma once
//! \file
//! Sampling on the device with the semantics of sampling/policy.hpp's `sampler`, step for step:
//! logit bias, penalties (repetition, frequency, presence) over each row's history, temperature,
//! top-k (exactly k, ties toward the lower id), top-p (shortest most-probable prefix reaching
//! p * mass, ties toward the lower id), min-p, renormalisation; then the inverse-CDF draw with the
//! row's Philox word offset + 0 (advancing by one).
//!
//! Kernels:
//! - `launch_process_logits`: bias and penalties into a work copy of each row (one block per row;
//!   a history token is counted with atomics in a zeroed [slots, vocab] array that the kernel
//!   leaves zeroed again).
//! - `launch_distribution`: the distribution of each row (one 1024-thread block per row: radix
//!   selection for the top-k and top-p thresholds, replicated host sums), written as floats equal
//!   to what `sampler::distribution` writes up to the order of double additions.
//! - `launch_softmax`: the plain softmax (`specdec::softmax`) of rows, the vocabulary of a row
//!   split over several blocks.
//! - `launch_sample`: the whole pipeline; plain temperature sampling skips the distribution row
//!   and draws straight from the logits (row statistics over several blocks per row, then the
//!   walk of walk.cuh over root-only trees).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/greedy_walk.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/backend/cuda/walk.cuh"
#include "specdec/core/types.hpp"
#include "specdec/sampling/params.hpp"

namespace specdec::cuda {

//! A sampling policy as the kernels read it (plain values and device pointers).
struct device_policy {
  bool greedy = false;           //!< temperature 0: one-hot at the argmax of the processed logits
  float inv_temperature = 1.0f;  //!< the host's float(min(1 / T, FLT_MAX)); unused when greedy
  std::int32_t top_k = 0;        //!< 0 = off
  float top_p = 1.0f;            //!< 1 = off
  float min_p = 0.0f;            //!< 0 = off
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  token_id const* bias_tokens = nullptr;  //!< [num_bias] on the device
  float const* bias_values = nullptr;     //!< [num_bias] on the device
  std::int32_t num_bias = 0;              //!< logit-bias entries, applied in order

  //! Whether any penalty is active.
  [[nodiscard]] __host__ __device__ constexpr bool penalties() const noexcept {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
  //! Whether rows need bias or penalty processing before anything else.
  [[nodiscard]] __host__ __device__ constexpr bool processing() const noexcept {
    return num_bias > 0 || penalties();
  }
  //! Whether the distribution truncates (top-k, top-p or min-p).
  [[nodiscard]] __host__ __device__ constexpr bool truncation() const noexcept {
    return top_k > 0 || top_p < 1.0f || min_p > 0.0f;
  }
};

#if defined(__CUDACC__)

//! A `sampling_params` on the device: validates it (as `sampler` does) and owns the device copy of
//! its logit-bias list.
class device_sampler {
 public:
  //! Throws `specdec::error` as `sampler`'s constructor does for bad parameters.
  explicit device_sampler(sampling_params const& params) : params_(params) {
    params_.validate();
    policy_.greedy = params_.temperature == 0.0f;
    double const inv = params_.temperature > 0.0f ? 1.0 / params_.temperature : 0.0;
    policy_.inv_temperature =
        static_cast<float>(std::min(inv, double{std::numeric_limits<float>::max()}));
    policy_.top_k = params_.top_k;
    policy_.top_p = params_.top_p;
    policy_.min_p = params_.min_p;
    policy_.repetition_penalty = params_.repetition_penalty;
    policy_.frequency_penalty = params_.frequency_penalty;
    policy_.presence_penalty = params_.presence_penalty;
    if (!params_.logit_bias.empty()) {
      std::vector<token_id> tokens;
      std::vector<float> values;
      for (auto const& [t, v] : params_.logit_bias) {
        tokens.push_back(t);
        values.push_back(v);
      }
      bias_tokens_.resize(tokens.size());
      bias_values_.resize(values.size());
      bias_tokens_.upload(std::span<token_id const>(tokens));
      bias_values_.upload(std::span<float const>(values));
      SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
      policy_.bias_tokens = bias_tokens_.data();
      policy_.bias_values = bias_values_.data();
      policy_.num_bias = static_cast<std::int32_t>(tokens.size());
    }
  }

  //! The policy as the kernels read it (valid while this object lives).
  [[nodiscard]] device_policy const& policy() const noexcept { return policy_; }
  //! The host parameters.
  [[nodiscard]] sampling_params const& params() const noexcept { return params_; }

 private:
  sampling_params params_;
  device_policy policy_;
  device_buffer<token_id> bias_tokens_;
  device_buffer<float> bias_values_;
};

#endif  // __CUDACC__

//! Inputs of `launch_process_logits`. Row r belongs to the sequence b with layout.begin(b) <= r <
//! layout.end(b) and is node r - begin(b) of its tree; its history is sequence b's history
//! followed by the tokens of the path to its node (root excluded, node included) when `tokens` is
//! given (verification), or just the sequence's history (sampling: one row per sequence).
struct process_params {
  float const* logits = nullptr;  //!< [rows, stride]
  std::int64_t stride = 0;
  float* out = nullptr;  //!< [rows, out_stride] processed logits (may not alias logits)
  std::int64_t out_stride = 0;
  ragged_layout layout;  //!< rows of each sequence
  std::int32_t vocab = 0;
  device_policy policy;
  token_id const* history = nullptr;         //!< [cu_history[batch]] committed tokens
  std::int32_t const* cu_history = nullptr;  //!< [batch + 1], or null for no history
  token_id const* tokens = nullptr;          //!< [rows] node tokens for the path, or null
  std::int32_t const* parents = nullptr;     //!< [rows] local parents (null = chains)
  std::int32_t* counts = nullptr;            //!< [count_slots, vocab] zeroed scratch
  std::int32_t count_slots = 0;              //!< rows of `counts` (= blocks launched)
  std::int32_t* error_flags = nullptr;       //!< [batch] (or null)
};

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

//! Index of the sequence owning row r (binary search over cu_rows, or division when padded).
__device__ __forceinline__ std::int32_t sequence_of(ragged_layout const& l,
                                                    std::int32_t r) noexcept {
  if (l.cu_rows == nullptr) return l.rows_per_seq > 0 ? r / l.rows_per_seq : 0;
  std::int32_t lo = 0, hi = l.batch - 1;
  while (lo < hi) {
    std::int32_t const mid = (lo + hi + 1) / 2;
    if (l.cu_rows[mid] <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

//! One block per row (grid-stride over rows; block g uses counts row g).
template <int Unused = 0>
__global__ void __launch_bounds__(256) process_kernel(process_params p) {
  std::int32_t* const counts = p.counts + static_cast<std::int64_t>(blockIdx.x) * p.vocab;
  std::int32_t const nt = static_cast<std::int32_t>(blockDim.x);
  std::int32_t const tid = static_cast<std::int32_t>(threadIdx.x);
  for (std::int32_t r = static_cast<std::int32_t>(blockIdx.x); r < p.layout.total_rows;
       r += static_cast<std::int32_t>(gridDim.x)) {
    std::int32_t const b = sequence_of(p.layout, r);
    std::int32_t const first = p.layout.begin(b);
    std::int32_t const node = r - first;
    float const* in = p.logits + r * p.stride;
    float* out = p.out + r * p.out_stride;
    for (std::int32_t i = tid; i < p.vocab; i += nt) out[i] = in[i];
    __syncthreads();
    if (tid == 0) {
      for (std::int32_t k = 0; k < p.policy.num_bias; ++k) {
        token_id const t = p.policy.bias_tokens[k];
        if (t < 0 || t >= p.vocab) {
          if (p.error_flags != nullptr) atomicOr(p.error_flags + b, token_out_of_range);
          continue;
        }
        out[t] = __fadd_rn(out[t], p.policy.bias_values[k]);
      }
    }
    __syncthreads();
    if (p.policy.penalties() && (p.cu_history != nullptr || p.tokens != nullptr)) {
      std::int32_t const h0 = p.cu_history != nullptr ? p.cu_history[b] : 0;
      std::int32_t const h1 = p.cu_history != nullptr ? p.cu_history[b + 1] : 0;
      // Path tokens: node, parent, ... (root excluded). Validated: parents precede their child.
      std::int32_t depth = 0;
      if (p.tokens != nullptr) {
        for (std::int32_t j = node; j > 0 && depth <= node;) {
          ++depth;
          std::int32_t const par = p.parents != nullptr ? p.parents[first + j] : j - 1;
          if (par < 0 || par >= j) {
            depth = -1;
            break;
          }
          j = par;
        }
      }
      if (depth < 0) {
        if (tid == 0 && p.error_flags != nullptr) atomicOr(p.error_flags + b, bad_tree);
        depth = 0;
      }
      auto const path_token = [&](std::int32_t k) {  // k-th ancestor-or-self of node
        std::int32_t j = node;
        for (std::int32_t s = 0; s < k; ++s)
          j = p.parents != nullptr ? p.parents[first + j] : j - 1;
        return p.tokens[first + j];
      };
      std::int32_t const total = (h1 - h0) + depth;
      // Phase A: count. Phase B: the first to take a token's count applies its penalties.
      for (std::int32_t k = tid; k < total; k += nt) {
        token_id const t = k < h1 - h0 ? p.history[h0 + k] : path_token(k - (h1 - h0));
        if (t < 0 || t >= p.vocab) {
          if (p.error_flags != nullptr) atomicOr(p.error_flags + b, token_out_of_range);
          continue;
        }
        atomicAdd(counts + t, 1);
      }
      __syncthreads();
      float const rp = p.policy.repetition_penalty, fp = p.policy.frequency_penalty,
                  pp = p.policy.presence_penalty;
      for (std::int32_t k = tid; k < total; k += nt) {
        token_id const t = k < h1 - h0 ? p.history[h0 + k] : path_token(k - (h1 - h0));
        if (t < 0 || t >= p.vocab) continue;
        std::int32_t const c = atomicExch(counts + t, 0);
        if (c == 0) continue;
        float l = out[t];
        if (rp != 1.0f) l = l > 0.0f ? __fdiv_rn(l, rp) : __fmul_rn(l, rp);
        l = __fsub_rn(l, __fmul_rn(fp, static_cast<float>(c)));
        l = __fsub_rn(l, pp);
        out[t] = l;
      }
      __syncthreads();
    }
  }
}

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

//! Softmax rows: out = exp(z - max) * float(1 / total), from the row statistics.
template <int Unused = 0>
__global__ void __launch_bounds__(256)
    softmax_scale_kernel(row_stats_params p, float* probs, std::int64_t probs_stride,
                         std::int32_t* row_flags) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  std::int64_t const id = blockIdx.x;
  std::int32_t const row = static_cast<std::int32_t>(id / p.plan.count);
  std::int32_t const c = static_cast<std::int32_t>(id % p.plan.count);
  std::int64_t const base = static_cast<std::int64_t>(row) * p.plan.count;
  float const m = row_max_from_chunks(p.scratch.chunk_max + base, p.plan.count, fscratch);
  double s = 0.0;
  for (std::int32_t k = static_cast<std::int32_t>(threadIdx.x); k < p.plan.count; k += 256)
    s += p.scratch.chunk_sum[base + k];
  s = block_sum(s, dscratch);
  float const* z = p.rows + row * p.stride;
  float* out = probs + row * probs_stride;
  std::int32_t const lo = c * p.plan.size, hi = min(p.vocab, lo + p.plan.size);
  if (m == INFINITY || m == -INFINITY || !(s > 0.0)) {
    if (threadIdx.x == 0 && c == 0 && row_flags != nullptr) row_flags[row] |= non_finite_logit;
    return;
  }
  float const inv = static_cast<float>(1.0 / s);
  for (std::int32_t i = lo + static_cast<std::int32_t>(threadIdx.x); i < hi; i += 256)
    out[i] = __fmul_rn(exp_shifted1(z[i], m, p.inv_temperature), inv);
}

#endif  // __CUDACC__

}  // namespace detail

#if defined(__CUDACC__)

//! Applies logit bias and penalties to each row (see `process_params`). error_flags, when
//! given, must be zeroed by the caller.
inline launch_status launch_process_logits(process_params const& p, cudaStream_t stream) noexcept {
  if (!p.layout.valid()) return fail(status::invalid_argument, "launch_process_logits: layout");
  if (p.layout.total_rows == 0) return {};
  if (p.logits == nullptr || p.out == nullptr || p.vocab <= 0 || p.stride < p.vocab ||
      p.out_stride < p.vocab)
    return fail(status::invalid_argument, "launch_process_logits: rows, vocab or stride");
  if (p.policy.num_bias > 0 && (p.policy.bias_tokens == nullptr || p.policy.bias_values == nullptr))
    return fail(status::invalid_argument, "launch_process_logits: null logit-bias arrays");
  if (p.policy.penalties() && (p.cu_history != nullptr || p.tokens != nullptr) &&
      (p.counts == nullptr || p.count_slots <= 0))
    return fail(status::invalid_argument, "launch_process_logits: penalties need counts");
  if (p.cu_history != nullptr && p.history == nullptr)
    return fail(status::invalid_argument, "launch_process_logits: null history");
  auto const blocks = static_cast<unsigned>(std::max<std::int32_t>(
      1, std::min<std::int32_t>(p.layout.total_rows, p.count_slots > 0 ? p.count_slots : 65535)));
  detail::process_kernel<<<blocks, 256, 0, stream>>>(p);
  return last_launch_status("launch_process_logits");
}

//! Writes the policy's distribution of each row (see `distribution_params`). row_flags, when
//! given, must be zeroed by the caller.
inline launch_status launch_distribution(distribution_params const& p,
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
  return last_launch_status("launch_distribution");
}

//! Softmax of `stats.num_rows` rows into `probs` ([rows, probs_stride]) as `specdec::softmax`
//! computes it (with 1/T = stats.inv_temperature; 1 for the plain softmax), the vocabulary split
//! as `stats.plan` says. row_flags (or null), zeroed by the caller, gets `non_finite_logit` for
//! rows with NaN / +inf or no finite entry.
inline launch_status launch_softmax(row_stats_params const& stats, float* probs,
                                    std::int64_t probs_stride, std::int32_t* row_flags,
                                    cudaStream_t stream) noexcept {
  if (stats.num_rows == 0) return {};
  if (probs == nullptr || probs_stride < stats.vocab)
    return fail(status::invalid_argument, "launch_softmax: probs");
  if (probs != stats.rows && probs < stats.rows + stats.num_rows * stats.stride &&
      stats.rows < probs + stats.num_rows * probs_stride)
    return fail(status::invalid_argument, "launch_softmax: rows and probs overlap");
  launch_status const st = launch_row_stats(stats, stream);
  if (!st.ok()) return st;
  auto const blocks =
      static_cast<unsigned>(static_cast<std::int64_t>(stats.num_rows) * stats.plan.count);
  detail::softmax_scale_kernel<<<blocks, 256, 0, stream>>>(stats, probs, probs_stride, row_flags);
  return last_launch_status("launch_softmax");
}

//! Device scratch for `launch_sample` and the verification launchers: the draw workspace, a work
//! row per row (processed logits / distributions), root-only trees for sampling, and the
//! penalty counts (allocated on first use).
class sampling_workspace {
 public:
  //! Scratch for up to `max_rows` rows (and sequences) of `vocab` entries.
  sampling_workspace(std::int32_t vocab, std::int32_t max_rows)
      : draw_(vocab, max_rows, max_rows), vocab_(vocab), max_rows_(max_rows) {
    auto const rows = static_cast<std::size_t>(max_rows);
    work_.resize(rows * static_cast<std::size_t>(vocab));
    zeros_.resize(rows);
    zeros_.zero();
    accepted_.resize(rows);
    num_accepted_.resize(rows);
    flags_.resize(rows);
    SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
  }

  //! The draw scratch.
  [[nodiscard]] draw_scratch const& draw() const noexcept { return draw_.scratch(); }
  //! [max_rows, vocab] work rows.
  [[nodiscard]] float* work() noexcept { return work_.data(); }
  //! [max_rows] zero tokens (root-only trees).
  [[nodiscard]] token_id const* zeros() const noexcept { return zeros_.data(); }
  //! [max_rows] scratch outputs.
  [[nodiscard]] std::int32_t* accepted() noexcept { return accepted_.data(); }
  [[nodiscard]] std::int32_t* num_accepted() noexcept { return num_accepted_.data(); }
  //! [max_rows] per-row flags scratch.
  [[nodiscard]] std::int32_t* row_flags() noexcept { return flags_.data(); }
  //! Zeroed [slots, vocab] counts for the penalties (allocated on first use).
  [[nodiscard]] std::int32_t* counts(std::int32_t& slots) {
    if (counts_.empty()) {
      counts_slots_ = std::min<std::int32_t>(max_rows_, 2 * draw_.scratch().multiprocessors);
      counts_.resize(static_cast<std::size_t>(counts_slots_) * static_cast<std::size_t>(vocab_));
      counts_.zero();
      SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
    }
    slots = counts_slots_;
    return counts_.data();
  }
  [[nodiscard]] std::int32_t vocab() const noexcept { return vocab_; }
  [[nodiscard]] std::int32_t max_rows() const noexcept { return max_rows_; }

 private:
  draw_workspace draw_;
  std::int32_t vocab_;
  std::int32_t max_rows_;
  device_buffer<float> work_;
  device_buffer<token_id> zeros_;
  device_buffer<std::int32_t> accepted_;
  device_buffer<std::int32_t> num_accepted_;
  device_buffer<std::int32_t> flags_;
  device_buffer<std::int32_t> counts_;
  std::int32_t counts_slots_ = 0;
};

//! Inputs of `launch_sample`: one token per row.
struct sample_params {
  float const* logits = nullptr;  //!< [rows, stride] on the device
  std::int64_t stride = 0;
  std::int32_t rows = 0;
  std::int32_t vocab = 0;
  token_id const* history = nullptr;         //!< [cu_history[rows]] per-row histories, or null
  std::int32_t const* cu_history = nullptr;  //!< [rows + 1], or null
  rng_state* rng = nullptr;                  //!< [rows] one word read (offset + 0), advanced by 1
  token_id* tokens = nullptr;                //!< [rows] out
  std::int32_t* error_flags = nullptr;       //!< [rows] (or null), zeroed by the caller
};

//! Samples one token per row with `policy` (as `sampler::distribution` then `sampler::sample`).
inline launch_status launch_sample(sample_params const& p, device_policy const& policy,
                                   sampling_workspace& ws, cudaStream_t stream) {
  if (p.rows == 0) return {};
  if (p.logits == nullptr || p.rows < 0 || p.vocab <= 0 || p.stride < p.vocab || p.rng == nullptr ||
      p.tokens == nullptr)
    return fail(status::invalid_argument, "launch_sample: parameters");
  if (p.rows > ws.max_rows() || p.vocab != ws.vocab())
    return fail(status::out_of_range, "launch_sample: workspace too small");
  ragged_layout const layout = ragged_layout::padded(p.rows, 1);
  float const* z = p.logits;
  std::int64_t z_stride = p.stride;
  launch_status st;
  if (policy.processing()) {
    process_params pp;
    pp.logits = p.logits;
    pp.stride = p.stride;
    pp.out = ws.work();
    pp.out_stride = p.vocab;
    pp.layout = layout;
    pp.vocab = p.vocab;
    pp.policy = policy;
    pp.history = p.history;
    pp.cu_history = p.cu_history;
    if (policy.penalties() && p.cu_history != nullptr) pp.counts = ws.counts(pp.count_slots);
    pp.error_flags = p.error_flags;
    st = launch_process_logits(pp, stream);
    if (!st.ok()) return st;
    z = ws.work();
    z_stride = p.vocab;
  }
  walk_params w;
  w.layout = layout;
  w.vocab = p.vocab;
  w.tokens = ws.zeros();
  w.rng = p.rng;
  w.num_accepted = ws.num_accepted();
  w.accepted_nodes = ws.accepted();
  w.out_tokens = p.tokens;
  w.error_flags = p.error_flags;
  w.scratch = ws.draw();
  if (policy.greedy) {
    w.plan = plan_chunks(p.vocab, p.rows, w.scratch.multiprocessors);
    w.target = z;
    w.target_stride = z_stride;
    return launch_greedy_walk(w, stream);
  }
  if (policy.truncation()) {
    distribution_params dp;
    dp.z = z;
    dp.z_stride = z_stride;
    dp.probs = ws.work();
    dp.probs_stride = p.vocab;
    dp.rows = p.rows;
    dp.vocab = p.vocab;
    dp.policy = policy;
    dp.row_flags = p.error_flags;
    st = launch_distribution(dp, stream);
    if (!st.ok()) return st;
    w.plan = plan_chunks(p.vocab, p.rows, w.scratch.multiprocessors);
    w.target = ws.work();
    w.target_stride = p.vocab;
    w.target_is_probs = true;
    return launch_walk_draw(w, stream);
  }
  row_stats_params rs;
  rs.rows = z;
  rs.stride = z_stride;
  rs.num_rows = p.rows;
  rs.vocab = p.vocab;
  rs.inv_temperature = policy.inv_temperature;
  rs.plan = plan_chunks(p.vocab, p.rows, ws.draw().multiprocessors);
  rs.scratch = ws.draw();
  st = launch_row_stats(rs, stream);
  if (!st.ok()) return st;
  w.plan = rs.plan;
  w.target = z;
  w.target_stride = z_stride;
  w.inv_temperature = policy.inv_temperature;
  return launch_walk_draw(w, stream);
}

#endif  // __CUDACC__

}  // namespace specdec::cuda
