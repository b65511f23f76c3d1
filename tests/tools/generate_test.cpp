// specdec-generate, run as a program on the stories260K fixture: the effect of every flag, the
// --json fields, greedy --compare giving identical outputs for every strategy, and every error
// with its exit status (2 for the command line, 1 at run time) and its one-line message. The
// strategy table (tools/generate/strategies.hpp) drives the checks that cover every strategy and
// every option: --help, options of another strategy, greedy outputs.
#include "support/doctest.hpp"

// These tests run the programs, which are built with the tools only (SPECDEC_BUILD_TOOLS; then
// tests/CMakeLists.txt passes SPECDEC_GENERATE_PATH and tools/CMakeLists.txt the tools' include
// directory and libraries).
#ifdef SPECDEC_GENERATE_PATH

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/options.hpp"
#include "generate/strategies.hpp"
#include "specdec/core/cpu_target.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/sparse_tree.hpp"
#include "support/files.hpp"
#include "tools/fixture.hpp"
#include "tools/generate.hpp"
#include "tools/process.hpp"

using namespace generate_test;
namespace sd = specdec;
using json = nlohmann::json;
using tools_test::model;
using tools_test::model_file;
using tools_test::process_result;
using tools_test::vocab;
namespace fs = std::filesystem;

namespace {

// A valid value for `o` on the command line (none for a flag); required files get real ones.
std::vector<std::string> valid_value(generate::option_spec const& o) {
  switch (o.kind) {
    case generate::value_kind::flag:
      return {};
    case generate::value_kind::count:
      return {std::to_string(std::max(o.count_default, o.count_lo))};
    case generate::value_kind::real:
      return {generate::option_spec::number_text(o.real_default)};
    case generate::value_kind::text:
      return {"x"};
    case generate::value_kind::file:
      return {o.flag == "--datastore" ? stories_datastore() : model()};
    case generate::value_kind::layers:
      return {"0"};
  }
  return {};
}

// "--strategy NAME" and the strategy's required options, with valid values (--heads: the heads
// trained for the fixture, tools/heads/<strategy>; --eagle: tools/eagle/eagle3; --block:
// tools/block/dspark).
std::vector<std::string> strategy_args(generate::strategy const& s) {
  std::vector<std::string> args = {"--strategy", std::string(s.name)};
  for (generate::option_spec const* o : s.options) {
    if (!o->required) continue;
    args.emplace_back(o->flag);
    if (o->flag == "--eagle") {
      args.push_back(
          test_support::source_file("tools/eagle/eagle3/config.json").parent_path().string());
      continue;
    }
    if (o->flag == "--block") {
      args.push_back(
          test_support::source_file("tools/block/dspark/config.json").parent_path().string());
      continue;
    }
    if (o->flag == "--heads") {
      args.push_back(
          test_support::source_file(("tools/heads/" + std::string(s.name) + "/config.json").c_str())
              .parent_path()
              .string());
      continue;
    }
    for (std::string const& v : valid_value(*o)) args.push_back(v);
  }
  return args;
}

}  // namespace

TEST_CASE("generate: --help lists every flag and exits 0") {
  process_result const r = tools_test::run_process(program(), {"--help"});
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  for (char const* flag : {"--model",
                           "--tokenizer",
                           "--draft",
                           "--strategy",
                           "-k",
                           "--temp",
                           "--top-k",
                           "--top-p",
                           "--min-p",
                           "--seed",
                           "--prompt",
                           "--prompt-file",
                           "-n",
                           "--compare",
                           "--repeat",
                           "--json",
                           "--threads",
                           "--skip-layers",
                           "--repetition-penalty",
                           "--adaptive",
                           "--ngram",
                           "--branches",
                           "--stop",
                           "--ignore-eos",
                           "autoregressive",
                           "prompt-lookup",
                           "layer-skip"}) {
    CAPTURE(flag);
    CHECK(r.out.find(flag) != std::string::npos);
  }
}

TEST_CASE("generate: streams the text, then the statistics table and the comparison") {
  process_result const r =
      gen(once({"--strategy", "draft", "--draft", model(), "-n", "40", "--compare"}));
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  std::vector<specdec::token_id> ids;
  for (auto t : reference_continuation(40)) ids.push_back(static_cast<specdec::token_id>(t));
  std::string const text =
      "Once upon a time" + tok().decode(std::span<specdec::token_id const>(ids));
  CHECK(r.out.rfind(text + "\n", 0) == 0);  // the prompt, then the streamed continuation
  for (char const* label :
       {"steps", "drafted", "accepted", "acceptance rate", "acceptance by depth",
        "mean accepted length", "tokens/s", "propose", "score", "verify", "commit", "prefill",
        "baseline", "speedup", "outputs identical      yes"}) {
    CAPTURE(label);
    CHECK(r.out.find(label, text.size()) != std::string::npos);
  }
}

TEST_CASE("generate: --repeat runs the request and the baseline several times, streams once") {
  process_result const r = gen(
      once({"--strategy", "draft", "--draft", model(), "-n", "16", "--compare", "--repeat", "3"}));
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  std::vector<specdec::token_id> ids;
  for (auto t : reference_continuation(16)) ids.push_back(static_cast<specdec::token_id>(t));
  std::string const text =
      "Once upon a time" + tok().decode(std::span<specdec::token_id const>(ids));
  CHECK(r.out.rfind(text + "\n", 0) == 0);
  CHECK(r.out.find(text, 1) == std::string::npos);  // streamed by the first run only
  CHECK(r.out.find("the run of median time of 3, for each, run alternately") != std::string::npos);
  CHECK(r.out.find("outputs identical      yes") != std::string::npos);

  json const j = gen_json(once({"--strategy", "prompt-lookup", "-n", "16", "--compare", "--repeat",
                                "4", "--temp", "1", "--seed", "3"}));
  CHECK(num(j.at("repeat")) == 4);
  json const single =
      gen_json(once({"--strategy", "prompt-lookup", "-n", "16", "--temp", "1", "--seed", "3"}));
  CHECK(num(single.at("repeat")) == 1);
  CHECK(tokens_of(j) == tokens_of(single));  // every run of a seeded request is the same
  CHECK(ints(j.at("baseline").at("tokens")).size() == 16);
  CHECK(num(j.at("stats").at("speedup")) > 0.0);
}

