#pragma once
//! \file
//! Greedy verification on the device (`launch_greedy_walk`), the walk of
//! verify/detail/walk.hpp's `greedy_walk` over a ragged batch of draft trees: one kernel, a
//! chunked argmax of every row, then the walk in the last block of each sequence to finish.
//!
//! The kernels are templates (`template <int Unused = 0>`): common.cuh says why.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/walk_common.cuh"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"

namespace specdec::cuda {
namespace detail {

#if defined(__CUDACC__)

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
