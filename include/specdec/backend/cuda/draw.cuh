#pragma once
//! \file
//! The row machinery shared by the CUDA sampling and verification kernels.
//!
//! - The softmax arithmetic of detail/rows.hpp, operation for operation, with the one
//!   `exp_nonpositive` of detail/exp.hpp that host and device share (rounded multiplies and adds,
//!   never contracted into fused multiply-adds), so that a probability computed here is the float
//!   the host computes.
//! - Row statistics over a vocabulary split into chunks of several thread blocks
//!   (`launch_row_stats`): per (row, chunk) the maximum, and the sum of exp((z - max) * 1/T) with
//!   the host's blocking (16 float lanes over blocks of 512, combined in double), so the
//!   normaliser differs from the host's only by the order of double additions.
//! - The tree walk and the final draw (`launch_walk_draw`): every block of a sequence replays the
//!   (cheap, gather-only) acceptance walk of verify/detail/walk.hpp's `sampling_walk`, then the
//!   blocks share the pass over the one row the final token is drawn from; the last block to finish
//!   locates the inverse-CDF crossing and writes the results. Sequences whose walk needs a residual
//!   update in the middle (q rows and a node with several children) run in one block.
//! - Greedy verification (`launch_greedy_walk`): chunked argmax of every row, then the walk.
//!
//! Sampling a token from a row is the walk over a root-only tree (one word, offset + 0).

#include <cuda_runtime.h>
#if defined(__CUDACC__)
#include <cuda_pipeline.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/detail/exp.hpp"

namespace specdec::cuda {

//! Entries per float block of the host's exp-and-sum (`detail::row_block` in detail/simd.hpp).
inline constexpr std::int32_t host_row_block = 512;
//! Float lanes of the host's exp-and-sum (`detail::row_lanes` in detail/simd.hpp).
inline constexpr std::int32_t host_row_lanes = 16;

//! How a row of `vocab` entries is split over thread blocks: `count` chunks of `size` entries
//! (the last may be shorter); `size` is a multiple of `host_row_block`.
struct chunk_plan {
  std::int32_t size = 0;   //!< entries per chunk
  std::int32_t count = 0;  //!< chunks per row
};

//! Most host blocks (of 512 entries) one thread block takes: bounds the serial work per block.
inline constexpr std::int32_t max_blocks_per_chunk = 16;

//! Splits rows of `vocab` entries so that `rows` rows give about two blocks per multiprocessor
//! (more chunks per row when there are few rows), with at most `max_blocks_per_chunk` * 512
//! entries per chunk (so that many rows of a large vocabulary still spread over many blocks).
[[nodiscard]] constexpr chunk_plan plan_chunks(std::int32_t vocab, std::int64_t rows,
                                               std::int32_t multiprocessors) noexcept {
  if (vocab <= 0 || rows <= 0) return {host_row_block, 0};
  std::int64_t const blocks = (vocab + host_row_block - 1) / host_row_block;
  std::int64_t const want_total = 2 * static_cast<std::int64_t>(std::max(multiprocessors, 1));
  std::int64_t want = std::max((want_total + rows - 1) / rows,
                               (blocks + max_blocks_per_chunk - 1) / max_blocks_per_chunk);
  want = std::clamp<std::int64_t>(want, 1, blocks);
  std::int64_t const per = (blocks + want - 1) / want;
  auto const size = static_cast<std::int32_t>(per * host_row_block);
  return {size, static_cast<std::int32_t>((vocab + size - 1) / size)};
}

//! Most chunks a row of `vocab` entries can be split into.
[[nodiscard]] constexpr std::int32_t max_chunks(std::int32_t vocab) noexcept {
  return vocab <= 0 ? 0 : (vocab + host_row_block - 1) / host_row_block;
}

//! Device scratch of the row kernels, as plain pointers (see `draw_workspace`).
struct draw_scratch {
  float* chunk_max = nullptr;         //!< [rows * max_chunks]
  double* chunk_sum = nullptr;        //!< [rows * max_chunks]
  float* chunk_arg_value = nullptr;   //!< [rows * max_chunks]
  std::int32_t* chunk_arg = nullptr;  //!< [rows * max_chunks]
  double* draw_partial = nullptr;     //!< [batch * max_chunks * 3]
  std::uint32_t* counters = nullptr;  //!< [batch], zero between launches
  float* residual = nullptr;          //!< [batch * vocab]
  std::int32_t max_rows = 0;          //!< rows the per-row arrays hold
  std::int32_t max_batch = 0;         //!< sequences the per-sequence arrays hold
  std::int32_t vocab = 0;             //!< vocabulary the arrays are sized for
  std::int32_t multiprocessors = 1;   //!< of the device, for chunk planning
};

#if defined(__CUDACC__)

//! Owns the device scratch of the row kernels for up to `max_rows` rows and `max_batch`
//! sequences of a `vocab`-entry vocabulary. One workspace serves one launch at a time (kernels
//! on one stream may share it; concurrent streams need one each).
class draw_workspace {
 public:
  //! Allocates the scratch (throws `specdec::error` when cudaMalloc fails or sizes are bad).
  draw_workspace(std::int32_t vocab, std::int32_t max_rows, std::int32_t max_batch) {
    SPECDEC_CHECK(vocab > 0 && max_rows > 0 && max_batch > 0, invalid_argument,
                  "draw_workspace: vocab ", vocab, ", max_rows ", max_rows, ", max_batch ",
                  max_batch, " must be positive");
    auto const chunks = static_cast<std::size_t>(max_chunks(vocab));
    auto const rows = static_cast<std::size_t>(max_rows);
    auto const batch = static_cast<std::size_t>(max_batch);
    chunk_max_.resize(rows * chunks);
    chunk_sum_.resize(rows * chunks);
    chunk_arg_value_.resize(rows * chunks);
    chunk_arg_.resize(rows * chunks);
    draw_partial_.resize(batch * chunks * 3);
    counters_.resize(batch);
    counters_.zero();
    residual_.resize(batch * static_cast<std::size_t>(vocab));
    int device = 0, sms = 1;
    SPECDEC_CUDA_CHECK(cudaGetDevice(&device));
    SPECDEC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
    view_ = draw_scratch{chunk_max_.data(),
                         chunk_sum_.data(),
                         chunk_arg_value_.data(),
                         chunk_arg_.data(),
                         draw_partial_.data(),
                         counters_.data(),
                         residual_.data(),
                         max_rows,
                         max_batch,
                         vocab,
                         sms};
  }

  //! The scratch as plain pointers for the launchers.
  [[nodiscard]] draw_scratch const& scratch() const noexcept { return view_; }

