#pragma once
//! \file
//! The per-token kernels of `cuda_llama` (llama.cuh): embedding lookup, RMSNorm, RoPE, the append
//! of each token's K and V to the cache, SwiGLU. Internal to backend/cuda.
//!
//! The kernels are templates (common.cuh says why); those that read weights or write the input
//! of a matrix product take its element type (float, __half or __nv_bfloat16; dtype.cuh).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/dtype.cuh"

namespace specdec::cuda::detail {

#if defined(__CUDACC__)

//! x[i, :] = embedding[tokens[i], :] as float32; embedding rows are `ld` elements apart.
template <class W = float>
__global__ void embed_kernel(W const* __restrict__ embedding, std::int64_t ld,
                             std::int32_t const* __restrict__ tokens, float* __restrict__ x,
                             std::int32_t dim) {
  std::int32_t const i = static_cast<std::int32_t>(blockIdx.x);
  W const* src = embedding + static_cast<std::int64_t>(tokens[i]) * ld;
  float* dst = x + static_cast<std::int64_t>(i) * dim;
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < dim;
       j += static_cast<std::int32_t>(blockDim.x))
    dst[j] = to_float(src[j]);
}

//! out[r, :] = weight * (x[rows[r], :] / rms(x[rows[r], :])), one block per output row;
//! rows null = identity. As llama2.c: 1 / sqrtf(mean(x^2) + eps), then w * (scale * x), written
//! as T (the input type of the matrix product that reads it).
template <class T = float>
__global__ void rmsnorm_kernel(float const* __restrict__ x, std::int32_t const* __restrict__ rows,
                               float const* __restrict__ weight, T* __restrict__ out,
                               std::int32_t dim, float eps) {
  __shared__ float scratch[32];
  std::int32_t const r = static_cast<std::int32_t>(blockIdx.x);
  std::int32_t const src_row = rows != nullptr ? rows[r] : r;
  float const* in = x + static_cast<std::int64_t>(src_row) * dim;
  float ss = 0.0f;
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < dim;
       j += static_cast<std::int32_t>(blockDim.x))
    ss += in[j] * in[j];
  ss = block_sum(ss, scratch);
  float const scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  T* o = out + static_cast<std::int64_t>(r) * dim;
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < dim;
       j += static_cast<std::int32_t>(blockDim.x))
    o[j] = from_float<T>(weight[j] * (scale * in[j]));
}

//! RoPE on the q and k parts of each fused qkv row (interleaved pairs (2i, 2i + 1) per head):
//! frequency theta^(-(2i mod head) / head), angle position * frequency. One block per token.
template <int Unused = 0>
__global__ void rope_kernel(float* __restrict__ qkv, std::int32_t const* __restrict__ positions,
                            std::int32_t qkv_stride, std::int32_t dim, std::int32_t kv_dim,
                            std::int32_t head_size, float theta) {
  std::int32_t const i = static_cast<std::int32_t>(blockIdx.x);
  float* row = qkv + static_cast<std::int64_t>(i) * qkv_stride;
  float const pos = static_cast<float>(positions[i]);
  std::int32_t const pairs = (dim + kv_dim) / 2;
  for (std::int32_t pr = static_cast<std::int32_t>(threadIdx.x); pr < pairs;
       pr += static_cast<std::int32_t>(blockDim.x)) {
    std::int32_t const j = 2 * pr;  // index within q (j < dim) or k (j >= dim)
    std::int32_t const in_head = (j < dim ? j : j - dim) % head_size;
    float const freq =
        1.0f / powf(theta, static_cast<float>(in_head) / static_cast<float>(head_size));
    float const val = pos * freq;
    float const fcr = cosf(val), fci = sinf(val);
    float const v0 = row[j], v1 = row[j + 1];
    row[j] = v0 * fcr - v1 * fci;
    row[j + 1] = v0 * fci + v1 * fcr;
  }
}

//! Appends each token's k and v (from the fused qkv rows) to the cache at slots *base + i.
template <int Unused = 0>
__global__ void kv_append_kernel(float const* __restrict__ qkv, std::int32_t qkv_stride,
                                 std::int32_t dim, std::int32_t kv_dim, float* __restrict__ keys,
                                 float* __restrict__ values,
                                 std::int32_t const* __restrict__ base_at) {
  std::int32_t const i = static_cast<std::int32_t>(blockIdx.x);
  std::int32_t const base = *base_at;
  float const* row = qkv + static_cast<std::int64_t>(i) * qkv_stride;
  float* k = keys + static_cast<std::int64_t>(base + i) * kv_dim;
  float* v = values + static_cast<std::int64_t>(base + i) * kv_dim;
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < kv_dim;
       j += static_cast<std::int32_t>(blockDim.x)) {
    k[j] = row[dim + j];
    v[j] = row[dim + kv_dim + j];
  }
}

//! h[i, j] = silu(gu[i, j]) * gu[i, hidden + j] (gate and up fused in one row), as llama2.c:
//! g * (1 / (1 + exp(-g))) * u, written as T (the input type of the down projection).
template <class T = float>
__global__ void swiglu_kernel(float const* __restrict__ gu, T* __restrict__ h, std::int32_t hidden,
                              std::int64_t total) {
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t const i = idx / hidden, j = idx % hidden;
    float g = gu[i * 2 * hidden + j];
    g *= 1.0f / (1.0f + expf(-g));
    h[idx] = from_float<T>(g * gu[i * 2 * hidden + hidden + j]);
  }
}

#endif  // __CUDACC__

}  // namespace specdec::cuda::detail
