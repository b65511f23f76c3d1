#include "specdec/model/llama2c.hpp"

#include "support/doctest.hpp"

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "model/test_util.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/mapped_file.hpp"
#include "specdec/model/random.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/llama_shapes.hpp"

using namespace specdec;
using test_support::expect_error;

namespace {

using test_support::shapes::file_tiny;

void check_same_config(llama_config const& a, llama_config const& b) {
  CHECK(a.dim == b.dim);
  CHECK(a.hidden_dim == b.hidden_dim);
  CHECK(a.n_layers == b.n_layers);
  CHECK(a.n_heads == b.n_heads);
  CHECK(a.n_kv_heads == b.n_kv_heads);
  CHECK(a.vocab_size == b.vocab_size);
  CHECK(a.seq_len == b.seq_len);
  CHECK(a.shared_classifier == b.shared_classifier);
}

// Max |a - b| over `count` values; exact equality when tolerance is 0.
void check_close(float const* a, float const* b, std::size_t count, float tolerance,
                 char const* what) {
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  float worst = 0.0f;
  for (std::size_t i = 0; i < count; ++i) worst = std::fmax(worst, std::fabs(a[i] - b[i]));
  CHECK_MESSAGE(worst <= tolerance, what, ": max difference ", worst, " > ", tolerance);
}

void check_same_weights(llama_weights const& a, llama_weights const& b, float tolerance) {
  check_same_config(a.config, b.config);
  auto const& c = a.config;
  auto const d = static_cast<std::size_t>(c.dim), h = static_cast<std::size_t>(c.hidden_dim),
             kv = static_cast<std::size_t>(c.kv_dim()), v = static_cast<std::size_t>(c.vocab_size);
  check_close(a.token_embedding, b.token_embedding, v * d, tolerance, "token_embedding");
  check_close(a.classifier, b.classifier, v * d, tolerance, "classifier");
  check_close(a.rms_final, b.rms_final, d, 0.0f, "rms_final");
  REQUIRE(a.layers.size() == b.layers.size());
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    auto const &x = a.layers[l], &y = b.layers[l];
    check_close(x.rms_att, y.rms_att, d, 0.0f, "rms_att");
    check_close(x.rms_ffn, y.rms_ffn, d, 0.0f, "rms_ffn");
    check_close(x.wq, y.wq, d * d, tolerance, "wq");
    check_close(x.wk, y.wk, kv * d, tolerance, "wk");
    check_close(x.wv, y.wv, kv * d, tolerance, "wv");
    check_close(x.wo, y.wo, d * d, tolerance, "wo");
    check_close(x.w1, y.w1, h * d, tolerance, "w1");
    check_close(x.w2, y.w2, d * h, tolerance, "w2");
    check_close(x.w3, y.w3, h * d, tolerance, "w3");
  }
}

}  // namespace

TEST_CASE("llama2c: the stories260K fixture loads with the MANIFEST's configuration") {
  auto const path = test_support::model_file("stories260K.bin");
  auto const w = load_llama2c(path);
  CHECK(w.config.dim == 64);
  CHECK(w.config.hidden_dim == 172);
  CHECK(w.config.n_layers == 5);
  CHECK(w.config.n_heads == 8);
  CHECK(w.config.n_kv_heads == 4);
  CHECK(w.config.head_size() == 8);
  CHECK(w.config.vocab_size == 512);
  CHECK(w.config.seq_len == 512);
  CHECK(w.config.shared_classifier);
  CHECK(w.config.rope_theta == 10000.0f);
  CHECK(w.config.rms_eps == 1e-5f);
  CHECK(w.classifier == w.token_embedding);
  REQUIRE(w.layers.size() == 5);
  CHECK(w.storage != nullptr);

  // Pointers land where the MANIFEST's layout says (in floats after the 28-byte header).
  auto const bytes = test::read_bytes(path);
  REQUIRE(bytes.size() == 1056540);
  auto const value_at = [&](std::size_t float_index) {
    return test::peek<float>(bytes, 28 + 4 * float_index);
  };
  CHECK(w.token_embedding[0] == value_at(0));
  CHECK(w.token_embedding[512 * 64 - 1] == value_at(512 * 64 - 1));
  std::size_t const emb = 512 * 64, att = 5 * 64, sq = 64 * 64, kvm = 32 * 64, ffn = 172 * 64;
  CHECK(w.layers[0].rms_att[0] == value_at(emb));
  CHECK(w.layers[4].rms_att[63] == value_at(emb + att - 1));
  CHECK(w.layers[1].wq[0] == value_at(emb + att + sq));
  CHECK(w.layers[2].wk[5] == value_at(emb + att + 5 * sq + 2 * kvm + 5));
  std::size_t const after_attn = emb + att + 5 * (2 * sq + 2 * kvm);
  CHECK(w.layers[3].rms_ffn[7] == value_at(after_attn + 3 * 64 + 7));
  CHECK(w.layers[4].w3[ffn - 1] == value_at(after_attn + att + 15 * ffn - 1));
  CHECK(w.rms_final[0] == value_at(after_attn + att + 15 * ffn));
}

