#pragma once
//! \file
//! What a `llama_weights::storage` owns when a reader produced it: the file's memory map (for
//! tensors used in place) and a buffer of converted float32 values (for tensors that needed a
//! conversion: F16, BF16, dequantised int8, misaligned data).

#include <cstddef>
#include <memory>
#include <vector>

#include "specdec/model/mapped_file.hpp"

namespace specdec::detail {

//! The owner behind a reader's `llama_weights::storage`.
struct weight_storage {
  std::shared_ptr<mapped_file const> map;  //!< the mapped file (may be null)
  std::vector<float> owned;                //!< converted tensors, [total converted elements]
};

}  // namespace specdec::detail
