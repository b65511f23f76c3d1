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

//! One sequence's part of a multi-sequence `cuda_llama::forward`: its tokens, positions, mask and
//! logits rows (`request`, as a single-sequence forward takes them; the mask covers the segment's
//! own tokens) scored against `cache`, a cache made by `cuda_llama::make_cache` (or the model's
//! own).
struct cuda_llama_segment {
  cuda_kv_cache* cache = nullptr;  //!< the sequence's cache (not null)
  forward_request request;         //!< its tokens, as for a single-sequence forward
};

//! The Llama architecture on a CUDA device (see the file comment). Satisfies `causal_lm`.
//! `forward` over `cuda_llama_segment`s scores several sequences, each against its own cache, in
//! one pass over the weights (the rows of every segment go through each matrix product together;
//! attention and the cache writes run per segment): what `cuda_batched_llama` builds on.
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

  //! A new, empty cache for a sequence of this model (its full capacity, max_context() entries,
  //! is allocated on the device now), on the model's stream.
  [[nodiscard]] std::unique_ptr<cuda_kv_cache> make_cache() const {
    return std::make_unique<cuda_kv_cache>(config_.n_layers, config_.kv_dim(), max_context_,
                                           stream_);
  }

  //! Scores `req` (see `forward_request`) and appends its KV entries; writes the logits (and
  //! hidden rows on request) into `out` on the host.
  void forward(forward_request const& req, forward_result& out) {
    cuda_llama_segment const one{cache_.get(), req};
    forward(std::span<cuda_llama_segment const>(&one, 1), out);
  }

  //! Scores every segment against its own cache in one pass over the weights and appends each
  //! segment's KV entries to its cache; `out.logits` holds the segments' logits rows one after the
  //! other (each segment's `logits_rows`, or all its rows). `want_hidden`, `hidden_layer` and
  //! `skip_layers` apply to the whole batch: every segment must give the same ones, and hidden
  //! rows are those of every batch row. Throws `specdec::error`, leaving every cache unchanged,
  //! for no segment, a null cache or one given twice, a cache of another shape, segments that
  //! disagree on the batch-wide fields, or a malformed segment (its message prefixed with
  //! "segment s: " when there are several).
  void forward(std::span<cuda_llama_segment const> segments, forward_result& out) {
    std::size_t const rows = run(segments);
    forward_request const& req = segments[0].request;
    std::size_t n = 0;
    for (cuda_llama_segment const& seg : segments) n += seg.request.tokens.size();
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
    cuda_llama_segment const one{cache_.get(), req};
    std::size_t const rows = run(std::span<cuda_llama_segment const>(&one, 1));
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
    SPECDEC_CUDA_CHECK(cudaFuncSetAttribute(cuda::detail::segment_attention_kernel<0>,
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

  // The checks of one request against the cache it is scored with.
  void check_request(forward_request const& req, cuda_kv_cache const& cache) const {
    req.validate(vocab_size(), max_context_);
    std::size_t const n = req.tokens.size();
    SPECDEC_CHECK(n <= cache.capacity() - cache.size(), context_overflow,
                  "cuda_llama::forward: ", n, " tokens do not fit in a cache holding ",
                  cache.size(), " of ", cache.capacity());
    for (std::int32_t layer : req.skip_layers)
      SPECDEC_CHECK(layer >= 0 && layer < config_.n_layers, out_of_range,
                    "cuda_llama::forward: skip layer ", layer, " of a model with ",
                    config_.n_layers, " layers");
    SPECDEC_CHECK(req.hidden_layer < config_.n_layers, out_of_range,
                  "cuda_llama::forward: hidden_layer ", req.hidden_layer, " of a model with ",
                  config_.n_layers, " layers");
    std::size_t const words = req.mask.empty() ? 0 : req.mask_stride;
    SPECDEC_CHECK(words <= static_cast<std::size_t>(INT32_MAX) / (2 * n), out_of_range,
                  "cuda_llama::forward: mask stride ", words, " is too large");
  }

  // Runs the forward of `segments` on the device; returns the number of logits rows (in logits_,
  // segment after segment). One segment runs the single-sequence kernels; several run the
  // segment kernels (attention.cuh), which look up each row's segment.
  std::size_t run(std::span<cuda_llama_segment const> segments) {
    SPECDEC_CHECK(!segments.empty(), invalid_argument, "cuda_llama::forward: no segments");
    std::size_t const count = segments.size();
    forward_request const& req = segments[0].request;  // the batch-wide fields
    std::size_t n = 0, rows = 0, words_total = 0, longest = 0;
    bool identity = true;  // every row needs logits, in batch order
    for (std::size_t s = 0; s < count; ++s) {
      cuda_llama_segment const& seg = segments[s];
      SPECDEC_CHECK(seg.cache != nullptr, invalid_argument, "cuda_llama::forward: segment ", s,
                    " has no cache");
      SPECDEC_CHECK(
          seg.cache->n_layers() == config_.n_layers && seg.cache->kv_dim() == config_.kv_dim(),
          invalid_argument, "cuda_llama::forward: the cache of segment ", s, " (",
          seg.cache->n_layers(), " layers x ", seg.cache->kv_dim(),
          " floats) was not made for this model");
      for (std::size_t j = 0; j < s; ++j)
        SPECDEC_CHECK(segments[j].cache != seg.cache, invalid_argument,
                      "cuda_llama::forward: segments ", j, " and ", s, " score the same cache");
      if (count == 1) {
        check_request(seg.request, *seg.cache);
      } else {
        try {
          check_request(seg.request, *seg.cache);
        } catch (error const& e) {
          throw detail::with_context(e, detail::concat("segment ", s, ": "));
        }
      }
      forward_request const& r = seg.request;
      SPECDEC_CHECK(r.want_hidden == req.want_hidden && r.hidden_layer == req.hidden_layer &&
                        std::equal(r.skip_layers.begin(), r.skip_layers.end(),
                                   req.skip_layers.begin(), req.skip_layers.end()),
                    invalid_argument, "cuda_llama::forward: segment ", s,
                    " asks for other hidden rows or skipped layers than segment 0 (they apply to "
                    "the whole batch)");
      std::size_t const ns = r.tokens.size();
      n += ns;
      rows += r.logits_rows.empty() ? ns : r.logits_rows.size();
      identity = identity && r.logits_rows.empty();
      words_total += r.mask.empty() ? 0 : ns * r.mask_stride;
      longest = std::max(longest, seg.cache->size() + ns);
    }
    SPECDEC_CHECK(n <= static_cast<std::size_t>(INT32_MAX) / 4 &&
                      words_total <= static_cast<std::size_t>(INT32_MAX) / 4,
                  out_of_range, "cuda_llama::forward: a batch of ", n, " tokens and ", words_total,
                  " mask words is too large");
    std::size_t const layers = static_cast<std::size_t>(config_.n_layers);
    std::size_t const meta = count == 1 ? 0 : n + 6 * count;
    std::size_t const pointers = count == 1 ? 0 : layers * count * 2;
    reserve(std::max(n, rows));
    reserve_inputs(2 * n + rows + meta + 2 + 2 * words_total + 2 + 2 * pointers);

    // Stage tokens | positions | logits rows | (several segments: row segment | first | count |
    // cache length | mask offset | mask stride) | masks (as 32-bit halves) | (several: plane
    // pointers) and upload them in one copy.
    std::int32_t* host = host_inputs_;
    std::size_t const at_meta = 2 * n + rows;
    std::size_t row = 0, logits_row = 0, mask_words = 0;
    std::size_t const mask_at = (at_meta + meta + 1) & ~std::size_t{1};  // 8-byte aligned
    for (std::size_t s = 0; s < count; ++s) {
      forward_request const& r = segments[s].request;
      std::size_t const ns = r.tokens.size();
      std::copy(r.tokens.begin(), r.tokens.end(), host + row);
      std::copy(r.positions.begin(), r.positions.end(), host + n + row);
      if (r.logits_rows.empty()) {
        for (std::size_t i = 0; i < ns; ++i)
          host[2 * n + logits_row++] = static_cast<std::int32_t>(row + i);
      } else {
        for (std::int32_t const i : r.logits_rows)
          host[2 * n + logits_row++] = static_cast<std::int32_t>(row) + i;
      }
      std::int32_t offset = -1;
      if (!r.mask.empty()) {
        offset = static_cast<std::int32_t>(mask_words);
        std::memcpy(host + mask_at + 2 * mask_words, r.mask.data(),
                    ns * r.mask_stride * sizeof(std::uint64_t));
        mask_words += ns * r.mask_stride;
      }
      if (count > 1) {
        for (std::size_t i = 0; i < ns; ++i) host[at_meta + row + i] = static_cast<std::int32_t>(s);
        std::int32_t* m = host + at_meta + n;
        m[s] = static_cast<std::int32_t>(row);
        m[count + s] = static_cast<std::int32_t>(ns);
        m[2 * count + s] = static_cast<std::int32_t>(segments[s].cache->size());
        m[3 * count + s] = offset;
        m[4 * count + s] = r.mask.empty() ? 0 : static_cast<std::int32_t>(r.mask_stride);
      }
      row += ns;
    }
    std::size_t staged = mask_words != 0 ? mask_at + 2 * mask_words : at_meta + meta;
    std::size_t planes_at = 0;
    if (count > 1) {
      planes_at = (staged + 1) & ~std::size_t{1};
      planes_.resize(pointers);
      for (std::size_t l = 0; l < layers; ++l)
        for (std::size_t s = 0; s < count; ++s) {
          planes_[(l * count + s) * 2] = segments[s].cache->keys(static_cast<std::int32_t>(l));
          planes_[(l * count + s) * 2 + 1] =
              segments[s].cache->values(static_cast<std::int32_t>(l));
        }
      std::memcpy(host + planes_at, planes_.data(), pointers * sizeof(float*));
      staged = planes_at + 2 * pointers;
    }
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(inputs_.data(), host, staged * sizeof(std::int32_t),
                                       cudaMemcpyHostToDevice, stream_));
    std::int32_t const* d_tokens = inputs_.data();
    std::int32_t const* d_positions = inputs_.data() + n;
    std::int32_t const* d_rows = inputs_.data() + 2 * n;
    auto const* d_masks = mask_words != 0
                              ? reinterpret_cast<std::uint64_t const*>(inputs_.data() + mask_at)
                              : nullptr;
    cuda::detail::segment_table table{};
    if (count > 1) {
      std::int32_t const* m = inputs_.data() + at_meta;
      table.row_segment = m;
      table.first = m + n;
      table.count = m + n + count;
      table.cache_len = m + n + 2 * count;
      table.mask_offset = m + n + 3 * count;
      table.mask_stride = m + n + 4 * count;
      table.masks = d_masks;
      table.planes = reinterpret_cast<float* const*>(inputs_.data() + planes_at);
      table.segments = static_cast<std::int32_t>(count);
    }
    cuda_kv_cache& cache0 = *segments[0].cache;
    std::size_t const start = cache0.size();
    std::size_t const words = req.mask.empty() ? 0 : req.mask_stride;

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
        if (count == 1) {
          cuda::detail::kv_append_kernel<<<ni, threads, 0, stream_>>>(
              qkv_.data(), static_cast<std::int32_t>(qkv_stride), idim, ikv, cache0.keys(layer),
              cache0.values(layer), static_cast<std::int32_t>(start));
          cuda::detail::attention_kernel<<<dim3(static_cast<unsigned>(config_.n_heads), ni),
                                           attention_threads, attention_smem(start + n), stream_>>>(
              qkv_.data(), static_cast<std::int32_t>(qkv_stride), cache0.keys(layer),
              cache0.values(layer), static_cast<std::int32_t>(start), static_cast<std::int32_t>(n),
              d_masks, static_cast<std::int32_t>(words), att_.data(), idim, ikv,
              config_.head_size(), config_.n_heads / config_.n_kv_heads);
        } else {
          cuda::detail::segment_kv_append_kernel<<<ni, threads, 0, stream_>>>(
              qkv_.data(), static_cast<std::int32_t>(qkv_stride), idim, ikv, table, layer);
          cuda::detail::
              segment_attention_kernel<<<dim3(static_cast<unsigned>(config_.n_heads), ni),
                                         attention_threads, attention_smem(longest), stream_>>>(
                  qkv_.data(), static_cast<std::int32_t>(qkv_stride), table, layer, att_.data(),
                  idim, ikv, config_.head_size(), config_.n_heads / config_.n_kv_heads);
        }
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
      if (identity) {
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
    for (cuda_llama_segment const& seg : segments)
      seg.cache->commit_append(seg.request.tokens.size());
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
  std::vector<float*> planes_;  // [layers, segments, 2] of a forward of several segments
  std::size_t inputs_capacity_ = 0;
};

#endif  // __CUDACC__

}  // namespace specdec