TEST_CASE("llama2c: write/read round trips in every format, shared and unshared classifier") {
  test_support::temp_dir dir;
  for (bool shared : {true, false}) {
    CAPTURE(shared);
    auto const original = make_random_llama(file_tiny(shared), 42);
    for (auto format : {llama2c_format::legacy, llama2c_format::v1, llama2c_format::v2_q8_0}) {
      CAPTURE(static_cast<int>(format));
      auto const path = dir.file("m.bin");
      write_llama2c(path, original, format);
      auto const loaded = load_llama2c(path);
      // Q8_0: each value is within half a quantisation step (max|w| / 127 / 2) of the original.
      float const tolerance = format == llama2c_format::v2_q8_0 ? 0.1f / 127.0f : 0.0f;
      check_same_weights(original, loaded, tolerance);
      if (shared) CHECK(loaded.classifier == loaded.token_embedding);
      auto const via_load_model = load_model(path);
      check_same_weights(loaded, via_load_model, 0.0f);
    }
  }
}

TEST_CASE("llama2c: the fixture written back is byte-identical") {
  auto const path = test_support::model_file("stories260K.bin");
  auto const w = load_llama2c(path);
  test_support::temp_dir dir;
  write_llama2c(dir.file("copy.bin"), w);
  auto const a = test::read_bytes(path), b = test::read_bytes(dir.file("copy.bin"));
  REQUIRE(a.size() == b.size());
  // The tensors are copied exactly; the RoPE tables are recomputed and may differ in the last bit.
  std::size_t const rope_begin = 28 + 4 * (264128 - 2 * 512 * 4);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < rope_begin; ++i) mismatches += a[i] != b[i];
  CHECK(mismatches == 0);
  for (std::size_t i = rope_begin; i < a.size(); i += 4) {
    CHECK(std::fabs(test::peek<float>(a, i) - test::peek<float>(b, i)) < 1e-4f);
  }
}

TEST_CASE("llama2c: every truncation of a small file is a bad_file error") {
  test_support::temp_dir dir;
  for (auto format : {llama2c_format::legacy, llama2c_format::v1, llama2c_format::v2_q8_0}) {
    CAPTURE(static_cast<int>(format));
    auto const full = dir.file("full.bin");
    write_llama2c(full, make_random_llama(file_tiny(false), 7), format);
    auto const bytes = test::read_bytes(full);
    auto const cut = dir.file("cut.bin");
    for (std::size_t n = 0; n < bytes.size(); n += (n < 300 ? 1 : 37)) {
      CAPTURE(n);
      test::write_bytes(cut, bytes, n);
      auto const message = expect_error([&] { (void)load_llama2c(cut); }, errc::bad_file);
      CHECK(message.find("cut.bin") != std::string::npos);
    }
    // One byte too many is also an error.
    auto longer = bytes;
    longer.push_back(std::byte{0});
    test::write_bytes(cut, longer);
    auto const message = expect_error([&] { (void)load_llama2c(cut); }, errc::bad_file);
    CHECK(message.find(std::to_string(longer.size())) != std::string::npos);
  }
}

