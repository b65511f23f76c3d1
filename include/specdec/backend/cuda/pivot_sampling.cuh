#pragma once
//! \file
//! Sort-free sampling on the device: the policy's distribution (temperature, top-k, top-p, min-p)
//! with the thresholds found by the pivot search of detail/pivot.hpp, and the draw, in one kernel
//! launch per batch of rows.
//!
//! - `launch_pivot_distribution` writes each row's distribution, as `sampler::distribution` does
//!   (the radix-selection kernel of distribution.cuh computes the same rows; `launch_distribution`
//!   now runs this one);
//! - `launch_pivot_sample` draws one token per row with the host's rule (sampling/draw.hpp: the
//!   first index whose running weight exceeds u times the total) and the row's uniform (Philox word
//!   offset + 0, then the generator advances by 1), without writing the distribution.
//!
//! A row is shared by a group of G thread blocks: a thread block cluster on devices of compute
//! capability 9.0 and above (G up to 8, so that a row of 128256 entries spreads over 8
//! multiprocessors at batch 1), one block elsewhere. Each block holds its chunk of the row (a
//! multiple of 512 entries) in shared memory when it fits (else in the output or work row) and the
//! blocks of a group combine their per-pass figures through each other's shared memory (`group`),
//! so a pass over the row costs one group-wide wait:
//!
//! 1. statistics: maximum (first index), smallest finite entry, finite count, NaN / +inf;
//! 2. top-k (count search on the logits) while more than `gather_cap` entries lie in the bracket,
//!    then the exact cut among the gathered entries (ranked by counting), or by id along a run of
//!    equal values (`detail::pivot`);
//! 3. e = exp((z - max) / T) of the kept entries, in place, and their total;
//! 4. top-p (mass search on e), the same way;
//! 5. min-p, and the mass of what is kept;
//! 6. the distribution (e / mass) is written, or the draw finds the crossing: each block knows the
//!    weight of the blocks before it, the block holding the crossing searches its chunk.
//!
//! The decisions are the twin's (reference/pivot.hpp, tested on the host against `sampler` on
//! many rows) and the masses differ from the host's only by the order of double additions.
//! Errors: a row with a NaN or +inf logit (or none finite) sets `non_finite_logit` in its flags;
//! its outputs are written (zeros, token 0) and its generator is not advanced.
//!
//! One topic, the sort-free sampling kernel, needs just over 600 lines here: its phases share the
//! group's exchange of sums and its gathers, which have no other user.
//!
//! The kernels are templates (common.cuh says why).

#include <cuda_runtime.h>
#if defined(__CUDACC__)
#include <cooperative_groups.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/draw.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/core/philox.hpp"
#include "specdec/detail/exp.hpp"
#include "specdec/detail/pivot.hpp"

