#pragma once
//! \file
//! The CPU backend's inner kernels. Internal to backend/cpu.
//!
//! - Matrix products for large models (`gemm_nt`): a register-tiled product of a batch of
//!   activation rows with a block of weight rows in their original layout (each weight row is read
//!   from memory once per call and reused for every token of the batch from cache).
//! - Matrix products for small models (`packed_gemm`): weights repacked once (`packed_matrix`) so
//!   that one register holds one weight column of simd::width consecutive rows; a product is then
//!   multiply-adds only (no horizontal reductions), register-tiled over rows and tokens, with the
//!   residual add or SwiGLU fused into its last step.
//! - Attention over a virtual sequence of cache rows (`row_run`): scores (AVX-512 with 8-float
//!   heads: keys transposed into blocks of 16), softmax, values.
//! - RMSNorm, RoPE, SwiGLU.
//!
//! Every output is computed by a fixed sequence of operations that depends only on the model's
//! shape, never on the batch, the tile it lands in or the thread that computes it (the CPU
//! backend's batch invariance).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <new>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specdec::detail::cpu {

// ---- vec: 8- (AVX2) or 4-wide (SSE2) vectors (attention along the head dimension; the exp
// and horizontal sums of `simd` on those ISAs).
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
  //! exp(x) for x <= 0 (Cephes' polynomial, ~1 ulp); 0 below `floor` (>= -87) and for -inf.
  static reg exp(reg x, float floor = -87.0f) noexcept {
    reg const tiny = _mm256_cmp_ps(x, _mm256_set1_ps(floor), _CMP_LT_OQ);
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
  static reg exp(reg x, float floor = -87.0f) noexcept {
    reg const tiny = _mm_cmplt_ps(x, _mm_set1_ps(floor));
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

// ---- simd: the widest float register, with loads and stores of whole or partial registers,
// arithmetic, a fixed-tree horizontal sum, exp(x) for x <= 0, SiLU, and `sum4`, which reduces
// four registers at once with a fixed summation tree (the same tree for each of the four, so a dot
// product's rounding never depends on which others it is reduced with).
#if defined(__AVX512F__)
struct simd {
  using reg = __m512;
  static constexpr std::size_t width = 16;
  static constexpr std::size_t registers = 32;
  // GCC 12's unmasked AVX-512 shuffles (and a few other unmasked forms) start from an undefined
  // register and warn -Wuninitialized once inlined; the all-ones masked forms do the same without
  // it.
  static constexpr __mmask16 all = 0xFFFF;
  static reg zero() noexcept { return _mm512_setzero_ps(); }
  static reg set1(float x) noexcept { return _mm512_set1_ps(x); }
  static reg load(float const* p) noexcept { return _mm512_loadu_ps(p); }
  static void store(float* p, reg a) noexcept { _mm512_storeu_ps(p, a); }
  //! The mask of lanes [0, n), n <= width.
  static __mmask16 first(std::size_t n) noexcept { return static_cast<__mmask16>((1u << n) - 1u); }
  //! p[0, n) in lanes [0, n), zeros above (n <= width; nothing past p + n is read).
  static reg load_part(float const* p, std::size_t n) noexcept {
    return _mm512_maskz_loadu_ps(first(n), p);
  }
  //! Stores lanes [0, n) to p[0, n) (n <= width; nothing past p + n is written).
  static void store_part(float* p, reg a, std::size_t n) noexcept {
    _mm512_mask_storeu_ps(p, first(n), a);
  }
  static reg add(reg a, reg b) noexcept { return _mm512_add_ps(a, b); }
  static reg sub(reg a, reg b) noexcept { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) noexcept { return _mm512_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) noexcept { return _mm512_fmadd_ps(a, b, c); }
  static reg max(reg a, reg b) noexcept { return _mm512_mask_max_ps(a, all, a, b); }
  //! The two 256-bit halves.
  static __m256 low(reg a) noexcept {
    return _mm256_castpd_ps(
        _mm512_mask_extractf64x4_pd(_mm256_setzero_pd(), 0xF, _mm512_castps_pd(a), 0));
  }
  static __m256 high(reg a) noexcept {
    return _mm256_castpd_ps(
        _mm512_mask_extractf64x4_pd(_mm256_setzero_pd(), 0xF, _mm512_castps_pd(a), 1));
  }
  //! The sum of the lanes (fixed tree: halves, then quarters, then pairs).
  static float hsum(reg a) noexcept;
  //! The largest lane.
  static float hmax(reg a) noexcept;
  //! exp(x) for x <= 0 (Cephes' polynomial, ~1 ulp); 0 below `floor` (>= -87) and for -inf.
  static reg exp(reg x, float floor = -87.0f) noexcept {
    __mmask16 const keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(floor), _CMP_GE_OQ);
    return _mm512_maskz_mov_ps(keep, exp_clamped(max(x, _mm512_set1_ps(-87.0f))));
  }
  //! exp(x) for x in [-87, 0] (the polynomial of `exp` without its range checks).
  static reg exp_clamped(reg x) noexcept {
    reg const fn = _mm512_mask_roundscale_ps(x, all, mul(x, _mm512_set1_ps(1.44269504088896341f)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fn, _mm512_set1_ps(-2.12194440e-4f), x);
    reg y = _mm512_set1_ps(1.9875691500e-4f);
    y = fma(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = fma(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = fma(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = fma(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = fma(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = fma(y, mul(x, x), add(x, _mm512_set1_ps(1.0f)));
    return _mm512_mask_scalef_ps(y, all, y, fn);
  }
  //! silu(g) * u = g / (1 + exp(-g)) * u, with exp taken of -|g| only (so it never overflows).
  static reg silu_mul(reg g, reg u) noexcept {
    __mmask16 const negative = _mm512_cmp_ps_mask(g, zero(), _CMP_LT_OQ);
    reg const minus_abs = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(g), _mm512_set1_epi32(std::numeric_limits<int>::min())));
    reg const e = exp(minus_abs);
    reg const den = add(e, _mm512_set1_ps(1.0f));
    reg inv = _mm512_mask_rcp14_ps(den, all, den);
    inv = mul(inv, _mm512_fnmadd_ps(den, inv, _mm512_set1_ps(2.0f)));  // one Newton step
    reg const num = _mm512_mask_mul_ps(g, negative, g, e);             // g >= 0: g; else g e
    return mul(mul(num, inv), u);
  }
  static void sum4(reg a, reg b, reg c, reg d, float* out) noexcept {
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
inline float simd::hsum(reg a) noexcept {
  return vec::sum(_mm256_add_ps(low(a), high(a)));
}
inline float simd::hmax(reg a) noexcept {
  return vec::hmax(_mm256_max_ps(low(a), high(a)));
}
inline constexpr std::size_t tile_tokens = 4;  // 16 accumulators of 32 registers
#elif defined(__AVX2__) && defined(__FMA__)
struct simd {
  using reg = __m256;
  static constexpr std::size_t width = 8;
  static constexpr std::size_t registers = 16;
  static reg zero() noexcept { return _mm256_setzero_ps(); }
  static reg set1(float x) noexcept { return _mm256_set1_ps(x); }
  static reg load(float const* p) noexcept { return _mm256_loadu_ps(p); }
  static void store(float* p, reg a) noexcept { _mm256_storeu_ps(p, a); }
  static __m256i first(std::size_t n) noexcept {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static reg load_part(float const* p, std::size_t n) noexcept {
    return _mm256_maskload_ps(p, first(n));
  }
  static void store_part(float* p, reg a, std::size_t n) noexcept {
    _mm256_maskstore_ps(p, first(n), a);
  }
  static reg add(reg a, reg b) noexcept { return _mm256_add_ps(a, b); }
  static reg sub(reg a, reg b) noexcept { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) noexcept { return _mm256_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) noexcept { return _mm256_fmadd_ps(a, b, c); }
  static reg max(reg a, reg b) noexcept { return _mm256_max_ps(a, b); }
  static float hsum(reg a) noexcept { return vec::sum(a); }
  static float hmax(reg a) noexcept { return vec::hmax(a); }
  static reg exp(reg x, float floor = -87.0f) noexcept { return vec::exp(x, floor); }
  static reg silu_mul(reg g, reg u) noexcept {
    reg const e = vec::exp(_mm256_or_ps(g, _mm256_set1_ps(-0.0f)));  // exp(-|g|)
    reg const num = _mm256_blendv_ps(g, mul(g, e), _mm256_cmp_ps(g, zero(), _CMP_LT_OQ));
    return mul(_mm256_div_ps(num, add(e, _mm256_set1_ps(1.0f))), u);
  }
  static void sum4(reg a, reg b, reg c, reg d, float* out) noexcept { vec::sum4(a, b, c, d, out); }
};
inline constexpr std::size_t tile_tokens = 2;  // 8 accumulators of 16 registers
#elif defined(__SSE2__)
struct simd {
  using reg = __m128;
  static constexpr std::size_t width = 4;
  static constexpr std::size_t registers = 16;
  static reg zero() noexcept { return _mm_setzero_ps(); }
  static reg set1(float x) noexcept { return _mm_set1_ps(x); }
  static reg load(float const* p) noexcept { return _mm_loadu_ps(p); }
  static void store(float* p, reg a) noexcept { _mm_storeu_ps(p, a); }
  static reg load_part(float const* p, std::size_t n) noexcept {
    float tmp[width] = {};
    for (std::size_t i = 0; i < n; ++i) tmp[i] = p[i];
    return _mm_loadu_ps(tmp);
  }
  static void store_part(float* p, reg a, std::size_t n) noexcept {
    float tmp[width];
    _mm_storeu_ps(tmp, a);
    for (std::size_t i = 0; i < n; ++i) p[i] = tmp[i];
  }
  static reg add(reg a, reg b) noexcept { return _mm_add_ps(a, b); }
  static reg sub(reg a, reg b) noexcept { return _mm_sub_ps(a, b); }
  static reg mul(reg a, reg b) noexcept { return _mm_mul_ps(a, b); }
  static reg fma(reg a, reg b, reg c) noexcept { return _mm_add_ps(_mm_mul_ps(a, b), c); }
  static reg max(reg a, reg b) noexcept { return _mm_max_ps(a, b); }
  static float hsum(reg a) noexcept { return vec::sum(a); }
  static float hmax(reg a) noexcept { return vec::hmax(a); }
  static reg exp(reg x, float floor = -87.0f) noexcept { return vec::exp(x, floor); }
  static reg silu_mul(reg g, reg u) noexcept {
    reg const e = vec::exp(_mm_or_ps(g, _mm_set1_ps(-0.0f)));  // exp(-|g|)
    reg const negative = _mm_cmplt_ps(g, zero());
    reg const num = _mm_or_ps(_mm_and_ps(negative, mul(g, e)), _mm_andnot_ps(negative, g));
    return mul(_mm_div_ps(num, add(e, _mm_set1_ps(1.0f))), u);
  }
  static void sum4(reg a, reg b, reg c, reg d, float* out) noexcept { vec::sum4(a, b, c, d, out); }
};
inline constexpr std::size_t tile_tokens = 2;
#else
struct simd {
  using reg = float;
  static constexpr std::size_t width = 1;
  static constexpr std::size_t registers = 16;
  static reg zero() noexcept { return 0.0f; }
  static reg set1(float x) noexcept { return x; }
  static reg load(float const* p) noexcept { return *p; }
  static void store(float* p, reg a) noexcept { *p = a; }
  static reg load_part(float const* p, std::size_t n) noexcept { return n > 0 ? *p : 0.0f; }
  static void store_part(float* p, reg a, std::size_t n) noexcept {
    if (n > 0) *p = a;
  }
  static reg add(reg a, reg b) noexcept { return a + b; }
  static reg sub(reg a, reg b) noexcept { return a - b; }
  static reg mul(reg a, reg b) noexcept { return a * b; }
  static reg fma(reg a, reg b, reg c) noexcept { return a * b + c; }
  static reg max(reg a, reg b) noexcept { return a > b ? a : b; }
  static float hsum(reg a) noexcept { return a; }
  static float hmax(reg a) noexcept { return a; }
  static reg exp(reg x, float floor = -87.0f) noexcept { return x < floor ? 0.0f : std::exp(x); }
  static reg silu_mul(reg g, reg u) noexcept { return g / (1.0f + std::exp(-g)) * u; }
  static void sum4(reg a, reg b, reg c, reg d, float* out) noexcept {
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = d;
  }
};
inline constexpr std::size_t tile_tokens = 2;
#endif

//! Calls f.template operator()<N>() for the run-time n in [1, Max] (nothing for other n): the
//! bridge from a run-time count to the kernel instantiated for it.
template <std::size_t Max, class F>
inline void with_count(std::size_t n, F&& f) noexcept {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (void)((n == I + 1 ? (f.template operator()<I + 1>(), true) : false) || ...);
  }
  (std::make_index_sequence<Max>{});
}

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
    with_count<tile_rows - 1>(r1 - r, [&]<std::size_t R>() {
      row_tile<R>(w + r * ldw, ldw, xb, ldx, nt, k, yb + r, ldy, accumulate);
    });
  }
}

// ---- packed products for small models.

//! Zero-initialised floats aligned to a cache line (64 bytes); allocated once, never resized.
class aligned_floats {
 public:
  //! No storage.
  aligned_floats() = default;
  //! `n` zeros.
  explicit aligned_floats(std::size_t n)
      : data_(n == 0
                  ? nullptr
                  : static_cast<float*>(::operator new (n * sizeof(float), std::align_val_t{64}))),
        size_(n) {
    if (n != 0) std::memset(data_.get(), 0, n * sizeof(float));
  }
  //! The first float (null when empty).
  [[nodiscard]] float* data() noexcept { return data_.get(); }
  //! The first float (null when empty).
  [[nodiscard]] float const* data() const noexcept { return data_.get(); }
  //! Number of floats.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  struct release {
    void operator()(float* p) const noexcept { ::operator delete (p, std::align_val_t{64}); }
  };
  std::unique_ptr<float, release> data_;
  std::size_t size_ = 0;
};

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

// ---- attention over a virtual sequence: the cache rows a token sees, in position order (all
// the cached rows, then the batch rows its mask allows). Scores, softmax and values are summed in
// the order of that sequence, so a token's result does not depend on where its visible rows sit
// in the cache or in the batch.

//! A run of consecutive cache rows [row, row + count) in a virtual sequence.
struct row_run {
  std::size_t row;
  std::size_t count;
};

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

//! Scores more than this below their row's largest get a negligible probability: exp(-44) <
//! 2^-63 of the largest, far below float precision (`softmax_rows` makes it 0,
//! `softmax_values8` keeps it at exp(-44)). Smaller ones would make subnormal products with the
//! values, which cost a microcode assist per operation on x86.
inline constexpr float softmax_floor = -44.0f;

#if defined(__AVX512F__)
//! Heads of 8 floats use keys and values transposed into blocks of 16 rows (`transpose_block8`,
//! `scores8`, `values8`).
inline constexpr bool transposed8 = true;

//! One block of 16 rows of 8 floats, row(i) for i in [0, 16) (a __m256 each), transposed:
//! out[d * 16 + i] = row(i)[d].
template <class Row>
inline void transpose_block8(Row const& row, float* out) noexcept {
  constexpr __mmask16 all = 0xFFFF;
  // z[i] = rows (a, a + 4) for a = 0, 1, 2, 3, 8, 9, 10, 11, so that the last step (lanes of
  // 128 bits) puts each dimension's 16 rows in order.
  __m512 z[8];
  for (std::size_t i = 0; i < 8; ++i) {
    std::size_t const a = i < 4 ? i : i + 4;
    __m512d const zero = _mm512_setzero_pd();
    __m512d const lo = _mm512_mask_insertf64x4(zero, 0xFF, zero, _mm256_castps_pd(row(a)), 0);
    z[i] = _mm512_castpd_ps(_mm512_mask_insertf64x4(lo, 0xFF, lo, _mm256_castps_pd(row(a + 4)), 1));
  }
  __m512 t[8];
  for (std::size_t i = 0; i < 8; i += 2) {
    t[i] = _mm512_mask_unpacklo_ps(z[i], all, z[i], z[i + 1]);
    t[i + 1] = _mm512_mask_unpackhi_ps(z[i], all, z[i], z[i + 1]);
  }
  __m512 u[8];
  for (std::size_t h = 0; h < 8; h += 4) {
    u[h] = _mm512_mask_shuffle_ps(t[h], all, t[h], t[h + 2], 0x44);
    u[h + 1] = _mm512_mask_shuffle_ps(t[h], all, t[h], t[h + 2], 0xEE);
    u[h + 2] = _mm512_mask_shuffle_ps(t[h + 1], all, t[h + 1], t[h + 3], 0x44);
    u[h + 3] = _mm512_mask_shuffle_ps(t[h + 1], all, t[h + 1], t[h + 3], 0xEE);
  }
  for (std::size_t d = 0; d < 4; ++d) {
    _mm512_storeu_ps(out + d * 16, _mm512_mask_shuffle_f32x4(u[d], all, u[d], u[d + 4], 0x88));
    _mm512_storeu_ps(out + (d + 4) * 16,
                     _mm512_mask_shuffle_f32x4(u[d], all, u[d], u[d + 4], 0xDD));
  }
}

//! Transposes rows [0, n) of 8 floats (rows ld apart) into blocks of 16 rows:
//! out[128 b + 16 d + i] = x[(16 b + i) * ld + d]; rows past n are zero.
inline void transpose_rows8(float const* x, std::size_t ld, std::size_t n, float* out) noexcept {
  for (std::size_t b = 0; b * 16 < n; ++b) {
    transpose_block8(
        [&](std::size_t i) {
          std::size_t const r = b * 16 + i;
          return r < n ? _mm256_loadu_ps(x + r * ld) : _mm256_setzero_ps();
        },
        out + b * 128);
  }
}

//! Transposes the rows rows[i] (null = zero) for i in [0, 16) into one block: out[16 d + i].
inline void transpose_gather8(float const* const* rows, float* out) noexcept {
  transpose_block8(
      [&](std::size_t i) {
        return rows[i] != nullptr ? _mm256_loadu_ps(rows[i]) : _mm256_setzero_ps();
      },
      out);
}

//! s[j] = scale * (q[0] k[j][0] + q[1] k[j][1] + ... + q[7] k[j][7]) (multiply-adds in that
//! order) for j in [0, round_up(n, 16)) from keys transposed by `transpose_rows8`; returns the
//! largest of s[0, n).
inline float scores8(float const* q, float const* kt, std::size_t n, float scale,
                     float* s) noexcept {
  __m512 qv[8];
  for (std::size_t d = 0; d < 8; ++d) qv[d] = _mm512_set1_ps(q[d]);
  __m512 const sv = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (std::size_t b = 0; b * 16 < n; ++b) {
    float const* const block = kt + b * 128;
    __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(block));
    for (std::size_t d = 1; d < 8; ++d)
      acc = _mm512_fmadd_ps(qv[d], _mm512_loadu_ps(block + d * 16), acc);
    acc = _mm512_mul_ps(acc, sv);
    _mm512_storeu_ps(s + b * 16, acc);
    std::size_t const left = n - b * 16;
    m = _mm512_mask_max_ps(m, left >= 16 ? simd::all : simd::first(left), m, acc);
  }
  return simd::hmax(m);
}

//! The attention output of one head over a virtual sequence of n rows, n >= 1:
//! out[d] = sum_i p[i] v[i][d] / sum_i p[i] with p[i] = exp(s[i] - max) (s[0, n) the scores,
//! `max` their largest), d in [0, 8). The values are transposed in blocks of 16 rows (as by
//! `transpose_rows8`): blocks [0, from) in `vt`, blocks [from, ceil(n / 16)) in `tail`. Both sums
//! run in 16 lanes by index, block by block (one multiply-add each), then through
//! `simd::sum4`'s fixed tree. Scores more than -softmax_floor below the largest count as
//! exp(softmax_floor) (negligible, and never subnormal).
inline void softmax_values8(float const* s, std::size_t n, float max, float const* vt,
                            std::size_t from, float const* tail, float* out) noexcept {
  __m512 const mv = _mm512_set1_ps(max);
  __m512 const floor = _mm512_set1_ps(softmax_floor);
  __m512 acc[8];
  for (std::size_t d = 0; d < 8; ++d) acc[d] = _mm512_setzero_ps();
  __m512 sum = _mm512_setzero_ps();
  std::size_t const blocks = (n + 15) / 16;
  for (std::size_t b = 0; b < blocks; ++b) {
    __m512 e = simd::exp_clamped(simd::max(simd::sub(_mm512_loadu_ps(s + b * 16), mv), floor));
    if (n - b * 16 < 16) e = _mm512_maskz_mov_ps(simd::first(n - b * 16), e);
    sum = simd::add(sum, e);
    float const* const block = b < from ? vt + b * 128 : tail + (b - from) * 128;
    for (std::size_t d = 0; d < 8; ++d)
      acc[d] = _mm512_fmadd_ps(e, _mm512_loadu_ps(block + d * 16), acc[d]);
  }
  float sums[8];
  simd::sum4(acc[0], acc[1], acc[2], acc[3], sums);
  simd::sum4(acc[4], acc[5], acc[6], acc[7], sums + 4);
  float const inv = 1.0f / simd::hsum(sum);
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_loadu_ps(sums), _mm256_set1_ps(inv)));
}
#else
//! Heads of 8 floats use transposed keys and values only with AVX-512.
inline constexpr bool transposed8 = false;
//! Not used without AVX-512 (`transposed8` is false).
inline void transpose_rows8(float const*, std::size_t, std::size_t, float*) noexcept {}
//! Not used without AVX-512 (`transposed8` is false).
inline void transpose_gather8(float const* const*, float*) noexcept {}
//! Not used without AVX-512 (`transposed8` is false).
inline float scores8(float const*, float const*, std::size_t, float, float*) noexcept {
  return 0.0f;
}
//! Not used without AVX-512 (`transposed8` is false).
inline void softmax_values8(float const*, std::size_t, float, float const*, std::size_t,
                            float const*, float*) noexcept {}
#endif

//! The largest of s[0, n), n >= 1 (exact: the order does not matter).
inline float row_max(float const* s, std::size_t n) noexcept {
  constexpr std::size_t w = simd::width;
  float m = s[0];
  std::size_t j = 0;
  if (n >= w) {
    typename simd::reg mv = simd::load(s);
    for (j = w; j + w <= n; j += w) mv = simd::max(mv, simd::load(s + j));
    m = simd::hmax(mv);
  }
  for (; j < n; ++j) m = s[j] > m ? s[j] : m;
  return m;
}

//! For each of R rows s_r = s + r stride: replaces s_r[0, n) by exp(s_r[j] - max[r]) (0 below
//! `softmax_floor`) and writes
//! their sum to sums[r] (accumulated in simd::width lanes by index, then reduced by a fixed tree:
//! padding with zeros changes nothing). The rows need room for round_up(n, simd::width) floats;
//! the padding ends up zero. The rows advance together so that their latencies overlap.
template <std::size_t R>
inline void softmax_rows(float* s, std::size_t stride, std::size_t n, float const* max,
                         float* sums) noexcept {
  constexpr std::size_t w = simd::width;
  std::size_t const padded = (n + w - 1) / w * w;
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t j = n; j < padded; ++j)
      s[r * stride + j] = -std::numeric_limits<float>::infinity();
  typename simd::reg mv[R], sum[R];
  for (std::size_t r = 0; r < R; ++r) {
    mv[r] = simd::set1(max[r]);
    sum[r] = simd::zero();
  }
  for (std::size_t j = 0; j < padded; j += w) {
    for (std::size_t r = 0; r < R; ++r) {
      float* const p = s + r * stride + j;
      typename simd::reg const e = simd::exp(simd::sub(simd::load(p), mv[r]), softmax_floor);
      simd::store(p, e);
      sum[r] = simd::add(sum[r], e);
    }
  }
  for (std::size_t r = 0; r < R; ++r) sums[r] = simd::hsum(sum[r]);
}