 private:
  device_buffer<float> chunk_max_;
  device_buffer<double> chunk_sum_;
  device_buffer<float> chunk_arg_value_;
  device_buffer<std::int32_t> chunk_arg_;
  device_buffer<double> draw_partial_;
  device_buffer<std::uint32_t> counters_;
  device_buffer<float> residual_;
  draw_scratch view_;
};

#endif  // __CUDACC__

//! Rows the row-statistics kernels read: `rows` rows of `vocab` logits, `stride` floats apart.
struct row_stats_params {
  float const* rows = nullptr;   //!< [num_rows, stride] on the device
  std::int64_t stride = 0;       //!< floats between rows (>= vocab)
  std::int32_t num_rows = 0;     //!< rows
  std::int32_t vocab = 0;        //!< entries per row
  float inv_temperature = 1.0f;  //!< the host's float(1 / T); 1 for a plain softmax
  chunk_plan plan;               //!< the split (from `plan_chunks`)
  draw_scratch scratch;          //!< where the statistics go
};

//! Where the walk reads its tree and rows and writes its results. All pointers are device
//! pointers; sequence b owns rows [layout.begin(b), layout.end(b)) of every per-row array.
struct walk_params {
  ragged_layout layout;              //!< rows per sequence (= tree nodes, root first)
  std::int32_t vocab = 0;            //!< entries per row
  float const* target = nullptr;     //!< [rows, target_stride] logits or probabilities
  std::int64_t target_stride = 0;    //!< floats between target rows
  bool target_is_probs = false;      //!< rows are distributions (else logits, softmax with 1/T)
  float inv_temperature = 1.0f;      //!< logits mode: the host's float(1 / T)
  token_id const* tokens = nullptr;  //!< [rows] node tokens (node 0: the root)
  std::int32_t const* parents = nullptr;  //!< [rows] local parent of each node; null = chains
  float const* q = nullptr;               //!< [rows, q_stride] draft q rows, or null (point masses)
  std::int64_t q_stride = 0;              //!< floats between q rows
  rng_state* rng = nullptr;               //!< [batch] read, then advanced by the node count
  std::int32_t* num_accepted = nullptr;   //!< [batch] out
  std::int32_t* accepted_nodes = nullptr;  //!< [rows] out: at begin(b), local node indices
  token_id* out_tokens = nullptr;       //!< [rows] out: at begin(b), accepted tokens then the bonus
  std::int32_t* error_flags = nullptr;  //!< [batch] out (or null): `device_error` bits, OR-ed
  chunk_plan plan;                      //!< the split of the final draw over blocks
  chunk_plan stats_plan;  //!< logits mode: the split `launch_row_stats` used (count 0: `plan`)
  draw_scratch scratch;   //!< workspace (statistics from `launch_row_stats`)

  //! Chunks per row of the row statistics.
  [[nodiscard]] __host__ __device__ std::int32_t stats_chunks() const noexcept {
    return stats_plan.count > 0 ? stats_plan.count : plan.count;
  }
};

namespace detail {

#if defined(__CUDACC__)

//! exp((z - shift) * scale) as the host's `exp_shifted` (detail/rows.hpp) computes it: the
//! subtraction and the multiplication rounded on their own, then the `exp_nonpositive` of
//! detail/exp.hpp, the one definition host and device share. A NaN argument (a launcher given an
//! infinite 1/T: 0 * inf) gives NaN, which the callers' checks flag; `exp_nonpositive` itself
//! takes no NaN.
__device__ __forceinline__ float exp_shifted1(float z, float shift, float scale) noexcept {
  float const x = __fmul_rn(__fsub_rn(z, shift), scale);
  return x == x ? specdec::detail::exp_nonpositive(x) : x;
}

//! Whether a float is finite.
__device__ __forceinline__ bool is_finite(float v) noexcept {
  return v - v == 0.0f;
}

//! The current distribution of a walk: explicit probabilities, or the softmax of a logits row
//! given its maximum and the host's float(1 / total).
struct dist_row {
  float const* z = nullptr;     //!< logits (implicit) or probabilities (explicit)
  float max = 0.0f;             //!< implicit: row maximum
  float inv_t = 1.0f;           //!< implicit: 1 / T
  float inv_total = 1.0f;       //!< implicit: float(1 / sum of exp)
  bool explicit_probs = false;  //!< whether z holds probabilities

