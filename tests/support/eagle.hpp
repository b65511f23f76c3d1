#pragma once
// EAGLE heads for the tests of the loader, the head runners, the proposer and the decoder: the
// heads trained for the stories260K fixture (tools/eagle/eagle1 and eagle3, loaded once per
// process), heads of random weights on random targets of other shapes, and the target features a
// head reads, computed by the CPU backend.

#include "support/doctest.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/model/eagle.hpp"
#include "specdec/model/eagle_file.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/random.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"

namespace test_support {

// tools/eagle/<kind> in the source tree ("eagle1" or "eagle3").
inline std::filesystem::path eagle_dir(char const* kind) {
  return source_file((std::string("tools/eagle/") + kind + "/config.json").c_str()).parent_path();
}

// The EAGLE-1 head trained for the fixture, loaded once per process.
inline std::shared_ptr<specdec::eagle_weights const> const& fixture_eagle1() {
  static auto const w = std::make_shared<specdec::eagle_weights const>(
      specdec::load_eagle_head(eagle_dir("eagle1"), fixture::stories260k()));
  return w;
}

// The EAGLE-3 head trained for the fixture, loaded once per process.
inline std::shared_ptr<specdec::eagle_weights const> const& fixture_eagle3() {
  static auto const w = std::make_shared<specdec::eagle_weights const>(
      specdec::load_eagle_head(eagle_dir("eagle3"), fixture::stories260k()));
  return w;
}

// A random target of `shape` (N(0, 0.3^2) weights, norms 1).
inline std::shared_ptr<specdec::llama_weights const> random_target(specdec::llama_config shape,
                                                                   std::uint64_t seed) {
  return std::make_shared<specdec::llama_weights const>(
      specdec::make_random_llama(shape, seed, 0.3f));
}

// A random EAGLE head for `target`: `heads` query heads over `kv_heads`, an MLP of 40, EAGLE-3
// over `draft_vocab` tokens reading the inputs of target layers `layers`; N(0, 0.2^2) weights.
inline std::shared_ptr<specdec::eagle_weights const> random_eagle(
    specdec::eagle_version version, std::shared_ptr<specdec::llama_weights const> target,
    std::size_t heads, std::size_t kv_heads, std::size_t draft_vocab,
    std::vector<std::int32_t> layers, std::uint64_t seed) {
  return std::make_shared<specdec::eagle_weights const>(specdec::make_random_eagle_head(
      version, std::move(target), heads, kv_heads, 40, draft_vocab, std::move(layers), seed, 0.2f));
}

// The features a head of `w` reads for `tokens` (one causal forward of the target from position
// 0): [tokens, feature_width], row i the feature of tokens[i].
inline std::vector<float> target_features(specdec::eagle_weights const& w,
                                          std::span<specdec::token_id const> tokens) {
  specdec::cpu_llama target(w.target, {.threads = 1});
  std::vector<specdec::position_t> positions(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i)
    positions[i] = static_cast<specdec::position_t>(i);
  specdec::forward_request req{.tokens = tokens, .positions = positions};
  if (w.target_layers.empty())
    req.want_hidden = true;
  else
    req.hidden_layers = w.target_layers;
  specdec::forward_result out;
  target.forward(req, out);
  return w.target_layers.empty() ? out.hidden : out.layer_hidden;
}

}  // namespace test_support
