//! \file
//! The row passes of the sampling, drawing and verification kernels, on the vectors of
//! detail/kernels/simd.inl: checked maximum, exp-and-sum, scaling, a validation sum, the
//! inverse-CDF crossing search, threshold statistics, gathers and argmax; and the finiteness check
//! of model weights. Every reduction runs over `row_lanes` logical lanes in a fixed order, so
//! results do not depend on the vector width. A kernel body: detail/rows.hpp compiles it once per
//! CPU target and calls it through its dispatching functions of the same names.
//! The maximum of x[0..n) as `summarize_row` defines it, one step of `row_lanes` at a time into
//! one set of lane maxima (each lane keeps the first of equal values), merged lane by lane in
//! order, then the tail; `bad` is set when an entry is NaN. Resolves the sign of a zero maximum.
[[nodiscard]] inline float ordered_row_max(float const* x, std::size_t n, bool& bad) noexcept {
  constexpr float inf = std::numeric_limits<float>::infinity();
  vfloat mx[row_vectors];
  vint nan[row_vectors];
  for (std::size_t v = 0; v < row_vectors; ++v) {
    mx[v] = splat(-inf);
    nan[v] = vint{};
  }
  std::size_t const full = n - n % row_lanes;
  for (std::size_t i = 0; i < full; i += row_lanes) {
    for (std::size_t v = 0; v < row_vectors; ++v) {
      vfloat const a = load(x + i + v * simd_width);
      mx[v] = select(a > mx[v], a, mx[v]);
      nan[v] |= a != a;
    }
  }
  float m = -inf;
  bool any_nan = false;
  for (std::size_t v = 0; v < row_vectors; ++v) {
    any_nan = any_nan || any(nan[v]);
    for (std::size_t j = 0; j < simd_width; ++j) m = mx[v][j] > m ? mx[v][j] : m;
  }
  for (std::size_t i = full; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    any_nan = any_nan || x[i] != x[i];
  }
  bad = any_nan;
  return m;
}

//! The maximum of `row`; throws `errc::numerical` naming the index of the first NaN or +inf, or
//! when no entry is finite (an empty row included). `who` names the caller in the message.
//! One vectorised pass over four independent sets of lane maxima (a single set would chain every
//! step on the previous one). The maximum of a set of floats does not depend on the order it is
//! taken in, except for the sign of a zero maximum (-0 and +0 compare equal), which the rare rows
//! whose maximum is zero take from `ordered_row_max`.
[[nodiscard]] inline row_summary summarize_row(std::span<float const> row, char const* who) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr std::size_t sets = 4;
  constexpr std::size_t stride = sets * row_lanes;
  float const* x = row.data();
  std::size_t const n = row.size();
  vfloat mx[sets][row_vectors];
  vint nan[sets][row_vectors];
  for (std::size_t u = 0; u < sets; ++u) {
    for (std::size_t v = 0; v < row_vectors; ++v) {
      mx[u][v] = splat(-inf);
      nan[u][v] = vint{};
    }
  }
  std::size_t const wide = n - n % stride;
  for (std::size_t i = 0; i < wide; i += stride) {
    for (std::size_t u = 0; u < sets; ++u) {
      for (std::size_t v = 0; v < row_vectors; ++v) {
        vfloat const a = load(x + i + u * row_lanes + v * simd_width);
        mx[u][v] = select(a > mx[u][v], a, mx[u][v]);
        nan[u][v] |= a != a;
      }
    }
  }
  std::size_t const full = n - n % row_lanes;
  for (std::size_t i = wide; i < full; i += row_lanes) {
    for (std::size_t v = 0; v < row_vectors; ++v) {
      vfloat const a = load(x + i + v * simd_width);
      mx[0][v] = select(a > mx[0][v], a, mx[0][v]);
      nan[0][v] |= a != a;
    }
  }
  vint bad_lanes = vint{};
  for (std::size_t v = 0; v < row_vectors; ++v) {
    for (std::size_t u = 1; u < sets; ++u) {
      mx[0][v] = select(mx[u][v] > mx[0][v], mx[u][v], mx[0][v]);
      nan[0][v] |= nan[u][v];
    }
    bad_lanes |= nan[0][v];
  }
  // The lanes by a pairwise tree of vector halves (short dependency chains).
  auto const vmax = [](auto a, auto b) { return select(b > a, b, a); };
  for (std::size_t v = 1; v < row_vectors; ++v) mx[0][0] = vmax(mx[0][0], mx[0][v]);
  row_summary s;
  s.max = reduce_lanes(mx[0][0], vmax);
  bool bad = any(bad_lanes);
  for (std::size_t i = full; i < n; ++i) {
    s.max = x[i] > s.max ? x[i] : s.max;
    bad = bad || x[i] != x[i];
  }
  if (bad || !(s.max > -inf && s.max < inf)) [[unlikely]]
    throw_bad_row(x, n, who);
  if (s.max == 0.0f) [[unlikely]]
    s.max = ordered_row_max(x, n, bad);
  return s;
}