TEST_CASE("generate: --json fields") {
  json const j =
      gen_json(once({"--strategy", "draft", "--draft", model(), "-n", "24", "--compare"}));
  CHECK(str(j.at("strategy")) == "draft");
  CHECK(str(j.at("verifier")) == "greedy");
  CHECK(str(j.at("finish_reason")) == "max_tokens");
  CHECK(str(j.at("prompt")) == "Once upon a time");
  CHECK(ints(j.at("prompt_ids")) == std::vector<std::int64_t>{1, 403, 407, 261, 378});
  auto const tokens = tokens_of(j);
  CHECK(tokens == reference_continuation(24));
  std::vector<specdec::token_id> ids(tokens.begin(), tokens.end());
  CHECK(str(j.at("text")) == tok().decode(std::span<specdec::token_id const>(ids)));

  json const& s = j.at("stats");
  for (char const* key : {"steps", "drafted", "accepted", "acceptance_rate", "mean_accepted_length",
                          "tokens_per_second", "baseline_tokens_per_second", "speedup",
                          "prefill_seconds", "propose_seconds", "score_seconds", "verify_seconds",
                          "commit_seconds", "total_seconds", "generated", "prompt_tokens"}) {
    CAPTURE(key);
    REQUIRE(s.contains(key));
    CHECK(s.at(key).is_number());
    CHECK(num(s.at(key)) >= 0.0);
  }
  double const steps = num(s.at("steps")), accepted = num(s.at("accepted"));
  CHECK(num(s.at("generated")) == 24);
  CHECK(num(s.at("prompt_tokens")) == 5);
  // The target drafts for itself: every draft is accepted.
  CHECK(accepted == num(s.at("drafted")));
  CHECK(num(s.at("mean_accepted_length")) == doctest::Approx((accepted + steps) / steps));
  CHECK(num(s.at("tokens_per_second")) > 0.0);
  CHECK(num(s.at("speedup")) ==
        doctest::Approx(num(s.at("tokens_per_second")) / num(s.at("baseline_tokens_per_second"))));
  REQUIRE(s.contains("outputs_identical"));
  CHECK(boolean(s.at("outputs_identical")));
  CHECK(ints(s.at("drafted_at_depth")).size() == 4);
  REQUIRE(s.at("acceptance_by_depth").is_array());
  CHECK(s.at("acceptance_by_depth").size() == 4);
  CHECK(ints(j.at("baseline").at("tokens")) == tokens);
}

TEST_CASE("generate: greedy --compare is identical for every strategy") {
  std::vector<std::vector<std::string>> const cases = {
      {"--strategy", "autoregressive"},
      {"--strategy", "draft", "--draft", model()},
      {"--strategy", "draft", "--draft", random_draft()},
      {"--strategy", "draft", "--draft", random_draft(), "--adaptive", "--k-max", "6"},
      {"--strategy", "prompt-lookup"},
      {"--strategy", "prompt-lookup", "--branches", "3", "--ngram", "2"},
      {"--strategy", "layer-skip"},
      {"--strategy", "layer-skip", "--skip-layers", "1,3", "--confidence", "0.2"},
      {"--strategy", "sparse-kv"},
      {"--strategy", "sparse-kv", "--sinks", "4", "--budget", "20", "--fixed-k", "-k", "3"},
      {"--strategy", "sparse-kv", "--kv-policy", "snapkv", "--kv-budget", "8", "--kv-window", "2"},
      {"--strategy", "sparse-kv", "--kv-policy", "retrieval", "--kv-budget", "12", "--kv-window",
       "2"},
      {"--strategy", "lookahead"},
      {"--strategy", "lookahead", "--lookahead-window", "3", "--lookahead-ngram", "3"},
      {"--strategy", "jacobi", "-k", "5"},
  };
  for (auto const& c : cases) {
    std::vector<std::string> args = once({"-n", "48", "--compare"});
    args.insert(args.end(), c.begin(), c.end());
    CAPTURE(args[5]);
    CAPTURE(args.back());
    json const j = gen_json(args);
    CHECK(boolean(j.at("stats").at("outputs_identical")));
    CHECK(tokens_of(j) == reference_continuation(48));
    CHECK(str(j.at("verifier")) == (c[1] == "autoregressive" ? "none" : "greedy"));
  }
}

TEST_CASE("generate: --cpu-target and --verbose") {
  check_error(once({"--strategy", "autoregressive", "--cpu-target", "sse9"}), 2,
              "unknown CPU target 'sse9' (baseline, avx2, avx512)");
  for (sd::cpu_target t : sd::all_cpu_targets) {
    std::string const name(sd::to_string(t));
    CAPTURE(name);
    std::vector<std::string> const args = once({"--strategy", "draft", "--draft", model(), "-n",
                                                "32", "--json", "--verbose", "--cpu-target", name});
    process_result const r = gen(args);
    // The tool is built as the tests are: the same targets compiled; the CPU is this one.
    if (!sd::cpu_target_compiled(t)) {
      CHECK(r.status == 2);
      CHECK(r.err.find("is not compiled in this build") != std::string::npos);
    } else if (!sd::cpu_target_supported(t)) {
      CHECK(r.status == 2);
      CHECK(r.err.find("this CPU cannot run it") != std::string::npos);
    } else {
      // Every target gives the greedy reference, and says which one ran.
      REQUIRE(r.status == 0);
      CHECK(r.err.find("cpu target " + name + " (compiled:") != std::string::npos);
      json const j = json::parse(r.out);
      CHECK(str(j.at("stats").at("cpu_target")) == name);
      CHECK(tokens_of(j) == reference_continuation(32));
    }
  }
}

TEST_CASE("generate: --device and --dtype") {
  check_error(once({"--strategy", "autoregressive", "--device", "tpu"}), 2,
              "unknown device 'tpu' (cpu, cuda)");
  check_error(once({"--strategy", "autoregressive", "--dtype", "fp8"}), 2,
              "unknown dtype 'fp8' (f32, f16, bf16)");
  check_error(once({"--strategy", "autoregressive", "--dtype", "bf16"}), 2,
              "--dtype bf16 needs --device cuda");
  check_error(once({"--strategy", "autoregressive", "--device", "cpu", "--dtype", "f16"}), 2,
              "--dtype f16 needs --device cuda");
  // The CPU is the default device and f32 its only dtype.
  CHECK(tokens_of(gen_json(once({"--strategy", "autoregressive", "-n", "16", "--device", "cpu",
                                 "--dtype", "f32"}))) == reference_continuation(16));
  // --device cuda: the greedy output on a device, or a one-line error saying what is missing
  // (this build's CUDA support, else a device), before any model file is read.
  for (std::vector<std::string> const& strategy :
       {std::vector<std::string>{"--strategy", "autoregressive"},
        std::vector<std::string>{"--strategy", "draft", "--draft", model()},
        std::vector<std::string>{"--strategy", "prompt-lookup"}}) {
    std::vector<std::string> args = once({"-n", "48", "--device", "cuda", "--json"});
    args.insert(args.end(), strategy.begin(), strategy.end());
    CAPTURE(strategy[1]);
    process_result const r = gen(args);
    INFO("stderr: " << r.err);
    if (r.status == 0) {
      CHECK(tokens_of(parse_json(r.out)) == reference_continuation(48));
      continue;
    }
#if defined(SPECDEC_TOOLS_WITH_CUDA)
    std::string const why = "--device cuda: no";  // no usable device / no device present
#else
    std::string const why = "--device cuda: this specdec-generate was built without CUDA";
#endif
    check_error(args, 1, why);
  }
}

TEST_CASE("generate: the default strategy") {
  CHECK(str(gen_json(once({"-n", "4"})).at("strategy")) == "prompt-lookup");
  CHECK(str(gen_json(once({"-n", "4", "--draft", model()})).at("strategy")) == "draft");
}

