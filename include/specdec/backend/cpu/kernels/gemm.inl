//! \file
//! Matrix products for large models (`gemm_nt`): a register-tiled product of a batch of activation
//! rows with a block of weight rows in their original layout (each weight row is read from memory
//! once per call and reused for every token of the batch from cache). A kernel body:
//! backend/cpu/kernels.hpp compiles it once per CPU target.

//! Tokens per register tile of `gemm_nt` (16 accumulators of 32 registers with AVX-512, 8 of 16
//! otherwise).
inline constexpr std::size_t tile_tokens = simd::registers == 32 ? 4 : 2;

//! How far ahead (floats) of each weight row the tile kernels prefetch into L2: keeps enough
//! memory requests in flight while the core is busy with a batch's multiply-adds.
inline constexpr std::size_t prefetch_distance = 4096;

//! Prefetches the cache line at `p` into L2 (a hint: never faults, whatever the address).
inline void prefetch(float const* p) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_prefetch(reinterpret_cast<char const*>(p), _MM_HINT_T1);
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

//! Tokens per outer block of `gemm_nt` (bounds the partial sums and the activations kept hot).
inline constexpr std::size_t token_block = 64;
//! Floats of a row per inner block: a tile's weight block (tile_rows x k_block) stays in L1 while
//! every token tile of the batch passes over it.
inline constexpr std::size_t k_block = 1024;

//! acc[I], or a zero register past the end (resolved at compile time, so `acc` stays in registers).
template <std::size_t I, std::size_t N>
inline simd::reg acc_or_zero(simd::reg const (&acc)[N]) noexcept {
  if constexpr (I < N)
    return acc[I];
  else
    return simd::zero();
}

//! sums[4g .. 4g + 4) = the sums of acc[4g .. 4g + 4) (zeros past the end), for every group g.
template <std::size_t N, std::size_t... G>
inline void reduce_groups(simd::reg const (&acc)[N], float* sums,
                          std::index_sequence<G...>) noexcept {
  (simd::sum4(acc_or_zero<4 * G>(acc), acc_or_zero<4 * G + 1>(acc), acc_or_zero<4 * G + 2>(acc),
              acc_or_zero<4 * G + 3>(acc), sums + 4 * G),
   ...);
}

//! The operands of a tile's products (see `gemm_nt`): R weight rows from `w`, T tokens from `x`.
struct tile_args {
  float const* w;  //!< first weight row; rows ldw apart
  std::size_t ldw;
  float const* x;  //!< first token's activations; rows ldx apart
  std::size_t ldx;
  std::size_t k;  //!< row length
  float* part;    //!< partial sums between blocks, [R, ldp]
  std::size_t ldp;
  float* y;  //!< results y[t * ldy + r]
  std::size_t ldy;
  bool accumulate;  //!< add the dot products to y instead of storing them
};

