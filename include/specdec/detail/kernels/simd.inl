//! \file
//! The portable vector layer of the row kernels (see detail/simd.hpp): `vfloat` / `vint` of
//! `simd_width` lanes chosen by `SPECDEC_KERNEL_LEVEL` (2: 16, AVX-512; 1: 8, AVX; 0: 4), loads and
//! stores, selects, fixed-order lane reductions and the branch-free scalar helpers. A kernel body:
//! detail/simd.hpp includes it at the flags' level, detail/rows.hpp once per CPU target.
//! Floats per vector.
#if SPECDEC_VECTOR_EXTENSIONS && SPECDEC_KERNEL_LEVEL >= 2
inline constexpr std::size_t simd_width = 16;
#elif SPECDEC_VECTOR_EXTENSIONS && SPECDEC_KERNEL_LEVEL >= 1
inline constexpr std::size_t simd_width = 8;
#else
inline constexpr std::size_t simd_width = 4;
#endif

//! Logical lanes of every reduction (16 floats: one AVX-512 vector, two AVX, four SSE vectors).
inline constexpr std::size_t row_lanes = 16;
//! Vectors per logical step.
inline constexpr std::size_t row_vectors = row_lanes / simd_width;
//! Entries summed in float per lane before the lane sums are added into doubles.
inline constexpr std::size_t row_block = 512;

#if SPECDEC_VECTOR_EXTENSIONS

//! A vector of `simd_width` floats.
using vfloat = float __attribute__((vector_size(simd_width * sizeof(float))));
//! A vector of `simd_width` 32-bit integers (comparison masks: -1 true, 0 false).
using vint = std::int32_t __attribute__((vector_size(simd_width * sizeof(float))));
//! A vector of `simd_width / 2` doubles.
using vdouble_half = double __attribute__((vector_size(simd_width * sizeof(float))));
//! A vector of `simd_width / 2` floats (converted to `vdouble_half` by `widen`).
using vfloat_half = float __attribute__((vector_size(simd_width * sizeof(float) / 2)));

//! `m ? a : b` lane by lane (`m` a comparison mask), or for scalars.
template <class M, class T>
[[nodiscard]] SPECDEC_INLINE T select(M m, T a, T b) noexcept {
  return m ? a : b;
}

//! The lanes of `a` converted to double.
[[nodiscard]] SPECDEC_INLINE vdouble_half widen(vfloat_half a) noexcept {
  return __builtin_convertvector(a, vdouble_half);
}

#else

//! The scalar fallback's vector: N lanes of T with the vector extensions' operators (arithmetic
//! lane by lane, scalars broadcast, comparisons giving a `simd_vec<std::int32_t, N>` mask).
template <class T, std::size_t N>
struct simd_vec {
  T lanes[N];  //!< lane values

  SPECDEC_INLINE T& operator[](std::size_t i) noexcept { return lanes[i]; }
  SPECDEC_INLINE T const& operator[](std::size_t i) const noexcept { return lanes[i]; }

  //! The vector whose lane i is f(i).
  template <class F>
  [[nodiscard]] SPECDEC_INLINE static simd_vec generate(F f) noexcept {
    simd_vec r{};
    for (std::size_t i = 0; i < N; ++i) r.lanes[i] = f(i);
    return r;
  }
  using mask_type = simd_vec<std::int32_t, N>;
};

template <class T>
struct is_simd_vec : std::false_type {};
template <class T, std::size_t N>
struct is_simd_vec<simd_vec<T, N>> : std::true_type {};

#define SPECDEC_SIMD_BINARY(op)                                                                   \
  template <class T, std::size_t N>                                                               \
  [[nodiscard]] SPECDEC_INLINE simd_vec<T, N> operator op(simd_vec<T, N> a,                       \
                                                          simd_vec<T, N> b) noexcept {            \
    return simd_vec<T, N>::generate([&](std::size_t i) { return static_cast<T>(a[i] op b[i]); }); \
  }                                                                                               \
  template <class T, std::size_t N, class S, class = std::enable_if_t<std::is_arithmetic_v<S>>>   \
  [[nodiscard]] SPECDEC_INLINE simd_vec<T, N> operator op(simd_vec<T, N> a, S b) noexcept {       \
    return a op simd_vec<T, N>::generate([&](std::size_t) { return static_cast<T>(b); });         \
  }                                                                                               \
  template <class T, std::size_t N, class S, class = std::enable_if_t<std::is_arithmetic_v<S>>>   \
  [[nodiscard]] SPECDEC_INLINE simd_vec<T, N> operator op(S a, simd_vec<T, N> b) noexcept {       \
    return simd_vec<T, N>::generate([&](std::size_t) { return static_cast<T>(a); }) op b;         \
  }                                                                                               \
  template <class T, std::size_t N, class B>                                                      \
  SPECDEC_INLINE simd_vec<T, N>& operator op##=(simd_vec<T, N>& a, B b) noexcept {                \
    return a = a op b;                                                                            \
  }
