#pragma once
//! \file
//! The virtual sequence of cache rows a token attends to (`row_run`, `virtual_sequence`) and the
//! constants attention's kernels (backend/cpu/kernels/attention.inl) share with their callers.
//! Internal to backend/cpu.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "specdec/core/forward.hpp"
#include "specdec/core/types.hpp"

namespace specdec::detail::cpu {

// ---- attention over a virtual sequence: the cache rows a token sees, in position order (all
// the cached rows, then the batch rows its mask allows). Scores, softmax and values are summed in
// the order of that sequence, so a token's result does not depend on where its visible rows sit
// in the cache or in the batch.

//! A run of consecutive cache rows [row, row + count) in a virtual sequence.
struct row_run {
  std::size_t row;
  std::size_t count;
};

//! Builds a virtual sequence as runs into `runs` (room enough), merging consecutive rows.
struct row_runs {
  row_run* runs;
  std::size_t count = 0;   //!< runs so far
  std::size_t length = 0;  //!< rows so far

  //! Appends rows [row, row + n).
  void add(std::size_t row, std::size_t n) noexcept {
    if (count > 0 && runs[count - 1].row + runs[count - 1].count == row)
      runs[count - 1].count += n;
    else
      runs[count++] = {row, n};
    length += n;
  }
  //! Appends the rows `base` + j for every bit j set in the first `bits` bits of `mask`.
  void add_bits(std::uint64_t const* mask, std::size_t bits, std::size_t base) noexcept {
    for (std::size_t word = 0; word < (bits + 63) / 64; ++word) {
      std::uint64_t m = mask[word];
      if (word == bits / 64 && bits % 64 != 0) m &= (std::uint64_t{1} << (bits % 64)) - 1;
      for (; m != 0; m &= m - 1)
        add(base + word * 64 + static_cast<std::size_t>(std::countr_zero(m)), 1);
    }
  }
};

//! The index of the last batch token that batch token t of `req` sees.
[[nodiscard]] inline std::size_t last_visible(forward_request const& req, std::size_t t) noexcept {
  if (req.mask.empty()) return t;
  std::size_t const n = req.tokens.size();
  std::uint64_t const* row = req.mask.data() + t * req.mask_stride;
  for (std::size_t word = mask_words(n); word-- > 0;) {
    std::uint64_t bits = row[word];
    if (word == n / 64 && n % 64 != 0) bits &= (std::uint64_t{1} << (n % 64)) - 1;
    if (bits != 0) return word * 64 + 63 - static_cast<std::size_t>(std::countl_zero(bits));
  }
  return t;  // unreachable for a validated request: every token sees itself
}

//! The virtual sequence of batch token t of `req` -- the cache rows [0, past) (those of
//! `req.view` when it has one), then the batch rows its mask lets it see, in batch order, at cache
//! rows past + batch index -- as runs of consecutive cache rows into `runs` (room for the batch +
//! 1 + `req.view.max_runs()`); returns the number of runs and sets `length` to the sequence's
//! length. `list` names the view's list of positions (layer l, kv head g: l * kv_heads + g).
//! Attention sums over the sequence in its order, so a token's result is the same as when the
//! same tokens sit at consecutive positions.
inline std::size_t virtual_sequence(std::size_t t, forward_request const& req, std::size_t past,
                                    row_run* runs, std::size_t& length,
                                    std::size_t list = 0) noexcept {
  row_runs seq{.runs = runs};
  if (req.view.empty()) {
    if (past > 0) seq.add(0, past);
  } else {
    req.view.for_each_run(
        past, [&](std::size_t row, std::size_t count) { seq.add(row, count); }, list);
  }
  if (req.mask.empty())
    seq.add(past, t + 1);
  else
    seq.add_bits(req.mask.data() + t * req.mask_stride, req.tokens.size(), past);
  length = seq.length;
  return seq.count;
}

//! Compacts the scores s[0, end) by cache row to the virtual sequence `runs`: s[i] becomes the
//! score of the sequence's row i.
inline void compact_scores(float* s, row_run const* runs, std::size_t n_runs) noexcept {
  std::size_t at = 0;
  for (std::size_t r = 0; r < n_runs; ++r) {
    if (runs[r].row != at) std::copy(s + runs[r].row, s + runs[r].row + runs[r].count, s + at);
    at += runs[r].count;
  }
}

//! Scores more than this below their row's largest get a negligible probability: exp(-44) <
//! 2^-63 of the largest, far below float precision (`softmax_rows` makes it 0,
//! `softmax_values8` keeps it at exp(-44)). Smaller ones would make subnormal products with the
//! values, which cost a microcode assist per operation on x86.
inline constexpr float softmax_floor = -44.0f;

//! Most (head, chunk) accumulators of one `attention_values` pass (and query heads of one
//! `attend_heads` call).
inline constexpr std::size_t max_value_accumulators = 8;

}  // namespace specdec::detail::cpu
