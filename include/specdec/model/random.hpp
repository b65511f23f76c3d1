#pragma once
//! \file
//! Llama models with random weights of any shape, built in memory: what benchmarks and tests use
//! to run the real shapes of models that are not available as files (see also the
//! specdec-randmodel tool, which writes them to disk).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numbers>
#include <span>
#include <thread>
#include <vector>

#include "specdec/core/philox.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/weight_storage.hpp"

namespace specdec {

//! Fills `out` with N(0, stddev^2) values: element i of the stream is a Box-Muller transform of
//! words of Philox4x32-10 block (first + i) / 4 of stream `stream` under `seed`. Deterministic
//! and position-addressed: filling a range in pieces (with `first` a multiple of 4 at each piece)
//! gives the same values as filling it at once.
inline void fill_normal(std::span<float> out, std::uint64_t seed, std::uint64_t stream,
                        float stddev, std::uint64_t first = 0) noexcept {
  constexpr float two_pi = 2.0f * std::numbers::pi_v<float>;
  auto const key0 = static_cast<std::uint32_t>(seed), key1 = static_cast<std::uint32_t>(seed >> 32);
  std::size_t i = 0;
  std::uint64_t block = first / 4;
  std::size_t skip = static_cast<std::size_t>(first % 4);  // elements of the first block to drop
  for (; i < out.size(); ++block) {
    philox_block const r = philox4x32_10(
        philox_block{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                      static_cast<std::uint32_t>(stream),
                      static_cast<std::uint32_t>(stream >> 32)}},
        key0, key1);
    float values[4];
    for (int pair = 0; pair < 2; ++pair) {
      float const u1 = 1.0f - word_to_uniform(r.v[2 * pair]);  // (0, 1]
      float const u2 = word_to_uniform(r.v[2 * pair + 1]);
      float const radius = stddev * std::sqrt(-2.0f * std::log(u1));
      values[2 * pair] = radius * std::cos(two_pi * u2);
      values[2 * pair + 1] = radius * std::sin(two_pi * u2);
    }
    for (std::size_t j = skip; j < 4 && i < out.size(); ++j) out[i++] = values[j];
    skip = 0;
  }
}

//! A Llama model of shape `config` with random weights: every matrix N(0, stddev^2) (small, so
//! that a forward pass stays numerically sane), every RMSNorm weight 1. Deterministic in `seed`;
//! each tensor has its own Philox stream, so a tensor's values do not depend on the other shapes
//! (the embedding of two models that differ only in n_layers is the same). The classifier is a
//! separate random matrix unless `config.shared_classifier`. Generation uses every core (the
//! values do not depend on the thread count). Throws `errc::bad_file` for an
//! invalid config (see `llama_config::validate`).
[[nodiscard]] inline llama_weights make_random_llama(llama_config const& config, std::uint64_t seed,
                                                     float stddev = 0.02f) {
  config.validate("make_random_llama");
  auto const d = static_cast<std::size_t>(config.dim),
             h = static_cast<std::size_t>(config.hidden_dim),
             kv = static_cast<std::size_t>(config.kv_dim()),
             v = static_cast<std::size_t>(config.vocab_size);
  auto storage = std::make_shared<detail::weight_storage>();
  float* next = storage->allocate(config.parameter_count());
  auto const take = [&](std::size_t count) {
    float* const p = next;
    next += count;
    return std::span<float>(p, count);
  };
  struct job {
    std::span<float> out;
    std::uint64_t stream;
  };
  std::vector<job> jobs;
  auto const matrix = [&](std::size_t count, std::uint64_t stream) -> float const* {
    auto const s = take(count);
    jobs.push_back({s, stream});
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
  SPECDEC_ASSERT(next == storage->owned.get() + storage->owned_size);

  // Fill the matrices on every core, in chunks of whole Philox blocks; each value depends only on
  // (seed, stream, index), so the result does not depend on the number of threads.
  constexpr std::size_t chunk = std::size_t{1} << 20;
  struct piece {
    std::size_t job, begin;
  };
  std::vector<piece> pieces;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    for (std::size_t b = 0; b < jobs[j].out.size(); b += chunk) pieces.push_back({j, b});
  }
  std::atomic<std::size_t> cursor{0};
  auto const work = [&] {
    for (std::size_t p; (p = cursor.fetch_add(1)) < pieces.size();) {
      auto const& [j, begin] = pieces[p];
      auto const out = jobs[j].out.subspan(begin, std::min(chunk, jobs[j].out.size() - begin));
      fill_normal(out, seed, jobs[j].stream, stddev, begin);
    }
  };
  std::size_t const threads =
      std::min<std::size_t>(std::max(1u, std::thread::hardware_concurrency()), pieces.size());
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  w.storage = std::move(storage);
  return w;
}

}  // namespace specdec