//! `exp_masked`, with the test against `zfloor` only when `Masked` (without it, every entry is
//! written as if it passed, which is what the test gives for zfloor = -inf on NaN-free rows).
template <bool WithFloor, bool Masked, bool Scaled>
[[nodiscard]] inline exp_sums exp_masked_pass(float const* x, float* out, std::size_t n,
                                              float shift, float scale, float zfloor,
                                              float efloor) noexcept {
  exp_sums s;
  std::size_t i = 0;
  std::size_t const full = n - n % row_lanes;
  vfloat const vshift = splat(shift), vscale = splat(scale), vzfloor = splat(zfloor),
               vefloor = splat(efloor), zero = splat(0.0f);
  while (i < full) {
    vfloat acc[row_vectors];
    vfloat acc_floor[row_vectors];
    for (std::size_t v = 0; v < row_vectors; ++v) acc[v] = acc_floor[v] = zero;
    std::size_t const stop = std::min(full, i + row_block);
    for (; i < stop; i += row_lanes) {
      for (std::size_t v = 0; v < row_vectors; ++v) {
        vfloat const a = load(x + i + v * simd_width);
        vfloat d = a - vshift;
        if constexpr (Scaled) d *= vscale;
        vfloat e = exp_nonpositive(d);
        if constexpr (Masked) e = select(a >= vzfloor, e, zero);
        store(out + i + v * simd_width, e);
        acc[v] += e;
        if constexpr (WithFloor) acc_floor[v] += select(e >= vefloor, e, zero);
      }
    }
    double block = 0.0, block_floor = 0.0;
    for (std::size_t v = 0; v < row_vectors; ++v) {
      for (std::size_t j = 0; j < simd_width; ++j) {
        block += static_cast<double>(acc[v][j]);
        block_floor += static_cast<double>(acc_floor[v][j]);
      }
    }
    s.total += block;
    s.at_least_floor += block_floor;
  }
  for (; i < n; ++i) {
    float const a = x[i];
    float d = a - shift;
    if constexpr (Scaled) d *= scale;
    float e = ::specdec::detail::exp_nonpositive(d);  // the scalar one (exp.hpp)
    if constexpr (Masked) e = a >= zfloor ? e : 0.0f;
    out[i] = e;
    s.total += static_cast<double>(e);
    if constexpr (WithFloor) s.at_least_floor += e >= efloor ? static_cast<double>(e) : 0.0;
  }
  return s;
}

//! Writes out[i] = x[i] >= zfloor ? exp((x[i] - shift) * scale) : 0 for every i and returns the
//! sum of the written values (and, with `WithFloor`, the sum of those >= efloor), accumulated in
//! float over blocks of `row_block` and in double across blocks. Requires x[i] - shift <= 0 (or
//! -inf), scale > 0 finite, no NaN. `out` may be `x` itself. With zfloor = -inf (no top-k) the
//! pass skips the test, which every entry passes; with scale = 1 it skips the multiplication,
//! which leaves every value as it is.
template <bool WithFloor>
[[nodiscard]] inline exp_sums exp_masked(float const* x, float* out, std::size_t n, float shift,
                                         float scale, float zfloor, float efloor) noexcept {
  bool const masked = zfloor != -std::numeric_limits<float>::infinity();
  if (scale == 1.0f) {
    return masked
               ? exp_masked_pass<WithFloor, true, false>(x, out, n, shift, scale, zfloor, efloor)
               : exp_masked_pass<WithFloor, false, false>(x, out, n, shift, scale, zfloor, efloor);
  }
  return masked ? exp_masked_pass<WithFloor, true, true>(x, out, n, shift, scale, zfloor, efloor)
                : exp_masked_pass<WithFloor, false, true>(x, out, n, shift, scale, zfloor, efloor);
}

