// The EAGLE head files (model/eagle.hpp): heads written in the reference's layout (rotate-half
// RoPE rows, or interleaved ones with "rope_style") load back as the weights they were written
// from, in F32, F16 and BF16; every loader and config error names the tensor or the key and the
// file; the committed heads of tools/eagle load for the fixture; and a loop over corrupted head
// files and configs that must end in specdec::error or a head that runs (its own ctest,
// model_corrupt_eagle, under the asan preset too).
#include "specdec/model/eagle.hpp"
#include "specdec/model/eagle_file.hpp"

#include "support/doctest.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/safetensors_util.hpp"
#include "model/test_util.hpp"
#include "specdec/backend/cpu/eagle.hpp"
#include "support/corrupt.hpp"
#include "support/eagle.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"
#include "support/llama_shapes.hpp"

using namespace specdec;
using specdec::test::edited;
using specdec::test::st_file;
using specdec::test::st_floats;
using specdec::test::st_tensor;
using specdec::test::without;
using test_support::check_error;
namespace fs = std::filesystem;

namespace {

// A random target (odd_gqa: dim 48, 3 layers, vocab 75) and heads for it.
std::shared_ptr<llama_weights const> const& target() {
  static auto const t = test_support::random_target(test_support::shapes::odd_gqa(), 3);
  return t;
}
std::shared_ptr<eagle_weights const> head(eagle_version v) {
  return v == eagle_version::eagle1
             ? test_support::random_eagle(v, target(), 6, 2, 0, {}, 21)
             : test_support::random_eagle(v, target(), 6, 2, 40, {3, 1, 2}, 22);
}

// `rows` x `cols` floats at p.
std::vector<float> floats(float const* p, std::size_t count) {
  return {p, p + count};
}

// The interleaved q / k rows `w` ([heads * hs, cols]) back in the rotate-half order.
std::vector<float> rotate_half_rows(float const* w, std::size_t heads, std::size_t hs,
                                    std::size_t cols) {
  std::vector<float> out(heads * hs * cols);
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < hs / 2; ++i) {
      std::copy(w + (h * hs + 2 * i) * cols, w + (h * hs + 2 * i + 1) * cols,
                out.begin() + static_cast<std::ptrdiff_t>((h * hs + i) * cols));
      std::copy(w + (h * hs + 2 * i + 1) * cols, w + (h * hs + 2 * i + 2) * cols,
                out.begin() + static_cast<std::ptrdiff_t>((h * hs + i + hs / 2) * cols));
    }
  return out;
}

