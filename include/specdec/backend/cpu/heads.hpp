#pragma once
//! \file
//! The Medusa and Hydra head computations on the CPU (`cpu_medusa_heads`, `cpu_hydra_heads`): the
//! heads runners that propose/medusa.hpp and propose/hydra.hpp drive through their concepts. The
//! matrix products are the backend's `gemm_nt` (backend/cpu/kernels.hpp: weights in their [out,
//! in] layout, each weight row streamed once per call for every row of the batch), split across the
//! thread pool by output rows; SiLU is the backend's own (`add_silu`, as SwiGLU computes it), both
//! of the CPU target active when the runner is built. Each output
//! is computed by a fixed sequence of operations that depends only on the shapes, never on the
//! batch or the thread count.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "specdec/backend/cpu/kernels.hpp"
#include "specdec/backend/cpu/thread_pool.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec {

//! Options of the CPU heads runners.
struct cpu_heads_options {
  //! Threads for the products (the calling thread included).
  std::size_t threads = 1;
  //! The thread pool; null = the process-wide pool of `threads` threads (`thread_pool::shared`),
  //! which a `cpu_llama` of the same thread count also uses. When given, its size overrides
  //! `threads`.
  std::shared_ptr<thread_pool> pool = nullptr;
};

namespace detail::cpu {

//! The products of the heads runners: y [n, rows] (+)= x [n, k] W^T for a weight matrix W
//! [rows, k], the rows split across the pool when the work pays for the hand-off.
class heads_products {
 public:
  explicit heads_products(cpu_heads_options const& options) : kernels_(&active_model_kernels()) {
    if (options.pool != nullptr) {
      pool_ = options.pool;
    } else {
      SPECDEC_CHECK(options.threads >= 1 && options.threads <= 1024, invalid_argument,
                    "cpu heads: threads is ", options.threads, ", need 1 to 1024");
      pool_ = thread_pool::shared(options.threads);
    }
  }

  //! y[t * ldy + r] (+)= sum_j w[r * k + j] x[t * k + j] for r < rows, t < n.
  void product(float const* w, std::size_t rows, std::size_t k, float const* x, std::size_t n,
               float* y, std::size_t ldy, bool accumulate) const noexcept {
    constexpr std::size_t min_parallel_work = std::size_t{1} << 15;
    auto const f = [&](std::size_t r0, std::size_t r1) {
      kernels_->gemm_nt(w, k, r0, r1, x, k, n, k, y, ldy, accumulate);
    };
    if (pool_->size() == 1 || rows * k * n < min_parallel_work)
      f(std::size_t{0}, rows);
    else
      pool_->parallel_for(rows, tile_rows, f);
  }

  //! Rows x[t, :dim] += SiLU(x[t, :dim] W^T + bias) for t < n: one residual block (`y` scratch of
  //! n * dim floats).
  void block(head_block const& b, std::size_t dim, float* x, std::size_t n,
             float* y) const noexcept {
    product(b.weight, dim, dim, x, n, y, dim, false);
    for (std::size_t t = 0; t < n; ++t) add_silu(x + t * dim, y + t * dim, b.bias, dim);
  }

  //! x[:n] += SiLU(y[:n] + bias[:n]) (bias may be null).
  void add_silu(float* x, float const* y, float const* bias, std::size_t n) const noexcept {
    kernels_->add_silu(x, y, bias, n);
  }

  //! Threads used.
  [[nodiscard]] std::size_t threads() const noexcept { return pool_->size(); }
  //! The kernels of the CPU target active when built.
  [[nodiscard]] model_kernels const& kernels() const noexcept { return *kernels_; }

 private:
  model_kernels const* kernels_;
  std::shared_ptr<thread_pool> pool_;
};

}  // namespace detail::cpu

//! Medusa heads on the CPU: for the target's hidden row h, the logits of every head
//! (model/heads.hpp gives the computation). A `medusa_heads_runner` (propose/medusa.hpp).
//! One `run` at a time per runner; `run` does not allocate.
class cpu_medusa_heads {
 public:
  //! A runner over `heads` (shared, read-only). Throws `errc::invalid_argument` for null heads or
  //! bad options.
  explicit cpu_medusa_heads(std::shared_ptr<medusa_weights const> heads,
                            cpu_heads_options options = {})
      : heads_(std::move(heads)), products_(options) {
    SPECDEC_CHECK(heads_ != nullptr && !heads_->heads.empty(), invalid_argument,
                  "cpu_medusa_heads: no heads");
    x_.resize(heads_->dim);
    y_.resize(heads_->dim);
  }

  //! Number of heads (K).
  [[nodiscard]] std::size_t num_heads() const noexcept { return heads_->heads.size(); }
  //! Width of the hidden row.
  [[nodiscard]] std::size_t hidden_size() const noexcept { return heads_->dim; }
  //! Logits per head.
  [[nodiscard]] std::size_t vocab_size() const noexcept { return heads_->vocab; }
  //! The heads' weights.
  [[nodiscard]] medusa_weights const& weights() const noexcept { return *heads_; }

  //! logits [num_heads, vocab] (row i = head i) of the heads on `hidden` [hidden_size]. Throws
  //! `errc::invalid_argument` for wrong sizes.
  void run(std::span<float const> hidden, matrix_view<float> logits) {
    std::size_t const d = heads_->dim, v = heads_->vocab;
    SPECDEC_CHECK(hidden.size() == d && logits.rows() == num_heads() && logits.cols() == v,
                  invalid_argument, "cpu_medusa_heads::run: a hidden row of ", hidden.size(),
                  " floats and logits of ", logits.rows(), " x ", logits.cols(), " for ",
                  num_heads(), " heads of dim ", d, " and vocab ", v);
    for (std::size_t i = 0; i < num_heads(); ++i) {
      medusa_weights::head const& h = heads_->heads[i];
      std::copy(hidden.begin(), hidden.end(), x_.begin());
      for (head_block const& b : h.blocks) products_.block(b, d, x_.data(), 1, y_.data());
      products_.product(h.lm_head, v, d, x_.data(), 1, logits.row(i).data(), v, false);
    }
  }

