#pragma once
//! \file
//! `cuda_llama`: the Llama architecture on one CUDA device, implementing `specdec::causal_lm`.
//! Matrices in float32, binary16 or bfloat16 (`weight_dtype`, weights.cuh), everything else
//! (activations, norms, KV cache, logits) in float32, every product accumulated in float32.
//! Attention with the request's visibility mask (attention.cuh) over a device KV cache
//! (`cuda_kv_cache`, kv_cache.cuh, with truncate and keep_path).
//!
//! Two paths compute the same forward:
//! - the reference path: cuBLAS for every product (cublasGemmEx; float32 without TF32, or half
//!   inputs with float32 accumulation and output), own kernels for the embedding, RMSNorm, RoPE,
//!   the KV append, SwiGLU (elementwise.cuh) and attention: nine launches a layer. The inputs of
//!   the products are written in the weights' dtype (cuBLAS multiplies two operands of one type).
//! - the fused path, for forwards of at most `cuda::fused_max_tokens` tokens (decode steps,
//!   short chains): one matrix-vector kernel per product with the norm folded into its input and
//!   RoPE + KV append, SwiGLU or the residual add in its epilogue (fused.cuh), float32 inputs:
//!   five launches a layer. Each shape of such a forward is captured once as a CUDA graph and
//!   replayed (graph_cache.cuh), so a decode step is one graph launch.
//!
//! The decoder runs on it unchanged: `forward(req, forward_result&)` fills the same host
//! `forward_result` as the CPU backend; `forward(req, cuda_forward_result&)` (and
//! `forward_device`) leave the logits on the device for the CUDA verifiers.
//!
//! Several sequences at once: `forward` over `cuda_llama_segment`s scores each segment against its
//! own cache (`make_cache`) in one pass over the weights, what `cuda_batched_llama`
//! (batched_llama.cuh) builds on. One segment takes the paths above; several take the reference
//! path with every segment's rows in each product together, and the KV append and attention per
//! segment (`segment_kv_append_kernel`, `segment_attention_kernel`: attention.cuh), reading each
//! row's segment, cache length and cache planes from a segment table staged with the inputs.
//!
//! One topic, the model's forward, needs about 800 lines: its two paths and the forward over
//! segments share the staging, the graph capture, the reference layers and the outputs.

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
#include "specdec/backend/cuda/dtype.cuh"
#include "specdec/backend/cuda/elementwise.cuh"
#include "specdec/backend/cuda/forward_result.cuh"
#include "specdec/backend/cuda/fused.cuh"
#include "specdec/backend/cuda/graph_cache.cuh"
#include "specdec/backend/cuda/kv_cache.cuh"
#include "specdec/backend/cuda/llama_options.hpp"
#include "specdec/backend/cuda/weight_layout.hpp"
#include "specdec/backend/cuda/weights.cuh"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec {

#if defined(__CUDACC__)

//! One sequence's part of a multi-sequence `cuda_llama::forward`: its tokens, positions, mask and
//! logits rows (`request`, as a single-sequence forward takes them; its mask covers the segment's
//! own tokens: a sequence never sees another's) scored against `cache`, a cache made by
//! `cuda_llama::make_cache` (or the model's own `cache()`).
struct cuda_llama_segment {
  cuda_kv_cache* cache = nullptr;  //!< the sequence's cache (not null)
  forward_request request;         //!< its tokens, as for a single-sequence forward
};

//! The Llama architecture on a CUDA device (see the file comment). Satisfies `causal_lm`.
//! `forward` over `cuda_llama_segment`s scores several sequences, each against its own cache, in
//! one pass over the weights (the rows of every segment go through each matrix product together;
//! the KV appends and attention run per segment).
//!
//! Not thread-safe: one forward at a time. All work runs on the model's own stream.
class cuda_llama {
 public:
  //! Its forward honours `forward_request::skip_layers` (self-speculation).
  static constexpr bool supports_skip_layers = true;

  //! What `forward` leaves on the device, for a verifier that reads device rows (step_verifier).
  using device_forward_result = cuda_forward_result;

