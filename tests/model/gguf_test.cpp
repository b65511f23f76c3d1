#include "specdec/model/gguf.hpp"

#include "support/doctest.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/test_util.hpp"
#include "specdec/model/gguf_writer.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/tokenizer.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/llama_shapes.hpp"

using namespace specdec;
using test_support::expect_error;

namespace {

// Builds GGUF bytes field by field, for targeted malformed files.
struct builder {
  std::vector<std::byte> b;
  template <class T>
  builder& raw(T v) {
    auto const at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
    return *this;
  }
  builder& u32(std::uint32_t v) { return raw(v); }
  builder& u64(std::uint64_t v) { return raw(v); }
  builder& str(std::string_view s) {
    u64(s.size());
    for (char c : s) b.push_back(static_cast<std::byte>(c));
    return *this;
  }
  builder& header(std::uint64_t tensors, std::uint64_t kvs, std::uint32_t version = 3) {
    return u32(gguf_magic).u32(version).u64(tensors).u64(kvs);
  }
  builder& pad(std::size_t alignment = 32) {
    while (b.size() % alignment != 0) b.push_back(std::byte{0});
    return *this;
  }
  builder& floats(std::size_t n, float v = 1.0f) {
    for (std::size_t i = 0; i < n; ++i) raw(v);
    return *this;
  }
};

using test_support::shapes::file_small;

tokenizer small_vocab(std::int32_t n) {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<token_type> types;
  pieces = {"<unk>", "<s>", "</s>"};
  types = {token_type::unknown, token_type::control, token_type::control};
  char const* words[] = {" ", "a", "b", " a", " b", "ab", " ab", "é", " é"};
  for (char const* w : words) {
    pieces.emplace_back(w);
    types.push_back(token_type::normal);
  }
  for (std::int32_t i = static_cast<std::int32_t>(pieces.size()); i < n; ++i) {
    pieces.push_back("tok" + std::to_string(i));
    types.push_back(token_type::user_defined);
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) scores.push_back(-static_cast<float>(i));
  return tokenizer(pieces, scores, types, 1, 2, 0);
}

using weight_map = std::vector<std::pair<float const*, std::size_t>>;

// Every tensor of `w` as (pointer, element count), in a fixed order.
weight_map tensors_of(llama_weights const& w) {
  auto const& c = w.config;
  auto const d = static_cast<std::size_t>(c.dim), h = static_cast<std::size_t>(c.hidden_dim),
             kv = static_cast<std::size_t>(c.kv_dim()), v = static_cast<std::size_t>(c.vocab_size);
  weight_map m{{w.token_embedding, v * d}, {w.classifier, v * d}, {w.rms_final, d}};
  for (auto const& l : w.layers) {
    m.insert(m.end(), {{l.rms_att, d},
                       {l.wq, d * d},
                       {l.wk, kv * d},
                       {l.wv, kv * d},
                       {l.wo, d * d},
                       {l.rms_ffn, d},
                       {l.w1, h * d},
                       {l.w2, d * h},
                       {l.w3, h * d}});
  }
  return m;
}

}  // namespace