//! Writes out[i] = exp((x[i] - shift) * scale) for every i and returns the sum of the written
//! values (see `exp_masked`). `out` may be `x` itself.
inline double exp_shifted(float const* x, float* out, std::size_t n, float shift, float scale) {
  return exp_masked<false>(x, out, n, shift, scale, -std::numeric_limits<float>::infinity(), 0.0f)
      .total;
}

//! out[i] = x[i] * factor. `out` may be `x` itself.
inline void scale_row(float const* x, float* out, std::size_t n, float factor) noexcept {
  std::size_t const full = n - n % simd_width;
  vfloat const f = splat(factor);
  for (std::size_t i = 0; i < full; i += simd_width) store(out + i, load(x + i) * f);
  for (std::size_t i = full; i < n; ++i) out[i] = x[i] * factor;
}

//! out[i] = x[i] >= floor ? x[i] * factor : 0. `out` may be `x` itself.
inline void scale_at_least(float const* x, float* out, std::size_t n, float floor,
                           float factor) noexcept {
  std::size_t const full = n - n % simd_width;
  vfloat const f = splat(factor), fl = splat(floor), zero = splat(0.0f);
  for (std::size_t i = 0; i < full; i += simd_width) {
    vfloat const a = load(x + i);
    store(out + i, select(a >= fl, a * f, zero));
  }
  for (std::size_t i = full; i < n; ++i) out[i] = x[i] >= floor ? x[i] * factor : 0.0f;
}

//! Adds x[from..n) to `total` in order, in double; returns whether an entry is negative or NaN.
//! The tail after the whole vector steps of the checked sums.
[[nodiscard]] inline bool add_tail_checked(float const* x, std::size_t from, std::size_t n,
                                           double& total) noexcept {
  bool bad = false;
  for (std::size_t i = from; i < n; ++i) {
    total += static_cast<double>(x[i]);
    bad = bad || !(x[i] >= 0.0f);
  }
  return bad;
}

//! Sum of x[0..n) for validation (not bit-compatible with any other sum here): float over
//! `row_lanes` logical lanes in four independent sets within blocks of `row_block` entries, the
//! sets added lane by lane ((0 + 1) + (2 + 3)) and the lanes by the fixed tree of `sum_row_lanes`
//! (so the sum does not depend on the vector width), double across blocks; `bad` is set when an
//! entry is negative or NaN (+inf makes the sum +inf).
[[nodiscard]] inline double sum_checked(float const* x, std::size_t n, bool& bad) noexcept {
  constexpr std::size_t sets = 4;
  constexpr std::size_t stride = sets * row_lanes;
  static_assert(row_block % stride == 0);
  vfloat const zero = splat(0.0f);
  vint negative = vint{};
  double total = 0.0;
  std::size_t i = 0;
  std::size_t const wide = n - n % stride;
  while (i < wide) {
    vfloat acc[sets * row_vectors];  // set s, logical lanes of vector v: acc[s * row_vectors + v]
    for (vfloat& a : acc) a = zero;
    std::size_t const stop = std::min(wide, i + row_block);
    for (; i < stop; i += stride) {
      for (std::size_t v = 0; v < sets * row_vectors; ++v) {
        vfloat const a = load(x + i + v * simd_width);
        negative |= ~(a >= zero);  // negative or NaN
        acc[v] += a;
      }
    }
    vfloat lanes[row_vectors];
    for (std::size_t v = 0; v < row_vectors; ++v)
      lanes[v] =
          (acc[v] + acc[row_vectors + v]) + (acc[2 * row_vectors + v] + acc[3 * row_vectors + v]);
    total += static_cast<double>(sum_row_lanes(lanes));
  }
  bad = add_tail_checked(x, i, n, total) || any(negative);
  return total;
}

