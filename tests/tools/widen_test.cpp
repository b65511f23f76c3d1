// specdec-widen, run as a program: --help, the fixture widened and written as GGUF (with its
// vocabulary) and as llama2.c, read back with the shape asked for, and decoded by specdec-generate
// into the fixture's greedy reference; its errors with their exit status (2 for the command line,
// 1 at run time) and one-line message.
#include "support/doctest.hpp"

#ifdef SPECDEC_GENERATE_PATH

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "specdec/model/load.hpp"
#include "support/files.hpp"
#include "tools/fixture.hpp"
#include "tools/generate.hpp"
#include "tools/process.hpp"

namespace {

using tools_test::process_result;

process_result widen(std::vector<std::string> const& args) {
  return tools_test::run_process(tools_test::program("widen"), args);
}

// Checks a failure with exit status `status`: nothing on stdout, one line on stderr that names
// the program and contains `needle`.
void check_widen_error(std::vector<std::string> const& args, int status,
                       std::string const& needle) {
  tools_test::check_failure(widen(args), "specdec-widen", status, needle);
}

// specdec-generate's greedy tokens for "Once upon a time" with `model` (and `extra` arguments).
std::vector<std::int64_t> greedy_tokens(std::vector<std::string> const& model_args) {
  std::vector<std::string> args = model_args;
  args.insert(args.end(), {"--prompt", "Once upon a time", "-n", "40", "--json"});
  process_result const r = tools_test::run_process(tools_test::program("generate"), args);
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  return generate_test::parse_json(r.out).at("tokens").get<std::vector<std::int64_t>>();
}

}  // namespace

TEST_CASE("widen: --help lists every option and exits 0") {
  process_result const r = widen({"--help"});
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  for (char const* flag :
       {"--model", "--no-mmap", "--preset", "stories110M", "--dim", "--hidden-dim", "--layers",
        "-o, --output", "--format", "--tokenizer", "--heads", "--heads-out", "Exit status"}) {
    CAPTURE(flag);
    CHECK(r.out.find(flag) != std::string::npos);
  }
}

TEST_CASE("widen: the fixture widened decodes to its greedy reference, as GGUF and llama2.c") {
  std::filesystem::path const dir = tools_test::scratch_dir() / "widen";
  std::filesystem::create_directories(dir);
  std::vector<std::int64_t> const reference = generate_test::reference_continuation(40);

  // GGUF, with the vocabulary embedded: specdec-generate needs no --tokenizer.
  std::string const gguf = (dir / "wide.gguf").string();
  process_result const g =
      widen({"--model", tools_test::model(), "--dim", "128", "--hidden-dim", "256", "--layers", "7",
             "--tokenizer", tools_test::vocab(), "-o", gguf});
  INFO("stderr: " << g.err);
  REQUIRE(g.status == 0);
  CHECK(g.out.rfind("wrote " + gguf + " (gguf-f32): dim 64 -> 128", 0) == 0);
  CHECK(g.out.find("with its vocabulary") != std::string::npos);
  specdec::llama_weights const w = specdec::load_model(gguf);
  CHECK(w.config.dim == 128);
  CHECK(w.config.hidden_dim == 256);
  CHECK(w.config.n_layers == 7);
  CHECK(w.config.n_heads == 16);
  CHECK(w.config.n_kv_heads == 8);
  CHECK(greedy_tokens({"--model", gguf}) == reference);

  // llama2.c legacy (the default for another extension), from the mapped or the read file.
  for (bool no_mmap : {false, true}) {
    CAPTURE(no_mmap);
    std::string const bin = (dir / "wide.bin").string();
    std::vector<std::string> args = {"--model", tools_test::model(), "--dim", "96", "-o", bin};
    if (no_mmap) args.push_back("--no-mmap");
    process_result const b = widen(args);
    INFO("stderr: " << b.err);
    REQUIRE(b.status == 0);
    CHECK(b.out.rfind("wrote " + bin + " (llama2c): dim 64 -> 96, hidden_dim 172 -> 172", 0) == 0);
    CHECK(greedy_tokens({"--model", bin, "--tokenizer", tools_test::vocab()}) == reference);
  }
}

