// specdec-generate, run as a program on the stories260K fixture: the effect of every flag, the
// --json fields, greedy --compare giving identical outputs for every strategy, and every error
// with its exit status (2 for the command line, 1 at run time) and its one-line message.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "specdec/model/llama2c.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/tokenizer.hpp"
#include "tools/json_value.hpp"
#include "tools/process.hpp"

namespace fs = std::filesystem;
using tools_test::json_value;
using tools_test::process_result;

namespace {

// The program under test (its path is compiled in by tests/CMakeLists.txt).
std::string program() {
#ifdef SPECDEC_GENERATE_PATH
  return SPECDEC_GENERATE_PATH;
#else
  FAIL("specdec_tools_tests was built without SPECDEC_GENERATE_PATH (tools disabled?)");
  return {};
#endif
}

// A fixture file under SPECDEC_MODEL_DIR; fails the test when it is missing.
std::string model_file(char const* name) {
  char const* dir = std::getenv("SPECDEC_MODEL_DIR");
  if (dir == nullptr || *dir == '\0') {
    FAIL("SPECDEC_MODEL_DIR is not set: the test needs " << name << " (ctest sets it)");
    return {};
  }
  fs::path const path = fs::path(dir) / name;
  if (!fs::exists(path)) FAIL("missing fixture file " << path.string());
  return path.string();
}

std::string model() {
  return model_file("stories260K.bin");
}
std::string vocab() {
  return model_file("tok512.bin");
}

// The reference greedy continuation of "Once upon a time" (MANIFEST.md), after the prompt.
std::vector<std::int64_t> reference_continuation(std::size_t n) {
  std::ifstream in(model_file("reference_greedy_once_upon_a_time.ids"));
  std::vector<std::int64_t> ids;
  std::int64_t t = 0;
  while (in >> t) ids.push_back(t);
  REQUIRE(ids.size() == 256);
  REQUIRE(n + 4 <= ids.size());
  return std::vector<std::int64_t>(ids.begin() + 4, ids.begin() + 4 + static_cast<long>(n));
}

specdec::tokenizer const& tok() {
  static specdec::tokenizer const t = specdec::load_tokenizer(model(), fs::path(vocab()));
  return t;
}

// Writes a random-weight llama2.c model of the fixture's vocabulary (or `vocab_size`) once per
// process and returns its path.
std::string random_draft(std::int32_t vocab_size = 512) {
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

// Runs the program with the fixture's model and tokenizer followed by `args`.
process_result gen(std::vector<std::string> const& args) {
  std::vector<std::string> all = {"--model", model(), "--tokenizer", vocab()};
  all.insert(all.end(), args.begin(), args.end());
  return tools_test::run_process(program(), all);
}

// Runs with --json, requires success, and parses stdout (which must be one JSON object).
json_value gen_json(std::vector<std::string> args) {
  args.push_back("--json");
  process_result const r = gen(args);
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  REQUIRE(!r.out.empty());
  CHECK(r.out.back() == '\n');
  json_value v;
  try {
    v = tools_test::parse_json(r.out);
  } catch (std::exception const& e) {
    FAIL("stdout is not one JSON value: " << e.what() << "\n" << r.out);
  }
  REQUIRE(v.is_object());
  return v;
}

// Checks a command-line failure: exit status `status`, nothing on stdout, one line on stderr
// that names the program and contains `needle`.
void check_error(std::vector<std::string> const& args, int status, std::string const& needle,
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

std::vector<std::string> once(std::initializer_list<std::string> more) {
  std::vector<std::string> a = {"--prompt", "Once upon a time"};
  a.insert(a.end(), more);
  return a;
}

std::vector<std::int64_t> tokens_of(json_value const& j) {
  return j["tokens"].ints();
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

  json_value const j = gen_json(once({"--strategy", "prompt-lookup", "-n", "16", "--compare",
                                      "--repeat", "4", "--temp", "1", "--seed", "3"}));
  CHECK(j["repeat"].number() == 4);
  json_value const single =
      gen_json(once({"--strategy", "prompt-lookup", "-n", "16", "--temp", "1", "--seed", "3"}));
  CHECK(single["repeat"].number() == 1);
  CHECK(tokens_of(j) == tokens_of(single));  // every run of a seeded request is the same
  CHECK(j["baseline"]["tokens"].ints().size() == 16);
  CHECK(j["stats"]["speedup"].number() > 0.0);
}

TEST_CASE("generate: --json fields") {
  json_value const j =
      gen_json(once({"--strategy", "draft", "--draft", model(), "-n", "24", "--compare"}));
  CHECK(j["strategy"].str() == "draft");
  CHECK(j["verifier"].str() == "greedy");
  CHECK(j["finish_reason"].str() == "max_tokens");
  CHECK(j["prompt"].str() == "Once upon a time");
  CHECK(j["prompt_ids"].ints() == std::vector<std::int64_t>{1, 403, 407, 261, 378});
  auto const tokens = tokens_of(j);
  CHECK(tokens == reference_continuation(24));
  std::vector<specdec::token_id> ids(tokens.begin(), tokens.end());
  CHECK(j["text"].str() == tok().decode(std::span<specdec::token_id const>(ids)));

  json_value const& s = j["stats"];
  for (char const* key : {"steps", "drafted", "accepted", "acceptance_rate", "mean_accepted_length",
                          "tokens_per_second", "baseline_tokens_per_second", "speedup",
                          "prefill_seconds", "propose_seconds", "score_seconds", "verify_seconds",
                          "commit_seconds", "total_seconds", "generated", "prompt_tokens"}) {
    CAPTURE(key);
    REQUIRE(s.has(key));
    CHECK(s[key].is_number());
    CHECK(s[key].number() >= 0.0);
  }
  double const steps = s["steps"].number(), accepted = s["accepted"].number();
  CHECK(s["generated"].number() == 24);
  CHECK(s["prompt_tokens"].number() == 5);
  // The target drafts for itself: every draft is accepted.
  CHECK(accepted == s["drafted"].number());
  CHECK(s["mean_accepted_length"].number() == doctest::Approx((accepted + steps) / steps));
  CHECK(s["tokens_per_second"].number() > 0.0);
  CHECK(s["speedup"].number() == doctest::Approx(s["tokens_per_second"].number() /
                                                 s["baseline_tokens_per_second"].number()));
  REQUIRE(s.has("outputs_identical"));
  CHECK(s["outputs_identical"].boolean());
  CHECK(s["drafted_at_depth"].ints().size() == 4);
  CHECK(s["acceptance_by_depth"].arr().size() == 4);
  CHECK(j["baseline"]["tokens"].ints() == tokens);
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
      {"--strategy", "lookahead"},
      {"--strategy", "lookahead", "--lookahead-window", "3", "--lookahead-ngram", "3"},
      {"--strategy", "jacobi", "-k", "5"},
  };
  for (auto const& c : cases) {
    std::vector<std::string> args = once({"-n", "48", "--compare"});
    args.insert(args.end(), c.begin(), c.end());
    CAPTURE(args[5]);
    CAPTURE(args.back());
    json_value const j = gen_json(args);
    CHECK(j["stats"]["outputs_identical"].boolean());
    CHECK(tokens_of(j) == reference_continuation(48));
    CHECK(j["verifier"].str() == (c[1] == "autoregressive" ? "none" : "greedy"));
  }
}

TEST_CASE("generate: the default strategy") {
  CHECK(gen_json(once({"-n", "4"}))["strategy"].str() == "prompt-lookup");
  CHECK(gen_json(once({"-n", "4", "--draft", model()}))["strategy"].str() == "draft");
}

TEST_CASE("generate: -n and -k") {
  CHECK(tokens_of(gen_json(once({"--strategy", "prompt-lookup", "-n", "7"}))).size() == 7);
  json_value const none = gen_json(once({"--strategy", "prompt-lookup", "-n", "0"}));
  CHECK(tokens_of(none).empty());
  CHECK(none["text"].str().empty());
  for (int k : {1, 2, 6}) {
    CAPTURE(k);
    json_value const j = gen_json(
        once({"--strategy", "draft", "--draft", model(), "-n", "30", "-k", std::to_string(k)}));
    CHECK(j["stats"]["max_tree_size"].number() == k);
    CHECK(j["stats"]["drafted_at_depth"].ints().size() == static_cast<std::size_t>(k));
    CHECK(j["description"].str().find("k = " + std::to_string(k)) != std::string::npos);
    CHECK(tokens_of(j) == reference_continuation(30));
  }
  // prompt lookup: -k is the depth, --branches widens the tree beyond a chain.
  json_value const tree =
      gen_json(once({"--strategy", "prompt-lookup", "-n", "64", "-k", "3", "--branches", "4"}));
  CHECK(tree["stats"]["drafted_at_depth"].ints().size() <= 3);
  CHECK(tree["stats"]["max_tree_size"].number() > 3);
  CHECK(tree["stats"]["max_tree_size"].number() <= 12);
}

TEST_CASE("generate: sampling flags") {
  std::vector<std::int64_t> const greedy = reference_continuation(32);
  auto const sampled = [&](std::initializer_list<std::string> more) {
    std::vector<std::string> args =
        once({"--strategy", "draft", "--draft", random_draft(), "-n", "32"});
    args.insert(args.end(), more);
    return gen_json(args);
  };
  json_value const a = sampled({"--temp", "1", "--seed", "5"});
  CHECK(a["verifier"].str() == "speculative sampling");
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
  json_value const lookup =
      gen_json(once({"--strategy", "prompt-lookup", "--temp", "0.7", "-n", "16"}));
  CHECK(lookup["verifier"].str() == "tree (point masses)");
  CHECK(tokens_of(lookup).size() == 16);
  // The target as its own draft under sampling: p = q, every draft is accepted.
  json_value const self =
      gen_json(once({"--strategy", "draft", "--draft", model(), "--temp", "1", "-n", "32"}));
  CHECK(self["stats"]["accepted"].number() == self["stats"]["drafted"].number());
}

TEST_CASE("generate: prompt file, threads, stops, layer choice") {
  fs::path const file = tools_test::scratch_dir() / "prompt.txt";
  tools_test::write_file(file, "Once upon a time\n");
  json_value const from_file =
      gen_json({"--prompt-file", file.string(), "--strategy", "prompt-lookup", "-n", "20"});
  CHECK(from_file["prompt"].str() == "Once upon a time");
  CHECK(tokens_of(from_file) == reference_continuation(20));

  CHECK(tokens_of(gen_json(once({"--strategy", "layer-skip", "--threads", "2", "-n", "20"}))) ==
        reference_continuation(20));

  json_value const stopped =
      gen_json(once({"--strategy", "prompt-lookup", "-n", "100", "--stop", "Lily"}));
  CHECK(stopped["finish_reason"].str() == "stop_string");
  std::string const text = stopped["text"].str();
  CHECK(text.find("Lily") != std::string::npos);
  CHECK(text.find("Lily") + 4 >= text.size() - 4);  // stops right after the match
  CHECK(tokens_of(gen_json(once({"--strategy", "autoregressive", "-n", "12", "--ignore-eos"})))
            .size() == 12);

  json_value const one =
      gen_json(once({"--strategy", "layer-skip", "--skip-layers", "1", "-n", "40"}));
  json_value const three =
      gen_json(once({"--strategy", "layer-skip", "--skip-layers", "0,1,2,3", "-n", "40"}));
  CHECK(one["description"].str().find("layers 1)") != std::string::npos);
  CHECK(three["description"].str().find("layers 0,1,2,3)") != std::string::npos);
  CHECK(tokens_of(one) == tokens_of(three));
  CHECK(one["stats"]["acceptance_rate"].number() != three["stats"]["acceptance_rate"].number());
}

TEST_CASE("generate: JSON strings are escaped") {
  json_value const j = gen_json({"--prompt", "a \"quoted\"\tback\\slash\nnew line \xc3\xa9 \x01",
                                 "--strategy", "autoregressive", "-n", "4"});
  CHECK(j["prompt"].str() == "a \"quoted\"\tback\\slash\nnew line \xc3\xa9 \x01");
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
  check_error(with({"--strategy", "medusa"}), 2, "unknown strategy 'medusa'");
  check_error(with({"--strategy", "autoregressive", "--temp"}), 2, "--temp needs a value");
  check_error(with({"--strategy", "autoregressive", "-k"}), 2, "-k needs a value");
  check_error(with({"--strategy", "autoregressive", "--temp", "abc"}), 2, "--temp expects");
  check_error(with({"--strategy", "autoregressive", "--temp", "0.5x"}), 2, "--temp expects");
  check_error(with({"--strategy", "autoregressive", "--temp", "nan"}), 2, "finite");
  check_error(with({"--strategy", "autoregressive", "--temp", "inf"}), 2, "finite");
  check_error(with({"--strategy", "autoregressive", "--temp", "-0.5"}), 2, "--temp must be >= 0");
  check_error(with({"--strategy", "autoregressive", "-k", "-1"}), 2, "-k must be in [1, 4095]");
  check_error(with({"--strategy", "autoregressive", "-k", "0"}), 2, "-k must be in [1, 4095]");
  check_error(with({"--strategy", "autoregressive", "-k", "two"}), 2, "-k");
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
  check_error(with({"--strategy", "layer-skip", "--ngram", "2"}), 2, "prompt-lookup only");
  check_error(with({"--strategy", "prompt-lookup", "--ngram", "2", "--ngram-min", "3"}), 2,
              "--ngram-min 3 exceeds --ngram 2");
  check_error(with({"--strategy", "prompt-lookup", "--ngram", "17"}), 2, "--ngram");
  check_error(with({"--strategy", "layer-skip", "--k-max", "8"}), 2, "--k-max needs --adaptive");
  check_error(with({"--strategy", "layer-skip", "-k", "6", "--adaptive", "--k-max", "4"}), 2,
              "--k-max 4 is below -k 6");
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
  // A draft model of another vocabulary.
  check_error(once({"--strategy", "draft", "--draft", random_draft(300)}), 1, "vocabulary");
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
  json_value const j = gen_json(args);
  CHECK(j["prompt_ids"].ints() == std::vector<std::int64_t>{1});
  CHECK(tokens_of(j).size() == 16);
  std::string const text = j["text"].str();
  REQUIRE(!text.empty());
  CHECK(text.front() != ' ');  // the piece after BOS drops its leading space
  process_result const r = gen(args);
  REQUIRE(r.status == 0);
  CHECK(r.out.rfind(text + "\n", 0) == 0);
}