//! `softmax_rows` for a run-time number of rows.
inline void softmax_rows(std::size_t rows, float* s, std::size_t stride, std::size_t n,
                         float const* max, float* sums) noexcept {
  std::size_t r = 0;
  for (; r + 4 <= rows; r += 4) softmax_rows<4>(s + r * stride, stride, n, max + r, sums + r);
  if (r + 2 <= rows) {
    softmax_rows<2>(s + r * stride, stride, n, max + r, sums + r);
    r += 2;
  }
  if (r < rows) softmax_rows<1>(s + r * stride, stride, n, max + r, sums + r);
}

//! Most (head, chunk) accumulators of one `attention_values` pass.
inline constexpr std::size_t max_value_accumulators = 8;

#if defined(__SSE2__)
//! Width of a value chunk (`attention_values` needs head sizes that are a multiple of it).
inline constexpr std::size_t value_chunk = vec::width;

//! One pass of `attention_values` with A accumulators.
template <std::size_t A>
inline void attention_values_pass(float const* const* p, std::size_t const* off, float const* inv,
                                  float* const* out, float const* v, std::size_t ldv,
                                  row_run const* runs, std::size_t n_runs) noexcept {
  vec::reg acc[A];
  for (std::size_t a = 0; a < A; ++a) acc[a] = vec::zero();
  std::size_t i = 0;  // virtual index
  for (std::size_t r = 0; r < n_runs; ++r) {
    float const* row = v + runs[r].row * ldv;
    for (std::size_t c = 0; c < runs[r].count; ++c, ++i, row += ldv)
      for (std::size_t a = 0; a < A; ++a)
        acc[a] = vec::fma(vec::set1(p[a][i]), vec::load(row + off[a]), acc[a]);
  }
  for (std::size_t a = 0; a < A; ++a) vec::store(out[a], vec::mul(acc[a], vec::set1(inv[a])));
}

