#pragma once
//! \file
//! `cpu_llama`: the Llama forward pass on the CPU (Eigen and register-tiled kernels), with tree
//! attention over a contiguous KV cache. Satisfies `causal_lm`.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "specdec/backend/cpu/kernels.hpp"
#include "specdec/backend/cpu/thread_pool.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/types.hpp"
#include "specdec/kv/contiguous_cache.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec {

//! Options of a `cpu_llama`.
struct cpu_llama_options {
  //! Threads for the matrix products and attention (the calling thread included).
  std::size_t threads = 2;
  //! Positions the KV cache holds and the largest position + 1 accepted; 0 = the model's seq_len.
  std::size_t max_context = 0;
  //! Batch rows the activation buffers are sized for at construction; larger batches grow them
  //! once (the only allocation a forward may do).
  std::size_t batch_capacity = 64;
  //! The thread pool; null = the process-wide pool of `threads` threads
  //! (`thread_pool::shared`), which every model with the same thread count uses in turn. When
  //! given, its size overrides `threads`.
  std::shared_ptr<thread_pool> pool = nullptr;
};

//! A Llama-architecture causal language model on the CPU: RMSNorm, RoPE (interleaved pairs),
//! grouped-query attention, SwiGLU, tied or untied classifier, all float32.
//!
//! `forward` scores a batch of tokens against its own `contiguous_cache` with the request's
//! visibility mask (tree attention) and appends the batch's keys and values to the cache in batch
//! order. The weights are shared (read-only) and can back several models, each with its own
//! cache; for example a self-speculative draft that skips layers. One forward at a time per model;
//! after the first forward of a given batch size a forward does not allocate.
class cpu_llama {
 public:
  //! A model over `weights` (which must outlive nothing: the model shares ownership). Throws
  //! `errc::invalid_argument` for null weights, missing tensors or bad options, and
  //! `errc::bad_file` for an inconsistent configuration.
  explicit cpu_llama(std::shared_ptr<llama_weights const> weights, cpu_llama_options options = {})
      : weights_(std::move(weights)) {
    SPECDEC_CHECK(weights_ != nullptr, invalid_argument, "cpu_llama: null weights");
    llama_config const& c = weights_->config;
    c.validate("cpu_llama");
    check_weights();
    dim_ = static_cast<std::size_t>(c.dim);
    hidden_dim_ = static_cast<std::size_t>(c.hidden_dim);
    n_layers_ = static_cast<std::size_t>(c.n_layers);
    n_heads_ = static_cast<std::size_t>(c.n_heads);
    n_kv_heads_ = static_cast<std::size_t>(c.n_kv_heads);
    head_size_ = static_cast<std::size_t>(c.head_size());
    kv_dim_ = static_cast<std::size_t>(c.kv_dim());
    vocab_ = static_cast<std::size_t>(c.vocab_size);
    max_context_ =
        options.max_context == 0 ? static_cast<std::size_t>(c.seq_len) : options.max_context;
    SPECDEC_CHECK(max_context_ <= (std::size_t{1} << 24), invalid_argument,
                  "cpu_llama: max_context ", max_context_, " is beyond 2^24");
    if (options.pool != nullptr) {
      pool_ = std::move(options.pool);
    } else {
      SPECDEC_CHECK(options.threads >= 1 && options.threads <= 1024, invalid_argument,
                    "cpu_llama: threads is ", options.threads, ", need 1 to 1024");
      pool_ = thread_pool::shared(options.threads);
    }
    cache_ = contiguous_cache(n_layers_, kv_dim_, max_context_);

    // RoPE angles, [max_context, head_size / 2] (cos, sin) pairs, computed in double.
    rope_.resize(max_context_ * head_size_);
    double const theta = static_cast<double>(c.rope_theta);
    for (std::size_t p = 0; p < max_context_; ++p) {
      for (std::size_t i = 0; i < head_size_; i += 2) {
        double const freq =
            std::pow(theta, -static_cast<double>(i) / static_cast<double>(head_size_));
        double const angle = static_cast<double>(p) * freq;
        rope_[p * head_size_ + i] = static_cast<float>(std::cos(angle));
        rope_[p * head_size_ + i + 1] = static_cast<float>(std::sin(angle));
      }
    }
    scores_.resize(pool_->size() * max_context_);
    grow(std::max<std::size_t>(1, options.batch_capacity));
  }

