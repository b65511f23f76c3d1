#pragma once
//! \file
//! The CPU backend's inner kernels: a register-tiled product of a batch of activation rows with
//! a block of weight rows (each weight row is read from memory once per call and reused for every
//! token of the batch from cache), RMSNorm, RoPE and SiLU. Internal to backend/cpu.

#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specdec::detail::cpu {

// ---- a minimal SIMD layer: one float register, loads, fused multiply-add, and `sum4`, which
// reduces four registers at once with a fixed summation tree (the same tree for each of the four,
// so a dot product's rounding never depends on which others it is reduced with).
#if defined(__AVX512F__)
struct simd {
  using reg = __m512;
  static constexpr std::size_t width = 16;
  static reg zero() noexcept { return _mm512_setzero_ps(); }
  static reg load(float const* p) noexcept { return _mm512_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) noexcept { return _mm512_fmadd_ps(a, b, c); }
  static reg mul(reg a, reg b) noexcept { return _mm512_mul_ps(a, b); }
  // GCC 12's unmasked AVX-512 shuffles start from an undefined register and warn
  // -Wuninitialized once inlined; the all-ones masked forms do the same without it.
  static void sum4(reg a, reg b, reg c, reg d, float* out) noexcept {
    constexpr __mmask16 all = 0xFFFF;
    reg const ab =
        _mm512_add_ps(_mm512_mask_unpacklo_ps(a, all, a, b), _mm512_mask_unpackhi_ps(a, all, a, b));
    reg const cd =
        _mm512_add_ps(_mm512_mask_unpacklo_ps(c, all, c, d), _mm512_mask_unpackhi_ps(c, all, c, d));
    reg u = _mm512_add_ps(_mm512_mask_shuffle_ps(ab, all, ab, cd, 0x44),
                          _mm512_mask_shuffle_ps(ab, all, ab, cd, 0xEE));
    u = _mm512_add_ps(u, _mm512_mask_shuffle_f32x4(u, all, u, u, 0x4E));
    u = _mm512_add_ps(u, _mm512_mask_shuffle_f32x4(u, all, u, u, 0xB1));
    _mm_storeu_ps(out, _mm512_mask_extractf32x4_ps(_mm_setzero_ps(), 0xF, u, 0));
  }
};
inline constexpr std::size_t tile_tokens = 4;  // 16 accumulators of 32 registers
#elif defined(__AVX2__) && defined(__FMA__)
struct simd {
  using reg = __m256;
  static constexpr std::size_t width = 8;
  static reg zero() noexcept { return _mm256_setzero_ps(); }
  static reg load(float const* p) noexcept { return _mm256_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) noexcept { return _mm256_fmadd_ps(a, b, c); }
  static reg mul(reg a, reg b) noexcept { return _mm256_mul_ps(a, b); }
  static void sum4(reg a, reg b, reg c, reg d, float* out) noexcept {
    reg const ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    reg const cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    reg const u = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xEE));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
  }
};
inline constexpr std::size_t tile_tokens = 2;  // 8 accumulators of 16 registers
#elif defined(__SSE2__)
struct simd {
  using reg = __m128;
  static constexpr std::size_t width = 4;
  static reg zero() noexcept { return _mm_setzero_ps(); }
  static reg load(float const* p) noexcept { return _mm_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) noexcept { return _mm_add_ps(_mm_mul_ps(a, b), c); }
  static reg mul(reg a, reg b) noexcept { return _mm_mul_ps(a, b); }
  static void sum4(reg a, reg b, reg c, reg d, float* out) noexcept {
    reg const ab = _mm_add_ps(_mm_unpacklo_ps(a, b), _mm_unpackhi_ps(a, b));
    reg const cd = _mm_add_ps(_mm_unpacklo_ps(c, d), _mm_unpackhi_ps(c, d));
    _mm_storeu_ps(out, _mm_add_ps(_mm_movelh_ps(ab, cd), _mm_movehl_ps(cd, ab)));
  }
};
inline constexpr std::size_t tile_tokens = 2;
#else
struct simd {
  using reg = float;
  static constexpr std::size_t width = 1;
  static reg zero() noexcept { return 0.0f; }
  static reg load(float const* p) noexcept { return *p; }
  static reg fma(reg a, reg b, reg c) noexcept { return a * b + c; }
  static reg mul(reg a, reg b) noexcept { return a * b; }
  static void sum4(reg a, reg b, reg c, reg d, float* out) noexcept {
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = d;
  }
};
inline constexpr std::size_t tile_tokens = 2;
#endif

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

