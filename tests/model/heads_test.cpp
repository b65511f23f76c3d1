// The Medusa and Hydra head files (model/heads.hpp): the committed files of tools/heads against
// checksums computed by the training script's own reader, their F16 / BF16 conversions against
// the F32 files, every loader and config error naming the tensor or the field, the tree files,
// and a loop over corrupted files that must end in specdec::error or success, never a crash.
#include "specdec/model/heads.hpp"
#include "specdec/model/heads_file.hpp"

#include "support/doctest.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "model/heads_checksums.hpp"
#include "model/safetensors_util.hpp"
#include "model/test_util.hpp"
#include "specdec/model/half.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"

using namespace specdec;
using specdec::test::edited;
using specdec::test::st_file;
using specdec::test::st_floats;
using specdec::test::st_tensor;
using specdec::test::st_tensors;
using specdec::test::without;
using test_support::check_error;
using test_support::expect_error;
namespace fs = std::filesystem;

namespace {

fs::path medusa_dir() {
  return test_support::source_file("tools/heads/medusa/config.json").parent_path();
}
fs::path hydra_dir() {
  return test_support::source_file("tools/heads/hydra/config.json").parent_path();
}
fs::path test_data(char const* name) {
  return test_support::source_file((std::string("tests/model/data/") + name).c_str()).parent_path();
}

llama_config const& target_config() {
  return fixture::stories260k()->config;
}

// Every tensor of `file` has the shape and the checksums of `expected`, and there is no other.
void check_checksums(safetensors_file const& file,
                     std::vector<heads_test::checksum> const& expected) {
  CHECK(file.tensors().size() == expected.size());
  for (auto const& e : expected) {
    CAPTURE(e.name);
    safetensors_tensor const* t = file.find(e.name);
    REQUIRE(t != nullptr);
    CHECK(t->shape == e.shape);
    std::vector<float> const v = file.read(e.name);
    double sum = 0.0, weighted = 0.0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      sum += static_cast<double>(v[i]);
      weighted += static_cast<double>(v[i]) * static_cast<double>(i % 13 + 1);
    }
    // Summation order differs from numpy's pairwise sums: agreement to double rounding.
    CHECK(std::abs(sum - e.sum) <= 1e-9 * (1.0 + std::abs(e.sum)));
    CHECK(std::abs(weighted - e.weighted) <= 1e-9 * (1.0 + std::abs(e.weighted)));
  }
}

medusa_weights load_medusa_bytes(std::vector<std::byte> const& bytes, medusa_config const& c) {
  return load_medusa_heads(safetensors_file(bytes, "heads.safetensors"), c, 64, 512);
}
hydra_weights load_hydra_bytes(std::vector<std::byte> const& bytes, hydra_config const& c) {
  return load_hydra_heads(safetensors_file(bytes, "heads.safetensors"), c, 64, 512);
}

}  // namespace

TEST_CASE("heads: the committed files match the training script's checksums") {
  check_checksums(safetensors_file(medusa_dir() / medusa_heads_file), heads_test::medusa_f32);
  check_checksums(safetensors_file(hydra_dir() / hydra_heads_file), heads_test::hydra_f32);
  check_checksums(safetensors_file(test_data("medusa_f16/config.json") / medusa_heads_file),
                  heads_test::medusa_f16);
  check_checksums(safetensors_file(test_data("hydra_bf16/config.json") / hydra_heads_file),
                  heads_test::hydra_bf16);
  safetensors_file const f(medusa_dir() / medusa_heads_file);
  CHECK(f.metadata().at("format") == "pt");
  CHECK(f.require("0.0.linear.weight").dtype == safetensors_dtype::f32);
}