  //! The stored entry i (a logit or a probability).
  __device__ __forceinline__ float load(std::int32_t i) const noexcept { return z[i]; }
  //! The probability of a stored entry.
  __device__ __forceinline__ float from(float raw) const noexcept {
    return explicit_probs ? raw : __fmul_rn(exp_shifted1(raw, max, inv_t), inv_total);
  }
  __device__ __forceinline__ float operator()(std::int32_t i) const noexcept {
    return from(load(i));
  }
};

//! Draw modes: from p, from max(p - q, 0) (falling back to p), or from p without some tokens.
enum draw_mode : std::int32_t { draw_plain = 0, draw_residual = 1, draw_excluding = 2 };

//! max(p - q, 0), NaN-propagating, as sampling/draw.hpp's `residual_weight`.
__device__ __forceinline__ float residual_weight(float p, float q) noexcept {
  float const d = __fsub_rn(p, q);
  return d < 0.0f ? 0.0f : d;
}

//! Whether `t` is in the ascending list rej[0..n).
__device__ __forceinline__ bool in_sorted(token_id const* rej, std::int32_t n,
                                          token_id t) noexcept {
  std::int32_t lo = 0, hi = n;
  while (lo < hi) {
    std::int32_t const mid = (lo + hi) / 2;
    if (rej[mid] < t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && rej[lo] == t;
}

//! Starts asynchronous copies of z[lo, hi) into stage[0, hi - lo) (one per entry, all in flight
//! together); `stage_wait` completes them for the whole block.
__device__ __forceinline__ void stage_async(float* stage, float const* z, std::int32_t lo,
                                            std::int32_t hi) noexcept {
  for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < hi - lo;
       i += static_cast<std::int32_t>(blockDim.x))
    __pipeline_memcpy_async(stage + i, z + lo + i, sizeof(float));
  __pipeline_commit();
}
__device__ __forceinline__ void stage_wait() noexcept {
  __pipeline_wait_prior(0);
  __syncthreads();
}

//! Chunk maxima: blockIdx.x = row * chunks + chunk. +inf marks a chunk holding NaN or +inf.
template <int Unused = 0>
__global__ void __launch_bounds__(256) row_max_kernel(row_stats_params p) {
  __shared__ float scratch[32];
  __shared__ int bad;
  std::int64_t const id = blockIdx.x;
  std::int32_t const row = static_cast<std::int32_t>(id / p.plan.count);
  std::int32_t const c = static_cast<std::int32_t>(id % p.plan.count);
  std::int32_t const lo = c * p.plan.size;
  std::int32_t const hi = min(p.vocab, lo + p.plan.size);
  float const* z = p.rows + row * p.stride;
  if (threadIdx.x == 0) bad = 0;
  // The chunk goes through shared memory: every load in flight at once (a loop of loads and
  // uses is latency-bound on rows this short).
  extern __shared__ float stage[];
  stage_async(stage, z, lo, hi);
  stage_wait();
  float m = -INFINITY;
  bool local_bad = false;
  for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < hi - lo; i += 256) {
    float const v = stage[i];
    local_bad = local_bad || v != v || v == INFINITY;
    m = v > m ? v : m;
  }
  if (local_bad) bad = 1;
  m = block_max(m, scratch);
  if (threadIdx.x == 0)
    p.scratch.chunk_max[static_cast<std::int64_t>(row) * p.plan.count + c] = bad ? INFINITY : m;
}

//! Row maximum from the chunk maxima (every thread gets it). +inf: the row holds NaN or +inf.
__device__ __forceinline__ float row_max_from_chunks(float const* chunk_max, std::int32_t chunks,
                                                     float* scratch) noexcept {
  float m = -INFINITY;
  for (std::int32_t c = static_cast<std::int32_t>(threadIdx.x); c < chunks;
       c += static_cast<std::int32_t>(blockDim.x))
    m = fmaxf(m, chunk_max[c]);
  return block_max(m, scratch);
}

//! Chunk sums of exp((z - max) / T) with the host's blocking: 16 groups of 16 lanes; group g takes
//! the host blocks g, g + 16, ... of the chunk; lane j sums entries start + j + 16 s in float;
//! a block's lanes are combined in double in lane order. The tail after the last multiple of 16
//! is added entry by entry in double.
template <int Unused = 0>
__global__ void __launch_bounds__(256) row_expsum_kernel(row_stats_params p) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  std::int64_t const id = blockIdx.x;
  std::int32_t const row = static_cast<std::int32_t>(id / p.plan.count);
  std::int32_t const c = static_cast<std::int32_t>(id % p.plan.count);
  std::int64_t const base = static_cast<std::int64_t>(row) * p.plan.count;
  std::int32_t const lo = c * p.plan.size;
  std::int32_t const hi = min(p.vocab, lo + p.plan.size);
  // The chunk is copied into shared memory while the row maximum is reduced.
  extern __shared__ float stage[];
  stage_async(stage, p.rows + row * p.stride, lo, hi);
  float const m = row_max_from_chunks(p.scratch.chunk_max + base, p.plan.count, fscratch);
  stage_wait();
  if (m == INFINITY || m == -INFINITY) {  // bad row: the walk flags it if it reads it
    if (threadIdx.x == 0) p.scratch.chunk_sum[base + c] = 0.0;
    return;
  }
  std::int32_t const n16 = p.vocab - p.vocab % host_row_lanes;
  std::int32_t const lane = static_cast<std::int32_t>(threadIdx.x) & 15;
  std::int32_t const group = static_cast<std::int32_t>(threadIdx.x) >> 4;
  double total = 0.0;
  std::int32_t const end16 = min(hi, n16);
  for (std::int32_t k = 0;; ++k) {
    std::int32_t const start = lo + (group + 16 * k) * host_row_block;
    bool const active = start < end16;
    if (!__any_sync(0xffffffffu, active)) break;  // both half-warps leave together
    float acc = 0.0f;
    if (active) {
      std::int32_t const stop = min(start + host_row_block, n16);
      for (std::int32_t i = start + lane; i < stop; i += host_row_lanes)
        acc = __fadd_rn(acc, exp_shifted1(stage[i - lo], m, p.inv_temperature));
    }
    double block = 0.0;
    for (int j = 0; j < host_row_lanes; ++j)
      block += static_cast<double>(__shfl_sync(0xffffffffu, acc, j, 16));
    if (active && lane == 0) total += block;
  }
  for (std::int32_t i = max(lo, n16) + static_cast<std::int32_t>(threadIdx.x); i < hi; i += 256)
    total += static_cast<double>(exp_shifted1(stage[i - lo], m, p.inv_temperature));
  total = block_sum(total, dscratch);
  if (threadIdx.x == 0) p.scratch.chunk_sum[base + c] = total;
}

//! Shared state of one walk (in dynamic shared memory, `n` = max_rows_per_seq entries each).
struct walk_smem {
  token_id* tok;      //!< node tokens
  std::int32_t* par;  //!< parents
  std::int32_t* first_child;
  std::int32_t* next_sibling;
  float* px;           //!< p of node j's token in its parent's row
  float* qx;           //!< q of node j's token in its parent's q row
  float* rmax;         //!< row maxima (logits mode)
  float* rinv;         //!< row float(1 / total) (logits mode)
  std::int32_t* path;  //!< accepted nodes
  token_id* rej;       //!< rejected tokens (ascending)
  float* u;            //!< the uniform of Philox word offset + j (walk) for node j

  __device__ static walk_smem carve(void* base, std::int32_t n) noexcept {
    auto* w = static_cast<std::int32_t*>(base);
    walk_smem s;
    s.tok = w;
    s.par = w + n;
    s.first_child = w + 2 * n;
    s.next_sibling = w + 3 * n;
    s.px = reinterpret_cast<float*>(w + 4 * n);
    s.qx = reinterpret_cast<float*>(w + 5 * n);
    s.rmax = reinterpret_cast<float*>(w + 6 * n);
    s.rinv = reinterpret_cast<float*>(w + 7 * n);
    s.path = w + 8 * n;
    s.rej = w + 9 * n;
    s.u = reinterpret_cast<float*>(w + 10 * n);
    return s;
  }

  //! Bytes of the per-node arrays, rounded up to a multiple of 8.
  __host__ __device__ static constexpr std::size_t node_bytes(std::int32_t n) noexcept {
    return (static_cast<std::size_t>(n) * 11 * 4 + 7) / 8 * 8;
  }
  //! The chunk partials of the draw (3 doubles per chunk), after the per-node arrays.
  __device__ static double* parts(void* base, std::int32_t n) noexcept {
    return reinterpret_cast<double*>(static_cast<unsigned char*>(base) + node_bytes(n));
  }
};

//! Loads a sequence's tree into shared memory and checks it. Returns the device_error bits
//! (block-uniform). Sets first_child / next_sibling and whether any node has several children.
inline __device__ std::int32_t load_tree(walk_params const& p, std::int32_t first, std::int32_t n,
                                         walk_smem const& s, int& multi_child) {
  __shared__ int flags, multi;
  if (threadIdx.x == 0) {
    flags = 0;
    multi = 0;
  }
  __syncthreads();
  std::int32_t const nt = static_cast<std::int32_t>(blockDim.x);
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < n; j += nt) {
    token_id const t = p.tokens[first + j];
    std::int32_t const par = p.parents != nullptr ? p.parents[first + j] : j - 1;
    s.tok[j] = t;
    s.par[j] = par;
    s.first_child[j] = INT32_MAX;
    if (t < 0 || t >= p.vocab) atomicOr(&flags, token_out_of_range);
    if (j == 0 ? par != -1 : (par < 0 || par >= j)) atomicOr(&flags, bad_tree);
  }
  __syncthreads();
  if (flags != 0) return flags;
  for (std::int32_t j = 1 + static_cast<std::int32_t>(threadIdx.x); j < n; j += nt)
    atomicMin(&s.first_child[s.par[j]], j);
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < n; j += nt) {
    std::int32_t next = -1;
    if (j > 0) {
      std::int32_t const par = s.par[j];
      for (std::int32_t k = j + 1; k < n; ++k) {
        if (s.par[k] == par) {
          next = k;
          break;
        }
      }
    }
    s.next_sibling[j] = next;
    if (next >= 0) multi = 1;
  }
  __syncthreads();
  for (std::int32_t j = static_cast<std::int32_t>(threadIdx.x); j < n; j += nt)
    if (s.first_child[j] == INT32_MAX) s.first_child[j] = -1;
  __syncthreads();
  multi_child = multi;
  return 0;
}

