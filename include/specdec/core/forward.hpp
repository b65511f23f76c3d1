#pragma once
//! \file
//! The request and result of one `causal_lm::forward` call: a batch of tokens at given positions,
//! with an explicit per-token visibility mask over the batch, scored against the model's cache.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"

namespace specdec {

//! A bounded view of the cache for one forward (sparse-KV drafting, as MagicDec and TriForce
//! draft with the target itself): the batch's tokens attend to the cache positions the view
//! selects instead of all of them -- the first `sinks` (attention sinks), the blocks listed in
//! `blocks` (block b is positions [b * block_size, (b + 1) * block_size)), the positions a
//! selection lists for the layer and kv head (`positions`: SnapKV's and TriForce's selections
//! differ per head), and the last `window` -- and to the batch's own tokens as the mask says. A
//! position selected more than once is seen once; attention runs over the selected positions in
//! position order. Keys keep the positions they were cached at and queries use the request's
//! positions: positions stay absolute, so a view changes what a token sees, never where anything
//! is. The default (empty) view is the whole cache. A model honours a view only if it declares
//! `supports_kv_view` (core/traits.hpp).
struct kv_view {
  std::size_t sinks = 0;                      //!< leading positions always seen
  std::size_t window = 0;                     //!< trailing positions of the cache seen
  std::size_t block_size = 0;                 //!< positions per block (> 0 when blocks are given)
  std::span<std::int32_t const> blocks = {};  //!< selected blocks, strictly ascending
  //! [layers, kv_heads, per_head] positions selected per layer and kv head (list l * kv_heads +
  //! g), each list strictly ascending; empty for none.
  std::span<std::int32_t const> positions = {};
  std::size_t per_head = 0;  //!< positions per list of `positions` (> 0 when it is given)

  //! Whether the view is the whole cache (nothing selected: the default).
  [[nodiscard]] bool empty() const noexcept {
    return sinks == 0 && window == 0 && blocks.empty() && positions.empty();
  }

  //! The most runs of consecutive positions `for_each_run` makes (sinks, each block, each listed
  //! position, window).
  [[nodiscard]] std::size_t max_runs() const noexcept { return 2 + blocks.size() + per_head; }

  //! Calls `add(first, count)` for each run of consecutive positions the view selects in a cache
  //! of `size` positions for list `list` of `positions` (layer l, kv head g: l * kv_heads + g;
  //! ignored without `positions`), in ascending order, disjoint. A block that ends past the cache
  //! is cut at the cache's end, a listed position past it skipped.
  template <class Add>
  void for_each_run(std::size_t size, Add&& add, std::size_t list = 0) const {
    std::size_t covered = 0;  // positions [0, covered) are done
    auto const put = [&](std::size_t first, std::size_t end) {
      first = std::max(first, covered);
      end = std::min(end, size);
      if (first >= end) return;
      add(first, end - first);
      covered = end;
    };
    put(0, sinks);
    std::span<std::int32_t const> const listed =
        positions.empty() ? positions : positions.subspan(list * per_head, per_head);
    std::size_t const window_first = size - std::min(window, size);
    bool window_done = window == 0;
    std::size_t b = 0, p = 0;  // the next block and listed position
    while (b < blocks.size() || p < listed.size()) {
      bool const block_next =
          p == listed.size() ||
          (b < blocks.size() &&
           static_cast<std::size_t>(blocks[b]) * block_size <= static_cast<std::size_t>(listed[p]));
      std::size_t const first = block_next ? static_cast<std::size_t>(blocks[b]) * block_size
                                           : static_cast<std::size_t>(listed[p]);
      if (!window_done && first >= window_first) {
        put(window_first, size);
        window_done = true;
      }
      if (block_next) {
        put(first, first + block_size);
        ++b;
      } else {
        put(first, first + 1);
        ++p;
      }
    }
    if (!window_done) put(window_first, size);
  }

  //! The number of positions the view selects in a cache of `size` positions for list `list`.
  [[nodiscard]] std::size_t rows(std::size_t size, std::size_t list = 0) const {
    std::size_t total = 0;
    for_each_run(
        size, [&](std::size_t, std::size_t count) { total += count; }, list);
    return total;
  }

  //! The most positions any list's view selects in a cache of `size` positions (a bound).
  [[nodiscard]] std::size_t max_rows(std::size_t size) const noexcept {
    return std::min(size, sinks + blocks.size() * block_size + per_head + window);
  }

