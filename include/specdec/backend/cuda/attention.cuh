#pragma once
//! \file
//! The attention kernels of `cuda_llama` (llama.cuh) and the EAGLE head (eagle.cuh): one block per
//! (token, query head) over the cache entries and the batch's own entries visible through the
//! request's bit-packed mask (causal when there is none). `attention_kernel` scores one sequence;
//! `segment_attention_kernel` (with `segment_kv_append_kernel`) the segments of a multi-sequence
//! forward, each row against its own segment's cache (`segment_table`). Both run one block body,
//! `attend_block`. Internal to backend/cuda.
//!
//! The kernels are templates (common.cuh says why); the attention takes the element type of its
//! output, the input of the output projection (dtype.cuh).

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/dtype.cuh"

namespace specdec::cuda::detail {

#if defined(__CUDACC__)

//! The attention of one block: token i of a sequence's batch of n tokens, query head h
//! (blockIdx.x), over that sequence's slots [0, cache_len + n): the slots below `prefix`
//! (<= cache_len) are all visible, slot prefix + j through the mask (bit j of row i; null mask =
//! causal: slots up to cache_len + i). `qrow` is the token's query row and `orow` its output row
//! (both at head 0); `keys` / `values` the sequence's [capacity, kv_dim] planes. Dynamic shared
//! memory: at least head_size + cache_len + n + groups * head_size floats, groups = max(1,
//! blockDim / head_size). Writes the heads' outputs as T.
template <class T>
__device__ __forceinline__ void attend_block(
    float const* __restrict__ qrow, float const* __restrict__ keys,
    float const* __restrict__ values, std::int32_t cache_len, std::int32_t prefix, std::int32_t n,
    std::int32_t i, std::uint64_t const* __restrict__ mask, std::int32_t mask_stride,
    T* __restrict__ orow, std::int32_t kv_dim, std::int32_t head_size, std::int32_t heads_per_kv) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  std::int32_t const h = static_cast<std::int32_t>(blockIdx.x);
  std::int32_t const kvh = h / heads_per_kv;
  std::int32_t const total = cache_len + n;
  std::int32_t const tid = static_cast<std::int32_t>(threadIdx.x);
  std::int32_t const nthreads = static_cast<std::int32_t>(blockDim.x);
  float* q = smem;
  float* scores = smem + head_size;
  std::int32_t const groups = nthreads >= head_size ? nthreads / head_size : 1;
  float* partial = scores + total;

  qrow += h * head_size;
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

  T* o = orow + h * head_size;
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

//! Attention of batch token i (blockIdx.y), query head h (blockIdx.x) over slots
//! [0, cache_len + n), cache_len = *cache_len_at (`attend_block`). `cuda_llama` passes
//! prefix_arg = -1, meaning prefix = cache_len (the batch's own slots masked); the EAGLE head a
//! shorter prefix (its committed entries), masking the tree entries of earlier calls too. The
//! length is read on the device so that a captured graph replays at any cache size. Dynamic shared
//! memory: as `attend_block`. Writes the heads' outputs as T.
template <class T = float>
__global__ void attention_kernel(float const* __restrict__ qkv, std::int32_t qkv_stride,
                                 float const* __restrict__ keys, float const* __restrict__ values,
                                 std::int32_t const* __restrict__ cache_len_at, std::int32_t n,
                                 std::int32_t prefix_arg, std::uint64_t const* __restrict__ mask,
                                 std::int32_t mask_stride, T* __restrict__ out, std::int32_t dim,
                                 std::int32_t kv_dim, std::int32_t head_size,
                                 std::int32_t heads_per_kv) {
  std::int32_t const i = static_cast<std::int32_t>(blockIdx.y);
  std::int32_t const cache_len = *cache_len_at;
  attend_block<T>(qkv + static_cast<std::int64_t>(i) * qkv_stride, keys, values, cache_len,
                  prefix_arg < 0 ? cache_len : prefix_arg, n, i, mask, mask_stride,
                  out + static_cast<std::int64_t>(i) * dim, kv_dim, head_size, heads_per_kv);
}

//! The segments of a multi-sequence forward, as the segment kernels read them (device arrays in
//! the model's staged inputs). A segment is one sequence's consecutive rows of the batch, scored
//! against its own cache.
struct segment_table {
  std::int32_t const* row_segment;  //!< [rows] the segment of each batch row
  std::int32_t const* first;        //!< [segments] the segment's first batch row
  std::int32_t const* count;        //!< [segments] its rows
  std::int32_t const* cache_len;    //!< [segments] entries its cache held before the forward
  std::int32_t const* mask_offset;  //!< [segments] its mask's first word in `masks`; -1: causal
  std::int32_t const* mask_stride;  //!< [segments] words per row of its mask
  std::uint64_t const* masks;       //!< every segment's mask, one after the other (or null)
  float* const* planes;             //!< [layers, segments, 2] each segment's K and V plane
  std::int32_t segments;            //!< segments in the forward (0: not a segmented forward)
};

//! Writes batch row r's (blockIdx.x) key and value (from its q|k|v row) into its own segment's
//! cache, layer `layer`, at entry cache_len + (r - first).
template <int Unused = 0>
__global__ void segment_kv_append_kernel(float const* __restrict__ qkv, std::int32_t qkv_stride,
                                         std::int32_t dim, std::int32_t kv_dim, segment_table table,
                                         std::int32_t layer) {
  std::int32_t const r = static_cast<std::int32_t>(blockIdx.x);
  std::int32_t const s = table.row_segment[r];
  std::int64_t const entry = table.cache_len[s] + (r - table.first[s]);
  float* const* const p =
      table.planes + (static_cast<std::int64_t>(layer) * table.segments + s) * 2;
  float const* row = qkv + static_cast<std::int64_t>(r) * qkv_stride;
  float* k = p[0] + entry * kv_dim;
  float* v = p[1] + entry * kv_dim;
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < kv_dim;
       j += static_cast<std::int32_t>(blockDim.x)) {
    k[j] = row[dim + j];
    v[j] = row[dim + kv_dim + j];
  }
}