// The tensors of `w` as the reference names them, its q / k rows in the rotate-half order unless
// `interleaved`, floats as `dtype`.
std::vector<st_tensor> head_tensors(eagle_weights const& w, bool interleaved,
                                    std::string const& dtype = "F32") {
  eagle_config const& c = w.config;
  bool const e3 = c.version == eagle_version::eagle3;
  std::size_t const d = w.dim, q = c.q_dim(), kv = c.kv_dim(), att = w.attention_width(),
                    inner = c.intermediate_size;
  auto const u = [](std::size_t n) { return static_cast<std::uint64_t>(n); };
  std::string const p = e3 ? "midlayer." : "layers.0.";
  std::vector<st_tensor> t;
  t.push_back(
      st_floats("fc.weight", {u(d), u(w.fc_width())}, floats(w.fc, d * w.fc_width()), dtype));
  if (w.fc_bias != nullptr) t.push_back(st_floats("fc.bias", {u(d)}, floats(w.fc_bias, d), dtype));
  if (e3) {
    t.push_back(st_floats(p + "input_layernorm.weight", {u(d)}, floats(w.input_norm, d), dtype));
    t.push_back(st_floats(p + "hidden_norm.weight", {u(d)}, floats(w.hidden_norm, d), dtype));
  }
  t.push_back(st_floats(
      p + "self_attn.q_proj.weight", {u(q), u(att)},
      interleaved ? floats(w.wq, q * att) : rotate_half_rows(w.wq, c.num_heads, c.head_dim, att),
      dtype));
  t.push_back(st_floats(p + "self_attn.k_proj.weight", {u(kv), u(att)},
                        interleaved ? floats(w.wk, kv * att)
                                    : rotate_half_rows(w.wk, c.num_kv_heads, c.head_dim, att),
                        dtype));
  t.push_back(
      st_floats(p + "self_attn.v_proj.weight", {u(kv), u(att)}, floats(w.wv, kv * att), dtype));
  t.push_back(st_floats(p + "self_attn.o_proj.weight", {u(d), u(q)}, floats(w.wo, d * q), dtype));
  t.push_back(
      st_floats(p + "post_attention_layernorm.weight", {u(d)}, floats(w.post_norm, d), dtype));
  t.push_back(
      st_floats(p + "mlp.gate_proj.weight", {u(inner), u(d)}, floats(w.w1, inner * d), dtype));
  t.push_back(
      st_floats(p + "mlp.up_proj.weight", {u(inner), u(d)}, floats(w.w3, inner * d), dtype));
  t.push_back(
      st_floats(p + "mlp.down_proj.weight", {u(d), u(inner)}, floats(w.w2, d * inner), dtype));
  if (e3) {
    t.push_back(st_floats("norm.weight", {u(d)}, floats(w.norm, d), dtype));
    t.push_back(st_floats("lm_head.weight", {u(w.draft_vocab), u(d)},
                          floats(w.lm_head, w.draft_vocab * d), dtype));
    std::vector<std::byte> d2t(w.draft_vocab * 8), t2d(w.vocab, std::byte{0});
    for (std::size_t i = 0; i < w.draft_vocab; ++i) {
      std::int64_t const off =
          static_cast<std::int64_t>(w.draft_to_target[i]) - static_cast<std::int64_t>(i);
      std::memcpy(d2t.data() + i * 8, &off, 8);
      t2d[static_cast<std::size_t>(w.draft_to_target[i])] = std::byte{1};
    }
    t.push_back({"d2t", "I64", {u(w.draft_vocab)}, d2t});
    t.push_back({"t2d", "BOOL", {u(w.vocab)}, t2d});
  }
  return t;
}