TEST_CASE("generate: -n and -k") {
  CHECK(tokens_of(gen_json(once({"--strategy", "prompt-lookup", "-n", "7"}))).size() == 7);
  json const none = gen_json(once({"--strategy", "prompt-lookup", "-n", "0"}));
  CHECK(tokens_of(none).empty());
  CHECK(str(none.at("text")).empty());
  for (int k : {1, 2, 6}) {
    CAPTURE(k);
    json const j = gen_json(
        once({"--strategy", "draft", "--draft", model(), "-n", "30", "-k", std::to_string(k)}));
    CHECK(num(j.at("stats").at("max_tree_size")) == k);
    CHECK(ints(j.at("stats").at("drafted_at_depth")).size() == static_cast<std::size_t>(k));
    CHECK(str(j.at("description")).find("k = " + std::to_string(k)) != std::string::npos);
    CHECK(tokens_of(j) == reference_continuation(30));
  }
  // prompt lookup: --depth is the depth, --branches widens the tree beyond a chain.
  json const tree = gen_json(
      once({"--strategy", "prompt-lookup", "-n", "64", "--depth", "3", "--branches", "4"}));
  CHECK(ints(tree.at("stats").at("drafted_at_depth")).size() <= 3);
  CHECK(num(tree.at("stats").at("max_tree_size")) > 3);
  CHECK(num(tree.at("stats").at("max_tree_size")) <= 12);
}

TEST_CASE("generate: sampling flags") {
  std::vector<std::int64_t> const greedy = reference_continuation(32);
  auto const sampled = [&](std::initializer_list<std::string> more) {
    std::vector<std::string> args =
        once({"--strategy", "draft", "--draft", random_draft(), "-n", "32"});
    args.insert(args.end(), more);
    return gen_json(args);
  };
  json const a = sampled({"--temp", "1", "--seed", "5"});
  CHECK(str(a.at("verifier")) == "speculative sampling");
  CHECK(tokens_of(a) != greedy);
  // Reproducible from the seed; another seed gives another text.
  CHECK(tokens_of(sampled({"--temp", "1", "--seed", "5"})) == tokens_of(a));
  CHECK(tokens_of(sampled({"--temp", "1", "--seed", "6"})) != tokens_of(a));
  // Truncations that keep only the top token give the greedy output at any temperature.
  CHECK(tokens_of(sampled({"--temp", "1.5", "--top-k", "1"})) == greedy);
  CHECK(tokens_of(sampled({"--temp", "1.5", "--top-p", "0.000001"})) == greedy);
  CHECK(tokens_of(sampled({"--temp", "1.5", "--min-p", "1"})) == greedy);
  // A repetition penalty changes the greedy output.
  CHECK(tokens_of(sampled({"--repetition-penalty", "1.8"})) != greedy);
  // Prompt lookup verifies its candidates with the tree verifier under sampling.
  json const lookup = gen_json(once({"--strategy", "prompt-lookup", "--temp", "0.7", "-n", "16"}));
  CHECK(str(lookup.at("verifier")) == "tree (point masses)");
  CHECK(tokens_of(lookup).size() == 16);
  // The target as its own draft under sampling: p = q, every draft is accepted.
  json const self =
      gen_json(once({"--strategy", "draft", "--draft", model(), "--temp", "1", "-n", "32"}));
  CHECK(num(self.at("stats").at("accepted")) == num(self.at("stats").at("drafted")));
}

TEST_CASE("generate: prompt file, threads, stops, layer choice") {
  fs::path const file = tools_test::scratch_dir() / "prompt.txt";
  tools_test::write_file(file, "Once upon a time\n");
  json const from_file =
      gen_json({"--prompt-file", file.string(), "--strategy", "prompt-lookup", "-n", "20"});
  CHECK(str(from_file.at("prompt")) == "Once upon a time");
  CHECK(tokens_of(from_file) == reference_continuation(20));

  CHECK(tokens_of(gen_json(once({"--strategy", "layer-skip", "--threads", "2", "-n", "20"}))) ==
        reference_continuation(20));

  json const stopped =
      gen_json(once({"--strategy", "prompt-lookup", "-n", "100", "--stop", "Lily"}));
  CHECK(str(stopped.at("finish_reason")) == "stop_string");
  std::string const text = str(stopped.at("text"));
  CHECK(text.find("Lily") != std::string::npos);
  CHECK(text.find("Lily") + 4 >= text.size() - 4);  // stops right after the match
  CHECK(tokens_of(gen_json(once({"--strategy", "autoregressive", "-n", "12", "--ignore-eos"})))
            .size() == 12);

  json const one = gen_json(once({"--strategy", "layer-skip", "--skip-layers", "1", "-n", "40"}));
  json const three =
      gen_json(once({"--strategy", "layer-skip", "--skip-layers", "0,1,2,3", "-n", "40"}));
  CHECK(str(one.at("description")).find("layers 1)") != std::string::npos);
  CHECK(str(three.at("description")).find("layers 0,1,2,3)") != std::string::npos);
  CHECK(tokens_of(one) == tokens_of(three));
  CHECK(num(one.at("stats").at("acceptance_rate")) != num(three.at("stats").at("acceptance_rate")));
}

TEST_CASE("generate: JSON strings are escaped") {
  json const j = gen_json({"--prompt", "a \"quoted\"\tback\\slash\nnew line \xc3\xa9 \x01",
                           "--strategy", "autoregressive", "-n", "4"});
  CHECK(str(j.at("prompt")) == "a \"quoted\"\tback\\slash\nnew line \xc3\xa9 \x01");
}

