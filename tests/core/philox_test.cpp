#include "specdec/core/philox.hpp"

#include "support/doctest.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

using specdec::philox;
using specdec::philox4x32_10;
using specdec::philox_block;

namespace {
void check_kat(philox_block ctr, std::uint32_t k0, std::uint32_t k1, philox_block expected) {
  philox_block const out = philox4x32_10(ctr, k0, k1);
  for (int i = 0; i < 4; ++i) CHECK(out.v[i] == expected.v[i]);
}
}  // namespace

TEST_CASE("philox4x32_10 matches the Random123 known-answer vectors") {
  check_kat({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  check_kat({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
            {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  check_kat({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
            {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

TEST_CASE("philox is usable at compile time") {
  constexpr philox_block out = philox4x32_10({{0, 0, 0, 0}}, 0, 0);
  static_assert(out.v[0] == 0x6627e8d5u);
}

TEST_CASE("philox streams are addressed by (seed, stream, offset)") {
  philox a(1234, 7);
  std::vector<std::uint32_t> words;
  for (int i = 0; i < 10; ++i) words.push_back(a.next_u32());
  CHECK(a.offset() == 10);
  // Word i is word i % 4 of the block with counter {i / 4, 0, stream, 0} and key = seed.
  for (std::uint64_t i = 0; i < 10; ++i) {
    philox_block const blk = philox4x32_10({{static_cast<std::uint32_t>(i / 4), 0, 7, 0}}, 1234, 0);
    CHECK(words[i] == blk.v[i % 4]);
    CHECK(words[i] == specdec::philox_word(1234, 7, i));
  }
  philox b(1234, 7, 5);
  CHECK(b.next_u32() == words[5]);
  b.seek(2);
  CHECK(b.next_u32() == words[2]);
  b.skip(3);
  CHECK(b.offset() == 6);
  CHECK(b.uniform_at(1) == specdec::word_to_uniform(words[7]));
  CHECK(b.offset() == 6);
  // Different streams and seeds differ.
  CHECK(specdec::philox_word(1234, 8, 0) != words[0]);
  CHECK(specdec::philox_word(1235, 7, 0) != words[0]);
  // 64-bit seeds and offsets use their high halves.
  CHECK(specdec::philox_word(1234 + (std::uint64_t{1} << 32), 7, 0) != words[0]);
  CHECK(specdec::philox_word(1234, 7, std::uint64_t{4} << 32) != words[0]);
}

TEST_CASE("philox uniforms lie in [0, 1) and look uniform") {
  CHECK(specdec::word_to_uniform(0) == 0.0f);
  CHECK(specdec::word_to_uniform(0xffffffffu) < 1.0f);
  philox rng(99);
  constexpr int n = 200000;
  constexpr int bins = 20;
  std::vector<int> hist(bins, 0);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    float const u = rng.uniform();
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    sum += u;
    ++hist[static_cast<std::size_t>(u * bins)];
  }
  CHECK(std::abs(sum / n - 0.5) < 0.005);
  // Chi-square with 19 degrees of freedom: the 0.999 quantile is 43.8.
  double chi2 = 0.0;
  double const expected = static_cast<double>(n) / bins;
  for (int h : hist) chi2 += (h - expected) * (h - expected) / expected;
  CHECK(chi2 < 43.8);
}

TEST_CASE("next_u32 keeps its last block: draws after seek, skip and copies are philox_word") {
  // The kept block must never leak into a draw at another position: every draw equals the
  // stateless word at its offset, whatever moves the offset in between.
  philox g(99, 3, 2);
  std::uint64_t checked = 0;
  for (int i = 0; i < 200; ++i) {
    if (i % 7 == 3) g.skip(static_cast<std::uint64_t>(i % 5));
    if (i % 11 == 5) g.seek(static_cast<std::uint64_t>((i * 37) % 23));
    if (i % 13 == 6) g.seek(g.offset() + (std::uint64_t{1} << 34));  // far: another high word
    philox copy = g;
    std::uint64_t const at = g.offset();
    std::uint32_t const w = g.next_u32();
    CHECK(w == specdec::philox_word(99, 3, at));
    CHECK(copy.next_u32() == w);
    CHECK(g.uniform_at(0) == specdec::philox_uniform(99, 3, at + 1));
    ++checked;
  }
  CHECK(checked == 200);
  // A block index that differs only in its high bits is a different block.
  philox h(5, 0, 0);
  (void)h.next_u32();
  h.seek(std::uint64_t{1} << 34);
  CHECK(h.next_u32() == specdec::philox_word(5, 0, std::uint64_t{1} << 34));
}
