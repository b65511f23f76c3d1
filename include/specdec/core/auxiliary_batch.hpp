#pragma once
//! \file
//! `auxiliary_batch`: the batch of one target forward when a proposer scores extra ("auxiliary")
//! tokens beside its draft tree -- lookahead decoding's Jacobi window, for example. The draft
//! tree's nodes come first, with exactly the tree's ancestor mask (they never see an auxiliary
//! token, so their logits, and hence verification, are those of the tree alone); the auxiliary
//! tokens follow, each with its own position and its own visibility row over the whole batch
//! (tree nodes and earlier or later auxiliary tokens alike: the mask need not be a tree).
//!
//! Protocol (see `auxiliary_proposer` in core/concepts.hpp): each step the decoder calls
//! `reset(tree, base, room, position_limit)`, the proposer appends tokens with `add` and sets
//! visibility with `attend`, the decoder calls `finalize` and forwards `tokens()`, `positions()`,
//! `mask()` and `logits_rows()`. The forward appends KV entries for every row; committing keeps the
//! root and the accepted tree nodes only (`kv_cache::keep_path` / `truncate` drop the rest), so the
//! auxiliary entries never outlive the step.
//!
//! Buffers keep their capacity across steps: after the first steps of a request nothing allocates.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"

namespace specdec {

//! A draft tree followed by auxiliary tokens, as one forward batch (see the file comment).
class auxiliary_batch {
 public:
  //! Starts a step: rows [0, tree.size()) are `tree`'s nodes at positions `base + depth` with the
  //! tree's ancestor mask; at most `room` auxiliary tokens may follow, at positions below
  //! `position_limit`. `base` is the root's position (the number of positions already cached).
  void reset(draft_tree const& tree, position_t base, std::size_t room,
             std::size_t position_limit) {
    SPECDEC_CHECK(!tree.empty(), invalid_argument, "auxiliary_batch: the tree has no root");
    SPECDEC_CHECK(base >= 0, out_of_range, "auxiliary_batch: negative base position ", base);
    tree_ = &tree;
    tree_size_ = tree.size();
    base_ = base;
    room_ = std::min(room, max_tree_nodes);
    position_limit_ = position_limit;
    aux_stride_ = mask_words(tree_size_ + room_);
    tokens_.assign(tree.tokens().begin(), tree.tokens().end());
    tree.positions(base, positions_);
    aux_mask_.clear();
    wants_logits_.clear();
    logits_rows_.clear();
    mask_.clear();
    stride_ = 0;
    finalized_ = false;
  }

  //! Appends an auxiliary token at `position` (it sees itself, nothing else until `attend`) and
  //! returns its batch row (>= tree_size()). `wants_logits`: whether the forward returns its logits
  //! (the proposer's `observe` receives them in row order). Throws `errc::context_overflow` beyond
  //! `room()` tokens or at a position >= `position_limit()`, `errc::out_of_range` for a negative
  //! token or position, `errc::invalid_argument` after `finalize`.
  std::size_t add(token_id token, position_t position, bool wants_logits = true) {
    SPECDEC_CHECK(!finalized_, invalid_argument, "auxiliary_batch: add after finalize");
    SPECDEC_CHECK(num_aux() < room_, context_overflow,
                  "auxiliary_batch: no room for auxiliary token ", num_aux(), " (room for ", room_,
                  ")");
    SPECDEC_CHECK(token >= 0, out_of_range, "auxiliary_batch: negative token ", token);
    SPECDEC_CHECK(position >= 0, out_of_range, "auxiliary_batch: negative position ", position);
    SPECDEC_CHECK(static_cast<std::size_t>(position) < position_limit_, context_overflow,
                  "auxiliary_batch: position ", position, " is beyond the limit of ",
                  position_limit_);
    std::size_t const row = tokens_.size();
    tokens_.push_back(token);
    positions_.push_back(position);
    wants_logits_.push_back(wants_logits ? 1 : 0);
    aux_mask_.resize(aux_mask_.size() + aux_stride_, 0);
    set_bit(row, row);
    return row;
  }

  //! Lets auxiliary row `row` attend to batch row `col` (a tree node or an auxiliary token). Tree
  //! rows cannot be changed. Throws `errc::out_of_range` for rows outside the batch.
  void attend(std::size_t row, std::size_t col) {
    SPECDEC_CHECK(row >= tree_size_ && row < size(), out_of_range, "auxiliary_batch: row ", row,
                  " is not an auxiliary row (they are [", tree_size_, ", ", size(), "))");
    SPECDEC_CHECK(col < size(), out_of_range, "auxiliary_batch: column ", col,
                  " is outside the batch of ", size());
    set_bit(row, col);
  }