TEST_CASE("llama2c: bad headers") {
  test_support::temp_dir dir;
  auto const full = dir.file("full.bin");
  write_llama2c(full, make_random_llama(file_tiny(true), 1));
  auto const good = test::read_bytes(full);
  auto const bad = dir.file("bad.bin");
  auto const with_int = [&](std::size_t index, std::int32_t value) {
    auto b = good;
    test::poke(b, 4 * index, value);
    test::write_bytes(bad, b);
  };

  SUBCASE("size disagreeing with the header") {
    with_int(2, 3);  // n_layers 3 instead of 2
    auto const m = expect_error([&] { (void)load_llama2c(bad); }, errc::bad_file);
    CHECK(m.find("n_layers 3") != std::string::npos);
    CHECK(m.find(std::to_string(good.size())) != std::string::npos);
  }
  SUBCASE("absurd dimensions") {
    for (std::size_t i = 0; i < 7; ++i) {
      for (std::int32_t v : {0, -1, INT_MIN, INT_MAX, 1 << 30}) {
        CAPTURE(i);
        CAPTURE(v);
        with_int(i, v);
        expect_error([&] { (void)load_llama2c(bad); }, errc::bad_file);
      }
    }
    with_int(3, 3);  // 3 heads do not divide dim 8
    CHECK(expect_error([&] { (void)load_llama2c(bad); }, errc::bad_file).find("n_heads") !=
          std::string::npos);
  }
  SUBCASE("unknown versioned format") {
    detail::binary_writer out(bad);
    out.write(llama2c_magic);
    out.write(std::int32_t{3});
    out.write_zeros(248);
    out.close();
    auto const m = expect_error([&] { (void)load_llama2c(bad); }, errc::unsupported);
    CHECK(m.find("version 3") != std::string::npos);
  }
  SUBCASE("versioned header with a bad flag") {
    write_llama2c(full, make_random_llama(file_tiny(true), 1), llama2c_format::v1);
    auto b = test::read_bytes(full);
    test::poke(b, 36, std::uint8_t{7});
    test::write_bytes(bad, b);
    expect_error([&] { (void)load_llama2c(bad); }, errc::bad_file);
  }
  SUBCASE("missing, empty, directory") {
    expect_error([&] { (void)load_llama2c(dir.file("nope.bin")); }, errc::io);
    expect_error([&] { (void)load_llama2c(dir.path()); }, errc::io);
    test::write_bytes(bad, {}, 0);
    expect_error([&] { (void)load_llama2c(bad); }, errc::bad_file);
    expect_error([&] { (void)load_model(bad); }, errc::bad_file);
  }
}

TEST_CASE("llama2c: random header mutations never crash") {
  test_support::temp_dir dir;
  auto const full = dir.file("full.bin");
  auto const bad = dir.file("bad.bin");
  std::mt19937 rng(1234);
  for (auto format : {llama2c_format::legacy, llama2c_format::v1, llama2c_format::v2_q8_0}) {
    write_llama2c(full, make_random_llama(file_tiny(false), 3), format);
    auto const good = test::read_bytes(full);
    std::size_t const header = format == llama2c_format::legacy ? 28 : 48;
    for (int trial = 0; trial < 300; ++trial) {
      auto b = good;
      int const flips = 1 + static_cast<int>(rng() % 3);
      for (int f = 0; f < flips; ++f) {
        std::size_t const at = rng() % header;
        b[at] = static_cast<std::byte>(rng() & 0xff);
      }
      test::write_bytes(bad, b);
      try {
        auto const w = load_llama2c(bad);
        // Accepted: then every tensor must be readable (ASan checks the bounds).
        float sum = 0.0f;
        auto const d = static_cast<std::size_t>(w.config.dim);
        for (std::size_t i = 0; i < d; ++i) sum += w.rms_final[i] + w.classifier[i];
        (void)sum;
      } catch (specdec::error const&) {
      }
    }
  }
}

