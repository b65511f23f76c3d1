#pragma once
//! \file
//! Tree bookkeeping on the device for a ragged batch of draft trees: bit-packed ancestor
//! (visibility) masks, depths and positions from parent indices, and the compaction of a KV cache
//! to the accepted path of each tree.
//!
//! The kernels are templates (`template <int Unused = 0>`): common.cuh says why.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/core/types.hpp"

namespace specdec::cuda {

//! Inputs and outputs of `launch_build_tree_masks`. All pointers are device pointers.
struct tree_mask_params {
  ragged_layout layout;                   //!< sequence b owns nodes [begin(b), end(b))
  std::int32_t const* parents = nullptr;  //!< [total_rows] parent of each node as a local index
                                          //!< (node 0 of a sequence is its root: -1)
  std::int32_t const* base_positions = nullptr;  //!< [batch] position of each root, or null (0)
  std::uint64_t* mask = nullptr;        //!< [total_rows, mask_stride] out: bit j of row i (local
                                        //!< indices) is set when node j is node i or an ancestor
  std::int32_t mask_stride = 0;         //!< words per mask row, >= mask_words(max_rows_per_seq)
  std::int32_t* depths = nullptr;       //!< [total_rows] out (may be null): 0 for roots
  std::int32_t* positions = nullptr;    //!< [total_rows] out (may be null): base + depth
  std::int32_t* error_flags = nullptr;  //!< [batch] out (may be null): bad_tree on a bad parent
};

//! Inputs of `launch_compact_kv`: the KV planes of a batched cache and, per sequence, the
//! committed length and the accepted rows. All pointers are device pointers.
//!
//! Plane p of sequence b is the row-major [capacity, row_width] float array at
//! `planes[p] + b * seq_stride`; rows are positions. For sequence b with committed length
//! n = base[b], the kernel moves row n + keep[i] to row n + i for i in [0, count_b), where keep is
//! `keep[cu_keep[b] .. cu_keep[b + 1])`, strictly ascending (so keep[i] >= i and the in-place
//! move in ascending order never overwrites a row it still has to read).
struct kv_compaction_params {
  float* const* planes = nullptr;         //!< [num_planes] device pointers (e.g. K and V per layer)
  std::int32_t num_planes = 0;            //!< number of planes
  std::int32_t row_width = 0;             //!< floats per row (kv_dim)
  std::int64_t seq_stride = 0;            //!< floats between sequences within a plane
  std::int32_t capacity = 0;              //!< rows per sequence within a plane
  std::int32_t batch = 0;                 //!< sequences
  std::int32_t const* base = nullptr;     //!< [batch] committed length n of each sequence
  std::int32_t const* cu_keep = nullptr;  //!< [batch + 1] cumulative counts of kept rows
  std::int32_t const* keep = nullptr;     //!< [cu_keep[batch]] kept rows relative to n, ascending
  std::int32_t* error_flags = nullptr;    //!< [batch] out (may be null): bad_tree when keep is not
                                          //!< strictly ascending or leaves the capacity
};

namespace detail {

#if defined(__CUDACC__)

//! One thread per node: walk up the parents, setting one bit per ancestor.
template <int Unused = 0>
__global__ void build_tree_masks_kernel(tree_mask_params p) {
  std::int32_t const b = static_cast<std::int32_t>(blockIdx.y);
  std::int32_t const first = p.layout.begin(b), last = p.layout.end(b);
  std::int32_t const n = last - first;
  if (n <= 0 || n > p.layout.max_rows_per_seq) {
    if (n != 0 && threadIdx.x == 0 && blockIdx.x == 0 && p.error_flags != nullptr)
      atomicOr(p.error_flags + b, bad_tree);
    return;
  }
  std::int32_t const base = p.base_positions != nullptr ? p.base_positions[b] : 0;
  for (std::int32_t i = static_cast<std::int32_t>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<std::int32_t>(gridDim.x * blockDim.x)) {
    std::uint64_t* row = p.mask + static_cast<std::int64_t>(first + i) * p.mask_stride;
    for (std::int32_t w = 0; w < p.mask_stride; ++w) row[w] = 0;
    std::int32_t at = i, depth = 0;
    bool ok = true;
    while (true) {
      row[at >> 6] |= std::uint64_t{1} << (at & 63);
      std::int32_t const parent = p.parents[first + at];
      if (at == 0) {
        ok = parent == -1;
        break;
      }
      if (parent < 0 || parent >= at) {
        ok = false;
        break;
      }
      at = parent;
      ++depth;
    }
    if (!ok && p.error_flags != nullptr) atomicOr(p.error_flags + b, bad_tree);
    if (p.depths != nullptr) p.depths[first + i] = depth;
    if (p.positions != nullptr) p.positions[first + i] = base + depth;
  }
}

//! One block per (plane, sequence): rows are moved one after another (ascending), the block's
//! threads sharing each row; a barrier between rows keeps the in-place move safe.
template <int Unused = 0>
__global__ void compact_kv_kernel(kv_compaction_params p) {
  std::int32_t const plane = static_cast<std::int32_t>(blockIdx.x);
  std::int32_t const b = static_cast<std::int32_t>(blockIdx.y);
  std::int32_t const k0 = p.cu_keep[b], k1 = p.cu_keep[b + 1];
  std::int32_t const n = p.base[b];
  // Validate the whole list first so that a bad one moves nothing.
  bool ok = k1 >= k0 && n >= 0;
  for (std::int32_t i = k0; ok && i < k1; ++i) {
    std::int32_t const src = p.keep[i];
    std::int32_t const prev = i > k0 ? p.keep[i - 1] : -1;
    ok = src > prev && src >= i - k0 &&
         static_cast<std::int64_t>(n) + src < static_cast<std::int64_t>(p.capacity);
  }
  if (!ok) {
    if (threadIdx.x == 0 && plane == 0 && p.error_flags != nullptr)
      atomicOr(p.error_flags + b, bad_tree);
    return;
  }
  float* const seq = p.planes[plane] + static_cast<std::int64_t>(b) * p.seq_stride;
  for (std::int32_t i = k0; i < k1; ++i) {
    std::int32_t const src = p.keep[i], dst = i - k0;
    if (src != dst) {
      float const* from = seq + static_cast<std::int64_t>(n + src) * p.row_width;
      float* to = seq + static_cast<std::int64_t>(n + dst) * p.row_width;
      for (std::int32_t e = static_cast<std::int32_t>(threadIdx.x); e < p.row_width;
           e += static_cast<std::int32_t>(blockDim.x))
        to[e] = from[e];
    }
    __syncthreads();
  }
}

#endif  // __CUDACC__

}  // namespace detail

#if defined(__CUDACC__)

//! Builds ancestor masks, depths and positions for a ragged batch of trees (one grid row per
//! sequence). Parents are validated on the device (`bad_tree` in error_flags); the host checks
//! pointers and sizes. error_flags, when given, must be zeroed by the caller.
inline launch_status launch_build_tree_masks(tree_mask_params const& p,
                                             cudaStream_t stream = nullptr) noexcept {
  constexpr char const* where = "launch_build_tree_masks";
  if (!p.layout.valid()) return fail(status::invalid_argument, "launch_build_tree_masks: layout");
  if (p.layout.batch == 0 || p.layout.total_rows == 0) return {};
  if (p.parents == nullptr || p.mask == nullptr)
    return fail(status::invalid_argument, "launch_build_tree_masks: null parents or mask");
  if (p.layout.max_rows_per_seq <= 0 ||
      static_cast<std::size_t>(p.layout.max_rows_per_seq) > max_tree_nodes)
    return fail(status::out_of_range, "launch_build_tree_masks: max_rows_per_seq");
  if (p.mask_stride <
      static_cast<std::int32_t>(mask_words(static_cast<std::size_t>(p.layout.max_rows_per_seq))))
    return fail(status::invalid_argument, "launch_build_tree_masks: mask_stride too small");
  if (p.layout.batch > 65535)
    return fail(status::out_of_range, "launch_build_tree_masks: batch above 65535");
  unsigned const blocks_x =
      static_cast<unsigned>(detail::ceil_div(p.layout.max_rows_per_seq, detail::block_threads));
  detail::build_tree_masks_kernel<<<dim3(blocks_x, static_cast<unsigned>(p.layout.batch)),
                                    detail::block_threads, 0, stream>>>(p);
  return last_launch_status(where);
}

//! Compacts each sequence's KV rows to its accepted path (see `kv_compaction_params`). A
//! sequence whose keep list is not strictly ascending or leaves the capacity is left untouched
//! and flagged (`bad_tree`); error_flags, when given, must be zeroed by the caller.
inline launch_status launch_compact_kv(kv_compaction_params const& p,
                                       cudaStream_t stream = nullptr) noexcept {
  constexpr char const* where = "launch_compact_kv";
  if (p.batch < 0 || p.num_planes < 0 || p.row_width < 0 || p.capacity < 0)
    return fail(status::invalid_argument, "launch_compact_kv: negative size");
  if (p.batch == 0 || p.num_planes == 0 || p.row_width == 0) return {};
  if (p.planes == nullptr || p.base == nullptr || p.cu_keep == nullptr || p.keep == nullptr)
    return fail(status::invalid_argument, "launch_compact_kv: null pointer");
  if (p.batch > 65535 || p.num_planes > 2147483647)
    return fail(status::out_of_range, "launch_compact_kv: batch above 65535");
  if (p.batch > 1 && p.seq_stride < static_cast<std::int64_t>(p.capacity) * p.row_width)
    return fail(status::invalid_argument, "launch_compact_kv: seq_stride below capacity * width");
  detail::
      compact_kv_kernel<<<dim3(static_cast<unsigned>(p.num_planes), static_cast<unsigned>(p.batch)),
                          detail::block_threads, 0, stream>>>(p);
  return last_launch_status(where);
}

#endif  // __CUDACC__

}  // namespace specdec::cuda