//! `first_crossing_sequential` (the same index, always), for x[0..len) without NaN and
//! 0 <= running <= target. With AVX-512, runs of `crossing_block` entries are searched with
//! prefix sums in double vectors instead of one dependent addition per entry: with every weight
//! non-negative, the sequential sums and the vector prefix sums (another association, at most 64
//! roundings each) are both within 2^-47 of the exact sum, relative to it, so the first index
//! whose prefix sum A has A * (1 + 2^-44) > target is the sequential answer when it also has
//! A * (1 - 2^-44) > target (and a positive weight); when the crossing is not that clear (the
//! target within about 2^-44 of a prefix sum) the sequential loop decides.
[[nodiscard]] inline std::size_t first_crossing(float const* x, std::size_t len, double running,
                                                double target) noexcept {
#if SPECDEC_VECTOR_EXTENSIONS && SPECDEC_KERNEL_LEVEL >= 2
  if (len == crossing_block) {
    constexpr double slack = 0x1p-44;
    __m512d const zero = _mm512_setzero_pd();
    __m512d const vt = _mm512_set1_pd(target);
    __m512d const up = _mm512_set1_pd(1.0 + slack);
    __m512d const down = _mm512_set1_pd(1.0 - slack);
    auto const shift = [zero](__m512d a, auto lanes) {  // lanes up by `lanes`, zeros in
      return _mm512_castsi512_pd(_mm512_maskz_alignr_epi64(
          0xFF, _mm512_castpd_si512(a), _mm512_castpd_si512(zero), 8 - decltype(lanes)::value));
    };
    // The zero-masked forms with every lane selected are the plain instructions (the unmasked
    // intrinsics trip GCC 12's -Wmaybe-uninitialized).
    __m512d carry = _mm512_set1_pd(running);
    for (std::size_t k = 0; k < crossing_block; k += 8) {
      __m256 const xf = _mm256_max_ps(_mm256_loadu_ps(x + k), _mm256_setzero_ps());
      __m512d a = _mm512_maskz_cvtps_pd(0xFF, xf);
      a = _mm512_add_pd(a, shift(a, std::integral_constant<int, 1>{}));
      a = _mm512_add_pd(a, shift(a, std::integral_constant<int, 2>{}));
      a = _mm512_add_pd(a, shift(a, std::integral_constant<int, 4>{}));
      a = _mm512_add_pd(a, carry);
      __mmask8 const maybe = _mm512_cmp_pd_mask(_mm512_mul_pd(a, up), vt, _CMP_GT_OQ);
      if (maybe != 0) {
        __mmask8 const sure = _mm512_cmp_pd_mask(_mm512_mul_pd(a, down), vt, _CMP_GT_OQ);
        auto const j = static_cast<std::size_t>(std::countr_zero(static_cast<unsigned>(maybe)));
        if (((sure >> j) & 1) != 0 && x[k + j] > 0.0f) return k + j;
        return first_crossing_sequential(x, len, running, target);
      }
      carry = _mm512_maskz_permutexvar_pd(0xFF, _mm512_set1_epi64(7), a);
    }
    // No prefix sum comes near the target, so no sequential sum (within the slack) crosses it.
    return len;
  }
#endif
  return first_crossing_sequential(x, len, running, target);
}

