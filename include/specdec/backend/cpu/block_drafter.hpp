#pragma once
//! \file
//! `cpu_block_drafter`: a block drafter's forward on the CPU (model/block_drafter.hpp gives the
//! computation), the runner that `block_proposer` (propose/block.hpp) drives. It keeps the
//! drafter's cache of context rows (every layer's keys and values of c_j, a `contiguous_cache`),
//! extends it by the rows of newly committed tokens, and runs a block of B rows over it in one
//! call: the block's keys and values are appended after the context entries for the call and
//! dropped when it returns, so the cache only ever holds committed context.
//!
//! The kernels are the CPU backend's (backend/cpu/kernels.hpp, as `cpu_eagle_head`): products by
//! `gemm_nt` over the thread pool, RMSNorm, RoPE, SwiGLU and `attend_heads` over the context
//! entries then the block's. Each row's output is a fixed sequence of operations that depends
//! only on the shapes and the entries it sees, so a context extended in one call or in many
//! gives the same blocks.

#include <algorithm>
#include <cstddef>
#include <cstdint>
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
#include "specdec/model/block_drafter.hpp"

namespace specdec {

//! Options of a `cpu_block_drafter`.
struct cpu_block_drafter_options {
  std::size_t threads = 1;                      //!< threads for the products (the caller included)
  std::shared_ptr<thread_pool> pool = nullptr;  //!< a pool to share (overrides `threads`)
  //! Context rows the cache can hold (the largest root position + 1); 0 = the target's seq_len.
  std::size_t max_context = 0;
};

//! A block drafter on the CPU. One call at a time; once the positions in use have been seen, no
//! call allocates.
class cpu_block_drafter {
 public:
  //! A runner over `weights` (shared, read-only). Throws `errc::invalid_argument` for null or
  //! incomplete weights and bad options.
  explicit cpu_block_drafter(std::shared_ptr<block_drafter_weights const> weights,
                             cpu_block_drafter_options options = {})
      : w_(std::move(weights)), products_({.threads = options.threads, .pool = options.pool}) {
    SPECDEC_CHECK(w_ != nullptr && w_->target != nullptr && w_->embedding && w_->classifier &&
                      w_->fc && w_->hidden_norm && w_->mask_embedding && w_->norm &&
                      !w_->layers.empty(),
                  invalid_argument, "cpu_block_drafter: missing weights");
    SPECDEC_CHECK(!dspark() || (w_->markov_out && w_->confidence && w_->confidence_bias),
                  invalid_argument, "cpu_block_drafter: a DSpark drafter misses its heads");
    block_drafter_config const& c = w_->config;
    dim_ = w_->dim;
    heads_ = c.num_heads;
    kv_heads_ = c.num_kv_heads;
    hs_ = c.head_dim;
    q_dim_ = c.q_dim();
    kv_dim_ = c.kv_dim();
    inner_ = c.intermediate_size;
    block_ = c.block_size;
    max_context_ = options.max_context != 0 ? options.max_context
                                            : static_cast<std::size_t>(w_->target->config.seq_len);
    SPECDEC_CHECK(max_context_ >= 1 && max_context_ <= (std::size_t{1} << 24), invalid_argument,
                  "cpu_block_drafter: max_context ", max_context_, " is outside [1, 2^24]");
    cache_ = contiguous_cache(w_->layers.size(), kv_dim_, max_context_ + block_);
    std::size_t const chunk = products_.kernels().value_chunk;
    heads_per_task_ = 1;
    if (chunk != 0 && hs_ % chunk == 0)
      heads_per_task_ =
          std::max<std::size_t>(1, detail::cpu::max_value_accumulators / (hs_ / chunk));
    heads_per_task_ = std::min(heads_per_task_, heads_);
    grow_rows(block_);
  }

