#pragma once
//! \file
//! Matrix products for small models (`packed_gemm`): weights repacked once (`packed_matrix`) so
//! that one register holds one weight column of `width` consecutive rows; a product is then
//! multiply-adds only (no horizontal reductions), register-tiled over rows and tokens, with the
//! residual add or SwiGLU fused into its last step (kernels/packed.inl). The layout's vector width
//! is the CPU target's (`model_kernels::width`, backend/cpu/kernels.hpp). Internal to backend/cpu.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "specdec/backend/cpu/aligned_floats.hpp"
#include "specdec/core/error.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec::detail::cpu {

//! A weight matrix [rows, k] repacked for `packed_gemm`: vectors of `width` consecutive rows,
//! each stored column by column ([k][width], so that a product reads it sequentially and one
//! register holds one column), rows past the end zero. Also a (gate, up) pair of matrices,
//! interleaved vector by vector, for the fused SwiGLU product.
class packed_matrix {
 public:
  //! A block of source rows: `rows` rows of k floats, contiguous.
  struct block {
    float const* data;  //!< [rows, k] row-major
    std::size_t rows;
  };

  //! An empty matrix.
  packed_matrix() = default;

  //! The rows of `blocks` one after the other (for example wq, wk, wv as one [q+k+v, k] matrix).
  //! `width` is the packing's vector width (floats), the CPU target's (`model_kernels::width`).
  packed_matrix(std::initializer_list<block> blocks, std::size_t k, std::size_t width)
      : k_(k), width_(width) {
    SPECDEC_ASSERT(width > 0);
    for (block const& b : blocks) rows_ += b.rows;
    vectors_ = (rows_ + width_ - 1) / width_;
    data_ = aligned_floats(vectors_ * k_ * width_);
    std::size_t r = 0;
    for (block const& b : blocks)
      for (std::size_t i = 0; i < b.rows; ++i, ++r) put(r / width_, r % width_, b.data + i * k);
  }

  //! SwiGLU's gate and up matrices [rows, k] interleaved: vector 2i holds gate rows
  //! [i width, (i + 1) width), vector 2i + 1 the same rows of up; `rows()` is the output width.
  static packed_matrix pairs(float const* gate, float const* up, std::size_t rows, std::size_t k,
                             std::size_t width) {
    SPECDEC_ASSERT(width > 0);
    packed_matrix m;
    m.k_ = k;
    m.width_ = width;
    m.rows_ = rows;
    m.paired_ = true;
    m.vectors_ = 2 * ((rows + width - 1) / width);
    m.data_ = aligned_floats(m.vectors_ * k * width);
    for (std::size_t r = 0; r < rows; ++r) {
      m.put(2 * (r / width), r % width, gate + r * k);
      m.put(2 * (r / width) + 1, r % width, up + r * k);
    }
    return m;
  }

  //! Output rows: the matrix rows, or the rows of each half of a pair.
  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  //! Row length (the inner dimension of the product).
  [[nodiscard]] std::size_t k() const noexcept { return k_; }
  //! Floats per vector (the CPU target's register width).
  [[nodiscard]] std::size_t width() const noexcept { return width_; }
  //! Vectors of `width()` rows (of a pair: gate and up vectors both).
  [[nodiscard]] std::size_t vectors() const noexcept { return vectors_; }
  //! Whether this is a (gate, up) pair.
  [[nodiscard]] bool paired() const noexcept { return paired_; }
  //! [vectors, k, width] the packed weights.
  [[nodiscard]] float const* data() const noexcept { return data_.data(); }
  //! Floats of packed weights.
  [[nodiscard]] std::size_t size() const noexcept { return data_.size(); }

 private:
  void put(std::size_t v, std::size_t lane, float const* row) noexcept {
    float* const dst = data_.data() + v * k_ * width_ + lane;
    for (std::size_t j = 0; j < k_; ++j) dst[j * width_] = row[j];
  }

  aligned_floats data_;
  std::size_t rows_ = 0, k_ = 0, width_ = 1, vectors_ = 0;
  bool paired_ = false;
};

//! What a packed product does with its dot products y[t, r] = sum_j w[r, j] x[t, j].
enum class panel_op {
  store,   //!< y[t, r] = dot
  add,     //!< y[t, r] = y[t, r] + dot
  swiglu,  //!< a pair: y[t, r] = silu(gate dot) * up dot
};

//! A Llama model's matrices repacked for `packed_gemm` (what `cpu_llama` runs small models on).
struct packed_llama {
  //! One layer's matrices.
  struct layer {
    packed_matrix qkv;  //!< [dim + 2 kv_dim, dim]: wq, wk, wv
    packed_matrix wo;   //!< [dim, dim]
    packed_matrix w13;  //!< gate (w1) and up (w3) pairs, [hidden_dim, dim] each
    packed_matrix w2;   //!< [dim, hidden_dim]
  };
  std::vector<layer> layers;  //!< [n_layers], or empty when not packed
  packed_matrix classifier;   //!< [vocab, dim]

  //! Bytes of the layer matrices and the classifier of a model of configuration `c`.
  [[nodiscard]] static std::size_t bytes(llama_config const& c) noexcept {
    auto const d = static_cast<std::size_t>(c.dim), kv = static_cast<std::size_t>(c.kv_dim());
    std::size_t const layer =
        2 * d * d + 2 * kv * d + 3 * static_cast<std::size_t>(c.hidden_dim) * d;
    return (static_cast<std::size_t>(c.n_layers) * layer +
            static_cast<std::size_t>(c.vocab_size) * d) *
           sizeof(float);
  }

  //! Repacks every matrix of `w` (complete: `detail::check_complete`).
  //! `width`: the packing's vector width (`model_kernels::width`).
  [[nodiscard]] static packed_llama pack(llama_weights const& w, std::size_t width) {
    auto const d = static_cast<std::size_t>(w.config.dim),
               kv = static_cast<std::size_t>(w.config.kv_dim());
    auto const hd = static_cast<std::size_t>(w.config.hidden_dim);
    packed_llama p;
    p.layers.reserve(w.layers.size());
    for (llama_layer_weights const& lw : w.layers)
      p.layers.push_back({packed_matrix({{lw.wq, d}, {lw.wk, kv}, {lw.wv, kv}}, d, width),
                          packed_matrix({{lw.wo, d}}, d, width),
                          packed_matrix::pairs(lw.w1, lw.w3, hd, d, width),
                          packed_matrix({{lw.w2, d}}, hd, width)});
    p.classifier =
        packed_matrix({{w.classifier, static_cast<std::size_t>(w.config.vocab_size)}}, d, width);
    return p;
  }
};

}  // namespace specdec::detail::cpu
