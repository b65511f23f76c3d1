// specdec-randmodel, run as a program: --help, models written in each format and read back by
// the library, and its errors with their exit status (2 for the command line) and one-line
// message.
#include "support/doctest.hpp"

// These tests run the programs, which are built with the tools only (SPECDEC_BUILD_TOOLS; then
// tests/CMakeLists.txt passes SPECDEC_GENERATE_PATH and tools/CMakeLists.txt the tools' include
// directory and libraries).
#ifdef SPECDEC_GENERATE_PATH

#include <filesystem>
#include <string>
#include <vector>

#include "specdec/model/load.hpp"
#include "tools/fixture.hpp"
#include "tools/process.hpp"

namespace fs = std::filesystem;
using tools_test::process_result;

namespace {

process_result randmodel(std::vector<std::string> const& args) {
  return tools_test::run_process(tools_test::program("randmodel"), args);
}

// Checks a failure: exit status 2, nothing on stdout, one line on stderr that names the program
// and contains `needle`.
void check_usage_error(std::vector<std::string> const& args, std::string const& needle) {
  tools_test::check_failure(randmodel(args), "specdec-randmodel", 2, needle);
}

// A small explicit shape.
std::vector<std::string> small(std::string const& output) {
  return {"--dim",      "16", "--hidden-dim", "32",  "--layers",  "2",  "--heads", "2",
          "--kv-heads", "1",  "--vocab",      "512", "--seq-len", "64", "-o",      output};
}

}  // namespace

TEST_CASE("randmodel: --help lists every option and exits 0") {
  process_result const r = randmodel({"--help"});
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  for (char const* flag :
       {"--preset",     "stories110M", "--dim",       "--hidden-dim", "--layers",
        "--heads",      "--kv-heads",  "--vocab",     "--seq-len",    "--rope-theta",
        "--rms-eps",    "--tied",      "--untied",    "--seed",       "--stddev",
        "-o, --output", "--format",    "--tokenizer", "--help",       "Exit status"}) {
    CAPTURE(flag);
    CHECK(r.out.find(flag) != std::string::npos);
  }
}

TEST_CASE("randmodel: writes each format, read back with the shape asked for") {
  fs::path const dir = tools_test::scratch_dir() / "randmodel";
  fs::create_directories(dir);
  for (char const* format : {"llama2c", "llama2c-v1", "llama2c-q8", "gguf-f32", "gguf-f16"}) {
    CAPTURE(format);
    fs::path const path = dir / (std::string(format) + ".bin");
    std::vector<std::string> args = small(path.string());
    args.insert(args.end(), {"--format", format, "--untied", "--seed", "3"});
    process_result const r = randmodel(args);
    INFO("stderr: " << r.err);
    REQUIRE(r.status == 0);
    CHECK(r.out.rfind("wrote " + path.string() + " (" + format + ")", 0) == 0);
    specdec::llama_weights const w = specdec::load_model(path);
    CHECK(w.config.dim == 16);
    CHECK(w.config.hidden_dim == 32);
    CHECK(w.config.n_layers == 2);
    CHECK(w.config.n_heads == 2);
    CHECK(w.config.n_kv_heads == 1);
    CHECK(w.config.vocab_size == 512);
    CHECK(w.config.seq_len == 64);
    CHECK(!w.config.shared_classifier);
  }
  // A preset, its extension choosing GGUF, with the fixture's vocabulary embedded.
  fs::path const gguf = dir / "preset.gguf";
  process_result const r = randmodel(
      {"--preset", "stories260K", "--tokenizer", tools_test::vocab(), "-o", gguf.string()});
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("(gguf-f32)") != std::string::npos);
  specdec::llama_weights const w = specdec::load_model(gguf);
  CHECK(w.config.dim == 64);
  CHECK(w.config.vocab_size == 512);
  CHECK(w.config.shared_classifier);
  // The same seed writes the same file.
  fs::path const a = dir / "a.bin", b = dir / "b.bin";
  REQUIRE(randmodel(small(a.string())).status == 0);
  REQUIRE(randmodel(small(b.string())).status == 0);
  CHECK(tools_test::read_file(a) == tools_test::read_file(b));
}

TEST_CASE("randmodel: command-line errors exit 2 with one line") {
  std::string const out = (tools_test::scratch_dir() / "unused.bin").string();
  check_usage_error({"--preset", "stories260K"}, "no output file (-o PATH)");
  check_usage_error({"--bogus", "-o", out}, "unknown option '--bogus'");
  check_usage_error({"--preset"}, "--preset needs a value");
  check_usage_error({"--preset", "stories260K", "-o", out, "--output", out},
                    "--output is given more than once");
  check_usage_error({"--preset", "stories260K", "--seed", "1", "--seed", "2", "-o", out},
                    "--seed is given more than once");
  check_usage_error({"--preset", "stories260K", "--tied", "--tied", "-o", out},
                    "--tied is given more than once");
  check_usage_error({"--preset", "stories260K", "--tied", "--untied", "-o", out}, "excludes");
  check_usage_error({"--preset", "nope", "-o", out}, "unknown preset 'nope'");
  check_usage_error({"--dim", "16", "-o", out}, "give --preset or all of");
  check_usage_error({"--preset", "stories260K", "--dim", "1.5", "-o", out}, "--dim expects");
  check_usage_error({"--preset", "stories260K", "--stddev", "0", "-o", out},
                    "--stddev must be positive");
  check_usage_error({"--preset", "stories260K", "--seed", "-2", "-o", out}, "--seed expects");
  check_usage_error({"--preset", "stories260K", "--format", "onnx", "-o", out},
                    "unknown format 'onnx'");
  check_usage_error({"--preset", "stories260K", "--tokenizer", tools_test::vocab(), "-o", out},
                    "--tokenizer only applies to GGUF output");
  // Options that a llama2.c file cannot store would do nothing: refused.
  check_usage_error({"--preset", "stories260K", "--rope-theta", "500000", "-o", out},
                    "--rope-theta only applies to GGUF output");
  check_usage_error(
      {"--preset", "stories260K", "--rms-eps", "1e-6", "--format", "llama2c-v1", "-o", out},
      "--rms-eps only applies to GGUF output");
}

#endif  // SPECDEC_GENERATE_PATH
