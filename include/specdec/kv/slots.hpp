#pragma once
//! \file
//! `slot_allocator`: which sequence slots of a batched model (`batched_lm`) are in use. Slots are
//! handed out and taken back in O(1); a released slot is the next one handed out, so its cache,
//! whose memory stays held, serves the next request without growing again.
//!
//! `slotted_model`: a `batched_lm` made of a model that scores several sequences in one forward
//! (over its own segment type) and one sequence state per slot -- the slot bookkeeping both
//! backends' batched models share (`cpu_batched_llama`, `cuda_batched_llama`), each naming its
//! sequence type and how to make one in a `Backend` description.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/batch_forward.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/traits.hpp"

namespace specdec {

//! The in-use set of `size()` sequence slots (see the file comment). Allocates only at
//! construction.
class slot_allocator {
 public:
  //! No slots.
  slot_allocator() = default;

  //! `slots` free slots; the first `acquire` returns slot 0, then 1, ... Throws
  //! `errc::invalid_argument` for 0 slots or more than 2^20.
  explicit slot_allocator(std::size_t slots) : used_(slots, 0) {
    SPECDEC_CHECK(slots >= 1 && slots <= (std::size_t{1} << 20), invalid_argument,
                  "slot_allocator: ", slots, " slots, need 1 to 2^20");
    free_.reserve(slots);
    for (std::size_t s = slots; s-- > 0;) free_.push_back(s);
  }

  //! Slots in all.
  [[nodiscard]] std::size_t size() const noexcept { return used_.size(); }
  //! Slots not in use.
  [[nodiscard]] std::size_t free() const noexcept { return free_.size(); }
  //! Whether `slot` is in use (false for a slot out of range).
  [[nodiscard]] bool in_use(std::size_t slot) const noexcept {
    return slot < used_.size() && used_[slot] != 0;
  }

  //! Marks a free slot in use and returns it: the most recently released one, else the lowest
  //! never used. Throws `errc::context_overflow` (naming `who`) when every slot is in use.
  std::size_t acquire(char const* who) {
    SPECDEC_CHECK(!free_.empty(), context_overflow, who, ": all ", used_.size(),
                  " sequence slots are in use");
    std::size_t const slot = free_.back();
    free_.pop_back();
    used_[slot] = 1;
    return slot;
  }

  //! Frees `slot`. Throws `errc::invalid_argument` (naming `who`) for a slot that is not in use.
  void release(std::size_t slot, char const* who) {
    SPECDEC_CHECK(in_use(slot), invalid_argument, who, ": slot ", slot, " is not in use (of ",
                  used_.size(), " slots)");
    used_[slot] = 0;
    free_.push_back(slot);
  }

  //! Throws `errc::invalid_argument` (naming `who`) unless `slot` is in use.
  void check(std::size_t slot, char const* who) const {
    SPECDEC_CHECK(in_use(slot), invalid_argument, who, ": slot ", slot, " is not in use (of ",
                  used_.size(), " slots)");
  }

 private:
  std::vector<std::uint8_t> used_;  // [slots] 1 = in use
  std::vector<std::size_t> free_;   // free slots, the next one last
};

//! A `batched_lm` over `Backend::model_type`, which scores a span of `Backend::segment_type` in
//! one forward, with one `Backend::sequence_type` per slot (see the file comment). `Backend`
//! describes the backend with static members: `name` (for messages), `made(sequence)` (whether a
//! slot's state was made), `make(model)` (a new sequence state for the model), `cache(sequence)`
//! (its `kv_cache`) and `segment(sequence, request)` (the model's segment scoring the request
//! against it). A slot's state is made on first use and kept when the slot is released.
template <class Backend>
class slotted_model {
 public:
  using model_type = typename Backend::model_type;        //!< the model
  using sequence_type = typename Backend::sequence_type;  //!< one slot's state

  //! Its forward honours what the model's does.
  static constexpr bool supports_skip_layers = model_traits<model_type>::supports_skip_layers;
  //! Its forward honours what the model's does (each segment's view against its own slot).
  static constexpr bool supports_kv_view = model_traits<model_type>::supports_kv_view;

  //! `max_slots` slots (in [1, 2^20]; `errc::invalid_argument` otherwise) over the model
  //! `model_type(model_args...)`.
  template <class... ModelArgs>
  explicit slotted_model(std::size_t max_slots, ModelArgs&&... model_args)
      : model_(std::forward<ModelArgs>(model_args)...), slots_(max_slots) {
    sequences_.resize(max_slots);
    segments_.reserve(std::min<std::size_t>(max_slots, 256));
  }

