#pragma once
//! \file
//! The CPU backend's inner kernels: a register-tiled product of a batch of activation rows with
//! a block of weight rows (each weight row is read from memory once per call and reused for every
//! token of the batch from cache), RMSNorm, RoPE and SiLU. Internal to backend/cpu.

#include <cmath>
#include <cstddef>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specdec::detail::cpu {

// ---- a minimal SIMD layer: one float register, loads, fused multiply-add, horizontal sum.
#if defined(__AVX512F__)
struct simd {
  using reg = __m512;
  static constexpr std::size_t width = 16;
  static reg zero() noexcept { return _mm512_setzero_ps(); }
  static reg load(float const* p) noexcept { return _mm512_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) noexcept { return _mm512_fmadd_ps(a, b, c); }
  static float sum(reg a) noexcept { return _mm512_reduce_add_ps(a); }
};
inline constexpr std::size_t tile_tokens = 4;  // 16 accumulators of 32 registers
#elif defined(__AVX2__) && defined(__FMA__)
struct simd {
  using reg = __m256;
  static constexpr std::size_t width = 8;
  static reg zero() noexcept { return _mm256_setzero_ps(); }
  static reg load(float const* p) noexcept { return _mm256_loadu_ps(p); }
  static reg fma(reg a, reg b, reg c) noexcept { return _mm256_fmadd_ps(a, b, c); }
  static float sum(reg a) noexcept {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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
  static float sum(reg a) noexcept {
    __m128 s = _mm_add_ps(a, _mm_movehl_ps(a, a));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    return _mm_cvtss_f32(s);
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
  static float sum(reg a) noexcept { return a; }
};
inline constexpr std::size_t tile_tokens = 2;
#endif

//! Weight rows per tile.
inline constexpr std::size_t tile_rows = 4;
//! Tokens per outer block of `gemm_nt` (bounds the activations kept hot in cache).
inline constexpr std::size_t token_block = 64;

//! y[t, r] (+)= dot(w[r, :k], x[t, :k]) for R weight rows and T tokens. Every dot product is
//! computed in the same order whatever R and T, so results do not depend on the batch.
template <std::size_t R, std::size_t T>
inline void dot_tile(float const* w, std::size_t ldw, float const* x, std::size_t ldx,
                     std::size_t k, float* y, std::size_t ldy, bool accumulate) noexcept {
  typename simd::reg acc[R][T];
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) acc[r][t] = simd::zero();
  std::size_t i = 0;
  for (; i + simd::width <= k; i += simd::width) {
    typename simd::reg xv[T];
    for (std::size_t t = 0; t < T; ++t) xv[t] = simd::load(x + t * ldx + i);
    for (std::size_t r = 0; r < R; ++r) {
      typename simd::reg const wv = simd::load(w + r * ldw + i);
      for (std::size_t t = 0; t < T; ++t) acc[r][t] = simd::fma(wv, xv[t], acc[r][t]);
    }
  }
  for (std::size_t r = 0; r < R; ++r) {
    for (std::size_t t = 0; t < T; ++t) {
      float s = simd::sum(acc[r][t]);
      for (std::size_t j = i; j < k; ++j) s += w[r * ldw + j] * x[t * ldx + j];
      float& out = y[t * ldy + r];
      out = accumulate ? out + s : s;
    }
  }
}

//! One tile row (R weight rows) against tokens [0, n).
template <std::size_t R>
inline void row_tile(float const* w, std::size_t ldw, float const* x, std::size_t ldx,
                     std::size_t n, std::size_t k, float* y, std::size_t ldy,
                     bool accumulate) noexcept {
  std::size_t t = 0;
  for (; t + tile_tokens <= n; t += tile_tokens)
    dot_tile<R, tile_tokens>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy, accumulate);
  std::size_t const rest = n - t;
  if constexpr (tile_tokens > 3) {
    if (rest == 3) dot_tile<R, 3>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy, accumulate);
  }
  if constexpr (tile_tokens > 2) {
    if (rest == 2) dot_tile<R, 2>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy, accumulate);
  }
  if (rest == 1) dot_tile<R, 1>(w, ldw, x + t * ldx, ldx, k, y + t * ldy, ldy, accumulate);
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