TEST_CASE("heads: Medusa heads load for the fixture, every tensor where the names say") {
  medusa_config const c = read_medusa_config(medusa_dir() / heads_config_file);
  CHECK(c.num_heads == 4);
  CHECK(c.num_layers == 4);
  CHECK(c.hidden_size == 64);
  CHECK(c.vocab_size == 512);
  CHECK(c.base_model == "stories260K.bin");
  medusa_weights const w = load_medusa_heads(medusa_dir(), target_config());
  REQUIRE(w.heads.size() == 4);
  CHECK(w.dim == 64);
  CHECK(w.vocab == 512);
  safetensors_file const f(medusa_dir() / medusa_heads_file);
  for (std::size_t i = 0; i < 4; ++i) {
    REQUIRE(w.heads[i].blocks.size() == 4);
    std::string const p = std::to_string(i) + ".";
    for (std::size_t l = 0; l < 4; ++l) {
      std::string const b = p + std::to_string(l) + ".linear.";
      auto const weight = f.read(b + "weight");
      auto const bias = f.read(b + "bias");
      CHECK(std::equal(weight.begin(), weight.end(), w.heads[i].blocks[l].weight));
      CHECK(std::equal(bias.begin(), bias.end(), w.heads[i].blocks[l].bias));
    }
    auto const lm = f.read(p + "4.weight");
    CHECK(std::equal(lm.begin(), lm.end(), w.heads[i].lm_head));
  }
}

TEST_CASE("heads: Hydra heads load for the fixture, every tensor where the names say") {
  hydra_config const c = read_hydra_config(hydra_dir() / heads_config_file);
  CHECK(c.num_heads == 4);
  CHECK(c.num_layers == 4);
  CHECK(c.head_arch == "mlp");
  CHECK(c.grounded_heads);
  hydra_weights const w = load_hydra_heads(hydra_dir(), target_config());
  REQUIRE(w.heads.size() == 4);
  safetensors_file const f(hydra_dir() / hydra_heads_file);
  auto const same = [&](std::string const& name, float const* p) {
    auto const v = f.read(name);
    CHECK_MESSAGE(std::equal(v.begin(), v.end(), p), name);
  };
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(w.input_width(i) == 64 * (i + 2));
    std::string const p = "hydra_mlp." + std::to_string(i) + ".";
    same(p + "0.linear.weight", w.heads[i].in_weight);
    same(p + "0.linear.bias", w.heads[i].in_bias);
    same(p + "0.res_connection.weight", w.heads[i].res_weight);
    same(p + "0.res_connection.bias", w.heads[i].res_bias);
    REQUIRE(w.heads[i].blocks.size() == 3);
    for (std::size_t l = 1; l < 4; ++l) {
      same(p + std::to_string(l) + ".linear.weight", w.heads[i].blocks[l - 1].weight);
      same(p + std::to_string(l) + ".linear.bias", w.heads[i].blocks[l - 1].bias);
    }
    same("hydra_lm_head." + std::to_string(i) + ".weight", w.heads[i].lm_head);
    same("hydra_lm_head." + std::to_string(i) + ".bias", w.heads[i].lm_bias);
  }
}