  //! Vocabulary size (logits per row).
  [[nodiscard]] std::size_t vocab_size() const noexcept { return model_.vocab_size(); }
  //! Positions each slot's cache can hold; every position must be below it.
  [[nodiscard]] std::size_t max_context() const noexcept { return model_.max_context(); }
  //! Width of the hidden rows.
  [[nodiscard]] std::size_t hidden_size() const noexcept { return model_.hidden_size(); }
  //! Most sequences held at once.
  [[nodiscard]] std::size_t max_slots() const noexcept { return slots_.size(); }
  //! Slots not in use.
  [[nodiscard]] std::size_t free_slots() const noexcept { return slots_.free(); }
  //! Whether `slot` is in use.
  [[nodiscard]] bool in_use(std::size_t slot) const noexcept { return slots_.in_use(slot); }

  //! A free slot with an empty cache, now in use (a released slot's memory is reused; a slot's
  //! state is made on its first use, and when that throws -- e.g. `errc::out_of_memory` -- the slot
  //! stays free). Throws `errc::context_overflow` when every slot is in use.
  std::size_t acquire_slot() {
    std::size_t const slot = slots_.acquire(Backend::name);
    sequence_type& s = sequences_[slot];
    if (!Backend::made(s)) {
      try {
        s = Backend::make(model_);
      } catch (...) {
        slots_.release(slot, Backend::name);
        throw;
      }
    }
    Backend::cache(s).clear();
    return slot;
  }

  //! Frees `slot` for reuse, keeping its memory. Throws `errc::invalid_argument` for a slot not in
  //! use.
  void release_slot(std::size_t slot) {
    slots_.release(slot, Backend::name);
    Backend::cache(sequences_[slot]).clear();
  }

  //! The KV cache of `slot`: truncate / keep_path it to commit speculation. Throws
  //! `errc::invalid_argument` for a slot not in use.
  [[nodiscard]] decltype(auto) cache(std::size_t slot) { return Backend::cache(sequence(slot)); }
  //! The KV cache of `slot`, read-only.
  [[nodiscard]] decltype(auto) cache(std::size_t slot) const {
    slots_.check(slot, Backend::name);
    return Backend::cache(sequences_[slot]);
  }

  //! Scores every segment of `req` against its slot's cache in one pass over the weights and
  //! appends each segment's keys and values to its slot's cache (see `batched_lm`). Throws
  //! `specdec::error`, leaving every cache and `out` untouched, for a malformed request
  //! (`batch_forward_request::validate`: no segment, a slot out of range or given twice, a
  //! malformed segment, segments asking for different outputs), a slot not in use
  //! (`errc::invalid_argument`), or a segment its cache cannot take (`errc::context_overflow`,
  //! "segment s: ...").
  void forward(batch_forward_request const& req, batch_forward_result& out) {
    req.validate(vocab_size(), max_context(), max_slots());
    segments_.clear();
    for (std::size_t s = 0; s < req.segments.size(); ++s) {
      batch_segment const& seg = req.segments[s];
      SPECDEC_CHECK(slots_.in_use(seg.slot), invalid_argument, Backend::name, "::forward: segment ",
                    s, " names slot ", seg.slot, ", which is not in use");
      segments_.push_back(Backend::segment(sequences_[seg.slot], seg.request));
    }
    model_.forward(std::span<typename Backend::segment_type const>(segments_), out.rows);
    out.set_offsets(req);
  }

  //! The underlying model (its own single-sequence cache is separate from the slots').
  [[nodiscard]] model_type& model() noexcept { return model_; }
  //! The underlying model, read-only.
  [[nodiscard]] model_type const& model() const noexcept { return model_; }

 protected:
  //! The state of `slot` (throws `errc::invalid_argument` for a slot not in use).
  [[nodiscard]] sequence_type& sequence(std::size_t slot) {
    slots_.check(slot, Backend::name);
    return sequences_[slot];
  }
  //! The state of `slot`, read-only.
  [[nodiscard]] sequence_type const& sequence(std::size_t slot) const {
    slots_.check(slot, Backend::name);
    return sequences_[slot];
  }

 private:
  model_type model_;
  slot_allocator slots_;
  std::vector<sequence_type> sequences_;                  // [max_slots], made on first use
  std::vector<typename Backend::segment_type> segments_;  // the forward in progress
};

}  // namespace specdec
