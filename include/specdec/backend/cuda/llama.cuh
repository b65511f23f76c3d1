#pragma once
//! \file
//! `cuda_llama`: the Llama architecture on one CUDA device, implementing `specdec::causal_lm`.
//! float32 weights and activations; cuBLAS for the matrix products (no TF32), own kernels for
//! the embedding, RMSNorm, RoPE (interleaved pairs, theta from the config), SwiGLU and attention
//! with the request's visibility mask over a device KV cache (`cuda_kv_cache`, with truncate and
//! keep_path). The decoder runs on it unchanged: `forward` fills the same host `forward_result`
//! as the CPU backend; `forward_device` leaves the logits on the device for the CUDA verifiers.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/tree.cuh"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"
#include "specdec/model/llama_weights.hpp"

//! Throws `specdec::error(errc::internal)` naming the call unless the cuBLAS call succeeds.
#define SPECDEC_CUBLAS_CHECK(EXPR)                                                 \
  do {                                                                             \
    cublasStatus_t const specdec_cublas_st_ = (EXPR);                              \
    if (specdec_cublas_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                \
      SPECDEC_THROW(internal, #EXPR, " failed at ", __FILE__, ":", __LINE__, ": ", \
                    cublasGetStatusName(specdec_cublas_st_));                      \
    }                                                                              \
  } while (false)

