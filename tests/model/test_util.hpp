#pragma once
// Helpers shared by the model tests: byte-level edits of the files they write (fixture paths and
// temporary directories: support/files.hpp; error checks: support/errors.hpp).

#include "support/doctest.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "support/files.hpp"

namespace specdec::test {

using test_support::read_bytes;

inline void write_bytes(std::filesystem::path const& p, std::vector<std::byte> const& bytes,
                        std::size_t count) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  REQUIRE(out.is_open());
  out.write(reinterpret_cast<char const*>(bytes.data()), static_cast<std::streamsize>(count));
  REQUIRE(out.good());
}

inline void write_bytes(std::filesystem::path const& p, std::vector<std::byte> const& bytes) {
  write_bytes(p, bytes, bytes.size());
}

template <class T>
void poke(std::vector<std::byte>& bytes, std::size_t offset, T value) {
  REQUIRE(offset + sizeof(T) <= bytes.size());
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}

//! The offset of the first occurrence of `text` in `bytes`; fails the test when there is none.
inline std::size_t find_bytes(std::vector<std::byte> const& bytes, std::string_view text) {
  for (std::size_t i = 0; i + text.size() <= bytes.size(); ++i)
    if (std::memcmp(bytes.data() + i, text.data(), text.size()) == 0) return i;
  FAIL("not found: ", text);
  return 0;
}

template <class T>
T peek(std::vector<std::byte> const& bytes, std::size_t offset) {
  REQUIRE(offset + sizeof(T) <= bytes.size());
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

}  // namespace specdec::test