TEST_CASE("generate: command-line errors exit 2 with one line") {
  std::string const m = model(), t = vocab();
  std::vector<std::string> const p = {"--prompt", "hi"};
  auto with = [&](std::initializer_list<std::string> more) {
    std::vector<std::string> a = p;
    a.insert(a.end(), more);
    return a;
  };
  check_error(with({"--bogus"}), 2, "unknown option '--bogus'");
  check_error(with({"--strategy", "nonesuch"}), 2, "unknown strategy 'nonesuch'");
  check_error(with({"--strategy", "autoregressive", "--temp"}), 2, "--temp needs a value");
  check_error(with({"--strategy", "autoregressive", "-k"}), 2, "-k needs a value");
  check_error(with({"--strategy", "autoregressive", "--temp", "abc"}), 2, "--temp expects");
  check_error(with({"--strategy", "autoregressive", "--temp", "0.5x"}), 2, "--temp expects");
  check_error(with({"--strategy", "autoregressive", "--temp", "nan"}), 2, "finite");
  check_error(with({"--strategy", "autoregressive", "--temp", "inf"}), 2, "finite");
  check_error(with({"--strategy", "autoregressive", "--temp", "-0.5"}), 2, "--temp must be >= 0");
  check_error(with({"--strategy", "jacobi", "-k", "-1"}), 2, "-k must be in [1, 4095]");
  check_error(with({"--strategy", "jacobi", "-k", "0"}), 2, "-k must be in [1, 4095]");
  check_error(with({"--strategy", "jacobi", "-k", "two"}), 2, "-k");
  check_error(with({"--strategy", "autoregressive", "-n", "1.5"}), 2, "-n expects");
  check_error(with({"--strategy", "autoregressive", "-n", "-3"}), 2, "-n must be");
  check_error(with({"--strategy", "autoregressive", "--top-p", "0"}), 2,
              "--top-p must be in (0, 1]");
  check_error(with({"--strategy", "autoregressive", "--top-p", "1.5"}), 2, "--top-p");
  check_error(with({"--strategy", "autoregressive", "--top-p", "-0.1"}), 2, "--top-p");
  check_error(with({"--strategy", "autoregressive", "--top-k", "-1"}), 2, "--top-k");
  check_error(with({"--strategy", "autoregressive", "--min-p", "1.5"}), 2, "--min-p");
  check_error(with({"--strategy", "autoregressive", "--repetition-penalty", "0"}), 2,
              "--repetition-penalty must be > 0");
  check_error(with({"--strategy", "autoregressive", "--seed", "-1"}), 2, "--seed");
  check_error(with({"--strategy", "autoregressive", "--threads", "0"}), 2, "--threads");
  check_error(with({"--strategy", "autoregressive", "--repeat", "0"}), 2, "--repeat");
  check_error(with({"--strategy", "autoregressive", "--repeat", "x"}), 2, "--repeat");
  check_error(with({"--strategy", "autoregressive", "--confidence", "0.5"}), 2, "--confidence");
  check_error(with({"--strategy", "draft"}), 2, "--draft PATH");
  check_error(with({"--strategy", "prompt-lookup", "--draft", m}), 2, "--draft applies");
  check_error(with({"--strategy", "draft", "--draft", m, "--skip-layers", "1"}), 2,
              "--skip-layers applies");
  check_error(with({"--strategy", "layer-skip", "--skip-layers", "a,b"}), 2, "--skip-layers");
  check_error(with({"--strategy", "layer-skip", "--skip-layers", "1,"}), 2, "--skip-layers");
  check_error(with({"--strategy", "layer-skip", "--skip-layers", "99"}), 2,
              "beyond the model's 5 layers");
  check_error(with({"--strategy", "layer-skip", "--ngram", "2"}), 2,
              "--ngram applies to --strategy prompt-lookup and rest only (not layer-skip)");
  check_error(with({"--strategy", "prompt-lookup", "--ngram", "2", "--ngram-min", "3"}), 2,
              "--ngram-min 3 exceeds --ngram 2");
  check_error(with({"--strategy", "prompt-lookup", "--ngram", "17"}), 2, "--ngram");
  check_error(with({"--strategy", "draft", "--draft", m, "--k-max", "8"}), 2,
              "--k-max needs --adaptive");
  check_error(with({"--strategy", "draft", "--draft", m, "-k", "6", "--adaptive", "--k-max", "4"}),
              2, "--k-max 4 is below -k 6");
  check_error(with({"--strategy", "layer-skip", "--fixed-k", "--k-max", "8"}), 2,
              "--k-max does not apply with --fixed-k");
  check_error(with({"--strategy", "layer-skip", "-k", "6", "--k-max", "4"}), 2,
              "--k-max 4 is below -k 6");
  check_error(with({"--strategy", "layer-skip", "--adaptive"}), 2,
              "--adaptive applies to --strategy draft only (not layer-skip)");
  check_error(with({"--strategy", "sparse-kv", "--sinks", "8", "--budget", "8"}), 2,
              "--kv-budget 8 must exceed --sinks 8");
  check_error(with({"--strategy", "sparse-kv", "--kv-policy", "h2o"}), 2,
              "--kv-policy 'h2o' is none of streaming, snapkv, retrieval");
  check_error(with({"--strategy", "sparse-kv", "--kv-policy", "snapkv", "--sinks", "4"}), 2,
              "--sinks needs --kv-policy streaming");
  check_error(with({"--strategy", "sparse-kv", "--kv-window", "4"}), 2,
              "--kv-window needs --kv-policy snapkv or retrieval");
  check_error(with({"--strategy", "sparse-kv", "--kv-policy", "retrieval", "--kv-budget", "20",
                    "--kv-window", "16"}),
              2, "--kv-budget 20 must be at least 24");
  check_error(with({"--strategy", "sparse-kv", "--fixed-k", "--k-max", "8"}), 2,
              "--k-max does not apply with --fixed-k");
  check_error(with({"--strategy", "autoregressive", "--stop", ""}), 2, "--stop");
  check_error({"--strategy", "autoregressive", "-n", "3"}, 2, "no prompt");
  check_error(with({"--strategy", "autoregressive", "--prompt-file", "x"}), 2, "not both");
  // Missing files.
  check_error({"--model", "/nonexistent/model.bin", "--prompt", "hi"}, 2,
              "--model: no such file '/nonexistent/model.bin'", false);
  check_error({"--prompt", "hi", "--strategy", "autoregressive"}, 2, "no model", false);
  check_error({"--model", m, "--tokenizer", "/nonexistent/tok.bin", "--prompt", "hi"}, 2,
              "--tokenizer: no such file", false);
  check_error(with({"--strategy", "draft", "--draft", "/nonexistent/draft.bin"}), 2,
              "--draft: no such file");
  check_error({"--strategy", "autoregressive", "--prompt-file", "/nonexistent/prompt.txt"}, 2,
              "--prompt-file: no such file");
  // A llama2.c model without --tokenizer and without tokenizer.bin next to it.
  fs::path const lone = tools_test::scratch_dir() / "lone" / "model.bin";
  fs::create_directories(lone.parent_path());
  fs::copy_file(m, lone, fs::copy_options::overwrite_existing);
  check_error({"--model", lone.string(), "--prompt", "hi", "--strategy", "autoregressive"}, 2,
              "no tokenizer", false);
  // A value for --strategy that is a flag.
  check_error({"--model", m, "--tokenizer", t, "--strategy"}, 2, "--strategy needs a value", false);
}

TEST_CASE("generate: run-time errors exit 1 with one line") {
  // A corrupt model file.
  fs::path const bad = tools_test::scratch_dir() / "corrupt.bin";
  tools_test::write_file(bad, std::string(100, 'x'));
  check_error({"--model", bad.string(), "--tokenizer", vocab(), "--prompt", "hi", "--strategy",
               "autoregressive"},
              1, "specdec: ", false);
  // A draft model whose own vocabulary file does not fit it.
  check_error(
      once({"--strategy", "draft", "--draft", random_draft(300), "--draft-tokenizer", vocab()}), 1,
      "the vocabulary has 512 tokens");
  // A prompt beyond the context.
  check_error(once({"--strategy", "autoregressive", "--context", "3"}), 1, "context");
  // A tokenizer file that does not fit the model.
  fs::path const short_tok = tools_test::scratch_dir() / "short_tok.bin";
  std::string const bytes = tools_test::read_file(vocab());
  tools_test::write_file(short_tok, bytes.substr(0, bytes.size() / 2));
  check_error({"--model", model(), "--tokenizer", short_tok.string(), "--prompt", "hi",
               "--strategy", "autoregressive"},
              1, "specdec: ", false);
}

