#pragma once
//! \file
//! Chain verification from logits in one launch (`launch_verify_chain`): the walk of
//! walk.cuh for chains (no parents) under a plain temperature policy, with the row statistics, the
//! walk and the final draw in one kernel instead of three. `launch_verify` runs it whenever it
//! applies.
//!
//! A sequence's rows are shared by a group of blocks (pivot_sampling.cuh's `row_group`: a cluster
//! of up to 8 blocks on capability 9.0 and above, one block elsewhere), each block taking the same
//! chunk of every row; the blocks combine their figures through each other's shared memory:
//!
//! 1. the maximum of each row;
//! 2. each row's sum of exp((z - max) / T) (in double: the host sums float lanes, so the
//!    normaliser differs in its last float bits at most; a NaN or +inf makes it NaN), and the
//!    logit of each node's token in its parent's row (read by the block that holds it);
//! 3. the walk, in every block (the same decisions): p = exp((z - max) / T) * float(1 / sum) as
//!    the host computes it, accept iff p > 0 and (p >= q or u q < p) with q rows, or u < p for a
//!    point mass (u = Philox word offset + j for node j);
//! 4. the draw from the row of the last accepted node: max(p - q, 0) after a rejection with q
//!    rows (p when that has no mass), p without the rejected token after a rejected point mass,
//!    p when every node was accepted; u = word offset + 0, the block holding the crossing finds
//!    the token. The generator advances by the chain's length.
//!
//! Errors as walk.cuh: a token outside the vocabulary, a NaN / +inf logit, a distribution without
//! mass flag the sequence, whose outputs then carry no result and whose generator stays.
//!
//! The kernels are templates (`template <int Unused = 0>`): common.cuh says why.

#include <cuda_runtime.h>

#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/draw.cuh"
#include "specdec/backend/cuda/pivot_sampling.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/backend/cuda/verify_inputs.cuh"
#include "specdec/core/philox.hpp"

