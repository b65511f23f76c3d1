#pragma once
//! \file
//! Logit processing on the device, the first steps of sampling/policy.hpp's `sampler`: logit bias
//! and penalties (repetition, frequency, presence) over each row's history, into a work copy of
//! each row (`launch_process_logits`: one block per row; a history token is counted with atomics
//! in a zeroed [slots, vocab] array that the kernel leaves zeroed again).
//!
//! The kernels are templates (`template <int Unused = 0>`): common.cuh says why.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/core/types.hpp"

namespace specdec::cuda {

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
      // Entry k of the row's history in commit order: the sequence's history, then the path from
      // the root's child down to the node. The penalties count entries [start, total).
      std::int32_t const total = (h1 - h0) + depth;
      std::int32_t const window = p.policy.penalty_last_n;
      std::int32_t const start = window > 0 && total > window ? total - window : 0;
      auto const entry = [&](std::int32_t k) {
        return k < h1 - h0 ? p.history[h0 + k] : path_token(total - 1 - k);
      };
      // Phase A: count. Phase B: the first to take a token's count applies its penalties.
      for (std::int32_t k = start + tid; k < total; k += nt) {
        token_id const t = entry(k);
        if (t < 0 || t >= p.vocab) {
          if (p.error_flags != nullptr) atomicOr(p.error_flags + b, token_out_of_range);
          continue;
        }
        atomicAdd(counts + t, 1);
      }
      __syncthreads();
      float const rp = p.policy.repetition_penalty, fp = p.policy.frequency_penalty,
                  pp = p.policy.presence_penalty;
      for (std::int32_t k = start + tid; k < total; k += nt) {
        token_id const t = entry(k);
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

#endif  // __CUDACC__

}  // namespace specdec::cuda
