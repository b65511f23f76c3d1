#pragma once
//! \file
//! `aligned_floats`: the cache-line-aligned float buffers of the CPU backend (packed weights,
//! transposed keys and values). Internal to backend/cpu.

#include <cstddef>
#include <cstring>

#include "specdec/detail/memory.hpp"

namespace specdec::detail::cpu {

//! Zero-initialised floats aligned to a cache line (64 bytes); allocated once, never resized.
class aligned_floats {
 public:
  //! No storage.
  aligned_floats() = default;
  //! `n` zeros.
  explicit aligned_floats(std::size_t n)
      : data_(n == 0 ? nullptr : allocate_aligned<float>(n)), size_(n) {
    if (n != 0) std::memset(data_.get(), 0, n * sizeof(float));
  }
  //! The first float (null when empty).
  [[nodiscard]] float* data() noexcept { return data_.get(); }
  //! The first float (null when empty).
  [[nodiscard]] float const* data() const noexcept { return data_.get(); }
  //! Number of floats.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  aligned_array<float> data_;
  std::size_t size_ = 0;
};

}  // namespace specdec::detail::cpu
