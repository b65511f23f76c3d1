#pragma once
// The corrupted-file loop that every file reader's tests run (tests/model: llama2.c models, GGUF,
// tokenizers; tests/propose: REST datastores): a few hundred variants of a good file, from a fixed
// seed, each written out and given to a probe that reads it and, when it is accepted, uses it.
// A variant must either be refused with a specdec::error or be read and used without fault: any
// other exception fails the test, and a crash, a sanitizer report or a hang fails the ctest that
// runs it (the loops run as their own ctests, under the asan preset too: tests/CMakeLists.txt).
//
// The variants: truncations, bit flips anywhere, bytes overwritten in the header, header fields
// set to boundary values (0, 1, -1, 2^31 - 1, 2^31, 2^32 - 1, 2^63, ..., the file size), bytes
// inserted into and cut out of the header, bytes appended, and floats of the body set to NaN,
// infinities or huge values; a reader whose file carries checksums gets a `fix` function that
// makes them match again, so that its later checks are reached too.

#include "support/doctest.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "specdec/core/error.hpp"

namespace test_support {

//! What the loop saw: how many variants were refused and how many were read and used.
struct corrupt_counts {
  std::size_t refused = 0;
  std::size_t accepted = 0;
};

//! One variant of `good` (mutation kind `kind` in [0, 9)), with header fields assumed within the
//! first `header` bytes.
inline std::vector<std::byte> corrupt_variant(std::vector<std::byte> const& good,
                                              std::size_t header, std::mt19937_64& rng,
                                              unsigned kind) {
  std::vector<std::byte> b = good;
  std::size_t const n = b.size();
  header = std::max<std::size_t>(1, std::min(header, n));
  auto const pick = [&](std::size_t limit) {
    return limit == 0 ? std::size_t{0} : static_cast<std::size_t>(rng() % limit);
  };
  auto const put = [&](std::size_t at, auto value) {
    if (at + sizeof(value) <= b.size()) std::memcpy(b.data() + at, &value, sizeof(value));
  };
  switch (kind) {
    case 0:  // truncation
      b.resize(pick(n));
      break;
    case 1:  // bit flips anywhere
      for (std::size_t i = 0, flips = 1 + pick(4); i < flips; ++i)
        b[pick(n)] ^= static_cast<std::byte>(1u << pick(8));
      break;
    case 2:  // header bytes overwritten
      for (std::size_t i = 0, count = 1 + pick(4); i < count; ++i) {
        std::uint64_t const r = rng();
        b[pick(header)] = static_cast<std::byte>(r % 3 == 0 ? 0xff : r % 3 == 1 ? 0x00 : r >> 8);
      }
      break;
    case 3: {  // a 32-bit header field set to a boundary value
      std::uint32_t const values[] = {0u,          1u,          0xffffffffu,
                                      0x7fffffffu, 0x80000000u, 1u << 16,
                                      1u << 24,    1u << 30,    static_cast<std::uint32_t>(n),
                                      2u,          0xfffffffeu};
      put(pick(header / 4 + 1) * 4, values[pick(std::size(values))]);
      break;
    }
    case 4: {  // a 64-bit field set to a boundary value (at any 4-byte offset of the header)
      std::uint64_t const values[] = {0ull,
                                      1ull,
                                      ~0ull,
                                      1ull << 32,
                                      1ull << 63,
                                      (1ull << 62) + 3,
                                      std::uint64_t{n},
                                      std::uint64_t{n} + 1,
                                      0xffffffffull};
      put(pick(header / 4 + 1) * 4, values[pick(std::size(values))]);
      break;
    }
    case 5: {  // bytes inserted into the header
      std::size_t const at = pick(header + 1), count = 1 + pick(16);
      for (std::size_t i = 0; i < count; ++i)
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::byte>(rng()));
      break;
    }
    case 6: {  // bytes cut out of the header
      std::size_t const at = pick(header), count = std::min(n - at, 1 + pick(16));
      b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
              b.begin() + static_cast<std::ptrdiff_t>(at + count));
      break;
    }
    case 7:  // bytes appended
      for (std::size_t i = 0, count = 1 + pick(64); i < count; ++i)
        b.push_back(static_cast<std::byte>(rng()));
      break;
    default: {  // floats of the body set to non-finite or huge values
      float const values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              3.0e38f,
                              -3.0e38f,
                              1e-40f};
      for (std::size_t i = 0, count = 1 + pick(3); i < count; ++i) {
        std::size_t const at = n > header + 4 ? header + pick((n - header) / 4) * 4 : 0;
        put(at, values[pick(std::size(values))]);
      }
      break;
    }
  }
  return b;
}

//! Runs `variants` variants of `good` (the seed fixes them) through `probe`, which reads the file
//! at the path it is given and uses what it read; `fix`, when given, runs on every other variant
//! before it is written (to repair checksums). Fails the test on any exception other than a
//! specdec::error; returns the counts.
inline corrupt_counts corrupt_file_loop(
    std::vector<std::byte> const& good, std::size_t header, std::uint64_t seed,
    std::size_t variants, std::filesystem::path const& path,
    std::function<void(std::filesystem::path const&)> const& probe,
    std::function<void(std::vector<std::byte>&)> const& fix = {}) {
  std::mt19937_64 rng(seed);
  corrupt_counts counts;
  for (std::size_t v = 0; v < variants; ++v) {
    unsigned const kind = static_cast<unsigned>(v % 9);
    std::vector<std::byte> bytes = corrupt_variant(good, header, rng, kind);
    if (fix && v % 2 == 1) fix(bytes);
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      REQUIRE(out.is_open());
      out.write(reinterpret_cast<char const*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
      REQUIRE(out.good());
    }
    try {
      probe(path);
      ++counts.accepted;
    } catch (specdec::error const&) {
      ++counts.refused;
    } catch (std::exception const& e) {
      FAIL("variant ", v, " (mutation ", kind, ", seed ", seed,
           ") threw a std::exception that is not a specdec::error: ", e.what());
    }
  }
  return counts;
}

}  // namespace test_support