namespace specdec {

//! Options of `cuda_llama`.
struct cuda_llama_options {
  std::size_t max_context = 0;  //!< cache capacity in tokens; 0 = the model's seq_len
  std::size_t max_batch = 64;   //!< tokens per forward reserved up front (grows on demand)
  int device = -1;              //!< CUDA device ordinal; -1 = the current device
};

#if defined(__CUDACC__)

//! A KV cache in device memory: per layer a K and a V plane of [capacity, kv_dim] floats. Entries
//! are stored in the order they were appended (slot i holds the i-th committed token's K/V).
//! Satisfies `specdec::kv_cache`. Operations run on the owning model's stream.
class cuda_kv_cache {
 public:
  //! A cache for `n_layers` layers of `kv_dim` floats per entry, holding `capacity` entries.
  cuda_kv_cache(std::int32_t n_layers, std::int32_t kv_dim, std::size_t capacity,
                cudaStream_t stream)
      : n_layers_(n_layers), kv_dim_(kv_dim), capacity_(capacity), stream_(stream) {
    SPECDEC_CHECK(n_layers > 0 && kv_dim > 0 && capacity > 0, invalid_argument,
                  "cuda_kv_cache: n_layers ", n_layers, ", kv_dim ", kv_dim, ", capacity ",
                  capacity, " must be positive");
    SPECDEC_CHECK(capacity <= static_cast<std::size_t>(INT32_MAX), out_of_range,
                  "cuda_kv_cache: capacity ", capacity, " exceeds 2^31 - 1");
    std::size_t const plane = capacity * static_cast<std::size_t>(kv_dim);
    data_.resize(plane * 2 * static_cast<std::size_t>(n_layers));
    std::vector<float*> planes(2 * static_cast<std::size_t>(n_layers));
    for (std::size_t p = 0; p < planes.size(); ++p) planes[p] = data_.data() + p * plane;
    planes_.resize(planes.size());
    planes_.upload(std::span<float* const>(planes), stream_);
    keep_.resize(capacity + 2 + 1);
    staging_.resize(capacity + 3);
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  //! Entries stored (committed positions).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! Most entries the cache holds.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  //! Floats per entry and plane.
  [[nodiscard]] std::int32_t kv_dim() const noexcept { return kv_dim_; }
  //! Number of layers.
  [[nodiscard]] std::int32_t n_layers() const noexcept { return n_layers_; }

  //! Drops entries >= n. Throws `errc::out_of_range` when n > size().
  void truncate(std::size_t n) {
    SPECDEC_CHECK(n <= size_, out_of_range, "cuda_kv_cache::truncate: ", n,
                  " is beyond the cache size ", size_);
    size_ = n;
  }

  //! Keeps entries [0, n), moves entry n + keep[i] to n + i and drops the rest. `keep` must be
  //! strictly ascending with n + keep.back() < size(). Throws `specdec::error` otherwise.
  void keep_path(std::size_t n, std::span<std::int32_t const> keep) {
    SPECDEC_CHECK(n <= size_, out_of_range, "cuda_kv_cache::keep_path: n = ", n,
                  " is beyond the cache size ", size_);
    for (std::size_t i = 0; i < keep.size(); ++i) {
      SPECDEC_CHECK(keep[i] >= 0 && n + static_cast<std::size_t>(keep[i]) < size_, out_of_range,
                    "cuda_kv_cache::keep_path: keep[", i, "] = ", keep[i], " addresses entry ",
                    n + static_cast<std::size_t>(keep[i] < 0 ? 0 : keep[i]), " of a cache holding ",
                    size_);
      SPECDEC_CHECK(i == 0 || keep[i] > keep[i - 1], invalid_argument,
                    "cuda_kv_cache::keep_path: keep is not strictly ascending at index ", i);
    }
    bool moves = false;
    for (std::size_t i = 0; i < keep.size(); ++i)
      moves = moves || keep[i] != static_cast<std::int32_t>(i);
    if (moves) {
      // staging: [base, cu0, cu1, keep...]
      staging_[0] = static_cast<std::int32_t>(n);
      staging_[1] = 0;
      staging_[2] = static_cast<std::int32_t>(keep.size());
      std::copy(keep.begin(), keep.end(), staging_.begin() + 3);
      keep_.upload(std::span<std::int32_t const>(staging_.data(), keep.size() + 3), stream_);
      cuda::kv_compaction_params p;
      p.planes = planes_.data();
      p.num_planes = 2 * n_layers_;
      p.row_width = kv_dim_;
      p.seq_stride = 0;
      p.capacity = static_cast<std::int32_t>(capacity_);
      p.batch = 1;
      p.base = keep_.data();
      p.cu_keep = keep_.data() + 1;
      p.keep = keep_.data() + 3;
      cuda::throw_if_failed(cuda::launch_compact_kv(p, stream_), "cuda_kv_cache::keep_path");
      // The staging buffer is reused by the next call: wait for the upload.
      SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    size_ = n + keep.size();
  }

  //! Empties the cache.
  void clear() noexcept { size_ = 0; }

  //! K plane of `layer`: [capacity, kv_dim] floats on the device.
  [[nodiscard]] float* keys(std::int32_t layer) noexcept { return plane(2 * layer); }
  //! V plane of `layer`: [capacity, kv_dim] floats on the device.
  [[nodiscard]] float* values(std::int32_t layer) noexcept { return plane(2 * layer + 1); }
  [[nodiscard]] float const* keys(std::int32_t layer) const noexcept {
    return data_.data() + static_cast<std::size_t>(2 * layer) * plane_size();
  }
  [[nodiscard]] float const* values(std::int32_t layer) const noexcept {
    return data_.data() + static_cast<std::size_t>(2 * layer + 1) * plane_size();
  }

  //! Records that `count` entries were appended (by the model's forward).
  void commit_append(std::size_t count) {
    SPECDEC_CHECK(count <= capacity_ - size_, context_overflow, "cuda_kv_cache: appending ", count,
                  " entries to ", size_, " exceeds the capacity ", capacity_);
    size_ += count;
  }

 private:
  [[nodiscard]] std::size_t plane_size() const noexcept {
    return capacity_ * static_cast<std::size_t>(kv_dim_);
  }
  [[nodiscard]] float* plane(std::int32_t p) noexcept {
    return data_.data() + static_cast<std::size_t>(p) * plane_size();
  }

  std::int32_t n_layers_;
  std::int32_t kv_dim_;
  std::size_t capacity_;
  std::size_t size_ = 0;
  cudaStream_t stream_;
  cuda::device_buffer<float> data_;
  cuda::device_buffer<float*> planes_;
  cuda::device_buffer<std::int32_t> keep_;
  std::vector<std::int32_t> staging_;
};

namespace cuda::detail {

//! x[i, :] = embedding[tokens[i], :].
template <int Unused = 0>
__global__ void embed_kernel(float const* __restrict__ embedding,
                             std::int32_t const* __restrict__ tokens, float* __restrict__ x,
                             std::int32_t dim) {
  std::int32_t const i = static_cast<std::int32_t>(blockIdx.x);
  float const* src = embedding + static_cast<std::int64_t>(tokens[i]) * dim;
  float* dst = x + static_cast<std::int64_t>(i) * dim;
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < dim;
       j += static_cast<std::int32_t>(blockDim.x))
    dst[j] = src[j];
}

//! out[r, :] = weight * (x[rows[r], :] / rms(x[rows[r], :])), one block per output row;
//! rows null = identity. As llama2.c: 1 / sqrtf(mean(x^2) + eps), then w * (scale * x).
template <int Unused = 0>
__global__ void rmsnorm_kernel(float const* __restrict__ x, std::int32_t const* __restrict__ rows,
                               float const* __restrict__ weight, float* __restrict__ out,
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
  float* o = out + static_cast<std::int64_t>(r) * dim;
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < dim;
       j += static_cast<std::int32_t>(blockDim.x))
    o[j] = weight[j] * (scale * in[j]);
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

//! Appends each token's k and v (from the fused qkv rows) to the cache at slots base + i.
template <int Unused = 0>
__global__ void kv_append_kernel(float const* __restrict__ qkv, std::int32_t qkv_stride,
                                 std::int32_t dim, std::int32_t kv_dim, float* __restrict__ keys,
                                 float* __restrict__ values, std::int32_t base) {
  std::int32_t const i = static_cast<std::int32_t>(blockIdx.x);
  float const* row = qkv + static_cast<std::int64_t>(i) * qkv_stride;
  float* k = keys + static_cast<std::int64_t>(base + i) * kv_dim;
  float* v = values + static_cast<std::int64_t>(base + i) * kv_dim;
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < kv_dim;
       j += static_cast<std::int32_t>(blockDim.x)) {
    k[j] = row[dim + j];
    v[j] = row[dim + kv_dim + j];
  }
}

//! Attention of batch token i (blockIdx.y), query head h (blockIdx.x) over cache slots
//! [0, cache_len) (all visible) and the batch's own slots cache_len + j visible through the mask
//! (bit j of row i; null mask = causal). Dynamic shared memory: head_size + cache_len + n +
//! groups * head_size floats, groups = max(1, blockDim / head_size).
template <int Unused = 0>
__global__ void attention_kernel(float const* __restrict__ qkv, std::int32_t qkv_stride,
                                 float const* __restrict__ keys, float const* __restrict__ values,
                                 std::int32_t cache_len, std::int32_t n,
                                 std::uint64_t const* __restrict__ mask, std::int32_t mask_stride,
                                 float* __restrict__ out, std::int32_t dim, std::int32_t kv_dim,
                                 std::int32_t head_size, std::int32_t heads_per_kv) {
  extern __shared__ float smem[];
  __shared__ float scratch[32];
  std::int32_t const h = static_cast<std::int32_t>(blockIdx.x);
  std::int32_t const i = static_cast<std::int32_t>(blockIdx.y);
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
    if (t >= cache_len) {
      std::int32_t const j = t - cache_len;
      visible = mask == nullptr
                    ? j <= i
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

  float* o = out + static_cast<std::int64_t>(i) * dim + h * head_size;
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
      o[tid] = acc * inv;
    }
  } else {
    for (std::int32_t d = tid; d < head_size; d += nthreads) {
      float acc = 0.0f;
      for (std::int32_t t = 0; t < total; ++t)
        acc += scores[t] * values[static_cast<std::int64_t>(t) * kv_dim + kvh * head_size + d];
      o[d] = acc * inv;
    }
  }
}

//! h[i, j] = silu(gu[i, j]) * gu[i, hidden + j] (gate and up fused in one row), as llama2.c:
//! g * (1 / (1 + exp(-g))) * u.
template <int Unused = 0>
__global__ void swiglu_kernel(float const* __restrict__ gu, float* __restrict__ h,
                              std::int32_t hidden, std::int64_t total) {
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       idx < total; idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::int64_t const i = idx / hidden, j = idx % hidden;
    float g = gu[i * 2 * hidden + j];
    g *= 1.0f / (1.0f + expf(-g));
    h[idx] = g * gu[i * 2 * hidden + hidden + j];
  }
}

}  // namespace cuda::detail

