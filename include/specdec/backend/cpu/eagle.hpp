#pragma once
//! \file
//! `cpu_eagle_head`: the EAGLE head's forward on the CPU (model/eagle.hpp gives the computation),
//! the head runner that propose/eagle.hpp drives through its concept. It keeps the head's own KV
//! cache (a one-layer `contiguous_cache`) and appends a batch of rows per call, each attending to
//! the entries its visibility mask allows (a draft tree's rows see the committed entries and their
//! ancestors), so that EAGLE-2 expands all the chosen nodes of one depth in one call.
//!
//! The kernels are the CPU backend's own: the products are `gemm_nt` over the thread pool (through
//! `detail::cpu::heads_products`, as the Medusa and Hydra runners), RMSNorm, RoPE (the same table
//! as `cpu_llama`'s) and SwiGLU, attention over a virtual sequence of cache entries
//! (`attend_heads`, what `cpu_llama` runs for heads of any size), all of the CPU target active when
//! the head is built (backend/cpu/kernels.hpp). Each
//! output is computed by a fixed sequence of operations that depends only on the shapes and on
//! the entries the row sees, never on the batch, the cache layout or the thread count: a row's
//! output is the same whether its entries were appended in one call or in many, which is what
//! lets the proposer roll the cache back and extend it step by step.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "specdec/backend/cpu/attention.hpp"
#include "specdec/backend/cpu/elementwise.hpp"
#include "specdec/backend/cpu/heads.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"
#include "specdec/kv/contiguous_cache.hpp"
#include "specdec/model/eagle.hpp"

namespace specdec {

//! Options of a `cpu_eagle_head`.
struct cpu_eagle_options {
  //! Threads for the products (the calling thread included).
  std::size_t threads = 1;
  //! The thread pool; null = the process-wide pool of `threads` threads (`thread_pool::shared`),
  //! which a `cpu_llama` of the same thread count also uses. When given, its size overrides
  //! `threads`.
  std::shared_ptr<thread_pool> pool = nullptr;
  //! Entries the head's cache can hold and the largest position + 1 accepted; 0 = the target's
  //! seq_len.
  std::size_t max_context = 0;
};

//! An EAGLE head on the CPU: `forward` appends a batch of rows to the head's KV cache and writes
//! their outputs (the layer's output, before any final norm); `logits` maps outputs to logits over
//! the draft vocabulary. An `eagle_head_runner` (propose/eagle.hpp). One call at a time; once the
//! batch size and the positions in use have been seen, no call allocates.
class cpu_eagle_head {
 public:
  //! A runner over `weights` (shared, read-only). Throws `errc::invalid_argument` for null or
  //! incomplete weights and bad options.
  explicit cpu_eagle_head(std::shared_ptr<eagle_weights const> weights,
                          cpu_eagle_options options = {})
      : w_(std::move(weights)), products_({.threads = options.threads, .pool = options.pool}) {
    SPECDEC_CHECK(w_ != nullptr && w_->target != nullptr && w_->embedding && w_->fc && w_->wq &&
                      w_->wk && w_->wv && w_->wo && w_->post_norm && w_->w1 && w_->w2 && w_->w3 &&
                      w_->lm_head,
                  invalid_argument, "cpu_eagle_head: missing weights");
    bool const e3 = eagle3();
    SPECDEC_CHECK(!e3 || (w_->input_norm && w_->hidden_norm && w_->norm), invalid_argument,
                  "cpu_eagle_head: an EAGLE-3 head misses a norm");
    eagle_config const& c = w_->config;
    dim_ = w_->dim;
    heads_ = c.num_heads;
    kv_heads_ = c.num_kv_heads;
    hs_ = c.head_dim;
    q_dim_ = c.q_dim();
    kv_dim_ = c.kv_dim();
    inner_ = c.intermediate_size;
    max_context_ = options.max_context != 0 ? options.max_context
                                            : static_cast<std::size_t>(w_->target->config.seq_len);
    SPECDEC_CHECK(max_context_ >= 1 && max_context_ <= (std::size_t{1} << 24), invalid_argument,
                  "cpu_eagle_head: max_context ", max_context_, " is outside [1, 2^24]");
    cache_ = contiguous_cache(1, kv_dim_, max_context_);
    std::size_t const chunk = products_.kernels().value_chunk;
    heads_per_task_ = 1;
    if (chunk != 0 && hs_ % chunk == 0)
      heads_per_task_ =
          std::max<std::size_t>(1, detail::cpu::max_value_accumulators / (hs_ / chunk));
    heads_per_task_ = std::min(heads_per_task_, heads_);
  }