TEST_CASE("gguf: half and bfloat16 conversions") {
  // Every binary16 pattern survives half -> float -> half (NaNs stay NaNs).
  for (std::uint32_t h = 0; h < 65536; ++h) {
    auto const bits = static_cast<std::uint16_t>(h);
    float const f = half_to_float(bits);
    if (std::isnan(f)) {
      CHECK(std::isnan(half_to_float(float_to_half(f))));
    } else if (float_to_half(f) != bits) {
      FAIL("half ", h, " -> ", f, " -> ", float_to_half(f));
    }
  }
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(65519.99f) == 0x7bff);
  CHECK(float_to_half(65520.0f) == 0x7c00);
  CHECK(float_to_half(-1e30f) == 0xfc00);
  CHECK(float_to_half(5.9604644775390625e-8f) == 0x0001);   // 2^-24
  CHECK(float_to_half(2.98023223876953125e-8f) == 0x0000);  // 2^-25 ties to even (0)
  CHECK(float_to_half(2.9802326e-8f) == 0x0001);            // just above 2^-25
  CHECK(float_to_half(1.0f + 0x1p-11f) == 0x3c00);          // tie to even
  CHECK(float_to_half(1.0f + 3 * 0x1p-11f) == 0x3c02);      // tie to even (up)
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(1.0f + 0x1p-8f) == 0x3f80);  // tie to even
  CHECK(float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
#if defined(__FLT16_MANT_DIG__)
  // Agrees with the compiler's own conversion on random float patterns.
  std::mt19937 rng(99);
  for (int i = 0; i < 200000; ++i) {
    auto const bits = static_cast<std::uint32_t>(rng());
    float const f = std::bit_cast<float>(bits);
    if (std::isnan(f)) continue;
    auto const expected = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    if (float_to_half(f) != expected)
      FAIL("float bits ", bits, ": ", float_to_half(f), " vs ", expected);
  }
#endif
  // The bulk conversions agree with the scalar ones on every pattern, at any alignment.
  std::vector<std::byte> all(2 * 65536 + 1);
  for (std::uint32_t b = 0; b < 65536; ++b) {
    auto const bits = static_cast<std::uint16_t>(b);
    std::memcpy(all.data() + 1 + 2 * b, &bits, 2);
  }
  std::vector<float> bulk(65536);
  half_to_float(all.data() + 1, bulk);
  for (std::uint32_t b = 0; b < 65536; ++b) {
    float const expected = half_to_float(static_cast<std::uint16_t>(b));
    if (std::memcmp(&bulk[b], &expected, 4) != 0) FAIL("bulk half ", b);
  }
  bf16_to_float(all.data() + 1, bulk);
  for (std::uint32_t b = 0; b < 65536; ++b) {
    float const expected = bf16_to_float(static_cast<std::uint16_t>(b));
    if (std::memcmp(&bulk[b], &expected, 4) != 0) FAIL("bulk bf16 ", b);
  }
  for (std::uint32_t b = 0; b < 65536; ++b) {
    auto const bits = static_cast<std::uint16_t>(b);
    float const f = bf16_to_float(bits);
    if (!std::isnan(f) && float_to_bf16(f) != bits) FAIL("bf16 ", b);
  }
}

TEST_CASE("gguf: the stories260K fixture parses and loads") {
  gguf_file const f(test_support::model_file("stories260K.gguf"));
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.metadata().size() == 19);
  CHECK(f.tensors().size() == 48);
  CHECK(f.data_offset() % 32 == 0);
  CHECK(f.require<std::string_view>("general.architecture") == "llama");
  CHECK(f.require<std::uint32_t>("llama.block_count") == 5);
  CHECK(f.require<std::int64_t>("llama.embedding_length") == 64);
  CHECK(f.require<std::uint8_t>("llama.attention.head_count") == 8);
  CHECK(f.require<float>("llama.attention.layer_norm_rms_epsilon") == 1e-5f);
  CHECK(f.require<double>("llama.attention.layer_norm_rms_epsilon") == doctest::Approx(1e-5));
  CHECK_FALSE(f.get<float>("llama.rope.freq_base").has_value());
  CHECK(f.get<std::uint64_t>("tokenizer.ggml.seperator_token_id") == 0xffffffffu);
  // Typed getters refuse values that do not fit or have another type.
  expect_error([&] { (void)f.require<std::int32_t>("tokenizer.ggml.seperator_token_id"); },
               errc::bad_file);
  expect_error([&] { (void)f.require<float>("llama.block_count"); }, errc::bad_file);
  expect_error([&] { (void)f.require<std::string_view>("llama.block_count"); }, errc::bad_file);
  expect_error([&] { (void)f.require<std::uint32_t>("tokenizer.ggml.tokens"); }, errc::bad_file);
  expect_error([&] { (void)f.require<std::uint32_t>("no.such.key"); }, errc::bad_file);
  auto const tokens = f.get_array<std::string_view>("tokenizer.ggml.tokens");
  REQUIRE(tokens.has_value());
  CHECK(tokens->size() == 512);
  CHECK((*tokens)[1] == "<s>");
  auto const types = f.get_array<std::int32_t>("tokenizer.ggml.token_type");
  REQUIRE(types.has_value());
  CHECK((*types)[3] == 6);
  gguf_tensor_info const* q = f.find_tensor("blk.0.attn_k.weight");
  REQUIRE(q != nullptr);
  CHECK(q->type == gguf_type::f32);
  CHECK(q->n_dims == 2);
  CHECK(q->ne[0] == 64);
  CHECK(q->ne[1] == 32);
  CHECK(q->bytes == 64 * 32 * 4);
  CHECK(f.find_tensor("blk.9.attn_k.weight") == nullptr);

  auto const w = load_gguf(test_support::model_file("stories260K.gguf"));
  CHECK(w.config.dim == 64);
  CHECK(w.config.hidden_dim == 172);
  CHECK(w.config.n_layers == 5);
  CHECK(w.config.n_heads == 8);
  CHECK(w.config.n_kv_heads == 4);
  CHECK(w.config.vocab_size == 512);
  CHECK(w.config.seq_len == 128);  // llama.context_length in this file (the .bin says 512)
  CHECK(w.config.rope_theta == 10000.0f);
  CHECK(w.config.rms_eps == 1e-5f);
  CHECK_FALSE(w.config.shared_classifier);  // the file stores output.weight explicitly
}