//! The Llama architecture on a CUDA device (see the file comment). Satisfies `causal_lm`.
//!
//! Not thread-safe: one forward at a time. All work runs on the model's own stream.
class cuda_llama {
 public:
  //! Uploads `weights` to the device; they may be released afterwards.
  explicit cuda_llama(llama_weights const& weights, cuda_llama_options options = {})
      : config_(weights.config) {
    config_.validate("cuda_llama");
    SPECDEC_CHECK(weights.token_embedding != nullptr && weights.rms_final != nullptr &&
                      weights.classifier != nullptr &&
                      weights.layers.size() == static_cast<std::size_t>(config_.n_layers),
                  invalid_argument, "cuda_llama: incomplete weights (", weights.layers.size(),
                  " layers for n_layers ", config_.n_layers, ")");
    if (options.device >= 0) SPECDEC_CUDA_CHECK(cudaSetDevice(options.device));
    max_context_ =
        options.max_context == 0 ? static_cast<std::size_t>(config_.seq_len) : options.max_context;
    SPECDEC_CHECK(max_context_ <= static_cast<std::size_t>(INT32_MAX / 2), out_of_range,
                  "cuda_llama: max_context ", max_context_, " is too large");
    SPECDEC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    try {
      SPECDEC_CUBLAS_CHECK(cublasCreate(&cublas_));
      SPECDEC_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
      SPECDEC_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
      upload_weights(weights);
      cache_ = std::make_unique<cuda_kv_cache>(config_.n_layers, config_.kv_dim(), max_context_,
                                               stream_);
      check_attention_limits();
      reserve(std::max<std::size_t>(options.max_batch, 1));
      reserve_inputs(4 * std::max<std::size_t>(options.max_batch, 1));
    } catch (...) {
      destroy();
      throw;
    }
  }
  //! Uploads `*weights` (which may be released afterwards).
  explicit cuda_llama(std::shared_ptr<llama_weights const> const& weights,
                      cuda_llama_options options = {})
      : cuda_llama(deref(weights), options) {}

