// tools/run.sh generate, run as the README runs it (on this build's preset, given through
// SPECDEC_PRESET): stdout holds only the program's output, so `... --json | jq` works (the
// build's output goes to stderr), and flags given are added to the default run's fixture paths
// and settings, each replacing its own default.
#include "support/doctest.hpp"

#if defined(SPECDEC_GENERATE_PATH) && defined(SPECDEC_SOURCE_DIR) && defined(SPECDEC_BUILD_PRESET)

#include <string>
#include <vector>

#include "tools/generate.hpp"
#include "tools/process.hpp"

using namespace generate_test;

namespace {

process_result run_script(std::vector<std::string> const& args) {
  std::vector<std::string> all = {std::string(SPECDEC_SOURCE_DIR) + "/tools/run.sh", "generate"};
  all.insert(all.end(), args.begin(), args.end());
  return tools_test::run_process(
      "/bin/bash", all, {std::string("SPECDEC_PRESET=") + SPECDEC_BUILD_PRESET, "SPECDEC_JOBS=1"});
}

}  // namespace

TEST_CASE("run.sh generate: flags add to the default run; stdout is the program's alone") {
  if (std::string(SPECDEC_BUILD_PRESET).empty()) {
    MESSAGE("skipped: this build directory is not build/<preset>, which run.sh builds into");
    return;
  }
  process_result const r = run_script({"--json", "-n", "12", "--repeat", "1"});
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  json const j = parse_json(r.out);  // exactly one JSON value: no build output on stdout
  // The defaults stay: the fixture, the trained draft model with k = 3, the prompt, --compare.
  CHECK(str(j.at("strategy")) == "draft");
  CHECK(str(j.at("description")).find("k = 3") != std::string::npos);
  CHECK(str(j.at("prompt")) == "Once upon a time");
  CHECK(j.contains("baseline"));
  CHECK(tokens_of(j) == reference_continuation(12));
  CHECK(num(j.at("repeat")) == 1);
  // A flag replaces its default; --strategy replaces the default strategy and its options.
  process_result const other =
      run_script({"--json", "-n", "6", "--strategy", "prompt-lookup", "--prompt", "Lily"});
  INFO("stderr: " << other.err);
  REQUIRE(other.status == 0);
  json const k = parse_json(other.out);
  CHECK(str(k.at("strategy")) == "prompt-lookup");
  CHECK(str(k.at("prompt")) == "Lily");
  CHECK(tokens_of(k).size() == 6);
}

#endif