TEST_CASE("gguf: stories260K.gguf holds exactly the weights of stories260K.bin") {
  auto const bin = load_model(test_support::model_file("stories260K.bin"));
  auto const gguf = load_model(test_support::model_file("stories260K.gguf"));
  auto const a = tensors_of(bin), b = tensors_of(gguf);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    REQUIRE(a[i].second == b[i].second);
    CHECK(std::memcmp(a[i].first, b[i].first, a[i].second * sizeof(float)) == 0);
  }
}

TEST_CASE("gguf: write/read round trips in F32, F16 and BF16") {
  test_support::temp_dir dir;
  for (bool shared : {true, false}) {
    auto const original = make_random_llama(file_small(shared), 5);
    auto const vocab = small_vocab(64);
    for (gguf_type type : {gguf_type::f32, gguf_type::f16, gguf_type::bf16}) {
      CAPTURE(shared);
      CAPTURE(traits(type).name);
      auto const path = dir.file("m.gguf");
      write_gguf(path, original, &vocab, type);
      auto const loaded = load_model(path);
      CHECK(loaded.config.dim == 32);
      CHECK(loaded.config.n_kv_heads == 2);
      CHECK(loaded.config.seq_len == 16);
      CHECK(loaded.config.rope_theta == 500000.0f);
      CHECK(loaded.config.rms_eps == 1e-6f);
      CHECK(loaded.config.shared_classifier == shared);
      if (shared) CHECK(loaded.classifier == loaded.token_embedding);
      auto const a = tensors_of(original), b = tensors_of(loaded);
      REQUIRE(a.size() == b.size());
      float const rel = type == gguf_type::f32 ? 0.0f : type == gguf_type::f16 ? 0x1p-11f : 0x1p-8f;
      for (std::size_t i = 0; i < a.size(); ++i) {
        bool const norm = a[i].second == 32;  // norms stay F32
        for (std::size_t j = 0; j < a[i].second; ++j) {
          float const x = a[i].first[j], y = b[i].first[j];
          float const expected = norm || type == gguf_type::f32 ? x
                                 : type == gguf_type::f16       ? half_to_float(float_to_half(x))
                                                                : bf16_to_float(float_to_bf16(x));
          if (y != expected || std::fabs(x - y) > std::fabs(x) * rel + 1e-7f) {
            FAIL("tensor ", i, " element ", j, ": ", x, " became ", y);
          }
        }
      }
      // The embedded vocabulary comes back identical.
      auto const t = load_tokenizer(path);
      REQUIRE(t.vocab_size() == vocab.vocab_size());
      for (token_id i = 0; i < t.vocab_size(); ++i) {
        CHECK(t.piece(i) == vocab.piece(i));
        CHECK(t.score(i) == vocab.score(i));
        CHECK(t.type(i) == vocab.type(i));
      }
      CHECK(t.bos() == 1);
      CHECK(t.eos() == 2);
      CHECK(t.encode(" ab é", true) == vocab.encode(" ab é", true));
    }
  }
  // Without a vocabulary, and in an unsupported type.
  auto const original = make_random_llama(file_small(true), 5);
  write_gguf(dir.file("novocab.gguf"), original, nullptr);
  CHECK_FALSE(gguf_file(dir.file("novocab.gguf")).contains("tokenizer.ggml.tokens"));
  expect_error([&] { (void)load_tokenizer(dir.file("novocab.gguf")); }, errc::bad_file);
  expect_error([&] { write_gguf(dir.file("q.gguf"), original, nullptr, gguf_type::q4_0); },
               errc::invalid_argument);
}

TEST_CASE("gguf: every truncation of a small file is a bad_file error") {
  test_support::temp_dir dir;
  auto const vocab = small_vocab(64);
  write_gguf(dir.file("full.gguf"), make_random_llama(file_small(false), 9), &vocab,
             gguf_type::f16);
  auto const bytes = test::read_bytes(dir.file("full.gguf"));
  std::size_t const header_end =
      static_cast<std::size_t>(gguf_file(dir.file("full.gguf")).data_offset());
  auto const cut = dir.file("cut.gguf");
  // Every length through the first fields, then every third byte of the metadata and tensor
  // infos, then a sample of the data section.
  for (std::size_t n = 0; n < bytes.size(); n += (n < 256 ? 1 : n < header_end + 64 ? 3 : 251)) {
    CAPTURE(n);
    test::write_bytes(cut, bytes, n);
    auto const m = expect_error([&] { (void)gguf_file{cut}; }, errc::bad_file);
    CHECK(m.find("cut.gguf") != std::string::npos);
  }
}

