//! \file
//! Attention over a virtual sequence of cache rows (`row_run`, backend/cpu/attention.hpp): scores
//! (AVX-512 with 8-float heads: keys transposed into blocks of 16), softmax, values. A kernel body:
//! backend/cpu/kernels.hpp compiles it once per CPU target.

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

#if SPECDEC_KERNEL_LEVEL >= 2
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

//! Adds to `out[row]`, for each cache row below `past` in the virtual sequence `runs` (`length`
//! rows), what `kind` names for query `q` [hs] against the keys `k` (kv head's first float, rows
//! `ldk` apart): its softmax weight over the whole sequence, or its scaled logit
//! (`forward_request::kv_scores`), the weight computed as attention computes it (`softmax_rows`).
//! `s` is scratch of round_up(length, simd::width) floats.
inline void add_cache_scores(float const* q, float const* k, std::size_t ldk, std::size_t hs,
                             row_run const* runs, std::size_t n_runs, std::size_t length,
                             std::size_t past, kv_score_kind kind, float* s, float* out) noexcept {
  float const scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (std::size_t r = 0, at = 0; r < n_runs; at += runs[r].count, ++r)
    attention_scores(q, k + runs[r].row * ldk, ldk, runs[r].count, hs, scale, s + at);
  float inv = 1.0f;
  if (kind == kv_score_kind::probability) {
    float const top = row_max(s, length);
    float sum = 0.0f;
    softmax_rows<1>(s, 0, length, &top, &sum);
    inv = 1.0f / sum;
  }
  for (std::size_t r = 0, at = 0; r < n_runs; at += runs[r].count, ++r)
    for (std::size_t c = 0; c < runs[r].count && runs[r].row + c < past; ++c)
      out[runs[r].row + c] += s[at + c] * inv;
}

//! The attention of one token for its query heads [h0, h1) (at most `max_value_accumulators`
//! of them) over the virtual sequence `runs` (`n_runs` runs of cache rows, `length` rows in all,
//! every row below `end`): scores by cache row [0, end) compacted to the sequence, softmax over
//! it, then the values summed over it in its order. `q` [heads, hs] is the token's query row,
//! `kc` / `vc` the layer's keys and values ([rows, ldkv], kv head g at g hs), query head h reading
//! kv head h / per_kv; `scores` is scratch of (h1 - h0) rows `stride` floats apart (stride >=
//! round_up(max(end, length), 16)); writes att[h hs : (h + 1) hs] for each head. The result
//! depends only on the sequence's rows, never on where they sit in the cache.
inline void attend_heads(float const* q, float const* kc, float const* vc, std::size_t ldkv,
                         std::size_t hs, std::size_t per_kv, std::size_t h0, std::size_t h1,
                         std::size_t end, row_run const* runs, std::size_t n_runs,
                         std::size_t length, float* scores, std::size_t stride,
                         float* att) noexcept {
  bool const compacted = n_runs > 1 || runs[0].row != 0;
  // A sparse sequence (a view of the cache) is scored run by run, a dense one in one pass and
  // compacted: the same bits either way (every row is scored alike), the cost of what is seen.
  bool const by_runs = 2 * length < end;
  float const scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float top[max_value_accumulators] = {};  // set for [0, h1 - h0) below
  for (std::size_t h = h0; h < h1; ++h) {
    float* const s = scores + (h - h0) * stride;
    float const* const k = kc + (h / per_kv) * hs;
    if (by_runs) {
      for (std::size_t r = 0, at = 0; r < n_runs; at += runs[r].count, ++r)
        attention_scores(q + h * hs, k + runs[r].row * ldkv, ldkv, runs[r].count, hs, scale,
                         s + at);
    } else {
      attention_scores(q + h * hs, k, ldkv, end, hs, scale, s);
      if (compacted) compact_scores(s, runs, n_runs);
    }
    top[h - h0] = row_max(s, length);
  }
  float inv[max_value_accumulators];
  softmax_rows(h1 - h0, scores, stride, length, top, inv);
  for (std::size_t h = h0; h < h1; ++h) inv[h - h0] = 1.0f / inv[h - h0];

  // Values: (head, chunk) accumulators in passes of at most max_value_accumulators.
  std::size_t const chunk = value_chunk;
  if (chunk == 0 || hs % chunk != 0) {
    for (std::size_t h = h0; h < h1; ++h)
      attention_values_scalar(scores + (h - h0) * stride, vc + (h / per_kv) * hs, ldkv, hs, runs,
                              n_runs, inv[h - h0], att + h * hs);
    return;
  }
#if defined(__SSE2__)
  std::size_t const chunks = hs / chunk;
  if (chunks == 1) {
    // One chunk per head: accumulator a is head h0 + a, value offset (h0 + a) / per_kv.
    std::size_t const count = h1 - h0;
    std::size_t const shared = std::min(per_kv, count);
    bool regular = true;
    for (std::size_t a = 0; a < count; ++a)
      regular = regular && (h0 + a) / per_kv - h0 / per_kv == a / shared;
    if (regular &&
        attention_values_regular(count, shared, false, scores, stride, inv, att + h0 * hs, vc, ldkv,
                                 (h0 / per_kv) * hs, runs, n_runs))
      return;
  } else if (chunks % max_value_accumulators == 0) {
    // Whole passes within one head.
    for (std::size_t h = h0; h < h1; ++h)
      for (std::size_t c = 0; c < chunks; c += max_value_accumulators)
        attention_values_regular(max_value_accumulators, 1, true, scores + (h - h0) * stride, 0,
                                 inv + (h - h0), att + h * hs + c * chunk, vc, ldkv,
                                 (h / per_kv) * hs + c * chunk, runs, n_runs);
    return;
  }
  std::size_t const pairs = (h1 - h0) * chunks;
  for (std::size_t a0 = 0; a0 < pairs; a0 += max_value_accumulators) {
    std::size_t const count = std::min(max_value_accumulators, pairs - a0);
    float const* p[max_value_accumulators];
    std::size_t off[max_value_accumulators];
    float pinv[max_value_accumulators];
    float* o[max_value_accumulators];
    for (std::size_t a = 0; a < count; ++a) {
      std::size_t const h = h0 + (a0 + a) / chunks;
      std::size_t const c = (a0 + a) % chunks;
      p[a] = scores + (h - h0) * stride;
      off[a] = (h / per_kv) * hs + c * chunk;
      pinv[a] = inv[h - h0];
      o[a] = att + h * hs + c * chunk;
    }
    attention_values(count, p, off, pinv, o, vc, ldkv, runs, n_runs);
  }
#endif
}