  //! Throws `specdec::error` unless the view fits a model of `max_context` positions: blocks
  //! strictly ascending, non-negative and starting inside the context, a positive block size when
  //! blocks are given; listed positions whole lists of `per_head`, each strictly ascending, inside
  //! the context.
  void validate(std::size_t max_context) const {
    SPECDEC_CHECK(blocks.empty() || block_size > 0, invalid_argument, "kv_view: ", blocks.size(),
                  " blocks of size 0");
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      SPECDEC_CHECK(blocks[i] >= 0, out_of_range, "kv_view: block ", i, " is ", blocks[i]);
      SPECDEC_CHECK(i == 0 || blocks[i - 1] < blocks[i], invalid_argument,
                    "kv_view: blocks must be strictly ascending (entry ", i, ": ", blocks[i - 1],
                    " then ", blocks[i], ")");
      SPECDEC_CHECK(
          static_cast<std::size_t>(blocks[i]) < (max_context + block_size - 1) / block_size,
          out_of_range, "kv_view: block ", blocks[i], " of ", block_size,
          " positions starts outside the context of ", max_context);
    }
    SPECDEC_CHECK(
        (per_head == 0) == positions.empty() && (per_head == 0 || positions.size() % per_head == 0),
        invalid_argument, "kv_view: ", positions.size(),
        " listed positions are no whole number of lists of ", per_head);
    for (std::size_t i = 0; i < positions.size(); ++i) {
      SPECDEC_CHECK(positions[i] >= 0 && static_cast<std::size_t>(positions[i]) < max_context,
                    out_of_range, "kv_view: listed position ", positions[i], " (list ",
                    i / per_head, ", entry ", i % per_head, ") is outside the context of ",
                    max_context);
      SPECDEC_CHECK(i % per_head == 0 || positions[i - 1] < positions[i], invalid_argument,
                    "kv_view: list ", i / per_head, " must be strictly ascending (entry ",
                    i % per_head, ": ", positions[i - 1], " then ", positions[i], ")");
    }
  }

  //! What `validate(max_context)` leaves to the model: throws `errc::out_of_range` for a block
  //! that starts, or a listed position that lies, at or past the end of a cache of `size`
  //! positions (a selection made for another cache or a later step), and
  //! `errc::invalid_argument` unless the lists are one per layer and kv head of the model.
  void check_fits(std::size_t size, std::size_t layers, std::size_t kv_heads) const {
    for (std::size_t i = 0; i < blocks.size(); ++i)
      SPECDEC_CHECK(static_cast<std::size_t>(blocks[i]) * block_size < size, out_of_range,
                    "kv_view: block ", blocks[i], " starts at position ",
                    static_cast<std::size_t>(blocks[i]) * block_size, ", past the cache's ", size,
                    " positions");
    if (positions.empty()) return;
    SPECDEC_CHECK(positions.size() == layers * kv_heads * per_head, invalid_argument,
                  "kv_view: ", positions.size() / per_head, " lists of positions for a model of ",
                  layers, " layers x ", kv_heads, " kv heads (one list each)");
    for (std::size_t i = 0; i < positions.size(); ++i)
      SPECDEC_CHECK(static_cast<std::size_t>(positions[i]) < size, out_of_range,
                    "kv_view: listed position ", positions[i], " (list ", i / per_head,
                    ") is past the cache's ", size, " positions");
  }
};

//! What `forward_request::kv_scores` asks: how much attention the cache positions receive.
enum class kv_score_kind : std::uint8_t {
  none,         //!< nothing (the default)
  probability,  //!< the softmax weight of each position (SnapKV's observation)
  logit,        //!< the scaled dot product q . k / sqrt(head size) (TriForce's chunk scores)
};

//! A request for attention statistics of the cache (`forward_result::kv_scores`): for each layer,
//! kv head and position j of the cache before the batch, the sum over the last `rows` tokens of
//! the batch and over the query heads of the kv head of what `kind` names; a position outside a
//! token's view adds 0, as does a skipped layer. Models that declare `supports_kv_view` honour it
//! for a batch of one sequence.
struct kv_scores_request {
  kv_score_kind kind = kv_score_kind::none;  //!< what to sum; none asks for nothing
  std::size_t rows = 1;                      //!< the last rows of the batch that score (>= 1)
};