namespace specdec::cuda {

//! Inputs of the pivot kernels. All pointers are device pointers.
struct pivot_params {
  float const* z = nullptr;  //!< [rows, z_stride] logits, bias and penalties already applied
  std::int64_t z_stride = 0;
  std::int32_t rows = 0;
  std::int32_t vocab = 0;
  device_policy policy;  //!< temperature, top-k, top-p, min-p (`processing()` must be false)
  //! launch_pivot_distribution: [rows, probs_stride] out (may be z itself).
  //! launch_pivot_sample: [rows, probs_stride] scratch, needed only when a chunk does not fit
  //! in shared memory (`pivot_plan::staged` false), else may be null.
  float* probs = nullptr;
  std::int64_t probs_stride = 0;
  rng_state* rng = nullptr;    //!< [rows] launch_pivot_sample: word offset + 0, then +1
  token_id* tokens = nullptr;  //!< [rows] launch_pivot_sample: out
  std::int32_t* error_flags =
      nullptr;  //!< [rows] device_error bits (or null), zeroed by the caller
};

//! How the pivot kernels split rows over thread blocks.
struct pivot_plan {
  std::int32_t group = 1;  //!< blocks per row (a cluster when > 1)
  std::int32_t chunk =
      0;                //!< entries per block (a multiple of 512; the last block's may be shorter)
  bool staged = false;  //!< chunks held in shared memory
};

//! Threads per block of the pivot kernels.
inline constexpr int pivot_threads = 512;
//! Most blocks per row (the portable cluster size).
inline constexpr int pivot_max_group = 8;
//! Entries a block takes at least before a row is shared by more blocks.
inline constexpr std::int32_t pivot_min_chunk = 2048;

//! The split of `rows` rows of `vocab` entries on a device with `multiprocessors` multiprocessors
//! of compute capability `major`.x and `smem_optin` bytes of shared memory per block: rows share
//! blocks (clusters, capability 9.0 and above) while the batch leaves multiprocessors idle, with
//! at least `pivot_min_chunk` entries a block; chunks in shared memory when they fit.
[[nodiscard]] constexpr pivot_plan plan_pivot(std::int32_t vocab, std::int32_t rows,
                                              std::int32_t multiprocessors, int major,
                                              std::size_t smem_optin) noexcept {
  pivot_plan p;
  if (vocab <= 0 || rows <= 0) return p;
  std::int64_t g =
      major >= 9 ? (static_cast<std::int64_t>(vocab) + pivot_min_chunk - 1) / pivot_min_chunk : 1;
  std::int64_t const fill = std::max<std::int64_t>(1, 2 * std::int64_t{multiprocessors} / rows);
  g = std::clamp<std::int64_t>(std::min(g, fill), 1, pivot_max_group);
  std::int64_t chunk = (vocab + g - 1) / g;
  chunk = (chunk + host_row_block - 1) / host_row_block * host_row_block;
  p.group = static_cast<std::int32_t>((vocab + chunk - 1) / chunk);
  p.chunk = static_cast<std::int32_t>(chunk);
  // Static shared memory of the kernel is a few KiB; leave 16 KiB to it.
  p.staged =
      static_cast<std::size_t>(chunk) * sizeof(float) + (std::size_t{16} << 10) <= smem_optin;
  return p;
}

namespace detail {

#if defined(__CUDACC__)

//! The blocks that share a row (see the file comment): a cluster on capability 9.0 and above,
//! else the block alone.
struct row_group {
  [[nodiscard]] __device__ static int rank() noexcept {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#else
    return 0;
#endif
  }
  [[nodiscard]] __device__ static int size() noexcept {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return static_cast<int>(cooperative_groups::this_cluster().num_blocks());
#else
    return 1;
#endif
  }
  //! Every thread of every block of the group waits here (shared memory written before is then
  //! visible to the group).
  __device__ static void sync() noexcept {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#else
    __syncthreads();
#endif
  }
  //! `p` (this block's shared memory) as block `r` of the group has it.
  template <class T>
  [[nodiscard]] __device__ static T* at(T* p, int r) noexcept {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().map_shared_rank(p, r);
#else
    (void)r;
    return p;
#endif
  }
};

//! Values a block publishes to its group at once.
inline constexpr int pivot_values = 16;

//! The shared state of one block of the pivot kernel.
struct pivot_shared {
  double slot[2][pivot_values];               // what this block publishes (alternating)
  double all[pivot_max_group][pivot_values];  // what every block published, copied here
  double warp_part[pivot_threads / 32][pivot_values];
  float list_v[specdec::detail::pivot::gather_cap];  // this block's gathered entries
  std::int32_t list_id[specdec::detail::pivot::gather_cap];
  float merged_v[specdec::detail::pivot::gather_cap];  // every block's, then ordered
  std::int32_t merged_id[specdec::detail::pivot::gather_cap];
  float sorted_v[specdec::detail::pivot::gather_cap];
  std::int32_t sorted_id[specdec::detail::pivot::gather_cap];
  std::int32_t list_count;
  float found_t;  // the cut of the last search (specdec::detail::pivot::cut, which shared memory
                  // cannot
  std::int32_t found_id;  // hold: it has default member initializers)
  double found_mass;
  std::int64_t scan[32];