// The config.json of `w` (the reference's keys).
nlohmann::json head_config(eagle_weights const& w, bool interleaved) {
  eagle_config const& c = w.config;
  nlohmann::json j = {{"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size},
                      {"num_attention_heads", c.num_heads},
                      {"num_key_value_heads", c.num_kv_heads},
                      {"num_hidden_layers", 1},
                      {"vocab_size", c.vocab_size},
                      {"rms_norm_eps", c.rms_eps},
                      {"rope_theta", c.rope_theta},
                      {"hidden_act", "silu"},
                      {"rope_scaling", nullptr}};
  if (interleaved) j["rope_style"] = "interleaved";
  if (c.version == eagle_version::eagle3) {
    j["architectures"] = {"LlamaForCausalLMEagle3"};
    j["draft_vocab_size"] = c.draft_vocab_size;
    j["eagle_aux_hidden_state_layer_ids"] = c.eagle_layers;
  } else {
    j["architectures"] = {"LlamaForCausalLM"};
    j["bias"] = true;
  }
  return j;
}

eagle_weights load(std::vector<st_tensor> const& tensors, nlohmann::json const& config) {
  std::vector<std::byte> const bytes = st_file(tensors);
  return load_eagle_head(safetensors_file(bytes, "head.safetensors"),
                         parse_eagle_config(config.dump(), "config.json"), target());
}

// Every pointer of `a` holds the values of the same tensor of `b`, to `tolerance` (relative).
void check_same(eagle_weights const& a, eagle_weights const& b, float tolerance) {
  auto const same = [&](float const* x, float const* y, std::size_t n, char const* what) {
    CAPTURE(what);
    REQUIRE(((x == nullptr) == (y == nullptr)));
    if (x == nullptr) return;
    float worst = 0.0f;
    for (std::size_t i = 0; i < n; ++i)
      worst = std::max(worst, std::abs(x[i] - y[i]) / (1.0f + std::abs(y[i])));
    CHECK(worst <= tolerance);
  };
  eagle_config const& c = b.config;
  std::size_t const d = b.dim, att = b.attention_width(), inner = c.intermediate_size;
  CHECK(a.config.version == c.version);
  CHECK(a.feature_width() == b.feature_width());
  CHECK(a.target_layers == b.target_layers);
  CHECK(a.draft_to_target == b.draft_to_target);
  same(a.fc, b.fc, d * b.fc_width(), "fc");
  same(a.fc_bias, b.fc_bias, d, "fc bias");
  same(a.input_norm, b.input_norm, d, "input norm");
  same(a.hidden_norm, b.hidden_norm, d, "hidden norm");
  same(a.wq, b.wq, c.q_dim() * att, "q");
  same(a.wk, b.wk, c.kv_dim() * att, "k");
  same(a.wv, b.wv, c.kv_dim() * att, "v");
  same(a.wo, b.wo, d * c.q_dim(), "o");
  same(a.post_norm, b.post_norm, d, "post norm");
  same(a.w1, b.w1, inner * d, "gate");
  same(a.w3, b.w3, inner * d, "up");
  same(a.w2, b.w2, d * inner, "down");
  same(a.norm, b.norm, d, "norm");
  same(a.lm_head, b.lm_head, b.draft_vocab * d, "lm head");
  CHECK(a.embedding == b.embedding);
}

}  // namespace

TEST_CASE("eagle files: heads written in the reference's layout load as they were written") {
  for (eagle_version v : {eagle_version::eagle1, eagle_version::eagle3}) {
    CAPTURE(static_cast<int>(v));
    auto const w = head(v);
    check_same(load(head_tensors(*w, false), head_config(*w, false)), *w, 0.0f);
    check_same(load(head_tensors(*w, true), head_config(*w, true)), *w, 0.0f);
    check_same(load(head_tensors(*w, false, "F16"), head_config(*w, false)), *w, 1e-3f);
    check_same(load(head_tensors(*w, false, "BF16"), head_config(*w, false)), *w, 8e-3f);
  }
  // A file's own embedding is used; the EAGLE-3 layers by their output ("eagle_layer_outputs").
  auto const w = head(eagle_version::eagle3);
  auto tensors = head_tensors(*w, false);
  std::vector<float> emb(75 * 48, 0.5f);
  tensors.push_back(st_floats("embed_tokens.weight", {75, 48}, emb));
  auto config = head_config(*w, false);
  config.erase("eagle_aux_hidden_state_layer_ids");
  config["eagle_layer_outputs"] = {2, 0, 1};
  eagle_weights const own = load(tensors, config);
  CHECK(own.embedding[5] == 0.5f);
  CHECK(own.target_layers == std::vector<std::int32_t>{2, 0, 1});
  // A config without the layers reads the reference's (inputs of 2, n / 2, n - 3) when the target
  // is deep enough, and says so when it is not.
  config.erase("eagle_layer_outputs");
  check_error([&] { (void)load(tensors, config); }, errc::invalid_argument,
              "no EAGLE-3 layers in the config and a target of 3 layers");
}

