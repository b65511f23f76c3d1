#pragma once
// Medusa and Hydra heads for the tests of the heads runners, the proposers and the decoder: the
// heads trained for the stories260K fixture (tools/heads, loaded once per process, with their
// trees) and heads of random weights of any shape (for shapes the fixture does not have: odd
// widths, one block, a vocabulary that is not a multiple of the vector width).

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "specdec/model/heads.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/propose/sparse_tree.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"

namespace test_support {

// tools/heads/<kind> in the source tree ("medusa" or "hydra").
inline std::filesystem::path heads_dir(char const* kind) {
  return source_file((std::string("tools/heads/") + kind + "/config.json").c_str()).parent_path();
}

// The Medusa heads trained for the fixture, loaded once per process.
inline std::shared_ptr<specdec::medusa_weights const> const& fixture_medusa() {
  static auto const w = std::make_shared<specdec::medusa_weights const>(
      specdec::load_medusa_heads(heads_dir("medusa"), fixture::stories260k()->config));
  return w;
}

// The Hydra heads trained for the fixture, loaded once per process.
inline std::shared_ptr<specdec::hydra_weights const> const& fixture_hydra() {
  static auto const w = std::make_shared<specdec::hydra_weights const>(
      specdec::load_hydra_heads(heads_dir("hydra"), fixture::stories260k()->config));
  return w;
}

// The committed sparse tree of `kind` (tools/heads/<kind>/tree.json).
inline specdec::sparse_tree fixture_tree(char const* kind) {
  return specdec::sparse_tree::from_choices(
      specdec::read_tree_choices(heads_dir(kind) / specdec::heads_tree_file));
}

// Random floats uniform in [-scale, scale] (seeded).
inline std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Medusa heads of random weights (N(0, 0.2^2)): `heads` heads of `layers` blocks for dim `dim`,
// `vocab` tokens.
inline std::shared_ptr<specdec::medusa_weights const> random_medusa(
    std::size_t dim, std::size_t vocab, std::size_t heads, std::size_t layers, std::uint64_t seed) {
  return std::make_shared<specdec::medusa_weights const>(
      specdec::make_random_medusa_heads(dim, vocab, heads, layers, seed, 0.2f));
}

// Hydra heads of random weights (see `random_medusa`).
inline std::shared_ptr<specdec::hydra_weights const> random_hydra(
    std::size_t dim, std::size_t vocab, std::size_t heads, std::size_t layers, std::uint64_t seed) {
  return std::make_shared<specdec::hydra_weights const>(
      specdec::make_random_hydra_heads(dim, vocab, heads, layers, seed, 0.2f));
}

// A target with only what a Hydra runner reads: the config's sizes and a random token embedding.
inline std::shared_ptr<specdec::llama_weights const> embedding_only(std::size_t dim,
                                                                    std::size_t vocab) {
  auto table = std::make_shared<std::vector<float>>(random_floats(vocab * dim, 5, 1.0f));
  specdec::llama_weights w;
  w.config.dim = static_cast<std::int32_t>(dim);
  w.config.vocab_size = static_cast<std::int32_t>(vocab);
  w.token_embedding = table->data();
  w.storage = table;
  return std::make_shared<specdec::llama_weights const>(std::move(w));
}

// Checks |got - want| <= tolerance (1 + |want|) for every entry (a runner's float logits against
// the double reference).
inline void check_logits_close(std::span<float const> got, std::vector<double> const& want,
                               double tolerance) {
  REQUIRE(got.size() == want.size());
  double worst = 0.0;
  for (std::size_t j = 0; j < got.size(); ++j)
    worst = std::max(worst,
                     std::abs(static_cast<double>(got[j]) - want[j]) / (1.0 + std::abs(want[j])));
  CHECK(worst <= tolerance);
}

}  // namespace test_support
