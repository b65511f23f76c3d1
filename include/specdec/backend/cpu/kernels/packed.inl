//! \file
//! Matrix products for small models (`packed_gemm`): weights repacked once (`packed_matrix`) so
//! that one register holds one weight column of simd::width consecutive rows; a product is then
//! multiply-adds only (no horizontal reductions), register-tiled over rows and tokens, with the
//! residual add or SwiGLU fused into its last step. A kernel body: backend/cpu/kernels.hpp compiles
//! it once per CPU target.

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
//! stay in L1 while every token tile of the batch passes over them. `w` is packed at this target's
//! width (`w.width() == simd::width`).
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