namespace specdec::cuda {

//! Most rows (nodes) of a chain `launch_verify_chain` takes (a draft of up to 14 tokens).
inline constexpr std::int32_t chain_max_rows = 15;

#if defined(__CUDACC__)

//! Whether `launch_verify_chain` applies: chains (no parents) of at most `chain_max_rows` rows
//! of logits (not probabilities), under a policy that samples at a temperature with nothing
//! else (no truncation, no logit bias or penalties).
[[nodiscard]] inline bool chain_verify_applies(verify_inputs const& in,
                                               device_policy const& policy) noexcept {
  return in.parents == nullptr && !in.target_is_probs && !policy.greedy && !policy.processing() &&
         !policy.truncation() && in.layout.max_rows_per_seq >= 1 &&
         in.layout.max_rows_per_seq <= chain_max_rows;
}

namespace detail {

//! One group of blocks per sequence (see the file comment).
template <int Unused = 0>
__global__ void __launch_bounds__(pivot_threads)
    chain_verify_kernel(verify_inputs in, float inv_t, pivot_plan plan) {
  constexpr int R = chain_max_rows;
  __shared__ pivot_shared s;
  __shared__ float wmax[pivot_threads / 32][R];
  int turn = 0;
  int const tid = static_cast<int>(threadIdx.x);
  int const lane = tid & 31, warp = tid >> 5;
  std::int32_t const b = static_cast<std::int32_t>(blockIdx.x) / plan.group;
  int const rank = row_group::rank();
  std::int32_t const first = in.layout.begin(b);
  std::int32_t const n = in.layout.end(b) - first;
  bool const shape_ok = n >= 1 && n <= R && first >= 0 && first + n <= in.layout.total_rows;
  std::int32_t const rows = shape_ok ? n : 0;
  std::int32_t const begin = rank * plan.chunk;
  std::int32_t const end = min(in.vocab, begin + plan.chunk);
  auto const row = [&](std::int32_t r) {
    return in.target + static_cast<std::int64_t>(first + r) * in.target_stride;
  };

  // 1. Row maxima.
  {
    float mx[R];
#pragma unroll
    for (int r = 0; r < R; ++r) mx[r] = -INFINITY;
    for (std::int32_t i = begin + tid; i < end; i += pivot_threads) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < rows) mx[r] = fmaxf(mx[r], row(r)[i]);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float const m = warp_max(mx[r]);
      if (lane == 0) wmax[warp][r] = m;
    }
    __syncthreads();
    double v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float m = -INFINITY;
      if (tid == r)
        for (int w = 0; w < pivot_threads / 32; ++w) m = fmaxf(m, wmax[w][r]);
      v[r] = tid == r ? static_cast<double>(m) : 0.0;  // one contributor per row
    }
    publish_sums(v, s, turn);
  }
  float rmax[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float m = -INFINITY;
    for (int g = 0; g < row_group::size(); ++g) m = fmaxf(m, static_cast<float>(s.all[g][r]));
    rmax[r] = m;
  }

  // 2. Sums of exp (a NaN or +inf logit, or a row without a finite one, makes its row's total
  //    NaN or 0: the row is bad), and the logits of the nodes' tokens.
  std::int32_t flags = shape_ok ? 0 : bad_tree;
  {
    double v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = 0.0;
    for (std::int32_t i = begin + tid; i < end; i += pivot_threads) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (r < rows) v[r] += static_cast<double>(exp_shifted1(row(r)[i], rmax[r], inv_t));
    }
    publish_sums(v, s, turn);
  }
  float rinv[R];
  bool row_ok[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    double const total = group_total(s, r);
    row_ok[r] = r < rows && rmax[r] != -INFINITY && rmax[r] != INFINITY && total > 0.0 &&
                total - total == 0.0;
    rinv[r] = row_ok[r] ? static_cast<float>(1.0 / total) : 0.0f;
  }
  {
    double v[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      v[j] = 0.0;
      if (j >= 1 && j < rows && tid == 0) {
        token_id const x = in.tokens[first + j];
        if (x >= begin && x < end) v[j] = static_cast<double>(row(j - 1)[x]);
      }
    }
    publish_sums(v, s, turn);
  }
  for (std::int32_t j = 0; j < rows; ++j) {
    token_id const x = in.tokens[first + j];
    if (x < 0 || x >= in.vocab) flags |= token_out_of_range;
  }

  // 3. The walk (every thread, the same decisions); a bad row stops it where the walk reads it.
  philox const rng = in.rng[b];
  std::int32_t m = 0;
  std::int32_t mode = draw_plain;
  float rejected_p = 0.0f;  // p of the rejected point mass (the host's fallback token)
  if (flags == 0) {
    for (std::int32_t j = 1; j < rows; ++j) {
      if (!row_ok[j - 1]) {
        flags |= non_finite_logit;
        break;
      }
      token_id const x = in.tokens[first + j];
      // The token's logit, from the block that holds it (the others published 0).
      auto const zx = static_cast<float>(group_total(s, j));
      float const px = __fmul_rn(exp_shifted1(zx, rmax[j - 1], inv_t), rinv[j - 1]);
      float const u = rng.uniform_at(static_cast<std::uint64_t>(j));
      bool accept = false;
      if (in.q != nullptr) {
        float const qx = in.q[static_cast<std::int64_t>(first + j - 1) * in.q_stride + x];
        if (!(is_finite(px) && px >= 0.0f && is_finite(qx) && qx >= 0.0f)) {
          flags |= no_probability_mass;
          break;
        }
        accept = px > 0.0f && (px >= qx || __fmul_rn(u, qx) < px);
        if (!accept) mode = draw_residual;
      } else {
        if (!(is_finite(px) && px >= 0.0f)) {
          flags |= no_probability_mass;
          break;
        }
        accept = px > 0.0f && (px >= 1.0f || u < px);  // a point mass of the whole mass 1
        if (!accept) {
          mode = draw_excluding;
          rejected_p = px;
        }
      }
      if (!accept) break;
      m = j;
    }
  }

  // 4. The draw from row m.
  if (flags == 0 && !row_ok[m]) flags |= non_finite_logit;
  dist_row cur;
  cur.z = rows > 0 ? row(m) : in.target;
  cur.max = rmax[m < R ? m : 0];
  cur.inv_t = inv_t;
  cur.inv_total = rinv[m < R ? m : 0];
  float const* qrow =
      in.q != nullptr ? in.q + static_cast<std::int64_t>(first + m) * in.q_stride : nullptr;
  token_id const rejected = mode == draw_excluding ? in.tokens[first + m + 1] : -1;
  auto const weight = [&](std::int32_t i) -> float {
    float const p = cur(i);
    if (mode == draw_residual) return residual_weight(p, qrow[i]);
    return i == rejected ? 0.0f : p;
  };
  {
    double v[3] = {0.0, 0.0, 0.0};
    bool bad = false;
    if (flags == 0) {
      for (std::int32_t i = begin + tid; i < end; i += pivot_threads) {
        float const p = cur(i);
        float const w = weight(i);
        bad = bad || !is_finite(p) || !is_finite(w);
        v[0] += static_cast<double>(w);
        v[1] += static_cast<double>(p);
      }
    }
    v[2] = bad ? 1.0 : 0.0;
    publish_sums(v, s, turn);
  }
  double const total_w = group_total(s, 0), total_p = group_total(s, 1);
  if (flags == 0 && group_total(s, 2) != 0.0) flags |= no_probability_mass;
  // A residual without mass: draw from p (as the host).
  bool const use_p = mode == draw_residual && !(total_w > 0.0);
  double const total = use_p ? total_p : total_w;
  // After a rejected point mass with nothing else left, the host emits the rejected token itself.
  bool const only_rejected = mode == draw_excluding && !(total > 0.0) && rejected_p > 0.0f;
  if (flags == 0 && !only_rejected && !(total > 0.0 && total - total == 0.0))
    flags |= no_probability_mass;
  // Everything so far is the same in every block of the group.
  bool const decided = flags == 0;
  std::int32_t token = -1;
  int owner = 0;
  if (decided && only_rejected) {
    token = rejected;
  } else if (decided) {
    double const target = static_cast<double>(rng.uniform_at(0)) * total;
    int const k = use_p ? 1 : 0;
    double base = 0.0;
    int last = -1;
    owner = -1;
    for (int g = 0; g < row_group::size(); ++g) {
      double const here = s.all[g][k];
      if (here > 0.0) last = g;
      if (owner < 0 && here > 0.0 && base + here > target) owner = g;
      if (owner < 0) base += here;
    }
    bool const fallback = owner < 0;  // rounding left the target unreached
    if (fallback) owner = last;       // total > 0: some block has weight
    if (rank == owner) {
      auto const w = [&](std::int32_t i) { return use_p ? cur(i) : weight(i); };
      token = fallback ? -1 : find_crossing_in(w, nullptr, 0, begin, end, base, target);
      if (token < 0) {
        __shared__ std::int32_t last_index;
        if (tid == 0) last_index = -1;
        __syncthreads();
        for (std::int32_t i = begin + tid; i < end; i += pivot_threads)
          if (w(i) > 0.0f) atomicMax(&last_index, i);
        __syncthreads();
        token = last_index;
      }
      if (token < 0 && mode == draw_excluding && rejected_p > 0.0f) token = rejected;
    }
  }
  // The results, by one thread: block 0 when the sequence is flagged before the draw, else the
  // block that drew.
  if (tid == 0 && rank == owner) {
    if (!decided || token < 0) {
      if (in.error_flags != nullptr)
        atomicOr(in.error_flags + b,
                 decided ? static_cast<std::int32_t>(no_probability_mass) : flags);
      in.num_accepted[b] = 0;
      if (shape_ok) in.out_tokens[first] = no_token;
    } else {
      in.num_accepted[b] = m;
      for (std::int32_t i = 0; i < m; ++i) {
        in.accepted_nodes[first + i] = i + 1;
        in.out_tokens[first + i] = in.tokens[first + i + 1];
      }
      in.out_tokens[first + m] = token;
      philox advanced = rng;
      advanced.skip(static_cast<std::uint64_t>(rows));
      in.rng[b] = advanced;
    }
  }
  row_group::sync();  // no block leaves while the group may read its shared memory
}

}  // namespace detail