  [[nodiscard]] std::size_t hidden_size() const noexcept { return dim_; }
  [[nodiscard]] std::size_t feature_width() const noexcept { return w_->feature_width(); }
  [[nodiscard]] std::size_t vocab_size() const noexcept { return w_->vocab; }
  //! B: rows per block (B - 1 drafts).
  [[nodiscard]] std::size_t block_size() const noexcept { return block_; }
  //! Whether the drafter has DSpark's Markov and confidence heads.
  [[nodiscard]] bool dspark() const noexcept { return w_->config.dspark; }
  //! The target layers whose output residual streams make up a feature.
  [[nodiscard]] std::span<std::int32_t const> target_layers() const noexcept {
    return w_->config.target_layers;
  }
  //! Context rows the cache can hold; a root's position must be below it.
  [[nodiscard]] std::size_t max_context() const noexcept { return max_context_; }
  //! Context rows in the cache (those of tokens 0 .. context() - 1).
  [[nodiscard]] std::size_t context() const noexcept { return cache_.size(); }
  //! Drops the context rows from `n` on.
  void truncate(std::size_t n) { cache_.truncate(std::min(n, cache_.size())); }
  [[nodiscard]] block_drafter_weights const& weights() const noexcept { return *w_; }

  //! Appends the context rows of `features` [r, feature_width()] (tokens context() ..
  //! context() + r - 1, at those positions). Throws `errc::invalid_argument` for a wrong width,
  //! `errc::context_overflow` past max_context(); the cache is unchanged when it throws.
  void extend(matrix_view<float const> features) {
    std::size_t const r = features.rows();
    SPECDEC_CHECK(r == 0 || features.cols() == feature_width(), invalid_argument,
                  "cpu_block_drafter::extend: feature rows of ", features.cols(),
                  " floats for a drafter reading ", feature_width());
    SPECDEC_CHECK(r <= max_context_ - std::min(max_context_, cache_.size()), context_overflow,
                  "cpu_block_drafter::extend: ", r, " rows after ", cache_.size(),
                  " exceed the context of ", max_context_);
    if (r == 0) return;
    std::size_t const past = cache_.size();
    reserve(past + r + block_);
    grow_rows(r);
    float const eps = w_->config.rms_eps;
    for (std::size_t i = 0; i < r; ++i) {
      std::span<float const> const in = features.row(i);
      std::copy(in.begin(), in.end(), x_.data() + i * feature_width());
    }
    products_.product(w_->fc, dim_, feature_width(), x_.data(), r, h_.data(), dim_, false);
    for (std::size_t i = 0; i < r; ++i)
      products_.kernels().rmsnorm(xb_.data() + i * dim_, h_.data() + i * dim_, w_->hidden_norm,
                                  dim_, eps);
    cache_.append(r);
    for (std::size_t l = 0; l < w_->layers.size(); ++l) {
      block_drafter_layer const& L = w_->layers[l];
      float* const kc = cache_.keys(l) + past * kv_dim_;
      products_.product(L.wk, kv_dim_, dim_, xb_.data(), r, kc, kv_dim_, false);
      products_.product(L.wv, kv_dim_, dim_, xb_.data(), r, cache_.values(l) + past * kv_dim_,
                        kv_dim_, false);
      for (std::size_t i = 0; i < r; ++i)
        products_.kernels().rope(kc + i * kv_dim_, kv_heads_, hs_, rope_.data() + (past + i) * hs_);
    }
    cache_.mark_unchanged();
  }