//! For each of `count` (<= max_value_accumulators) chunks a: out[a][0, value_chunk) =
//! inv[a] * sum_i p[a][i] v[row(i) * ldv + off[a] + (0, value_chunk)], over the virtual rows i of
//! `runs` in order (one multiply-add per row, in that order).
inline void attention_values(std::size_t count, float const* const* p, std::size_t const* off,
                             float const* inv, float* const* out, float const* v, std::size_t ldv,
                             row_run const* runs, std::size_t n_runs) noexcept {
  with_count<max_value_accumulators>(count, [&]<std::size_t A>() {
    attention_values_pass<A>(p, off, inv, out, v, ldv, runs, n_runs);
  });
}

//! One pass of `attention_values_regular` with A accumulators: accumulator a takes the
//! probabilities p + (Shared ? 0 : a ps), the value chunk at voff + (a / Group) value_chunk of
//! each row, and writes out + a value_chunk scaled by inv[Shared ? 0 : a]. The offsets are
//! compile-time multiples, so every pointer stays in a register.
template <std::size_t A, std::size_t Group, bool Shared>
inline void attention_values_fixed(float const* p, std::size_t ps, float const* inv, float* out,
                                   float const* v, std::size_t ldv, std::size_t voff,
                                   row_run const* runs, std::size_t n_runs) noexcept {
  vec::reg acc[A];
  for (std::size_t a = 0; a < A; ++a) acc[a] = vec::zero();
  float const* pa[A];
  for (std::size_t a = 0; a < A; ++a) pa[a] = Shared ? p : p + a * ps;
  std::size_t i = 0;  // virtual index
  for (std::size_t r = 0; r < n_runs; ++r) {
    float const* row = v + runs[r].row * ldv + voff;
    for (std::size_t c = 0; c < runs[r].count; ++c, ++i, row += ldv) {
      vec::reg vr[(A + Group - 1) / Group];
      for (std::size_t g = 0; g < (A + Group - 1) / Group; ++g)
        vr[g] = vec::load(row + g * value_chunk);
      for (std::size_t a = 0; a < A; ++a)
        acc[a] = vec::fma(vec::set1(pa[a][i]), vr[a / Group], acc[a]);
    }
  }
  for (std::size_t a = 0; a < A; ++a)
    vec::store(out + a * value_chunk, vec::mul(acc[a], vec::set1(inv[Shared ? 0 : a])));
}

