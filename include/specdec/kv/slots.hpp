#pragma once
//! \file
//! `slot_allocator`: which sequence slots of a batched model (`batched_lm`) are in use. Slots are
//! handed out and taken back in O(1); a released slot is the next one handed out, so its cache,
//! whose memory stays held, serves the next request without growing again.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "specdec/core/error.hpp"

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

}  // namespace specdec