//! Per-row maxima and float(1 / total) from the chunk statistics; then p and q of every node's
//! token in its parent's row. Row bad (NaN/Inf, no finite entry) => rmax = +inf.
inline __device__ void gather_probs(walk_params const& p, std::int32_t first, std::int32_t n,
                                    walk_smem const& s) {
  std::int32_t const lane = static_cast<std::int32_t>(threadIdx.x) & 31;
  std::int32_t const warp = static_cast<std::int32_t>(threadIdx.x) >> 5;
  std::int32_t const warps = static_cast<std::int32_t>(blockDim.x) >> 5;
  if (!p.target_is_probs) {
    for (std::int32_t r = warp; r < n; r += warps) {
      std::int32_t const chunks = p.stats_chunks();
      std::int64_t const base = static_cast<std::int64_t>(first + r) * chunks;
      float m = -INFINITY;
      double sum = 0.0;
      for (std::int32_t c = lane; c < chunks; c += 32) {
        m = fmaxf(m, p.scratch.chunk_max[base + c]);
        sum += p.scratch.chunk_sum[base + c];
      }
      m = warp_max(m);
      sum = warp_sum(sum);
      if (lane == 0) {
        bool const ok = m != INFINITY && m != -INFINITY && sum > 0.0 && sum - sum == 0.0;
        s.rmax[r] = ok ? m : INFINITY;
        s.rinv[r] = ok ? static_cast<float>(1.0 / sum) : 0.0f;
      }
    }
  }
  __syncthreads();
  for (std::int32_t j = 1 + static_cast<std::int32_t>(threadIdx.x); j < n;
       j += static_cast<std::int32_t>(blockDim.x)) {
    std::int32_t const r = s.par[j];
    token_id const t = s.tok[j];
    float const* row = p.target + static_cast<std::int64_t>(first + r) * p.target_stride;
    float px;
    if (p.target_is_probs) {
      px = row[t];
    } else {
      px = s.rmax[r] == INFINITY
               ? 0.0f
               : __fmul_rn(exp_shifted1(row[t], s.rmax[r], p.inv_temperature), s.rinv[r]);
    }
    s.px[j] = px;
    s.qx[j] = p.q != nullptr ? p.q[static_cast<std::int64_t>(first + r) * p.q_stride + t] : 0.0f;
  }
  __syncthreads();
}

//! Three block sums at once (every thread gets them): one pass through shared memory instead
//! of three. `scratch` holds >= 96 doubles. Fixed order, like `block_sum`.
__device__ __forceinline__ void block_sum3(double& a, double& b, double& c,
                                           double* scratch) noexcept {
  int const lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  int const warps = static_cast<int>((blockDim.x + 31) / 32);
  a = warp_sum(a);
  b = warp_sum(b);
  c = warp_sum(c);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
    scratch[64 + warp] = c;
  }
  __syncthreads();
  a = warp_sum(lane < warps ? scratch[lane] : 0.0);
  b = warp_sum(lane < warps ? scratch[32 + lane] : 0.0);
  c = warp_sum(lane < warps ? scratch[64 + lane] : 0.0);
}

//! Sums over [lo, hi) of the draw weights: out[0] = the mode's weights (residual, or p), out[1]
//! = p, out[2] = 1 when a non-finite p (or q in residual mode) was seen. Block-uniform result.
inline __device__ void chunk_weight_sums(dist_row const& cur, float const* q, std::int32_t mode,
                                         std::int32_t lo, std::int32_t hi, double out[3]) {
  __shared__ double dscratch[96];
  double w = 0.0, pp = 0.0;
  bool local_bad = false;
  auto const add = [&](float raw, float qi) {
    float const pi = cur.from(raw);
    local_bad = local_bad || !is_finite(pi);
    pp += static_cast<double>(pi);
    if (mode == draw_residual) {
      local_bad = local_bad || !is_finite(qi);
      w += static_cast<double>(residual_weight(pi, qi));
    }
  };
  std::int32_t const nt = static_cast<std::int32_t>(blockDim.x);
  // Eight entries (and q entries) in flight per thread before any is used.
  constexpr std::int32_t unroll = 8;
  for (std::int32_t i = lo + static_cast<std::int32_t>(threadIdx.x); i < hi; i += unroll * nt) {
    float raw[unroll], qv[unroll];
#pragma unroll
    for (std::int32_t u = 0; u < unroll; ++u) {
      bool const in = i + u * nt < hi;
      raw[u] = in ? cur.load(i + u * nt) : 0.0f;
      qv[u] = in && mode == draw_residual ? q[i + u * nt] : 0.0f;
    }
#pragma unroll
    for (std::int32_t u = 0; u < unroll; ++u)
      if (i + u * nt < hi) add(raw[u], qv[u]);
  }
  double flag = local_bad ? 1.0 : 0.0;  // summed: nonzero when any thread saw a bad entry
  block_sum3(w, pp, flag, dscratch);
  out[0] = mode == draw_residual ? w : pp;
  out[1] = pp;
  out[2] = flag != 0.0 ? 1.0 : 0.0;
}

//! The first index i in [lo, hi) with w(i) > 0 (not in rej) whose running sum, starting at
//! `base`, exceeds `target`; -1 if none. The range is read in tiles of `crossing_per_lane`
//! entries per thread, all loads of a tile in flight together: thread t of the block takes the
//! t-th run of the tile, a warp scan and the warps' sums give each thread the running sum before
//! its run, and the thread holding the crossing scans its run in index order.
//! blockDim.x is a multiple of 32. Block-uniform result.
inline constexpr std::int32_t crossing_per_lane = 8;