//! A batch of tokens for one forward pass.
//!
//! Every token sees every entry already in the model's cache (positions [0, cache().size()), or
//! those `view` selects) and,
//! within the batch, exactly the tokens its mask row marks: bit j of row i (word j / 64 of the row,
//! bit j % 64) lets token i attend to batch token j. A token should see itself. An empty mask
//! means causal: token i sees batch tokens 0..i. A draft tree's ancestor mask is one such mask;
//! lookahead decoding's is not a tree. The forward appends the batch's KV entries to the cache in
//! batch order; the caller then keeps what was accepted (`kv_cache::keep_path` / `truncate`).
struct forward_request {
  std::span<token_id const> tokens = {};  //!< [n] token ids, each < vocab_size()
  std::span<position_t const> positions =
      {};  //!< [n] absolute positions (RoPE), each < max_context()
  std::span<std::uint64_t const> mask = {};  //!< [n, mask_stride] bit-packed, or empty for causal
  std::size_t mask_stride = 0;               //!< words per mask row, >= mask_words(n)
  std::span<std::int32_t const> logits_rows =
      {};                          //!< batch rows that need logits; empty = all rows
  bool want_hidden = false;        //!< also return the final hidden state (after the final norm)
  std::int32_t hidden_layer = -1;  //!< also return the residual stream after this layer (0-based);
                                   //!< the same as hidden_layers = {hidden_layer}
  //! Also return the residual streams after each of these layers (0-based; any order, repeats
  //! allowed), side by side per token in this order (EAGLE-3 reads three layers' features).
  //! At most one of `hidden_layer` and `hidden_layers` may be set.
  std::span<std::int32_t const> hidden_layers = {};
  std::span<std::int32_t const> skip_layers =
      {};  //!< layers to skip, ascending (self-speculation);
           //!< a cache must always see the same skip set
  //! The cache positions the batch attends to (`kv_view`); the default is all of them.
  kv_view view = {};
  //! Attention statistics of the cache to return (`kv_scores_request`); none by default.
  kv_scores_request kv_scores = {};

  //! Throws `specdec::error` when the request is malformed for a model of this vocabulary and
  //! context length (sizes disagree, a token or position out of range, a mask row too short).
  void validate(std::size_t vocab, std::size_t max_context) const {
    std::size_t const n = tokens.size();
    SPECDEC_CHECK(n > 0, invalid_argument, "forward_request: empty batch");
    SPECDEC_CHECK(positions.size() == n, invalid_argument, "forward_request: ", n, " tokens but ",
                  positions.size(), " positions");
    for (std::size_t i = 0; i < n; ++i) {
      SPECDEC_CHECK(tokens[i] >= 0 && static_cast<std::size_t>(tokens[i]) < vocab, out_of_range,
                    "forward_request: token ", tokens[i], " at batch index ", i,
                    " is outside the vocabulary of ", vocab);
      SPECDEC_CHECK(positions[i] >= 0 && static_cast<std::size_t>(positions[i]) < max_context,
                    context_overflow, "forward_request: position ", positions[i],
                    " at batch index ", i, " is outside the context of ", max_context);
    }
    if (!mask.empty()) {
      SPECDEC_CHECK(mask_stride >= mask_words(n), invalid_argument,
                    "forward_request: mask rows of ", mask_stride,
                    " words cannot cover a batch of ", n);
      SPECDEC_CHECK(mask.size() >= n * mask_stride, invalid_argument, "forward_request: mask has ",
                    mask.size(), " words, need ", n * mask_stride);
    }
    for (std::size_t i = 1; i < skip_layers.size(); ++i)
      SPECDEC_CHECK(skip_layers[i - 1] < skip_layers[i], invalid_argument,
                    "forward_request: skip_layers must be strictly ascending (entry ", i, ")");
    for (std::int32_t r : logits_rows)
      SPECDEC_CHECK(r >= 0 && static_cast<std::size_t>(r) < n, out_of_range,
                    "forward_request: logits row ", r, " is outside the batch of ", n);
    SPECDEC_CHECK(hidden_layer < 0 || hidden_layers.empty(), invalid_argument,
                  "forward_request: hidden_layer and hidden_layers are both set");
    SPECDEC_CHECK(hidden_layer >= -1, out_of_range, "forward_request: hidden_layer ", hidden_layer,
                  " (-1 asks for none)");
    view.validate(max_context);
    SPECDEC_CHECK(
        kv_scores.kind == kv_score_kind::none || (kv_scores.rows >= 1 && kv_scores.rows <= n),
        out_of_range, "forward_request: kv_scores over the last ", kv_scores.rows,
        " rows of a batch of ", n);
  }

