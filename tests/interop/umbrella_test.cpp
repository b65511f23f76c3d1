// The umbrella header specdec/specdec.hpp includes every public header except backend/ (the CPU
// and CUDA backends), interop/ (xtensor), internals (any detail/ directory, reached through the
// headers that use them) and the headers that need nlohmann/json, directly or through what they
// include; those are in specdec/files.hpp. So a header added later cannot be forgotten in either,
// and the umbrella needs only the standard library.
#include "specdec/specdec.hpp"

#include "support/doctest.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read_text(std::filesystem::path const& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("the umbrella header includes every header outside backend/, interop/ and detail/s") {
  std::filesystem::path const include =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "include";
  std::filesystem::path const umbrella_path = include / "specdec" / "specdec.hpp";
  REQUIRE_MESSAGE(std::filesystem::exists(umbrella_path), "missing " << umbrella_path.string());
  std::string const umbrella = read_text(umbrella_path);
  std::string const files = read_text(include / "specdec" / "files.hpp");

  // Every header's specdec includes, and whether it includes nlohmann/json itself.
  std::map<std::string, std::vector<std::string>> includes;
  std::set<std::string> json;
  std::regex const line(R"re(\s*#\s*include\s*[<"]([^>"]+)[>"].*)re");
  for (auto const& entry : std::filesystem::recursive_directory_iterator(include / "specdec")) {
    if (!entry.is_regular_file()) continue;
    std::string const ext = entry.path().extension().string();
    if (ext != ".hpp" && ext != ".cuh") continue;
    std::string const rel = std::filesystem::relative(entry.path(), include).generic_string();
    std::istringstream text(read_text(entry.path()));
    auto& list = includes[rel];
    std::smatch m;
    for (std::string l; std::getline(text, l);) {  // directives only, not comments quoting them
      if (!std::regex_match(l, m, line)) continue;
      std::string const target = m[1].str();
      if (target.starts_with("nlohmann/")) json.insert(rel);
      if (target.starts_with("specdec/")) list.push_back(target);
    }
  }
  // Which headers reach nlohmann/json (a fixed point over the include graph).
  for (bool grew = true; grew;) {
    grew = false;
    for (auto const& [header, list] : includes)
      for (std::string const& target : list)
        if (!json.contains(header) && json.contains(target)) grew = json.insert(header).second;
  }
  CHECK(json.contains("specdec/model/safetensors.hpp"));
  CHECK(json.contains("specdec/model/heads_file.hpp"));
  CHECK(!json.contains("specdec/model/heads.hpp"));
  CHECK(!json.contains("specdec/specdec.hpp"));  // the umbrella needs only the standard library

  std::vector<std::string> missing;
  std::size_t checked = 0;
  for (auto const& [rel, list] : includes) {
    if (!rel.ends_with(".hpp") || rel == "specdec/specdec.hpp" || rel == "specdec/files.hpp" ||
        rel.starts_with("specdec/backend/") || rel.starts_with("specdec/interop/") ||
        rel.find("/detail/") != std::string::npos)
      continue;
    ++checked;
    std::string const directive = "#include \"" + rel + "\"";
    if (json.contains(rel)) {
      if (files.find(directive) == std::string::npos)
        FAIL_CHECK("specdec/files.hpp does not include " << rel);
      CHECK_MESSAGE(umbrella.find(directive) == std::string::npos,
                    "specdec/specdec.hpp includes " << rel << ", which needs nlohmann/json");
    } else if (umbrella.find(directive) == std::string::npos) {
      missing.push_back(rel);
    }
  }
  CHECK(checked > 40);
  for (std::string const& m : missing) FAIL_CHECK("specdec/specdec.hpp does not include " << m);
  // ... and none of the excluded directories.
  CHECK(umbrella.find("#include \"specdec/backend/") == std::string::npos);
  CHECK(umbrella.find("#include \"specdec/interop/") == std::string::npos);
}