 private:
  std::shared_ptr<medusa_weights const> heads_;
  detail::cpu::heads_products products_;
  std::vector<float> x_, y_;  // [dim] the head's state, the block's product
};

//! Hydra heads on the CPU: head d for a batch of drafted paths, reading the token embeddings of
//! the target the heads were trained for (model/heads.hpp gives the computation). A
//! `hydra_heads_runner` (propose/hydra.hpp). One `run` at a time per runner; after the first call
//! of a given batch size `run` does not allocate.
class cpu_hydra_heads {
 public:
  //! A runner over `heads` with the token embedding of `target` (both shared, read-only). Throws
  //! `errc::invalid_argument` for null weights, heads of another dim or vocabulary, bad options.
  cpu_hydra_heads(std::shared_ptr<hydra_weights const> heads,
                  std::shared_ptr<llama_weights const> target, cpu_heads_options options = {})
      : heads_(std::move(heads)), target_(std::move(target)), products_(options) {
    SPECDEC_CHECK(heads_ != nullptr && !heads_->heads.empty() && target_ != nullptr &&
                      target_->token_embedding != nullptr,
                  invalid_argument, "cpu_hydra_heads: no heads or no target embedding");
    SPECDEC_CHECK(static_cast<std::size_t>(target_->config.dim) == heads_->dim &&
                      static_cast<std::size_t>(target_->config.vocab_size) == heads_->vocab,
                  invalid_argument, "cpu_hydra_heads: heads of dim ", heads_->dim, " and vocab ",
                  heads_->vocab, " for a target of dim ", target_->config.dim, " and vocab ",
                  target_->config.vocab_size);
  }

  //! Number of heads (K).
  [[nodiscard]] std::size_t num_heads() const noexcept { return heads_->heads.size(); }
  //! Width of the hidden row.
  [[nodiscard]] std::size_t hidden_size() const noexcept { return heads_->dim; }
  //! Logits per head.
  [[nodiscard]] std::size_t vocab_size() const noexcept { return heads_->vocab; }
  //! The heads' weights.
  [[nodiscard]] hydra_weights const& weights() const noexcept { return *heads_; }

  //! logits [n, vocab] of head `head` for the n drafted paths `paths` [n, head + 1] (row r: the
  //! root, then the tokens drafted at depths 1..head), all after the target's hidden row `hidden`
  //! [hidden_size]. Throws `errc::invalid_argument` for wrong sizes or a head beyond num_heads(),
  //! `errc::out_of_range` for a token outside the vocabulary.
  void run(std::size_t head, std::span<float const> hidden, matrix_view<token_id const> paths,
           matrix_view<float> logits) {
    std::size_t const d = heads_->dim, v = heads_->vocab, n = paths.rows();
    SPECDEC_CHECK(head < num_heads() && hidden.size() == d && paths.cols() == head + 1 &&
                      logits.rows() == n && logits.cols() == v,
                  invalid_argument, "cpu_hydra_heads::run: head ", head, " of ", num_heads(),
                  ", a hidden row of ", hidden.size(), " floats, paths of ", n, " x ", paths.cols(),
                  ", logits of ", logits.rows(), " x ", logits.cols());
    if (n == 0) return;
    std::size_t const width = heads_->input_width(head);
    if (u_.size() < n * width) u_.resize(n * width);
    if (x_.size() < n * d) {
      x_.resize(n * d);
      y_.resize(n * d);
    }
    // u = concat(h, E[path tokens]) per row.
    float const* const embedding = target_->token_embedding;
    for (std::size_t r = 0; r < n; ++r) {
      float* const u = u_.data() + r * width;
      std::copy(hidden.begin(), hidden.end(), u);
      for (std::size_t j = 0; j <= head; ++j) {
        token_id const t = paths(r, j);
        SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < v, out_of_range,
                      "cpu_hydra_heads::run: token ", t, " of path ", r,
                      " is outside the vocabulary of ", v);
        float const* const e = embedding + static_cast<std::size_t>(t) * d;
        std::copy(e, e + d, u + (j + 1) * d);
      }
    }
    hydra_weights::head const& h = heads_->heads[head];
    // x = R u + r + SiLU(A u + a), then the residual blocks and the LM head with its bias.
    products_.product(h.res_weight, d, width, u_.data(), n, x_.data(), d, false);
    products_.product(h.in_weight, d, width, u_.data(), n, y_.data(), d, false);
    for (std::size_t r = 0; r < n; ++r) {
      float* const x = x_.data() + r * d;
      for (std::size_t j = 0; j < d; ++j) x[j] += h.res_bias[j];
      products_.add_silu(x, y_.data() + r * d, h.in_bias, d);
    }
    for (head_block const& b : h.blocks) products_.block(b, d, x_.data(), n, y_.data());
    products_.product(h.lm_head, v, d, x_.data(), n, logits.data(), logits.stride(), false);
    for (std::size_t r = 0; r < n; ++r) {
      std::span<float> const row = logits.row(r);
      for (std::size_t j = 0; j < v; ++j) row[j] += h.lm_bias[j];
    }
  }

 private:
  std::shared_ptr<hydra_weights const> heads_;
  std::shared_ptr<llama_weights const> target_;
  detail::cpu::heads_products products_;
  std::vector<float> u_, x_, y_;  // [n, width] inputs, [n, dim] state, [n, dim] products
};

}  // namespace specdec
