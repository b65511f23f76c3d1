#pragma once
// Where the tests find their files, and where they write their own: the model fixtures
// (SPECDEC_MODEL_DIR), the data sets (SPECDEC_DATA_DIR), files of the source tree, temporary
// directories, and the bytes of a file. ctest sets both variables (tests/CMakeLists.txt); a missing
// variable or file FAILS the test with a message that names it, it never skips.

#include "support/doctest.hpp"

#include <unistd.h>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

namespace test_support {

// The bytes of the file at `p` (fails the test when it cannot be read).
inline std::vector<std::byte> read_bytes(std::filesystem::path const& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.is_open(), "cannot read ", p.string());
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

// The directory named by the environment variable `var`; fails the test when it is unset or not a
// directory.
inline std::filesystem::path env_dir(char const* var) {
  char const* dir = std::getenv(var);
  REQUIRE_MESSAGE((dir != nullptr && *dir != '\0'), var,
                  " is not set: the test needs it (ctest sets it; see tests/CMakeLists.txt)");
  std::filesystem::path const p(dir);
  REQUIRE_MESSAGE(std::filesystem::is_directory(p), var, "=", p.string(), " is not a directory");
  return p;
}

// The model fixture directory ($SPECDEC_MODEL_DIR).
inline std::filesystem::path model_dir() {
  return env_dir("SPECDEC_MODEL_DIR");
}

// A file of the model fixture directory; fails the test when it is missing.
inline std::filesystem::path model_file(char const* name) {
  auto const p = model_dir() / name;
  REQUIRE_MESSAGE(std::filesystem::is_regular_file(p), "model fixture missing: ", p.string());
  return p;
}

// A file of the data directory ($SPECDEC_DATA_DIR); fails the test when it is missing.
inline std::filesystem::path data_file(char const* name) {
  auto const p = env_dir("SPECDEC_DATA_DIR") / name;
  REQUIRE_MESSAGE(std::filesystem::is_regular_file(p), "data file missing: ", p.string());
  return p;
}

// A file of the source tree by its path from the repository root (found from this header's own
// path, tests/support/files.hpp); fails the test when it is missing.
inline std::filesystem::path source_file(char const* relative) {
  std::filesystem::path const here = std::filesystem::path(__FILE__).lexically_normal();
  auto const p = here.parent_path().parent_path().parent_path() / relative;
  REQUIRE_MESSAGE(std::filesystem::is_regular_file(p), "source file missing: ", p.string());
  return p;
}

// A fresh temporary directory, removed with its contents on destruction.
class temp_dir {
 public:
  temp_dir() {
    path_ = std::filesystem::temp_directory_path() /
            ("specdec_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(path_);
  }
  temp_dir(temp_dir const&) = delete;
  temp_dir& operator=(temp_dir const&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  // The path of a file `name` in the directory (not created).
  [[nodiscard]] std::filesystem::path file(char const* name) const { return path_ / name; }
  [[nodiscard]] std::filesystem::path const& path() const { return path_; }

 private:
  static std::atomic<int>& counter() {
    static std::atomic<int> c{0};
    return c;
  }
  std::filesystem::path path_;
};

}  // namespace test_support