//! Weight rows per tile.
inline constexpr std::size_t tile_rows = 4;
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

//! y[t, r] (+)= sum_j w[r, j] x[t, j] for weight rows r in [r0, r1) and tokens t in [0, n):
//! the product of activations x [n, k] (rows ldx apart) with the transposed weight block
//! w [rows, k] (row-major, rows ldw apart); y [n, >= r1] rows ldy apart. Each weight row streams
//! from memory once per block of `token_block` tokens.
inline void gemm_nt(float const* w, std::size_t ldw, std::size_t r0, std::size_t r1, float const* x,
                    std::size_t ldx, std::size_t n, std::size_t k, float* y, std::size_t ldy,
                    bool accumulate) noexcept {
  for (std::size_t t0 = 0; t0 < n; t0 += token_block) {
    std::size_t const nt = n - t0 < token_block ? n - t0 : token_block;
    float const* const xb = x + t0 * ldx;
    float* const yb = y + t0 * ldy;
    std::size_t r = r0;
    for (; r + tile_rows <= r1; r += tile_rows)
      row_tile<tile_rows>(w + r * ldw, ldw, xb, ldx, nt, k, yb + r, ldy, accumulate);
    switch (r1 - r) {
      case 3:
        row_tile<3>(w + r * ldw, ldw, xb, ldx, nt, k, yb + r, ldy, accumulate);
        break;
      case 2:
        row_tile<2>(w + r * ldw, ldw, xb, ldx, nt, k, yb + r, ldy, accumulate);
        break;
      case 1:
        row_tile<1>(w + r * ldw, ldw, xb, ldx, nt, k, yb + r, ldy, accumulate);
        break;
      default:
        break;
    }
  }
}

// ---- attention: 8- (AVX2) or 4-wide (SSE2) vectors along the head dimension.
#if defined(__AVX2__) && defined(__FMA__)
struct vec {
  using reg = __m256;
  static constexpr std::size_t width = 8;
  static reg zero() noexcept { return _mm256_setzero_ps(); }
  static reg set1(float x) noexcept { return _mm256_set1_ps(x); }
  static reg load(float const* p) noexcept { return _mm256_loadu_ps(p); }
  static void store(float* p, reg a) noexcept { _mm256_storeu_ps(p, a); }
  static reg add(reg a, reg b) noexcept { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) noexcept { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) noexcept { return _mm256_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) noexcept { return _mm256_fmadd_ps(a, b, c); }
  static reg max(reg a, reg b) noexcept { return _mm256_max_ps(a, b); }
  static float hmax(reg a) noexcept {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 0x55));
    return _mm_cvtss_f32(m);
  }
  static float sum(reg a) noexcept {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
  }
  //! out[0..4) = the sums of a, b, c, d.
  static void sum4(reg a, reg b, reg c, reg d, float* out) noexcept {
    reg const ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    reg const cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    reg const u = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xEE));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
  }
  //! exp(x) for x <= 0 (Cephes' polynomial, ~1 ulp); 0 below -87 (and for -inf).
  static reg exp(reg x) noexcept {
    reg const tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256i const n = _mm256_cvtps_epi32(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)));
    reg const fn = _mm256_cvtepi32_ps(n);
    x = _mm256_fnmadd_ps(fn, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fn, _mm256_set1_ps(-2.12194440e-4f), x);
    reg y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i const e = _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(tiny, y);
  }
};
#elif defined(__SSE2__)
struct vec {
  using reg = __m128;
  static constexpr std::size_t width = 4;
  static reg zero() noexcept { return _mm_setzero_ps(); }
  static reg set1(float x) noexcept { return _mm_set1_ps(x); }
  static reg load(float const* p) noexcept { return _mm_loadu_ps(p); }
  static void store(float* p, reg a) noexcept { _mm_storeu_ps(p, a); }
  static reg add(reg a, reg b) noexcept { return _mm_add_ps(a, b); }
  static reg sub(reg a, reg b) noexcept { return _mm_sub_ps(a, b); }
  static reg mul(reg a, reg b) noexcept { return _mm_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) noexcept { return _mm_add_ps(_mm_mul_ps(a, b), c); }
  static reg max(reg a, reg b) noexcept { return _mm_max_ps(a, b); }
  static float hmax(reg a) noexcept {
    __m128 m = _mm_max_ps(a, _mm_movehl_ps(a, a));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 0x55));
    return _mm_cvtss_f32(m);
  }
  static float sum(reg a) noexcept {
    __m128 s = _mm_add_ps(a, _mm_movehl_ps(a, a));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
  }
  static void sum4(reg a, reg b, reg c, reg d, float* out) noexcept {
    reg const ab = _mm_add_ps(_mm_unpacklo_ps(a, b), _mm_unpackhi_ps(a, b));
    reg const cd = _mm_add_ps(_mm_unpacklo_ps(c, d), _mm_unpackhi_ps(c, d));
    _mm_storeu_ps(out, _mm_add_ps(_mm_movelh_ps(ab, cd), _mm_movehl_ps(cd, ab)));
  }
  static reg exp(reg x) noexcept {
    reg const tiny = _mm_cmplt_ps(x, _mm_set1_ps(-87.0f));
    x = _mm_max_ps(x, _mm_set1_ps(-87.0f));
    __m128i const n = _mm_cvtps_epi32(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f)));
    reg const fn = _mm_cvtepi32_ps(n);
    x = _mm_sub_ps(x, _mm_mul_ps(fn, _mm_set1_ps(0.693359375f)));
    x = _mm_sub_ps(x, _mm_mul_ps(fn, _mm_set1_ps(-2.12194440e-4f)));
    reg y = _mm_set1_ps(1.9875691500e-4f);
    y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(1.3981999507e-3f));
    y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(8.3334519073e-3f));
    y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(4.1665795894e-2f));
    y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(1.6666665459e-1f));
    y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(5.0000001201e-1f));
    y = _mm_add_ps(_mm_mul_ps(y, _mm_mul_ps(x, x)), _mm_add_ps(x, _mm_set1_ps(1.0f)));
    __m128i const e = _mm_slli_epi32(_mm_add_epi32(n, _mm_set1_epi32(127)), 23);
    y = _mm_mul_ps(y, _mm_castsi128_ps(e));
    return _mm_andnot_ps(tiny, y);
  }
};
#endif