//! `attention_values` for a regular layout, when a kernel with compile-time offsets exists:
//! `count` accumulators, accumulator a with the probabilities p + (shared ? 0 : a ps), the value
//! chunk voff + (a / group) value_chunk, the output out + a value_chunk and the scale
//! inv[shared ? 0 : a]. Returns false (and does nothing) when there is no such kernel.
inline bool attention_values_regular(std::size_t count, std::size_t group, bool shared,
                                     float const* p, std::size_t ps, float const* inv, float* out,
                                     float const* v, std::size_t ldv, std::size_t voff,
                                     row_run const* runs, std::size_t n_runs) noexcept {
  if (shared) {
    if (count != 8 || group != 1) return false;
    attention_values_fixed<8, 1, true>(p, ps, inv, out, v, ldv, voff, runs, n_runs);
    return true;
  }
  auto run = [&]<std::size_t A, std::size_t G>() {
    attention_values_fixed<A, G, false>(p, ps, inv, out, v, ldv, voff, runs, n_runs);
    return true;
  };
  switch (count * 16 + group) {
    case 1 * 16 + 1:
      return run.template operator()<1, 1>();
    case 2 * 16 + 1:
      return run.template operator()<2, 1>();
    case 2 * 16 + 2:
      return run.template operator()<2, 2>();
    case 4 * 16 + 1:
      return run.template operator()<4, 1>();
    case 4 * 16 + 2:
      return run.template operator()<4, 2>();
    case 4 * 16 + 4:
      return run.template operator()<4, 4>();
    case 8 * 16 + 1:
      return run.template operator()<8, 1>();
    case 8 * 16 + 2:
      return run.template operator()<8, 2>();
    case 8 * 16 + 4:
      return run.template operator()<8, 4>();
    case 8 * 16 + 8:
      return run.template operator()<8, 8>();
    default:
      return false;
  }
}
#else
//! Without SSE2, every head takes `attention_values_scalar`.
inline constexpr std::size_t value_chunk = 0;
#endif