// Medusa and Hydra heads widened with the model: specdec-generate with the widened heads on the
// widened model emits the greedy reference, with the original heads' acceptance on the original.
TEST_CASE("widen: --heads widens Medusa and Hydra heads with the model") {
  std::filesystem::path const dir = tools_test::scratch_dir() / "widen_heads";
  std::filesystem::create_directories(dir);
  std::string const bin = (dir / "wide.bin").string();
  std::string const medusa =
      test_support::source_file("tools/heads/medusa/config.json").parent_path().string();
  std::string const hydra =
      test_support::source_file("tools/heads/hydra/config.json").parent_path().string();
  std::string const wide_medusa = (dir / "medusa").string(), wide_hydra = (dir / "hydra").string();
  process_result const r = widen({"--model", tools_test::model(), "--dim", "128", "--hidden-dim",
                                  "256", "-o", bin, "--heads", medusa, "--heads-out", wide_medusa,
                                  "--heads", hydra, "--heads-out", wide_hydra});
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("wrote " + wide_medusa + ": Medusa heads, dim 64 -> 128") != std::string::npos);
  CHECK(r.out.find("wrote " + wide_hydra + ": Hydra heads, dim 64 -> 128") != std::string::npos);
  CHECK(std::filesystem::is_regular_file(std::filesystem::path(wide_medusa) / "tree.json"));
  std::vector<std::int64_t> const reference = generate_test::reference_continuation(40);
  for (auto const& [strategy, original, widened] :
       {std::tuple{"medusa", medusa, wide_medusa}, std::tuple{"hydra", hydra, wide_hydra}}) {
    CAPTURE(strategy);
    auto const run = [&](std::string const& model, std::string const& heads) {
      process_result const g = tools_test::run_process(
          tools_test::program("generate"),
          {"--model", model, "--tokenizer", tools_test::vocab(), "--strategy", strategy, "--heads",
           heads, "--prompt", "Once upon a time", "-n", "40", "--json"});
      INFO("stderr: " << g.err);
      REQUIRE(g.status == 0);
      return generate_test::parse_json(g.out);
    };
    auto const a = run(tools_test::model(), original), b = run(bin, widened);
    CHECK(b.at("tokens").get<std::vector<std::int64_t>>() == reference);
    CHECK(b.at("stats").at("accepted") == a.at("stats").at("accepted"));
  }
  check_widen_error({"--model", tools_test::model(), "--dim", "128", "-o", bin, "--heads", medusa},
                    2, "each --heads DIR needs its --heads-out DIR");
  check_widen_error({"--model", tools_test::model(), "--dim", "128", "-o", bin, "--heads",
                     dir.string(), "--heads-out", wide_medusa},
                    2, "holds neither");
}

TEST_CASE("widen: bad command lines and models are refused with one line") {
  std::string const out = (tools_test::scratch_dir() / "refused.bin").string();
  std::string const model = tools_test::model();
  check_widen_error({"--dim", "128", "-o", out}, 2, "no model to widen (--model PATH)");
  check_widen_error({"--model", model, "--dim", "128"}, 2, "no output file (-o PATH)");
  check_widen_error({"--model", model, "-o", out}, 2, "no shape");
  check_widen_error({"--model", model, "--preset", "gpt5", "-o", out}, 2, "unknown preset 'gpt5'");
  check_widen_error({"--model", model, "--dim", "0", "-o", out}, 2, "--dim must be positive");
  check_widen_error({"--model", model, "--dim", "wide", "-o", out}, 2, "--dim");
  check_widen_error({"--model", model, "--dim", "100", "-o", out}, 2,
                    "not a multiple of the model's head size 8");
  check_widen_error({"--model", model, "--dim", "32", "-o", out}, 2, "smaller than the model's");
  check_widen_error({"--model", model, "--dim", "128", "--format", "onnx", "-o", out}, 2,
                    "unknown format 'onnx'");
  check_widen_error(
      {"--model", model, "--dim", "128", "--tokenizer", tools_test::vocab(), "-o", out}, 2,
      "--tokenizer only applies to GGUF output");
  check_widen_error({"--model", out + ".missing", "--dim", "128", "-o", out}, 2,
                    "--model: no such file");
  // A file that is not a model: a run-time failure.
  check_widen_error({"--model", tools_test::vocab(), "--dim", "128", "-o", out}, 1, "tok512.bin");
  CHECK(!std::filesystem::exists(out));
}

#endif  // SPECDEC_GENERATE_PATH