template <class W>
inline __device__ std::int32_t find_crossing_in(W const& w, token_id const* rej, std::int32_t nrej,
                                                std::int32_t lo, std::int32_t hi, double base,
                                                double target) {
  constexpr std::int32_t per = crossing_per_lane;
  __shared__ double warp_total[32];
  __shared__ std::int32_t found;
  std::int32_t const lane = static_cast<std::int32_t>(threadIdx.x) & 31;
  std::int32_t const warp = static_cast<std::int32_t>(threadIdx.x) >> 5;
  std::int32_t const warps = static_cast<std::int32_t>(blockDim.x) >> 5;
  std::int32_t const tile = warps * 32 * per;
  __syncthreads();  // `found` may still be read by a previous call
  if (threadIdx.x == 0) found = INT32_MAX;
  double carry = base;
  for (std::int32_t t0 = lo; t0 < hi; t0 += tile) {
    std::int32_t const l0 = t0 + (warp * 32 + lane) * per;  // this thread's run [l0, l0 + per)
    float x[per];
#pragma unroll
    for (std::int32_t j = 0; j < per; ++j) x[j] = l0 + j < hi ? w(l0 + j) : 0.0f;
#pragma unroll
    for (std::int32_t j = 0; j < per; ++j)
      if (!(x[j] > 0.0f) || (nrej != 0 && in_sorted(rej, nrej, l0 + j))) x[j] = 0.0f;
    double mine = 0.0;
#pragma unroll
    for (std::int32_t j = 0; j < per; ++j) mine += static_cast<double>(x[j]);
    double incl = mine;  // inclusive scan over the warp's runs (in index order)
    for (int o = 1; o < 32; o <<= 1) {
      double const y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    double const wsum = __shfl_sync(0xffffffffu, incl, 31);
    __syncthreads();  // warp_total may still be read by the previous tile
    if (lane == 0) warp_total[warp] = wsum;
    __syncthreads();
    double before = carry, tile_total = 0.0;
    for (std::int32_t k = 0; k < warps; ++k) {
      double const v = warp_total[k];
      if (k < warp) before += v;
      tile_total += v;
    }
    double run = before + (incl - mine);
    if (run + mine > target) {  // the crossing may lie in this thread's run
      bool hit = false;         // no early exit: x stays in registers only with constant indices
#pragma unroll
      for (std::int32_t j = 0; j < per; ++j) {
        if (!hit && x[j] > 0.0f) {
          run += static_cast<double>(x[j]);
          if (run > target) {
            atomicMin(&found, l0 + j);
            hit = true;
          }
        }
      }
    }
    __syncthreads();
    if (found != INT32_MAX) break;  // block-uniform
    carry += tile_total;
  }
  __syncthreads();
  std::int32_t const r = found;
  __syncthreads();
  return r == INT32_MAX ? -1 : r;
}

//! The last index in [0, vocab) with w(i) > 0 (not in rej), or -1. Block-uniform result.
template <class W>
inline __device__ std::int32_t last_positive(W const& w, token_id const* rej, std::int32_t nrej,
                                             std::int32_t vocab) {
  __shared__ std::int32_t found;
  if (threadIdx.x == 0) found = -1;
  __syncthreads();
  for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < vocab;
       i += static_cast<std::int32_t>(blockDim.x)) {
    if (w(i) > 0.0f && (nrej == 0 || !in_sorted(rej, nrej, i))) atomicMax(&found, i);
  }
  __syncthreads();
  std::int32_t const r = found;
  __syncthreads();
  return r;
}

//! Given per-chunk sums parts[c * 3 + k] (k = which; shared memory or a buffer the block wrote
//! itself), finds the chunk where the running sum
//! crosses `target` and the index inside it (or -1). Block-uniform.
template <class W>
inline __device__ std::int32_t find_crossing(W const& w, token_id const* rej, std::int32_t nrej,
                                             double const* parts, std::int32_t which,
                                             chunk_plan plan, std::int32_t vocab, double target) {
  __shared__ double dscratch[32];
  __shared__ std::int32_t chunk;
  __shared__ double chunk_base;
  if (threadIdx.x == 0) chunk = INT32_MAX;
  __syncthreads();
  double carry = 0.0;
  std::int32_t const nt = static_cast<std::int32_t>(blockDim.x);
  for (std::int32_t c0 = 0; c0 < plan.count; c0 += nt) {
    std::int32_t const c = c0 + static_cast<std::int32_t>(threadIdx.x);
    double const v = c < plan.count ? parts[static_cast<std::int64_t>(c) * 3 + which] : 0.0;
    double tile_total = 0.0;
    double const incl = block_inclusive_scan(v, dscratch, tile_total);
    if (c < plan.count && carry + incl > target && v > 0.0) {
      // first such chunk within the tile (and overall: earlier tiles did not cross)
      atomicMin(&chunk, c);
    }
    __syncthreads();
    if (chunk != INT32_MAX) {
      if (c == chunk) chunk_base = carry + incl - v;
      __syncthreads();
      break;
    }
    carry += tile_total;
  }
  __syncthreads();
  std::int32_t const cc = chunk;
  double const base = chunk_base;
  __syncthreads();
  if (cc == INT32_MAX) return -1;
  std::int32_t const lo = cc * plan.size;
  std::int32_t const hi = min(vocab, lo + plan.size);
  return find_crossing_in(w, rej, nrej, lo, hi, base, target);
}