//! out[:hs] = inv * sum_i p[i] v[row(i) * ldv : + hs] over the virtual rows i of `runs` in order,
//! one float at a time (heads whose size is not a multiple of `value_chunk`).
inline void attention_values_scalar(float const* p, float const* v, std::size_t ldv, std::size_t hs,
                                    row_run const* runs, std::size_t n_runs, float inv,
                                    float* out) noexcept {
  for (std::size_t d = 0; d < hs; ++d) out[d] = 0.0f;
  std::size_t i = 0;
  for (std::size_t r = 0; r < n_runs; ++r) {
    float const* row = v + runs[r].row * ldv;
    for (std::size_t c = 0; c < runs[r].count; ++c, ++i, row += ldv) {
      float const pi = p[i];
      for (std::size_t d = 0; d < hs; ++d) out[d] += pi * row[d];
    }
  }
  for (std::size_t d = 0; d < hs; ++d) out[d] *= inv;
}

// ---- elementwise.

//! out[:n] = x[:n] * (1 / sqrt(mean(x^2) + eps)) * weight[:n]; the sum of squares in simd::width
//! lanes by index, then a fixed tree.
inline void rmsnorm(float* out, float const* x, float const* weight, std::size_t n,
                    float eps) noexcept {
  constexpr std::size_t w = simd::width;
  typename simd::reg acc = simd::zero();
  std::size_t i = 0;
  for (; i + w <= n; i += w) {
    typename simd::reg const r = simd::load(x + i);
    acc = simd::fma(r, r, acc);
  }
  if (i < n) {
    typename simd::reg const r = simd::load_part(x + i, n - i);
    acc = simd::fma(r, r, acc);
  }
  float const scale = 1.0f / std::sqrt(simd::hsum(acc) / static_cast<float>(n) + eps);
  typename simd::reg const sv = simd::set1(scale);
  for (i = 0; i + w <= n; i += w)
    simd::store(out + i, simd::mul(simd::mul(simd::load(x + i), sv), simd::load(weight + i)));
  if (i < n)
    simd::store_part(
        out + i,
        simd::mul(simd::mul(simd::load_part(x + i, n - i), sv), simd::load_part(weight + i, n - i)),
        n - i);
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

//! gate[i] = silu(gate[i]) * up[i] for i in [0, n) (`simd::silu_mul` on every element).
inline void swiglu(float* gate, float const* up, std::size_t n) noexcept {
  constexpr std::size_t w = simd::width;
  std::size_t i = 0;
  for (; i + w <= n; i += w)
    simd::store(gate + i, simd::silu_mul(simd::load(gate + i), simd::load(up + i)));
  if (i < n)
    simd::store_part(
        gate + i, simd::silu_mul(simd::load_part(gate + i, n - i), simd::load_part(up + i, n - i)),
        n - i);
}

}  // namespace specdec::detail::cpu