TEST_CASE("heads: the F16 and BF16 conversions load as the F32 values rounded") {
  medusa_weights const m32 = load_medusa_heads(medusa_dir(), target_config());
  medusa_weights const m16 =
      load_medusa_heads(test_data("medusa_f16/config.json"), target_config());
  auto const d = m32.dim, v = m32.vocab;
  std::size_t compared = 0;
  auto const check_half = [&](float const* a, float const* b, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i, ++compared)
      if (half_to_float(float_to_half(a[i])) != b[i]) FAIL("F16 value differs at ", i);
  };
  for (std::size_t i = 0; i < m32.heads.size(); ++i) {
    for (std::size_t l = 0; l < m32.heads[i].blocks.size(); ++l) {
      check_half(m32.heads[i].blocks[l].weight, m16.heads[i].blocks[l].weight, d * d);
      check_half(m32.heads[i].blocks[l].bias, m16.heads[i].blocks[l].bias, d);
    }
    check_half(m32.heads[i].lm_head, m16.heads[i].lm_head, v * d);
  }
  CHECK(compared == 197632);  // every parameter of the Medusa heads

  hydra_weights const h32 = load_hydra_heads(hydra_dir(), target_config());
  hydra_weights const hbf = load_hydra_heads(test_data("hydra_bf16/config.json"), target_config());
  compared = 0;
  auto const check_bf16 = [&](float const* a, float const* b, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i, ++compared)
      if (bf16_to_float(float_to_bf16(a[i])) != b[i]) FAIL("BF16 value differs at ", i);
  };
  for (std::size_t i = 0; i < h32.heads.size(); ++i) {
    auto const& a = h32.heads[i];
    auto const& b = hbf.heads[i];
    check_bf16(a.in_weight, b.in_weight, d * h32.input_width(i));
    check_bf16(a.in_bias, b.in_bias, d);
    check_bf16(a.res_weight, b.res_weight, d * h32.input_width(i));
    check_bf16(a.res_bias, b.res_bias, d);
    for (std::size_t l = 0; l < a.blocks.size(); ++l) {
      check_bf16(a.blocks[l].weight, b.blocks[l].weight, d * d);
      check_bf16(a.blocks[l].bias, b.blocks[l].bias, d);
    }
    check_bf16(a.lm_head, b.lm_head, v * d);
    check_bf16(a.lm_bias, b.lm_bias, v);
  }
  CHECK(compared == 298240);  // every parameter of the Hydra heads
}

