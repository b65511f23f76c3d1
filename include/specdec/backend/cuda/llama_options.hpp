#pragma once
//! \file
//! `cuda_llama_options`: what a `cuda_llama` (llama.cuh) is built with, as plain host code (no
//! CUDA header), which g++ compiles.

#include <cstddef>

#include "specdec/backend/cuda/weight_layout.hpp"

namespace specdec {

//! Options of `cuda_llama`.
struct cuda_llama_options {
  std::size_t max_context = 0;  //!< cache capacity in tokens; 0 = the model's seq_len
  std::size_t max_batch = 64;   //!< tokens per forward reserved up front (grows on demand)
  int device = -1;              //!< CUDA device ordinal; -1 = the current device
  //! Element type of the matrices on the device (the loaders' float32 weights are converted,
  //! rounding to nearest even; F16 / BF16 tensors of a GGUF file convert back to their own bits).
  weight_dtype dtype = weight_dtype::f32;
  //! Forwards of at most `cuda::fused_max_tokens` tokens and logits rows take the fused kernels
  //! (when the model's widths allow: `cuda::fused_supported`); false: always the reference path.
  bool fused = true;
  //! Fused forwards are captured as CUDA graphs, one per shape, and replayed.
  bool graphs = true;
  //! Most shapes captured (the first ones seen); later shapes run their launches directly.
  std::size_t max_graphs = 64;
};

}  // namespace specdec