TEST_CASE("generate: an empty prompt is BOS alone; --json text equals the streamed text") {
  std::vector<std::string> const args = {"--prompt", "", "--strategy", "layer-skip", "-n", "16"};
  json const j = gen_json(args);
  CHECK(ints(j.at("prompt_ids")) == std::vector<std::int64_t>{1});
  CHECK(tokens_of(j).size() == 16);
  std::string const text = str(j.at("text"));
  REQUIRE(!text.empty());
  CHECK(text.front() != ' ');  // the piece after BOS drops its leading space
  process_result const r = gen(args);
  REQUIRE(r.status == 0);
  CHECK(r.out.rfind(text + "\n", 0) == 0);
}

TEST_CASE("generate: --help lists every strategy of the table with its options") {
  process_result const r = tools_test::run_process(program(), {"-h"});
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  std::string const& help = r.out;
  for (generate::option_spec const* o : generate::all_options()) {
    CAPTURE(o->flag);
    std::string const names =
        std::string(o->flag) + (o->alias.empty() ? "" : ", " + std::string(o->alias));
    CHECK(help.find(names + (o->value_name.empty() ? "" : " ")) != std::string::npos);
  }
  // Each strategy's line (its name and help), then its options before the next strategy's line.
  std::size_t at = help.find("\nstrategy:\n");
  REQUIRE(at != std::string::npos);
  for (generate::strategy const& s : generate::strategies) {
    CAPTURE(s.name);
    std::size_t const line = help.find("\n  " + std::string(s.name) + " ", at);
    REQUIRE(line != std::string::npos);
    CHECK(help.find(std::string(s.help.substr(0, 30)), line) < help.find('\n', line + 1));
    std::size_t next = help.find("\n  ", line + 1);
    while (next != std::string::npos && help.compare(next, 5, "\n    ") == 0)
      next = help.find("\n  ", next + 1);  // the strategy's option lines are indented deeper
    std::string const section = help.substr(line, next - line);
    for (generate::option_spec const* o : s.options) {
      CAPTURE(o->flag);
      CHECK(section.find("\n    " + std::string(o->flag)) != std::string::npos);
    }
    if (s.greedy_only) CHECK(section.find("greedy only") != std::string::npos);
    at = line + 1;
  }
  CHECK(help.find("needs --temp > 0") != std::string::npos);
}

TEST_CASE("generate: an option of another strategy is refused, naming both") {
  for (generate::strategy const& s : generate::strategies) {
    for (generate::strategy const& other : generate::strategies) {
      for (generate::option_spec const* o : other.options) {
        if (generate::find_option(s, o->flag) != nullptr) continue;
        std::vector<std::string> args = once({"-n", "4"});
        for (std::string const& a : strategy_args(s)) args.push_back(a);
        args.emplace_back(o->flag);
        for (std::string const& v : valid_value(*o)) args.push_back(v);
        CAPTURE(s.name);
        CAPTURE(o->flag);
        check_error(args, 2,
                    std::string(o->flag) + " applies to --strategy " +
                        generate::strategies_with(o->flag) + " only (not " + std::string(s.name) +
                        ")");
      }
    }
  }
  // The strategies that share a flag are all named.
  CHECK(generate::strategies_with("-k") == "draft, layer-skip, sparse-kv, jacobi and pard");
  check_error(once({"--strategy", "autoregressive", "-k", "3"}), 2,
              "-k applies to --strategy draft, layer-skip, sparse-kv, jacobi and pard only (not "
              "autoregressive)");
  check_error(once({"--strategy", "lookahead", "-k", "3"}), 2, "(not lookahead)");
  check_error(once({"--strategy", "prompt-lookup", "-k", "3"}), 2, "(not prompt-lookup)");
  check_error(once({"--strategy", "rest", "--datastore", stories_datastore(), "-k", "3"}), 2,
              "(not rest)");
  check_error(once({"--strategy", "jacobi", "--depth", "3"}), 2,
              "--depth applies to --strategy prompt-lookup and rest only (not jacobi)");
  // The default strategy follows a required option; other options still belong to one strategy.
  CHECK(str(gen_json(once({"-n", "4", "--datastore", stories_datastore()})).at("strategy")) ==
        "rest");
  check_error(once({"--draft", model(), "--branches", "2"}), 2, "(not draft)");
  check_error(once({"--branches", "2", "--adaptive"}), 2, "(not prompt-lookup)");
  check_error(once({"--strategy", "rest"}), 2, "--strategy rest needs --datastore PATH");
}

TEST_CASE("generate: an option given twice is refused") {
  struct repeated {
    std::vector<std::string> args;  // after the fixture's --model, --tokenizer and --prompt
    char const* flag;               // the option named in the error
  };
  for (repeated const& r : std::vector<repeated>{
           {{"-n", "3", "-n", "4"}, "-n"},
           {{"--json", "--json"}, "--json"},
           {{"--compare", "--compare"}, "--compare"},
           {{"--temp", "1", "--temperature", "1"}, "--temp"},
           {{"--prompt", "again"}, "--prompt"},
           {{"--model", model()}, "--model"},
           {{"--strategy", "jacobi", "-k", "2", "-k", "3"}, "-k"},
           {{"--strategy", "draft", "--draft", model(), "--draft", model()}, "--draft"},
           {{"--strategy", "layer-skip", "--fixed-k", "--fixed-k"}, "--fixed-k"},
           {{"--strategy", "jacobi", "--strategy", "jacobi"}, "--strategy"}}) {
    std::vector<std::string> args = once({});
    args.insert(args.end(), r.args.begin(), r.args.end());
    CAPTURE(r.flag);
    check_error(args, 2, std::string(r.flag) + " is given more than once");
  }
  // --stop is the one repeatable option: each text stops generation.
  json const j = gen_json(
      once({"--strategy", "autoregressive", "-n", "100", "--stop", "zzz", "--stop", "Lily"}));
  CHECK(str(j.at("finish_reason")) == "stop_string");
}

