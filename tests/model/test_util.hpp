#pragma once
// Helpers shared by the model tests: fixture paths, temporary files, byte-level file edits.

#include <doctest/doctest.h>

#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "specdec/core/error.hpp"

namespace specdec::test {

//! The model fixture directory ($SPECDEC_MODEL_DIR); fails the test when it is not set or missing.
inline std::filesystem::path model_dir() {
  char const* dir = std::getenv("SPECDEC_MODEL_DIR");
  REQUIRE_MESSAGE(dir != nullptr, "SPECDEC_MODEL_DIR is not set: the model fixtures are needed");
  std::filesystem::path const p(dir);
  REQUIRE_MESSAGE(std::filesystem::is_directory(p), "SPECDEC_MODEL_DIR=", p.string(),
                  " is not a directory: the model fixtures are needed");
  return p;
}

//! A file of the model fixture directory; fails the test when it is missing.
inline std::filesystem::path model_file(char const* name) {
  auto const p = model_dir() / name;
  REQUIRE_MESSAGE(std::filesystem::is_regular_file(p), "model fixture missing: ", p.string());
  return p;
}

//! A file of the data directory ($SPECDEC_DATA_DIR); fails the test when it is missing.
inline std::filesystem::path data_file(char const* name) {
  char const* dir = std::getenv("SPECDEC_DATA_DIR");
  REQUIRE_MESSAGE(dir != nullptr, "SPECDEC_DATA_DIR is not set: the data sets are needed");
  auto const p = std::filesystem::path(dir) / name;
  REQUIRE_MESSAGE(std::filesystem::is_regular_file(p), "data file missing: ", p.string());
  return p;
}

//! A fresh temporary directory, removed with its contents on destruction.
class temp_dir {
 public:
  temp_dir() {
    auto base =
        std::filesystem::temp_directory_path() /
        ("specdec_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(base);
    path_ = base;
  }
  temp_dir(temp_dir const&) = delete;
  temp_dir& operator=(temp_dir const&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] std::filesystem::path file(char const* name) const { return path_ / name; }
  [[nodiscard]] std::filesystem::path const& path() const { return path_; }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path path_;
};

inline std::vector<std::byte> read_bytes(std::filesystem::path const& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.is_open(), "cannot read ", p.string());
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

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

template <class T>
T peek(std::vector<std::byte> const& bytes, std::size_t offset) {
  REQUIRE(offset + sizeof(T) <= bytes.size());
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

//! Runs `f` and checks that it throws specdec::error with code `code`; returns the message.
template <class F>
std::string expect_error(F&& f, errc code) {
  try {
    f();
  } catch (specdec::error const& e) {
    CHECK_MESSAGE(e.code() == code, "expected ", to_string(code), ", got: ", std::string(e.what()));
    return e.what();
  } catch (std::exception const& e) {
    FAIL("expected specdec::error, got std::exception: ", std::string(e.what()));
    return {};
  }
  FAIL("expected specdec::error (", to_string(code), "), nothing was thrown");
  return {};
}

}  // namespace specdec::test