//! The walk and the final draw; blockIdx.x = b * chunks + chunk. See the file comment.
template <int Unused = 0>
__global__ void __launch_bounds__(256) walk_draw_kernel(walk_params p) {
  extern __shared__ std::int32_t walk_dynamic[];
  __shared__ int multi_child;
  __shared__ int s_flags;
  __shared__ std::int32_t s_m, s_nrej, s_draw_node, s_draw_mode, s_fallback;
  __shared__ bool s_cur_work;
  __shared__ bool s_last;

  std::int32_t const chunks = p.plan.count;
  std::int32_t const b = static_cast<std::int32_t>(blockIdx.x / static_cast<unsigned>(chunks));
  std::int32_t const c = static_cast<std::int32_t>(blockIdx.x % static_cast<unsigned>(chunks));
  std::int32_t const first = p.layout.begin(b);
  std::int32_t const n = p.layout.end(b) - first;
  std::int32_t const cap = p.layout.max_rows_per_seq;
  if (n < 1 || n > cap || first < 0 || first + n > p.layout.total_rows) {
    if (c == 0 && threadIdx.x == 0 && p.error_flags != nullptr)
      atomicOr(p.error_flags + b, bad_tree);
    return;
  }
  walk_smem const s = walk_smem::carve(walk_dynamic, cap);
  rng_state const rng = p.rng[b];
  int multi = 0;
  std::int32_t flags = load_tree(p, first, n, s, multi);
  if (threadIdx.x == 0) multi_child = multi;
  __syncthreads();
  bool const single = p.q != nullptr && multi_child != 0;
  if (flags != 0) {
    if (c == 0 && threadIdx.x == 0) {
      if (p.error_flags != nullptr) atomicOr(p.error_flags + b, flags);
      p.num_accepted[b] = 0;
      p.out_tokens[first] = no_token;
    }
    return;
  }
  if (single && c != 0) return;
  // Every uniform of the walk at once, from the last threads (gather_probs keeps the first ones
  // busy), instead of one Philox block after another on the walk's critical path.
  {
    std::int32_t const nt = static_cast<std::int32_t>(blockDim.x);
    for (std::int32_t j = nt - 1 - static_cast<std::int32_t>(threadIdx.x); j < n; j += nt)
      s.u[j] = rng.uniform_at(static_cast<std::uint64_t>(j));
  }
  gather_probs(p, first, n, s);  // ends with __syncthreads
  float const u0 = s.u[0];

  // ---- The walk (every thread replays it; decisions are block-uniform). ----
  if (threadIdx.x == 0) {
    s_flags = 0;
    s_m = 0;
    s_nrej = 0;
    s_cur_work = false;
    s_fallback = -1;
  }
  __syncthreads();
  float* const work = p.scratch.residual + static_cast<std::int64_t>(b) * p.vocab;
  auto const row_of = [&](std::int32_t node) {
    dist_row d;
    d.z = p.target + static_cast<std::int64_t>(first + node) * p.target_stride;
    d.explicit_probs = p.target_is_probs;
    if (!p.target_is_probs) {
      d.max = s.rmax[node];
      d.inv_t = p.inv_temperature;
      d.inv_total = s.rinv[node];
    }
    return d;
  };
  std::int32_t node = 0;
  bool done = false;
  bool cur_work = false;
  for (std::int32_t step = 0; !done && step <= n; ++step) {
    if (!p.target_is_probs && s.rmax[node] == INFINITY) {
      if (threadIdx.x == 0) s_flags |= non_finite_logit;
      break;
    }
    std::int32_t child = s.first_child[node];
    if (child < 0) {
      if (threadIdx.x == 0) {
        s_draw_node = node;
        s_draw_mode = draw_plain;
      }
      break;
    }
    std::int32_t accepted = -1;
    if (p.q != nullptr) {
      float const* qrow = p.q + static_cast<std::int64_t>(first + node) * p.q_stride;
      for (; child >= 0; child = s.next_sibling[child]) {
        token_id const x = s.tok[child];
        float const px = cur_work ? work[x] : s.px[child];
        float const qx = s.qx[child];
        if (!(is_finite(px) && px >= 0.0f && is_finite(qx) && qx >= 0.0f)) {
          if (threadIdx.x == 0) s_flags |= no_probability_mass;
          done = true;
          break;
        }
        float const u = s.u[child];
        if (px > 0.0f && (px >= qx || __fmul_rn(u, qx) < px)) {
          accepted = child;
          break;
        }
        if (s.next_sibling[child] < 0) {
          if (threadIdx.x == 0) {
            s_draw_node = node;
            s_draw_mode = draw_residual;
          }
          done = true;
          break;
        }
        // Residual update cur := norm(max(cur - q, 0)) (single-block mode only).
        dist_row const cur = cur_work ? dist_row{work, 0.0f, 1.0f, 1.0f, true} : row_of(node);
        double sums[3];
        chunk_weight_sums(cur, qrow, draw_residual, 0, p.vocab, sums);
        if (sums[2] != 0.0) {
          if (threadIdx.x == 0) s_flags |= no_probability_mass;
          done = true;
          break;
        }
        if (sums[0] > 0.0) {
          float const scale = static_cast<float>(1.0 / sums[0]);
          for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < p.vocab;
               i += static_cast<std::int32_t>(blockDim.x))
            work[i] = __fmul_rn(residual_weight(cur(i), qrow[i]), scale);
          __syncthreads();
          cur_work = true;
        }
      }
    } else {
      float mass = 1.0f;
      std::int32_t nrej = 0;
      for (; child >= 0; child = s.next_sibling[child]) {
        token_id const x = s.tok[child];
        float const px = s.px[child];
        if (!(is_finite(px) && px >= 0.0f)) {
          if (threadIdx.x == 0) s_flags |= no_probability_mass;
          done = true;
          break;
        }
        float const u = s.u[child];
        if (px > 0.0f && (px >= mass || __fmul_rn(u, mass) < px)) {
          accepted = child;
          break;
        }
        mass = __fsub_rn(mass, px);
        // insert x into the ascending list (siblings are distinct without q rows)
        if (threadIdx.x == 0) {
          std::int32_t at = nrej;
          while (at > 0 && s.rej[at - 1] > x) {
            s.rej[at] = s.rej[at - 1];
            --at;
          }
          s.rej[at] = x;
        }
        ++nrej;
      }
      if (!done && accepted < 0) {
        if (threadIdx.x == 0) {
          s_draw_node = node;
          s_draw_mode = draw_excluding;
          s_nrej = nrej;
          // Fallback (rounding): the last child with p > 0.
          std::int32_t fb = -1;
          for (std::int32_t ch = s.first_child[node]; ch >= 0; ch = s.next_sibling[ch])
            if (s.px[ch] > 0.0f) fb = s.tok[ch];
          s_fallback = fb;
        }
        done = true;
      }
    }
    if (done) break;
    if (threadIdx.x == 0) s.path[s_m] = accepted;
    if (threadIdx.x == 0) ++s_m;
    __syncthreads();
    node = accepted;
    cur_work = false;
  }
  if (threadIdx.x == 0) s_cur_work = cur_work;
  __syncthreads();
  flags = s_flags;
  if (flags != 0) {
    if (c == 0 && threadIdx.x == 0) {
      if (p.error_flags != nullptr) atomicOr(p.error_flags + b, flags);
      p.num_accepted[b] = 0;
      p.out_tokens[first] = no_token;
    }
    return;
  }

  // ---- The draw. ----
  std::int32_t const dnode = s_draw_node;
  std::int32_t const mode = s_draw_mode;
  std::int32_t const nrej = mode == draw_excluding ? s_nrej : 0;
  dist_row const cur = s_cur_work ? dist_row{work, 0.0f, 1.0f, 1.0f, true} : row_of(dnode);
  float const* qrow =
      p.q != nullptr ? p.q + static_cast<std::int64_t>(first + dnode) * p.q_stride : nullptr;
  double* const parts = p.scratch.draw_partial + static_cast<std::int64_t>(b) * chunks * 3;
  if (single) {
    for (std::int32_t cc = 0; cc < chunks; ++cc) {
      double sums[3];
      chunk_weight_sums(cur, qrow, mode, cc * p.plan.size, min(p.vocab, (cc + 1) * p.plan.size),
                        sums);
      if (threadIdx.x == 0)
        for (int k = 0; k < 3; ++k) parts[cc * 3 + k] = sums[k];
    }
    __syncthreads();
  } else {
    double sums[3];
    chunk_weight_sums(cur, qrow, mode, c * p.plan.size, min(p.vocab, (c + 1) * p.plan.size), sums);
    if (threadIdx.x == 0) {
      for (int k = 0; k < 3; ++k) parts[c * 3 + k] = sums[k];
      __threadfence();
      unsigned const prev = atomicAdd(p.scratch.counters + b, 1u);
      s_last = prev == static_cast<unsigned>(chunks - 1);
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    if (threadIdx.x == 0) p.scratch.counters[b] = 0;
  }

  // The partials into shared memory (read once), then the totals: a block reduction over them
  // (fixed order: the same in every block).
  double* const sp = walk_smem::parts(walk_dynamic, cap);
  for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < chunks * 3;
       i += static_cast<std::int32_t>(blockDim.x))
    sp[i] = __ldcg(parts + i);
  __syncthreads();
  double total_w = 0.0, total_p = 0.0, bad_count = 0.0;
  {
    __shared__ double tscratch[96];
    for (std::int32_t cc = static_cast<std::int32_t>(threadIdx.x); cc < chunks;
         cc += static_cast<std::int32_t>(blockDim.x)) {
      total_w += sp[cc * 3 + 0];
      total_p += sp[cc * 3 + 1];
      bad_count += sp[cc * 3 + 2];
    }
    block_sum3(total_w, total_p, bad_count, tscratch);
  }
  bool const bad = bad_count != 0.0;
  std::int32_t token = -1;
  std::int32_t f = 0;
  auto const draw_p = [&]() -> std::int32_t {
    if (!(total_p > 0.0 && total_p - total_p == 0.0)) return -2;
    double const target = static_cast<double>(u0) * total_p;
    std::int32_t t = find_crossing(cur, nullptr, 0, sp, 1, p.plan, p.vocab, target);
    if (t < 0) t = last_positive(cur, nullptr, 0, p.vocab);
    return t < 0 ? -2 : t;
  };
  if (bad) {
    f = no_probability_mass;
  } else if (mode == draw_plain) {
    token = draw_p();
  } else if (mode == draw_residual) {
    if (total_w > 0.0) {
      auto const w = [&](std::int32_t i) { return residual_weight(cur(i), qrow[i]); };
      double const target = static_cast<double>(u0) * total_w;
      token = find_crossing(w, nullptr, 0, sp, 0, p.plan, p.vocab, target);
      if (token < 0) token = draw_p();
    } else {
      token = draw_p();
    }
  } else {  // excluding
    double total = total_p;
    for (std::int32_t k = 0; k < nrej; ++k) {
      float const v = cur(s.rej[k]);
      if (v > 0.0f) total -= static_cast<double>(v);
    }
    if (total > 0.0) {
      // Per-chunk sums without the rejected tokens (the shared copy, by thread 0).
      __syncthreads();
      if (threadIdx.x == 0) {
        for (std::int32_t k = 0; k < nrej; ++k) {
          float const v = cur(s.rej[k]);
          if (v > 0.0f) sp[(s.rej[k] / p.plan.size) * 3 + 1] -= static_cast<double>(v);
        }
      }
      __syncthreads();
      double const target = static_cast<double>(u0) * total;
      token = find_crossing(cur, s.rej, nrej, sp, 1, p.plan, p.vocab, target);
      if (token < 0) token = s_fallback;
    } else {
      token = s_fallback;
    }
    if (token < 0) token = -2;
  }
  if (token == -2) f = no_probability_mass;
  if (threadIdx.x == 0) {
    if (f != 0) {
      if (p.error_flags != nullptr) atomicOr(p.error_flags + b, f);
      p.num_accepted[b] = 0;
      p.out_tokens[first] = no_token;
    } else {
      std::int32_t const m = s_m;
      p.num_accepted[b] = m;
      for (std::int32_t i = 0; i < m; ++i) {
        p.accepted_nodes[first + i] = s.path[i];
        p.out_tokens[first + i] = s.tok[s.path[i]];
      }
      p.out_tokens[first + m] = token;
      rng_state advanced = rng;
      advanced.skip(static_cast<std::uint64_t>(n));
      p.rng[b] = advanced;
    }
  }
}