  //! The head's kind.
  [[nodiscard]] eagle_version version() const noexcept { return w_->config.version; }
  //! Width of the head's state and outputs (the target's dim).
  [[nodiscard]] std::size_t hidden_size() const noexcept { return dim_; }
  //! Width of a target feature row (`eagle_weights::feature_width`).
  [[nodiscard]] std::size_t feature_width() const noexcept { return w_->feature_width(); }
  //! The target's vocabulary (tokens a batch may hold).
  [[nodiscard]] std::size_t vocab_size() const noexcept { return w_->vocab; }
  //! Logits per row of `logits`.
  [[nodiscard]] std::size_t draft_vocab_size() const noexcept { return w_->draft_vocab; }
  //! [draft_vocab] the target id of each draft id, or empty for the identity.
  [[nodiscard]] std::span<token_id const> draft_to_target() const noexcept {
    return w_->draft_to_target;
  }
  //! The target layers whose residual streams make up a feature (empty: the final hidden state).
  [[nodiscard]] std::span<std::int32_t const> target_layers() const noexcept {
    return w_->target_layers;
  }
  //! Entries the cache can hold; every position must be below it.
  [[nodiscard]] std::size_t max_context() const noexcept { return max_context_; }
  //! The weights.
  [[nodiscard]] eagle_weights const& weights() const noexcept { return *w_; }
  //! The head's KV cache (truncate it to roll back).
  [[nodiscard]] contiguous_cache& cache() noexcept { return cache_; }
  //! The head's KV cache, read-only.
  [[nodiscard]] contiguous_cache const& cache() const noexcept { return cache_; }

  //! Holds min(`positions`, max_context()) entries and positions in memory ahead of use.
  void reserve(std::size_t positions) {
    positions = std::min(positions, max_context_);
    cache_.reserve(positions);
    detail::cpu::grow_rope_table(rope_, hs_, static_cast<double>(w_->config.rope_theta), positions);
    grow_scores(positions);
  }

  //! Appends the rows of `batch` to the cache and writes their outputs to `out` [n, dim]. Throws
  //! `errc::invalid_argument` for sizes that disagree or a mask row that does not let a row see
  //! itself, `errc::out_of_range` for a token outside the vocabulary, `errc::context_overflow`
  //! for a position or an entry beyond max_context(); the cache is unchanged when it throws.
  void forward(eagle_batch const& batch, matrix_view<float> out) {
    namespace k = detail::cpu;
    std::size_t const n = batch.tokens.size();
    validate(batch, out);
    std::size_t needed = cache_.size() + n;
    for (position_t p : batch.positions) needed = std::max(needed, static_cast<std::size_t>(p) + 1);
    if (needed > rope_.size() / hs_ || needed > scores_rows_)
      reserve(std::max(needed, 2 * std::max(cache_.size(), std::size_t{16})));
    grow_batch(n);
    std::size_t const past = cache_.append(n);
    float const eps = w_->config.rms_eps;
    bool const e3 = eagle3();

    // u = fc(x) (EAGLE-1: x = [E(token), input]; EAGLE-3: x = the target features), or the input
    // itself (EAGLE-3, outputs of the head).
    std::size_t const fc_in = w_->fc_width();
    if (!e3 || batch.from_target) {
      for (std::size_t i = 0; i < n; ++i) {
        float* const x = x_.data() + i * fc_in;
        std::span<float const> const in = batch.inputs.row(i);
        if (e3) {
          std::copy(in.begin(), in.end(), x);
        } else {
          float const* const e = embedding(batch.tokens[i]);
          std::copy(e, e + dim_, x);
          std::copy(in.begin(), in.end(), x + dim_);
        }
      }
      products_.product(w_->fc, dim_, fc_in, x_.data(), n, u_.data(), dim_, false);
      if (w_->fc_bias != nullptr)
        for (std::size_t i = 0; i < n; ++i)
          for (std::size_t j = 0; j < dim_; ++j) u_[i * dim_ + j] += w_->fc_bias[j];
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        std::span<float const> const in = batch.inputs.row(i);
        std::copy(in.begin(), in.end(), u_.data() + i * dim_);
      }
    }

    // The attention's input: u (EAGLE-1), [input_norm(E(token)), hidden_norm(u)] (EAGLE-3).
    std::size_t const att_in = w_->attention_width();
    float const* a = u_.data();
    if (e3) {
      for (std::size_t i = 0; i < n; ++i) {
        float* const row = a_.data() + i * att_in;
        products_.kernels().rmsnorm(row, embedding(batch.tokens[i]), w_->input_norm, dim_, eps);
        products_.kernels().rmsnorm(row + dim_, u_.data() + i * dim_, w_->hidden_norm, dim_, eps);
      }
      a = a_.data();
    }

