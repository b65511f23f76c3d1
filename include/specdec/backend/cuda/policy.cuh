#pragma once
//! \file
//! A sampling policy on the device: `device_policy`, the parameters as the kernels read them
//! (plain values and device pointers), and `device_sampler`, which validates a `sampling_params`
//! (sampling/params.hpp) as `sampler` does and owns the device copy of its logit-bias list.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/core/types.hpp"
#include "specdec/sampling/params.hpp"

namespace specdec::cuda {

//! A sampling policy as the kernels read it (plain values and device pointers).
struct device_policy {
  bool greedy = false;           //!< temperature 0: one-hot at the argmax of the processed logits
  float inv_temperature = 1.0f;  //!< the host's float(min(1 / T, FLT_MAX)); unused when greedy
  std::int32_t top_k = 0;        //!< 0 = off
  float top_p = 1.0f;            //!< 1 = off
  float min_p = 0.0f;            //!< 0 = off
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  //! The penalties count the last this many tokens of a row's history and path (0 = all).
  std::int32_t penalty_last_n = 0;
  token_id const* bias_tokens = nullptr;  //!< [num_bias] on the device
  float const* bias_values = nullptr;     //!< [num_bias] on the device
  std::int32_t num_bias = 0;              //!< logit-bias entries, applied in order

  //! Whether any penalty is active.
  [[nodiscard]] __host__ __device__ constexpr bool penalties() const noexcept {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
  //! Whether rows need bias or penalty processing before anything else.
  [[nodiscard]] __host__ __device__ constexpr bool processing() const noexcept {
    return num_bias > 0 || penalties();
  }
  //! Whether the distribution truncates (top-k, top-p or min-p).
  [[nodiscard]] __host__ __device__ constexpr bool truncation() const noexcept {
    return top_k > 0 || top_p < 1.0f || min_p > 0.0f;
  }
};

#if defined(__CUDACC__)

//! A `sampling_params` on the device: validates it (as `sampler` does) and owns the device copy of
//! its logit-bias list.
class device_sampler {
 public:
  //! Throws `specdec::error` as `sampler`'s constructor does for bad parameters.
  explicit device_sampler(sampling_params const& params) : params_(params) {
    params_.validate();
    policy_.greedy = params_.temperature == 0.0f;
    double const inv = params_.temperature > 0.0f ? 1.0 / params_.temperature : 0.0;
    policy_.inv_temperature =
        static_cast<float>(std::min(inv, double{std::numeric_limits<float>::max()}));
    policy_.top_k = params_.top_k;
    policy_.top_p = params_.top_p;
    policy_.min_p = params_.min_p;
    policy_.repetition_penalty = params_.repetition_penalty;
    policy_.frequency_penalty = params_.frequency_penalty;
    policy_.presence_penalty = params_.presence_penalty;
    // A window of 2^31 - 1 tokens or more counts every token a row can have.
    policy_.penalty_last_n = static_cast<std::int32_t>(
        std::min<std::size_t>(params_.penalty_last_n, std::numeric_limits<std::int32_t>::max()));
    if (!params_.logit_bias.empty()) {
      std::vector<token_id> tokens;
      std::vector<float> values;
      for (auto const& [t, v] : params_.logit_bias) {
        tokens.push_back(t);
        values.push_back(v);
      }
      bias_tokens_.resize(tokens.size());
      bias_values_.resize(values.size());
      bias_tokens_.upload(std::span<token_id const>(tokens));
      bias_values_.upload(std::span<float const>(values));
      SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
      policy_.bias_tokens = bias_tokens_.data();
      policy_.bias_values = bias_values_.data();
      policy_.num_bias = static_cast<std::int32_t>(tokens.size());
    }
  }

  //! The policy as the kernels read it (valid while this object lives).
  [[nodiscard]] device_policy const& policy() const noexcept { return policy_; }
  //! The host parameters.
  [[nodiscard]] sampling_params const& params() const noexcept { return params_; }

 private:
  sampling_params params_;
  device_policy policy_;
  device_buffer<token_id> bias_tokens_;
  device_buffer<float> bias_values_;
};

#endif  // __CUDACC__

}  // namespace specdec::cuda