TEST_CASE("heads: every loader error names the tensor and the file") {
  safetensors_file const mf(medusa_dir() / medusa_heads_file);
  safetensors_file const hf(hydra_dir() / hydra_heads_file);
  std::vector<st_tensor> const medusa = st_tensors(mf);
  std::vector<st_tensor> const hydra = st_tensors(hf);
  medusa_config const mc = read_medusa_config(medusa_dir() / heads_config_file);
  hydra_config const hc = read_hydra_config(hydra_dir() / heads_config_file);
  CHECK(load_medusa_bytes(st_file(medusa), mc).heads.size() == 4);  // the copy loads
  CHECK(load_hydra_bytes(st_file(hydra), hc).heads.size() == 4);

  SUBCASE("missing tensors") {
    check_error([&] { (void)load_medusa_bytes(st_file(without(medusa, "2.3.linear.bias")), mc); },
                errc::bad_file, "heads.safetensors: missing tensor '2.3.linear.bias'");
    check_error([&] { (void)load_medusa_bytes(st_file(without(medusa, "3.4.weight")), mc); },
                errc::bad_file, "missing tensor '3.4.weight'");
    check_error(
        [&] {
          (void)load_hydra_bytes(st_file(without(hydra, "hydra_mlp.1.0.res_connection.weight")),
                                 hc);
        },
        errc::bad_file, "missing tensor 'hydra_mlp.1.0.res_connection.weight'");
    check_error(
        [&] { (void)load_hydra_bytes(st_file(without(hydra, "hydra_lm_head.0.bias")), hc); },
        errc::bad_file, "missing tensor 'hydra_lm_head.0.bias'");
  }
  SUBCASE("extra tensors, and configs declaring fewer heads or layers than the file holds") {
    auto extra = medusa;
    extra.push_back(st_floats("4.0.linear.bias", {64}, std::vector<float>(64)));
    check_error([&] { (void)load_medusa_bytes(st_file(extra), mc); }, errc::bad_file,
                "unexpected tensor '4.0.linear.bias' (shape [64])");
    medusa_config fewer = mc;
    fewer.num_heads = 3;
    check_error([&] { (void)load_medusa_bytes(st_file(medusa), fewer); }, errc::bad_file,
                "unexpected tensor '3.");
    medusa_config shallower = mc;
    shallower.num_layers = 3;  // then {i}.3.weight would be the LM head: it is a block's instead
    check_error([&] { (void)load_medusa_bytes(st_file(medusa), shallower); }, errc::bad_file,
                "missing tensor '0.3.weight'");
    hydra_config deeper = hc;
    deeper.num_layers = 5;
    check_error([&] { (void)load_hydra_bytes(st_file(hydra), deeper); }, errc::bad_file,
                "missing tensor 'hydra_mlp.0.4.linear.weight'");
    hydra_config fewer_h = hc;
    fewer_h.num_heads = 2;
    check_error([&] { (void)load_hydra_bytes(st_file(hydra), fewer_h); }, errc::bad_file,
                "unexpected tensor 'hydra_");
  }
  SUBCASE("wrong shapes") {
    auto const reshaped = edited(medusa, "1.2.linear.weight", [](st_tensor& t) {
      t.shape = {32, 128};
    });
    check_error([&] { (void)load_medusa_bytes(st_file(reshaped), mc); }, errc::bad_file,
                "tensor '1.2.linear.weight' has shape [32, 128], expected [64, 64] = [dim, dim]");
    auto const flat = edited(hydra, "hydra_mlp.2.0.linear.weight",
                             [](st_tensor& t) { t.shape = {t.shape[0] * t.shape[1]}; });
    check_error([&] { (void)load_hydra_bytes(st_file(flat), hc); }, errc::bad_file,
                "tensor 'hydra_mlp.2.0.linear.weight' has shape [16384], expected [64, 256]");
  }
  SUBCASE("heads for another target") {
    check_error(
        [&] { (void)load_medusa_heads(safetensors_file(st_file(medusa), "h"), mc, 64, 1024); },
        errc::invalid_argument, "\"vocab_size\" is 512 but the target's vocabulary has 1024");
    medusa_config informative = mc;
    informative.hidden_size = 0;
    informative.vocab_size = 0;
    check_error(
        [&] {
          (void)load_medusa_heads(safetensors_file(st_file(medusa), "h"), informative, 64, 1024);
        },
        errc::bad_file, "tensor '0.4.weight' has shape [512, 64], expected [1024, 64]");
    check_error(
        [&] {
          (void)load_medusa_heads(safetensors_file(st_file(medusa), "h"), informative, 128, 512);
        },
        errc::bad_file, "expected [128, 128] = [dim, dim]");
    check_error([&] { (void)load_hydra_heads(safetensors_file(st_file(hydra), "h"), hc, 32, 512); },
                errc::invalid_argument, "\"hidden_size\" is 64 but the target's dim is 32");
  }
  SUBCASE("tensor types other than floats") {
    auto const ints = edited(medusa, "0.0.linear.bias", [](st_tensor& t) { t.dtype = "I32"; });
    check_error([&] { (void)load_medusa_bytes(st_file(ints), mc); }, errc::unsupported,
                "tensor '0.0.linear.bias' has dtype I32");
  }
  SUBCASE("a directory without the files") {
    test_support::temp_dir dir;
    check_error([&] { (void)load_medusa_heads(dir.path(), target_config()); }, errc::io,
                "config.json");
    fs::copy_file(medusa_dir() / heads_config_file, dir.file(heads_config_file));
    check_error([&] { (void)load_medusa_heads(dir.path(), target_config()); }, errc::io,
                medusa_heads_file);
  }
}

