#pragma once
// What the specdec-generate tests share: running the program on the stories260K fixture (with
// --json parsed by nlohmann/json), checking its one-line errors, the reference greedy ids, and a
// random draft model and a REST datastore built once per process.

#include "support/doctest.hpp"

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "specdec/model/llama2c.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/tokenizer.hpp"
#include "tools/fixture.hpp"
#include "tools/process.hpp"

namespace generate_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using tools_test::model;
using tools_test::model_file;
using tools_test::process_result;
using tools_test::vocab;

inline std::string program() {
  return tools_test::program("generate");
}

// `text` parsed as exactly one JSON document (nlohmann/json accepts nothing else); fails the test
// when it is not one.
inline json parse_json(std::string const& text) {
  try {
    return json::parse(text);
  } catch (std::exception const& e) {
    FAIL("not one JSON value: " << e.what() << "\n" << text);
  }
  return {};
}

// The reference greedy continuation of "Once upon a time" (MANIFEST.md), after the prompt.
inline std::vector<std::int64_t> reference_continuation(std::size_t n) {
  std::ifstream in(model_file("reference_greedy_once_upon_a_time.ids"));
  std::vector<std::int64_t> ids;
  std::int64_t t = 0;
  while (in >> t) ids.push_back(t);
  REQUIRE(ids.size() == 256);
  REQUIRE(n + 4 <= ids.size());
  return std::vector<std::int64_t>(ids.begin() + 4, ids.begin() + 4 + static_cast<long>(n));
}

inline specdec::tokenizer const& tok() {
  static specdec::tokenizer const t = specdec::load_tokenizer(model(), fs::path(vocab()));
  return t;
}

// Writes a random-weight llama2.c model of the fixture's vocabulary (or `vocab_size`) once per
// process and returns its path.
inline std::string random_draft(std::int32_t vocab_size = 512) {
  fs::path const path =
      tools_test::scratch_dir() / ("draft_" + std::to_string(vocab_size) + ".bin");
  if (!fs::exists(path)) {
    specdec::llama_config c;
    c.dim = 16;
    c.hidden_dim = 32;
    c.n_layers = 1;
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.vocab_size = vocab_size;
    c.seq_len = 512;
    specdec::write_llama2c(path, specdec::make_random_llama(c, 7, 0.5f));
  }
  return path.string();
}

// A REST datastore of the TinyStories stories, built once per process by specdec-datastore.
inline std::string stories_datastore() {
  fs::path const path = tools_test::scratch_dir() / "stories.sdrest";
  if (!fs::exists(path)) {
    process_result const r = tools_test::run_process(
        tools_test::program("datastore"), {"--model", model(), "--tokenizer", vocab(), "--jsonl",
                                           tools_test::data_file("tinystories_prompts.jsonl"),
                                           "--field", "story", "--output", path.string()});
    INFO("stderr: " << r.err);
    REQUIRE(r.status == 0);
  }
  return path.string();
}

// Runs the program with the fixture's model and tokenizer followed by `args`.
inline process_result gen(std::vector<std::string> const& args) {
  std::vector<std::string> all = {"--model", model(), "--tokenizer", vocab()};
  all.insert(all.end(), args.begin(), args.end());
  return tools_test::run_process(program(), all);
}

// Runs with --json, requires success, and parses stdout (which must be one JSON object).
inline json gen_json(std::vector<std::string> args) {
  args.push_back("--json");
  process_result const r = gen(args);
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  REQUIRE(!r.out.empty());
  CHECK(r.out.back() == '\n');
  json const v = parse_json(r.out);
  REQUIRE(v.is_object());
  return v;
}

// Checks a command-line failure: exit status `status`, nothing on stdout, one line on stderr
// that names the program and contains `needle`.
inline void check_error(std::vector<std::string> const& args, int status, std::string const& needle,
                        bool with_fixture = true) {
  process_result const r = with_fixture ? gen(args) : tools_test::run_process(program(), args);
  INFO("stderr: " << r.err);
  CHECK(r.status == status);
  CHECK(r.out.empty());
  REQUIRE(!r.err.empty());
  CHECK(r.err.rfind("specdec-generate: ", 0) == 0);
  CHECK(r.err.find('\n') == r.err.size() - 1);  // exactly one line
  CHECK(r.err.find(needle) != std::string::npos);
}

inline std::vector<std::string> once(std::initializer_list<std::string> more) {
  std::vector<std::string> a = {"--prompt", "Once upon a time"};
  a.insert(a.end(), more);
  return a;
}

// Members of a JSON value, failing the test (not crashing) when one is missing or mistyped.
inline std::vector<std::int64_t> ints(json const& j) {
  REQUIRE(j.is_array());
  return j.get<std::vector<std::int64_t>>();
}
inline std::string str(json const& j) {
  REQUIRE(j.is_string());
  return j.get<std::string>();
}
inline double num(json const& j) {
  REQUIRE(j.is_number());
  return j.get<double>();
}
inline bool boolean(json const& j) {
  REQUIRE(j.is_boolean());
  return j.get<bool>();
}

inline std::vector<std::int64_t> tokens_of(json const& j) {
  return ints(j.at("tokens"));
}

}  // namespace generate_test
