// specdec-generate --regex and --json-schema, run as a program on the stories260K fixture: every
// kind of strategy (prompt lookup and suffix trees wrapped in the constrained proposer, the trained
// draft model, Medusa heads and EAGLE under the constrained policy alone) gives the constrained
// autoregressive output token for token at temperature 0, and that output matches the pattern
// (checked by std::regex on the text, not by the library's automaton) and is reported valid; a
// JSON schema's output parses with the keys it declares; sampled outputs and every request of a
// batch are valid too; bad patterns and conflicting options are refused.
#include "support/doctest.hpp"

#ifdef SPECDEC_GENERATE_PATH

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
// GCC 12 warns inside <regex> itself (maybe-uninitialized, in std::function) at -O1.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>
#pragma GCC diagnostic pop

#include <nlohmann/json.hpp>

#include "support/files.hpp"
#include "tools/generate.hpp"

using namespace generate_test;

namespace constraint_tool_test {

// A JSON object the fixture fills in a few dozen tokens; ECMAScript reads it the same way.
constexpr char const* person_pattern = R"(\{"name": "[A-Z][a-z]{1,10}", "age": [1-9][0-9]?\})";

// A schema of the same object with an enum member, written once per process.
std::string person_schema() {
  fs::path const path = tools_test::scratch_dir() / "person.schema.json";
  if (!fs::exists(path)) {
    std::ofstream out(path, std::ios::trunc);
    out << R"({"type": "object",
               "properties": {"name": {"type": "string", "maxLength": 12},
                              "age": {"type": "integer"},
                              "pet": {"enum": ["cat", "dog", "bird"]}},
               "required": ["name", "age", "pet"]})";
  }
  return path.string();
}

// The directory of a file of the source tree.
std::string source_dir(char const* file) {
  return test_support::source_file(file).parent_path().string();
}

// The strategies checked: the constrained proposer's (prompt lookup, suffix, the draft model)
// and the policy's alone (Medusa, EAGLE, the block drafter: its draft rows under the constrained
// policy too).
std::vector<std::vector<std::string>> constrained_strategies() {
  return {{"--strategy", "prompt-lookup"},
          {"--strategy", "suffix"},
          {"--strategy", "draft", "--draft",
           test_support::source_file("tools/draft/stories_draft.bin").string()},
          {"--strategy", "medusa", "--heads", source_dir("tools/heads/medusa/config.json")},
          {"--strategy", "eagle", "--eagle", source_dir("tools/eagle/eagle3/config.json")},
          {"--strategy", "dspark", "--block", source_dir("tools/block/dspark/config.json")}};
}

// Checks that a run's output matches `pattern` and is reported valid.
void check_matches(json const& j, std::string const& pattern) {
  std::string const text = str(j.at("text"));
  CAPTURE(text);
  CHECK(std::regex_match(text, std::regex(pattern, std::regex::ECMAScript)));
  CHECK(str(j.at("finish_reason")) == "eos");
  json const& c = j.at("constraint");
  CHECK(str(c.at("kind")) == "regex");
  CHECK(str(c.at("source")) == pattern);
  CHECK(boolean(c.at("valid")));
}

// The first `n` prompts of tinystories_prompts.jsonl, as a --prompts file.
std::string constraint_prompts_file(std::size_t n) {
  fs::path const path =
      tools_test::scratch_dir() / ("constraint_prompts_" + std::to_string(n) + ".jsonl");
  std::ifstream in(tools_test::data_file("tinystories_prompts.jsonl"));
  std::ofstream out(path, std::ios::trunc);
  std::string line;
  for (std::size_t i = 0; i < n && std::getline(in, line); ++i) out << line << '\n';
  return path.string();
}

}  // namespace constraint_tool_test

TEST_CASE("generate --regex: every strategy gives the constrained autoregressive output") {
  using namespace constraint_tool_test;
  for (auto const& strategy : constrained_strategies()) {
    CAPTURE(strategy[1]);
    std::vector<std::string> args = once({"-n", "64", "--regex", person_pattern, "--compare"});
    args.insert(args.end(), strategy.begin(), strategy.end());
    json const j = gen_json(args);
    check_matches(j, person_pattern);
    CHECK(boolean(j.at("constraint").at("json")));  // this pattern writes JSON
    // The baseline is autoregressive under the same constraint.
    CHECK(boolean(j.at("stats").at("outputs_identical")));
    CHECK(tokens_of(j) == tokens_of(j.at("baseline")));
    // The proposers that draft from tokens alone are wrapped: forced spans pay there.
    bool const wrapped =
        strategy[1] != "medusa" && strategy[1] != "eagle" && strategy[1] != "dspark";
    CHECK(j.at("constraint").contains("forced_steps") == wrapped);
    if (wrapped) CHECK(num(j.at("constraint").at("forced_steps")) > 0);
  }
  // Without forced spans: the same output, no forced step.
  json const plain = gen_json(once({"-n", "64", "--regex", person_pattern, "--strategy",
                                    "prompt-lookup", "--compare", "--no-forced-spans"}));
  check_matches(plain, person_pattern);
  CHECK(tokens_of(plain) == tokens_of(plain.at("baseline")));
  CHECK(num(plain.at("constraint").at("forced_steps")) == 0);
  // After BOS alone the streamed text drops the first piece's leading space; the output the
  // constraint judges keeps it.
  std::string const spaced = " [a-z]+(, [a-z]+){1,3}!";
  json const bos = gen_json({"--prompt", "", "-n", "64", "--regex", spaced});
  CHECK(boolean(bos.at("constraint").at("valid")));
  CHECK(std::regex_match(" " + str(bos.at("text")), std::regex(spaced)));
  // The table says so.
  process_result const r = gen(once({"-n", "64", "--regex", person_pattern}));
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("constraint             regex \"" + std::string(person_pattern) + "\"") !=
        std::string::npos);
  CHECK(r.out.find("output valid           yes (complete)") != std::string::npos);
}