  cpu_llama(cpu_llama&&) noexcept = default;
  cpu_llama& operator=(cpu_llama&&) noexcept = default;
  cpu_llama(cpu_llama const&) = delete;
  cpu_llama& operator=(cpu_llama const&) = delete;
  ~cpu_llama() = default;

  //! Vocabulary size (logits per row).
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_; }
  //! Positions the cache holds; every request position must be below it.
  [[nodiscard]] std::size_t max_context() const noexcept { return max_context_; }
  //! Width of the residual stream (hidden rows).
  [[nodiscard]] std::size_t hidden_size() const noexcept { return dim_; }
  //! Number of transformer layers.
  [[nodiscard]] std::size_t n_layers() const noexcept { return n_layers_; }
  //! Threads used by a forward.
  [[nodiscard]] std::size_t threads() const noexcept { return pool_->size(); }
  //! The model's hyper-parameters.
  [[nodiscard]] llama_config const& config() const noexcept { return weights_->config; }
  //! The shared weights.
  [[nodiscard]] std::shared_ptr<llama_weights const> const& weights() const noexcept {
    return weights_;
  }
  //! The thread pool (shareable with another model through `cpu_llama_options::pool`).
  [[nodiscard]] std::shared_ptr<thread_pool> const& pool() const noexcept { return pool_; }

  //! The KV cache: truncate / keep_path it to commit speculation.
  [[nodiscard]] contiguous_cache& cache() noexcept { return cache_; }
  //! The KV cache, read-only.
  [[nodiscard]] contiguous_cache const& cache() const noexcept { return cache_; }
  //! Empties the cache (a new sequence).
  void reset() noexcept { cache_.clear(); }

  //! Scores `req` against the cache, appends the batch's keys and values to it, and fills `out`
  //! (see `forward_request`, `forward_result`). Throws `specdec::error`, leaving the cache and
  //! `out` untouched, for a malformed request (`forward_request::validate`; a mask row that does
  //! not let a token see itself; hidden_layer or skip_layers outside the model's layers) and
  //! `errc::context_overflow` when the cache cannot take the batch.
  void forward(forward_request const& req, forward_result& out) {
    validate(req);
    std::size_t const n = req.tokens.size();
    if (n > batch_capacity_) grow(n);
    std::size_t const m = req.logits_rows.empty() ? n : req.logits_rows.size();
    out.vocab = vocab_;
    out.hidden_size = dim_;
    out.logits.resize(m * vocab_);
    out.hidden.resize(req.want_hidden ? n * dim_ : 0);
    out.layer_hidden.resize(req.hidden_layer >= 0 ? n * dim_ : 0);
    out.logits_count = m;
    std::size_t const past = cache_.append(n);  // throws context_overflow before any change
    run(req, past, out);
  }

 private:
  void check_weights() const {
    llama_weights const& w = *weights_;
    SPECDEC_CHECK(w.token_embedding != nullptr && w.rms_final != nullptr && w.classifier != nullptr,
                  invalid_argument, "cpu_llama: missing embedding, final norm or classifier");
    SPECDEC_CHECK(w.layers.size() == static_cast<std::size_t>(w.config.n_layers), invalid_argument,
                  "cpu_llama: ", w.layers.size(), " layer weights for ", w.config.n_layers,
                  " layers");
    for (std::size_t l = 0; l < w.layers.size(); ++l) {
      llama_layer_weights const& lw = w.layers[l];
      SPECDEC_CHECK(
          lw.rms_att && lw.wq && lw.wk && lw.wv && lw.wo && lw.rms_ffn && lw.w1 && lw.w2 && lw.w3,
          invalid_argument, "cpu_llama: layer ", l, " misses a tensor");
    }
  }

  void validate(forward_request const& req) const {
    req.validate(vocab_, max_context_);
    std::size_t const n = req.tokens.size();
    SPECDEC_CHECK(n <= cache_.room(), context_overflow, "cpu_llama::forward: a batch of ", n,
                  " tokens does not fit the cache (", cache_.size(), " of ", cache_.capacity(),
                  " positions used)");
    SPECDEC_CHECK(req.hidden_layer >= -1 && req.hidden_layer < static_cast<std::int32_t>(n_layers_),
                  out_of_range, "cpu_llama::forward: hidden_layer ", req.hidden_layer,
                  " is outside the model's ", n_layers_, " layers");
    for (std::int32_t l : req.skip_layers)
      SPECDEC_CHECK(l >= 0 && l < static_cast<std::int32_t>(n_layers_), out_of_range,
                    "cpu_llama::forward: skip layer ", l, " is outside the model's ", n_layers_,
                    " layers");
    if (!req.mask.empty()) {
      for (std::size_t i = 0; i < n; ++i)
        SPECDEC_CHECK(req.visible(i, i), invalid_argument, "cpu_llama::forward: mask row ", i,
                      " does not let token ", i, " see itself");
    }
  }

  // Grows the per-batch buffers to `n` rows (allocates; never called once large enough).
  void grow(std::size_t n) {
    x_.resize(n * dim_);
    xb_.resize(n * dim_);
    q_.resize(n * dim_);
    att_.resize(n * dim_);
    hb_.resize(n * hidden_dim_);
    hb2_.resize(n * hidden_dim_);
    gather_.resize(n * dim_);
    visible_end_.resize(n);
    batch_capacity_ = n;
  }

  // Runs `f(begin, end)` over [0, rows) split in `grain`-aligned chunks across the pool, or on
  // this thread alone when the work (multiply-adds) is too small to pay for the hand-off.
  template <class F>
  void split_rows(std::size_t rows, std::size_t grain, std::size_t work, F&& f) noexcept {
    constexpr std::size_t min_parallel_work = std::size_t{1} << 15;
    if (pool_->size() == 1 || work < min_parallel_work) {
      f(std::size_t{0}, rows);
    } else {
      pool_->parallel_for(rows, grain, f);
    }
  }

  void run(forward_request const& req, std::size_t past, forward_result& out) noexcept {
    namespace k = detail::cpu;
    llama_weights const& w = *weights_;
    float const eps = w.config.rms_eps;
    std::size_t const n = req.tokens.size();

    // Embeddings.
    for (std::size_t t = 0; t < n; ++t)
      std::memcpy(x_.data() + t * dim_,
                  w.token_embedding + static_cast<std::size_t>(req.tokens[t]) * dim_,
                  dim_ * sizeof(float));
    // Per token, one past the last batch token it sees (attention skips the rows after it).
    for (std::size_t t = 0; t < n; ++t) visible_end_[t] = last_visible(req, t) + 1;

    std::size_t skip_at = 0;
    for (std::size_t l = 0; l < n_layers_; ++l) {
      bool skip = false;
      if (skip_at < req.skip_layers.size() &&
          static_cast<std::size_t>(req.skip_layers[skip_at]) == l) {
        skip = true;
        ++skip_at;
      }
      if (!skip) layer(l, req, past);
      if (static_cast<std::int32_t>(l) == req.hidden_layer)
        std::memcpy(out.layer_hidden.data(), x_.data(), n * dim_ * sizeof(float));
    }

    // Final norm, hidden rows, classifier rows.
    for (std::size_t t = 0; t < n; ++t)
      k::rmsnorm(xb_.data() + t * dim_, x_.data() + t * dim_, w.rms_final, dim_, eps);
    if (req.want_hidden) std::memcpy(out.hidden.data(), xb_.data(), n * dim_ * sizeof(float));
    float const* rows = xb_.data();
    std::size_t m = n;
    if (!req.logits_rows.empty()) {
      m = req.logits_rows.size();
      for (std::size_t i = 0; i < m; ++i)
        std::memcpy(gather_.data() + i * dim_,
                    xb_.data() + static_cast<std::size_t>(req.logits_rows[i]) * dim_,
                    dim_ * sizeof(float));
      rows = gather_.data();
    }
    float* const logits = out.logits.data();
    split_rows(vocab_, k::tile_rows, vocab_ * dim_ * m, [&](std::size_t r0, std::size_t r1) {
      k::gemm_nt(w.classifier, dim_, r0, r1, rows, dim_, m, dim_, logits, vocab_, false);
    });
  }

  // The index of the last batch token that token t sees.
  static std::size_t last_visible(forward_request const& req, std::size_t t) noexcept {
    if (req.mask.empty()) return t;
    std::size_t const n = req.tokens.size();
    std::uint64_t const* row = req.mask.data() + t * req.mask_stride;
    for (std::size_t word = mask_words(n); word-- > 0;) {
      std::uint64_t bits = row[word];
      if (word == n / 64 && n % 64 != 0) bits &= (std::uint64_t{1} << (n % 64)) - 1;
      if (bits != 0) return word * 64 + 63 - static_cast<std::size_t>(std::countl_zero(bits));
    }
    return t;  // unreachable: validate() ensures the token sees itself
  }

  void layer(std::size_t l, forward_request const& req, std::size_t past) noexcept {
    namespace k = detail::cpu;
    llama_layer_weights const& lw = weights_->layers[l];
    float const eps = weights_->config.rms_eps;
    std::size_t const n = req.tokens.size();
    float* const kc = cache_.keys(l);
    float* const vc = cache_.values(l);

    // Attention block: norm, q/k/v projections (k and v straight into the cache rows).
    for (std::size_t t = 0; t < n; ++t)
      k::rmsnorm(xb_.data() + t * dim_, x_.data() + t * dim_, lw.rms_att, dim_, eps);
    std::size_t const qkv_rows = dim_ + 2 * kv_dim_;
    split_rows(qkv_rows, k::tile_rows, qkv_rows * dim_ * n, [&](std::size_t r0, std::size_t r1) {
      auto segment = [&](float const* wt, std::size_t first, std::size_t count, float* y,
                         std::size_t ldy) {
        std::size_t const b = std::max(r0, first), e = std::min(r1, first + count);
        if (b < e)
          k::gemm_nt(wt, dim_, b - first, e - first, xb_.data(), dim_, n, dim_, y, ldy, false);
      };
      segment(lw.wq, 0, dim_, q_.data(), dim_);
      segment(lw.wk, dim_, kv_dim_, kc + past * kv_dim_, kv_dim_);
      segment(lw.wv, dim_ + kv_dim_, kv_dim_, vc + past * kv_dim_, kv_dim_);
    });
    for (std::size_t t = 0; t < n; ++t) {
      float const* const cs =
          rope_.data() + static_cast<std::size_t>(req.positions[t]) * head_size_;
      k::rope(q_.data() + t * dim_, n_heads_, head_size_, cs);
      k::rope(kc + (past + t) * kv_dim_, n_kv_heads_, head_size_, cs);
    }

    // Attention over the cache and the visible batch tokens, one task per (head, token).
    std::size_t const tasks = n * n_heads_;
    std::size_t const ctx_work = (past + n) * head_size_ * 2;
    pool_task_split(tasks, tasks * ctx_work, [&](std::size_t thread, std::size_t b, std::size_t e) {
      float* const scores = scores_.data() + thread * max_context_;
      for (std::size_t task = b; task < e; ++task) attend(task, req, past, kc, vc, scores);
    });

    // Output projection, added to the residual stream.
    split_rows(dim_, k::tile_rows, dim_ * dim_ * n, [&](std::size_t r0, std::size_t r1) {
      k::gemm_nt(lw.wo, dim_, r0, r1, att_.data(), dim_, n, dim_, x_.data(), dim_, true);
    });

    // Feed-forward block: norm, gate and up projections with SwiGLU, down projection added.
    for (std::size_t t = 0; t < n; ++t)
      k::rmsnorm(xb_.data() + t * dim_, x_.data() + t * dim_, lw.rms_ffn, dim_, eps);
    split_rows(hidden_dim_, k::tile_rows, 2 * hidden_dim_ * dim_ * n,
               [&](std::size_t r0, std::size_t r1) {
                 k::gemm_nt(lw.w1, dim_, r0, r1, xb_.data(), dim_, n, dim_, hb_.data(), hidden_dim_,
                            false);
                 k::gemm_nt(lw.w3, dim_, r0, r1, xb_.data(), dim_, n, dim_, hb2_.data(),
                            hidden_dim_, false);
                 for (std::size_t t = 0; t < n; ++t)
                   k::swiglu(hb_.data() + t * hidden_dim_ + r0, hb2_.data() + t * hidden_dim_ + r0,
                             r1 - r0);
               });
    split_rows(dim_, k::tile_rows, dim_ * hidden_dim_ * n, [&](std::size_t r0, std::size_t r1) {
      k::gemm_nt(lw.w2, hidden_dim_, r0, r1, hb_.data(), hidden_dim_, n, hidden_dim_, x_.data(),
                 dim_, true);
    });
  }

  // Splits `tasks` evenly over the pool (or runs them here when the work is small); f(thread,
  // begin, end).
  template <class F>
  void pool_task_split(std::size_t tasks, std::size_t work, F&& f) noexcept {
    constexpr std::size_t min_parallel_work = std::size_t{1} << 15;
    std::size_t const threads = pool_->size();
    if (threads == 1 || work < min_parallel_work || tasks == 1) {
      f(std::size_t{0}, std::size_t{0}, tasks);
      return;
    }
    pool_->run([&](std::size_t t) {
      std::size_t const b = tasks * t / threads, e = tasks * (t + 1) / threads;
      if (b < e) f(t, b, e);
    });
  }

  // Attention of head h = task / n, batch token t = task % n: softmax(q K^T / sqrt(d)) V over cache
  // rows [0, past) and the batch rows the token sees. Head-major order keeps one head's keys and
  // values hot in cache across the batch.
  void attend(std::size_t task, forward_request const& req, std::size_t past, float const* kc,
              float const* vc, float* scores) noexcept {
    namespace k = detail::cpu;
    std::size_t const n = req.tokens.size();
    std::size_t const h = task / n;
    std::size_t const t = task % n;
    std::size_t const kv_off = (h / (n_heads_ / n_kv_heads_)) * head_size_;
    std::size_t const end = past + visible_end_[t];  // rows [0, end) may be visible
    float const scale = 1.0f / std::sqrt(static_cast<float>(head_size_));
    float* const out = att_.data() + t * dim_ + h * head_size_;
    k::attention_scores(q_.data() + t * dim_ + h * head_size_, kc + kv_off, kv_dim_, end,
                        head_size_, scale, scores);
    bool const masked = !req.mask.empty() || visible_end_[t] != t + 1;
    if (masked) {
      for (std::size_t j = past; j < end; ++j)
        if (!req.visible(t, j - past)) scores[j] = -std::numeric_limits<float>::infinity();
    }
    k::softmax_exp(scores, end);
    k::attention_values(scores, vc + kv_off, kv_dim_, end, head_size_, out);
    // The denominator over the visible entries packed together, so that it is summed exactly as
    // when the same tokens sit at consecutive positions (a token's logits do not depend on the
    // batch it is scored in).
    std::size_t count = end;
    if (masked) {
      count = past;
      for (std::size_t j = past; j < end; ++j)
        if (req.visible(t, j - past)) scores[count++] = scores[j];
    }
    float const inv = 1.0f / k::lane_sum(scores, count);
    for (std::size_t d = 0; d < head_size_; ++d) out[d] *= inv;
  }

  std::shared_ptr<llama_weights const> weights_;
  std::shared_ptr<thread_pool> pool_;
  contiguous_cache cache_;
  std::size_t dim_ = 0, hidden_dim_ = 0, n_layers_ = 0, n_heads_ = 0, n_kv_heads_ = 0;
  std::size_t head_size_ = 0, kv_dim_ = 0, vocab_ = 0, max_context_ = 0;
  std::size_t batch_capacity_ = 0;
  std::vector<float> rope_;               // [max_context, head_size]: (cos, sin) per pair
  std::vector<float> scores_;             // [threads, max_context] attention scratch
  std::vector<float> x_;                  // [batch, dim] residual stream
  std::vector<float> xb_;                 // [batch, dim] normed input
  std::vector<float> q_;                  // [batch, dim] queries
  std::vector<float> att_;                // [batch, dim] attention output
  std::vector<float> hb_;                 // [batch, hidden_dim] gate, then SwiGLU
  std::vector<float> hb2_;                // [batch, hidden_dim] up
  std::vector<float> gather_;             // [batch, dim] rows that need logits
  std::vector<std::size_t> visible_end_;  // [batch]
};

}  // namespace specdec