//! Attention of batch row r (blockIdx.y), query head h (blockIdx.x) within its own segment: over
//! that segment's cache (layer `layer`) and the segment's rows its mask lets it see, as
//! `attention_kernel` computes it for that segment alone (`attend_block`, prefix = the segment's
//! cache length). Dynamic shared memory: as `attend_block` for the longest segment (cache_len +
//! count). Writes the heads' outputs as T.
template <class T = float>
__global__ void segment_attention_kernel(float const* __restrict__ qkv, std::int32_t qkv_stride,
                                         segment_table table, std::int32_t layer,
                                         T* __restrict__ out, std::int32_t dim, std::int32_t kv_dim,
                                         std::int32_t head_size, std::int32_t heads_per_kv) {
  std::int32_t const r = static_cast<std::int32_t>(blockIdx.y);
  std::int32_t const s = table.row_segment[r];
  float* const* const p =
      table.planes + (static_cast<std::int64_t>(layer) * table.segments + s) * 2;
  std::int32_t const cache_len = table.cache_len[s];
  std::int32_t const offset = table.mask_offset[s];
  attend_block<T>(qkv + static_cast<std::int64_t>(r) * qkv_stride, p[0], p[1], cache_len, cache_len,
                  table.count[s], r - table.first[s], offset < 0 ? nullptr : table.masks + offset,
                  table.mask_stride[s], out + static_cast<std::int64_t>(r) * dim, kv_dim, head_size,
                  heads_per_kv);
}

//! Threads of an attention block (`attention_kernel`, `segment_attention_kernel`).
inline constexpr unsigned attention_threads = 256;

//! Bytes of dynamic shared memory an attention block needs over `keys` keys with heads of
//! `head_size` floats (see `attend_block`).
[[nodiscard]] inline std::size_t attention_smem(std::size_t head_size, std::size_t keys) noexcept {
  std::size_t const groups = attention_threads >= head_size ? attention_threads / head_size : 1;
  return (head_size + keys + groups * head_size) * sizeof(float);
}

//! Checks that attention over `keys` keys fits the shared memory the current device allows one
//! block (`errc::unsupported` naming `who` otherwise) and lets each of `kernels` use that much.
template <class... Kernel>
void allow_attention_smem(std::size_t head_size, std::size_t keys, char const* who,
                          Kernel*... kernels) {
  int device = 0, optin = 0;
  SPECDEC_CUDA_CHECK(cudaGetDevice(&device));
  SPECDEC_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  std::size_t const need = attention_smem(head_size, keys);
  SPECDEC_CHECK(need <= static_cast<std::size_t>(optin), unsupported, who, ": a context of ", keys,
                " entries needs ", need,
                " bytes of shared memory per attention block; the device allows ", optin);
  auto const allow = [&](auto* kernel) {
    SPECDEC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(need)));
  };
  (allow(kernels), ...);
}

#endif  // __CUDACC__

}  // namespace specdec::cuda::detail