TEST_CASE("gguf: malformed headers") {
  test_support::temp_dir dir;
  auto const path = dir.file("bad.gguf");
  auto const parse = [&](builder const& b) {
    test::write_bytes(path, b.b);
    return gguf_file(path);
  };
  auto const fails = [&](builder const& b, errc code) {
    return expect_error([&] { (void)parse(b); }, code);
  };

  SUBCASE("magic and version") {
    builder b;
    b.u32(0x46554748).u32(3).u64(0).u64(0);
    fails(b, errc::bad_file);
    CHECK(fails(builder{}.header(0, 0, 1), errc::unsupported).find("version 1") !=
          std::string::npos);
    fails(builder{}.header(0, 0, 4), errc::unsupported);
    CHECK(fails(builder{}.header(0, 0, 0x03000000), errc::unsupported).find("big-endian") !=
          std::string::npos);
    CHECK(parse(builder{}.header(0, 0, 2)).version() == 2);
    CHECK(parse(builder{}.header(0, 0, 3)).tensors().empty());
  }
  SUBCASE("counts the file cannot hold") {
    fails(builder{}.header(0, 1ull << 62), errc::bad_file);
    fails(builder{}.header(~0ull, 0), errc::bad_file);
    fails(builder{}.header(0, 2).str("a").u32(4).u32(1), errc::bad_file);
  }
  SUBCASE("string lengths") {
    fails(builder{}.header(0, 1).u64(~0ull), errc::bad_file);
    fails(builder{}.header(0, 1).u64(1000).u32(0), errc::bad_file);
    fails(builder{}.header(0, 1).str("k").u32(8).u64(1ull << 63), errc::bad_file);
    auto const m = fails(builder{}.header(0, 1).str("k").u32(8).u64(100).raw(std::uint64_t{0}),
                         errc::bad_file);
    CHECK(m.find("100") != std::string::npos);
  }
  SUBCASE("arrays") {
    // Array lengths beyond the file, overflowing, and of strings.
    fails(builder{}.header(0, 1).str("k").u32(9).u32(4).u64(1ull << 62).u32(0), errc::bad_file);
    fails(builder{}.header(0, 1).str("k").u32(9).u32(12).u64(~0ull).u64(0), errc::bad_file);
    fails(builder{}.header(0, 1).str("k").u32(9).u32(8).u64(1ull << 60).str("x"), errc::bad_file);
    fails(builder{}.header(0, 1).str("k").u32(9).u32(8).u64(2).str("x").u64(99), errc::bad_file);
    fails(builder{}.header(0, 1).str("k").u32(9).u32(9).u64(1).u32(4).u64(0), errc::unsupported);
    fails(builder{}.header(0, 1).str("k").u32(9).u32(13).u64(0), errc::bad_file);
  }
  SUBCASE("value types") {
    CHECK(fails(builder{}.header(0, 1).str("k").u32(13).u32(0), errc::bad_file)
              .find("unknown value type 13") != std::string::npos);
    // Every value type parses and converts.
    builder b;
    b.header(0, 14);
    b.str("u8").u32(0).raw(std::uint8_t{200});
    b.str("i8").u32(1).raw(std::int8_t{-100});
    b.str("u16").u32(2).raw(std::uint16_t{60000});
    b.str("i16").u32(3).raw(std::int16_t{-30000});
    b.str("u32").u32(4).raw(std::uint32_t{4000000000u});
    b.str("i32").u32(5).raw(std::int32_t{-2000000000});
    b.str("f32").u32(6).raw(1.5f);
    b.str("bool").u32(7).raw(std::uint8_t{1});
    b.str("str").u32(8).str("héllo");
    b.str("u64").u32(10).raw(std::uint64_t{1} << 40);
    b.str("i64").u32(11).raw(std::int64_t{-(std::int64_t{1} << 40)});
    b.str("f64").u32(12).raw(0.25);
    b.str("arr")
        .u32(9)
        .u32(3)
        .u64(3)
        .raw(std::int16_t{-1})
        .raw(std::int16_t{2})
        .raw(std::int16_t{3});
    b.str("sarr").u32(9).u32(8).u64(2).str("").str("xy");
    auto const f = parse(b);
    CHECK(f.require<int>("u8") == 200);
    CHECK(f.require<int>("i8") == -100);
    CHECK(f.require<int>("u16") == 60000);
    CHECK(f.require<int>("i16") == -30000);
    CHECK(f.require<std::uint32_t>("u32") == 4000000000u);
    CHECK(f.require<std::int32_t>("i32") == -2000000000);
    CHECK(f.require<float>("f32") == 1.5f);
    CHECK(f.require<bool>("bool"));
    CHECK(f.require<std::string_view>("str") == "héllo");
    CHECK(f.require<std::string>("str") == "héllo");
    CHECK(f.require<std::uint64_t>("u64") == std::uint64_t{1} << 40);
    CHECK(f.require<std::int64_t>("i64") == -(std::int64_t{1} << 40));
    CHECK(f.require<double>("f64") == 0.25);
    CHECK(f.get_array<int>("arr") == std::vector<int>{-1, 2, 3});
    CHECK(f.find("arr")->element_type() == gguf_value_type::int16);
    CHECK(f.get_array<std::string>("sarr") == std::vector<std::string>{"", "xy"});
    expect_error([&] { (void)f.require<std::uint8_t>("u16"); }, errc::bad_file);
    expect_error([&] { (void)f.require<std::uint32_t>("i8"); }, errc::bad_file);
    expect_error([&] { (void)f.get_array<std::uint32_t>("arr"); }, errc::bad_file);
    expect_error([&] { (void)f.get_array<int>("u8"); }, errc::bad_file);
    expect_error([&] { (void)f.find("arr")->element<int>(3); }, errc::out_of_range);
    CHECK(f.metadata()[8].key == "str");
  }
  SUBCASE("duplicates and alignment") {
    fails(builder{}
              .header(0, 2)
              .str("k")
              .u32(0)
              .raw(std::uint8_t{1})
              .str("k")
              .u32(0)
              .raw(std::uint8_t{1}),
          errc::bad_file);
    for (std::uint32_t a : {0u, 3u, 48u}) {
      CAPTURE(a);
      fails(builder{}.header(0, 1).str("general.alignment").u32(4).u32(a), errc::bad_file);
    }
    auto const f = parse(builder{}.header(0, 1).str("general.alignment").u32(4).u32(64));
    CHECK(f.alignment() == 64);
  }
  SUBCASE("tensor infos") {
    auto const one_tensor = [](std::uint32_t n_dims, std::vector<std::uint64_t> ne,
                               std::uint32_t type, std::uint64_t offset, std::size_t data_floats) {
      builder b;
      b.header(1, 0).str("t").u32(n_dims);
      for (auto n : ne) b.u64(n);
      b.u32(type).u64(offset).pad().floats(data_floats);
      return b;
    };
    auto const ok = parse(one_tensor(2, {4, 2}, 0, 0, 8));
    REQUIRE(ok.tensors().size() == 1);
    CHECK(ok.tensors()[0].bytes == 32);
    CHECK(ok.tensors()[0].data == ok.file()->data() + ok.data_offset());
    // Data out of bounds, offsets misaligned or overflowing, too many dimensions, bad types.
    CHECK(fails(one_tensor(2, {4, 2}, 0, 0, 7), errc::bad_file).find("extends past the end") !=
          std::string::npos);
    fails(one_tensor(2, {4, 2}, 0, 32, 8), errc::bad_file);
    fails(one_tensor(2, {4, 2}, 0, 4, 16), errc::bad_file);
    fails(one_tensor(2, {4, 2}, 0, ~0ull - 31, 8), errc::bad_file);
    fails(one_tensor(2, {1ull << 62, 1ull << 62}, 0, 0, 8), errc::bad_file);
    fails(one_tensor(1, {~0ull}, 0, 0, 8), errc::bad_file);
    fails(one_tensor(5, {1, 1, 1, 1, 1}, 0, 0, 8), errc::bad_file);
    CHECK(fails(one_tensor(2, {4, 2}, 99, 0, 8), errc::unsupported).find("99") !=
          std::string::npos);
    fails(one_tensor(2, {4, 2}, 2, 0, 8), errc::bad_file);  // Q4_0 rows must be multiples of 32
    CHECK(parse(one_tensor(2, {32, 1}, 2, 0, 8)).tensors()[0].bytes == 18);
    // Duplicate names.
    builder b;
    b.header(2, 0).str("t").u32(1).u64(4).u32(0).u64(0).str("t").u32(1).u64(4).u32(0).u64(32);
    b.pad().floats(16);
    fails(b, errc::bad_file);
  }
}

