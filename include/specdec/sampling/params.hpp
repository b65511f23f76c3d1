#pragma once
//! \file
//! `sampling_params`: the parameters of a `sampler` (sampling/policy.hpp), on their own so that
//! code that only carries them (the CUDA sampling kernels, reference/) does not pull in the host
//! sampling kernels.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"

namespace specdec {

//! The parameters of a `sampler`. Defaults leave the distribution untouched (plain softmax).
struct sampling_params {
  float temperature = 1.0f;  //!< >= 0, finite; 0 = greedy (argmax of the processed logits)
  std::int32_t top_k = 0;    //!< >= 0; keep the k most likely tokens; 0 = off
  float top_p = 1.0f;        //!< in (0, 1]; keep the smallest set with mass >= top_p; 1 = off
  float min_p = 0.0f;        //!< in [0, 1]; drop tokens with prob < min_p * max prob; 0 = off
  //! > 0, finite; CTRL / HF rule for tokens in the history: logit > 0 ? l / r : l * r; 1 = off
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;  //!< finite; l -= f * count(token in history); 0 = off
  float presence_penalty = 0.0f;   //!< finite; l -= p if the token is in the history; 0 = off
  //! The penalties' window: they count only the last `penalty_last_n` tokens of the history (the
  //! committed tokens, then the draft path to the row's node); 0 = the whole history.
  std::size_t penalty_last_n = 0;
  //! (token, bias) pairs: l += bias. Token ids >= 0 (checked against the vocabulary per row);
  //! a bias is finite or -inf (which bans the token). Repeated tokens add up, in order.
  std::vector<std::pair<token_id, float>> logit_bias;

  //! The part of `history` the penalties count (`penalty_last_n`).
  [[nodiscard]] std::span<token_id const> penalty_window(
      std::span<token_id const> history) const noexcept {
    return penalty_last_n == 0 || history.size() <= penalty_last_n ? history
                                                                   : history.last(penalty_last_n);
  }

  //! Throws `errc::invalid_argument` naming the field and its value when a parameter is outside
  //! its domain, and `errc::out_of_range` for a negative token id in `logit_bias`.
  void validate() const {
    auto const finite = [](float v) { return std::isfinite(v); };
    SPECDEC_CHECK(finite(temperature) && temperature >= 0.0f, invalid_argument,
                  "sampling_params: temperature = ", temperature, " must be finite and >= 0");
    SPECDEC_CHECK(top_k >= 0, invalid_argument, "sampling_params: top_k = ", top_k,
                  " must be >= 0 (0 = off)");
    SPECDEC_CHECK(top_p > 0.0f && top_p <= 1.0f, invalid_argument,
                  "sampling_params: top_p = ", top_p, " must be in (0, 1] (1 = off)");
    SPECDEC_CHECK(min_p >= 0.0f && min_p <= 1.0f, invalid_argument,
                  "sampling_params: min_p = ", min_p, " must be in [0, 1] (0 = off)");
    SPECDEC_CHECK(finite(repetition_penalty) && repetition_penalty > 0.0f, invalid_argument,
                  "sampling_params: repetition_penalty = ", repetition_penalty,
                  " must be finite and > 0 (1 = off)");
    SPECDEC_CHECK(finite(frequency_penalty), invalid_argument,
                  "sampling_params: frequency_penalty = ", frequency_penalty, " must be finite");
    SPECDEC_CHECK(finite(presence_penalty), invalid_argument,
                  "sampling_params: presence_penalty = ", presence_penalty, " must be finite");
    for (std::size_t i = 0; i < logit_bias.size(); ++i) {
      auto const [token, bias] = logit_bias[i];
      SPECDEC_CHECK(token >= 0, out_of_range, "sampling_params: logit_bias[", i, "] has token id ",
                    token, " (negative)");
      SPECDEC_CHECK(finite(bias) || bias == -std::numeric_limits<float>::infinity(),
                    invalid_argument, "sampling_params: logit_bias[", i, "] (token ", token,
                    ") = ", bias, " must be finite or -inf");
    }
  }
};

}  // namespace specdec