  //! Runs the block of root `root` at position context() over the whole context and writes
  //! rms(h_i, norm) of its rows to `out` [B, dim] (row 0 included). Throws
  //! `errc::out_of_range` for a root outside the vocabulary, `errc::context_overflow` when the
  //! block's positions pass max_context() + B.
  void block(token_id root, matrix_view<float> out) {
    namespace k = detail::cpu;
    std::size_t const ctx = cache_.size(), b = block_;
    SPECDEC_CHECK(out.rows() == b && out.cols() == dim_, invalid_argument,
                  "cpu_block_drafter::block: outputs of ", out.rows(), " x ", out.cols(),
                  " for a block of ", b, " rows of ", dim_);
    SPECDEC_CHECK(root >= 0 && static_cast<std::size_t>(root) < w_->vocab, out_of_range,
                  "cpu_block_drafter::block: root token ", root, " is outside the vocabulary of ",
                  w_->vocab);
    SPECDEC_CHECK(ctx < max_context_, context_overflow, "cpu_block_drafter::block: a root at ", ctx,
                  " is outside the context of ", max_context_);
    reserve(ctx + b);
    float const eps = w_->config.rms_eps;
    std::copy(embedding(root), embedding(root) + dim_, h_.data());
    for (std::size_t i = 1; i < b; ++i)
      std::copy(w_->mask_embedding, w_->mask_embedding + dim_, h_.data() + i * dim_);
    cache_.append(b);
    detail::cpu::row_run const run{.row = 0, .count = ctx + b};
    for (std::size_t l = 0; l < w_->layers.size(); ++l) {
      block_drafter_layer const& L = w_->layers[l];
      for (std::size_t i = 0; i < b; ++i)
        products_.kernels().rmsnorm(xb_.data() + i * dim_, h_.data() + i * dim_, L.input_norm, dim_,
                                    eps);
      float* const kc = cache_.keys(l);
      float* const vc = cache_.values(l);
      products_.product(L.wq, q_dim_, dim_, xb_.data(), b, q_.data(), q_dim_, false);
      products_.product(L.wk, kv_dim_, dim_, xb_.data(), b, kc + ctx * kv_dim_, kv_dim_, false);
      products_.product(L.wv, kv_dim_, dim_, xb_.data(), b, vc + ctx * kv_dim_, kv_dim_, false);
      for (std::size_t i = 0; i < b; ++i) {
        float const* const cs = rope_.data() + (ctx + i) * hs_;
        products_.kernels().rope(q_.data() + i * q_dim_, heads_, hs_, cs);
        products_.kernels().rope(kc + (ctx + i) * kv_dim_, kv_heads_, hs_, cs);
      }
      for (std::size_t i = 0; i < b; ++i)
        for (std::size_t h0 = 0; h0 < heads_; h0 += heads_per_task_)
          products_.kernels().attend_heads(
              q_.data() + i * q_dim_, kc, vc, kv_dim_, hs_, heads_ / kv_heads_, h0,
              std::min(heads_, h0 + heads_per_task_), ctx + b, &run, 1, ctx + b, scores_.data(),
              scores_rows_, att_.data() + i * q_dim_);
      products_.product(L.wo, dim_, q_dim_, att_.data(), b, h_.data(), dim_, true);
      for (std::size_t i = 0; i < b; ++i)
        products_.kernels().rmsnorm(xb_.data() + i * dim_, h_.data() + i * dim_, L.post_norm, dim_,
                                    eps);
      products_.product(L.w1, inner_, dim_, xb_.data(), b, g_.data(), inner_, false);
      products_.product(L.w3, inner_, dim_, xb_.data(), b, up_.data(), inner_, false);
      for (std::size_t i = 0; i < b; ++i)
        products_.kernels().swiglu(g_.data() + i * inner_, up_.data() + i * inner_, inner_);
      products_.product(L.w2, dim_, inner_, g_.data(), b, h_.data(), dim_, true);
    }
    cache_.truncate(ctx);
    for (std::size_t i = 0; i < b; ++i)
      products_.kernels().rmsnorm(out.row(i).data(), h_.data() + i * dim_, w_->norm, dim_, eps);
  }

  //! logits [n, vocab] of block outputs `out` [n, dim] (the target's classifier).
  void logits(matrix_view<float const> out, matrix_view<float> logits) {
    std::size_t const n = out.rows();
    SPECDEC_CHECK(out.cols() == dim_ && logits.rows() == n && logits.cols() == w_->vocab,
                  invalid_argument, "cpu_block_drafter::logits: ", n, " x ", out.cols(),
                  " outputs and logits of ", logits.rows(), " x ", logits.cols(), " for dim ", dim_,
                  " and a vocabulary of ", w_->vocab);
    if (n == 0) return;
    grow_rows(n);
    for (std::size_t i = 0; i < n; ++i)
      std::copy(out.row(i).begin(), out.row(i).end(), xb_.data() + i * dim_);
    products_.product(w_->classifier, w_->vocab, dim_, xb_.data(), n, logits.data(),
                      logits.stride(), false);
  }