TEST_CASE("gguf: load_gguf rejects what it cannot run") {
  test_support::temp_dir dir;
  auto const vocab = small_vocab(64);
  auto const good = dir.file("good.gguf");
  write_gguf(good, make_random_llama(file_small(false), 2), &vocab, gguf_type::f32);
  auto const bytes = test::read_bytes(good);
  gguf_file const f(good);
  auto const bad = dir.file("bad.gguf");
  // Offsets of a string value and of tensor-info fields, found by searching the header bytes.
  auto const find = [&](std::string_view s) { return test::find_bytes(bytes, s); };

  SUBCASE("another architecture") {
    auto b = bytes;
    auto const at = find("general.architecture") + 20 + 4 + 8;  // key, type, length
    std::memcpy(b.data() + at, "gpt2!", 5);
    test::write_bytes(bad, b);
    CHECK(expect_error([&] { (void)load_gguf(bad); }, errc::unsupported).find("gpt2!") !=
          std::string::npos);
  }
  SUBCASE("quantised tensor type") {
    auto b = bytes;
    // blk.1.ffn_up.weight: name, n_dims 2, ne 32 x 64, then the type.
    auto const at = find("blk.1.ffn_up.weight") + 19 + 4 + 16;
    CHECK(test::peek<std::uint32_t>(b, at) == 0);
    test::poke(b, at, std::uint32_t{12});  // Q4_K: rows of 32 are not whole blocks
    test::write_bytes(bad, b);
    expect_error([&] { (void)load_gguf(bad); }, errc::bad_file);
    test::poke(b, at, std::uint32_t{8});  // Q8_0: a smaller tensor, within bounds
    test::write_bytes(bad, b);
    auto const m = expect_error([&] { (void)load_gguf(bad); }, errc::unsupported);
    CHECK(m.find("Q8_0") != std::string::npos);
    CHECK(m.find("blk.1.ffn_up.weight") != std::string::npos);
  }
  SUBCASE("wrong shape and missing tensor") {
    auto b = bytes;
    auto const at = find("blk.0.attn_k.weight") + 19 + 4;
    test::poke(b, at + 8, std::uint64_t{8});  // ne[1] 16 -> 8
    test::write_bytes(bad, b);
    CHECK(expect_error([&] { (void)load_gguf(bad); }, errc::bad_file).find("blk.0.attn_k") !=
          std::string::npos);
    b = bytes;
    b[find("blk.1.ffn_gate.weight") + 4] = std::byte{'X'};
    test::write_bytes(bad, b);
    CHECK(expect_error([&] { (void)load_gguf(bad); }, errc::bad_file).find("blk.1.ffn_gate") !=
          std::string::npos);
  }
  SUBCASE("non-finite or absurd RoPE base and RMSNorm epsilon, named") {
    auto const with = [&](std::string_view key, float value) {
      auto b = bytes;
      auto const at = find(key) + key.size();
      CHECK(test::peek<std::uint32_t>(b, at) == 6);  // float32
      test::poke(b, at + 4, value);
      test::write_bytes(bad, b);
      return expect_error([&] { (void)load_gguf(bad); }, errc::bad_file);
    };
    float const inf = std::numeric_limits<float>::infinity();
    CHECK(with("llama.rope.freq_base", inf)
              .find("metadata 'llama.rope.freq_base' is inf, must be a finite number in (0, ") !=
          std::string::npos);
    CHECK(with("llama.rope.freq_base", -1.0f).find("'llama.rope.freq_base' is -1") !=
          std::string::npos);
    CHECK(with("llama.rope.freq_base", 1e20f).find("'llama.rope.freq_base' is 1e+20") !=
          std::string::npos);
    CHECK(with("llama.attention.layer_norm_rms_epsilon", std::nanf(""))
              .find("metadata 'llama.attention.layer_norm_rms_epsilon' is nan") !=
          std::string::npos);
    CHECK(with("llama.attention.layer_norm_rms_epsilon", inf)
              .find("'llama.attention.layer_norm_rms_epsilon' is inf") != std::string::npos);
    CHECK(with("llama.attention.layer_norm_rms_epsilon", 0.0f)
              .find("'llama.attention.layer_norm_rms_epsilon' is 0") != std::string::npos);
    // The same checks for any config (a model built in memory).
    llama_config c = file_small(false);
    c.rope_theta = inf;
    CHECK(expect_error([&] { c.validate("model"); }, errc::bad_file)
              .find("model: rope_theta is inf") != std::string::npos);
    c = file_small(false);
    c.rms_eps = std::nanf("");
    CHECK(
        expect_error([&] { c.validate("model"); }, errc::bad_file).find("model: rms_eps is nan") !=
        std::string::npos);
  }
  SUBCASE("hyper-parameters disagreeing with the tensors") {
    auto b = bytes;
    auto const at = find("llama.embedding_length") + 22 + 4;
    test::poke(b, at, std::uint32_t{64});
    test::write_bytes(bad, b);
    expect_error([&] { (void)load_gguf(bad); }, errc::bad_file);
    test::poke(b, at, std::uint32_t{0});
    test::write_bytes(bad, b);
    expect_error([&] { (void)load_gguf(bad); }, errc::bad_file);
  }
}