TEST_CASE("generate: options that only shape sampling are refused at temperature 0") {
  // The general ones, with any strategy; then each strategy's own, with that strategy.
  std::vector<std::pair<generate::option_spec const*, std::vector<std::string>>> cases;
  for (generate::option_group const& g : generate::general_groups)
    for (generate::option_spec const* o : g.options)
      if (o->sampling_only) cases.push_back({o, {"--strategy", "autoregressive"}});
  std::size_t const general = cases.size();
  for (generate::strategy const& s : generate::strategies)
    for (generate::option_spec const* o : s.options)
      if (o->sampling_only) cases.push_back({o, strategy_args(s)});
  for (auto const& [o, strategy] : cases) {
    CAPTURE(o->flag);
    CAPTURE(strategy[1]);
    std::vector<std::string> args = once({"-n", "4"});
    args.insert(args.end(), strategy.begin(), strategy.end());
    args.emplace_back(o->flag);
    for (std::string const& v : valid_value(*o)) args.push_back(v);
    check_error(args, 2, std::string(o->flag) + " applies to sampling only (--temp > 0)");
    args.insert(args.end(), {"--temp", "0.8"});
    CHECK(tokens_of(gen_json(args)).size() == 4);
  }
  CHECK(general == 4);  // --top-k, --top-p, --min-p, --seed
  // No strategy has sampling-only options of its own (typical acceptance is --verifier typical,
  // refused at temperature 0 for every strategy).
  CHECK(cases.size() == general);
  // The penalties change greedy decoding, so they apply at temperature 0 too.
  for (char const* penalty : {"--repetition-penalty", "--frequency-penalty", "--presence-penalty"})
    CHECK(tokens_of(gen_json(once({"--strategy", "autoregressive", "-n", "4", penalty, "1.5"})))
              .size() == 4);
}

TEST_CASE("generate: a draft of another vocabulary, both modes, greedy and sampled") {
  std::string const draft =
      test_support::source_file("tools/draft/cross/stories_draft_tok1024.bin").string();
  std::string const draft_tok = test_support::source_file("tools/draft/cross/tok1024.bin").string();
  for (std::string const mode : {"intersection", "string"}) {
    CAPTURE(mode);
    std::vector<std::string> const common = {"--strategy",        "draft",   "--draft",      draft,
                                             "--draft-tokenizer", draft_tok, "--vocab-mode", mode};
    std::vector<std::string> args = once({"-n", "48", "--compare"});
    args.insert(args.end(), common.begin(), common.end());
    json const greedy = gen_json(args);
    CHECK(boolean(greedy.at("stats").at("outputs_identical")));
    CHECK(tokens_of(greedy) == reference_continuation(48));
    CHECK(str(greedy.at("verifier")) == "greedy");
    std::string const description = str(greedy.at("description"));
    CHECK(description.find(
              "draft model of another vocabulary (478 of 1024 tokens shared), " +
              std::string(mode == std::string("string") ? "string level" : "intersection") +
              ", k = 4") == 0);
    CHECK(num(greedy.at("stats").at("accepted")) > 0);
    std::vector<std::string> sampled = once({"-n", "32", "--temp", "1", "--seed", "3"});
    sampled.insert(sampled.end(), common.begin(), common.end());
    json const s = gen_json(sampled);
    CHECK(str(s.at("verifier")) ==
          (mode == std::string("string") ? "tree (point masses)" : "speculative sampling"));
    CHECK(tokens_of(s).size() == 32);
  }
  // A draft whose vocabulary only differs in size: a padded bridge, the greedy output kept.
  json const padded = gen_json(
      once({"-n", "24", "--compare", "--strategy", "draft", "--draft", random_draft(600)}));
  CHECK(boolean(padded.at("stats").at("outputs_identical")));
  CHECK(str(padded.at("description")).find("(512 of 600 tokens shared), intersection") !=
        std::string::npos);
  check_error(once({"--strategy", "draft", "--draft", model(), "--vocab-mode", "string"}), 2,
              "--vocab-mode needs a draft of another vocabulary");
  check_error(once({"--strategy", "draft", "--draft", draft, "--draft-tokenizer", draft_tok,
                    "--vocab-mode", "chars"}),
              2, "--vocab-mode 'chars' is none of intersection, string");
  check_error(once({"--strategy", "draft", "--draft", draft, "--draft-tokenizer", vocab()}), 1,
              "tok512.bin");  // 512 tokens for a model of 1024
}

TEST_CASE("generate: every strategy of the table gives the greedy output at temperature 0") {
  for (generate::strategy const& s : generate::strategies) {
    CAPTURE(s.name);
    std::vector<std::string> args = once({"-n", "48", "--compare"});
    for (std::string const& a : strategy_args(s)) args.push_back(a);
    json const j = gen_json(args);
    CHECK(str(j.at("strategy")) == s.name);
    CHECK(boolean(j.at("stats").at("outputs_identical")));
    CHECK(tokens_of(j) == reference_continuation(48));
    CHECK(str(j.at("verifier")) == (s.name == "autoregressive" ? "none" : "greedy"));
  }
}

TEST_CASE("generate: each strategy's options reach its proposer, which sets the node budget") {
  auto const stats = [](json const& j) { return j.at("stats"); };
  // jacobi: -k guesses per step, a chain of k nodes.
  json const jacobi = gen_json(once({"--strategy", "jacobi", "-k", "3", "-n", "40"}));
  CHECK(str(jacobi.at("description")) == "Jacobi, k = 3");
  CHECK(num(stats(jacobi).at("max_tree_size")) == 3);
  CHECK(tokens_of(jacobi) == reference_continuation(40));
  // layer-skip: an adaptive chain (the library's default) stays within --k-max; --fixed-k fixes
  // it; the defaults are the library's (layer_skip_config, jacobi_config, prompt_lookup_config).
  json const adaptive =
      gen_json(once({"--strategy", "layer-skip", "-k", "2", "--k-max", "5", "-n", "60"}));
  CHECK(str(adaptive.at("description")).find("adaptive k from 2 in [1, 5]") != std::string::npos);
  CHECK(num(stats(adaptive).at("max_tree_size")) <= 5);
  CHECK(num(stats(adaptive).at("max_tree_size")) > 2);
  sd::layer_skip_config const ls;
  json const library = gen_json(once({"--strategy", "layer-skip", "-n", "8"}));
  CHECK(str(library.at("description"))
            .find("adaptive k from " + std::to_string(ls.draft.k) + " in [1, " +
                  std::to_string(ls.draft.k_max) + "]") != std::string::npos);
  json const fixed =
      gen_json(once({"--strategy", "layer-skip", "--fixed-k", "-k", "3", "-n", "40"}));
  CHECK(str(fixed.at("description")).find("k = 3") != std::string::npos);
  CHECK(num(stats(fixed).at("max_tree_size")) == 3);
  json const jacobi_default = gen_json(once({"--strategy", "jacobi", "-n", "8"}));
  CHECK(str(jacobi_default.at("description")) ==
        "Jacobi, k = " + std::to_string(sd::jacobi_config{}.block));
  // rest: --depth bounds the depth, --max-nodes the tree.
  json const rest = gen_json(once({"--strategy", "rest", "--datastore", stories_datastore(),
                                   "--depth", "3", "--max-nodes", "5", "-n", "48"}));
  CHECK(str(rest.at("description")).find("depth 3, 5 nodes") != std::string::npos);
  CHECK(ints(stats(rest).at("drafted_at_depth")).size() <= 3);
  CHECK(num(stats(rest).at("max_tree_size")) <= 5);
  CHECK(num(stats(rest).at("max_tree_size")) > 0);
  CHECK(tokens_of(rest) == reference_continuation(48));
  // lookahead: G candidates of N - 1 tokens at most.
  json const lookahead = gen_json(once({"--strategy", "lookahead", "--lookahead-guesses", "2",
                                        "--lookahead-ngram", "3", "-n", "64"}));
  CHECK(str(lookahead.at("description")) == "lookahead, W = 5, N = 3, G = 2");
  CHECK(num(stats(lookahead).at("max_tree_size")) <= 4);
  CHECK(ints(stats(lookahead).at("drafted_at_depth")).size() <= 2);
  CHECK(tokens_of(lookahead) == reference_continuation(64));
  json const no_guesses =
      gen_json(once({"--strategy", "lookahead", "--lookahead-guesses", "0", "-n", "16"}));
  CHECK(num(stats(no_guesses).at("drafted")) == 0);
  // prompt-lookup: a chain of --depth nodes at most.
  json const chain =
      gen_json(once({"--strategy", "prompt-lookup", "--depth", "2", "--ngram", "1", "-n", "64"}));
  CHECK(str(chain.at("description")) == "prompt lookup, n-grams 1..1, depth 2");
  CHECK(num(stats(chain).at("max_tree_size")) == 2);
}