  //! DSpark: adds the Markov bias after `prev` to `row` [vocab].
  void add_markov(token_id prev, std::span<float> row) {
    SPECDEC_CHECK(dspark(), invalid_argument,
                  "cpu_block_drafter: a DFlash drafter has no Markov "
                  "head");
    SPECDEC_CHECK(
        prev >= 0 && static_cast<std::size_t>(prev) < w_->vocab && row.size() == w_->vocab,
        invalid_argument, "cpu_block_drafter::add_markov: token ", prev, ", a row of ", row.size(),
        " for a vocabulary of ", w_->vocab);
    std::size_t const r = w_->config.markov_rank;
    products_.product(w_->markov_out, w_->vocab, r,
                      w_->markov_in + static_cast<std::size_t>(prev) * r, 1, row.data(), w_->vocab,
                      true);
  }

  //! DSpark: the confidence that token `y` drafted at block row `i` (1 .. B - 1), whose output is
  //! `out` [dim], is accepted given the earlier rows were.
  [[nodiscard]] double confidence(std::span<float const> out, token_id y, std::size_t i) const {
    SPECDEC_CHECK(dspark() && i >= 1 && i < block_ && out.size() == dim_ && y >= 0 &&
                      static_cast<std::size_t>(y) < w_->vocab,
                  invalid_argument, "cpu_block_drafter::confidence: row ", i, ", token ", y);
    double z = static_cast<double>(w_->confidence_bias[i - 1]);
    float const* const e = embedding(y);
    for (std::size_t j = 0; j < dim_; ++j)
      z += static_cast<double>(w_->confidence[j]) * out[j] +
           static_cast<double>(w_->confidence[dim_ + j]) * e[j];
    return 1.0 / (1.0 + std::exp(-z));
  }

 private:
  [[nodiscard]] float const* embedding(token_id t) const noexcept {
    return w_->embedding + static_cast<std::size_t>(t) * dim_;
  }

  // Room for `positions` cache entries (context and a block) and their RoPE rows and scores.
  void reserve(std::size_t positions) {
    if (positions <= reserved_) return;
    positions = std::max(positions, std::min(cache_.capacity(), 2 * reserved_ + 16));
    positions = std::min(positions, cache_.capacity());
    cache_.reserve(positions);
    detail::cpu::grow_rope_table(rope_, hs_, static_cast<double>(w_->config.rope_theta), positions);
    std::size_t const rows = (positions + 15) / 16 * 16;
    if (rows > scores_rows_) {
      scores_.resize(heads_per_task_ * rows);
      scores_rows_ = rows;
    }
    reserved_ = positions;
  }

  // Row buffers for `n` rows.
  void grow_rows(std::size_t n) {
    if (n <= rows_) return;
    x_.resize(n * feature_width());
    h_.resize(n * dim_);
    xb_.resize(n * dim_);
    q_.resize(n * q_dim_);
    att_.resize(n * q_dim_);
    g_.resize(n * inner_);
    up_.resize(n * inner_);
    rows_ = n;
  }

  std::shared_ptr<block_drafter_weights const> w_;
  detail::cpu::heads_products products_;
  contiguous_cache cache_;
  std::size_t dim_ = 0, heads_ = 0, kv_heads_ = 0, hs_ = 0, q_dim_ = 0, kv_dim_ = 0, inner_ = 0;
  std::size_t block_ = 0, max_context_ = 0, heads_per_task_ = 1;
  std::size_t rows_ = 0, reserved_ = 0, scores_rows_ = 0;
  std::vector<float> rope_;    // [positions, head_dim] (cos, sin) pairs
  std::vector<float> scores_;  // [heads_per_task, scores_rows] attention scratch
  std::vector<float> x_;       // [rows, feature_width] features
  std::vector<float> h_;       // [rows, dim] residual stream
  std::vector<float> xb_;      // [rows, dim] normed rows
  std::vector<float> q_;       // [rows, q_dim]
  std::vector<float> att_;     // [rows, q_dim]
  std::vector<float> g_;       // [rows, intermediate]
  std::vector<float> up_;      // [rows, intermediate]
};

}  // namespace specdec
