#pragma once
//! \file
//! `cuda_kv_cache`: the KV cache of `cuda_llama` in device memory, per layer a K and a V plane of
//! [capacity, kv_dim] floats; rejected speculation is dropped by truncation (chains) or by the
//! compaction kernel of tree.cuh (trees). The device twin of kv/contiguous_cache.hpp.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/tree.cuh"
#include "specdec/core/error.hpp"
#include "specdec/detail/memory.hpp"

namespace specdec {

#if defined(__CUDACC__)

//! A KV cache in device memory: per layer a K and a V plane of [capacity, kv_dim] floats. Entries
//! are stored in the order they were appended (slot i holds the i-th committed token's K/V).
//! Satisfies `specdec::kv_cache`. Operations run on the owning model's stream.
class cuda_kv_cache {
 public:
  //! A cache for `n_layers` layers of `kv_dim` floats per entry, holding `capacity` entries.
  cuda_kv_cache(std::int32_t n_layers, std::int32_t kv_dim, std::size_t capacity,
                cudaStream_t stream)
      : n_layers_(n_layers), kv_dim_(kv_dim), capacity_(capacity), stream_(stream) {
    SPECDEC_CHECK(n_layers > 0 && kv_dim > 0 && capacity > 0, invalid_argument,
                  "cuda_kv_cache: n_layers ", n_layers, ", kv_dim ", kv_dim, ", capacity ",
                  capacity, " must be positive");
    SPECDEC_CHECK(capacity <= static_cast<std::size_t>(INT32_MAX), out_of_range,
                  "cuda_kv_cache: capacity ", capacity, " exceeds 2^31 - 1");
    std::size_t const plane = capacity * static_cast<std::size_t>(kv_dim);
    // The cache is sized for its whole capacity at once: check that the device can hold it
    // before allocating, and say how much it needs.
    std::size_t const bytes = plane * 2 * static_cast<std::size_t>(n_layers) * sizeof(float);
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      SPECDEC_CHECK(bytes <= free_bytes, out_of_memory, "cuda_kv_cache: a KV cache of ", capacity,
                    " positions (", n_layers, " layers x 2 x ", kv_dim,
                    " floats per position) needs ", detail::byte_text(bytes),
                    " of device memory but only ", detail::byte_text(free_bytes), " of ",
                    detail::byte_text(total_bytes), " is free; give the model a smaller context");
    } else {
      (void)cudaGetLastError();  // no device information: cudaMalloc reports the failure
    }
    data_.resize(plane * 2 * static_cast<std::size_t>(n_layers));
    std::vector<float*> planes(2 * static_cast<std::size_t>(n_layers));
    for (std::size_t p = 0; p < planes.size(); ++p) planes[p] = data_.data() + p * plane;
    planes_.resize(planes.size());
    planes_.upload(std::span<float* const>(planes), stream_);
    keep_.resize(capacity + 2 + 1);
    staging_.resize(capacity + 3);
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  //! Entries stored (committed positions).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! Most entries the cache holds.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  //! Floats per entry and plane.
  [[nodiscard]] std::int32_t kv_dim() const noexcept { return kv_dim_; }
  //! Number of layers.
  [[nodiscard]] std::int32_t n_layers() const noexcept { return n_layers_; }

  //! Drops entries >= n. Throws `errc::out_of_range` when n > size().
  void truncate(std::size_t n) {
    SPECDEC_CHECK(n <= size_, out_of_range, "cuda_kv_cache::truncate: ", n,
                  " is beyond the cache size ", size_);
    size_ = n;
  }

  //! Keeps entries [0, n), moves entry n + keep[i] to n + i and drops the rest. `keep` must be
  //! strictly ascending with n + keep.back() < size(). Throws `specdec::error` otherwise.
  void keep_path(std::size_t n, std::span<std::int32_t const> keep) {
    SPECDEC_CHECK(n <= size_, out_of_range, "cuda_kv_cache::keep_path: n = ", n,
                  " is beyond the cache size ", size_);
    for (std::size_t i = 0; i < keep.size(); ++i) {
      SPECDEC_CHECK(keep[i] >= 0 && n + static_cast<std::size_t>(keep[i]) < size_, out_of_range,
                    "cuda_kv_cache::keep_path: keep[", i, "] = ", keep[i], " addresses entry ",
                    n + static_cast<std::size_t>(keep[i] < 0 ? 0 : keep[i]), " of a cache holding ",
                    size_);
      SPECDEC_CHECK(i == 0 || keep[i] > keep[i - 1], invalid_argument,
                    "cuda_kv_cache::keep_path: keep is not strictly ascending at index ", i);
    }
    bool moves = false;
    for (std::size_t i = 0; i < keep.size(); ++i)
      moves = moves || keep[i] != static_cast<std::int32_t>(i);
    if (moves) {
      // staging: [base, cu0, cu1, keep...]
      staging_[0] = static_cast<std::int32_t>(n);
      staging_[1] = 0;
      staging_[2] = static_cast<std::int32_t>(keep.size());
      std::copy(keep.begin(), keep.end(), staging_.begin() + 3);
      keep_.upload(std::span<std::int32_t const>(staging_.data(), keep.size() + 3), stream_);
      cuda::kv_compaction_params p;
      p.planes = planes_.data();
      p.num_planes = 2 * n_layers_;
      p.row_width = kv_dim_;
      p.seq_stride = 0;
      p.capacity = static_cast<std::int32_t>(capacity_);
      p.batch = 1;
      p.base = keep_.data();
      p.cu_keep = keep_.data() + 1;
      p.keep = keep_.data() + 3;
      cuda::throw_if_failed(cuda::launch_compact_kv(p, stream_), "cuda_kv_cache::keep_path");
      // The staging buffer is reused by the next call: wait for the upload.
      SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    size_ = n + keep.size();
  }

  //! Empties the cache.
  void clear() noexcept { size_ = 0; }

  //! K plane of `layer`: [capacity, kv_dim] floats on the device.
  [[nodiscard]] float* keys(std::int32_t layer) noexcept { return plane(2 * layer); }
  //! V plane of `layer`: [capacity, kv_dim] floats on the device.
  [[nodiscard]] float* values(std::int32_t layer) noexcept { return plane(2 * layer + 1); }
  [[nodiscard]] float const* keys(std::int32_t layer) const noexcept {
    return data_.data() + static_cast<std::size_t>(2 * layer) * plane_size();
  }
  [[nodiscard]] float const* values(std::int32_t layer) const noexcept {
    return data_.data() + static_cast<std::size_t>(2 * layer + 1) * plane_size();
  }

  //! Records that `count` entries were appended (by the model's forward).
  void commit_append(std::size_t count) {
    SPECDEC_CHECK(count <= capacity_ - size_, context_overflow, "cuda_kv_cache: appending ", count,
                  " entries to ", size_, " exceeds the capacity ", capacity_);
    size_ += count;
  }

 private:
  [[nodiscard]] std::size_t plane_size() const noexcept {
    return capacity_ * static_cast<std::size_t>(kv_dim_);
  }
  [[nodiscard]] float* plane(std::int32_t p) noexcept {
    return data_.data() + static_cast<std::size_t>(p) * plane_size();
  }

  std::int32_t n_layers_;
  std::int32_t kv_dim_;
  std::size_t capacity_;
  std::size_t size_ = 0;
  cudaStream_t stream_;
  cuda::device_buffer<float> data_;
  cuda::device_buffer<float*> planes_;
  cuda::device_buffer<std::int32_t> keep_;
  std::vector<std::int32_t> staging_;
};

#endif  // __CUDACC__

}  // namespace specdec