TEST_CASE("generate: medusa and hydra read their heads, trees and verifier options") {
  auto const stats = [](json const& j) { return j.at("stats"); };
  std::string const medusa =
      test_support::source_file("tools/heads/medusa/config.json").parent_path().string();
  std::string const hydra =
      test_support::source_file("tools/heads/hydra/config.json").parent_path().string();
  // The heads' own tree.json by default: 32 nodes.
  json const m = gen_json(once({"--strategy", "medusa", "--heads", medusa, "-n", "64"}));
  CHECK(str(m.at("description")).find("Medusa, 4 heads, 32-node tree") != std::string::npos);
  CHECK(num(stats(m).at("max_tree_size")) == 32);
  CHECK(str(m.at("verifier")) == "greedy");
  CHECK(tokens_of(m) == reference_continuation(64));
  CHECK(num(stats(m).at("mean_accepted_length")) > 2.2);
  // --tree-nodes builds a tree from accuracies measured on the target's greedy text, and
  // --write-tree writes it in tree.json's format.
  test_support::temp_dir dir;
  std::string const written = dir.file("tree.json").string();
  json const h = gen_json(once({"--strategy", "hydra", "--heads", hydra, "--tree-nodes", "12",
                                "--write-tree", written, "-n", "64"}));
  CHECK(str(h.at("description")).find("Hydra, 4 heads, 12-node tree built from measured") !=
        std::string::npos);
  CHECK(num(stats(h).at("max_tree_size")) <= 12);
  CHECK(tokens_of(h) == reference_continuation(64));
  specdec::tree_choices const tree = specdec::read_tree_choices(written);
  CHECK(tree.size() == 12);
  CHECK(specdec::sparse_tree::from_choices(tree).size() == 12);
  // --tree takes that file.
  json const t =
      gen_json(once({"--strategy", "medusa", "--heads", medusa, "--tree", written, "-n", "32"}));
  CHECK(str(t.at("description")).find("12-node tree " + written) != std::string::npos);
  CHECK(tokens_of(t) == reference_continuation(32));
  // Sampling: the tree verifier, or typical acceptance when asked for.
  json const sampled = gen_json(once({"--strategy", "hydra", "--heads", hydra, "--temp", "1",
                                      "--top-p", "0.9", "--seed", "3", "-n", "32"}));
  CHECK(str(sampled.at("verifier")) == "tree (point masses)");
  json const typical =
      gen_json(once({"--strategy", "medusa", "--heads", medusa, "--temp", "0.7", "--verifier",
                     "typical", "--typical-epsilon", "0.2", "-n", "32"}));
  CHECK(str(typical.at("verifier")) == "typical acceptance (lossy)");
  CHECK(tokens_of(typical).size() == 32);

  check_error(once({"--strategy", "medusa"}), 2, "--heads DIR");
  check_error(once({"--strategy", "medusa", "--heads", "/nonexistent/heads"}), 2,
              "--heads: no such directory '/nonexistent/heads'");
  check_error(
      once({"--strategy", "medusa", "--heads", medusa, "--tree", written, "--tree-nodes", "8"}), 2,
      "--tree and --tree-nodes exclude each other");
  check_error(once({"--strategy", "medusa", "--heads", medusa, "--verifier", "typical"}), 2,
              "--verifier typical applies to sampling only");
  check_error(
      once({"--strategy", "medusa", "--heads", medusa, "--temp", "1", "--typical-epsilon", "0.1"}),
      2, "--typical-epsilon applies to --verifier typical only");
  check_error(once({"--strategy", "medusa", "--heads", medusa, "--temp", "1", "--verifier",
                    "typical", "--typical-epsilon", "1"}),
              2, "--typical-epsilon must be in [0, 1)");
  // Heads of the other kind, or for another target: a run-time error naming the file.
  check_error(once({"--strategy", "hydra", "--heads", medusa}), 1, "missing \"hydra_num_heads\"");
  check_error(once({"--strategy", "medusa", "--heads", medusa, "--tree", model()}), 1,
              "stories260K.bin: a NUL byte at byte 1 of");  // a binary file is no JSON text
}

TEST_CASE("generate: eagle reads its head, its trees and their options") {
  auto const stats = [](json const& j) { return j.at("stats"); };
  std::string const e1 =
      test_support::source_file("tools/eagle/eagle1/config.json").parent_path().string();
  std::string const e3 =
      test_support::source_file("tools/eagle/eagle3/config.json").parent_path().string();
  // The dynamic tree by default: depth 6, top-8, 32 nodes; greedy output is greedy decoding's.
  json const a = gen_json(once({"--strategy", "eagle", "--eagle", e1, "-n", "64"}));
  CHECK(str(a.at("description")) == "EAGLE, EAGLE-1 head, dynamic tree: depth 6, top-8, 32 nodes");
  CHECK(str(a.at("verifier")) == "greedy");
  CHECK(num(stats(a).at("max_tree_size")) <= 32);
  CHECK(tokens_of(a) == reference_continuation(64));
  CHECK(num(stats(a).at("mean_accepted_length")) > 2.5);
  json const b = gen_json(once({"--strategy", "eagle", "--eagle", e3, "--eagle-depth", "4",
                                "--eagle-topk", "3", "--tree-nodes", "10", "-n", "48"}));
  CHECK(str(b.at("description")).find("EAGLE, EAGLE-3 head (layers") == 0);
  CHECK(str(b.at("description")).find("dynamic tree: depth 4, top-3, 10 nodes") !=
        std::string::npos);
  CHECK(num(stats(b).at("max_tree_size")) <= 10);
  CHECK(stats(b).at("drafted_at_depth").size() <= 4);
  CHECK(tokens_of(b) == reference_continuation(48));
  // A static tree (EAGLE-1's), and sampling with the tree verifier.
  std::string const tree = test_support::source_file("tools/heads/medusa/tree.json").string();
  json const st =
      gen_json(once({"--strategy", "eagle", "--eagle", e1, "--tree", tree, "-n", "32"}));
  CHECK(str(st.at("description")).find("static 32-node tree") != std::string::npos);
  CHECK(tokens_of(st) == reference_continuation(32));
  json const sampled = gen_json(once({"--strategy", "eagle", "--eagle", e3, "--temp", "1",
                                      "--top-p", "0.9", "--seed", "3", "-n", "32"}));
  CHECK(str(sampled.at("verifier")) == "tree (point masses)");
  CHECK(tokens_of(sampled).size() == 32);

  check_error(once({"--strategy", "eagle"}), 2, "--eagle DIR");
  check_error(once({"--strategy", "eagle", "--eagle", "/nonexistent/head"}), 2,
              "--eagle: no such directory '/nonexistent/head'");
  check_error(once({"--strategy", "eagle", "--eagle", e1, "--tree", tree, "--eagle-depth", "3"}), 2,
              "--tree (a static tree) excludes --eagle-depth");
  check_error(once({"--strategy", "eagle", "--eagle", e1, "--eagle-topk", "0"}), 2, "--eagle-topk");
  check_error(once({"--strategy", "medusa", "--heads", e1, "--eagle-depth", "3"}), 2,
              "--eagle-depth");
  // Not an EAGLE head: a run-time error naming the file.
  std::string const medusa =
      test_support::source_file("tools/heads/medusa/config.json").parent_path().string();
  check_error(once({"--strategy", "eagle", "--eagle", medusa}), 1,
              "medusa/config.json: missing \"intermediate_size\"");
}

