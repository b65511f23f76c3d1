#pragma once
// What the command-line tests share: the programs under test and the fixture files.

#include "support/doctest.hpp"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tools/process.hpp"

namespace tools_test {

//! The program specdec-`name`, built next to specdec-generate (whose path tests/CMakeLists.txt
//! compiles in).
inline std::string program(char const* name = "generate") {
#ifdef SPECDEC_GENERATE_PATH
  return (std::filesystem::path(SPECDEC_GENERATE_PATH).parent_path() /
          (std::string("specdec-") + name))
      .string();
#else
  FAIL("specdec_tools_tests was built without SPECDEC_GENERATE_PATH (tools disabled?)");
  return name;
#endif
}

//! A file under the directory named by the environment variable `dir_variable`; fails the test
//! when it is missing.
inline std::string shared_file(char const* dir_variable, char const* name) {
  char const* dir = std::getenv(dir_variable);
  if (dir == nullptr || *dir == '\0') {
    FAIL(dir_variable << " is not set: the test needs " << name << " (ctest sets it)");
    return {};
  }
  std::filesystem::path const path = std::filesystem::path(dir) / name;
  if (!std::filesystem::exists(path)) FAIL("missing fixture file " << path.string());
  return path.string();
}

//! A fixture file under SPECDEC_MODEL_DIR.
inline std::string model_file(char const* name) {
  return shared_file("SPECDEC_MODEL_DIR", name);
}
//! A data set under SPECDEC_DATA_DIR.
inline std::string data_file(char const* name) {
  return shared_file("SPECDEC_DATA_DIR", name);
}

//! The stories260K fixture model and its tokenizer.
inline std::string model() {
  return model_file("stories260K.bin");
}
inline std::string vocab() {
  return model_file("tok512.bin");
}

}  // namespace tools_test
