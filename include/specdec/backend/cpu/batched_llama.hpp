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

//! A Llama model on the CPU scoring many sequences per forward (see the file comment).
class cpu_batched_llama {
 public:
  //! Its forward honours `forward_request::skip_layers` (self-speculation).
  static constexpr bool supports_skip_layers = true;

  //! A model over `weights` (shared ownership). Throws as `cpu_llama` does, and
  //! `errc::invalid_argument` for max_slots outside [1, 2^20].
  explicit cpu_batched_llama(std::shared_ptr<llama_weights const> weights,
                             cpu_batched_llama_options options = {})
      : model_(std::move(weights), options.model), slots_(options.max_slots) {
    sequences_.resize(options.max_slots);
    segments_.reserve(std::min<std::size_t>(options.max_slots, 256));
  }

  //! Vocabulary size (logits per row).
  [[nodiscard]] std::size_t vocab_size() const noexcept { return model_.vocab_size(); }
  //! Positions each slot's cache can hold; every position must be below it.
  [[nodiscard]] std::size_t max_context() const noexcept { return model_.max_context(); }
  //! Width of the residual stream (hidden rows).
  [[nodiscard]] std::size_t hidden_size() const noexcept { return model_.hidden_size(); }
  //! Most sequences held at once.
  [[nodiscard]] std::size_t max_slots() const noexcept { return slots_.size(); }
  //! Slots not in use.
  [[nodiscard]] std::size_t free_slots() const noexcept { return slots_.free(); }
  //! Whether `slot` is in use.
  [[nodiscard]] bool in_use(std::size_t slot) const noexcept { return slots_.in_use(slot); }

  //! A free slot with an empty cache, now in use (a released slot's memory is reused). Throws
  //! `errc::context_overflow` when every slot is in use.
  std::size_t acquire_slot() {
    std::size_t const slot = slots_.acquire("cpu_batched_llama");
    cpu_llama_sequence& s = sequences_[slot];
    if (s.cache().n_layers() == 0) {
      try {
        s = model_.make_sequence();  // allocates nothing large
      } catch (...) {
        slots_.release(slot, "cpu_batched_llama");
        throw;
      }
    }
    s.cache().clear();
    return slot;
  }

  //! Frees `slot` for reuse, keeping its memory. Throws `errc::invalid_argument` for a slot not in
  //! use.
  void release_slot(std::size_t slot) {
    slots_.release(slot, "cpu_batched_llama::release_slot");
    sequences_[slot].cache().clear();
  }

  //! The KV cache of `slot`: truncate / keep_path it to commit speculation. Throws
  //! `errc::invalid_argument` for a slot not in use.
  [[nodiscard]] contiguous_cache& cache(std::size_t slot) {
    slots_.check(slot, "cpu_batched_llama::cache");
    return sequences_[slot].cache();
  }
  //! The KV cache of `slot`, read-only.
  [[nodiscard]] contiguous_cache const& cache(std::size_t slot) const {
    slots_.check(slot, "cpu_batched_llama::cache");
    return sequences_[slot].cache();
  }

  //! Holds min(`positions`, max_context()) positions of `slot` in memory ahead of its forwards
  //! (see `cpu_llama::reserve`); throws `errc::out_of_memory`, changing nothing, when the memory
  //! is not there, and `errc::invalid_argument` for a slot not in use.
  void reserve(std::size_t slot, std::size_t positions) {
    slots_.check(slot, "cpu_batched_llama::reserve");
    model_.reserve(sequences_[slot], positions);
  }
  //! Positions `slot`'s buffers hold in memory now.
  [[nodiscard]] std::size_t reserved(std::size_t slot) const {
    slots_.check(slot, "cpu_batched_llama::reserved");
    return sequences_[slot].reserved();
  }

  //! Scores every segment of `req` against its slot's cache in one pass over the weights and
  //! appends each segment's keys and values to its slot's cache (see `batched_lm`). Throws
  //! `specdec::error`, leaving every cache and `out` untouched, for a malformed request
  //! (`batch_forward_request::validate`: no segment, a slot out of range or given twice, a
  //! malformed segment), a slot not in use (`errc::invalid_argument`), or a segment its cache
  //! cannot take (`errc::context_overflow`, "segment s: ...").
  void forward(batch_forward_request const& req, batch_forward_result& out) {
    req.validate(vocab_size(), max_context(), max_slots());
    segments_.clear();
    for (std::size_t s = 0; s < req.segments.size(); ++s) {
      batch_segment const& seg = req.segments[s];
      SPECDEC_CHECK(slots_.in_use(seg.slot), invalid_argument,
                    "cpu_batched_llama::forward: ", "segment ", s, " names slot ", seg.slot,
                    ", which is not in use");
      segments_.push_back({&sequences_[seg.slot], req.request(s)});
    }
    model_.forward(std::span<cpu_llama_segment const>(segments_), out.rows);
    out.set_offsets(req);
  }

  //! The underlying model (its own single-sequence cache is separate from the slots').
  [[nodiscard]] cpu_llama& model() noexcept { return model_; }
  //! The underlying model, read-only.
  [[nodiscard]] cpu_llama const& model() const noexcept { return model_; }

 private:
  cpu_llama model_;
  slot_allocator slots_;
  std::vector<cpu_llama_sequence> sequences_;  // [max_slots], made on first use
  std::vector<cpu_llama_segment> segments_;    // the forward in progress
};

}  // namespace specdec
