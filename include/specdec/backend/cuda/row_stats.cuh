#pragma once
//! \file
//! Row statistics of logits rows over a vocabulary split into chunks of several thread blocks, and
//! the scratch every row kernel shares.
//!
//! - The softmax arithmetic of detail/rows.hpp, operation for operation, with the one
//!   `exp_nonpositive` of detail/exp.hpp that host and device share (rounded multiplies and adds,
//!   never contracted into fused multiply-adds), so that a probability computed here is the float
//!   the host computes (`detail::exp_shifted1`).
//! - Chunk plans (`plan_chunks`): how a row is cut into chunks of multiples of the host's exp
//!   block, and the workspace of the row kernels (`draw_workspace`, `draw_scratch`).
//! - `launch_row_stats`: per (row, chunk) the maximum, and the sum of exp((z - max) * 1/T) with
//!   the host's blocking (16 float lanes over blocks of 512, combined in double), so the
//!   normaliser differs from the host's only by the order of double additions. The walk
//!   (walk.cuh) and the softmax (softmax.cuh) read them.
//!
//! The kernels are templates (`template <int Unused = 0>`): common.cuh says why.

#include <cuda_runtime.h>
#if defined(__CUDACC__)
#include <cuda_pipeline.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/core/error.hpp"
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

namespace detail {

#if defined(__CUDACC__)

//! exp((z - shift) * scale) as the host's `exp_shifted` (detail/rows.hpp) computes it: the
//! subtraction and the multiplication rounded on their own, then the `exp_nonpositive` of
//! detail/exp.hpp, the one definition host and device share. A NaN argument (a launcher given an
//! infinite 1/T: 0 * inf) gives NaN, which the callers' checks flag.
__device__ __forceinline__ float exp_shifted1(float z, float shift, float scale) noexcept {
  return specdec::detail::exp_nonpositive(__fmul_rn(__fsub_rn(z, shift), scale));
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

#endif  // __CUDACC__

}  // namespace specdec::cuda
