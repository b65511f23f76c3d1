#pragma once
//! \file
//! Matrix products for small models (`packed_gemm`): weights repacked once (`packed_matrix`) so
//! that one register holds one weight column of simd::width consecutive rows; a product is then
//! multiply-adds only (no horizontal reductions), register-tiled over rows and tokens, with the
//! residual add or SwiGLU fused into its last step. Internal to backend/cpu.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "specdec/backend/cpu/aligned_floats.hpp"
#include "specdec/backend/cpu/gemm.hpp"
#include "specdec/detail/simd_registers.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec::detail::cpu {

//! A weight matrix [rows, k] repacked for `packed_gemm`: vectors of simd::width consecutive rows,
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
  packed_matrix(std::initializer_list<block> blocks, std::size_t k) : k_(k) {
    for (block const& b : blocks) rows_ += b.rows;
    vectors_ = (rows_ + simd::width - 1) / simd::width;
    data_ = aligned_floats(vectors_ * k_ * simd::width);
    std::size_t r = 0;
    for (block const& b : blocks)
      for (std::size_t i = 0; i < b.rows; ++i, ++r)
        put(r / simd::width, r % simd::width, b.data + i * k);
  }

  //! SwiGLU's gate and up matrices [rows, k] interleaved: vector 2i holds gate rows
  //! [i width, (i + 1) width), vector 2i + 1 the same rows of up; `rows()` is the output width.
  static packed_matrix pairs(float const* gate, float const* up, std::size_t rows, std::size_t k) {
    packed_matrix m;
    m.k_ = k;
    m.rows_ = rows;
    m.paired_ = true;
    m.vectors_ = 2 * ((rows + simd::width - 1) / simd::width);
    m.data_ = aligned_floats(m.vectors_ * k * simd::width);
    for (std::size_t r = 0; r < rows; ++r) {
      m.put(2 * (r / simd::width), r % simd::width, gate + r * k);
      m.put(2 * (r / simd::width) + 1, r % simd::width, up + r * k);
    }
    return m;
  }

  //! Output rows: the matrix rows, or the rows of each half of a pair.
  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  //! Row length (the inner dimension of the product).
  [[nodiscard]] std::size_t k() const noexcept { return k_; }
  //! Vectors of simd::width rows (of a pair: gate and up vectors both).
  [[nodiscard]] std::size_t vectors() const noexcept { return vectors_; }
  //! Whether this is a (gate, up) pair.
  [[nodiscard]] bool paired() const noexcept { return paired_; }
  //! [vectors, k, simd::width] the packed weights.
  [[nodiscard]] float const* data() const noexcept { return data_.data(); }
  //! Floats of packed weights.
  [[nodiscard]] std::size_t size() const noexcept { return data_.size(); }

 private:
  void put(std::size_t v, std::size_t lane, float const* row) noexcept {
    float* const dst = data_.data() + v * k_ * simd::width + lane;
    for (std::size_t j = 0; j < k_; ++j) dst[j * simd::width] = row[j];
  }

  aligned_floats data_;
  std::size_t rows_ = 0, k_ = 0, vectors_ = 0;
  bool paired_ = false;
};

//! What a packed product does with its dot products y[t, r] = sum_j w[r, j] x[t, j].
enum class panel_op {
  store,   //!< y[t, r] = dot
  add,     //!< y[t, r] = y[t, r] + dot
  swiglu,  //!< a pair: y[t, r] = silu(gate dot) * up dot
};

//! The operands of `panel_tile`.
struct panel_args {
  float const* w;       //!< the packed matrix
  std::size_t vstride;  //!< floats from one vector to the next (k * simd::width)
  std::size_t k;        //!< row length
  float const* x;       //!< first token's activations [n, k], rows ldx apart
  std::size_t ldx;
  float* y;  //!< first token's outputs, rows ldy apart
  std::size_t ldy;
  std::size_t rows;  //!< output columns (columns past it are never written)
};

//! Vectors of a tile with one token (the matrix-vector product streams them in parallel).
inline constexpr std::size_t gemv_vectors = simd::registers == 32 ? 8 : 4;
//! Vectors of a tile with several tokens.
inline constexpr std::size_t tile_vectors = simd::registers == 32 ? 4 : 2;
//! Most tokens of a tile with `tile_vectors` vectors (accumulators + weights + a broadcast fit
//! the registers).
inline constexpr std::size_t max_tile_tokens = simd::registers == 32 ? 6 : 5;