  [[nodiscard]] __device__ specdec::detail::pivot::cut found() const noexcept {
    return specdec::detail::pivot::cut{found_t, found_id, found_mass};
  }
  __device__ void set_found(specdec::detail::pivot::cut const& c) noexcept {
    found_t = c.t;
    found_id = c.last_id;
    found_mass = c.mass;
  }
};

//! Sums v[0, n) over the block into s.warp_part and publishes the sums to the group in slot
//! `turn` (then flips it); on return s.all[r][k] holds block r's sum k for every block r of the
//! group. Every thread of every block must call it with the same n.
template <int N>
__device__ void publish_sums(double (&v)[N], pivot_shared& s, int& turn) {
  static_assert(N <= pivot_values);
  int const tid = static_cast<int>(threadIdx.x);
  int const lane = tid & 31, warp = tid >> 5;
  constexpr int warps = pivot_threads / 32;
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = warp_sum(v[k]);
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < N; ++k) s.warp_part[warp][k] = v[k];
  __syncthreads();
  if (tid < N) {
    double t = 0.0;
    for (int w = 0; w < warps; ++w) t += s.warp_part[w][tid];
    s.slot[turn][tid] = t;
  }
  row_group::sync();
  int const g = row_group::size();
  for (int i = tid; i < g * N; i += pivot_threads)
    s.all[i / N][i % N] = row_group::at(&s.slot[turn][0], i / N)[i % N];
  __syncthreads();
  turn ^= 1;
}

//! The sum of published value k over the group.
__device__ __forceinline__ double group_total(pivot_shared const& s, int k) noexcept {
  double t = 0.0;
  for (int r = 0; r < row_group::size(); ++r) t += s.all[r][k];
  return t;
}

//! One pass of a search over this block's entries vals[0, len) (ids begin + i): the weights and
//! counts at the pivots of `b`, combined over the group, then `narrow`.
inline __device__ void pivot_pass(float const* vals, std::int32_t len,
                                  specdec::detail::pivot::bracket& b,
                                  specdec::detail::pivot::mode md, double target, pivot_shared& s,
                                  int& turn) {
  namespace pv = specdec::detail::pivot;
  float p[pv::pivot_count];
  int const np = pv::place_pivots(b, md, p);
  for (int j = np; j < pv::pivot_count; ++j) p[j] = INFINITY;  // never reached: no +inf entry
  float w[pv::pivot_count];
  std::int32_t c[pv::pivot_count];
#pragma unroll
  for (int j = 0; j < pv::pivot_count; ++j) {
    w[j] = 0.0f;
    c[j] = 0;
  }
  for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < len; i += pivot_threads) {
    float const x = vals[i];
#pragma unroll
    for (int j = 0; j < pv::pivot_count; ++j) {
      bool const ge = x >= p[j];
      c[j] += ge ? 1 : 0;
      w[j] += ge ? x : 0.0f;
    }
  }
  double v[2 * pv::pivot_count];
#pragma unroll
  for (int j = 0; j < pv::pivot_count; ++j) {
    v[j] = static_cast<double>(c[j]);
    v[pv::pivot_count + j] = static_cast<double>(w[j]);
  }
  publish_sums(v, s, turn);
  double wt[pv::pivot_count];
  std::int64_t ct[pv::pivot_count];
  for (int j = 0; j < np; ++j) {
    ct[j] = static_cast<std::int64_t>(group_total(s, j));
    wt[j] =
        md == pv::mode::count ? static_cast<double>(ct[j]) : group_total(s, pv::pivot_count + j);
  }
  pv::narrow(b, p, wt, ct, np, target);
}

