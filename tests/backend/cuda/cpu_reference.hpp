#pragma once
// Host-side helpers of the CUDA tests, compiled by the C++ compiler (not nvcc): model loading,
// random weights, and the CPU backend's forward as the reference for the CUDA model.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>

#include "specdec/core/forward.hpp"
#include "specdec/core/types.hpp"
#include "specdec/model/llama_weights.hpp"

namespace cuda_test {

// load_model(path) (llama2.c or GGUF).
std::shared_ptr<specdec::llama_weights const> load_weights(std::filesystem::path const& path);

// make_random_llama(config, seed, stddev).
std::shared_ptr<specdec::llama_weights const> random_weights(specdec::llama_config const& config,
                                                             std::uint64_t seed, float stddev);

// A fresh cpu_llama over `weights`: a causal forward over `prefix` (positions 0..), then `req`;
// returns req's result.
specdec::forward_result cpu_forward(std::shared_ptr<specdec::llama_weights const> const& weights,
                                    std::span<specdec::token_id const> prefix,
                                    specdec::forward_request const& req);

}  // namespace cuda_test