TEST_CASE("heads: config errors name the key and the file") {
  std::string const w = "config.json";
  auto const medusa = [&](std::string const& text) { return parse_medusa_config(text, w); };
  auto const hydra = [&](std::string const& text) { return parse_hydra_config(text, w); };
  CHECK(medusa(R"({"medusa_num_heads": 5, "medusa_num_layers": 1, "transformers_version": "x"})")
            .num_heads == 5);
  check_error([&] { (void)medusa("{\"medusa_num_heads\": 5"); }, errc::bad_file,
              "config.json: invalid JSON");
  check_error([&] { (void)medusa("[1]"); }, errc::bad_file, "a config is a JSON object");
  check_error([&] { (void)medusa(R"({"medusa_num_layers": 1})"); }, errc::bad_file,
              "config.json: missing \"medusa_num_heads\"");
  check_error([&] { (void)medusa(R"({"medusa_num_heads": 0, "medusa_num_layers": 1})"); },
              errc::bad_file, "\"medusa_num_heads\" must be an integer in [1, 64], got 0");
  check_error([&] { (void)medusa(R"({"medusa_num_heads": "4", "medusa_num_layers": 1})"); },
              errc::bad_file, "\"medusa_num_heads\" must be an integer in [1, 64], got \"4\"");
  check_error([&] { (void)medusa(R"({"medusa_num_heads": 4.5, "medusa_num_layers": 1})"); },
              errc::bad_file, "got 4.5");
  check_error([&] { (void)medusa(R"({"medusa_num_heads": 4, "medusa_num_layers": 100000})"); },
              errc::bad_file, "\"medusa_num_layers\" must be an integer in [1, 64]");
  check_error(
      [&] {
        (void)medusa(R"({"medusa_num_heads": 4, "medusa_num_layers": 1, "hidden_size": -64})");
      },
      errc::bad_file, "\"hidden_size\" must be an integer");
  check_error(
      [&] {
        (void)medusa(
            R"({"medusa_num_heads": 4, "medusa_num_layers": 1, "base_model_name_or_path": 3})");
      },
      errc::bad_file, "\"base_model_name_or_path\" must be a string");
  check_error([&] { (void)medusa(R"({"medusa_num_heads": 4, "medusa_num_heads": 5, "x": 1})"); },
              errc::bad_file, "the name 'medusa_num_heads' appears twice");

  CHECK(hydra(R"({"hydra_num_heads": 4, "hydra_num_layers": 4})").head_arch == "mlp");
  check_error(
      [&] {
        (void)hydra(
            R"({"hydra_num_heads": 4, "hydra_num_layers": 4, "hydra_head_arch": "prefix-mlp"})");
      },
      errc::unsupported, "\"hydra_head_arch\" \"prefix-mlp\" is not supported");
  check_error(
      [&] {
        (void)hydra(R"({"hydra_num_heads": 4, "hydra_num_layers": 4, "grounded_heads": false})");
      },
      errc::unsupported, "\"grounded_heads\" false is not supported");
  check_error(
      [&] {
        (void)hydra(R"({"hydra_num_heads": 4, "hydra_num_layers": 4, "grounded_heads": "yes"})");
      },
      errc::bad_file, "\"grounded_heads\" must be true or false");
  check_error(
      [&] {
        (void)hydra(R"({"hydra_num_heads": 4, "hydra_num_layers": 4, "hidden_state_offset": 2})");
      },
      errc::unsupported, "\"hidden_state_offset\" 2 is not supported");
  check_error([&] { (void)hydra(R"({"hydra_num_heads": 4})"); }, errc::bad_file,
              "missing \"hydra_num_layers\"");
  // A NUL byte would end the text for the parser, which would ignore what follows: refused, with
  // or without content after it.
  std::string const nul = std::string(R"({"medusa_num_heads": 4, "medusa_num_layers": 1})") + '\0';
  check_error([&] { (void)medusa(nul + R"({"medusa_num_heads": 64})"); }, errc::bad_file,
              "config.json: a NUL byte at byte 47 of 72");
  check_error([&] { (void)medusa(nul); }, errc::bad_file, "a NUL byte at byte 47 of 48");
}