SPECDEC_SIMD_BINARY(+)
SPECDEC_SIMD_BINARY(-)
SPECDEC_SIMD_BINARY(*)
SPECDEC_SIMD_BINARY(/)
SPECDEC_SIMD_BINARY(&)
SPECDEC_SIMD_BINARY(|)
SPECDEC_SIMD_BINARY(^)
#undef SPECDEC_SIMD_BINARY

#define SPECDEC_SIMD_COMPARE(op)                                                                  \
  template <class T, std::size_t N>                                                               \
  [[nodiscard]] SPECDEC_INLINE simd_vec<std::int32_t, N> operator op(simd_vec<T, N> a,            \
                                                                     simd_vec<T, N> b) noexcept { \
    return simd_vec<std::int32_t, N>::generate(                                                   \
        [&](std::size_t i) { return a[i] op b[i] ? std::int32_t{-1} : std::int32_t{0}; });        \
  }                                                                                               \
  template <class T, std::size_t N, class S, class = std::enable_if_t<std::is_arithmetic_v<S>>>   \
  [[nodiscard]] SPECDEC_INLINE simd_vec<std::int32_t, N> operator op(simd_vec<T, N> a,            \
                                                                     S b) noexcept {              \
    return a op simd_vec<T, N>::generate([&](std::size_t) { return static_cast<T>(b); });         \
  }
SPECDEC_SIMD_COMPARE(<)
SPECDEC_SIMD_COMPARE(<=)
SPECDEC_SIMD_COMPARE(>)
SPECDEC_SIMD_COMPARE(>=)
SPECDEC_SIMD_COMPARE(==)
SPECDEC_SIMD_COMPARE(!=)
#undef SPECDEC_SIMD_COMPARE

//! Bitwise not, lane by lane.
template <std::size_t N>
[[nodiscard]] SPECDEC_INLINE simd_vec<std::int32_t, N> operator~(
    simd_vec<std::int32_t, N> a) noexcept {
  return simd_vec<std::int32_t, N>::generate([&](std::size_t i) { return ~a[i]; });
}
//! Left shift, lane by lane.
template <std::size_t N>
[[nodiscard]] SPECDEC_INLINE simd_vec<std::int32_t, N> operator<<(simd_vec<std::int32_t, N> a,
                                                                  int s) noexcept {
  return simd_vec<std::int32_t, N>::generate([&](std::size_t i) {
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(a[i]) << s);
  });
}

//! A vector of `simd_width` floats.
using vfloat = simd_vec<float, simd_width>;
//! A vector of `simd_width` 32-bit integers (comparison masks: -1 true, 0 false).
using vint = simd_vec<std::int32_t, simd_width>;
//! A vector of `simd_width / 2` doubles.
using vdouble_half = simd_vec<double, simd_width / 2>;
//! A vector of `simd_width / 2` floats (converted to `vdouble_half` by `widen`).
using vfloat_half = simd_vec<float, simd_width / 2>;

//! `m ? a : b` for scalars.
template <class M, class T, class = std::enable_if_t<!is_simd_vec<T>::value>>
[[nodiscard]] SPECDEC_INLINE T select(M m, T a, T b) noexcept {
  return m ? a : b;
}
//! `m[i] ? a[i] : b[i]` lane by lane.
template <class T, std::size_t N>
[[nodiscard]] SPECDEC_INLINE simd_vec<T, N> select(simd_vec<std::int32_t, N> m, simd_vec<T, N> a,
                                                   simd_vec<T, N> b) noexcept {
  return simd_vec<T, N>::generate([&](std::size_t i) { return m[i] != 0 ? a[i] : b[i]; });
}

//! The lanes of `a` converted to double.
[[nodiscard]] SPECDEC_INLINE vdouble_half widen(vfloat_half a) noexcept {
  return vdouble_half::generate([&](std::size_t i) { return static_cast<double>(a[i]); });
}

#endif