    // q, k, v (k and v straight into the cache rows), RoPE.
    float* const kc = cache_.keys(0);
    float* const vc = cache_.values(0);
    products_.product(w_->wq, q_dim_, att_in, a, n, q_.data(), q_dim_, false);
    products_.product(w_->wk, kv_dim_, att_in, a, n, kc + past * kv_dim_, kv_dim_, false);
    products_.product(w_->wv, kv_dim_, att_in, a, n, vc + past * kv_dim_, kv_dim_, false);
    for (std::size_t i = 0; i < n; ++i) {
      float const* const cs = rope_.data() + static_cast<std::size_t>(batch.positions[i]) * hs_;
      products_.kernels().rope(q_.data() + i * q_dim_, heads_, hs_, cs);
      products_.kernels().rope(kc + (past + i) * kv_dim_, kv_heads_, hs_, cs);
    }

    // Attention of each row over the entries it sees, in cache order.
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t length = 0, end = 0;
      std::size_t const n_runs = sequence(batch, i, past, length, end);
      for (std::size_t h0 = 0; h0 < heads_; h0 += heads_per_task_)
        products_.kernels().attend_heads(
            q_.data() + i * q_dim_, kc, vc, kv_dim_, hs_, heads_ / kv_heads_, h0,
            std::min(heads_, h0 + heads_per_task_), end, runs_.data(), n_runs, length,
            scores_.data(), scores_rows_, att_.data() + i * q_dim_);
    }

