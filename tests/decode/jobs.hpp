#pragma once
// The requests of the batched decoding tests: a prompt, a sampling policy and a configuration.

#include <cstdint>
#include <vector>

#include "specdec/core/types.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/sampling/policy.hpp"

namespace decode_test {

// One request of a test: its prompt, policy, configuration.
struct job {
  std::vector<specdec::token_id> prompt;
  specdec::sampler policy;
  specdec::decode_config config;
};

// The sampling policy of `temperature`, `top_p` and `top_k` (0: no top-k).
inline specdec::sampler policy_of(float temperature, float top_p = 1.0f, std::int32_t top_k = 0) {
  specdec::sampling_params p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  return specdec::sampler(p);
}

}  // namespace decode_test