//! Finishes a search whose bracket `b` is `done`: the cut, in s.found() (every block of the
//! group gets the same). vals[0, len) are this block's entries, ids begin + i.
inline __device__ void pivot_finish(float const* vals, std::int32_t len, std::int32_t begin,
                                    specdec::detail::pivot::bracket const& b,
                                    specdec::detail::pivot::mode md, double target, pivot_shared& s,
                                    int& turn) {
  namespace pv = specdec::detail::pivot;
  int const tid = static_cast<int>(threadIdx.x);
  if (b.inside() > pv::gather_cap) {
    // Adjacent ends: every entry inside equals lo. The need-th of them by id is found by the
    // block that holds it.
    std::int64_t const need = pv::ties_needed(b, md, target);
    double v[1] = {0.0};
    for (std::int32_t i = tid; i < len; i += pivot_threads) v[0] += vals[i] == b.lo ? 1.0 : 0.0;
    publish_sums(v, s, turn);
    std::int64_t before = 0;
    int owner = row_group::size() - 1;
    for (int r = 0; r < row_group::size(); ++r) {
      auto const here = static_cast<std::int64_t>(s.all[r][0]);
      if (before + here >= need) {
        owner = r;
        break;
      }
      before += here;
    }
    double id[1] = {0.0};
    if (row_group::rank() == owner) {
      // The (need - before)-th equal entry of this chunk: scan tiles in id order.
      std::int64_t carry = before;
      std::int32_t hit = -1;
      for (std::int32_t t0 = 0; t0 < len && hit < 0; t0 += pivot_threads) {
        std::int32_t const i = t0 + tid;
        std::int64_t const eq = i < len && vals[i] == b.lo ? 1 : 0;
        std::int64_t total = 0;
        std::int64_t const incl = block_inclusive_scan(eq, s.scan, total);
        if (eq != 0 && carry + incl == need) s.list_count = i;  // exactly one thread
        __syncthreads();
        if (carry + total >= need) hit = s.list_count;
        carry += total;
        __syncthreads();
      }
      if (tid == 0) id[0] = static_cast<double>(begin + (hit < 0 ? len - 1 : hit));
    }
    // Only the owner's thread 0 contributes; the sum over the group is its id.
    publish_sums(id, s, turn);
    if (tid == 0) {
      s.set_found(pv::cut{b.lo, static_cast<std::int32_t>(group_total(s, 0)),
                          b.w_hi + static_cast<double>(need) * static_cast<double>(b.lo)});
    }
    __syncthreads();
    return;
  }
  // Gather [lo, hi) from every block (at most gather_cap in all), order them by counting, cut.
  if (tid == 0) s.list_count = 0;
  __syncthreads();
  for (std::int32_t i = tid; i < len; i += pivot_threads) {
    float const x = vals[i];
    if (x >= b.lo && x < b.hi) {
      int const at = atomicAdd(&s.list_count, 1);
      if (at < pv::gather_cap) {
        s.list_v[at] = x;
        s.list_id[at] = begin + i;
      }
    }
  }
  __syncthreads();
  double n[1] = {tid == 0 ? static_cast<double>(min(s.list_count, pv::gather_cap)) : 0.0};
  publish_sums(n, s, turn);  // also makes every list visible to the group
  int m = 0;
  for (int r = 0; r < row_group::size(); ++r) {
    int const count = static_cast<int>(s.all[r][0]);
    for (int k = tid; k < count && m + k < pv::gather_cap; k += pivot_threads) {
      s.merged_v[m + k] = row_group::at(&s.list_v[0], r)[k];
      s.merged_id[m + k] = row_group::at(&s.list_id[0], r)[k];
    }
    m = min(m + count, pv::gather_cap);
  }
  __syncthreads();
  if (tid < m) {
    float const x = s.merged_v[tid];
    std::int32_t const id = s.merged_id[tid];
    int rank = 0;
    for (int o = 0; o < m; ++o) rank += pv::before(s.merged_v[o], s.merged_id[o], x, id) ? 1 : 0;
    s.sorted_v[rank] = x;
    s.sorted_id[rank] = id;
  }
  __syncthreads();
  if (tid == 0) s.set_found(pv::cut_sorted(s.sorted_v, s.sorted_id, m, b, md, target));
  __syncthreads();
}

