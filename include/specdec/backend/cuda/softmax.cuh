#pragma once
//! \file
//! The plain softmax of rows on the device (`launch_softmax`), as `specdec::softmax`
//! (sampling/softmax.hpp) computes it: the row statistics of row_stats.cuh, then one pass that
//! scales exp((z - max) * 1/T) by the host's float(1 / total), the vocabulary of a row split over
//! several blocks.
//!
//! The kernels are templates (`template <int Unused = 0>`): common.cuh says why.

#include <cuda_runtime.h>

#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/row_stats.cuh"

namespace specdec::cuda {
namespace detail {

#if defined(__CUDACC__)

//! Softmax rows: out = exp(z - max) * float(1 / total), from the row statistics.
template <int Unused = 0>
__global__ void __launch_bounds__(256)
    softmax_scale_kernel(row_stats_params p, float* probs, std::int64_t probs_stride,
                         std::int32_t* row_flags) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  std::int64_t const id = blockIdx.x;
  std::int32_t const row = static_cast<std::int32_t>(id / p.plan.count);
  std::int32_t const c = static_cast<std::int32_t>(id % p.plan.count);
  std::int64_t const base = static_cast<std::int64_t>(row) * p.plan.count;
  float const m = row_max_from_chunks(p.scratch.chunk_max + base, p.plan.count, fscratch);
  double s = 0.0;
  for (std::int32_t k = static_cast<std::int32_t>(threadIdx.x); k < p.plan.count; k += 256)
    s += p.scratch.chunk_sum[base + k];
  s = block_sum(s, dscratch);
  float const* z = p.rows + row * p.stride;
  float* out = probs + row * probs_stride;
  std::int32_t const lo = c * p.plan.size, hi = min(p.vocab, lo + p.plan.size);
  if (m == INFINITY || m == -INFINITY || !(s > 0.0)) {
    if (threadIdx.x == 0 && c == 0 && row_flags != nullptr) row_flags[row] |= non_finite_logit;
    return;
  }
  float const inv = static_cast<float>(1.0 / s);
  for (std::int32_t i = lo + static_cast<std::int32_t>(threadIdx.x); i < hi; i += 256)
    out[i] = __fmul_rn(exp_shifted1(z[i], m, p.inv_temperature), inv);
}

#endif  // __CUDACC__

}  // namespace detail

#if defined(__CUDACC__)

//! Softmax of `stats.num_rows` rows into `probs` ([rows, probs_stride]) as `specdec::softmax`
//! computes it (with 1/T = stats.inv_temperature; 1 for the plain softmax), the vocabulary split
//! as `stats.plan` says. row_flags (or null), zeroed by the caller, gets `non_finite_logit` for
//! rows with NaN / +inf or no finite entry.
inline launch_status launch_softmax(row_stats_params const& stats, float* probs,
                                    std::int64_t probs_stride, std::int32_t* row_flags,
                                    cudaStream_t stream) noexcept {
  if (stats.num_rows == 0) return {};
  if (probs == nullptr || probs_stride < stats.vocab)
    return fail(status::invalid_argument, "launch_softmax: probs");
  if (probs != stats.rows && probs < stats.rows + stats.num_rows * stats.stride &&
      stats.rows < probs + stats.num_rows * probs_stride)
    return fail(status::invalid_argument, "launch_softmax: rows and probs overlap");
  launch_status const st = launch_row_stats(stats, stream);
  if (!st.ok()) return st;
  auto const blocks =
      static_cast<unsigned>(static_cast<std::int64_t>(stats.num_rows) * stats.plan.count);
  detail::softmax_scale_kernel<<<blocks, 256, 0, stream>>>(stats, probs, probs_stride, row_flags);
  return last_launch_status("launch_softmax");
}

#endif  // __CUDACC__

}  // namespace specdec::cuda