TEST_CASE("generate: dflash and dspark read their drafter and their options") {
  auto const stats = [](json const& j) { return j.at("stats"); };
  std::string const dflash =
      test_support::source_file("tools/block/dflash/config.json").parent_path().string();
  std::string const dspark =
      test_support::source_file("tools/block/dspark/config.json").parent_path().string();
  // Chains of the block's 7 drafts; greedy output is greedy decoding's.
  json const a = gen_json(once({"--strategy", "dflash", "--block", dflash, "-n", "64"}));
  CHECK(str(a.at("description")) ==
        "DFlash block drafter (2 layers, block of 8, target layers 0 2 4), chain of 7");
  CHECK(str(a.at("verifier")) == "greedy");
  CHECK(num(stats(a).at("max_tree_size")) <= 8);
  CHECK(tokens_of(a) == reference_continuation(64));
  CHECK(num(stats(a).at("mean_accepted_length")) > 1.5);
  json const b = gen_json(once({"--strategy", "dspark", "--block", dspark, "--block-length", "5",
                                "--block-confidence", "0.2", "-n", "48"}));
  CHECK(str(b.at("description")) ==
        "DSpark block drafter (2 layers, block of 8, target layers 0 "
        "2 4), chain of 5, confidence cutoff 0.200");
  CHECK(num(stats(b).at("max_tree_size")) <= 6);
  CHECK(tokens_of(b) == reference_continuation(48));
  // DDTree's trees: greedy output is greedy decoding's; under sampling the tree verifier.
  json const t =
      gen_json(once({"--strategy", "dspark", "--block", dspark, "--block-tree", "16", "-n", "48"}));
  CHECK(str(t.at("description")) ==
        "DSpark block drafter (2 layers, block of 8, target layers 0 "
        "2 4), DDTree of 16 nodes, depth 7");
  CHECK(num(stats(t).at("max_tree_size")) <= 17);
  CHECK(tokens_of(t) == reference_continuation(48));
  json const ts = gen_json(once({"--strategy", "dflash", "--block", dflash, "--block-tree", "8",
                                 "--temp", "1", "--seed", "5", "-n", "24"}));
  CHECK(str(ts.at("verifier")) == "tree (point masses)");
  CHECK(tokens_of(ts).size() == 24);
  // A DSpark drafter runs as DFlash (its body alone); sampling: speculative sampling.
  json const c = gen_json(once({"--strategy", "dflash", "--block", dspark, "-n", "16"}));
  CHECK(tokens_of(c) == reference_continuation(16));
  json const sampled = gen_json(once({"--strategy", "dspark", "--block", dspark, "--temp", "1",
                                      "--top-p", "0.9", "--seed", "3", "-n", "32"}));
  CHECK(str(sampled.at("verifier")) == "speculative sampling");
  CHECK(tokens_of(sampled).size() == 32);

  check_error(once({"--strategy", "dflash"}), 2, "--block DIR");
  check_error(once({"--strategy", "dflash", "--block", "/nonexistent/drafter"}), 2,
              "--block: no such directory '/nonexistent/drafter'");
  check_error(once({"--strategy", "dspark", "--block", dflash}), 2,
              "has no Markov and confidence heads");
  check_error(once({"--strategy", "dflash", "--block", dflash, "--block-confidence", "0.5"}), 2,
              "--block-confidence");
  check_error(once({"--strategy", "dspark", "--block", dspark, "--block-tree", "8",
                    "--block-confidence", "0.5"}),
              2, "--block-tree (a tree of the most probable paths) excludes --block-confidence");
  check_error(once({"--strategy", "dflash", "--block", dflash, "--block-length", "8"}), 1,
              "length 8 exceeds the drafter's 7 drafts per block");
  // Not a block drafter: a run-time error naming the file.
  std::string const eagle =
      test_support::source_file("tools/eagle/eagle3/config.json").parent_path().string();
  check_error(once({"--strategy", "dflash", "--block", eagle}), 1,
              "eagle3/config.json: missing \"block_size\"");
}

TEST_CASE("generate: pard drafts a chain from one forward of a mask-trained draft") {
  auto const stats = [](json const& j) { return j.at("stats"); };
  std::string const pard = test_support::source_file("tools/draft/pard/stories_pard.bin").string();
  // --draft and --mask-token choose pard without --strategy.
  json const a = gen_json(once({"--draft", pard, "--mask-token", "0", "-k", "6", "-n", "48"}));
  CHECK(str(a.at("description")) ==
        "parallel draft model (PARD), k = 6 from one forward, mask "
        "token 0");
  CHECK(str(a.at("verifier")) == "greedy");
  CHECK(num(stats(a).at("max_tree_size")) <= 7);
  CHECK(tokens_of(a) == reference_continuation(48));
  CHECK(num(stats(a).at("mean_accepted_length")) > 1.3);
  json const sampled = gen_json(once({"--strategy", "pard", "--draft", pard, "--mask-token", "0",
                                      "--temp", "1", "--seed", "2", "-n", "24"}));
  CHECK(str(sampled.at("verifier")) == "speculative sampling");
  CHECK(tokens_of(sampled).size() == 24);
  check_error(once({"--strategy", "pard", "--draft", pard}), 2, "--mask-token ID");
  check_error(once({"--strategy", "pard", "--draft", pard, "--mask-token", "512"}), 1,
              "mask token 512 is outside the vocabulary of 512");
  check_error(
      once({"--strategy", "pard", "--draft",
            test_support::source_file("tools/draft/cross/stories_draft_tok1024.bin").string(),
            "--mask-token", "0"}),
      1, "a draft of 1024 tokens for a target of 512");
}

#endif  // SPECDEC_GENERATE_PATH