TEST_CASE("heads: tree files") {
  tree_choices const medusa = read_tree_choices(medusa_dir() / heads_tree_file);
  tree_choices const hydra = read_tree_choices(hydra_dir() / heads_tree_file);
  CHECK(medusa.size() == 32);
  CHECK(hydra.size() == 32);
  CHECK(medusa.front() == std::vector<std::int32_t>{0});
  CHECK(medusa.back() == std::vector<std::int32_t>{0, 0, 0, 0});
  CHECK(parse_tree_choices(tree_choices_text(medusa), "x") == medusa);
  CHECK(tree_choices_text({{0}, {1}, {0, 0}}) == "[[0], [1], [0, 0]]\n");

  test_support::temp_dir dir;
  write_tree_choices(dir.file("tree.json"), hydra);
  CHECK(read_tree_choices(dir.file("tree.json")) == hydra);

  std::string const w = "tree.json";
  check_error([&] { (void)parse_tree_choices("{}", w); }, errc::bad_file,
              "tree.json: a tree file is a JSON array of paths");
  check_error([&] { (void)parse_tree_choices("[[0], []]", w); }, errc::bad_file,
              "path 1 must be an array of 1 to 64 ranks, got []");
  check_error([&] { (void)parse_tree_choices("[[0], 1]", w); }, errc::bad_file, "path 1");
  check_error([&] { (void)parse_tree_choices("[[0], [0, -1]]", w); }, errc::bad_file,
              "path 1 holds -1, not a rank");
  check_error([&] { (void)parse_tree_choices("[[0.5]]", w); }, errc::bad_file, "holds 0.5");
  check_error([&] { (void)parse_tree_choices("[[0], [1]", w); }, errc::bad_file, "invalid JSON");
  check_error([&] { (void)parse_tree_choices(std::string("[[0], [1]]\0[[2]]", 16), w); },
              errc::bad_file, "a NUL byte at byte 10 of 16");
  std::string many = "[";
  for (int i = 0; i < 5000; ++i) many += (i ? ",[" : "[") + std::to_string(i % 9) + "]";
  check_error([&] { (void)parse_tree_choices(many + "]", w); }, errc::bad_file,
              "5000 paths, more than 4095");
}

