#pragma once
//! \file
//! `cuda_batched_llama`: the CUDA Llama forward over many sequences at once, each in a slot with
//! its own device KV cache (`cuda_kv_cache`). Satisfies `batched_lm`: the twin of
//! backend/cpu/batched_llama.hpp. One forward runs every segment's rows through each matrix
//! product together (cuBLAS, one call per product for the whole batch) and the KV appends and
//! attention per segment against its own cache (`cuda_llama::forward` over `cuda_llama_segment`s:
//! the reference path with the segment kernels when several segments are scored; a forward of a
//! single segment takes the single-sequence paths, fused kernels for short forwards, uncaptured).
//!
//! Caches: one per slot, made when the slot is first used, at the model's full context (a device
//! cache is allocated at its capacity); it is kept when the slot is released and serves the next
//! request in that slot. A paged pool of blocks with per-sequence block tables (vLLM's paged
//! attention) would let many more, shorter sequences share the device memory; see
//! docs/batching.md.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "specdec/backend/cuda/kv_cache.cuh"
#include "specdec/backend/cuda/llama.cuh"
#include "specdec/core/batch_forward.hpp"
#include "specdec/core/error.hpp"
#include "specdec/kv/slots.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec {

//! Options of a `cuda_batched_llama`.
struct cuda_batched_llama_options {
  cuda_llama_options model = {};  //!< the model's options (context per sequence, device)
  std::size_t max_slots = 64;     //!< most sequences held at once, in [1, 2^20]
};

#if defined(__CUDACC__)

//! What `slotted_model` needs to know of the CUDA backend: a slot is a device KV cache.
struct cuda_slots {
  using model_type = cuda_llama;                         //!< the model
  using sequence_type = std::unique_ptr<cuda_kv_cache>;  //!< a slot's device KV cache
  using segment_type = cuda_llama_segment;               //!< what its forward over segments takes
  static constexpr char const* name = "cuda_batched_llama";  //!< for messages
  //! Whether the slot's cache was made.
  static bool made(sequence_type const& s) noexcept { return s != nullptr; }
  //! A new cache (`errc::out_of_memory` when the device cannot hold it).
  static sequence_type make(model_type const& m) { return m.make_cache(); }
  static cuda_kv_cache& cache(sequence_type& s) noexcept { return *s; }              //!< its cache
  static cuda_kv_cache const& cache(sequence_type const& s) noexcept { return *s; }  //!< its cache
  //! The segment scoring `req` against `s`.
  static segment_type segment(sequence_type& s, forward_request const& req) {
    return {s.get(), req};
  }
};

//! A Llama model on one CUDA device scoring many sequences per forward (see the file comment):
//! the forward copies the logits (and hidden rows) to the host and waits for the device.
class cuda_batched_llama : public slotted_model<cuda_slots> {
 public:
  //! Uploads `weights` to the device (they may be released afterwards). Throws as `cuda_llama`
  //! does, and `errc::invalid_argument` for max_slots outside [1, 2^20].
  explicit cuda_batched_llama(llama_weights const& weights, cuda_batched_llama_options options = {})
      : slotted_model(options.max_slots, weights, options.model) {}
  //! Uploads `*weights` (which may be released afterwards).
  explicit cuda_batched_llama(std::shared_ptr<llama_weights const> const& weights,
                              cuda_batched_llama_options options = {})
      : cuda_batched_llama(deref(weights), options) {}

 private:
  static llama_weights const& deref(std::shared_ptr<llama_weights const> const& w) {
    SPECDEC_CHECK(w != nullptr, invalid_argument, "cuda_batched_llama: null weights");
    return *w;
  }
};

#endif  // __CUDACC__

}  // namespace specdec
