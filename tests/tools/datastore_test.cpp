// specdec-datastore, run as a program: --help, a datastore built from text, JSONL (read by
// nlohmann/json: strings, arrays of strings, escapes) and generated documents, then loaded by
// --info and by the library; and its errors with their exit status (2 for the command line, 1 at
// run time) and one-line message.
#include "support/doctest.hpp"

// These tests run the programs, which are built with the tools only (SPECDEC_BUILD_TOOLS; then
// tests/CMakeLists.txt passes SPECDEC_GENERATE_PATH and tools/CMakeLists.txt the tools' include
// directory and libraries).
#ifdef SPECDEC_GENERATE_PATH

#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

#include "specdec/propose/rest_datastore.hpp"
#include "tools/fixture.hpp"
#include "tools/process.hpp"

namespace fs = std::filesystem;
using tools_test::process_result;

namespace {

process_result datastore(std::vector<std::string> const& args) {
  return tools_test::run_process(tools_test::program("datastore"), args);
}

// Checks a failure: exit status `status`, nothing on stdout, one line on stderr that names the
// program and contains `needle`.
void check_datastore_error(std::vector<std::string> const& args, int status,
                           std::string const& needle) {
  tools_test::check_failure(datastore(args), "specdec-datastore", status, needle);
}

// The fixture's model and tokenizer, then `more`.
std::vector<std::string> with_model(std::initializer_list<std::string> more) {
  std::vector<std::string> a = {"--model", tools_test::model(), "--tokenizer", tools_test::vocab()};
  a.insert(a.end(), more);
  return a;
}

}  // namespace

TEST_CASE("datastore: --help lists every option and exits 0") {
  process_result const r = datastore({"--help"});
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  for (char const* flag : {"--model", "--tokenizer", "--output", "--info", "--text", "--jsonl",
                           "--field", "--generate", "--generate-tokens", "--temperature", "--top-p",
                           "--seed", "--threads", "--help", "Exit status"}) {
    CAPTURE(flag);
    CHECK(r.out.find(flag) != std::string::npos);
  }
  CHECK(r.out.find("(default: 256)") != std::string::npos);
}

TEST_CASE("datastore: builds from text, JSONL and generated documents, and describes the result") {
  fs::path const dir = tools_test::scratch_dir() / "datastore";
  fs::create_directories(dir);
  fs::path const text = dir / "paragraphs.txt", jsonl = dir / "docs.jsonl",
                 out = dir / "all.sdrest";
  tools_test::write_file(text, "Once upon a time.\n\nThe end.\n\n\nA third one.\n");
  // Two documents from a string and an array (escapes decoded), none from a line without the
  // field, one whose field is not a string, or an array without strings; blank lines skipped.
  tools_test::write_file(jsonl,
                         "{\"id\": 1, \"story\": \"Lily went \\\"out\\\".\\nThe sun \\u00e9!\"}\n"
                         "\n"
                         "{\"story\": [\"One.\", 7, \"Two.\"], \"other\": {\"a\": [1, 2]}}\n"
                         "{\"id\": 3}\n"
                         "{\"story\": 12}\n"
                         "{\"story\": [null]}\n");
  process_result const r = datastore(
      with_model({"--text", text.string(), "--jsonl", jsonl.string(), "--field", "story",
                  "--generate", "2", "--generate-tokens", "8", "--output", out.string()}));
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  CHECK(r.out.find("documents   8 (text 3, jsonl 3, generated 2); 3 JSONL lines without a "
                   "string 'story'") != std::string::npos);
  CHECK(r.out.find("written") != std::string::npos);

  {
    specdec::rest_datastore const ds = specdec::rest_datastore::load(out);
    CHECK(ds.num_documents() == 8);
    CHECK(ds.vocab_size() == 512);
  }

  process_result const info = datastore({"--info", out.string()});
  REQUIRE(info.status == 0);
  CHECK(info.out.find("documents   8") != std::string::npos);
  CHECK(info.out.find("vocabulary  512 ids") != std::string::npos);

  // The same sources give the same file (generation is seeded).
  fs::path const again = dir / "again.sdrest";
  REQUIRE(datastore(
              with_model({"--text", text.string(), "--jsonl", jsonl.string(), "--field", "story",
                          "--generate", "2", "--generate-tokens", "8", "--output", again.string()}))
              .status == 0);
  CHECK(tools_test::read_file(again) == tools_test::read_file(out));
}