  //! Whether batch row `row` attends to batch row `col` (tree rows: the tree's ancestor mask).
  [[nodiscard]] bool visible(std::size_t row, std::size_t col) const noexcept {
    if (row >= size() || col >= size()) return false;
    if (row < tree_size_)
      return col < tree_size_ &&
             tree_->is_ancestor_or_self(static_cast<node_index>(col), static_cast<node_index>(row));
    std::size_t const r = row - tree_size_;
    return (aux_mask_[r * aux_stride_ + col / 64] >> (col % 64)) & 1u;
  }

  //! Builds the combined mask and logits rows; called by the decoder once the proposer is done.
  void finalize() {
    std::size_t const n = size();
    stride_ = mask_words(n);
    mask_.assign(n * stride_, 0);
    std::span<std::uint64_t const> const tree_mask = tree_->mask();
    std::size_t const tree_stride = tree_->mask_stride();
    std::size_t const tree_words = mask_words(tree_size_);
    for (std::size_t i = 0; i < tree_size_; ++i)
      std::copy_n(tree_mask.begin() + static_cast<std::ptrdiff_t>(i * tree_stride), tree_words,
                  mask_.begin() + static_cast<std::ptrdiff_t>(i * stride_));
    for (std::size_t r = 0; r < num_aux(); ++r)
      std::copy_n(aux_mask_.begin() + static_cast<std::ptrdiff_t>(r * aux_stride_), stride_,
                  mask_.begin() + static_cast<std::ptrdiff_t>((tree_size_ + r) * stride_));
    logits_rows_.clear();
    std::size_t wanted = 0;
    for (std::uint8_t const w : wants_logits_) wanted += w;
    if (wanted != num_aux()) {
      for (std::size_t i = 0; i < tree_size_; ++i)
        logits_rows_.push_back(static_cast<std::int32_t>(i));
      for (std::size_t r = 0; r < num_aux(); ++r)
        if (wants_logits_[r] != 0)
          logits_rows_.push_back(static_cast<std::int32_t>(tree_size_ + r));
    }
    num_aux_logits_ = wanted;
    finalized_ = true;
  }

  //! Rows of the draft tree (the first rows of the batch).
  [[nodiscard]] std::size_t tree_size() const noexcept { return tree_size_; }
  //! Auxiliary tokens appended so far.
  [[nodiscard]] std::size_t num_aux() const noexcept { return tokens_.size() - tree_size_; }
  //! Rows in the batch (tree + auxiliary).
  [[nodiscard]] std::size_t size() const noexcept { return tokens_.size(); }
  //! Most auxiliary tokens this step may take.
  [[nodiscard]] std::size_t room() const noexcept { return room_; }
  //! Auxiliary positions must be below this.
  [[nodiscard]] std::size_t position_limit() const noexcept { return position_limit_; }
  //! The root's position.
  [[nodiscard]] position_t base() const noexcept { return base_; }
  //! Auxiliary rows whose logits the forward returns (after `finalize`).
  [[nodiscard]] std::size_t num_aux_logits() const noexcept { return num_aux_logits_; }

  //! [size()] token ids, tree nodes first.
  [[nodiscard]] std::span<token_id const> tokens() const noexcept { return tokens_; }
  //! [size()] positions.
  [[nodiscard]] std::span<position_t const> positions() const noexcept { return positions_; }
  //! [size(), mask_stride()] bit-packed visibility (after `finalize`).
  [[nodiscard]] std::span<std::uint64_t const> mask() const noexcept { return mask_; }
  //! Words per mask row (after `finalize`).
  [[nodiscard]] std::size_t mask_stride() const noexcept { return stride_; }
  //! Batch rows that need logits: every tree row, then the auxiliary rows that want them; empty
  //! when every row wants logits (after `finalize`).
  [[nodiscard]] std::span<std::int32_t const> logits_rows() const noexcept { return logits_rows_; }

 private:
  void set_bit(std::size_t row, std::size_t col) noexcept {
    std::size_t const r = row - tree_size_;
    aux_mask_[r * aux_stride_ + col / 64] |= std::uint64_t{1} << (col % 64);
  }

  draft_tree const* tree_ = nullptr;
  std::size_t tree_size_ = 0;
  position_t base_ = 0;
  std::size_t room_ = 0;
  std::size_t position_limit_ = 0;
  std::size_t aux_stride_ = 0;  //!< words per auxiliary row while building
  std::size_t stride_ = 0;      //!< words per row of the combined mask
  std::size_t num_aux_logits_ = 0;
  bool finalized_ = false;
  std::vector<token_id> tokens_;
  std::vector<position_t> positions_;
  std::vector<std::uint64_t> aux_mask_;  //!< [num_aux, aux_stride_]
  std::vector<std::uint8_t> wants_logits_;
  std::vector<std::int32_t> logits_rows_;
  std::vector<std::uint64_t> mask_;  //!< [size, stride_]
};

}  // namespace specdec
