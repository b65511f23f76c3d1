#pragma once
//! \file
//! `contiguous_cache`: a key/value cache that stores, per layer, the keys and the values of every
//! position in one dense float32 block, grows on demand up to its capacity, and drops rejected
//! speculation by truncation (chains) or compaction of the accepted path (trees).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

#include "specdec/core/error.hpp"
#include "specdec/core/views.hpp"
#include "specdec/detail/memory.hpp"

namespace specdec {

//! A float32 KV cache of up to `capacity` positions, laid out as, for each layer, keys
//! [reserved, kv_dim] then values [reserved, kv_dim], row-major (row p = position p).
//!
//! Positions [0, size()) are committed. A backend's forward reserves room for its batch with
//! `append`, then writes the batch's rows through `keys` / `values`. Satisfies `kv_cache`.
//! Memory is allocated on demand: construction allocates nothing, `append` grows the rows held
//! in memory (`reserved()`) when a batch needs more, to at least twice as many (within the
//! capacity), and `reserve` grows them ahead. Growing checks the memory it needs first and
//! throws `errc::out_of_memory` saying how much; it moves the stored rows, so pointers from
//! `keys` / `values` are valid until the next `append` or `reserve`. Nothing else allocates.
class contiguous_cache {
 public:
  //! An empty cache with no layers and no capacity.
  contiguous_cache() = default;

  //! A cache for `n_layers` layers of `kv_dim` floats per position, holding up to `capacity`
  //! positions (none in memory yet). Throws `errc::invalid_argument` when a dimension is zero or
  //! the size at full capacity overflows.
  contiguous_cache(std::size_t n_layers, std::size_t kv_dim, std::size_t capacity)
      : n_layers_(n_layers), kv_dim_(kv_dim), capacity_(capacity) {
    SPECDEC_CHECK(n_layers > 0 && kv_dim > 0 && capacity > 0, invalid_argument,
                  "contiguous_cache: n_layers (", n_layers, "), kv_dim (", kv_dim,
                  ") and capacity (", capacity, ") must be positive");
    constexpr std::size_t limit = std::size_t{1} << 40;  // floats; far beyond any real cache
    SPECDEC_CHECK(kv_dim <= limit / capacity && 2 * n_layers <= limit / (kv_dim * capacity),
                  invalid_argument, "contiguous_cache: ", n_layers, " layers x ", capacity,
                  " positions x ", kv_dim, " floats is too large");
  }

  contiguous_cache(contiguous_cache&&) noexcept = default;
  contiguous_cache& operator=(contiguous_cache&&) noexcept = default;
  contiguous_cache(contiguous_cache const&) = delete;
  contiguous_cache& operator=(contiguous_cache const&) = delete;
  ~contiguous_cache() = default;

  //! Number of positions stored.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! Most positions the cache can hold.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  //! Positions that can still be appended.
  [[nodiscard]] std::size_t room() const noexcept { return capacity_ - size_; }
  //! Positions held in memory (at most the capacity): rows of `keys` / `values`.
  [[nodiscard]] std::size_t reserved() const noexcept { return reserved_; }
  //! Bytes the cache takes for `positions` positions held in memory.
  [[nodiscard]] std::uint64_t bytes_for(std::size_t positions) const noexcept {
    return std::uint64_t{2} * n_layers_ * kv_dim_ * positions * sizeof(float);
  }

  //! Holds at least min(`positions`, capacity()) positions in memory, keeping the stored ones.
  //! Checks the memory first: throws `errc::out_of_memory` (saying how much) and leaves the cache
  //! unchanged when it is not available.
  void reserve(std::size_t positions) {
    positions = std::min(positions, capacity_);
    if (positions <= reserved_) return;
    std::size_t const stride = 2 * positions * kv_dim_;
    std::unique_ptr<float[]> data = detail::allocate_checked(
        bytes_for(positions), "contiguous_cache",
        detail::concat("a KV cache of ", positions, " positions (", n_layers_, " layers x 2 x ",
                       kv_dim_, " floats per position)"),
        [&] { return std::make_unique<float[]>(n_layers_ * stride); });  // zeroed
    std::size_t const row_bytes = kv_dim_ * sizeof(float);
    for (std::size_t l = 0; l < n_layers_ && size_ > 0; ++l) {
      std::memcpy(data.get() + l * stride, keys(l), size_ * row_bytes);
      std::memcpy(data.get() + l * stride + positions * kv_dim_, values(l), size_ * row_bytes);
    }
    data_ = std::move(data);
    reserved_ = positions;
    layer_stride_ = stride;
  }
  //! Whether no position is stored.
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  //! Number of layers.
  [[nodiscard]] std::size_t n_layers() const noexcept { return n_layers_; }
  //! Floats per position and layer, for keys and for values each.
  [[nodiscard]] std::size_t kv_dim() const noexcept { return kv_dim_; }

  //! Drops every position.
  void clear() noexcept { size_ = unchanged_ = 0; }

  //! Positions [0, n) that no member function has dropped or moved since the last
  //! `mark_unchanged()` (writes through `keys` / `values` are not tracked). A backend that keeps
  //! data derived from the rows, such as a transposed copy, refreshes only the rows past this.
  [[nodiscard]] std::size_t unchanged_rows() const noexcept { return unchanged_; }
  //! Marks every stored position unchanged (`unchanged_rows()` becomes `size()`).
  void mark_unchanged() noexcept { unchanged_ = size_; }

  //! Drops positions >= n. Throws `errc::out_of_range` when n > size().
  void truncate(std::size_t n) {
    SPECDEC_CHECK(n <= size_, out_of_range, "contiguous_cache::truncate: ", n,
                  " is beyond the size ", size_);
    size_ = n;
    unchanged_ = std::min(unchanged_, n);
  }

