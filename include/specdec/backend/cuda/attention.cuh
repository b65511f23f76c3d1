#pragma once
//! \file
//! The attention kernel of `cuda_llama` (llama.cuh) and the EAGLE head (eagle.cuh): one block per
//! (token, query head) over the cache entries and the batch's own entries visible through the
//! request's bit-packed mask (causal when there is none). Internal to backend/cuda.
//!
//! The kernels are templates (common.cuh says why); the attention takes the element type of its
//! output, the input of the output projection (dtype.cuh).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/dtype.cuh"

namespace specdec::cuda::detail {

#if defined(__CUDACC__)

//! Attention of batch token i (blockIdx.y), query head h (blockIdx.x) over slots
//! [0, cache_len + n), cache_len = *cache_len_at: the slots below the prefix (<= cache_len) are all
//! visible, slot prefix + j through the mask (bit j of row i; null mask = causal: slots up to
//! cache_len + i). `cuda_llama` passes prefix_arg = -1, meaning prefix = cache_len (the batch's own
//! slots masked); the EAGLE head a shorter prefix (its committed entries), masking the tree entries
//! of earlier calls too. The length is read on the device so that a captured graph replays at any
//! cache size. Dynamic shared memory: at least head_size + cache_len + n + groups * head_size
//! floats, groups = max(1, blockDim / head_size). Writes the heads' outputs as T.
template <class T = float>
__global__ void attention_kernel(float const* __restrict__ qkv, std::int32_t qkv_stride,
                                 float const* __restrict__ keys, float const* __restrict__ values,
                                 std::int32_t const* __restrict__ cache_len_at, std::int32_t n,
                                 std::int32_t prefix_arg,
                                 std::uint64_t const* __restrict__ mask, std::int32_t mask_stride,
                                 T* __restrict__ out, std::int32_t dim, std::int32_t kv_dim,
                                 std::int32_t head_size, std::int32_t heads_per_kv) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  std::int32_t const h = static_cast<std::int32_t>(blockIdx.x);
  std::int32_t const i = static_cast<std::int32_t>(blockIdx.y);
  std::int32_t const cache_len = *cache_len_at;
  std::int32_t const prefix = prefix_arg < 0 ? cache_len : prefix_arg;
  std::int32_t const kvh = h / heads_per_kv;
  std::int32_t const total = cache_len + n;
  std::int32_t const tid = static_cast<std::int32_t>(threadIdx.x);
  std::int32_t const nthreads = static_cast<std::int32_t>(blockDim.x);
  float* q = smem;
  float* scores = smem + head_size;
  std::int32_t const groups = nthreads >= head_size ? nthreads / head_size : 1;
  float* partial = scores + total;

  float const* qrow = qkv + static_cast<std::int64_t>(i) * qkv_stride + h * head_size;
  for (std::int32_t d = tid; d < head_size; d += nthreads) q[d] = qrow[d];
  __syncthreads();

  float const scale = 1.0f / sqrtf(static_cast<float>(head_size));
  float local_max = -INFINITY;
  for (std::int32_t t = tid; t < total; t += nthreads) {
    bool visible = true;
    if (t >= prefix) {
      std::int32_t const j = t - prefix;
      visible = mask == nullptr
                    ? t <= cache_len + i
                    : ((mask[static_cast<std::int64_t>(i) * mask_stride + (j >> 6)] >> (j & 63)) &
                       1u) != 0;
    }
    float s = -INFINITY;
    if (visible) {
      float const* k = keys + static_cast<std::int64_t>(t) * kv_dim + kvh * head_size;
      float dot = 0.0f;
      for (std::int32_t d = 0; d < head_size; ++d) dot += q[d] * k[d];
      s = dot * scale;
    }
    scores[t] = s;
    local_max = fmaxf(local_max, s);
  }
  float const m = block_max(local_max, scratch);
  float local_sum = 0.0f;
  for (std::int32_t t = tid; t < total; t += nthreads) {
    float const e = scores[t] == -INFINITY ? 0.0f : expf(scores[t] - m);
    scores[t] = e;
    local_sum += e;
  }
  float const sum = block_sum(local_sum, scratch);  // ends with a barrier: scores are visible
  float const inv = sum > 0.0f ? 1.0f / sum : 0.0f;

  T* o = out + static_cast<std::int64_t>(i) * dim + h * head_size;
  if (nthreads >= head_size) {
    std::int32_t const g = tid / head_size, d = tid % head_size;
    if (g < groups) {
      float acc = 0.0f;
      for (std::int32_t t = g; t < total; t += groups)
        acc += scores[t] * values[static_cast<std::int64_t>(t) * kv_dim + kvh * head_size + d];
      partial[g * head_size + d] = acc;
    }
    __syncthreads();
    if (tid < head_size) {
      float acc = 0.0f;
      for (std::int32_t gg = 0; gg < groups; ++gg) acc += partial[gg * head_size + tid];
      o[tid] = from_float<T>(acc * inv);
    }
  } else {
    for (std::int32_t d = tid; d < head_size; d += nthreads) {
      float acc = 0.0f;
      for (std::int32_t t = 0; t < total; ++t)
        acc += scores[t] * values[static_cast<std::int64_t>(t) * kv_dim + kvh * head_size + d];
      o[d] = from_float<T>(acc * inv);
    }
  }
}

#endif  // __CUDACC__

}  // namespace specdec::cuda::detail
