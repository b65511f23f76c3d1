// How cuda_llama packs its matrices (backend/cuda/weight_layout.hpp), checked on the host: padded
// row lengths, float32 copied as is, binary16 and bfloat16 rounded to nearest even with zero
// padding, the exact round trip of every finite F16 / BF16 value (a GGUF tensor stored in either
// type packs back to its own bits), refused values, and the dtype names.

#include "support/doctest.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "specdec/backend/cuda/weight_layout.hpp"
#include "specdec/core/error.hpp"
#include "specdec/model/half.hpp"

namespace {

namespace sd = specdec;
namespace sc = specdec::cuda;

std::uint16_t half_at(std::vector<std::byte> const& bytes, std::size_t i) {
  std::uint16_t h = 0;
  std::memcpy(&h, bytes.data() + 2 * i, 2);
  return h;
}

}  // namespace

TEST_CASE("weight layout: padded rows and packed sizes") {
  CHECK(sc::padded_cols(1) == 8);
  CHECK(sc::padded_cols(8) == 8);
  CHECK(sc::padded_cols(64) == 64);
  CHECK(sc::padded_cols(172) == 176);  // stories260K's hidden width
  CHECK(sc::packed_bytes(3, 172, sd::weight_dtype::f32) == 3 * 176 * 4);
  CHECK(sc::packed_bytes(3, 172, sd::weight_dtype::bf16) == 3 * 176 * 2);
  CHECK(sd::dtype_bytes(sd::weight_dtype::f16) == 2);
  for (sd::weight_dtype t : {sd::weight_dtype::f32, sd::weight_dtype::f16, sd::weight_dtype::bf16})
    CHECK(sd::parse_weight_dtype(sd::to_string(t)) == t);
  CHECK_FALSE(sd::parse_weight_dtype("fp16").has_value());
  CHECK_FALSE(sd::parse_weight_dtype("").has_value());
}

TEST_CASE("weight layout: pack_rows rounds to nearest even and zeroes the padding") {
  std::size_t const rows = 5, cols = 13, ld = sc::padded_cols(cols);
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> src(rows * cols);
  for (float& f : src) f = normal(gen);
  src[3] = -0.0f;
  src[4] = 65504.0f;  // the largest binary16
  for (sd::weight_dtype t :
       {sd::weight_dtype::f32, sd::weight_dtype::f16, sd::weight_dtype::bf16}) {
    CAPTURE(sd::to_string(t));
    std::vector<std::byte> out(sc::packed_bytes(rows, cols, t), std::byte{0x5a});
    sc::pack_rows(src.data(), rows, cols, t, out.data(), "w");
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t c = 0; c < ld; ++c) {
        std::size_t const at = r * ld + c;
        if (t == sd::weight_dtype::f32) {
          float f = 0.0f;
          std::memcpy(&f, out.data() + 4 * at, 4);
          if (c < cols)
            CHECK(std::memcmp(&f, &src[r * cols + c], 4) == 0);
          else
            CHECK(f == 0.0f);
        } else {
          std::uint16_t const h = half_at(out, at);
          std::uint16_t const want =
              c >= cols ? std::uint16_t{0}
                        : (t == sd::weight_dtype::f16 ? sd::float_to_half(src[r * cols + c])
                                                      : sd::float_to_bf16(src[r * cols + c]));
          CHECK(h == want);
        }
      }
    }
  }
  // Rounding: ties to even in both types.
  float const tie_f16 = 1.0f + 1.0f / 2048.0f;  // halfway between 1 and 1 + 2^-10
  float const tie_bf16 = 1.0f + 1.0f / 256.0f;  // halfway between 1 and 1 + 2^-7
  std::vector<std::byte> out(sc::packed_bytes(1, 1, sd::weight_dtype::f16));
  sc::pack_rows(&tie_f16, 1, 1, sd::weight_dtype::f16, out.data(), "w");
  CHECK(half_at(out, 0) == 0x3c00);  // 1.0: the even neighbour
  sc::pack_rows(&tie_bf16, 1, 1, sd::weight_dtype::bf16, out.data(), "w");
  CHECK(half_at(out, 0) == 0x3f80);
}

TEST_CASE("weight layout: every finite F16 and BF16 value packs back to its own bits") {
  // What the GGUF reader gives for an F16 / BF16 tensor is the exact float32 of each value.
  std::vector<float> f16, bf16;
  std::vector<std::uint16_t> f16_bits, bf16_bits;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    auto const h = static_cast<std::uint16_t>(b);
    if (float const f = sd::half_to_float(h); std::isfinite(f)) {
      f16.push_back(f);
      f16_bits.push_back(h);
    }
    if (float const f = sd::bf16_to_float(h); std::isfinite(f)) {
      bf16.push_back(f);
      bf16_bits.push_back(h);
    }
  }
  REQUIRE(f16.size() == 63488);   // 65536 - 2 * 1024 infinities and NaNs
  REQUIRE(bf16.size() == 65280);  // 65536 - 2 * 128
  std::vector<std::byte> out(sc::packed_bytes(1, f16.size(), sd::weight_dtype::f16));
  sc::pack_rows(f16.data(), 1, f16.size(), sd::weight_dtype::f16, out.data(), "f16");
  std::size_t bad = 0;
  for (std::size_t i = 0; i < f16.size(); ++i) bad += half_at(out, i) != f16_bits[i];
  CHECK(bad == 0);
  out.assign(sc::packed_bytes(1, bf16.size(), sd::weight_dtype::bf16), std::byte{0});
  sc::pack_rows(bf16.data(), 1, bf16.size(), sd::weight_dtype::bf16, out.data(), "bf16");
  bad = 0;
  for (std::size_t i = 0; i < bf16.size(); ++i) bad += half_at(out, i) != bf16_bits[i];
  CHECK(bad == 0);
}

TEST_CASE("weight layout: values that do not fit the dtype are refused, naming the entry") {
  std::vector<float> const w{1.0f, 2.0f, 70000.0f, 3.0f};  // 70000 overflows binary16
  std::vector<std::byte> out(sc::packed_bytes(2, 2, sd::weight_dtype::f16));
  try {
    sc::pack_rows(w.data(), 2, 2, sd::weight_dtype::f16, out.data(), "cuda_llama: wq");
    FAIL("no exception");
  } catch (sd::error const& e) {
    CHECK(e.code() == sd::errc::numerical);
    CHECK(std::string(e.what()).find("wq: entry (1, 0)") != std::string::npos);
  }
  // bfloat16 has float32's range.
  out.assign(sc::packed_bytes(2, 2, sd::weight_dtype::bf16), std::byte{0});
  CHECK_NOTHROW(sc::pack_rows(w.data(), 2, 2, sd::weight_dtype::bf16, out.data(), "w"));
  float const inf = INFINITY;
  CHECK_THROWS_AS(sc::pack_rows(&inf, 1, 1, sd::weight_dtype::bf16, out.data(), "w"), sd::error);
  float const nan = NAN;
  CHECK_THROWS_AS(sc::pack_rows(&nan, 1, 1, sd::weight_dtype::f16, out.data(), "w"), sd::error);
}