//! The block [k0, k1) of R x T dot products (k1 - k0 a positive multiple of simd::width): partial
//! sum = previous partial (unless k0 == 0) + the block's sum; after the last block the scalar tail
//! [k1, k) is added and the result goes to y. The summation order of every dot product depends
//! only on k, never on R, T or the batch.
template <std::size_t R, std::size_t T, bool Prefetch>
inline void block_tile(tile_args const& a, std::size_t k0, std::size_t k1) noexcept {
  // The first step initialises the accumulators (fma(w, x, 0) == w * x exactly), which spares
  // zeroing them in memory.
  typename simd::reg acc[R * T];
  {
    typename simd::reg xv[T];
    for (std::size_t t = 0; t < T; ++t) xv[t] = simd::load(a.x + t * a.ldx + k0);
    for (std::size_t r = 0; r < R; ++r) {
      if constexpr (Prefetch) prefetch(a.w + r * a.ldw + k0 + prefetch_distance);
      typename simd::reg const wv = simd::load(a.w + r * a.ldw + k0);
      for (std::size_t t = 0; t < T; ++t) acc[r * T + t] = simd::mul(wv, xv[t]);
    }
  }
  for (std::size_t i = k0 + simd::width; i < k1; i += simd::width) {
    typename simd::reg xv[T];
    for (std::size_t t = 0; t < T; ++t) xv[t] = simd::load(a.x + t * a.ldx + i);
    for (std::size_t r = 0; r < R; ++r) {
      if constexpr (Prefetch) prefetch(a.w + r * a.ldw + i + prefetch_distance);
      typename simd::reg const wv = simd::load(a.w + r * a.ldw + i);
      for (std::size_t t = 0; t < T; ++t) acc[r * T + t] = simd::fma(wv, xv[t], acc[r * T + t]);
    }
  }
  constexpr std::size_t groups = (R * T + 3) / 4;
  float sums[4 * groups];
  reduce_groups(acc, sums, std::make_index_sequence<groups>());
  bool const first = k0 == 0;
  bool const last = a.k - k1 < simd::width;
  for (std::size_t r = 0; r < R; ++r) {
    for (std::size_t t = 0; t < T; ++t) {
      float s = first ? sums[r * T + t] : a.part[r * a.ldp + t] + sums[r * T + t];
      if (!last) {
        a.part[r * a.ldp + t] = s;
        continue;
      }
      for (std::size_t j = k1; j < a.k; ++j) s += a.w[r * a.ldw + j] * a.x[t * a.ldx + j];
      float& out = a.y[t * a.ldy + r];
      out = a.accumulate ? out + s : s;
    }
  }
}

//! The tile's token tile starting at token t.
inline tile_args at_token(tile_args a, std::size_t t) noexcept {
  a.x += t * a.ldx;
  a.part += t;
  a.y += t * a.ldy;
  return a;
}

//! R weight rows against tokens [0, n), n <= token_block: y[t, r] (+)= dot(w[r, :k], x[t, :k]).
//! For each block of k_block floats, every token tile passes over the rows' block (the first one
//! prefetching ahead, the others finding it in L1).
template <std::size_t R>
inline void row_tile(float const* w, std::size_t ldw, float const* x, std::size_t ldx,
                     std::size_t n, std::size_t k, float* y, std::size_t ldy,
                     bool accumulate) noexcept {
  std::size_t const kv = k - k % simd::width;
  if (kv == 0) {  // rows shorter than one register
    for (std::size_t r = 0; r < R; ++r) {
      for (std::size_t t = 0; t < n; ++t) {
        float s = 0.0f;
        for (std::size_t j = 0; j < k; ++j) s += w[r * ldw + j] * x[t * ldx + j];
        float& out = y[t * ldy + r];
        out = accumulate ? out + s : s;
      }
    }
    return;
  }
  float part[R * token_block];
  tile_args const args{w, ldw, x, ldx, k, part, token_block, y, ldy, accumulate};
  for (std::size_t k0 = 0; k0 < kv; k0 += k_block) {
    std::size_t const k1 = kv - k0 < k_block ? kv : k0 + k_block;
    if (n < tile_tokens) {
      if constexpr (tile_tokens > 3) {
        if (n == 3) block_tile<R, 3, true>(args, k0, k1);
      }
      if constexpr (tile_tokens > 2) {
        if (n == 2) block_tile<R, 2, true>(args, k0, k1);
      }
      if (n == 1) block_tile<R, 1, true>(args, k0, k1);
      continue;
    }
    // A single token left over joins the last full tile (T = 5 still fits the AVX-512 registers)
    // rather than taking a pass of its own.
    std::size_t const merge = tile_tokens == 4 && n % tile_tokens == 1 ? 1 : 0;
    std::size_t const full = n / tile_tokens - merge;  // plain full tiles
    if (full == 0) {
      if constexpr (tile_tokens == 4) block_tile<R, 5, true>(args, k0, k1);
      continue;
    }
    block_tile<R, tile_tokens, true>(args, k0, k1);
    std::size_t t = tile_tokens;
    for (; t < full * tile_tokens; t += tile_tokens)
      block_tile<R, tile_tokens, false>(at_token(args, t), k0, k1);
    if constexpr (tile_tokens == 4) {
      if (merge != 0) {
        block_tile<R, 5, false>(at_token(args, t), k0, k1);
        continue;
      }
    }
    std::size_t const rest = n - t;
    if constexpr (tile_tokens > 3) {
      if (rest == 3) block_tile<R, 3, false>(at_token(args, t), k0, k1);
    }
    if constexpr (tile_tokens > 2) {
      if (rest == 2) block_tile<R, 2, false>(at_token(args, t), k0, k1);
    }
    if (rest == 1) block_tile<R, 1, false>(at_token(args, t), k0, k1);
  }
}