TEST_CASE("gguf: a float64 value beyond the float range is refused as a float, naming the key") {
  test_support::temp_dir dir;
  auto const path = dir.file("f64.gguf");
  builder b;
  b.header(0, 3)
      .str("huge")
      .u32(12)
      .raw(1e300)
      .str("small")
      .u32(12)
      .raw(0.5)
      .str("infinite")
      .u32(12)
      .raw(std::numeric_limits<double>::infinity());
  test::write_bytes(path, b.pad().b);
  gguf_file const f(path);
  CHECK(expect_error([&] { (void)f.get<float>("huge"); }, errc::bad_file)
            .find("metadata 'huge' value 1e+300 is out of the range of float") !=
        std::string::npos);
  CHECK(f.get<double>("huge") == 1e300);
  CHECK(f.get<float>("small") == 0.5f);
  CHECK(
      std::isinf(*f.get<float>("infinite")));  // an infinity is one; the hyper-parameters refuse it
}

TEST_CASE("gguf: random header mutations never crash") {
  test_support::temp_dir dir;
  auto const vocab = small_vocab(64);
  auto const good = dir.file("good.gguf");
  write_gguf(good, make_random_llama(file_small(false), 2), &vocab, gguf_type::bf16);
  auto const bytes = test::read_bytes(good);
  auto const header = static_cast<std::size_t>(gguf_file(good).data_offset());
  auto const bad = dir.file("bad.gguf");
  std::mt19937 rng(77);
  int accepted = 0;
  for (int trial = 0; trial < 400; ++trial) {
    auto b = bytes;
    int const flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      std::size_t const at = rng() % header;
      // Favour the high bytes of lengths and counts: set a byte to 0xff or a random value.
      b[at] = static_cast<std::byte>(rng() % 2 ? 0xff : rng() & 0xff);
    }
    test::write_bytes(bad, b);
    try {
      auto const w = load_model(bad);
      ++accepted;
      float sum = 0.0f;
      for (auto const& [p, n] : tensors_of(w)) {
        for (std::size_t i = 0; i < n; ++i) sum += p[i];
      }
      (void)sum;
      (void)load_tokenizer(bad);
    } catch (specdec::error const&) {
    }
  }
  MESSAGE("mutated files accepted: ", accepted, " of 400");
}

