#pragma once
//! \file
//! Llama models with random weights of any shape, built in memory: what benchmarks and tests use
//! to run the real shapes of models that are not available as files (see also the
//! specdec-randmodel tool, which writes them to disk).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numbers>
#include <span>

#include "specdec/core/philox.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! Fills `out` with N(0, stddev^2) values (Box-Muller over Philox4x32-10 blocks of stream
//! `stream` under `seed`). Deterministic: the same (seed, stream) gives the same values.
inline void fill_normal(std::span<float> out, std::uint64_t seed, std::uint64_t stream,
                        float stddev) noexcept {
  constexpr float two_pi = 2.0f * std::numbers::pi_v<float>;
  auto const key0 = static_cast<std::uint32_t>(seed), key1 = static_cast<std::uint32_t>(seed >> 32);
  std::size_t i = 0;
  for (std::uint64_t block = 0; i < out.size(); ++block) {
    philox_block const r = philox4x32_10(
        philox_block{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                      static_cast<std::uint32_t>(stream),
                      static_cast<std::uint32_t>(stream >> 32)}},
        key0, key1);
    for (int pair = 0; pair < 2 && i < out.size(); ++pair) {
      float const u1 = 1.0f - word_to_uniform(r.v[2 * pair]);  // (0, 1]
      float const u2 = word_to_uniform(r.v[2 * pair + 1]);
      float const radius = stddev * std::sqrt(-2.0f * std::log(u1));
      out[i++] = radius * std::cos(two_pi * u2);
      if (i < out.size()) out[i++] = radius * std::sin(two_pi * u2);
    }
  }
}

//! A Llama model of shape `config` with random weights: every matrix N(0, stddev^2) (small, so
//! that a forward pass stays numerically sane), every RMSNorm weight 1. Deterministic in `seed`;
//! each tensor has its own Philox stream, so a tensor's values do not depend on the other shapes
//! (the embedding of two models that differ only in n_layers is the same). The classifier is a
//! separate random matrix unless `config.shared_classifier`. Throws `errc::bad_file` for an
//! invalid config (see `llama_config::validate`).
[[nodiscard]] inline llama_weights make_random_llama(llama_config const& config, std::uint64_t seed,
                                                     float stddev = 0.02f) {
  config.validate("make_random_llama");
  auto const d = static_cast<std::size_t>(config.dim),
             h = static_cast<std::size_t>(config.hidden_dim),
             kv = static_cast<std::size_t>(config.kv_dim()),
             v = static_cast<std::size_t>(config.vocab_size);
  auto storage = std::make_shared<detail::weight_storage>();
  storage->owned.resize(config.parameter_count());
  float* next = storage->owned.data();
  auto const take = [&](std::size_t count) {
    float* const p = next;
    next += count;
    return std::span<float>(p, count);
  };
  auto const matrix = [&](std::size_t count, std::uint64_t stream) -> float const* {
    auto const s = take(count);
    fill_normal(s, seed, stream, stddev);
    return s.data();
  };
  auto const ones = [&](std::size_t count) -> float const* {
    auto const s = take(count);
    for (float& x : s) x = 1.0f;
    return s.data();
  };

  llama_weights w;
  w.config = config;
  w.token_embedding = matrix(v * d, 0);
  w.layers.resize(static_cast<std::size_t>(config.n_layers));
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    auto& layer = w.layers[l];
    std::uint64_t const base = 16 * (l + 1);
    layer.rms_att = ones(d);
    layer.wq = matrix(d * d, base + 0);
    layer.wk = matrix(kv * d, base + 1);
    layer.wv = matrix(kv * d, base + 2);
    layer.wo = matrix(d * d, base + 3);
    layer.rms_ffn = ones(d);
    layer.w1 = matrix(h * d, base + 4);
    layer.w2 = matrix(d * h, base + 5);
    layer.w3 = matrix(h * d, base + 6);
  }
  w.rms_final = ones(d);
  w.classifier = config.shared_classifier ? w.token_embedding : matrix(v * d, 1);
  SPECDEC_ASSERT(next == storage->owned.data() + storage->owned.size());
  w.storage = std::move(storage);
  return w;
}

}  // namespace specdec