//! Greedy: chunk argmax of every row of the sequence, then (last block) the walk.
//! blockIdx.x = b * chunks + chunk.
template <int Unused = 0>
__global__ void __launch_bounds__(256) greedy_walk_kernel(walk_params p) {
  extern __shared__ std::int32_t walk_dynamic[];
  __shared__ arg_max_pair ascratch[32];
  __shared__ int bad;
  __shared__ bool s_last;
  std::int32_t const chunks = p.plan.count;
  std::int32_t const b = static_cast<std::int32_t>(blockIdx.x / static_cast<unsigned>(chunks));
  std::int32_t const c = static_cast<std::int32_t>(blockIdx.x % static_cast<unsigned>(chunks));
  std::int32_t const first = p.layout.begin(b);
  std::int32_t const n = p.layout.end(b) - first;
  std::int32_t const cap = p.layout.max_rows_per_seq;
  if (n < 1 || n > cap || first < 0 || first + n > p.layout.total_rows) {
    if (c == 0 && threadIdx.x == 0 && p.error_flags != nullptr)
      atomicOr(p.error_flags + b, bad_tree);
    return;
  }
  std::int32_t const lo = c * p.plan.size, hi = min(p.vocab, lo + p.plan.size);
  for (std::int32_t r = 0; r < n; ++r) {
    float const* z = p.target + static_cast<std::int64_t>(first + r) * p.target_stride;
    if (threadIdx.x == 0) bad = 0;
    arg_max_pair best{-INFINITY, INT32_MAX};
    bool local_bad = false;
    for (std::int32_t i = lo + static_cast<std::int32_t>(threadIdx.x); i < hi; i += 256) {
      float const v = z[i];
      local_bad = local_bad || v != v || (!p.target_is_probs && v == INFINITY);
      if (v > best.value || (v == best.value && i < best.index)) best = arg_max_pair{v, i};
    }
    __syncthreads();
    if (local_bad) bad = 1;
    best = block_argmax(best, ascratch);
    if (threadIdx.x == 0) {
      std::int64_t const at = static_cast<std::int64_t>(first + r) * chunks + c;
      p.scratch.chunk_arg_value[at] = best.value;
      p.scratch.chunk_arg[at] = bad ? -2 : best.index;
    }
  }
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned const prev = atomicAdd(p.scratch.counters + b, 1u);
    s_last = prev == static_cast<unsigned>(chunks - 1);
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (threadIdx.x == 0) p.scratch.counters[b] = 0;

  walk_smem const s = walk_smem::carve(walk_dynamic, cap);
  int multi = 0;
  std::int32_t flags = load_tree(p, first, n, s, multi);
  if (flags == 0) {
    // Row argmax (first maximum) into first_child's slot of rmax / path: reuse px as value and
    // path as index.
    std::int32_t const lane = static_cast<std::int32_t>(threadIdx.x) & 31;
    std::int32_t const warp = static_cast<std::int32_t>(threadIdx.x) >> 5;
    for (std::int32_t r = warp; r < n; r += 8) {
      std::int64_t const base = static_cast<std::int64_t>(first + r) * chunks;
      arg_max_pair best{-INFINITY, INT32_MAX};
      bool rbad = false;
      for (std::int32_t cc = lane; cc < chunks; cc += 32) {
        std::int32_t const idx = __ldcg(p.scratch.chunk_arg + base + cc);
        rbad = rbad || idx == -2;
        arg_max_pair const cand{__ldcg(p.scratch.chunk_arg_value + base + cc), idx};
        if (idx >= 0) best = better(best, cand);
      }
      best = warp_argmax(best);
      rbad = __any_sync(0xffffffffu, rbad);
      if (lane == 0) {
        bool const ok = !rbad && best.index != INT32_MAX &&
                        (p.target_is_probs ? best.value > 0.0f : best.value != -INFINITY);
        s.path[r] = ok ? best.index : -1;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      std::int32_t node = 0, m = 0;
      std::int32_t f = 0;
      token_id g = -1;
      for (std::int32_t step = 0; step <= n; ++step) {
        g = s.path[node];
        if (g < 0) {
          f = p.target_is_probs ? no_probability_mass : non_finite_logit;
          break;
        }
        std::int32_t child = s.first_child[node];
        while (child >= 0 && s.tok[child] != g) child = s.next_sibling[child];
        if (child < 0) break;
        s.rej[m++] = child;  // accepted path (rej reused)
        node = child;
      }
      if (f != 0) {
        if (p.error_flags != nullptr) atomicOr(p.error_flags + b, f);
        p.num_accepted[b] = 0;
        p.out_tokens[first] = no_token;
      } else {
        p.num_accepted[b] = m;
        for (std::int32_t i = 0; i < m; ++i) {
          p.accepted_nodes[first + i] = s.rej[i];
          p.out_tokens[first + i] = s.tok[s.rej[i]];
        }
        p.out_tokens[first + m] = g;
        rng_state advanced = p.rng[b];
        advanced.skip(static_cast<std::uint64_t>(n));
        p.rng[b] = advanced;
      }
    }
  } else if (threadIdx.x == 0) {
    if (p.error_flags != nullptr) atomicOr(p.error_flags + b, flags);
    p.num_accepted[b] = 0;
    p.out_tokens[first] = no_token;
  }
}

#endif  // __CUDACC__

}  // namespace detail

