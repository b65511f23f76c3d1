#pragma once
//! \file
//! `softmax`: a numerically stable, vectorisable softmax of one logits row.

#include <cstddef>
#include <span>

#include "specdec/core/error.hpp"
#include "specdec/detail/rows.hpp"

namespace specdec {

//! Numerically stable softmax of `logits` into `probs` (same size): probs[i] = exp(logits[i] - m)
//! / sum_j exp(logits[j] - m) with m the largest logit, so huge logits do not overflow.
//!
//! -inf logits are allowed and get probability 0. A NaN or +inf logit, or a row with no finite
//! entry (an empty row included), throws `errc::numerical` naming the index; sizes that differ,
//! or buffers that partially overlap, throw `errc::invalid_argument`. `probs` may be the same
//! buffer as `logits` (in-place softmax).
//!
//! Accuracy: each probability is within a few float ulp of the exact softmax of the given float
//! logits (exp is evaluated by `detail::exp_nonpositive`; the normaliser is summed in float
//! blocks combined in double). Probabilities below the smallest normal float are flushed to 0.
//! Three passes over the row (max, exp-and-sum, scale); no allocation.
inline void softmax(std::span<float const> logits, std::span<float> probs) {
  SPECDEC_CHECK(logits.size() == probs.size(), invalid_argument, "softmax: ", logits.size(),
                " logits but ", probs.size(), " probabilities");
  SPECDEC_CHECK(
      !detail::partially_overlap(logits.data(), logits.size(), probs.data(), probs.size()),
      invalid_argument, "softmax: logits and probs partially overlap");
  detail::row_summary const s = detail::summarize_row(logits, "softmax");
  double const total = detail::exp_shifted(logits.data(), probs.data(), logits.size(), s.max, 1.0f);
  // total >= 1: the maximum contributes exp(0) = 1 exactly.
  detail::scale_row(probs.data(), probs.data(), probs.size(), static_cast<float>(1.0 / total));
}

}  // namespace specdec
