#pragma once
//! \file
//! The request and result of one `batched_lm::forward` call: several sequences scored at once,
//! each segment with its own tokens, positions and visibility mask against its own slot's KV
//! cache. A serving loop batches many requests into one forward this way, so that the model's
//! weights are read once per step for all of them.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"

namespace specdec {

//! One sequence's part of a batched forward: `request` scored against the KV cache of slot `slot`,
//! exactly as a single sequence's forward scores it against its own cache (see `forward_request`
//! for the mask, the logits rows, the hidden rows and the variants). A segment's mask covers its
//! own tokens only: a sequence never sees another's.
struct batch_segment {
  std::size_t slot = 0;     //!< the sequence slot whose cache is used
  forward_request request;  //!< what the segment scores, and what it returns besides logits

  //! Rows of logits the segment returns.
  [[nodiscard]] std::size_t logits_count() const noexcept {
    return request.logits_rows.empty() ? request.tokens.size() : request.logits_rows.size();
  }
};

//! Several sequences for one forward pass. Segments are scored as if each were alone, in one pass.
struct batch_forward_request {
  std::span<batch_segment const> segments = {};  //!< [segments], each on a different slot

  //! Segment s's request.
  [[nodiscard]] forward_request const& request(std::size_t s) const noexcept {
    return segments[s].request;
  }

  //! Throws `specdec::error` when the request is malformed for a model of this vocabulary, context
  //! length and number of slots: no segment, a slot out of range or used twice, a segment whose
  //! request `forward_request::validate` refuses (its message prefixed with "segment s: "), or
  //! segments that ask for other hidden rows or skipped layers than segment 0
  //! (`forward_request::same_outputs`).
  void validate(std::size_t vocab, std::size_t max_context, std::size_t max_slots) const {
    SPECDEC_CHECK(!segments.empty(), invalid_argument, "batch_forward_request: no segments");
    for (std::size_t s = 0; s < segments.size(); ++s) {
      SPECDEC_CHECK(segments[s].slot < max_slots, out_of_range, "batch_forward_request: segment ",
                    s, " names slot ", segments[s].slot, " of ", max_slots);
      for (std::size_t j = 0; j < s; ++j)
        SPECDEC_CHECK(segments[j].slot != segments[s].slot, invalid_argument,
                      "batch_forward_request: segments ", j, " and ", s, " both use slot ",
                      segments[s].slot);
      try {
        segments[s].request.validate(vocab, max_context);
      } catch (error const& e) {
        throw detail::with_context(e, detail::concat("segment ", s, ": "));
      }
      SPECDEC_CHECK(segments[s].request.same_outputs(segments[0].request), invalid_argument,
                    "batch_forward_request: segment ", s,
                    " asks for other hidden rows or skipped layers than segment 0 (a batched "
                    "forward runs its layers once for every segment)");
    }
  }

  //! Tokens in all segments.
  [[nodiscard]] std::size_t num_tokens() const noexcept {
    std::size_t n = 0;
    for (batch_segment const& s : segments) n += s.request.tokens.size();
    return n;
  }
};

//! What a batched forward returns: the rows of every segment one after the other. Owns its
//! buffers and reuses them across calls.
struct batch_forward_result {
  //! Logits [sum of logits_count(), vocab] (segment s's rows from logits_offsets[s]); hidden
  //! [num_tokens, hidden_size] when want_hidden (segment s's from token_offsets[s]).
  forward_result rows;
  std::vector<std::size_t> logits_offsets;  //!< [segments + 1] first logits row of each segment
  std::vector<std::size_t> token_offsets;   //!< [segments + 1] first token (hidden row) of each

  //! Sets the offsets for `req` (called by the model's forward).
  void set_offsets(batch_forward_request const& req) {
    std::size_t const n = req.segments.size();
    logits_offsets.resize(n + 1);
    token_offsets.resize(n + 1);
    logits_offsets[0] = token_offsets[0] = 0;
    for (std::size_t s = 0; s < n; ++s) {
      logits_offsets[s + 1] = logits_offsets[s] + req.segments[s].logits_count();
      token_offsets[s + 1] = token_offsets[s] + req.segments[s].request.tokens.size();
    }
  }

  //! Number of segments of the last forward.
  [[nodiscard]] std::size_t segments() const noexcept {
    return logits_offsets.empty() ? 0 : logits_offsets.size() - 1;
  }
  //! Segment s's logits rows: [logits_count(), vocab], in its request order. Unchecked s.
  [[nodiscard]] matrix_view<float const> logits(std::size_t s) const noexcept {
    return matrix_view<float const>(rows.logits.data() + logits_offsets[s] * rows.vocab,
                                    logits_offsets[s + 1] - logits_offsets[s], rows.vocab);
  }
  //! Segment s's hidden rows: [tokens, hidden_size], or empty without want_hidden. Unchecked s.
  [[nodiscard]] matrix_view<float const> hidden(std::size_t s) const noexcept {
    if (rows.hidden.empty() || rows.hidden_size == 0) return {};
    return matrix_view<float const>(rows.hidden.data() + token_offsets[s] * rows.hidden_size,
                                    token_offsets[s + 1] - token_offsets[s], rows.hidden_size);
  }
  //! Segment s's residual streams of the requested layers: [tokens, layers x hidden_size] (see
  //! `forward_result::layer_hidden`), or empty without `hidden_layers`. Unchecked s.
  [[nodiscard]] matrix_view<float const> layer_hidden(std::size_t s) const noexcept {
    matrix_view<float const> const all = rows.layer_hidden_view();
    if (all.empty()) return {};
    return matrix_view<float const>(all.data() + token_offsets[s] * all.cols(),
                                    token_offsets[s + 1] - token_offsets[s], all.cols());
  }
};

}  // namespace specdec