  //! Keeps positions [0, n), moves position n + keep[i] to n + i, and drops the rest, so the
  //! cache's size becomes n + keep.size(). `keep` must be strictly ascending and non-negative with
  //! every n + keep[i] < size(); otherwise throws (`errc::out_of_range` for n or an entry beyond
  //! the stored positions, `errc::invalid_argument` for a negative or non-ascending entry) and
  //! leaves the cache unchanged.
  void keep_path(std::size_t n, std::span<std::int32_t const> keep) {
    SPECDEC_CHECK(n <= size_, out_of_range, "contiguous_cache::keep_path: prefix ", n,
                  " is beyond the size ", size_);
    for (std::size_t i = 0; i < keep.size(); ++i) {
      SPECDEC_CHECK(keep[i] >= 0, invalid_argument, "contiguous_cache::keep_path: keep[", i,
                    "] = ", keep[i], " is negative");
      SPECDEC_CHECK(i == 0 || keep[i - 1] < keep[i], invalid_argument,
                    "contiguous_cache::keep_path: keep is not strictly ascending at index ", i,
                    " (", keep[i - 1], " then ", keep[i], ")");
      SPECDEC_CHECK(static_cast<std::size_t>(keep[i]) < size_ - n, out_of_range,
                    "contiguous_cache::keep_path: keep[", i, "] = ", keep[i],
                    " points at position ", n + static_cast<std::size_t>(keep[i]),
                    ", beyond the size ", size_);
    }
    // keep[i] >= i, so moving in ascending order never overwrites a row still to be read.
    std::size_t const row_bytes = kv_dim_ * sizeof(float);
    for (std::size_t i = 0; i < keep.size(); ++i) {
      std::size_t const src = n + static_cast<std::size_t>(keep[i]);
      std::size_t const dst = n + i;
      if (src == dst) continue;
      unchanged_ = std::min(unchanged_, dst);
      for (std::size_t l = 0; l < n_layers_; ++l) {
        float* const k = keys(l);
        float* const v = values(l);
        std::memcpy(k + dst * kv_dim_, k + src * kv_dim_, row_bytes);
        std::memcpy(v + dst * kv_dim_, v + src * kv_dim_, row_bytes);
      }
    }
    size_ = n + keep.size();
    unchanged_ = std::min(unchanged_, size_);
  }

  //! Reserves `count` positions after the stored ones and returns the first of them; their rows
  //! are then written by the caller through `keys` / `values`. Grows the rows held in memory when
  //! they do not suffice (to at least twice as many, within the capacity; see `reserve`). Throws
  //! `errc::context_overflow` when the positions do not fit the capacity and
  //! `errc::out_of_memory` when growing fails, leaving the cache unchanged.
  std::size_t append(std::size_t count) {
    SPECDEC_CHECK(count <= room(), context_overflow, "contiguous_cache: appending ", count,
                  " positions to ", size_, " would exceed the capacity of ", capacity_);
    if (size_ + count > reserved_) reserve(std::max(size_ + count, 2 * reserved_));
    std::size_t const first = size_;
    size_ += count;
    return first;
  }

  //! Keys of layer `layer`: [reserved, kv_dim] row-major (rows >= size() hold no entry), valid
  //! until the cache grows. Unchecked.
  [[nodiscard]] float* keys(std::size_t layer) noexcept {
    return data_.get() + layer * layer_stride_;
  }
  //! Values of layer `layer`: [reserved, kv_dim] row-major, valid until the cache grows.
  //! Unchecked.
  [[nodiscard]] float* values(std::size_t layer) noexcept {
    return data_.get() + layer * layer_stride_ + reserved_ * kv_dim_;
  }
  //! Read-only keys of layer `layer`: [reserved, kv_dim] row-major. Unchecked.
  [[nodiscard]] float const* keys(std::size_t layer) const noexcept {
    return data_.get() + layer * layer_stride_;
  }
  //! Read-only values of layer `layer`: [reserved, kv_dim] row-major. Unchecked.
  [[nodiscard]] float const* values(std::size_t layer) const noexcept {
    return data_.get() + layer * layer_stride_ + reserved_ * kv_dim_;
  }

  //! The stored keys of `layer` as a view: [size, kv_dim]. Throws `errc::out_of_range` for a bad
  //! layer.
  [[nodiscard]] matrix_view<float const> key_view(std::size_t layer) const {
    check_layer(layer);
    return matrix_view<float const>(keys(layer), size_, kv_dim_);
  }
  //! The stored values of `layer` as a view: [size, kv_dim]. Throws `errc::out_of_range` for a
  //! bad layer.
  [[nodiscard]] matrix_view<float const> value_view(std::size_t layer) const {
    check_layer(layer);
    return matrix_view<float const>(values(layer), size_, kv_dim_);
  }

 private:
  void check_layer(std::size_t layer) const {
    SPECDEC_CHECK(layer < n_layers_, out_of_range, "contiguous_cache: layer ", layer, " of ",
                  n_layers_);
  }

  std::size_t n_layers_ = 0;
  std::size_t kv_dim_ = 0;
  std::size_t capacity_ = 0;
  std::size_t size_ = 0;
  std::size_t unchanged_ = 0;      // see unchanged_rows()
  std::size_t reserved_ = 0;       // positions held in memory
  std::size_t layer_stride_ = 0;   // floats per layer: keys then values
  std::unique_ptr<float[]> data_;  // [n_layers][2][reserved][kv_dim]
};

}  // namespace specdec
