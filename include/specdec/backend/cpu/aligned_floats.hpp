#pragma once
//! \file
//! `aligned_floats`: the cache-line-aligned float buffers of the CPU backend (packed weights,
//! transposed keys and values). Internal to backend/cpu.

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>

namespace specdec::detail::cpu {

//! Zero-initialised floats aligned to a cache line (64 bytes); allocated once, never resized.
class aligned_floats {
 public:
  //! No storage.
  aligned_floats() = default;
  //! `n` zeros.
  explicit aligned_floats(std::size_t n)
      : data_(n == 0
                  ? nullptr
                  : static_cast<float*>(::operator new (n * sizeof(float), std::align_val_t{64}))),
        size_(n) {
    if (n != 0) std::memset(data_.get(), 0, n * sizeof(float));
  }
  //! The first float (null when empty).
  [[nodiscard]] float* data() noexcept { return data_.get(); }
  //! The first float (null when empty).
  [[nodiscard]] float const* data() const noexcept { return data_.get(); }
  //! Number of floats.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  struct release {
    void operator()(float* p) const noexcept { ::operator delete (p, std::align_val_t{64}); }
  };
  std::unique_ptr<float, release> data_;
  std::size_t size_ = 0;
};

}  // namespace specdec::detail::cpu