TEST_CASE("eagle files: every loader error names the tensor and the file") {
  auto const w1 = head(eagle_version::eagle1);
  auto const w3 = head(eagle_version::eagle3);
  auto const t1 = head_tensors(*w1, false);
  auto const t3 = head_tensors(*w3, false);
  auto const c1 = head_config(*w1, false);
  auto const c3 = head_config(*w3, false);
  check_error([&] { (void)load(without(t1, "fc.bias"), c1); }, errc::bad_file,
              "head.safetensors: missing tensor 'fc.bias'");
  check_error([&] { (void)load(without(t3, "midlayer.hidden_norm.weight"), c3); }, errc::bad_file,
              "missing tensor 'midlayer.hidden_norm.weight'");
  check_error([&] { (void)load(without(t3, "d2t"), c3); }, errc::bad_file, "missing tensor 'd2t'");
  auto extra = t1;
  extra.push_back(st_floats("layers.0.input_layernorm.weight", {48}, std::vector<float>(48, 1)));
  check_error([&] { (void)load(extra, c1); }, errc::bad_file,
              "unexpected tensor 'layers.0.input_layernorm.weight'");
  auto no_bias = c1;
  no_bias["bias"] = false;
  check_error([&] { (void)load(t1, no_bias); }, errc::bad_file, "unexpected tensor 'fc.bias'");
  check_error(
      [&] {
        (void)load(edited(t3, "midlayer.self_attn.q_proj.weight",
                          [](st_tensor& t) {
                            t.shape = {96, 48};
                          }),
                   c3);
      },
      errc::bad_file,
      "tensor 'midlayer.self_attn.q_proj.weight' has shape [96, 48], expected [48, 96]");
  check_error(
      [&] { (void)load(edited(t1, "fc.weight", [](st_tensor& t) { t.dtype = "I32"; }), c1); },
      errc::unsupported, "tensor 'fc.weight' has dtype I32");
  check_error([&] { (void)load(edited(t3, "d2t", [](st_tensor& t) { t.dtype = "F64"; }), c3); },
              errc::unsupported, "tensor 'd2t' has dtype F64");
  auto const d2t_value = [&](std::size_t at, std::int64_t value) {
    return edited(t3, "d2t", [&](st_tensor& t) { std::memcpy(t.data.data() + at * 8, &value, 8); });
  };
  check_error([&] { (void)load(d2t_value(39, 100), c3); }, errc::bad_file,
              "tensor 'd2t' maps draft token 39 to 139, outside the vocabulary of 75");
  check_error([&] { (void)load(d2t_value(1, -1), c3); }, errc::bad_file,
              "tensor 'd2t' maps two draft tokens to 0");
  // Offsets at the ends of the int64 range: the message says where they lead, without overflow.
  check_error([&] { (void)load(d2t_value(39, std::numeric_limits<std::int64_t>::max()), c3); },
              errc::bad_file,
              "tensor 'd2t' maps draft token 39 to 39 + 9223372036854775807, outside the "
              "vocabulary of 75");
  check_error([&] { (void)load(d2t_value(39, std::numeric_limits<std::int64_t>::min()), c3); },
              errc::bad_file,
              "tensor 'd2t' maps draft token 39 to -9223372036854775769, outside the vocabulary");
  check_error(
      [&] { (void)load(edited(t3, "t2d", [](st_tensor& t) { t.data[2] = std::byte{1}; }), c3); },
      errc::bad_file, "tensor 't2d' marks token 2, which d2t does not map to");
  check_error(
      [&] { (void)load(edited(t3, "t2d", [](st_tensor& t) { t.data[0] = std::byte{7}; }), c3); },
      errc::bad_file, "holds the byte 7 at index 0");
  // The config against the target.
  auto c = c1;
  c["hidden_size"] = 64;
  check_error([&] { (void)load(t1, c); }, errc::invalid_argument,
              "\"hidden_size\" is 64 but the target's dim is 48");
  c = c1;
  c["vocab_size"] = 76;
  check_error([&] { (void)load(t1, c); }, errc::invalid_argument,
              "\"vocab_size\" is 76 but the target's vocabulary has 75 tokens");
  c = c3;
  c["eagle_aux_hidden_state_layer_ids"] = {1, 4};
  check_error([&] { (void)load(t3, c); }, errc::invalid_argument,
              "the EAGLE-3 layers name the input of layer 4 but the target has 3 layers");
}