  //! As above, and for a model of `n_layers` layers: throws `errc::out_of_range` for a hidden
  //! layer (`hidden_layer`, `hidden_layers`) or a skipped layer outside [0, n_layers).
  void validate(std::size_t vocab, std::size_t max_context, std::size_t n_layers) const {
    validate(vocab, max_context);
    auto const check = [&](std::int32_t l, char const* what) {
      SPECDEC_CHECK(l >= 0 && static_cast<std::size_t>(l) < n_layers, out_of_range,
                    "forward_request: ", what, " ", l, " is outside the model's ", n_layers,
                    " layers");
    };
    for (std::int32_t l : requested_layers()) check(l, "hidden layer");
    for (std::int32_t l : skip_layers) check(l, "skip layer");
  }

  //! The layers whose residual streams the result holds, in order: `hidden_layers`, or
  //! {hidden_layer} when that is set (>= 0), else none. Points into this request.
  [[nodiscard]] std::span<std::int32_t const> requested_layers() const noexcept {
    if (!hidden_layers.empty()) return hidden_layers;
    if (hidden_layer >= 0) return std::span<std::int32_t const>(&hidden_layer, 1);
    return {};
  }

  //! Whether `other` asks for the same rows besides logits and the same variant of the forward
  //! (hidden rows, requested layers, skipped layers): what the segments of one multi-sequence
  //! forward share, since the model runs its layers once for all of them.
  [[nodiscard]] bool same_outputs(forward_request const& other) const noexcept {
    auto const equal = [](std::span<std::int32_t const> x, std::span<std::int32_t const> y) {
      return std::equal(x.begin(), x.end(), y.begin(), y.end());
    };
    return want_hidden == other.want_hidden &&
           equal(requested_layers(), other.requested_layers()) &&
           equal(skip_layers, other.skip_layers);
  }

  //! Whether batch token i may attend to batch token j.
  [[nodiscard]] bool visible(std::size_t i, std::size_t j) const noexcept {
    if (mask.empty()) return j <= i;
    return (mask[i * mask_stride + j / 64] >> (j % 64)) & 1u;
  }
};

//! What a forward pass returns. Owns its buffers and reuses them across calls.
struct forward_result {
  std::vector<float> logits;  //!< [logits_count, vocab] row-major
  std::vector<float> hidden;  //!< [n, hidden_size] when want_hidden, else empty
  //! [n, layers x hidden_size] the residual streams of `forward_request::requested_layers()`,
  //! side by side per token (row t: layer 0's stream, then layer 1's, ...), else empty.
  std::vector<float> layer_hidden;
  std::size_t vocab = 0;
  std::size_t hidden_size = 0;
  std::size_t logits_count = 0;  //!< rows in `logits`: n, or logits_rows.size()
  std::size_t layer_count = 0;   //!< layers in `layer_hidden` (0 when empty)
  //! [layers, kv_score_heads, kv_score_positions] the statistics `forward_request::kv_scores`
  //! asked for (position j of the cache before the batch), else empty.
  std::vector<float> kv_scores;
  std::size_t kv_score_heads = 0;      //!< kv heads per layer in `kv_scores`
  std::size_t kv_score_positions = 0;  //!< cache positions per kv head in `kv_scores`

  //! Logits rows, in request order (row r = batch token r, or logits_rows[r] when given).
  [[nodiscard]] matrix_view<float const> logits_view() const {
    return matrix_view<float const>(logits.data(), logits_count, vocab);
  }
  [[nodiscard]] matrix_view<float const> hidden_view() const {
    return hidden_size == 0 || hidden.empty()
               ? matrix_view<float const>()
               : matrix_view<float const>(hidden.data(), hidden.size() / hidden_size, hidden_size);
  }
  //! [n, layer_count x hidden_size] the requested layers' residual streams (see `layer_hidden`).
  [[nodiscard]] matrix_view<float const> layer_hidden_view() const {
    std::size_t const width = std::max<std::size_t>(layer_count, 1) * hidden_size;
    return width == 0 || layer_hidden.empty()
               ? matrix_view<float const>()
               : matrix_view<float const>(layer_hidden.data(), layer_hidden.size() / width, width);
  }
};

}  // namespace specdec