//! The pivot kernel: grid = rows x plan.group blocks (a cluster per row when group > 1). `Draw`:
//! draw a token per row; else write the distribution.
template <bool Draw>
__global__ void __launch_bounds__(pivot_threads) pivot_kernel(pivot_params p, pivot_plan plan) {
  namespace pv = specdec::detail::pivot;
  extern __shared__ float staged[];
  __shared__ pivot_shared s;
  int turn = 0;
  int const tid = static_cast<int>(threadIdx.x);
  std::int32_t const row = static_cast<std::int32_t>(blockIdx.x) / plan.group;
  int const rank = row_group::rank();
  std::int32_t const begin = rank * plan.chunk;
  std::int32_t const end = min(p.vocab, begin + plan.chunk);
  std::int32_t const len = max(0, end - begin);
  float const* z = p.z + static_cast<std::int64_t>(row) * p.z_stride + begin;
  float* const out_row =
      p.probs != nullptr ? p.probs + static_cast<std::int64_t>(row) * p.probs_stride : nullptr;
  // This block's entries: z first, then e in place.
  float* const vals = plan.staged ? staged : out_row + begin;
  device_policy const& pol = p.policy;

  // 1. Copy the chunk and take its statistics.
  float mx = -INFINITY, mn = INFINITY;
  std::int32_t arg = INT32_MAX;
  double finite = 0.0, bad = 0.0;
  for (std::int32_t i = tid; i < len; i += pivot_threads) {
    float const x = z[i];
    vals[i] = x;
    if (x != x || x == INFINITY) bad = 1.0;
    if (x > -INFINITY && x < INFINITY) {
      finite += 1.0;
      mn = fminf(mn, x);
    }
    if (x > mx) {  // strided in index order: the first maximum of this thread
      mx = x;
      arg = begin + i;
    }
  }
  {
    __shared__ arg_max_pair ascratch[32];
    __shared__ float fscratch[32];
    arg_max_pair const best = block_argmax(arg_max_pair{mx, arg}, ascratch);
    float const low = -block_max(-mn, fscratch);
    double v[5] = {0.0, 0.0, 0.0, 0.0, 0.0};
    if (tid == 0) {
      v[0] = best.value;
      v[1] = best.index;
      v[2] = low;
    }
    v[3] = finite;
    v[4] = bad;
    // Maxima and minima are not sums: thread 0 alone contributes them, the group combines below.
    publish_sums(v, s, turn);
  }
  float zmax = -INFINITY, zmin = INFINITY;
  std::int32_t argmax = INT32_MAX;
  double total_finite = 0.0, any_bad = 0.0;
  for (int r = 0; r < row_group::size(); ++r) {
    auto const m = static_cast<float>(s.all[r][0]);
    auto const a = static_cast<std::int32_t>(s.all[r][1]);
    if (m > zmax || (m == zmax && a < argmax)) {
      zmax = m;
      argmax = a;
    }
    zmin = fminf(zmin, static_cast<float>(s.all[r][2]));
    total_finite += s.all[r][3];
    any_bad += s.all[r][4];
  }
  bool const flagged = any_bad != 0.0 || total_finite == 0.0;
  bool const leader = rank == 0 && tid == 0;
  if (flagged || pol.greedy) {
    if (leader && flagged && p.error_flags != nullptr) p.error_flags[row] |= non_finite_logit;
    if constexpr (Draw) {
      if (leader) {
        p.tokens[row] = flagged ? 0 : argmax;
        if (!flagged) p.rng[row].skip(1);
      }
    } else {
      for (std::int32_t i = tid; i < len; i += pivot_threads)
        out_row[begin + i] = flagged ? 0.0f : (begin + i == argmax ? 1.0f : 0.0f);
    }
    row_group::sync();  // no block leaves while the group may read its shared memory
    return;
  }

  // 2. Top-k on the logits.
  pv::cut top_k{-INFINITY, INT32_MAX, 0.0};
  if (pol.top_k > 0 && static_cast<double>(pol.top_k) < total_finite) {
    pv::bracket b;
    b.lo = zmin;
    b.hi = pv::next_up(zmax);
    b.c_lo = static_cast<std::int64_t>(total_finite);
    double const target = static_cast<double>(pol.top_k);
    while (!pv::done(b)) pivot_pass(vals, len, b, pv::mode::count, target, s, turn);
    pivot_finish(vals, len, begin, b, pv::mode::count, target, s, turn);
    top_k = s.found();
  }

  // 3. e = exp((z - max) / T) of the kept entries, in place, and their total.
  float const inv_t = pol.inv_temperature;
  {
    double v[2] = {0.0, 0.0};
    for (std::int32_t i = tid; i < len; i += pivot_threads) {
      float const x = vals[i];
      float const e = pv::kept(x, begin + i, top_k) ? exp_shifted1(x, zmax, inv_t) : 0.0f;
      vals[i] = e;
      v[0] += static_cast<double>(e);
      v[1] += e > 0.0f ? 1.0 : 0.0;
    }
    publish_sums(v, s, turn);
  }
  double const total = group_total(s, 0);
  auto const positive = static_cast<std::int64_t>(group_total(s, 1));

  // 4. Top-p on e.
  bool const top_p_on = pol.top_p < 1.0f;
  pv::cut top_p{0.0f, -1, total};
  if (top_p_on) {
    pv::bracket b;
    b.lo = 1.40129846e-45f;  // the smallest positive float: zeros carry no mass
    b.hi = pv::next_up(1.0f);
    b.c_lo = positive;
    double const target = static_cast<double>(pol.top_p) * total;
    while (!pv::done(b)) pivot_pass(vals, len, b, pv::mode::mass, target, s, turn);
    pivot_finish(vals, len, begin, b, pv::mode::mass, target, s, turn);
    top_p = s.found();
  }

  // 5. Min-p and the mass of what is kept.
  {
    double v[1] = {0.0};
    for (std::int32_t i = tid; i < len; i += pivot_threads) {
      float const e = vals[i];
      bool const keep = e > 0.0f && (!top_p_on || pv::kept(e, begin + i, top_p)) &&
                        !(pol.min_p > 0.0f && e < pol.min_p);
      vals[i] = keep ? e : 0.0f;
      v[0] += keep ? static_cast<double>(e) : 0.0;
    }
    publish_sums(v, s, turn);
  }
  double const mass = group_total(s, 0);
  float const inv = static_cast<float>(1.0 / mass);

  if constexpr (!Draw) {
    // 6a. The distribution.
    for (std::int32_t i = tid; i < len; i += pivot_threads)
      out_row[begin + i] = __fmul_rn(vals[i], inv);
  } else {
    // 6b. The draw over w = e * inv (what the host's distribution holds): the block holding the
    // crossing of u times the total weight searches its chunk.
    auto const w = [&](std::int32_t i) { return __fmul_rn(vals[i - begin], inv); };
    double v[1] = {0.0};
    for (std::int32_t i = tid; i < len; i += pivot_threads)
      v[0] += static_cast<double>(w(begin + i));
    publish_sums(v, s, turn);
    double const weight = group_total(s, 0);
    philox g = p.rng[row];
    double const target = static_cast<double>(g.uniform_at(0)) * weight;
    double base = 0.0;
    int owner = -1, last = -1;
    for (int r = 0; r < row_group::size(); ++r) {
      double const here = s.all[r][0];
      if (here > 0.0) last = r;
      if (owner < 0 && here > 0.0 && base + here > target) owner = r;
      if (owner < 0) base += here;
    }
    bool const fallback = owner < 0;  // rounding left the target unreached: the last positive
    if (fallback) owner = last;
    if (rank == owner) {
      std::int32_t t = fallback ? -1 : find_crossing_in(w, nullptr, 0, begin, end, base, target);
      if (t < 0) {
        __shared__ std::int32_t last_index;
        if (tid == 0) last_index = -1;
        __syncthreads();
        for (std::int32_t i = tid; i < len; i += pivot_threads)
          if (w(begin + i) > 0.0f) atomicMax(&last_index, begin + i);
        __syncthreads();
        t = last_index;
      }
      if (tid == 0) {
        p.tokens[row] = t < 0 ? 0 : t;
        g.skip(1);
        p.rng[row] = g;
      }
    }
  }
  row_group::sync();  // no block leaves while the group may read its shared memory
}

