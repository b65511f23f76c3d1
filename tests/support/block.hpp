#pragma once
// Block drafters for the tests of the loader, the CPU runner, the proposer and the decoder: the
// drafters trained for the stories260K fixture (tools/block/dflash and dspark, loaded once per
// process) and their golden vectors.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "specdec/model/block_drafter_file.hpp"
#include "specdec/model/safetensors.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"

namespace test_support {

// tools/block/<kind> in the source tree ("dflash" or "dspark").
inline std::filesystem::path block_dir(char const* kind) {
  return source_file((std::string("tools/block/") + kind + "/config.json").c_str()).parent_path();
}

// The DFlash drafter trained for the fixture, loaded once per process.
inline std::shared_ptr<specdec::block_drafter_weights const> const& fixture_dflash() {
  static auto const w = std::make_shared<specdec::block_drafter_weights const>(
      specdec::load_block_drafter(block_dir("dflash"), fixture::stories260k()));
  return w;
}

// The DSpark drafter (the same body, with the Markov and confidence heads).
inline std::shared_ptr<specdec::block_drafter_weights const> const& fixture_dspark() {
  static auto const w = std::make_shared<specdec::block_drafter_weights const>(
      specdec::load_block_drafter(block_dir("dspark"), fixture::stories260k()));
  return w;
}

// The integers of tensor `name` of `file`.
inline std::vector<std::int64_t> tensor_integers(specdec::safetensors_file const& file,
                                                 char const* name) {
  specdec::safetensors_tensor const& t = file.require(name);
  std::vector<std::int64_t> v(static_cast<std::size_t>(t.elements));
  file.read_integers(t, v);
  return v;
}

}  // namespace test_support