TEST_CASE("gguf: overlapping tensors, unused tensors and non-finite weights are refused") {
  test_support::temp_dir dir;
  auto const vocab = small_vocab(64);
  auto const good = dir.file("good.gguf");
  write_gguf(good, make_random_llama(file_small(false), 2), &vocab, gguf_type::f32);
  auto const bytes = test::read_bytes(good);
  gguf_file const f(good);
  auto const bad = dir.file("bad.gguf");
  auto const find = [&](std::string_view s) { return test::find_bytes(bytes, s); };
  // The file offset of a 2-dimensional tensor's data offset field: name, n_dims, ne[2], type.
  auto const offset_field = [&](std::string_view name) {
    return find(name) + name.size() + 4 + 16 + 4;
  };

  SUBCASE("two tensors over the same bytes") {
    auto b = bytes;
    auto const q = f.find_tensor("blk.1.attn_q.weight");
    auto const o = f.find_tensor("blk.1.attn_output.weight");
    REQUIRE(q != nullptr);
    REQUIRE(o != nullptr);
    REQUIRE(test::peek<std::uint64_t>(b, offset_field("blk.1.attn_output.weight")) == o->offset);
    test::poke(b, offset_field("blk.1.attn_output.weight"), q->offset);  // an alias
    test::write_bytes(bad, b);
    auto m = expect_error([&] { (void)gguf_file(bad); }, errc::bad_file);
    CHECK(m.find("overlaps") != std::string::npos);
    CHECK(m.find("blk.1.attn_q.weight") != std::string::npos);
    CHECK(m.find("blk.1.attn_output.weight") != std::string::npos);
    test::poke(b, offset_field("blk.1.attn_output.weight"), q->offset + 32);  // a partial overlap
    test::write_bytes(bad, b);
    m = expect_error([&] { (void)load_model(bad); }, errc::bad_file);
    CHECK(m.find("overlaps") != std::string::npos);
  }
  SUBCASE("a block count below the file's layers") {
    auto b = bytes;
    auto const at = find("llama.block_count") + 17 + 4;
    REQUIRE(test::peek<std::uint32_t>(b, at) == 2);
    test::poke(b, at, std::uint32_t{1});
    test::write_bytes(bad, b);
    auto const m = expect_error([&] { (void)load_gguf(bad); }, errc::bad_file);
    CHECK(m.find("tensor 'blk.1.") != std::string::npos);
    CHECK(m.find("is not used by a llama model of 1 layers") != std::string::npos);
  }
  SUBCASE("a tensor the architecture does not use") {
    // Renamed, the untied classifier is no longer "output.weight": the model would load with the
    // embedding as its classifier and ignore the tensor.
    auto b = bytes;
    auto const at = find("output.weight");
    REQUIRE(at > 0);
    REQUIRE(static_cast<char>(b[at - 1]) != '_');  // not "attn_output.weight"
    b[at + 5] = std::byte{'X'};
    test::write_bytes(bad, b);
    auto const m = expect_error([&] { (void)load_gguf(bad); }, errc::bad_file);
    CHECK(m.find("tensor 'outpuX.weight' is not used") != std::string::npos);
  }
  SUBCASE("NaN and infinite weights, F32 and F16") {
    for (gguf_type type : {gguf_type::f32, gguf_type::f16}) {
      CAPTURE(traits(type).name);
      write_gguf(good, make_random_llama(file_small(false), 2), &vocab, type);
      auto b = test::read_bytes(good);
      gguf_file const g(good);
      auto const t = g.find_tensor("blk.0.ffn_down.weight");
      REQUIRE(t != nullptr);
      auto const at = static_cast<std::size_t>(t->data - g.file()->data()) +
                      7 * (type == gguf_type::f32 ? 4 : 2);
      if (type == gguf_type::f32)
        test::poke(b, at, -INFINITY);
      else
        test::poke(b, at, std::uint16_t{0x7e00});  // a half NaN
      test::write_bytes(bad, b);
      auto const m = expect_error([&] { (void)load_model(bad); }, errc::bad_file);
      CHECK(m.find("tensor 'blk.0.ffn_down.weight'") != std::string::npos);
      CHECK(m.find("at element 7 ") != std::string::npos);
    }
  }
}