TEST_CASE("llama2c: a NaN or infinite weight is refused, naming the tensor, in every format") {
  test_support::temp_dir dir;
  auto const good = dir.file("good.bin");
  auto const bad = dir.file("bad.bin");
  for (auto format : {llama2c_format::legacy, llama2c_format::v1}) {
    CAPTURE(static_cast<int>(format));
    write_llama2c(good, make_random_llama(file_tiny(false), 9), format);
    // The file offset of element 5 of layer 1's wq: the float32 weights point into the map.
    auto const w = load_llama2c(good);
    auto const map = std::static_pointer_cast<mapped_file const>(w.storage);
    auto const at = static_cast<std::size_t>(
        reinterpret_cast<std::byte const*>(w.layers[1].wq + 5) - map->data());
    for (float v : {-INFINITY, INFINITY, NAN}) {
      CAPTURE(v);
      auto b = test::read_bytes(good);
      test::poke(b, at, v);
      test::write_bytes(bad, b);
      auto const m = expect_error([&] { (void)load_llama2c(bad); }, errc::bad_file);
      CHECK(m.find("bad.bin") != std::string::npos);
      CHECK(m.find("tensor 'layers[1].wq'") != std::string::npos);
      CHECK(m.find("at element 5 ") != std::string::npos);
      expect_error([&] { (void)load_model(bad); }, errc::bad_file);
    }
    // The classifier too (the last tensor of the file).
    auto b = test::read_bytes(good);
    test::poke(b, b.size() - 4, -INFINITY);
    test::write_bytes(bad, b);
    CHECK(expect_error([&] { (void)load_llama2c(bad); }, errc::bad_file)
              .find("tensor 'classifier'") != std::string::npos);
  }
  // Version 2 (Q8_0): an infinite scale dequantises to infinite weights. The scales of
  // token_embedding follow its int8 values, right after the norms.
  write_llama2c(good, make_random_llama(file_tiny(true), 9), llama2c_format::v2_q8_0);
  auto b = test::read_bytes(good);
  auto const c = file_tiny(true);
  std::size_t const norms = 4 * static_cast<std::size_t>((2 * c.n_layers + 1) * c.dim);
  std::size_t const emb = static_cast<std::size_t>(c.vocab_size * c.dim);
  test::poke(b, llama2c_header_bytes + norms + emb, INFINITY);
  test::write_bytes(bad, b);
  CHECK(expect_error([&] { (void)load_llama2c(bad); }, errc::bad_file)
            .find("tensor 'token_embedding'") != std::string::npos);
}

TEST_CASE("llama2c: a file read into memory is immune to later changes of the file") {
  test_support::temp_dir dir;
  auto const path = dir.file("model.bin");
  write_llama2c(path, make_random_llama(file_tiny(false), 4));
  auto const bytes = test::read_bytes(path);
  auto const copy = load_model(path, file_access::read);
  auto const map = std::static_pointer_cast<mapped_file const>(copy.storage);
  CHECK(map->access() == file_access::read);
  // Truncating a mapped file would make reading its weights a SIGBUS; the copy reads on.
  std::filesystem::resize_file(path, 0);
  auto const n = static_cast<std::size_t>(copy.config.dim * copy.config.dim);
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) sum += copy.layers[1].wq[i];
  CHECK(std::isfinite(sum));
  CHECK(std::memcmp(map->data(), bytes.data(), bytes.size()) == 0);
  test::write_bytes(path, bytes);
  auto const mapped = load_model(path);
  CHECK(std::static_pointer_cast<mapped_file const>(mapped.storage)->access() == file_access::map);
  CHECK(std::memcmp(mapped.layers[1].wq, copy.layers[1].wq, n * sizeof(float)) == 0);
  // A directory is named as one.
  auto const m = expect_error([&] { (void)load_model(dir.path(), file_access::read); }, errc::io);
  CHECK(m.find("is a directory") != std::string::npos);
}