TEST_CASE("datastore: command-line errors exit 2 with one line") {
  std::string const out = (tools_test::scratch_dir() / "unused.sdrest").string();
  std::string const text = tools_test::data_file("tinystories_prompts.jsonl");
  check_datastore_error({"--bogus"}, 2, "unknown option '--bogus'");
  check_datastore_error({"--model"}, 2, "--model needs a value");
  check_datastore_error(with_model({"--jsonl", text, "--output", out, "--output", out}), 2,
                        "--output is given more than once");
  check_datastore_error(
      with_model({"--jsonl", text, "--field", "a", "--field", "b", "--output", out}), 2,
      "--field is given more than once");
  check_datastore_error(with_model({"--jsonl", text}), 2, "--output is required");
  check_datastore_error({"--jsonl", text, "--output", out}, 2, "--model is required");
  check_datastore_error(with_model({"--output", out}), 2, "no source");
  check_datastore_error({"--info", out, "--model", tools_test::model()}, 2,
                        "--info takes no other option");
  check_datastore_error(with_model({"--generate", "-1", "--output", out}), 2, "--generate expects");
  check_datastore_error(with_model({"--generate", "2", "--generate-tokens", "0", "--output", out}),
                        2, "--generate-tokens must be at least 1");
  check_datastore_error(with_model({"--generate", "1", "--top-p", "0", "--output", out}), 2,
                        "--top-p");
  check_datastore_error(with_model({"--generate", "1", "--temperature", "x", "--output", out}), 2,
                        "--temperature expects a number");
  check_datastore_error(with_model({"--generate", "1", "--threads", "0", "--output", out}), 2,
                        "--threads must be at least 1");
  // Options that would change nothing are refused, naming what they apply to.
  for (char const* option :
       {"--generate-tokens", "--temperature", "--top-p", "--seed", "--threads"})
    check_datastore_error(with_model({"--jsonl", text, "--output", out, option, "1"}), 2,
                          std::string(option) + " applies to --generate only");
  check_datastore_error(with_model({"--generate", "1", "--field", "story", "--output", out}), 2,
                        "--field applies to --jsonl only");
  check_datastore_error({"--info", out, "--tokenizer", tools_test::vocab()}, 2,
                        "--info takes no other option (--tokenizer given)");
}

TEST_CASE("datastore: run-time errors exit 1 with one line") {
  fs::path const bad = tools_test::scratch_dir() / "bad.jsonl";
  tools_test::write_file(bad, "{\"text\": \"fine\"}\n{\"text\": \"unterminated}\n");
  std::string const out = (tools_test::scratch_dir() / "bad.sdrest").string();
  check_datastore_error(with_model({"--jsonl", bad.string(), "--output", out}), 1,
                        bad.string() + ":2: malformed JSON");
  tools_test::write_file(bad, "[\"an array, not an object\"]\n");
  check_datastore_error(with_model({"--jsonl", bad.string(), "--output", out}), 1,
                        ":1: malformed JSON: not a JSON object");
  check_datastore_error(with_model({"--text", "/nonexistent/file.txt", "--output", out}), 1,
                        "cannot read '/nonexistent/file.txt'");
  check_datastore_error({"--info", "/nonexistent/store.sdrest"}, 1, "specdec");
  // A JSONL file none of whose lines has the field: the field is named, not "no text".
  tools_test::write_file(bad, "{\"story\": \"a\"}\n\n{\"story\": \"b\"}\n");
  check_datastore_error(with_model({"--jsonl", bad.string(), "--output", out}), 1,
                        bad.string() +
                            ": none of its 2 lines has a string field 'text' (choose the field "
                            "with --field)");
}

#endif  // SPECDEC_GENERATE_PATH
