//! \file
//! Native SIMD registers for the CPU model backend's matrix, attention and elementwise kernels:
//! `vec` (8-wide AVX2 or 4-wide SSE2 registers, used along a head's dimension) and `simd` (the
//! widest float register: AVX-512, AVX2, SSE2, or one float), with whole and partial loads and
//! stores, fused multiply-add, fixed-tree horizontal sums, SiLU and an exp; and `with_count`, which
//! turns a run-time count into the register-tiled kernel instantiated for it. Internals, not API.
//! A kernel body: backend/cpu/kernels.hpp compiles it once per CPU target, with
//! `SPECDEC_KERNEL_LEVEL` 0 (the flags' baseline: SSE2 on x86-64, one float elsewhere), 1 (AVX2 +
//! FMA) or 2 (AVX-512).
//!
//! This is the second half of the library's numeric layer beside detail/simd.hpp: the matrix
//! kernels need masked loads, explicit fused multiply-adds and register tiling, which the portable
//! vectors do not express. Its exp (`simd::exp`) is the model's: fused operations and the
//! instruction set's own rounding, fast, for attention's softmax and SiLU, whose results may
//! differ in the last bit between instruction sets like the rest of a forward. The exp that
//! sampling and verification rest on, and that the CUDA kernels reproduce, is `exp_nonpositive`
//! (detail/exp.hpp), which gives the same value on every instruction set and device.

// ---- vec: 8- (AVX2) or 4-wide (SSE2) vectors (attention along the head dimension; the exp
// and horizontal sums of `simd` on those ISAs).
#if SPECDEC_KERNEL_LEVEL >= 1
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
#if SPECDEC_KERNEL_LEVEL >= 2
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
#elif SPECDEC_KERNEL_LEVEL >= 1
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
