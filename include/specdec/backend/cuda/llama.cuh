#pragma once
//! \file
//! `cuda_llama`: the Llama architecture on one CUDA device, implementing `specdec::causal_lm`.
//! float32 weights and activations; cuBLAS for the matrix products (no TF32), own kernels for
//! the embedding, RMSNorm, RoPE (interleaved pairs, theta from the config), SwiGLU
//! (elementwise.cuh) and attention with the request's visibility mask (attention.cuh) over a
//! device KV cache (`cuda_kv_cache`, kv_cache.cuh, with truncate and keep_path). The decoder runs
//! on it unchanged: `forward` fills the same host `forward_result` as the CPU backend;
//! `forward_device` leaves the logits on the device for the CUDA verifiers.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "specdec/backend/cuda/attention.cuh"
#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/elementwise.cuh"
#include "specdec/backend/cuda/kv_cache.cuh"
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
  //! hidden rows and the requested layers' residual streams) into `out` on the host.
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
    std::size_t const layers = req.requested_layers().size();
    out.layer_count = layers;
    if (layers > 0) {
      out.layer_hidden.resize(n * layers * d);
      SPECDEC_CUDA_CHECK(cudaMemcpyAsync(out.layer_hidden.data(), layer_hidden_.data(),
                                         n * layers * d * sizeof(float), cudaMemcpyDeviceToHost,
                                         stream_));
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
    for (std::int32_t layer : req.hidden_layers)
      SPECDEC_CHECK(layer >= 0 && layer < config_.n_layers, out_of_range,
                    "cuda_llama::forward: hidden layer ", layer, " of a model with ",
                    config_.n_layers, " layers");
    std::span<std::int32_t const> const wanted = req.requested_layers();
    std::size_t const rows = req.logits_rows.empty() ? n : req.logits_rows.size();
    std::size_t const words = req.mask.empty() ? 0 : req.mask_stride;
    SPECDEC_CHECK(words <= static_cast<std::size_t>(INT32_MAX) / (2 * n), out_of_range,
                  "cuda_llama::forward: mask stride ", words, " is too large");
    reserve(std::max(n, rows));
    layer_hidden_.reserve(n * std::max<std::size_t>(wanted.size(), 1) *
                          static_cast<std::size_t>(config_.dim));
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
            static_cast<std::int32_t>(start), d_mask, static_cast<std::int32_t>(words), att_.data(),
            idim, ikv, config_.head_size(), config_.n_heads / config_.n_kv_heads);
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
      // The requested layers' residual streams, side by side per token.
      for (std::size_t j = 0; j < wanted.size(); ++j)
        if (wanted[j] == layer)
          SPECDEC_CUDA_CHECK(cudaMemcpy2DAsync(
              layer_hidden_.data() + j * d, wanted.size() * d * sizeof(float), x_.data(),
              d * sizeof(float), d * sizeof(float), n, cudaMemcpyDeviceToDevice, stream_));
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