//! For each of the K thresholds th[k]: count[k] = #{i : x[i] >= th[k]} and, with `Mass`,
//! mass[k] = sum of those x[i] (float over `row_lanes` logical lanes within blocks of
//! `row_block`, the lanes added into the double total in lane order, then the tail in order: the
//! same sum whatever the vector width). One vectorised pass over the row.
template <bool Mass, std::size_t K>
inline void threshold_stats(float const* x, std::size_t n, float const (&th)[K], double (&mass)[K],
                            double (&count)[K]) noexcept {
  for (std::size_t k = 0; k < K; ++k) mass[k] = count[k] = 0.0;
  vfloat vth[K];
  for (std::size_t k = 0; k < K; ++k) vth[k] = splat(th[k]);
  vfloat const zero = splat(0.0f);
  std::size_t i = 0;
  std::size_t const full = n - n % row_lanes;
  while (i < full) {
    vfloat am[K][row_vectors];
    vint ac[K];
    for (std::size_t k = 0; k < K; ++k) {
      for (vfloat& a : am[k]) a = zero;
      ac[k] = vint{};
    }
    std::size_t const stop = std::min(full, i + row_block);
    for (; i < stop; i += row_lanes) {
      for (std::size_t v = 0; v < row_vectors; ++v) {
        vfloat const a = load(x + i + v * simd_width);
        for (std::size_t k = 0; k < K; ++k) {
          vint const ge = a >= vth[k];
          if constexpr (Mass) am[k][v] += select(ge, a, zero);
          ac[k] -= ge;  // a true lane is -1
        }
      }
    }
    for (std::size_t k = 0; k < K; ++k) {
      for (std::size_t j = 0; j < simd_width; ++j) count[k] += static_cast<double>(ac[k][j]);
      if constexpr (Mass)
        for (std::size_t v = 0; v < row_vectors; ++v)
          for (std::size_t j = 0; j < simd_width; ++j) mass[k] += static_cast<double>(am[k][v][j]);
    }
  }
  for (; i < n; ++i) {
    for (std::size_t k = 0; k < K; ++k) {
      if (x[i] >= th[k]) {
        if constexpr (Mass) mass[k] += static_cast<double>(x[i]);
        count[k] += 1.0;
      }
    }
  }
}

//! Copies (x[i], i) for every i with lo <= x[i] < hi, in index order, into vals / ids (at most
//! `capacity` of them) and returns how many entries are in the range (which may exceed
//! `capacity`; only the first `capacity` are stored). Groups of `row_lanes` entries with none in
//! range are skipped after one vectorised test.
[[nodiscard]] inline std::size_t gather_range(float const* x, std::size_t n, float lo, float hi,
                                              float* vals, std::int32_t* ids,
                                              std::size_t capacity) noexcept {
  std::size_t found = 0;
  std::size_t const full = n - n % row_lanes;
  std::size_t i0 = 0;
#if SPECDEC_VECTOR_EXTENSIONS && SPECDEC_KERNEL_LEVEL >= 2
  // Compressing stores write the hits of 16 entries at once, in index order; near the capacity
  // the generic loop below takes over.
  {
    __m512 const zlo = _mm512_set1_ps(lo), zhi = _mm512_set1_ps(hi);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i const step = _mm512_set1_epi32(16);
    static_assert(row_lanes == 16);
    for (; i0 < full && found + 16 <= capacity; i0 += 16) {
      __m512 const a = _mm512_loadu_ps(x + i0);
      __mmask16 const m =
          _mm512_cmp_ps_mask(a, zlo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(a, zhi, _CMP_LT_OQ);
      _mm512_mask_compressstoreu_ps(vals + found, m, a);
      _mm512_mask_compressstoreu_epi32(ids + found, m, idx);
      found += static_cast<std::size_t>(std::popcount(static_cast<unsigned>(m)));
      idx = _mm512_add_epi32(idx, step);
    }
  }
#endif
  vfloat const vlo = splat(lo), vhi = splat(hi);
  for (std::size_t i = i0; i < full; i += row_lanes) {
    vint in[row_vectors];
    vint hit = vint{};
    for (std::size_t v = 0; v < row_vectors; ++v) {
      vfloat const a = load(x + i + v * simd_width);
      in[v] = (a >= vlo) & (a < vhi);
      hit |= in[v];
    }
    if (!any(hit)) continue;
    // Visit the set lanes only (branchy per group, not per entry).
    std::int32_t lanes[row_lanes];
    std::memcpy(lanes, in, sizeof lanes);
    std::uint32_t bits = 0;
    for (std::size_t j = 0; j < row_lanes; ++j)
      bits |= static_cast<std::uint32_t>(lanes[j] & 1) << j;
    while (bits != 0) {
      auto const j = static_cast<std::size_t>(std::countr_zero(bits));
      bits &= bits - 1;
      if (found < capacity) {
        vals[found] = x[i + j];
        ids[found] = static_cast<std::int32_t>(i + j);
      }
      ++found;
    }
  }
  for (std::size_t i = full; i < n; ++i) {
    if (!(x[i] >= lo && x[i] < hi)) continue;
    if (found < capacity) {
      vals[found] = x[i];
      ids[found] = static_cast<std::int32_t>(i);
    }
    ++found;
  }
  return found;
}

//! Index of the largest entry of x[0..n), n >= 1, ties to the lowest index, NaN never chosen;
//! -1 when no entry is above -inf.
[[nodiscard]] inline std::int64_t argmax_index(float const* x, std::size_t n) noexcept {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  // Lane indices are 32-bit: rows longer than that (never a vocabulary) take the scalar loop.
  std::size_t const full =
      n <= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()) - row_lanes
          ? n - n % row_lanes
          : 0;
  // Per logical lane: the best value and the first index holding it (-1: none yet).
  vfloat best[row_vectors];
  vint at[row_vectors];
  vint idx[row_vectors];
  for (std::size_t v = 0; v < row_vectors; ++v) {
    best[v] = splat(ninf);
    at[v] = vint{} - 1;
    std::int32_t first[simd_width];
    for (std::size_t j = 0; j < simd_width; ++j)
      first[j] = static_cast<std::int32_t>(v * simd_width + j);
    std::memcpy(&idx[v], first, sizeof first);
  }
  auto const step = static_cast<std::int32_t>(row_lanes);
  for (std::size_t i = 0; i < full; i += row_lanes) {
    for (std::size_t v = 0; v < row_vectors; ++v) {
      vfloat const a = load(x + i + v * simd_width);
      vint const better = a > best[v];
      best[v] = select(better, a, best[v]);
      at[v] = select(better, idx[v], at[v]);
      idx[v] += step;
    }
  }
  float b = ninf;
  std::int64_t a = -1;
  for (std::size_t v = 0; v < row_vectors; ++v) {
    for (std::size_t j = 0; j < simd_width; ++j) {
      std::int64_t const lane_at = at[v][j];
      if (lane_at < 0) continue;
      if (a < 0 || best[v][j] > b || (best[v][j] == b && lane_at < a)) {
        b = best[v][j];
        a = lane_at;
      }
    }
  }
  for (std::size_t i = full; i < n; ++i) {
    if (x[i] > b) {
      b = x[i];
      a = static_cast<std::int64_t>(i);
    }
  }
  return a;
}