  //! Uploads `weights` to the device; they may be released afterwards.
  explicit cuda_llama(llama_weights const& weights, cuda_llama_options options = {})
      : config_(weights.config),
        options_(options),
        graphs_(options.graphs ? options.max_graphs : 0) {
    config_.validate("cuda_llama");
    SPECDEC_CHECK(weights.layers.size() == static_cast<std::size_t>(config_.n_layers),
                  invalid_argument, "cuda_llama: incomplete weights (", weights.layers.size(),
                  " layers for n_layers ", config_.n_layers, ")");
    if (options.device >= 0) SPECDEC_CUDA_CHECK(cudaSetDevice(options.device));
    max_context_ =
        options.max_context == 0 ? static_cast<std::size_t>(config_.seq_len) : options.max_context;
    SPECDEC_CHECK(max_context_ <= static_cast<std::size_t>(INT32_MAX / 2), out_of_range,
                  "cuda_llama: max_context ", max_context_, " is too large");
    fused_ok_ =
        options.fused && cuda::fused_supported(config_.dim, config_.hidden_dim, config_.kv_dim());
    SPECDEC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    try {
      SPECDEC_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_free_, cudaEventDisableTiming));
      SPECDEC_CUBLAS_CHECK(cublasCreate(&cublas_));
      SPECDEC_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
      SPECDEC_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
      weights_ = std::make_unique<cuda::llama_device_weights>(weights, options.dtype, stream_);
      cache_ = std::make_unique<cuda_kv_cache>(config_.n_layers, config_.kv_dim(), max_context_,
                                               stream_);
      check_attention_limits();
      reserve_batch(std::max<std::size_t>(options.max_batch, 1), 1);
      reserve_inputs(4 * std::max<std::size_t>(options.max_batch, 1) + 2);
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
  //! The options it was built with.
  [[nodiscard]] cuda_llama_options const& options() const noexcept { return options_; }
  //! The element type of the matrices on the device.
  [[nodiscard]] weight_dtype dtype() const noexcept { return weights_->dtype(); }
  //! The KV cache.
  [[nodiscard]] cuda_kv_cache& cache() noexcept { return *cache_; }
  [[nodiscard]] cuda_kv_cache const& cache() const noexcept { return *cache_; }
  //! Empties the cache.
  void reset() noexcept { cache_->clear(); }
  //! The stream all work runs on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  //! Bytes of weights on the device: the matrices in their dtype (rows padded to 16 bytes) and the
  //! float32 norm vectors.
  [[nodiscard]] std::size_t weight_bytes() const noexcept {
    return weights_->matrix_bytes() + weights_->vector_bytes();
  }
  //! Bytes a decode step must read at least once: every weight except the rows of an untied
  //! embedding table, of which a step reads one row per token.
  [[nodiscard]] std::size_t step_bytes() const noexcept {
    cuda::device_matrix const& e = weights_->embedding();
    bool const tied = e.data == weights_->classifier().data;
    return weight_bytes() -
           (tied ? 0
                 : cuda::packed_bytes(static_cast<std::size_t>(e.rows),
                                      static_cast<std::size_t>(e.cols), weights_->dtype()));
  }
  //! Whether a forward of `tokens` tokens and `rows` logits rows takes the fused kernels.
  [[nodiscard]] bool fused_for(std::size_t tokens, std::size_t rows) const noexcept {
    return fused_ok_ && tokens <= static_cast<std::size_t>(cuda::fused_max_tokens) &&
           rows <= static_cast<std::size_t>(cuda::fused_max_tokens);
  }
  //! Forward shapes captured as graphs so far.
  [[nodiscard]] std::size_t graphs_captured() const noexcept { return graphs_.size(); }

  //! A new, empty cache for one sequence of this model, for `forward` over `cuda_llama_segment`s:
  //! max_context() entries, allocated on the device now (throws `errc::out_of_memory` when the
  //! device cannot hold them), operated on the model's stream.
  [[nodiscard]] std::unique_ptr<cuda_kv_cache> make_cache() const {
    return std::make_unique<cuda_kv_cache>(config_.n_layers, config_.kv_dim(), max_context_,
                                           stream_);
  }

  //! Scores `req` (see `forward_request`; no `view`) and appends its KV entries; writes the logits
  //! (hidden rows, requested layers' streams) into `out` on the host. Waits for the device.
  void forward(forward_request const& req, forward_result& out) {
    std::size_t const rows = run(req, *cache_);
    copy_out(req, req.tokens.size(), rows, out);
  }

  //! Scores every segment against its own cache in one pass over the weights (see the class
  //! comment), as a single-sequence forward of its request against that cache would, and appends
  //! each segment's KV entries to its cache; waits for the device. `out.logits` holds the logits
  //! rows of every segment one after the other (segment s's `logits_rows`, or all its rows when
  //! empty, in request order). `want_hidden`, `hidden_layer` / `hidden_layers` and `skip_layers`
  //! apply to the whole batch, so every segment must give the same ones; hidden rows are those of
  //! every batch row, segment after segment. One segment takes the single-sequence paths (fused
  //! kernels; captured graphs when its cache is the model's own), several the reference path.
  //! Throws `specdec::error`, leaving every cache unchanged: `errc::invalid_argument` for no
  //! segment, a null cache or one given twice, a cache of another shape, or segments that disagree
  //! on the batch-wide fields; for a malformed segment request or one its cache cannot take, the
  //! single-sequence forward's error prefixed with "segment s: " (when there are several).
  void forward(std::span<cuda_llama_segment const> segments, forward_result& out) {
    check_segments(segments);
    forward_request const& first = segments[0].request;
    std::size_t n = 0;
    for (cuda_llama_segment const& seg : segments) n += seg.request.tokens.size();
    std::size_t const rows =
        segments.size() == 1 ? run(first, *segments[0].cache) : run_segments(segments, n);
    copy_out(first, n, rows, out);
  }

