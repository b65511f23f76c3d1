// Block drafter files (model/block_drafter.hpp): the committed drafters of tools/block load for the
// fixture; a file written with rotate-half RoPE rows loads as the interleaved one it was made
// from; F16 tensors convert; every loader and config error names the tensor or the key and the
// file; and a loop over corrupted drafter files and configs that must end in specdec::error or a
// drafter that runs (its own ctest, model_corrupt_block, under the asan preset too).
#include "support/doctest.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "model/safetensors_util.hpp"
#include "model/test_util.hpp"
#include "specdec/backend/cpu/block_drafter.hpp"
#include "specdec/model/block_drafter_file.hpp"
#include "support/block.hpp"
#include "support/corrupt.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"

namespace block_drafter_files_test {

using namespace specdec;
using specdec::test::edited;
using specdec::test::st_file;
using specdec::test::st_tensors;
using specdec::test::without;
namespace fs = std::filesystem;

// The committed DSpark drafter's tensors and config.
inline std::vector<specdec::test::st_tensor> const& dspark_tensors() {
  static auto const t =
      st_tensors(safetensors_file(test_support::block_dir("dspark") / block_drafter_weights_file));
  return t;
}
inline nlohmann::json dspark_config() {
  return nlohmann::json::parse(
      detail::read_text_file(test_support::block_dir("dspark") / block_drafter_config_file));
}

inline block_drafter_weights load(std::vector<specdec::test::st_tensor> const& tensors,
                                  nlohmann::json const& config) {
  std::vector<std::byte> const bytes = st_file(tensors);
  return load_block_drafter(safetensors_file(bytes, "drafter.safetensors"),
                            parse_block_drafter_config(config.dump(), "config.json"),
                            fixture::stories260k());
}

// A block of root 1 over three context rows of 0.25: the drafter runs.
inline std::vector<float> run(block_drafter_weights w) {
  auto const shared = std::make_shared<block_drafter_weights const>(std::move(w));
  cpu_block_drafter runner(shared, {.max_context = 16});
  std::size_t const f = runner.feature_width(), d = runner.hidden_size(), b = runner.block_size();
  std::vector<float> const in(3 * f, 0.25f);
  std::vector<float> out(b * d), logits((b - 1) * runner.vocab_size());
  runner.extend(matrix_view<float const>(in.data(), 3, f));
  runner.block(1, matrix_view<float>(out.data(), b, d));
  runner.logits(matrix_view<float const>(out.data() + d, b - 1, d),
                matrix_view<float>(logits.data(), b - 1, runner.vocab_size()));
  return out;
}

}  // namespace block_drafter_files_test

TEST_CASE("block drafter files: the committed drafters load for the fixture") {
  using namespace block_drafter_files_test;
  auto const& f = *test_support::fixture_dflash();
  auto const& s = *test_support::fixture_dspark();
  CHECK_FALSE(f.config.dspark);
  CHECK(s.config.dspark);
  CHECK(f.config.block_size == 8);
  CHECK(f.config.target_layers == std::vector<std::int32_t>{0, 2, 4});
  CHECK(f.feature_width() == 192);
  CHECK(f.markov_in == nullptr);
  CHECK(s.markov_in != nullptr);
  CHECK(s.config.markov_rank > 0);
  CHECK(s.confidence_bias != nullptr);
}

TEST_CASE("block drafter files: rotate-half rows and F16 tensors load as what they encode") {
  using namespace block_drafter_files_test;
  auto const config = dspark_config();
  std::vector<float> const want = run(load(dspark_tensors(), config));
  // Rows of each head's q / k reordered to the rotate-half pairs: the same drafter.
  auto rotated = dspark_tensors();
  std::size_t const hs =
      config["hidden_size"].get<std::size_t>() / config["num_attention_heads"].get<std::size_t>();
  for (auto& t : rotated) {
    if (t.name.find("q_proj") == std::string::npos && t.name.find("k_proj") == std::string::npos)
      continue;
    std::size_t const cols = static_cast<std::size_t>(t.shape[1]), row = cols * 4;
    std::vector<std::byte> out(t.data.size());
    for (std::size_t h = 0; h < t.shape[0] / hs; ++h)
      for (std::size_t i = 0; i < hs / 2; ++i) {
        // interleaved row 2i -> rotate-half row i, 2i + 1 -> i + hs / 2
        std::memcpy(out.data() + (h * hs + i) * row, t.data.data() + (h * hs + 2 * i) * row, row);
        std::memcpy(out.data() + (h * hs + i + hs / 2) * row,
                    t.data.data() + (h * hs + 2 * i + 1) * row, row);
      }
    t.data = out;
  }
  auto rc = config;
  rc["rope_style"] = "rotate_half";
  std::vector<float> const got = run(load(rotated, rc));
  double worst = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(got[i] - want[i])));
  CHECK(worst < 1e-5);
  // F16 weights: close to the F32 ones.
  auto halves = dspark_tensors();
  for (auto& t : halves) {
    std::vector<float> v(t.data.size() / 4);
    std::memcpy(v.data(), t.data.data(), t.data.size());
    t.data = specdec::test::st_encode(v, "F16");
    t.dtype = "F16";
  }
  std::vector<float> const h = run(load(halves, config));
  worst = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(h[i] - want[i])));
  CHECK(worst < 0.05);
}