//! Chain verification from logits in one launch (see the file comment); refuses (invalid_argument)
//! inputs it does not apply to (`chain_verify_applies`). error_flags, when given, must be zeroed
//! by the caller.
inline launch_status launch_verify_chain(verify_inputs const& in, device_policy const& policy,
                                         cudaStream_t stream) noexcept {
  constexpr char const* what = "launch_verify_chain: parameters";
  if (!in.layout.valid()) return fail(status::invalid_argument, what);
  if (in.layout.batch == 0) return {};
  if (!chain_verify_applies(in, policy) || in.vocab <= 0 || in.target == nullptr ||
      in.target_stride < in.vocab || in.tokens == nullptr || in.rng == nullptr ||
      in.num_accepted == nullptr || in.accepted_nodes == nullptr || in.out_tokens == nullptr ||
      (in.q != nullptr && in.q_stride < in.vocab) || !(policy.inv_temperature > 0.0f))
    return fail(status::invalid_argument, what);
  int device = 0, sms = 0, major = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e != cudaSuccess) return launch_status{status::cuda_error, e, what};
  pivot_plan const plan = plan_pivot(in.vocab, in.layout.batch, sms, major, 0);
  if (static_cast<std::int64_t>(in.layout.batch) * plan.group > INT32_MAX)
    return fail(status::out_of_range, what);
  auto const kernel = detail::chain_verify_kernel<0>;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(in.layout.batch * plan.group));
  config.blockDim = dim3(pivot_threads);
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
  e = cudaLaunchKernelEx(&config, kernel, in, policy.inv_temperature, plan);
  if (e != cudaSuccess) return launch_status{status::cuda_error, e, what};
  return last_launch_status(what);
}

#endif  // __CUDACC__

}  // namespace specdec::cuda
