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

//! A Llama model on one CUDA device scoring many sequences per forward (see the file comment).
class cuda_batched_llama {
 public:
  //! Its forward honours `forward_request::skip_layers` (self-speculation).
  static constexpr bool supports_skip_layers = true;

  //! Uploads `weights` to the device (they may be released afterwards). Throws as `cuda_llama`
  //! does, and `errc::invalid_argument` for max_slots outside [1, 2^20].
  explicit cuda_batched_llama(llama_weights const& weights, cuda_batched_llama_options options = {})
      : model_(weights, options.model), slots_(options.max_slots) {
    caches_.resize(options.max_slots);
    segments_.reserve(std::min<std::size_t>(options.max_slots, 256));
  }
  //! Uploads `*weights` (which may be released afterwards).
  explicit cuda_batched_llama(std::shared_ptr<llama_weights const> const& weights,
                              cuda_batched_llama_options options = {})
      : cuda_batched_llama(deref(weights), options) {}

  //! Vocabulary size.
  [[nodiscard]] std::size_t vocab_size() const noexcept { return model_.vocab_size(); }
  //! Positions each slot's cache holds.
  [[nodiscard]] std::size_t max_context() const noexcept { return model_.max_context(); }
  //! Width of the hidden states.
  [[nodiscard]] std::size_t hidden_size() const noexcept { return model_.hidden_size(); }
  //! Most sequences held at once.
  [[nodiscard]] std::size_t max_slots() const noexcept { return slots_.size(); }
  //! Slots not in use.
  [[nodiscard]] std::size_t free_slots() const noexcept { return slots_.free(); }
  //! Whether `slot` is in use.
  [[nodiscard]] bool in_use(std::size_t slot) const noexcept { return slots_.in_use(slot); }

  //! A free slot with an empty cache, now in use (its cache is made on first use: throws
  //! `errc::out_of_memory` when the device cannot hold it, leaving the slot free). Throws
  //! `errc::context_overflow` when every slot is in use.
  std::size_t acquire_slot() {
    std::size_t const slot = slots_.acquire("cuda_batched_llama");
    if (caches_[slot] == nullptr) {
      try {
        caches_[slot] = model_.make_cache();
      } catch (...) {
        slots_.release(slot, "cuda_batched_llama");
        throw;
      }
    }
    caches_[slot]->clear();
    return slot;
  }

  //! Frees `slot` for reuse, keeping its cache. Throws `errc::invalid_argument` for a slot not in
  //! use.
  void release_slot(std::size_t slot) {
    slots_.release(slot, "cuda_batched_llama::release_slot");
    caches_[slot]->clear();
  }

  //! The device KV cache of `slot`. Throws `errc::invalid_argument` for a slot not in use.
  [[nodiscard]] cuda_kv_cache& cache(std::size_t slot) {
    slots_.check(slot, "cuda_batched_llama::cache");
    return *caches_[slot];
  }
  //! The device KV cache of `slot`, read-only.
  [[nodiscard]] cuda_kv_cache const& cache(std::size_t slot) const {
    slots_.check(slot, "cuda_batched_llama::cache");
    return *caches_[slot];
  }

  //! Scores every segment of `req` against its slot's cache in one pass over the weights, appends
  //! each segment's KV entries to its slot's cache, and copies the logits (and hidden rows) to
  //! `out` on the host (see `batched_lm`); waits for the device. Throws `specdec::error`, leaving
  //! every cache unchanged, for a malformed request (`batch_forward_request::validate`: no segment,
  //! a slot out of range or given twice, a malformed segment), a slot not in use
  //! (`errc::invalid_argument`), or a segment its cache cannot take (`errc::context_overflow`,
  //! "segment s: ...").
  void forward(batch_forward_request const& req, batch_forward_result& out) {
    req.validate(vocab_size(), max_context(), max_slots());
    segments_.clear();
    for (std::size_t s = 0; s < req.segments.size(); ++s) {
      batch_segment const& seg = req.segments[s];
      SPECDEC_CHECK(slots_.in_use(seg.slot), invalid_argument,
                    "cuda_batched_llama::forward: ", "segment ", s, " names slot ", seg.slot,
                    ", which is not in use");
      segments_.push_back({caches_[seg.slot].get(), req.request(s)});
    }
    model_.forward(std::span<cuda_llama_segment const>(segments_), out.rows);
    out.set_offsets(req);
  }

  //! The underlying model (its own single-sequence cache is separate from the slots').
  [[nodiscard]] cuda_llama& model() noexcept { return model_; }
  //! The underlying model, read-only.
  [[nodiscard]] cuda_llama const& model() const noexcept { return model_; }

 private:
  static llama_weights const& deref(std::shared_ptr<llama_weights const> const& w) {
    SPECDEC_CHECK(w != nullptr, invalid_argument, "cuda_batched_llama: null weights");
    return *w;
  }

  cuda_llama model_;
  slot_allocator slots_;
  std::vector<std::unique_ptr<cuda_kv_cache>> caches_;  // [max_slots], made on first use
  std::vector<cuda_llama_segment> segments_;            // the forward in progress
};

#endif  // __CUDACC__

}  // namespace specdec