TEST_CASE("eagle files: config errors name the key and the file") {
  auto const base = head_config(*head(eagle_version::eagle3), false);
  auto const bad = [&](auto edit, errc code, std::string const& fragment) {
    nlohmann::json j = base;
    edit(j);
    CAPTURE(j.dump());
    check_error([&] { (void)parse_eagle_config(j.dump(), "dir/config.json"); }, code, fragment);
  };
  using json = nlohmann::json;
  bad([](json& j) { j.erase("hidden_size"); }, errc::bad_file,
      "dir/config.json: missing \"hidden_size\"");
  bad([](json& j) { j["intermediate_size"] = -3; }, errc::bad_file,
      "\"intermediate_size\" must be");
  bad([](json& j) { j["num_attention_heads"] = 1e9; }, errc::bad_file,
      "\"num_attention_heads\" must be");
  bad([](json& j) { j["num_key_value_heads"] = 4; }, errc::bad_file,
      "\"num_attention_heads\" 6 is not a multiple of \"num_key_value_heads\" 4");
  bad([](json& j) { j["head_dim"] = 7; }, errc::bad_file, "must be even");
  bad([](json& j) { j["draft_vocab_size"] = 76; }, errc::bad_file, "\"draft_vocab_size\" must be");
  bad([](json& j) { j["num_hidden_layers"] = 2; }, errc::unsupported,
      "\"num_hidden_layers\" 2 is not supported");
  bad([](json& j) { j["rms_norm_eps"] = "small"; }, errc::bad_file, "\"rms_norm_eps\" must be");
  bad([](json& j) { j["rope_theta"] = -1; }, errc::bad_file, "\"rope_theta\" must be");
  bad([](json& j) { j["hidden_act"] = "gelu"; }, errc::unsupported, "\"hidden_act\" \"gelu\"");
  bad(
      [](json& j) {
        j["rope_scaling"] = {{"type", "linear"}};
      },
      errc::unsupported, "\"rope_scaling\"");
  bad([](json& j) { j["rope_style"] = "neox"; }, errc::bad_file, "\"rope_style\" \"neox\"");
  bad(
      [](json& j) {
        j["eagle_aux_hidden_state_layer_ids"] = {0, 2};
      },
      errc::unsupported, "the input of layer 0 (the token embedding) is not supported");
  bad([](json& j) { j["eagle_aux_hidden_state_layer_ids"] = "1,2"; }, errc::bad_file,
      "must be an array of 1 to 16 layer indices");
  bad([](json& j) { j["eagle_layer_outputs"] = {1}; }, errc::bad_file,
      "both \"eagle_aux_hidden_state_layer_ids\" and \"eagle_layer_outputs\" are given");
  bad([](json& j) { j["eagle_version"] = 1; }, errc::bad_file, "\"eagle_version\" 1 disagrees");
  bad([](json& j) { j["eagle_version"] = 2; }, errc::bad_file, "\"eagle_version\" 2");
  bad([](json& j) { j["architectures"] = "Eagle3"; }, errc::bad_file,
      "\"architectures\" must be an array of strings");
  check_error([] { (void)parse_eagle_config("[1, 2]", "c.json"); }, errc::bad_file,
              "a config is a JSON object");
  check_error([] { (void)parse_eagle_config("{\"hidden_size\": ", "c.json"); }, errc::bad_file,
              "invalid JSON");
  // EAGLE-1 from its keys, the defaults.
  eagle_config const c1 = parse_eagle_config(
      R"({"hidden_size": 64, "intermediate_size": 172, "num_attention_heads": 8,
          "vocab_size": 512})",
      "c.json");
  CHECK(c1.version == eagle_version::eagle1);
  CHECK(c1.num_kv_heads == 8);
  CHECK(c1.head_dim == 8);
  CHECK(c1.fc_bias);
  CHECK(!c1.rope_interleaved);
  CHECK(c1.rms_eps == 1e-6f);
}