  //! Like `forward`, but leaves the logits on the device (valid until the next forward) and does
  //! not wait for the device. Hidden rows are not available this way (`want_hidden` and
  //! `hidden_layer` / `hidden_layers` must be unset).
  void forward(forward_request const& req, cuda_forward_result& out) {
    SPECDEC_CHECK(!req.want_hidden && req.requested_layers().empty(), invalid_argument,
                  "cuda_llama::forward: a device result carries no hidden rows");
    std::size_t const rows = run(req, *cache_);
    out.vocab = vocab_size();
    out.logits_count = rows;
    out.logits = cuda::device_rows(logits_.data(), rows, vocab_size());
  }

  //! Like `forward`, but returns a [rows, vocab] view of the logits left on the device (valid
  //! until the next forward); does not synchronise the stream.
  [[nodiscard]] matrix_view<float const> forward_device(forward_request const& req) {
    std::size_t const rows = run(req, *cache_);
    return matrix_view<float const>(logits_.data(), rows, vocab_size());
  }

 private:
  static llama_weights const& deref(std::shared_ptr<llama_weights const> const& w) {
    SPECDEC_CHECK(w != nullptr, invalid_argument, "cuda_llama: null weights");
    return *w;
  }

  // Copies the logits of `rows` rows (and the hidden rows and requested layers' residual streams
  // of `n` batch rows, as `req` asks) into `out` on the host and waits for the device.
  void copy_out(forward_request const& req, std::size_t n, std::size_t rows, forward_result& out) {
    std::size_t const v = vocab_size(), d = hidden_size();
    out.vocab = v;
    out.hidden_size = d;
    out.logits_count = rows;
    // One copy per output into pinned memory, one wait, then host copies.
    std::size_t const logit_floats = rows * v;
    std::size_t const hidden_floats = req.want_hidden ? n * d : 0;
    std::size_t const layers = req.requested_layers().size();
    std::size_t const layer_floats = n * layers * d;
    host_outputs_.reserve(logit_floats + hidden_floats + layer_floats);
    float* host = host_outputs_.data();
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(host, logits_.data(), logit_floats * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
    if (hidden_floats != 0)
      SPECDEC_CUDA_CHECK(cudaMemcpyAsync(host + logit_floats, final_.data(),
                                         hidden_floats * sizeof(float), cudaMemcpyDeviceToHost,
                                         stream_));
    if (layer_floats != 0)
      SPECDEC_CUDA_CHECK(cudaMemcpyAsync(host + logit_floats + hidden_floats, layer_hidden_.data(),
                                         layer_floats * sizeof(float), cudaMemcpyDeviceToHost,
                                         stream_));
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    out.logits.assign(host, host + logit_floats);
    out.hidden.assign(host + logit_floats, host + logit_floats + hidden_floats);
    out.layer_hidden.assign(host + logit_floats + hidden_floats,
                            host + logit_floats + hidden_floats + layer_floats);
    out.layer_count = layers;
  }

  // Lets every attention instantiation the forwards launch -- float output (fused path, float32
  // weights) and the dtype's (reference path, one sequence or segments) -- use the shared memory
  // of the whole context; throws when the device has too little.
  void check_attention_limits() {
    auto const hs = static_cast<std::size_t>(config_.head_size());
    cuda::detail::with_dtype(weights_->dtype(), [&]<class T>(T) {
      cuda::detail::allow_attention_smem(
          hs, max_context_, "cuda_llama", cuda::detail::attention_kernel<float>,
          cuda::detail::attention_kernel<T>, cuda::detail::segment_attention_kernel<T>);
    });
  }

  [[nodiscard]] std::size_t attention_smem(std::size_t keys) const noexcept {
    return cuda::detail::attention_smem(static_cast<std::size_t>(config_.head_size()), keys);
  }

  // Activation buffers for `n` tokens; reallocating them invalidates the captured graphs.
  // `layers` residual streams per token.
  void reserve_batch(std::size_t n, std::size_t layers) {
    if (n <= reserved_ && layers <= reserved_layers_) return;
    n = std::max(n, reserved_);
    layers = std::max(layers, reserved_layers_);
    graphs_.clear();
    auto const d = static_cast<std::size_t>(config_.dim);
    auto const h = static_cast<std::size_t>(config_.hidden_dim);
    auto const kv = static_cast<std::size_t>(config_.kv_dim());
    auto const v = static_cast<std::size_t>(config_.vocab_size);
    x_.resize(n * d);
    xb_.resize(n * d * sizeof(float));
    att_.resize(n * d * sizeof(float));
    qkv_.resize(n * (d + 2 * kv));
    gu_.resize(n * 2 * h);
    hb_.resize(n * h * sizeof(float));
    final_.resize(n * d);
    layer_hidden_.resize(n * layers * d);
    logits_.resize(n * v);
    reserved_ = n;
    reserved_layers_ = layers;
  }

  // Room for `count` staged 32-bit input words on the host (pinned) and the device;
  // reallocating invalidates the captured graphs.
  void reserve_inputs(std::size_t count) {
    if (count <= host_inputs_.size()) return;
    graphs_.clear();
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    inputs_.resize(count);
    host_inputs_.reserve(count);
  }

  // Y[n, w.rows] = X[n, w.cols] * W^T + beta Y (row-major; X in the weights' dtype, Y float32).
  void gemm(cuda::device_matrix const& w, void const* x, float* y, std::size_t n, float beta) {
    float const alpha = 1.0f;
    cudaDataType_t const type = cuda::detail::cuda_data_type(weights_->dtype());
    // Row-major Y = X W^T  <=>  column-major Y^T = W^T(op T) X^T; W's rows are w.ld apart.
    SPECDEC_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, w.rows,
                                      static_cast<int>(n), w.cols, &alpha, w.data, type,
                                      static_cast<int>(w.ld), x, type, w.cols, &beta, y, CUDA_R_32F,
                                      w.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // The device addresses of the staged inputs of one forward, and what the launches need to know
  // about them.
  struct staged_inputs {
    std::int32_t const* start;             // [1] cache length before the forward (one sequence)
    std::int32_t const* tokens;            // [n]
    std::int32_t const* positions;         // [n]
    std::int32_t const* rows;              // [rows] logits rows (batch rows)
    std::uint64_t const* mask;             // [n, mask_stride] or null (causal; one sequence)
    std::size_t mask_stride;               // 64-bit words per mask row
    std::size_t words;                     // 32-bit words staged
    std::size_t attention_keys;            // keys the attention's shared memory is sized for
    cuda_kv_cache* cache;                  // the cache of a one-sequence forward (null: segments)
    cuda::detail::segment_table segments;  // the segments of a multi-sequence forward
  };

  // The checks of one request against the cache it is scored with.
  void check_request(forward_request const& req, cuda_kv_cache const& cache) const {
    req.validate(vocab_size(), max_context_, static_cast<std::size_t>(config_.n_layers));
    SPECDEC_CHECK(req.view.empty() && req.kv_scores.kind == kv_score_kind::none, invalid_argument,
                  "cuda_llama::forward: no forward_request::view or kv_scores on the device yet");
    std::size_t const n = req.tokens.size();
    std::size_t const start = cache.size();
    SPECDEC_CHECK(n <= cache.capacity() - start, context_overflow, "cuda_llama::forward: ", n,
                  " tokens do not fit in a cache holding ", start, " of ", cache.capacity());
    std::size_t const words = req.mask.empty() ? 0 : req.mask_stride;
    SPECDEC_CHECK(words <= static_cast<std::size_t>(INT32_MAX) / (2 * n), out_of_range,
                  "cuda_llama::forward: mask stride ", words, " is too large");
  }

  // Runs the forward of one sequence against `cache` on the device; returns the number of logits
  // rows (in logits_). Forwards against the model's own cache may be captured as graphs (a graph
  // holds the cache's addresses).
  std::size_t run(forward_request const& req, cuda_kv_cache& cache) {
    check_request(req, cache);
    std::size_t const n = req.tokens.size();
    std::size_t const start = cache.size();
    std::span<std::int32_t const> const wanted = req.requested_layers();
    std::size_t const rows = req.logits_rows.empty() ? n : req.logits_rows.size();
    std::size_t const words = req.mask.empty() ? 0 : req.mask_stride;
    reserve_batch(std::max(n, rows), std::max<std::size_t>(wanted.size(), 1));
    reserve_inputs(1 + 2 * n + rows + 1 + 2 * n * words);

    // The host staging may still feed the previous forward's copy.
    SPECDEC_CUDA_CHECK(cudaEventSynchronize(inputs_free_));
    bool const fused = fused_for(n, rows);
    bool const captured = fused && options_.graphs && &cache == cache_.get();
    // A launch that may be captured reads the cache length on the device: its shared memory must
    // cover every length.
    staged_inputs const in = stage(req, cache, n, rows, words, captured ? max_context_ : start + n);
    if (captured) {
      cuda::forward_shape shape{.tokens = static_cast<std::int32_t>(n),
                                .rows = static_cast<std::int32_t>(rows),
                                .mask_words = static_cast<std::int32_t>(words),
                                .hidden_layers = {},
                                .want_hidden = req.want_hidden,
                                .skip_layers = {}};
      shape.hidden_layers.assign(wanted.begin(), wanted.end());
      shape.skip_layers.assign(req.skip_layers.begin(), req.skip_layers.end());
      cudaGraphExec_t exec = graphs_.find(shape);
      if (exec == nullptr && graphs_.has_room())
        exec = graphs_.capture(std::move(shape), stream_, [&] { enqueue(req, n, rows, in, true); });
      if (exec != nullptr) {
        SPECDEC_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
      } else {
        enqueue(req, n, rows, in, true);
      }
    } else {
      enqueue(req, n, rows, in, fused);
    }
    SPECDEC_CUDA_CHECK(cudaEventRecord(inputs_free_, stream_));
    cache.commit_append(n);
    return rows;
  }

  // The checks of a forward over segments, all before any change (see that `forward`).
  void check_segments(std::span<cuda_llama_segment const> segments) const {
    SPECDEC_CHECK(!segments.empty(), invalid_argument, "cuda_llama::forward: no segments");
    std::size_t const count = segments.size();
    forward_request const& first = segments[0].request;
    for (std::size_t s = 0; s < count; ++s) {
      cuda_kv_cache const* const c = segments[s].cache;
      forward_request const& req = segments[s].request;
      SPECDEC_CHECK(c != nullptr, invalid_argument, "cuda_llama::forward: segment ", s,
                    " has no cache");
      SPECDEC_CHECK(c->n_layers() == config_.n_layers && c->kv_dim() == config_.kv_dim() &&
                        c->capacity() == max_context_,
                    invalid_argument, "cuda_llama::forward: the cache of segment ", s, " (",
                    c->n_layers(), " layers x ", c->kv_dim(), " floats, ", c->capacity(),
                    " entries) was not made for this model (", config_.n_layers, " layers x ",
                    config_.kv_dim(), " floats, ", max_context_, " entries)");
      for (std::size_t j = 0; j < s; ++j)
        SPECDEC_CHECK(segments[j].cache != c, invalid_argument, "cuda_llama::forward: segments ", j,
                      " and ", s, " score the same cache");
      try {
        check_request(req, *c);
      } catch (error const& e) {
        if (count == 1) throw;
        throw detail::with_context(e, detail::concat("segment ", s, ": "));
      }
      SPECDEC_CHECK(req.same_outputs(first), invalid_argument, "cuda_llama::forward: segment ", s,
                    " asks for other hidden rows or skipped layers than segment 0 (they apply to "
                    "the whole batch)");
    }
  }

  // Runs the forward of several checked segments (`n` tokens in all) on the device: the reference
  // path with the segment kernels. Returns the number of logits rows (in logits_, segment after
  // segment).
  std::size_t run_segments(std::span<cuda_llama_segment const> segments, std::size_t n) {
    std::size_t const count = segments.size();
    forward_request const& first = segments[0].request;
    std::size_t rows = 0, mask_words = 0, longest = 0;
    for (cuda_llama_segment const& seg : segments) {
      forward_request const& r = seg.request;
      std::size_t const ns = r.tokens.size();
      rows += r.logits_rows.empty() ? ns : r.logits_rows.size();
      mask_words += r.mask.empty() ? 0 : ns * r.mask_stride;
      longest = std::max(longest, seg.cache->size() + ns);
    }
    constexpr auto limit = static_cast<std::size_t>(INT32_MAX) / 8;
    SPECDEC_CHECK(n <= limit && rows <= limit && mask_words <= limit, out_of_range,
                  "cuda_llama::forward: a batch of ", n, " tokens, ", rows, " logits rows and ",
                  mask_words, " mask words is too large");
    // Staged: start (unused) | tokens | positions | logits rows | row segment | first | count |
    // cache length | mask offset | mask stride | masks (as 32-bit halves, 8-byte aligned) | the
    // cache planes [layers, segments, 2] (pointers, as 32-bit halves).
    auto const layers = static_cast<std::size_t>(config_.n_layers);
    std::size_t const meta_at = 1 + 2 * n + rows;
    std::size_t const masks_at = (meta_at + n + 5 * count + 1) & ~std::size_t{1};
    std::size_t const planes_at = masks_at + 2 * mask_words;
    std::size_t const words = planes_at + 2 * layers * count * 2;
    reserve_batch(std::max(n, rows), std::max<std::size_t>(first.requested_layers().size(), 1));
    reserve_inputs(words);

    // The host staging may still feed the previous forward's copy.
    SPECDEC_CUDA_CHECK(cudaEventSynchronize(inputs_free_));
    std::int32_t* const host = host_inputs_.data();
    std::int32_t* const meta = host + meta_at;
    host[0] = 0;
    std::size_t row = 0, logits_row = 0, mask_at = 0;
    for (std::size_t s = 0; s < count; ++s) {
      forward_request const& r = segments[s].request;
      std::size_t const ns = r.tokens.size();
      std::copy(r.tokens.begin(), r.tokens.end(), host + 1 + row);
      std::copy(r.positions.begin(), r.positions.end(), host + 1 + n + row);
      std::size_t const want = r.logits_rows.empty() ? ns : r.logits_rows.size();
      for (std::size_t i = 0; i < want; ++i)
        host[1 + 2 * n + logits_row++] =
            static_cast<std::int32_t>(row) +
            (r.logits_rows.empty() ? static_cast<std::int32_t>(i) : r.logits_rows[i]);
      std::fill(meta + row, meta + row + ns, static_cast<std::int32_t>(s));
      std::size_t const stride = r.mask.empty() ? 0 : r.mask_stride;
      meta[n + s] = static_cast<std::int32_t>(row);
      meta[n + count + s] = static_cast<std::int32_t>(ns);
      meta[n + 2 * count + s] = static_cast<std::int32_t>(segments[s].cache->size());
      meta[n + 3 * count + s] = stride == 0 ? -1 : static_cast<std::int32_t>(mask_at);
      meta[n + 4 * count + s] = static_cast<std::int32_t>(stride);
      if (stride != 0)
        std::memcpy(host + masks_at + 2 * mask_at, r.mask.data(),
                    ns * stride * sizeof(std::uint64_t));
      mask_at += ns * stride;
      row += ns;
    }
    for (std::size_t l = 0; l < layers; ++l)
      for (std::size_t s = 0; s < count; ++s) {
        auto const layer = static_cast<std::int32_t>(l);
        float* const planes[2] = {segments[s].cache->keys(layer), segments[s].cache->values(layer)};
        std::memcpy(host + planes_at + 2 * (l * count + s) * 2, planes, sizeof(planes));
      }

    std::int32_t const* d = inputs_.data();
    cuda::detail::segment_table const table{
        .row_segment = d + meta_at,
        .first = d + meta_at + n,
        .count = d + meta_at + n + count,
        .cache_len = d + meta_at + n + 2 * count,
        .mask_offset = d + meta_at + n + 3 * count,
        .mask_stride = d + meta_at + n + 4 * count,
        .masks = mask_words != 0 ? reinterpret_cast<std::uint64_t const*>(d + masks_at) : nullptr,
        .planes = reinterpret_cast<float* const*>(d + planes_at),
        .segments = static_cast<std::int32_t>(count)};
    staged_inputs const in{.start = d,
                           .tokens = d + 1,
                           .positions = d + 1 + n,
                           .rows = d + 1 + 2 * n,
                           .mask = nullptr,
                           .mask_stride = 0,
                           .words = words,
                           .attention_keys = longest,
                           .cache = nullptr,
                           .segments = table};
    enqueue(first, n, rows, in, false);
    SPECDEC_CUDA_CHECK(cudaEventRecord(inputs_free_, stream_));
    for (cuda_llama_segment const& seg : segments)
      seg.cache->commit_append(seg.request.tokens.size());
    return rows;
  }

  // Writes start | tokens | positions | logits rows | mask (as 32-bit halves, 8-byte aligned)
  // into the pinned staging buffer.
  staged_inputs stage(forward_request const& req, cuda_kv_cache& cache, std::size_t n,
                      std::size_t rows, std::size_t words, std::size_t attention_keys) {
    std::int32_t* host = host_inputs_.data();
    host[0] = static_cast<std::int32_t>(cache.size());
    std::copy(req.tokens.begin(), req.tokens.end(), host + 1);
    std::copy(req.positions.begin(), req.positions.end(), host + 1 + n);
    for (std::size_t r = 0; r < rows; ++r)
      host[1 + 2 * n + r] =
          req.logits_rows.empty() ? static_cast<std::int32_t>(r) : req.logits_rows[r];
    std::size_t staged = 1 + 2 * n + rows;
    std::size_t mask_at = 0;
    if (words != 0) {
      mask_at = (staged + 1) & ~std::size_t{1};
      std::memcpy(host + mask_at, req.mask.data(), n * words * sizeof(std::uint64_t));
      staged = mask_at + 2 * n * words;
    }
    std::int32_t const* d = inputs_.data();
    return staged_inputs{d,
                         d + 1,
                         d + 1 + n,
                         d + 1 + 2 * n,
                         words != 0 ? reinterpret_cast<std::uint64_t const*>(d + mask_at) : nullptr,
                         words,
                         staged,
                         attention_keys,
                         &cache,
                         {}};
  }

  // Enqueues the whole forward on the stream (directly, or into a graph being captured): the
  // upload of the staged inputs, then the fused or the reference launches.
  void enqueue(forward_request const& req, std::size_t n, std::size_t rows, staged_inputs const& in,
               bool fused) {
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(inputs_.data(), host_inputs_.data(),
                                       in.words * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                                       stream_));
    cuda::detail::with_dtype(weights_->dtype(), [&]<class W>(W) {
      if (fused)
        enqueue_fused<W>(req, n, rows, in);
      else
        enqueue_reference<W>(req, n, rows, in);
    });
    cuda::throw_if_failed(cuda::last_launch_status("cuda_llama::forward: kernel launch"),
                          "cuda_llama::forward");
  }

  // The embedding of the batch tokens into x_ (float32).
  template <class W>
  void embed(std::size_t n, staged_inputs const& in) {
    cuda::device_matrix const& e = weights_->embedding();
    cuda::detail::embed_kernel<W>
        <<<static_cast<unsigned>(n), cuda::detail::block_threads, 0, stream_>>>(
            static_cast<W const*>(e.data), e.ld, in.tokens, x_.data(), config_.dim);
  }

  // The reference path (see the file comment); products take inputs of type T.
  template <class T>
  void enqueue_reference(forward_request const& req, std::size_t n, std::size_t rows,
                         staged_inputs const& in) {
    auto const d = static_cast<std::size_t>(config_.dim);
    auto const hd = static_cast<std::size_t>(config_.hidden_dim);
    auto const kv = static_cast<std::size_t>(config_.kv_dim());
    std::size_t const qkv_stride = d + 2 * kv;
    auto const ni = static_cast<unsigned>(n);
    auto const idim = static_cast<std::int32_t>(d);
    auto const ikv = static_cast<std::int32_t>(kv);
    T* const xb = reinterpret_cast<T*>(xb_.data());
    T* const att = reinterpret_cast<T*>(att_.data());
    T* const hb = reinterpret_cast<T*>(hb_.data());
    constexpr unsigned threads = cuda::detail::block_threads;

    embed<T>(n, in);
    std::size_t skip_at = 0;
    for (std::int32_t layer = 0; layer < config_.n_layers; ++layer) {
      if (skip_at < req.skip_layers.size() && req.skip_layers[skip_at] == layer) {
        ++skip_at;
      } else {
        auto const& l = weights_->at(static_cast<std::size_t>(layer));
        cuda::detail::rmsnorm_kernel<T>
            <<<ni, threads, 0, stream_>>>(x_.data(), nullptr, l.rms_att, xb, idim, config_.rms_eps);
        gemm(l.qkv, xb, qkv_.data(), n, 0.0f);
        cuda::detail::rope_kernel<<<ni, threads, 0, stream_>>>(
            qkv_.data(), in.positions, static_cast<std::int32_t>(qkv_stride), idim, ikv,
            config_.head_size(), config_.rope_theta);
        append_and_attend<T>(layer, n, in, att);
        gemm(l.wo, att, x_.data(), n, 1.0f);  // x += att Wo^T
        cuda::detail::rmsnorm_kernel<T>
            <<<ni, threads, 0, stream_>>>(x_.data(), nullptr, l.rms_ffn, xb, idim, config_.rms_eps);
        gemm(l.w13, xb, gu_.data(), n, 0.0f);
        auto const total = static_cast<std::int64_t>(n * hd);
        auto const blocks =
            static_cast<unsigned>(std::min<std::int64_t>((total + threads - 1) / threads, 4096));
        cuda::detail::swiglu_kernel<T>
            <<<blocks, threads, 0, stream_>>>(gu_.data(), hb, static_cast<std::int32_t>(hd), total);
        gemm(l.w2, hb, x_.data(), n, 1.0f);  // x += h W2^T
      }
      copy_layer_hidden(req, layer, n);
    }
    if (req.want_hidden)
      cuda::detail::rmsnorm_kernel<float><<<ni, threads, 0, stream_>>>(
          x_.data(), nullptr, weights_->rms_final(), final_.data(), idim, config_.rms_eps);
    cuda::detail::rmsnorm_kernel<T><<<static_cast<unsigned>(rows), threads, 0, stream_>>>(
        x_.data(), in.rows, weights_->rms_final(), xb, idim, config_.rms_eps);
    gemm(weights_->classifier(), xb, logits_.data(), rows, 0.0f);
  }

  // The fused path (see the file comment and fused.cuh); weights of type W.
  template <class W>
  void enqueue_fused(forward_request const& req, std::size_t n, std::size_t rows,
                     staged_inputs const& in) {
    auto const d = static_cast<std::int64_t>(config_.dim);
    auto const hd = static_cast<std::int64_t>(config_.hidden_dim);
    auto const kv = static_cast<std::int64_t>(config_.kv_dim());
    float* const att = reinterpret_cast<float*>(att_.data());
    float* const hb = reinterpret_cast<float*>(hb_.data());
    auto const tokens = static_cast<std::int32_t>(n);
    auto const check = [](cuda::launch_status s) {
      cuda::throw_if_failed(s, "cuda_llama::forward (fused)");
    };

    embed<W>(n, in);
    std::size_t skip_at = 0;
    for (std::int32_t layer = 0; layer < config_.n_layers; ++layer) {
      if (skip_at < req.skip_layers.size() && req.skip_layers[skip_at] == layer) {
        ++skip_at;
      } else {
        auto const& l = weights_->at(static_cast<std::size_t>(layer));
        cuda::matvec_params qkv{.w = l.qkv,
                                .x = x_.data(),
                                .x_stride = d,
                                .n = tokens,
                                .norm = l.rms_att,
                                .eps = config_.rms_eps,
                                .y = qkv_.data(),
                                .y_stride = d + 2 * kv,
                                .positions = in.positions,
                                .base = in.start,
                                .keys = in.cache->keys(layer),
                                .values = in.cache->values(layer),
                                .dim = config_.dim,
                                .kv_dim = config_.kv_dim(),
                                .head_size = config_.head_size(),
                                .theta = config_.rope_theta};
        check(cuda::launch_matvec<W, cuda::matvec_out::rope_append>(qkv, stream_));
        attention<float>(layer, n, in, att);
        check(cuda::launch_matvec<W, cuda::matvec_out::add>(
            {.w = l.wo, .x = att, .x_stride = d, .n = tokens, .y = x_.data(), .y_stride = d},
            stream_));
        check(cuda::launch_matvec<W, cuda::matvec_out::swiglu>({.w = l.w13,
                                                                .x = x_.data(),
                                                                .x_stride = d,
                                                                .n = tokens,
                                                                .norm = l.rms_ffn,
                                                                .eps = config_.rms_eps,
                                                                .y = hb,
                                                                .y_stride = hd,
                                                                .hidden = config_.hidden_dim},
                                                               stream_));
        check(cuda::launch_matvec<W, cuda::matvec_out::add>(
            {.w = l.w2, .x = hb, .x_stride = hd, .n = tokens, .y = x_.data(), .y_stride = d},
            stream_));
      }
      copy_layer_hidden(req, layer, n);
    }
    if (req.want_hidden)
      cuda::detail::rmsnorm_kernel<float>
          <<<static_cast<unsigned>(n), cuda::detail::block_threads, 0, stream_>>>(
              x_.data(), nullptr, weights_->rms_final(), final_.data(), config_.dim,
              config_.rms_eps);
    check(cuda::launch_matvec<W, cuda::matvec_out::store>(
        {.w = weights_->classifier(),
         .x = x_.data(),
         .x_stride = d,
         .x_rows = in.rows,
         .n = static_cast<std::int32_t>(rows),
         .norm = weights_->rms_final(),
         .eps = config_.rms_eps,
         .y = logits_.data(),
         .y_stride = static_cast<std::int64_t>(vocab_size())},
        stream_));
  }

  // The attention of `layer` over the cache and the batch (one sequence), heads' outputs written
  // as T.
  template <class T>
  void attention(std::int32_t layer, std::size_t n, staged_inputs const& in, T* out) {
    cuda::detail::attention_kernel<T>
        <<<dim3(static_cast<unsigned>(config_.n_heads), static_cast<unsigned>(n)),
           cuda::detail::attention_threads, attention_smem(in.attention_keys), stream_>>>(
            qkv_.data(), config_.dim + 2 * config_.kv_dim(), in.cache->keys(layer),
            in.cache->values(layer), in.start, static_cast<std::int32_t>(n), -1, in.mask,
            static_cast<std::int32_t>(in.mask_stride), out, config_.dim, config_.kv_dim(),
            config_.head_size(), config_.n_heads / config_.n_kv_heads);
  }

  // The reference path's step of `layer` between the q|k|v product (RoPE applied) and the output
  // projection: the batch's keys and values appended to the cache, then attention, heads' outputs
  // written as T. One sequence: `kv_append_kernel` and `attention_kernel` against in.cache;
  // several segments: their twins reading the segment table, each row against its own cache.
  template <class T>
  void append_and_attend(std::int32_t layer, std::size_t n, staged_inputs const& in, T* out) {
    auto const ni = static_cast<unsigned>(n);
    auto const qkv_stride = config_.dim + 2 * config_.kv_dim();
    if (in.segments.segments == 0) {
      cuda::detail::kv_append_kernel<<<ni, cuda::detail::block_threads, 0, stream_>>>(
          qkv_.data(), qkv_stride, config_.dim, config_.kv_dim(), in.cache->keys(layer),
          in.cache->values(layer), in.start);
      attention<T>(layer, n, in, out);
      return;
    }
    cuda::detail::segment_kv_append_kernel<<<ni, cuda::detail::block_threads, 0, stream_>>>(
        qkv_.data(), qkv_stride, config_.dim, config_.kv_dim(), in.segments, layer);
    cuda::detail::segment_attention_kernel<T>
        <<<dim3(static_cast<unsigned>(config_.n_heads), ni), cuda::detail::attention_threads,
           attention_smem(in.attention_keys), stream_>>>(
            qkv_.data(), qkv_stride, in.segments, layer, out, config_.dim, config_.kv_dim(),
            config_.head_size(), config_.n_heads / config_.n_kv_heads);
  }

  // The requested layers' residual streams, side by side per token.
  void copy_layer_hidden(forward_request const& req, std::int32_t layer, std::size_t n) {
    std::span<std::int32_t const> const wanted = req.requested_layers();
    auto const d = static_cast<std::size_t>(config_.dim);
    for (std::size_t j = 0; j < wanted.size(); ++j)
      if (wanted[j] == layer)
        SPECDEC_CUDA_CHECK(cudaMemcpy2DAsync(
            layer_hidden_.data() + j * d, wanted.size() * d * sizeof(float), x_.data(),
            d * sizeof(float), d * sizeof(float), n, cudaMemcpyDeviceToDevice, stream_));
  }

  void destroy() noexcept {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    graphs_.clear();
    host_inputs_.release();
    host_outputs_.release();
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    cublas_ = nullptr;
    if (inputs_free_ != nullptr) cudaEventDestroy(inputs_free_);
    inputs_free_ = nullptr;
    if (stream_ != nullptr) {
      cache_.reset();
      weights_.reset();
      cudaStreamDestroy(stream_);
    }
    stream_ = nullptr;
  }

  llama_config config_;
  cuda_llama_options options_;
  std::size_t max_context_ = 0;
  bool fused_ok_ = false;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_free_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<cuda::llama_device_weights> weights_;
  std::unique_ptr<cuda_kv_cache> cache_;
  cuda::graph_cache graphs_;
  std::size_t reserved_ = 0;
  std::size_t reserved_layers_ = 0;
  cuda::device_buffer<float> x_, qkv_, gu_, final_, layer_hidden_, logits_;
  // Inputs of the products (float32, or the weights' dtype on the reference path).
  cuda::device_buffer<std::byte> xb_, att_, hb_;
  cuda::device_buffer<std::int32_t> inputs_;
  cuda::pinned_buffer<std::int32_t> host_inputs_;
  cuda::pinned_buffer<float> host_outputs_;
};

#endif  // __CUDACC__

}  // namespace specdec