//! s[j] = scale * dot(q[:hs], k[j * ldk : j * ldk + hs]) for j in [0, n): a query against n key
//! rows (rows ldk floats apart). Every row is computed the same way, whatever its index and n.
inline void attention_scores(float const* q, float const* k, std::size_t ldk, std::size_t n,
                             std::size_t hs, float scale, float* s) noexcept {
#if defined(__SSE2__)
  if (hs % vec::width == 0) {
    for (std::size_t j = 0; j < n; j += 4) {
      std::size_t const rows = n - j < 4 ? n - j : 4;
      float const* const k0 = k + j * ldk;
      vec::reg a[4] = {vec::zero(), vec::zero(), vec::zero(), vec::zero()};
      for (std::size_t d = 0; d < hs; d += vec::width) {
        vec::reg const qv = vec::load(q + d);
        for (std::size_t r = 0; r < rows; ++r)
          a[r] = vec::fma(qv, vec::load(k0 + r * ldk + d), a[r]);
      }
      float out[4];
      vec::sum4(a[0], a[1], a[2], a[3], out);
      for (std::size_t r = 0; r < rows; ++r) s[j + r] = out[r] * scale;
    }
    return;
  }
#endif
  for (std::size_t j = 0; j < n; ++j) {
    float const* const kj = k + j * ldk;
    float dot = 0.0f;
    for (std::size_t d = 0; d < hs; ++d) dot += q[d] * kj[d];
    s[j] = dot * scale;
  }
}