//! Loads `simd_width` floats from p (any alignment).
[[nodiscard]] SPECDEC_INLINE vfloat load(float const* p) noexcept {
  vfloat v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
//! Stores `simd_width` floats to p (any alignment).
SPECDEC_INLINE void store(float* p, vfloat v) noexcept {
  std::memcpy(p, &v, sizeof v);
}
//! A vector with every lane `x`.
[[nodiscard]] SPECDEC_INLINE vfloat splat(float x) noexcept {
  return vfloat{} + x;
}

//! Whether any lane of a mask is set (one vector test where the instruction set has one).
[[nodiscard]] SPECDEC_INLINE bool any(vint m) noexcept {
#if SPECDEC_VECTOR_EXTENSIONS && SPECDEC_KERNEL_LEVEL >= 2
  static_assert(sizeof(vint) == sizeof(__m512i));
  __m512i v;
  std::memcpy(&v, &m, sizeof v);
  return _mm512_test_epi32_mask(v, v) != 0;
#elif SPECDEC_VECTOR_EXTENSIONS && SPECDEC_KERNEL_LEVEL >= 1
  static_assert(sizeof(vint) == sizeof(__m256i));
  __m256i v;
  std::memcpy(&v, &m, sizeof v);
  return _mm256_testz_si256(v, v) == 0;
#elif SPECDEC_VECTOR_EXTENSIONS && defined(__SSE4_1__)
  static_assert(sizeof(vint) == sizeof(__m128i));
  __m128i v;
  std::memcpy(&v, &m, sizeof v);
  return _mm_testz_si128(v, v) == 0;
#else
  std::uint64_t w[sizeof(vint) / 8];
  std::memcpy(w, &m, sizeof w);
  std::uint64_t acc = 0;
  for (std::uint64_t x : w) acc |= x;
  return acc != 0;
#endif
}

//! The lanes of `v` (a `vfloat`) combined by `op` as a pairwise tree of vector halves (lane l with
//! lane l + simd_width / 2, then l + simd_width / 4, ...), without a round trip through memory.
//! `op` is applied to vectors of 8, 4 and 2 floats (or, in the fallback, to floats).
template <class V, class Op>
[[nodiscard]] SPECDEC_INLINE float reduce_lanes(V v, Op op) noexcept {
  constexpr std::size_t width = sizeof(V) / sizeof(float);
  static_assert(width == 16 || width == 8 || width == 4);
#if SPECDEC_VECTOR_EXTENSIONS
  using f8 = float __attribute__((vector_size(8 * sizeof(float))));
  using f4 = float __attribute__((vector_size(4 * sizeof(float))));
  using f2 = float __attribute__((vector_size(2 * sizeof(float))));
  f4 t4;
  if constexpr (width == 16) {
    f8 const t8 = op(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                     __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
    t4 = op(__builtin_shufflevector(t8, t8, 0, 1, 2, 3),
            __builtin_shufflevector(t8, t8, 4, 5, 6, 7));
  } else if constexpr (width == 8) {
    t4 = op(__builtin_shufflevector(v, v, 0, 1, 2, 3), __builtin_shufflevector(v, v, 4, 5, 6, 7));
  } else {
    t4 = v;
  }
  f2 const t2 = op(__builtin_shufflevector(t4, t4, 0, 1), __builtin_shufflevector(t4, t4, 2, 3));
  return op(t2, __builtin_shufflevector(t2, t2, 1, 0))[0];
#else
  float t[width];
  std::memcpy(t, &v, sizeof t);
  for (std::size_t h = width / 2; h >= 1; h /= 2)
    for (std::size_t l = 0; l < h; ++l) t[l] = op(t[l], t[l + h]);
  return t[0];
#endif
}

//! The `row_lanes` logical lanes of `acc` (vector v holds lanes [v simd_width, (v + 1) simd_width))
//! added by the fixed tree lane l += lane l + 8, then l + 4, l + 2, l + 1: the same additions in
//! the same order whatever the vector width.
template <std::size_t N>
[[nodiscard]] SPECDEC_INLINE float sum_row_lanes(vfloat const (&acc)[N]) noexcept {
  static_assert(N == row_vectors && (N == 1 || N == 2 || N == 4));
  auto const add = [](auto a, auto b) { return a + b; };
  if constexpr (N == 1) {
    return reduce_lanes(acc[0], add);
  } else if constexpr (N == 2) {
    return reduce_lanes(acc[0] + acc[1], add);
  } else {
    return reduce_lanes((acc[0] + acc[2]) + (acc[1] + acc[3]), add);
  }
}

//! max(x, 0) without a branch (x not NaN): x where x > 0, else a zero (its sign unspecified:
//! the callers add it to a non-negative sum, which it leaves unchanged).
[[nodiscard]] SPECDEC_INLINE float positive_part(float x) noexcept {
#if SPECDEC_VECTOR_EXTENSIONS && defined(__SSE__)
  return _mm_cvtss_f32(_mm_max_ss(_mm_set_ss(x), _mm_setzero_ps()));
#else
  return x > 0.0f ? x : 0.0f;
#endif
}

//! Makes `x` opaque to the optimiser (no instruction): a select computing it is then not merged
//! into the branches of later tests on it.
SPECDEC_INLINE void opaque(float& x) noexcept {
#if SPECDEC_VECTOR_EXTENSIONS && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+x"(x));
#elif SPECDEC_VECTOR_EXTENSIONS && defined(__aarch64__)
  asm("" : "+w"(x));
#else
  (void)x;
#endif
}

//! `keep ? a : b` for indices, without a branch.
[[nodiscard]] SPECDEC_INLINE std::size_t select_index(bool keep, std::size_t a,
                                                      std::size_t b) noexcept {
  return b ^ ((a ^ b) & (std::size_t{0} - static_cast<std::size_t>(keep)));
}