#endif  // __CUDACC__

}  // namespace detail

#if defined(__CUDACC__)

namespace detail {

//! Checks `p` and launches the pivot kernel.
template <bool Draw>
inline launch_status launch_pivot(pivot_params const& p, cudaStream_t stream,
                                  char const* what) noexcept {
  if (p.rows == 0) return {};
  if (p.z == nullptr || p.rows < 0 || p.vocab <= 0 || p.z_stride < p.vocab)
    return fail(status::invalid_argument, what);
  if (p.policy.processing() || (!p.policy.greedy && !(p.policy.inv_temperature > 0.0f)) ||
      p.policy.top_k < 0 || !(p.policy.top_p > 0.0f && p.policy.top_p <= 1.0f) ||
      !(p.policy.min_p >= 0.0f && p.policy.min_p <= 1.0f))
    return fail(status::invalid_argument, what);
  int device = 0, sms = 0, major = 0, optin = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e != cudaSuccess) return launch_status{status::cuda_error, e, what};
  pivot_plan const plan = plan_pivot(p.vocab, p.rows, sms, major, static_cast<std::size_t>(optin));
  if (!plan.staged && (p.probs == nullptr || p.probs_stride < p.vocab))
    return fail(status::invalid_argument, what);  // unstaged rows live in the probs rows
  if (Draw ? (p.rng == nullptr || p.tokens == nullptr)
           : (p.probs == nullptr || p.probs_stride < p.vocab))
    return fail(status::invalid_argument, what);
  if (p.probs != nullptr && p.z != p.probs && p.z < p.probs + p.rows * p.probs_stride &&
      p.probs < p.z + p.rows * p.z_stride)
    return fail(status::invalid_argument, what);  // partial overlap
  if (static_cast<std::int64_t>(p.rows) * plan.group > INT32_MAX)
    return fail(status::out_of_range, what);
  std::size_t const smem = plan.staged ? static_cast<std::size_t>(plan.chunk) * sizeof(float) : 0;
  auto const kernel = pivot_kernel<Draw>;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
  if (e != cudaSuccess) return launch_status{status::cuda_error, e, what};
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(p.rows * plan.group));
  config.blockDim = dim3(pivot_threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  if (plan.group > 1) {
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = static_cast<unsigned>(plan.group);
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
  }
  e = cudaLaunchKernelEx(&config, kernel, p, plan);
  if (e != cudaSuccess) return launch_status{status::cuda_error, e, what};
  return last_launch_status(what);
}

}  // namespace detail

//! Writes each row's distribution into `probs` (see the file comment). error_flags, when given,
//! must be zeroed by the caller.
inline launch_status launch_pivot_distribution(pivot_params const& p,
                                               cudaStream_t stream) noexcept {
  return detail::launch_pivot<false>(p, stream, "launch_pivot_distribution");
}

//! Draws one token per row into `tokens`, advancing each row's generator by 1 (see the file
//! comment). `probs` is scratch, needed when rows do not fit in shared memory.
inline launch_status launch_pivot_sample(pivot_params const& p, cudaStream_t stream) noexcept {
  return detail::launch_pivot<true>(p, stream, "launch_pivot_sample");
}

#endif  // __CUDACC__

}  // namespace specdec::cuda