#if defined(__CUDACC__)

//! Computes the chunk maxima and exp sums of `p.num_rows` logits rows (two kernels).
inline launch_status launch_row_stats(row_stats_params const& p, cudaStream_t stream) noexcept {
  if (p.num_rows == 0) return {};
  if (p.rows == nullptr || p.num_rows < 0 || p.vocab <= 0 || p.stride < p.vocab)
    return fail(status::invalid_argument, "launch_row_stats: rows, vocab or stride");
  if (p.plan.count <= 0 || p.plan.size <= 0 || p.plan.size % host_row_block != 0 ||
      p.plan.size > max_blocks_per_chunk * host_row_block || p.plan.count > max_chunks(p.vocab) ||
      static_cast<std::int64_t>(p.plan.count) * p.plan.size < p.vocab)
    return fail(status::invalid_argument, "launch_row_stats: chunk plan");
  if (p.scratch.chunk_max == nullptr || p.num_rows > p.scratch.max_rows ||
      p.vocab > p.scratch.vocab)
    return fail(status::out_of_range, "launch_row_stats: workspace too small");
  if (!(p.inv_temperature > 0.0f))
    return fail(status::invalid_argument, "launch_row_stats: inverse temperature");
  auto const blocks = static_cast<unsigned>(static_cast<std::int64_t>(p.num_rows) * p.plan.count);
  auto const stage = static_cast<std::size_t>(p.plan.size) * sizeof(float);
  detail::row_max_kernel<<<blocks, 256, stage, stream>>>(p);
  detail::row_expsum_kernel<<<blocks, 256, stage, stream>>>(p);
  return last_launch_status("launch_row_stats");
}

namespace detail {

//! Shared checks of the walk launchers.
inline launch_status check_walk(walk_params const& p, char const* what) noexcept {
  if (!p.layout.valid()) return fail(status::invalid_argument, what);
  if (p.layout.batch == 0) return {};
  if (p.vocab <= 0 || p.target == nullptr || p.target_stride < p.vocab || p.tokens == nullptr ||
      p.rng == nullptr || p.num_accepted == nullptr || p.accepted_nodes == nullptr ||
      p.out_tokens == nullptr)
    return fail(status::invalid_argument, what);
  if (p.q != nullptr && p.q_stride < p.vocab) return fail(status::invalid_argument, what);
  if (p.layout.max_rows_per_seq <= 0 ||
      static_cast<std::size_t>(p.layout.max_rows_per_seq) > max_tree_nodes)
    return fail(status::out_of_range, what);
  auto const bad_plan = [&](chunk_plan const& c) {
    return c.count <= 0 || c.count > max_chunks(p.vocab) || c.size <= 0 ||
           c.size % host_row_block != 0 || static_cast<std::int64_t>(c.count) * c.size < p.vocab;
  };
  if (bad_plan(p.plan) || (p.stats_plan.count != 0 && bad_plan(p.stats_plan)))
    return fail(status::invalid_argument, what);
  if (p.scratch.counters == nullptr || p.layout.batch > p.scratch.max_batch ||
      p.layout.total_rows > p.scratch.max_rows || p.vocab > p.scratch.vocab)
    return fail(status::out_of_range, what);
  return {};
}

//! Dynamic shared memory of the walk kernels, raising the kernel's limit when above 48 KB.
template <class Kernel>
inline launch_status walk_smem_bytes(Kernel kernel, std::int32_t cap, std::int32_t chunks,
                                     std::size_t& bytes) noexcept {
  bytes = walk_smem::node_bytes(cap) + static_cast<std::size_t>(chunks) * 3 * sizeof(double);
  if (bytes > 48 * 1024) {
    cudaError_t const e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(bytes));
    if (e != cudaSuccess) return launch_status{status::cuda_error, e, "walk shared memory"};
  }
  return {};
}

}  // namespace detail

//! The sampling walk and final draw (see the file comment and verify/detail/walk.hpp's
//! `sampling_walk`). In logits mode, `launch_row_stats` must have run with the same plan and
//! scratch. error_flags, when given, must be zeroed by the caller.
inline launch_status launch_walk_draw(walk_params const& p, cudaStream_t stream) noexcept {
  launch_status st = detail::check_walk(p, "launch_walk_draw: parameters");
  if (!st.ok() || p.layout.batch == 0) return st;
  if (!p.target_is_probs && !(p.inv_temperature > 0.0f))
    return fail(status::invalid_argument, "launch_walk_draw: inverse temperature");
  std::size_t smem = 0;
  st = detail::walk_smem_bytes(detail::walk_draw_kernel<0>, p.layout.max_rows_per_seq, p.plan.count,
                               smem);
  if (!st.ok()) return st;
  auto const blocks =
      static_cast<unsigned>(static_cast<std::int64_t>(p.layout.batch) * p.plan.count);
  detail::walk_draw_kernel<<<blocks, 256, smem, stream>>>(p);
  return last_launch_status("launch_walk_draw");
}

//! Greedy verification walk (rows are logits, or probabilities when target_is_probs). One
//! kernel. error_flags, when given, must be zeroed by the caller.
inline launch_status launch_greedy_walk(walk_params const& p, cudaStream_t stream) noexcept {
  launch_status st = detail::check_walk(p, "launch_greedy_walk: parameters");
  if (!st.ok() || p.layout.batch == 0) return st;
  std::size_t smem = 0;
  st = detail::walk_smem_bytes(detail::greedy_walk_kernel<0>, p.layout.max_rows_per_seq, 0, smem);
  if (!st.ok()) return st;
  auto const blocks =
      static_cast<unsigned>(static_cast<std::int64_t>(p.layout.batch) * p.plan.count);
  detail::greedy_walk_kernel<<<blocks, 256, smem, stream>>>(p);
  return last_launch_status("launch_greedy_walk");
}

#endif  // __CUDACC__

}  // namespace specdec::cuda