TEST_CASE("gguf: the end-of-text set is EOS and the end-of-turn and end-of-message tokens") {
  test_support::temp_dir dir;
  auto const path = dir.file("vocab.gguf");
  auto const with = [&](std::vector<std::pair<char const*, std::uint32_t>> const& ids) {
    builder b;
    b.header(0, 2 + ids.size());
    b.str("tokenizer.ggml.model").u32(8).str("llama");
    b.str("tokenizer.ggml.tokens").u32(9).u32(8).u64(6);
    for (char const* t : {"<unk>", "<s>", "</s>", "a", "<|eot|>", "<|eom|>"}) b.str(t);
    for (auto const& [key, id] : ids) b.str(key).u32(4).u32(id);
    test::write_bytes(path, b.b);
    return tokenizer::from_gguf(gguf_file(path)).end_of_text();
  };
  CHECK(with({}) == std::vector<token_id>{2});
  CHECK(with({{"tokenizer.ggml.eos_token_id", 3}}) == std::vector<token_id>{3});
  CHECK(with({{"tokenizer.ggml.eot_token_id", 4}, {"tokenizer.ggml.eom_token_id", 5}}) ==
        std::vector<token_id>{2, 4, 5});
  CHECK(with({{"tokenizer.ggml.eot_token_id", 2}}) == std::vector<token_id>{2});
  CHECK(with({{"tokenizer.ggml.eos_token_id", 0xffffffffu}}).empty());
  CHECK_THROWS_AS(with({{"tokenizer.ggml.eot_token_id", 9}}), specdec::error);
  // stories260K.gguf names EOS only.
  CHECK(
      tokenizer::from_gguf(gguf_file(test_support::model_file("stories260K.gguf"))).end_of_text() ==
      std::vector<token_id>{2});
}