    // h = u + o_proj(att); h += MLP(post_norm(h)).
    std::copy(u_.begin(), u_.begin() + static_cast<std::ptrdiff_t>(n * dim_), h_.begin());
    products_.product(w_->wo, dim_, q_dim_, att_.data(), n, h_.data(), dim_, true);
    for (std::size_t i = 0; i < n; ++i)
      products_.kernels().rmsnorm(xb_.data() + i * dim_, h_.data() + i * dim_, w_->post_norm, dim_,
                                  eps);
    products_.product(w_->w1, inner_, dim_, xb_.data(), n, g_.data(), inner_, false);
    products_.product(w_->w3, inner_, dim_, xb_.data(), n, up_.data(), inner_, false);
    for (std::size_t i = 0; i < n; ++i)
      products_.kernels().swiglu(g_.data() + i * inner_, up_.data() + i * inner_, inner_);
    products_.product(w_->w2, dim_, inner_, g_.data(), n, h_.data(), dim_, true);
    for (std::size_t i = 0; i < n; ++i)
      std::copy(h_.data() + i * dim_, h_.data() + (i + 1) * dim_, out.row(i).data());
    cache_.mark_unchanged();
  }

  //! logits [n, draft_vocab] of the outputs `hidden` [n, dim]: EAGLE-3 lm_head(norm(h)), EAGLE-1
  //! the target's classifier on h. Throws `errc::invalid_argument` for wrong sizes.
  void logits(matrix_view<float const> hidden, matrix_view<float> logits) {
    std::size_t const n = hidden.rows(), v = w_->draft_vocab;
    SPECDEC_CHECK(hidden.cols() == dim_ && logits.rows() == n && logits.cols() == v,
                  invalid_argument, "cpu_eagle_head::logits: ", n, " x ", hidden.cols(),
                  " outputs and logits of ", logits.rows(), " x ", logits.cols(), " for dim ", dim_,
                  " and a draft vocabulary of ", v);
    if (n == 0) return;
    grow_batch(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::span<float const> const h = hidden.row(i);
      if (eagle3())
        products_.kernels().rmsnorm(xb_.data() + i * dim_, h.data(), w_->norm, dim_,
                                    w_->config.rms_eps);
      else
        std::copy(h.begin(), h.end(), xb_.data() + i * dim_);
    }
    products_.product(w_->lm_head, v, dim_, xb_.data(), n, logits.data(), logits.stride(), false);
  }

 private:
  [[nodiscard]] bool eagle3() const noexcept { return w_->config.version == eagle_version::eagle3; }

  [[nodiscard]] float const* embedding(token_id t) const noexcept {
    return w_->embedding + static_cast<std::size_t>(t) * dim_;
  }

  void validate(eagle_batch const& b, matrix_view<float> out) const {
    std::size_t const n = b.tokens.size();
    std::size_t const width = b.from_target ? w_->feature_width() : dim_;
    SPECDEC_CHECK(n > 0 && b.positions.size() == n && b.inputs.rows() == n &&
                      b.inputs.cols() == width && out.rows() == n && out.cols() == dim_,
                  invalid_argument, "cpu_eagle_head::forward: ", n, " tokens, ", b.positions.size(),
                  " positions, inputs of ", b.inputs.rows(), " x ", b.inputs.cols(),
                  " (need width ", width, "), outputs of ", out.rows(), " x ", out.cols(),
                  " (need width ", dim_, ")");
    SPECDEC_CHECK(n <= cache_.room(), context_overflow, "cpu_eagle_head::forward: ", n,
                  " rows do not fit the head's cache (", cache_.size(), " of ", cache_.capacity(),
                  " entries used)");
    for (std::size_t i = 0; i < n; ++i) {
      SPECDEC_CHECK(b.tokens[i] >= 0 && static_cast<std::size_t>(b.tokens[i]) < w_->vocab,
                    out_of_range, "cpu_eagle_head::forward: token ", b.tokens[i], " of row ", i,
                    " is outside the vocabulary of ", w_->vocab);
      SPECDEC_CHECK(b.positions[i] >= 0 && static_cast<std::size_t>(b.positions[i]) < max_context_,
                    context_overflow, "cpu_eagle_head::forward: position ", b.positions[i],
                    " of row ", i, " is outside the context of ", max_context_);
    }
    if (b.mask.empty()) return;
    std::size_t const size = cache_.size();
    SPECDEC_CHECK(b.shared <= size, invalid_argument, "cpu_eagle_head::forward: ", b.shared,
                  " shared entries but the cache holds ", size);
    std::size_t const bits = size - b.shared + n;
    SPECDEC_CHECK(b.mask_stride >= mask_words(bits) && b.mask.size() >= n * b.mask_stride,
                  invalid_argument, "cpu_eagle_head::forward: a mask of ", b.mask.size(),
                  " words, rows of ", b.mask_stride, ", for ", n, " rows of ", bits, " entries");
    for (std::size_t i = 0; i < n; ++i)
      SPECDEC_CHECK(b.visible(i, size + i, size), invalid_argument,
                    "cpu_eagle_head::forward: mask row ", i, " does not let the row see itself");
  }

  // The entries row i sees as runs of consecutive cache entries; sets `length` (entries) and
  // `end` (one past the last). Entries after the row's own are never visible.
  std::size_t sequence(eagle_batch const& b, std::size_t i, std::size_t past, std::size_t& length,
                       std::size_t& end) noexcept {
    detail::cpu::row_runs seq{.runs = runs_.data()};
    if (b.mask.empty()) {
      seq.add(0, past + i + 1);
    } else {
      if (b.shared > 0) seq.add(0, b.shared);
      // Entries up to the row's own.
      seq.add_bits(b.mask.data() + i * b.mask_stride, past + i + 1 - b.shared, b.shared);
    }
    length = seq.length;
    end = runs_[seq.count - 1].row + runs_[seq.count - 1].count;
    return seq.count;
  }

  // Score rows for `entries` entries (heads_per_task rows, each rounded up to 16 floats).
  void grow_scores(std::size_t entries) {
    std::size_t const rows = (entries + 15) / 16 * 16;
    if (rows <= scores_rows_) return;
    scores_.resize(heads_per_task_ * rows);
    runs_.resize(rows + 1);
    scores_rows_ = rows;
  }

  // Batch buffers for `n` rows.
  void grow_batch(std::size_t n) {
    if (n <= batch_) return;
    x_.resize(n * w_->fc_width());
    u_.resize(n * dim_);
    a_.resize(n * w_->attention_width());
    q_.resize(n * q_dim_);
    att_.resize(n * q_dim_);
    h_.resize(n * dim_);
    xb_.resize(n * dim_);
    g_.resize(n * inner_);
    up_.resize(n * inner_);
    batch_ = n;
  }

  std::shared_ptr<eagle_weights const> w_;
  detail::cpu::heads_products products_;
  contiguous_cache cache_;
  std::size_t dim_ = 0, heads_ = 0, kv_heads_ = 0, hs_ = 0, q_dim_ = 0, kv_dim_ = 0, inner_ = 0;
  std::size_t max_context_ = 0;
  std::size_t heads_per_task_ = 1;
  std::size_t batch_ = 0;                   // rows the batch buffers hold
  std::size_t scores_rows_ = 0;             // floats per score row (entries rounded up to 16)
  std::vector<float> rope_;                 // [positions, head_dim] (cos, sin) pairs
  std::vector<float> scores_;               // [heads_per_task, scores_rows] attention scratch
  std::vector<detail::cpu::row_run> runs_;  // [scores_rows + 1] a row's visible entries
  std::vector<float> x_;                    // [batch, fc_width] fc's input
  std::vector<float> u_;                    // [batch, dim] fc's output (the residual)
  std::vector<float> a_;    // [batch, attention_width] the attention's input (EAGLE-3)
  std::vector<float> q_;    // [batch, q_dim] queries
  std::vector<float> att_;  // [batch, q_dim] attention output
  std::vector<float> h_;    // [batch, dim] the layer's residual stream
  std::vector<float> xb_;   // [batch, dim] normed rows
  std::vector<float> g_;    // [batch, intermediate] gate, then SwiGLU
  std::vector<float> up_;   // [batch, intermediate] up
};

}  // namespace specdec
