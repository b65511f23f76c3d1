// The umbrella header specdec/specdec.hpp includes every public header except backend/ (the CPU
// and CUDA backends), interop/ (xtensor) and internals (any detail/ directory, reached through the
// headers that use them), so a header added later cannot be forgotten in it.
#include "specdec/specdec.hpp"

#include "support/doctest.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

TEST_CASE("the umbrella header includes every header outside backend/, interop/ and detail/s") {
  std::filesystem::path const include =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "include";
  std::filesystem::path const umbrella_path = include / "specdec" / "specdec.hpp";
  REQUIRE_MESSAGE(std::filesystem::exists(umbrella_path), "missing " << umbrella_path.string());
  std::ifstream in(umbrella_path);
  std::stringstream text;
  text << in.rdbuf();
  std::string const umbrella = text.str();

  std::vector<std::string> missing;
  std::size_t checked = 0;
  for (auto const& entry : std::filesystem::recursive_directory_iterator(include / "specdec")) {
    if (!entry.is_regular_file() || entry.path().extension() != ".hpp") continue;
    std::string const rel = std::filesystem::relative(entry.path(), include).generic_string();
    if (rel == "specdec/specdec.hpp" || rel.starts_with("specdec/backend/") ||
        rel.starts_with("specdec/interop/") || rel.find("/detail/") != std::string::npos)
      continue;
    ++checked;
    if (umbrella.find("#include \"" + rel + "\"") == std::string::npos) missing.push_back(rel);
  }
  CHECK(checked > 40);
  for (std::string const& m : missing) FAIL_CHECK("specdec/specdec.hpp does not include " << m);
  // ... and none of the excluded directories.
  CHECK(umbrella.find("#include \"specdec/backend/") == std::string::npos);
  CHECK(umbrella.find("#include \"specdec/interop/") == std::string::npos);
}