//! Vectors [v, v + M) of the packed matrix against tokens [t0, t0 + T): M x T registers of
//! simd::width dot products, each accumulated over j = 0, 1, ..., k - 1 in that order by one
//! multiply-add per step (the same sequence for every row and token, whatever M, T, the tile or
//! the thread), then stored, added or paired through SwiGLU.
template <std::size_t M, std::size_t T, panel_op Op>
inline void panel_tile(panel_args const& a, std::size_t v, std::size_t t0) noexcept {
  constexpr std::size_t w_lanes = simd::width;
  float const* const w = a.w + v * a.vstride;
  float const* const x = a.x + t0 * a.ldx;
  typename simd::reg acc[M][T];
  for (std::size_t m = 0; m < M; ++m)
    for (std::size_t t = 0; t < T; ++t) acc[m][t] = simd::zero();
  for (std::size_t j = 0; j < a.k; ++j) {
    typename simd::reg wv[M];
    for (std::size_t m = 0; m < M; ++m) wv[m] = simd::load(w + m * a.vstride + j * w_lanes);
    for (std::size_t t = 0; t < T; ++t) {
      typename simd::reg const xb = simd::set1(x[t * a.ldx + j]);
      for (std::size_t m = 0; m < M; ++m) acc[m][t] = simd::fma(wv[m], xb, acc[m][t]);
    }
  }
  float* const y = a.y + t0 * a.ldy;
  if constexpr (Op == panel_op::swiglu) {
    for (std::size_t p = 0; p < M / 2; ++p) {
      std::size_t const col = (v / 2 + p) * w_lanes;
      std::size_t const count = std::min(w_lanes, a.rows - col);
      for (std::size_t t = 0; t < T; ++t) {
        typename simd::reg const h = simd::silu_mul(acc[2 * p][t], acc[2 * p + 1][t]);
        float* const dst = y + t * a.ldy + col;
        if (count == w_lanes)
          simd::store(dst, h);
        else
          simd::store_part(dst, h, count);
      }
    }
  } else {
    for (std::size_t m = 0; m < M; ++m) {
      std::size_t const col = (v + m) * w_lanes;
      std::size_t const count = std::min(w_lanes, a.rows - col);
      for (std::size_t t = 0; t < T; ++t) {
        float* const dst = y + t * a.ldy + col;
        typename simd::reg r = acc[m][t];
        if (count == w_lanes) {
          if constexpr (Op == panel_op::add) r = simd::add(simd::load(dst), r);
          simd::store(dst, r);
        } else {
          if constexpr (Op == panel_op::add) r = simd::add(simd::load_part(dst, count), r);
          simd::store_part(dst, r, count);
        }
      }
    }
  }
}

//! panel_tile<M, T, Op> for a run-time T in [1, max_tile_tokens].
template <std::size_t M, panel_op Op>
inline void panel_tokens(panel_args const& a, std::size_t v, std::size_t t0,
                         std::size_t tokens) noexcept {
  with_count<max_tile_tokens>(tokens, [&]<std::size_t T>() { panel_tile<M, T, Op>(a, v, t0); });
}

//! Vectors [v0, v1) of `w` (for a pair: both even) against tokens [0, n): y[t, r] (+)= the dot
//! products of rows r in [v0 width, min(v1 width, rows)) with x[t, :k] (x rows ldx apart, y rows
//! ldy apart), or for a pair the SwiGLU of the gate and up products. The rows of a vector group
//! stay in L1 while every token tile of the batch passes over them.
template <panel_op Op>
inline void packed_gemm(packed_matrix const& w, std::size_t v0, std::size_t v1, float const* x,
                        std::size_t ldx, std::size_t n, float* y, std::size_t ldy) noexcept {
  panel_args const a{w.data(), w.k() * simd::width, w.k(), x, ldx, y, ldy, w.rows()};
  std::size_t v = v0;
  if (n == 1) {
    for (; v + gemv_vectors <= v1; v += gemv_vectors) panel_tile<gemv_vectors, 1, Op>(a, v, 0);
    if constexpr (gemv_vectors > 4) {
      if (v + 4 <= v1) {
        panel_tile<4, 1, Op>(a, v, 0);
        v += 4;
      }
    }
    if (v + 2 <= v1) {
      panel_tile<2, 1, Op>(a, v, 0);
      v += 2;
    }
    if (v < v1) panel_tile<1, 1, Op>(a, v, 0);
    return;
  }
  std::size_t const tiles = (n + max_tile_tokens - 1) / max_tile_tokens;
  while (v < v1) {
    std::size_t const left = v1 - v;
    std::size_t const m = left >= tile_vectors ? tile_vectors : left >= 2 ? 2 : 1;
    for (std::size_t i = 0; i < tiles; ++i) {
      std::size_t const t0 = n * i / tiles, t1 = n * (i + 1) / tiles;
      if (m == tile_vectors)
        panel_tokens<tile_vectors, Op>(a, v, t0, t1 - t0);
      else if (m == 2)
        panel_tokens<2, Op>(a, v, t0, t1 - t0);
      else
        panel_tokens<1, Op>(a, v, t0, t1 - t0);
    }
    v += m;
  }
}

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
  [[nodiscard]] static packed_llama pack(llama_weights const& w) {
    auto const d = static_cast<std::size_t>(w.config.dim),
               kv = static_cast<std::size_t>(w.config.kv_dim());
    auto const hd = static_cast<std::size_t>(w.config.hidden_dim);
    packed_llama p;
    p.layers.reserve(w.layers.size());
    for (llama_layer_weights const& lw : w.layers)
      p.layers.push_back({packed_matrix({{lw.wq, d}, {lw.wk, kv}, {lw.wv, kv}}, d),
                          packed_matrix({{lw.wo, d}}, d), packed_matrix::pairs(lw.w1, lw.w3, hd, d),
                          packed_matrix({{lw.w2, d}}, hd)});
    p.classifier =
        packed_matrix({{w.classifier, static_cast<std::size_t>(w.config.vocab_size)}}, d);
    return p;
  }
};

}  // namespace specdec::detail::cpu
