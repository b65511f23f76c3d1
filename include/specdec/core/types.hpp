#pragma once
//! \file
//! Small value types shared by every part of specdec.

#include <cstddef>
#include <cstdint>
#include <limits>

namespace specdec {

//! A token id. Valid ids are in [0, vocab_size); 32 bits so that any vocabulary fits.
using token_id = std::int32_t;

//! An absolute position in a sequence (0 = the first token of the prompt).
using position_t = std::int32_t;

//! A node index in a draft tree (0 = the root).
using node_index = std::int32_t;

//! The value used where no token is present.
inline constexpr token_id no_token = -1;

//! The largest draft tree specdec accepts (nodes, root included). Bounds every per-step buffer.
inline constexpr std::size_t max_tree_nodes = 4096;

//! Tag of the overloads (`sampler::distribution`, the sampling verifiers' `verify`) for callers
//! that have checked every token id of the history they pass against the vocabulary themselves,
//! e.g. a decoder whose committed tokens were all checked as they were committed.
struct history_checked_t {
  explicit history_checked_t() = default;
};
//! The `history_checked_t` value.
inline constexpr history_checked_t history_checked{};

//! Number of 64-bit words in one row of a bit-packed [n, n] visibility mask.
[[nodiscard]] constexpr std::size_t mask_words(std::size_t n) noexcept {
  return (n + 63) / 64;
}

}  // namespace specdec