  ~cuda_llama() { destroy(); }
  cuda_llama(cuda_llama const&) = delete;
  cuda_llama& operator=(cuda_llama const&) = delete;

  //! Vocabulary size.
  [[nodiscard]] std::size_t vocab_size() const noexcept {
    return static_cast<std::size_t>(config_.vocab_size);
  }
  //! Cache capacity (positions and entries).
  [[nodiscard]] std::size_t max_context() const noexcept { return max_context_; }
  //! Width of the hidden states.
  [[nodiscard]] std::size_t hidden_size() const noexcept {
    return static_cast<std::size_t>(config_.dim);
  }
  //! The model's hyper-parameters.
  [[nodiscard]] llama_config const& config() const noexcept { return config_; }
  //! The KV cache.
  [[nodiscard]] cuda_kv_cache& cache() noexcept { return *cache_; }
  [[nodiscard]] cuda_kv_cache const& cache() const noexcept { return *cache_; }
  //! Empties the cache.
  void reset() noexcept { cache_->clear(); }
  //! The stream all work runs on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  //! Bytes of weights on the device (what one decode step streams at least once).
  [[nodiscard]] std::size_t weight_bytes() const noexcept {
    return weights_.size() * sizeof(float);
  }

  //! Scores `req` (see `forward_request`) and appends its KV entries; writes the logits (and
  //! hidden rows on request) into `out` on the host.
  void forward(forward_request const& req, forward_result& out) {
    std::size_t const rows = run(req);
    std::size_t const n = req.tokens.size();
    std::size_t const v = vocab_size(), d = hidden_size();
    out.vocab = v;
    out.hidden_size = d;
    out.logits_count = rows;
    out.logits.resize(rows * v);
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(out.logits.data(), logits_.data(), rows * v * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
    if (req.want_hidden) {
      out.hidden.resize(n * d);
      SPECDEC_CUDA_CHECK(cudaMemcpyAsync(out.hidden.data(), final_.data(), n * d * sizeof(float),
                                         cudaMemcpyDeviceToHost, stream_));
    } else {
      out.hidden.clear();
    }
    if (req.hidden_layer >= 0) {
      out.layer_hidden.resize(n * d);
      SPECDEC_CUDA_CHECK(cudaMemcpyAsync(out.layer_hidden.data(), layer_hidden_.data(),
                                         n * d * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    } else {
      out.layer_hidden.clear();
    }
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  //! Like `forward`, but leaves the logits on the device: returns a [rows, vocab] view of device
  //! memory, valid until the next forward. Does not synchronise the stream.
  [[nodiscard]] matrix_view<float const> forward_device(forward_request const& req) {
    std::size_t const rows = run(req);
    return matrix_view<float const>(logits_.data(), rows, vocab_size());
  }

 private:
  static llama_weights const& deref(std::shared_ptr<llama_weights const> const& w) {
    SPECDEC_CHECK(w != nullptr, invalid_argument, "cuda_llama: null weights");
    return *w;
  }

  // Device weight layout (floats): embedding, [per layer: rms_att, wqkv, wo, rms_ffn, w13, w2],
  // rms_final, classifier (only when not shared).
  struct layer_offsets {
    std::size_t rms_att, wqkv, wo, rms_ffn, w13, w2;
  };

  void upload_weights(llama_weights const& w) {
    auto const d = static_cast<std::size_t>(config_.dim);
    auto const h = static_cast<std::size_t>(config_.hidden_dim);
    auto const kv = static_cast<std::size_t>(config_.kv_dim());
    auto const v = static_cast<std::size_t>(config_.vocab_size);
    bool const shared = w.classifier == w.token_embedding;
    std::size_t total = v * d;
    layers_.resize(static_cast<std::size_t>(config_.n_layers));
    for (auto& l : layers_) {
      l.rms_att = total;
      total += d;
      l.wqkv = total;
      total += (d + 2 * kv) * d;
      l.wo = total;
      total += d * d;
      l.rms_ffn = total;
      total += d;
      l.w13 = total;
      total += 2 * h * d;
      l.w2 = total;
      total += d * h;
    }
    rms_final_ = total;
    total += d;
    classifier_ = shared ? 0 : total;
    if (!shared) total += v * d;
    weights_.resize(total);
    float* base = weights_.data();
    auto put = [&](std::size_t offset, float const* src, std::size_t count) {
      SPECDEC_CHECK(src != nullptr, invalid_argument, "cuda_llama: a weight pointer is null");
      SPECDEC_CUDA_CHECK(
          cudaMemcpy(base + offset, src, count * sizeof(float), cudaMemcpyHostToDevice));
    };
    put(0, w.token_embedding, v * d);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      auto const& src = w.layers[i];
      auto const& l = layers_[i];
      put(l.rms_att, src.rms_att, d);
      put(l.wqkv, src.wq, d * d);
      put(l.wqkv + d * d, src.wk, kv * d);
      put(l.wqkv + d * d + kv * d, src.wv, kv * d);
      put(l.wo, src.wo, d * d);
      put(l.rms_ffn, src.rms_ffn, d);
      put(l.w13, src.w1, h * d);
      put(l.w13 + h * d, src.w3, h * d);
      put(l.w2, src.w2, d * h);
    }
    put(rms_final_, w.rms_final, d);
    if (!shared) put(classifier_, w.classifier, v * d);
  }

  void check_attention_limits() {
    int device = 0;
    SPECDEC_CUDA_CHECK(cudaGetDevice(&device));
    int optin = 0;
    SPECDEC_CUDA_CHECK(
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    std::size_t const need = attention_smem(max_context_);
    SPECDEC_CHECK(need <= static_cast<std::size_t>(optin), unsupported, "cuda_llama: a context of ",
                  max_context_, " tokens needs ", need,
                  " bytes of shared memory per attention block; the device allows ", optin);
    SPECDEC_CUDA_CHECK(cudaFuncSetAttribute(cuda::detail::attention_kernel<0>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(need)));
  }

  [[nodiscard]] std::size_t attention_smem(std::size_t keys) const noexcept {
    auto const hs = static_cast<std::size_t>(config_.head_size());
    std::size_t const groups =
        attention_threads >= hs ? static_cast<std::size_t>(attention_threads) / hs : 1;
    return (hs + keys + groups * hs) * sizeof(float);
  }

  void reserve(std::size_t n) {
    if (n <= reserved_) return;
    auto const d = static_cast<std::size_t>(config_.dim);
    auto const h = static_cast<std::size_t>(config_.hidden_dim);
    auto const kv = static_cast<std::size_t>(config_.kv_dim());
    auto const v = static_cast<std::size_t>(config_.vocab_size);
    x_.resize(n * d);
    xb_.resize(n * d);
    att_.resize(n * d);
    qkv_.resize(n * (d + 2 * kv));
    gu_.resize(n * 2 * h);
    hb_.resize(n * h);
    final_.resize(n * d);
    layer_hidden_.resize(n * d);
    logits_.resize(n * v);
    reserved_ = n;
  }

  // Room for `count` staged 32-bit input words on the host (pinned) and the device.
  void reserve_inputs(std::size_t count) {
    if (count <= inputs_capacity_) return;
    inputs_.resize(count);
    if (host_inputs_ != nullptr) cudaFreeHost(host_inputs_);
    host_inputs_ = nullptr;
    inputs_capacity_ = 0;
    void* p = nullptr;
    SPECDEC_CUDA_CHECK(cudaMallocHost(&p, count * sizeof(std::int32_t)));
    host_inputs_ = static_cast<std::int32_t*>(p);
    inputs_capacity_ = count;
  }

  void gemm(float const* w, float const* x, float* y, std::size_t out_features,
            std::size_t in_features, std::size_t n, float beta) {
    float const alpha = 1.0f;
    // Row-major Y[n, out] = X[n, in] * W[out, in]^T  <=>  column-major Y^T = W^T(op T) * X^T.
    SPECDEC_CUBLAS_CHECK(cublasSgemm(
        cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_features), static_cast<int>(n),
        static_cast<int>(in_features), &alpha, w, static_cast<int>(in_features), x,
        static_cast<int>(in_features), &beta, y, static_cast<int>(out_features)));
  }

  // Runs the forward on the device; returns the number of logits rows (in logits_).
  std::size_t run(forward_request const& req) {
    req.validate(vocab_size(), max_context_);
    std::size_t const n = req.tokens.size();
    std::size_t const start = cache_->size();
    SPECDEC_CHECK(n <= cache_->capacity() - start, context_overflow, "cuda_llama::forward: ", n,
                  " tokens do not fit in a cache holding ", start, " of ", cache_->capacity());
    for (std::int32_t layer : req.skip_layers)
      SPECDEC_CHECK(layer >= 0 && layer < config_.n_layers, out_of_range,
                    "cuda_llama::forward: skip layer ", layer, " of a model with ",
                    config_.n_layers, " layers");
    SPECDEC_CHECK(req.hidden_layer < config_.n_layers, out_of_range,
                  "cuda_llama::forward: hidden_layer ", req.hidden_layer, " of a model with ",
                  config_.n_layers, " layers");
    std::size_t const rows = req.logits_rows.empty() ? n : req.logits_rows.size();
    std::size_t const words = req.mask.empty() ? 0 : req.mask_stride;
    SPECDEC_CHECK(words <= static_cast<std::size_t>(INT32_MAX) / (2 * n), out_of_range,
                  "cuda_llama::forward: mask stride ", words, " is too large");
    reserve(std::max(n, rows));
    reserve_inputs(2 * n + rows + 1 + 2 * n * words);

    // Stage tokens | positions | logits rows | mask (as 32-bit halves) and upload in one copy.
    std::int32_t* host = host_inputs_;
    std::copy(req.tokens.begin(), req.tokens.end(), host);
    std::copy(req.positions.begin(), req.positions.end(), host + n);
    for (std::size_t r = 0; r < rows; ++r)
      host[2 * n + r] = req.logits_rows.empty() ? static_cast<std::int32_t>(r) : req.logits_rows[r];
    std::size_t staged = 2 * n + rows;
    std::size_t mask_at = 0;
    if (words != 0) {
      mask_at = (staged + 1) & ~std::size_t{1};  // 8-byte alignment for the mask words
      std::memcpy(host + mask_at, req.mask.data(), n * words * sizeof(std::uint64_t));
      staged = mask_at + 2 * n * words;
    }
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(inputs_.data(), host, staged * sizeof(std::int32_t),
                                       cudaMemcpyHostToDevice, stream_));
    std::int32_t const* d_tokens = inputs_.data();
    std::int32_t const* d_positions = inputs_.data() + n;
    std::int32_t const* d_rows = inputs_.data() + 2 * n;
    auto const* d_mask =
        words != 0 ? reinterpret_cast<std::uint64_t const*>(inputs_.data() + mask_at) : nullptr;

    auto const d = static_cast<std::size_t>(config_.dim);
    auto const hd = static_cast<std::size_t>(config_.hidden_dim);
    auto const kv = static_cast<std::size_t>(config_.kv_dim());
    std::size_t const qkv_stride = d + 2 * kv;
    auto const ni = static_cast<unsigned>(n);
    auto const idim = static_cast<std::int32_t>(d);
    auto const ikv = static_cast<std::int32_t>(kv);
    float const* w = weights_.data();
    constexpr unsigned threads = cuda::detail::block_threads;

    cuda::detail::embed_kernel<<<ni, threads, 0, stream_>>>(w, d_tokens, x_.data(), idim);
    std::size_t skip_at = 0;
    for (std::int32_t layer = 0; layer < config_.n_layers; ++layer) {
      if (skip_at < req.skip_layers.size() && req.skip_layers[skip_at] == layer) {
        ++skip_at;
      } else {
        auto const& l = layers_[static_cast<std::size_t>(layer)];
        cuda::detail::rmsnorm_kernel<<<ni, threads, 0, stream_>>>(
            x_.data(), nullptr, w + l.rms_att, xb_.data(), idim, config_.rms_eps);
        gemm(w + l.wqkv, xb_.data(), qkv_.data(), qkv_stride, d, n, 0.0f);
        cuda::detail::rope_kernel<<<ni, threads, 0, stream_>>>(
            qkv_.data(), d_positions, static_cast<std::int32_t>(qkv_stride), idim, ikv,
            config_.head_size(), config_.rope_theta);
        cuda::detail::kv_append_kernel<<<ni, threads, 0, stream_>>>(
            qkv_.data(), static_cast<std::int32_t>(qkv_stride), idim, ikv, cache_->keys(layer),
            cache_->values(layer), static_cast<std::int32_t>(start));
        cuda::detail::attention_kernel<<<dim3(static_cast<unsigned>(config_.n_heads), ni),
                                         attention_threads, attention_smem(start + n), stream_>>>(
            qkv_.data(), static_cast<std::int32_t>(qkv_stride), cache_->keys(layer),
            cache_->values(layer), static_cast<std::int32_t>(start), static_cast<std::int32_t>(n),
            d_mask, static_cast<std::int32_t>(words), att_.data(), idim, ikv, config_.head_size(),
            config_.n_heads / config_.n_kv_heads);
        gemm(w + l.wo, att_.data(), x_.data(), d, d, n, 1.0f);  // x += att Wo^T
        cuda::detail::rmsnorm_kernel<<<ni, threads, 0, stream_>>>(
            x_.data(), nullptr, w + l.rms_ffn, xb_.data(), idim, config_.rms_eps);
        gemm(w + l.w13, xb_.data(), gu_.data(), 2 * hd, d, n, 0.0f);
        auto const total = static_cast<std::int64_t>(n * hd);
        auto const blocks =
            static_cast<unsigned>(std::min<std::int64_t>((total + threads - 1) / threads, 4096));
        cuda::detail::swiglu_kernel<<<blocks, threads, 0, stream_>>>(
            gu_.data(), hb_.data(), static_cast<std::int32_t>(hd), total);
        gemm(w + l.w2, hb_.data(), x_.data(), d, hd, n, 1.0f);  // x += h W2^T
      }
      if (layer == req.hidden_layer)
        SPECDEC_CUDA_CHECK(cudaMemcpyAsync(layer_hidden_.data(), x_.data(), n * d * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream_));
    }
    float const* classifier = classifier_ == 0 ? w : w + classifier_;
    if (req.want_hidden) {
      cuda::detail::rmsnorm_kernel<<<ni, threads, 0, stream_>>>(
          x_.data(), nullptr, w + rms_final_, final_.data(), idim, config_.rms_eps);
      if (req.logits_rows.empty()) {
        gemm(classifier, final_.data(), logits_.data(), vocab_size(), d, n, 0.0f);
      } else {
        cuda::detail::rmsnorm_kernel<<<static_cast<unsigned>(rows), threads, 0, stream_>>>(
            x_.data(), d_rows, w + rms_final_, xb_.data(), idim, config_.rms_eps);
        gemm(classifier, xb_.data(), logits_.data(), vocab_size(), d, rows, 0.0f);
      }
    } else {
      cuda::detail::rmsnorm_kernel<<<static_cast<unsigned>(rows), threads, 0, stream_>>>(
          x_.data(), d_rows, w + rms_final_, xb_.data(), idim, config_.rms_eps);
      gemm(classifier, xb_.data(), logits_.data(), vocab_size(), d, rows, 0.0f);
    }
    cuda::throw_if_failed(cuda::last_launch_status("cuda_llama::forward: kernel launch"),
                          "cuda_llama::forward");
    cache_->commit_append(n);
    return rows;
  }

  void destroy() noexcept {
    if (host_inputs_ != nullptr) cudaFreeHost(host_inputs_);
    host_inputs_ = nullptr;
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    cublas_ = nullptr;
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cache_.reset();
      cudaStreamDestroy(stream_);
    }
    stream_ = nullptr;
  }

  static constexpr unsigned attention_threads = 256;

  llama_config config_;
  std::size_t max_context_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cuda::device_buffer<float> weights_;
  std::vector<layer_offsets> layers_;
  std::size_t rms_final_ = 0;
  std::size_t classifier_ = 0;  // 0 = shared with the embedding
  std::unique_ptr<cuda_kv_cache> cache_;
  std::size_t reserved_ = 0;
  cuda::device_buffer<float> x_, xb_, att_, qkv_, gu_, hb_, final_, layer_hidden_, logits_;
  cuda::device_buffer<std::int32_t> inputs_;
  std::int32_t* host_inputs_ = nullptr;
  std::size_t inputs_capacity_ = 0;
};

#endif  // __CUDACC__

}  // namespace specdec