//! Batches of (narrow_from, narrow_tokens] tokens take one pass over the weights, two weight rows
//! at a time against every token (AVX-512: 16 accumulators and 8 token registers), rather than
//! tile_tokens-wide passes over each block of rows: a pass after the first finds the block in L1
//! and issues no memory traffic, so the weight stream would stall for its duration. 0: none.
inline constexpr std::size_t narrow_tokens = simd::registers == 32 ? 8 : 0;
inline constexpr std::size_t narrow_from = 5;

//! `gemm_nt` for exactly T tokens (T <= narrow_tokens) in one pass: weight rows two at a time.
template <std::size_t T>
inline void narrow_gemm_nt(float const* w, std::size_t ldw, std::size_t r0, std::size_t r1,
                           float const* x, std::size_t ldx, std::size_t k, float* y,
                           std::size_t ldy, bool accumulate) noexcept {
  std::size_t const kv = k - k % simd::width;
  float part[2 * T];
  auto rows = [&]<std::size_t R>(std::size_t r) {
    tile_args const args{w + r * ldw, ldw, x, ldx, k, part, T, y + r, ldy, accumulate};
    for (std::size_t k0 = 0; k0 < kv; k0 += k_block)
      block_tile<R, T, true>(args, k0, kv - k0 < k_block ? kv : k0 + k_block);
  };
  std::size_t r = r0;
  for (; r + 2 <= r1; r += 2) rows.template operator()<2>(r);
  if (r < r1) rows.template operator()<1>(r);
}

//! y[t, r] (+)= sum_j w[r, j] x[t, j] for weight rows r in [r0, r1) and tokens t in [0, n):
//! the product of activations x [n, k] (rows ldx apart) with the transposed weight block
//! w [rows, k] (row-major, rows ldw apart); y [n, >= r1] rows ldy apart. Each weight row streams
//! from memory once per block of `token_block` tokens.
inline void gemm_nt(float const* w, std::size_t ldw, std::size_t r0, std::size_t r1, float const* x,
                    std::size_t ldx, std::size_t n, std::size_t k, float* y, std::size_t ldy,
                    bool accumulate) noexcept {
  if constexpr (narrow_tokens > 0) {
    if (n > narrow_from && n <= narrow_tokens && k >= simd::width) {
      with_count<narrow_tokens>(n, [&]<std::size_t T>() {
        if constexpr (T > narrow_from)
          narrow_gemm_nt<T>(w, ldw, r0, r1, x, ldx, k, y, ldy, accumulate);
      });
      return;
    }
  }
  for (std::size_t t0 = 0; t0 < n; t0 += token_block) {
    std::size_t const nt = n - t0 < token_block ? n - t0 : token_block;
    float const* const xb = x + t0 * ldx;
    float* const yb = y + t0 * ldy;
    std::size_t r = r0;
    for (; r + tile_rows <= r1; r += tile_rows)
      row_tile<tile_rows>(w + r * ldw, ldw, xb, ldx, nt, k, yb + r, ldy, accumulate);
    with_count<tile_rows - 1>(r1 - r, [&]<std::size_t R>() {
      row_tile<R>(w + r * ldw, ldw, xb, ldx, nt, k, yb + r, ldy, accumulate);
    });
  }
}