//! The first index i in [0, n) with x[i] == value, or n if there is none. Vectorised: whole
//! vectors are compared at once until one holds a match.
[[nodiscard]] inline std::size_t first_equal(float const* x, std::size_t n, float value) noexcept {
  vfloat const v = splat(value);
  std::size_t i = 0;
  for (; i + simd_width <= n; i += simd_width)
    if (any(load(x + i) == v)) break;
  for (; i < n; ++i)
    if (x[i] == value) return i;
  return n;
}

//! The first index i in [0, n) at which x[i] is NaN or infinite, or n when every entry is
//! finite. Vectorised: x * 0 is 0 for a finite x and NaN otherwise, so four sums of x * 0 over a
//! block of `row_block` entries are all 0 exactly when the block is finite (two operations per
//! vector, no branch); a block that is not is searched again entry by entry.
[[nodiscard]] inline std::size_t first_non_finite(float const* x, std::size_t n) noexcept {
  constexpr std::size_t sets = 4;
  constexpr std::size_t stride = sets * simd_width;
  static_assert(row_block % stride == 0);
  vfloat const zero = splat(0.0f);
  std::size_t i = 0;
  std::size_t const wide = n - n % stride;
  while (i < wide) {
    std::size_t const stop = std::min(wide, i + row_block);
    vfloat acc[sets];
    for (vfloat& a : acc) a = zero;
    for (std::size_t j = i; j < stop; j += stride)
      for (std::size_t v = 0; v < sets; ++v) acc[v] += load(x + j + v * simd_width) * zero;
    if (any(~((acc[0] + acc[1] + acc[2] + acc[3]) == zero))) break;  // searched below
    i = stop;
  }
  for (; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return n;
}
