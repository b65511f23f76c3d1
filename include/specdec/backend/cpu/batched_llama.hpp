#pragma once
//! \file
//! `cpu_batched_llama`: the CPU Llama forward over many sequences at once, each in a slot with its
//! own KV cache. Satisfies `batched_lm`.
//!
//! One forward streams the weights once for the whole batch: the rows of every segment go through
//! each layer's matrix products together (a decode step of one sequence is bound by the memory
//! bandwidth, so the rows of the others come nearly free), and attention runs per sequence against
//! its own cache (`cpu_llama::forward` over `cpu_llama_segment`s). A sequence's rows are the same
//! bits a single-sequence `cpu_llama` gives for the same tokens, whatever else is in the batch.
//!
//! Caches: one contiguous cache per slot (`cpu_llama_sequence`), not a paged pool of blocks. The
//! CPU attention kernels read runs of consecutive cache rows, and keep a transposed copy per
//! sequence for heads of 8 floats; a slot's memory grows on demand (doubling) with the positions
//! its sequence uses, is kept when the slot is released, and serves the next request in that slot
//! without growing again. Paged attention's block tables answer a GPU's problem -- a fixed memory
//! pool that must not be reserved at the maximum length for every sequence -- which on-demand
//! growth already answers here; see docs/batching.md.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/batch_forward.hpp"
#include "specdec/core/error.hpp"
#include "specdec/kv/contiguous_cache.hpp"
#include "specdec/kv/slots.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec {

//! Options of a `cpu_batched_llama`.
struct cpu_batched_llama_options {
  //! The model's options (threads, context per sequence, batch rows, pool, packing).
  cpu_llama_options model = {};
  //! Most sequences held at once (slots), in [1, 2^20]. A slot's memory is allocated when it is
  //! first used and grows with its sequence.
  std::size_t max_slots = 64;
};

//! What `slotted_model` needs to know of the CPU backend: a slot is a `cpu_llama_sequence`.
struct cpu_slots {
  using model_type = cpu_llama;              //!< the model
  using sequence_type = cpu_llama_sequence;  //!< a slot's KV cache and transposed copies
  using segment_type = cpu_llama_segment;    //!< what its forward over segments takes
  static constexpr char const* name = "cpu_batched_llama";  //!< for messages
  //! Whether the slot's sequence was made.
  static bool made(sequence_type const& s) noexcept { return s.cache().n_layers() != 0; }
  //! A new sequence (allocates nothing large).
  static sequence_type make(model_type const& m) { return m.make_sequence(); }
  static contiguous_cache& cache(sequence_type& s) noexcept { return s.cache(); }  //!< its cache
  static contiguous_cache const& cache(sequence_type const& s) noexcept {          //!< its cache
    return s.cache();
  }
  //! The segment scoring `req` against `s`.
  static segment_type segment(sequence_type& s, forward_request const& req) { return {&s, req}; }
};

//! A Llama model on the CPU scoring many sequences per forward (see the file comment).
class cpu_batched_llama : public slotted_model<cpu_slots> {
 public:
  //! A model over `weights` (shared ownership). Throws as `cpu_llama` does, and
  //! `errc::invalid_argument` for max_slots outside [1, 2^20].
  explicit cpu_batched_llama(std::shared_ptr<llama_weights const> weights,
                             cpu_batched_llama_options options = {})
      : slotted_model(options.max_slots, std::move(weights), options.model) {}

  //! Holds min(`positions`, max_context()) positions of `slot` in memory ahead of its forwards
  //! (see `cpu_llama::reserve`); throws `errc::out_of_memory`, changing nothing, when the memory
  //! is not there, and `errc::invalid_argument` for a slot not in use.
  void reserve(std::size_t slot, std::size_t positions) {
    model().reserve(sequence(slot), positions);
  }
  //! Positions `slot`'s buffers hold in memory now.
  [[nodiscard]] std::size_t reserved(std::size_t slot) const { return sequence(slot).reserved(); }
};

}  // namespace specdec
