#pragma once
//! \file
//! What a `llama_weights::storage` owns when a reader produced it: the file's memory map (for
//! tensors used in place) and a buffer of converted float32 values (for tensors that needed a
//! conversion: F16, BF16, dequantised int8, misaligned data; or generated ones).

#include <cstddef>
#include <cstdint>
#include <memory>

#include "specdec/detail/memory.hpp"
#include "specdec/model/mapped_file.hpp"

namespace specdec::detail {

//! The owner behind a reader's `llama_weights::storage`.
struct weight_storage {
  std::shared_ptr<mapped_file const> map;  //!< the mapped file (may be null)
  aligned_array<float> owned;              //!< converted tensors, [owned_size], cache-line aligned
  std::size_t owned_size = 0;              //!< number of floats in `owned`

  //! Allocates `count` floats, uninitialised (every reader writes all of them), and returns them.
  //! Checks the memory first: throws `errc::out_of_memory` (saying how much) when it is not there.
  float* allocate(std::size_t count) {
    owned = allocate_checked(std::uint64_t{count} * sizeof(float), "model reader",
                             "converting the weights to float32",
                             [&] { return allocate_aligned<float>(count); });
    owned_size = count;
    return owned.get();
  }
};

}  // namespace specdec::detail