// Truncations, bit flips and absurd sizes of the committed head files and configs, fixed seed:
// every attempt ends in specdec::error or a successful load, never a crash or another exception
// (run under AddressSanitizer too: the asan preset).
TEST_CASE("heads: corrupted head files and configs give specdec::error or load, never crash") {
  std::vector<std::byte> const medusa = specdec::test::read_bytes(medusa_dir() / medusa_heads_file);
  std::vector<std::byte> const hydra = specdec::test::read_bytes(hydra_dir() / hydra_heads_file);
  medusa_config const mc = read_medusa_config(medusa_dir() / heads_config_file);
  hydra_config const hc = read_hydra_config(hydra_dir() / heads_config_file);
  std::string const mconfig = detail::read_text_file(medusa_dir() / heads_config_file);
  std::string const tree = detail::read_text_file(medusa_dir() / heads_tree_file);
  std::mt19937_64 rng(20240613);
  auto const pick = [&](std::size_t n) {
    return static_cast<std::size_t>(std::uniform_int_distribution<std::size_t>(0, n - 1)(rng));
  };
  std::size_t errors = 0, loads = 0;
  auto const attempt = [&](auto&& f) {
    try {
      f();
      ++loads;
    } catch (specdec::error const&) {
      ++errors;
    } catch (std::exception const& e) {
      FAIL("not a specdec::error: ", e.what());
    }
  };
  constexpr int rounds = 300;
  for (int round = 0; round < rounds; ++round) {
    bool const is_medusa = round % 2 == 0;
    std::vector<std::byte> bytes = is_medusa ? medusa : hydra;
    std::uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    std::size_t const header_end = static_cast<std::size_t>(8 + header);
    switch (round % 6) {
      case 0:
      case 1:  // truncation, mostly inside the header
        bytes.resize(pick(4) == 0 ? pick(bytes.size()) : pick(header_end + 16));
        break;
      case 2:
      case 3:  // 1 to 4 bit flips, mostly in the header
        for (std::size_t k = 0, n = 1 + pick(4); k < n; ++k) {
          std::size_t const at = pick(4) == 0 ? pick(bytes.size()) : pick(header_end);
          bytes[at] ^= static_cast<std::byte>(1u << pick(8));
        }
        break;
      case 4: {  // an absurd header length
        std::uint64_t const sizes[] = {0,
                                       1,
                                       header - 1,
                                       header + 1,
                                       bytes.size(),
                                       ~std::uint64_t{0},
                                       std::uint64_t{1} << 63,
                                       rng()};
        std::uint64_t const n = sizes[pick(8)];
        std::memcpy(bytes.data(), &n, 8);
        break;
      }
      default: {  // an absurd number in place of one in the header
        char const* absurd[] = {"18446744073709551615", "-1", "1e30", "4294967296", "99999999999"};
        std::string text(reinterpret_cast<char const*>(bytes.data()) + 8, header);
        std::size_t at = pick(text.size());
        while (at < text.size() && (text[at] < '0' || text[at] > '9')) ++at;
        if (at == text.size()) break;
        std::size_t end = at;
        while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
        text.replace(at, end - at, absurd[pick(5)]);
        std::vector<std::byte> rebuilt = specdec::test::st_raw(text, {}, false);
        rebuilt.insert(rebuilt.end(), bytes.begin() + static_cast<long>(header_end), bytes.end());
        bytes = std::move(rebuilt);
        break;
      }
    }
    attempt([&] {
      safetensors_file const f(bytes, "corrupted.safetensors");
      if (is_medusa)
        (void)load_medusa_heads(f, mc, 64, 512);
      else
        (void)load_hydra_heads(f, hc, 64, 512);
    });
    // The JSON files: truncations and flips of the config and the tree.
    std::string text = round % 2 == 0 ? mconfig : tree;
    if (pick(2) == 0)
      text.resize(pick(text.size() + 1));
    else
      text[pick(text.size())] ^= static_cast<char>(1u << pick(8));
    attempt([&] {
      if (round % 2 == 0)
        (void)parse_medusa_config(text, "corrupted config.json");
      else
        (void)parse_tree_choices(text, "corrupted tree.json");
    });
  }
  MESSAGE(errors << " errors, " << loads << " loads of " << 2 * rounds << " corrupted files");
  CHECK(errors > rounds);  // most corruptions are caught
  CHECK(errors + loads == 2 * rounds);

  // The Medusa file with 100,000 empty tensors more in its header (10 MB): refused, naming the
  // first, in about the time nlohmann/json takes to parse the header alone (the header's check
  // for repeated names was quadratic, and so was the parser it used: minutes).
  {
    std::uint64_t header = 0;
    std::memcpy(&header, medusa.data(), 8);
    std::string text(reinterpret_cast<char const*>(medusa.data()) + 8, header);
    std::size_t const open = text.find('{');
    REQUIRE(open != std::string::npos);
    std::string extra;
    for (int i = 0; i < 100'000; ++i)
      extra += "\"unused.padding_of_the_header_with_empty_tensors." + std::to_string(i) +
               "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},";
    text.insert(open + 1, extra);
    std::vector<std::byte> bytes = specdec::test::st_raw(text, {}, false);
    bytes.insert(bytes.end(), medusa.begin() + static_cast<long>(8 + header), medusa.end());
    auto const since = [](std::chrono::steady_clock::time_point t) {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    };
    auto start = std::chrono::steady_clock::now();
    CHECK(nlohmann::json::parse(text).size() > 100'000);
    double const parse_alone = since(start);
    start = std::chrono::steady_clock::now();
    check_error(
        [&] {
          (void)load_medusa_heads(safetensors_file(bytes, "padded.safetensors"), mc, 64, 512);
        },
        errc::bad_file, "unexpected tensor 'unused.padding_of_the_header_with_empty_");
    double const refused = since(start);
    MESSAGE("a header of ", text.size(), " bytes refused in ", refused,
            " s; nlohmann/json parses it in ", parse_alone, " s");
    CHECK(refused < 5.0 * parse_alone + 0.5);
  }
}

// --no-mmap: heads read into memory do not depend on their files any more. A mapped file that is
// truncated kills the process (SIGBUS) at the next use of a weight past its new end.
TEST_CASE("heads: heads read into memory survive the truncation of their files") {
  test_support::temp_dir dir;
  auto const copy = [&](fs::path const& from, char const* sub) {
    fs::path const to = dir.path() / sub;
    fs::create_directories(to);
    for (char const* name : {heads_config_file, medusa_heads_file, hydra_heads_file})
      if (fs::exists(from / name)) fs::copy_file(from / name, to / name);
    return to;
  };
  fs::path const m = copy(medusa_dir(), "medusa");
  fs::path const h = copy(hydra_dir(), "hydra");
  medusa_weights const mw = load_medusa_heads(m, target_config(), file_access::read);
  hydra_weights const hw = load_hydra_heads(h, target_config(), file_access::read);
  fs::resize_file(m / medusa_heads_file, 8);
  fs::resize_file(h / hydra_heads_file, 8);
  auto const sum = [](float const* p, std::size_t n) {
    double s = 0.0;
    for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(p[i]);
    return s;
  };
  std::size_t const d = mw.dim, v = mw.vocab;
  double total = 0.0;
  for (auto const& head : mw.heads) {
    for (auto const& b : head.blocks) total += sum(b.weight, d * d) + sum(b.bias, d);
    total += sum(head.lm_head, v * d);
  }
  for (std::size_t i = 0; i < hw.heads.size(); ++i) {
    auto const& head = hw.heads[i];
    total += sum(head.in_weight, d * hw.input_width(i)) + sum(head.in_bias, d) +
             sum(head.res_weight, d * hw.input_width(i)) + sum(head.res_bias, d) +
             sum(head.lm_head, v * d) + sum(head.lm_bias, v);
    for (auto const& b : head.blocks) total += sum(b.weight, d * d) + sum(b.bias, d);
  }
  CHECK(std::isfinite(total));
  // The truncated files themselves are refused, as any truncated file.
  check_error([&] { (void)load_medusa_heads(m, target_config(), file_access::read); },
              errc::bad_file, "medusa_lm_head.safetensors");
}

TEST_CASE("heads: random heads of any shape, deterministic in the seed") {
  medusa_weights const a = make_random_medusa_heads(20, 37, 3, 2, 7, 0.2f);
  medusa_weights const b = make_random_medusa_heads(20, 37, 3, 2, 7, 0.2f);
  medusa_weights const c = make_random_medusa_heads(20, 37, 3, 2, 8, 0.2f);
  REQUIRE(a.heads.size() == 3);
  CHECK(a.config.num_layers == 2);
  CHECK(a.dim == 20);
  CHECK(a.vocab == 37);
  for (std::size_t i = 0; i < 3; ++i) {
    REQUIRE(a.heads[i].blocks.size() == 2);
    CHECK(std::equal(a.heads[i].lm_head, a.heads[i].lm_head + 37 * 20, b.heads[i].lm_head));
    CHECK(!std::equal(a.heads[i].lm_head, a.heads[i].lm_head + 37 * 20, c.heads[i].lm_head));
    CHECK(std::isfinite(a.heads[i].blocks[1].bias[19]));
  }
  hydra_weights const h = make_random_hydra_heads(20, 37, 4, 3, 7, 0.2f);
  REQUIRE(h.heads.size() == 4);
  CHECK(h.heads[3].blocks.size() == 2);
  CHECK(std::isfinite(h.heads[3].in_weight[20 * h.input_width(3) - 1]));
  CHECK(std::isfinite(h.heads[3].lm_bias[36]));
  check_error([] { (void)make_random_hydra_heads(20, 37, 0, 3, 7, 0.2f); }, errc::invalid_argument,
              "0 heads");
}