TEST_CASE("generate --json-schema: the output parses as JSON with the schema's keys") {
  using namespace constraint_tool_test;
  for (char const* layout : {"spaced", "compact"}) {
    CAPTURE(layout);
    json const j = gen_json(once(
        {"-n", "64", "--json-schema", person_schema(), "--json-whitespace", layout, "--compare"}));
    std::string const text = str(j.at("text"));
    CAPTURE(text);
    json const c = j.at("constraint");
    CHECK(str(c.at("kind")) == "json_schema");
    CHECK(str(c.at("source")) == person_schema());
    CHECK(boolean(c.at("valid")));
    CHECK(boolean(c.at("json")));
    CHECK(boolean(j.at("stats").at("outputs_identical")));
    REQUIRE(json::accept(text));
    json const value = json::parse(text);
    REQUIRE(value.is_object());
    CHECK(value.size() == 3);
    CHECK(value.at("name").is_string());
    CHECK(value.at("name").get<std::string>().size() <= 12);
    CHECK(value.at("age").is_number_integer());
    std::string const pet = str(value.at("pet"));
    CHECK((pet == "cat" || pet == "dog" || pet == "bird"));
    CHECK((text.find(", ") != std::string::npos) == (std::string(layout) == "spaced"));
  }
  process_result const r = gen(once({"-n", "64", "--json-schema", person_schema()}));
  REQUIRE(r.status == 0);
  CHECK(r.out.find("output valid           yes (complete, parses as JSON)") != std::string::npos);
}

TEST_CASE("generate --regex: sampled outputs are valid") {
  using namespace constraint_tool_test;
  for (char const* seed : {"1", "2", "3"}) {
    CAPTURE(seed);
    json const j = gen_json(once({"-n", "64", "--regex", person_pattern, "--strategy",
                                  "prompt-lookup", "--temp", "0.8", "--seed", seed}));
    check_matches(j, person_pattern);
  }
  // A sampled draft chain: its q rows are the plain sampler's, its forced spans point masses.
  json const d =
      gen_json(once({"-n", "64", "--regex", person_pattern, "--strategy", "draft", "--draft",
                     test_support::source_file("tools/draft/stories_draft.bin").string(), "--temp",
                     "0.8", "--seed", "5"}));
  check_matches(d, person_pattern);
  CHECK(str(d.at("verifier")) == "speculative sampling");
}

TEST_CASE("generate --prompts --regex: every request's output is valid") {
  using namespace constraint_tool_test;
  std::string const file = constraint_prompts_file(3);
  for (char const* strategy : {"prompt-lookup", "eagle"}) {
    CAPTURE(strategy);
    std::vector<std::string> args = {"--prompts", file,         "--batch", "2",
                                     "-n",        "64",         "--regex", person_pattern,
                                     "--json",    "--strategy", strategy};
    if (std::string(strategy) == "eagle")
      args.insert(args.end(), {"--eagle", source_dir("tools/eagle/eagle3/config.json")});
    process_result const r = gen(args);
    INFO("stderr: " << r.err);
    REQUIRE(r.status == 0);
    std::istringstream lines(r.out);
    std::string line;
    std::vector<json> all;
    while (std::getline(lines, line)) all.push_back(parse_json(line));
    REQUIRE(all.size() == 4);
    for (std::size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      check_matches(all[i], person_pattern);
      // As the prompt alone under the constraint.
      json const alone = gen_json({"--prompt", str(all[i].at("prompt")), "-n", "64", "--regex",
                                   person_pattern, "--strategy", "autoregressive"});
      CHECK(tokens_of(all[i]) == tokens_of(alone));
    }
    json const& c = all.back().at("total").at("constraint");
    CHECK(str(c.at("kind")) == "regex");
    CHECK(num(c.at("valid_outputs")) == 3);
  }
}

TEST_CASE("generate --regex, --json-schema: errors") {
  using namespace constraint_tool_test;
  // A pattern that does not compile: the compiler's message, with where.
  check_error(once({"--regex", "a(b"}), 1, "offset");
  check_error(once({"--regex", "x", "--json-schema", person_schema()}), 2,
              "give --regex or --json-schema, not both");
  check_error(once({"--regex", "x", "--ignore-eos"}), 2, "--ignore-eos");
  check_error(once({"--regex", "x", "--json-whitespace", "compact"}), 2,
              "--json-whitespace applies to --json-schema only");
  check_error(once({"--json-schema", person_schema(), "--json-whitespace", "wide"}), 2,
              "unknown --json-whitespace 'wide'");
  check_error(once({"--no-forced-spans"}), 2, "--no-forced-spans applies to --regex");
  check_error(once({"--json-schema", (tools_test::scratch_dir() / "missing.json").string()}), 2,
              "missing.json");
  // A schema the compiler refuses: its message names the keyword.
  fs::path const bad = tools_test::scratch_dir() / "bad.schema.json";
  std::ofstream(bad, std::ios::trunc) << R"({"type": "string", "format": "date"})";
  check_error(once({"--json-schema", bad.string()}), 1, "format");
}

#endif  // SPECDEC_GENERATE_PATH