TEST_CASE("eagle files: the committed heads load for the fixture") {
  auto const& e1 = *test_support::fixture_eagle1();
  auto const& e3 = *test_support::fixture_eagle3();
  CHECK(e1.config.version == eagle_version::eagle1);
  CHECK(e3.config.version == eagle_version::eagle3);
  CHECK(e1.feature_width() == 64);
  CHECK(e3.feature_width() == 3 * 64);
  CHECK(e1.lm_head == fixture::stories260k()->classifier);
  CHECK(e3.draft_vocab == e3.config.draft_vocab_size);
  CHECK(e3.target_layers.size() == 3);
}

// Truncations, bit flips, absurd header fields and non-finite weights of the committed EAGLE-3
// head, and truncations and flips of its config (fixed seeds): every variant ends in
// specdec::error or in a head that runs a few rows, never a crash or another exception (run as
// its own ctest, model_corrupt_eagle, under the asan preset too).
TEST_CASE("corrupted EAGLE head files and configs are refused or run" * doctest::skip()) {
  test_support::temp_dir dir;
  fs::path const src = test_support::eagle_dir("eagle3");
  auto const bytes = specdec::test::read_bytes(src / eagle_weights_file);
  std::uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  eagle_config const config = read_eagle_config(src / eagle_config_file);
  auto const target = fixture::stories260k();
  auto const run = [&](eagle_weights w) {
    auto const shared = std::make_shared<eagle_weights const>(std::move(w));
    cpu_eagle_head runner(shared, {.max_context = 16});
    std::size_t const f = runner.feature_width(), d = runner.hidden_size();
    std::vector<float> const in(3 * f, 0.25f);
    std::vector<token_id> const tokens = {1, 2, 3};
    std::vector<position_t> const positions = {0, 1, 2};
    std::vector<float> out(3 * d), logits(3 * runner.draft_vocab_size());
    runner.forward({.inputs = matrix_view<float const>(in.data(), 3, f),
                    .tokens = tokens,
                    .positions = positions},
                   matrix_view<float>(out.data(), 3, d));
    runner.logits(matrix_view<float const>(out.data(), 3, d),
                  matrix_view<float>(logits.data(), 3, runner.draft_vocab_size()));
  };
  auto const counts = test_support::corrupt_file_loop(
      bytes, static_cast<std::size_t>(8 + header), 47, 300, dir.file("model.safetensors"),
      [&](fs::path const& path) { run(load_eagle_head(safetensors_file(path), config, target)); });
  MESSAGE("EAGLE head variants: ", counts.refused, " refused, ", counts.accepted,
          " loaded and run");
  CHECK(counts.refused > 0);
  CHECK(counts.accepted > 0);

  std::string const text = detail::read_text_file(src / eagle_config_file);
  std::mt19937_64 rng(53);
  std::size_t errors = 0, loads = 0;
  for (int round = 0; round < 300; ++round) {
    std::string t = text;
    if (round % 2 == 0)
      t.resize(rng() % (t.size() + 1));
    else
      for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k)
        t[rng() % t.size()] ^= static_cast<char>(1u << (rng() % 8));
    try {
      eagle_config const c = parse_eagle_config(t, "corrupted config.json");
      run(load_eagle_head(safetensors_file(src / eagle_weights_file), c, target));
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

  // A head read into memory (--no-mmap) runs after its file is truncated; a mapped one would
  // end the process with SIGBUS at the next use of a weight past the new end.
  fs::path const copy = dir.path() / "eagle3";
  fs::create_directories(copy);
  fs::copy_file(src / eagle_config_file, copy / eagle_config_file);
  fs::copy_file(src / eagle_weights_file, copy / eagle_weights_file);
  eagle_weights w = load_eagle_head(copy, target, file_access::read);
  fs::resize_file(copy / eagle_weights_file, 8);
  run(std::move(w));
  check_error([&] { (void)load_eagle_head(copy, target, file_access::read); }, errc::bad_file,
              "model.safetensors");
}
