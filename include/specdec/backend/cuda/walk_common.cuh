#pragma once
//! \file
//! What the two walk kernels (the sampling walk of walk.cuh and the greedy walk of
//! greedy_walk.cuh) share: their parameters (`walk_params`), the draft tree of one sequence in
//! shared memory (`detail::walk_smem`, `detail::load_tree`), and the launchers' host-side checks.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/core/types.hpp"

namespace specdec::cuda {

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

#endif  // __CUDACC__

}  // namespace detail
}  // namespace specdec::cuda