TEST_CASE("block drafter files: errors name the tensor or the key and the file") {
  using namespace block_drafter_files_test;
  using test_support::check_error;
  auto const& t = dspark_tensors();
  auto const c = dspark_config();
  check_error([&] { (void)load(without(t, "mask_embedding"), c); }, errc::bad_file,
              "drafter.safetensors: missing tensor 'mask_embedding'");
  check_error([&] { (void)load(without(t, "markov_head.in"), c); }, errc::bad_file,
              "missing tensor 'markov_head.in'");
  auto dflash = c;
  dflash["architectures"] = {"DFlashDraftModel"};
  check_error([&] { (void)load(t, dflash); }, errc::bad_file, "unexpected tensor 'markov_head");
  check_error(
      [&] {
        (void)load(edited(t, "layers.1.self_attn.k_proj.weight",
                          [](specdec::test::st_tensor& x) {
                            x.shape = {64, 32};
                          }),
                   c);
      },
      errc::bad_file,
      "tensor 'layers.1.self_attn.k_proj.weight' has shape [64, 32], expected [32, 64]");
  check_error(
      [&] {
        (void)load(edited(t, "fc.weight", [](specdec::test::st_tensor& x) { x.dtype = "I32"; }), c);
      },
      errc::unsupported, "tensor 'fc.weight' has dtype I32");
  auto const config_error = [&](auto edit, errc code, std::string const& what) {
    nlohmann::json j = c;
    edit(j);
    check_error([&] { (void)load(t, j); }, code, what);
  };
  config_error([](nlohmann::json& j) { j.erase("block_size"); }, errc::bad_file,
               "config.json: missing \"block_size\"");
  config_error([](nlohmann::json& j) { j["block_size"] = 1; }, errc::bad_file,
               "\"block_size\" must be an integer in [2, 64]");
  config_error([](nlohmann::json& j) { j.erase("markov_rank"); }, errc::bad_file,
               "missing \"markov_rank\"");
  config_error(
      [](nlohmann::json& j) {
        j["target_layer_outputs"] = {0, 9};
      },
      errc::invalid_argument, "names layer 9 but the target has 5 layers");
  config_error([](nlohmann::json& j) { j["target_layer_outputs"] = nlohmann::json::array(); },
               errc::bad_file, "\"target_layer_outputs\" must be an array of 1 to 16");
  config_error([](nlohmann::json& j) { j["hidden_size"] = 32; }, errc::invalid_argument,
               "\"hidden_size\" is 32 but the target's dim is 64");
  config_error([](nlohmann::json& j) { j["vocab_size"] = 1000; }, errc::invalid_argument,
               "\"vocab_size\" is 1000 but the target's vocabulary has 512 tokens");
  config_error([](nlohmann::json& j) { j["hidden_act"] = "gelu"; }, errc::unsupported,
               "\"hidden_act\" \"gelu\" is not supported");
  config_error([](nlohmann::json& j) { j["rope_style"] = "other"; }, errc::bad_file,
               "\"rope_style\" \"other\" is neither");
}

// Truncations, bit flips, absurd header fields and non-finite weights of the committed DSpark
// drafter, and truncations and flips of its config (fixed seeds): every variant ends in
// specdec::error or in a drafter that runs a block, never a crash or another exception.
TEST_CASE("corrupted block drafter files and configs are refused or run" * doctest::skip()) {
  using namespace block_drafter_files_test;
  test_support::temp_dir dir;
  fs::path const src = test_support::block_dir("dspark");
  auto const bytes = specdec::test::read_bytes(src / block_drafter_weights_file);
  std::uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  block_drafter_config const config = read_block_drafter_config(src / block_drafter_config_file);
  auto const target = fixture::stories260k();
  auto const counts = test_support::corrupt_file_loop(
      bytes, static_cast<std::size_t>(8 + header), 61, 300, dir.file("model.safetensors"),
      [&](fs::path const& path) {
        (void)run(load_block_drafter(safetensors_file(path), config, target));
      });
  MESSAGE("drafter variants: ", counts.refused, " refused, ", counts.accepted, " loaded and run");
  CHECK(counts.refused > 0);
  CHECK(counts.accepted > 0);

  std::string const text = detail::read_text_file(src / block_drafter_config_file);
  std::mt19937_64 rng(67);
  std::size_t errors = 0, loads = 0;
  for (int round = 0; round < 300; ++round) {
    std::string t = text;
    if (round % 2 == 0)
      t.resize(rng() % (t.size() + 1));
    else
      for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k)
        t[rng() % t.size()] ^= static_cast<char>(1u << (rng() % 8));
    try {
      block_drafter_config const c = parse_block_drafter_config(t, "corrupted config.json");
      (void)run(load_block_drafter(safetensors_file(src / block_drafter_weights_file), c, target));
      ++loads;
    } catch (specdec::error const&) {
      ++errors;
    } catch (std::exception const& e) {
      FAIL("not a specdec::error: ", e.what());
    }
  }
  MESSAGE("config variants: ", errors, " refused, ", loads, " loaded and run");
  CHECK(errors > 0);
  CHECK(loads > 0);
}