//! Replaces s[0..n) by exp(s[j] - max s); entries of -inf become 0. Elementwise identical
//! whatever n.
inline void softmax_exp(float* s, std::size_t n) noexcept {
  float max = -std::numeric_limits<float>::infinity();
  std::size_t j = 0;
#if defined(__SSE2__)
  if (n >= vec::width) {
    vec::reg m = vec::load(s);
    for (j = vec::width; j + vec::width <= n; j += vec::width) m = vec::max(m, vec::load(s + j));
    max = vec::hmax(m);
  }
#endif
  for (; j < n; ++j) max = s[j] > max ? s[j] : max;
#if defined(__SSE2__)
  vec::reg const mv = vec::set1(max);
  for (j = 0; j + vec::width <= n; j += vec::width)
    vec::store(s + j, vec::exp(vec::sub(vec::load(s + j), mv)));
  if (j < n) {  // the tail through the same vector code
    float pad[vec::width];
    for (std::size_t i = 0; i < vec::width; ++i) pad[i] = j + i < n ? s[j + i] : max;
    vec::store(pad, vec::exp(vec::sub(vec::load(pad), mv)));
    for (std::size_t i = 0; j + i < n; ++i) s[j + i] = pad[i];
  }
#else
  for (j = 0; j < n; ++j)
    s[j] = s[j] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(s[j] - max);
#endif
}

//! The sum of s[0..n), accumulated in lanes by index (lane = j mod width) and then reduced with a
//! fixed tree: appending zeros to s does not change the result.
inline float lane_sum(float const* s, std::size_t n) noexcept {
#if defined(__SSE2__)
  vec::reg acc = vec::zero();
  std::size_t j = 0;
  for (; j + vec::width <= n; j += vec::width) acc = vec::add(acc, vec::load(s + j));
  if (j < n) {
    float pad[vec::width];
    for (std::size_t i = 0; i < vec::width; ++i) pad[i] = j + i < n ? s[j + i] : 0.0f;
    acc = vec::add(acc, vec::load(pad));
  }
  return vec::sum(acc);
#else
  float sum = 0.0f;
  for (std::size_t j = 0; j < n; ++j) sum += s[j];
  return sum;
#endif
}

//! out[:hs] = sum_j p[j] * v[j * ldv : j * ldv + hs] for j in [0, n), accumulated in order of j
//! (so rows with p[j] = 0 change nothing).
inline void attention_values(float const* p, float const* v, std::size_t ldv, std::size_t n,
                             std::size_t hs, float* out) noexcept {
#if defined(__SSE2__)
  if (hs % vec::width == 0) {
    constexpr std::size_t block = 8;  // accumulators
    for (std::size_t d0 = 0; d0 < hs; d0 += block * vec::width) {
      std::size_t const chunks = (hs - d0) / vec::width < block ? (hs - d0) / vec::width : block;
      vec::reg acc[block];
      for (std::size_t c = 0; c < block; ++c) acc[c] = vec::zero();
      for (std::size_t j = 0; j < n; ++j) {
        vec::reg const pj = vec::set1(p[j]);
        float const* const vj = v + j * ldv + d0;
        for (std::size_t c = 0; c < chunks; ++c)
          acc[c] = vec::fma(pj, vec::load(vj + c * vec::width), acc[c]);
      }
      for (std::size_t c = 0; c < chunks; ++c) vec::store(out + d0 + c * vec::width, acc[c]);
    }
    return;
  }
#endif
  for (std::size_t d = 0; d < hs; ++d) out[d] = 0.0f;
  for (std::size_t j = 0; j < n; ++j) {
    float const pj = p[j];
    float const* const vj = v + j * ldv;
    for (std::size_t d = 0; d < hs; ++d) out[d] += pj * vj[d];
  }
}

//! out[:n] = x[:n] / sqrt(mean(x^2) + eps) * weight[:n].
inline void rmsnorm(float* out, float const* x, float const* weight, std::size_t n,
                    float eps) noexcept {
  float ss = 0.0f;
  for (std::size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  float const scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

//! Rotates the interleaved pairs (2i, 2i + 1) of each of `heads` heads of `head_size` floats at
//! `v` by the angles whose cosines and sines are cos_sin[2i], cos_sin[2i + 1].
inline void rope(float* v, std::size_t heads, std::size_t head_size,
                 float const* cos_sin) noexcept {
  for (std::size_t h = 0; h < heads; ++h) {
    float* const p = v + h * head_size;
    for (std::size_t i = 0; i < head_size; i += 2) {
      float const c = cos_sin[i];
      float const s = cos_sin[i + 1];
      float const a = p[i];
      float const b = p[i + 1];
      p[i] = a * c - b * s;
      p[i + 1] = a * s + b * c;
    }
  }
}

//! gate[i] = silu(gate[i]) * up[i] for i in [0, n).
inline void swiglu(float* gate, float const* up, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    float const g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

}  // namespace specdec::detail::cpu
