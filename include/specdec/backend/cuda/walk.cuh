#pragma once
//! \file
//! The sampling walk and the final draw (`launch_walk_draw`): the verification walk of
//! verify/detail/walk.hpp's `sampling_walk` over a ragged batch of draft trees, on the device.
//!
//! Every block of a sequence replays the (cheap, gather-only) acceptance walk, then the blocks
//! share the pass over the one row the final token is drawn from (draw.cuh); the last block to
//! finish locates the inverse-CDF crossing and writes the results. Sequences whose walk needs a
//! residual update in the middle (q rows and a node with several children) run in one block.
//!
//! Sampling a token from a row is the walk over a root-only tree (one word, offset + 0).
//!
//! The kernels are templates (`template <int Unused = 0>`): common.cuh says why.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/draw.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/backend/cuda/walk_common.cuh"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"

namespace specdec::cuda {
namespace detail {

#if defined(__CUDACC__)

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

#endif  // __CUDACC__

}  // namespace detail

#if defined(__CUDACC__)

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

#endif  // __CUDACC__

}  // namespace specdec::cuda
