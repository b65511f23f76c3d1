// specdec-generate beyond its flags' plain effects: where generation stops (the model family's
// end-of-text tokens, streamed safely), what memory a file's context length costs, prompts and
// contexts beyond the model's, reading model files instead of mapping them, messages that say
// what is wrong, timings with a warm-up and their spread, JSON streaming, log-probabilities, the
// penalty window, the typical-acceptance verifier, the draft model's own threads and context,
// the --report picture, and the options that would do nothing refused.
#include "support/doctest.hpp"

#ifdef SPECDEC_GENERATE_PATH

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/test_util.hpp"
#include "specdec/backend/cpu/thread_pool.hpp"
#include "specdec/model/gguf.hpp"
#include "specdec/model/llama2c.hpp"
#include "specdec/model/random.hpp"
#include "support/files.hpp"
#include "support/llama_shapes.hpp"
#include "tools/fixture.hpp"
#include "tools/generate.hpp"
#include "tools/process.hpp"

using namespace generate_test;
namespace fs = std::filesystem;

namespace {

// Every line of `text` parsed as one JSON value.
std::vector<json> json_lines(std::string const& text) {
  std::vector<json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(parse_json(line));
  return out;
}

// A copy of stories260K.gguf whose llama.context_length is `context`.
std::string gguf_with_context(std::uint32_t context) {
  fs::path const path = tools_test::scratch_dir() / ("ctx" + std::to_string(context) + ".gguf");
  auto bytes = specdec::test::read_bytes(model_file("stories260K.gguf"));
  std::string_view const key = "llama.context_length";
  std::size_t const at = specdec::test::find_bytes(bytes, key) + key.size() + 4;  // then the type
  REQUIRE(specdec::test::peek<std::uint32_t>(bytes, at) == 128);
  specdec::test::poke(bytes, at, context);
  specdec::test::write_bytes(path, bytes);
  return path.string();
}

// The fixture's model and tokenizer with another model file.
process_result gen_model(std::string const& model_path, std::vector<std::string> const& args) {
  std::vector<std::string> all = {"--model", model_path, "--tokenizer", vocab()};
  all.insert(all.end(), args.begin(), args.end());
  return tools_test::run_process(program(), all);
}

}  // namespace

TEST_CASE("generate: the end of the story, streamed safely and where generation stops") {
  // Past the end of the first story (--ignore-eos), the model writes BOS (a control token, whose
  // piece is empty) and the next story: streamed without fault, the text equal to --json's.
  std::vector<std::string> const past =
      once({"--strategy", "autoregressive", "-n", "400", "--ignore-eos"});
  process_result const streamed = gen(past);
  INFO("stderr: " << streamed.err);
  REQUIRE(streamed.status == 0);
  CHECK(streamed.err.empty());
  json const all = gen_json(past);
  CHECK(str(all.at("finish_reason")) == "max_tokens");
  std::vector<std::int64_t> const tokens = tokens_of(all);
  REQUIRE(tokens.size() == 400);
  CHECK(streamed.out.rfind("Once upon a time" + str(all.at("text")) + "\n", 0) == 0);
  std::size_t story = 0;
  while (story < tokens.size() && tokens[story] != 1 && tokens[story] != 2) ++story;
  REQUIRE(story < tokens.size());
  CHECK(tokens[story] == 1);  // BOS: llama2.c models end a text with the next one's start
  std::vector<std::int64_t> const first(tokens.begin(), tokens.begin() + static_cast<long>(story));

  // By default generation stops there, with every strategy.
  for (std::vector<std::string> const& strategy :
       {std::vector<std::string>{"--strategy", "autoregressive"},
        std::vector<std::string>{"--strategy", "prompt-lookup", "--branches", "3"},
        std::vector<std::string>{"--strategy", "draft", "--draft", random_draft()},
        std::vector<std::string>{"--strategy", "lookahead"}}) {
    CAPTURE(strategy[1]);
    std::vector<std::string> args = once({"-n", "400"});
    args.insert(args.end(), strategy.begin(), strategy.end());
    json const j = gen_json(args);
    CHECK(str(j.at("finish_reason")) == "eos");
    CHECK(tokens_of(j) == first);
  }
  process_result const text = gen(once({"--strategy", "autoregressive", "-n", "400"}));
  REQUIRE(text.status == 0);
  std::string const story_text =
      str(gen_json(once({"--strategy", "autoregressive", "-n", "400"})).at("text"));
  CHECK(text.out.rfind("Once upon a time" + story_text + "\n", 0) == 0);
  CHECK(story_text.find("Once upon a time") == std::string::npos);
}

TEST_CASE("generate: a file's context length costs memory only as it is used") {
  // stories260K.gguf with a context length of 2^20 and of 2^24: the first used to allocate 2.6 GB
  // before the first token, the second to fail with std::bad_alloc.
  for (std::uint32_t context : {1u << 20, 1u << 24}) {
    CAPTURE(context);
    process_result const r = gen_model(gguf_with_context(context),
                                       once({"--strategy", "prompt-lookup", "-n", "16", "--json"}));
    INFO("stderr: " << r.err);
    REQUIRE(r.status == 0);
    CHECK(r.err.empty());
    CHECK(tokens_of(parse_json(r.out)) == reference_continuation(16));
    CHECK(r.max_rss_kib < 256 * 1024);
  }
}

TEST_CASE("generate: contexts and prompts beyond the model's") {
  // A context beyond the 512 positions stories260K.bin was trained on runs, with a warning.
  process_result const wide =
      gen(once({"--strategy", "autoregressive", "-n", "8", "--context", "1024", "--json"}));
  REQUIRE(wide.status == 0);
  CHECK(wide.err ==
        "specdec-generate: warning: --context 1024 is beyond the 512 positions the model was "
        "trained on; its output past them may degrade\n");
  CHECK(tokens_of(parse_json(wide.out)) == reference_continuation(8));

  // A prompt of 10 MB is refused before it is encoded (encoding it took 42 s).
  fs::path const big = tools_test::scratch_dir() / "big_prompt.txt";
  tools_test::write_file(big, std::string(10'000'000, 'a'));
  process_result const r =
      gen({"--prompt-file", big.string(), "--strategy", "autoregressive", "-n", "4"});
  CHECK(r.status == 1);
  CHECK(r.out.empty());
  CHECK(r.err.find("context_overflow") != std::string::npos);
  CHECK(r.err.find("a prompt of 10000000 bytes encodes to at least") != std::string::npos);
  CHECK(r.seconds < 20.0);

  // A request whose context the machine cannot hold fails before its first token, saying how
  // much it needs: 64 layers of 64 floats per key and value, 2^24 positions, 512 GiB.
  fs::path const wide_cache = tools_test::scratch_dir() / "wide_cache.bin";
  specdec::write_llama2c(wide_cache,
                         specdec::make_random_llama(test_support::shapes::wide_cache(), 1, 0.1f));
  process_result const huge =
      gen_model(wide_cache.string(),
                once({"--strategy", "autoregressive", "--context", "16777216", "-n", "16777000"}));
  CHECK(huge.status == 1);
  CHECK(huge.out.empty());
  CHECK(huge.err.find("specdec: out_of_memory: cpu_llama: a context of") != std::string::npos);
  CHECK(huge.err.find("of memory is available") != std::string::npos);
}

TEST_CASE("generate: --no-mmap reads the model files into memory, with the same output") {
  json const j =
      gen_json(once({"--no-mmap", "--strategy", "draft", "--draft", model(), "-n", "24"}));
  CHECK(tokens_of(j) == reference_continuation(24));
}

// --speculate adaptive on one request: each step's draft length from the target's forward cost,
// measured at start-up, and the request's acceptance; greedy output unchanged. On the fixture
// (compute-bound: a forward of 5 rows costs ~2.7 of one) it drafts little or nothing.
TEST_CASE("generate: --speculate adaptive sizes one request's drafts, output unchanged") {
  for (std::vector<std::string> const& strategy :
       {std::vector<std::string>{"--strategy", "draft", "--draft", model()},
        std::vector<std::string>{"--strategy", "prompt-lookup"}}) {
    CAPTURE(strategy.at(1));
    std::vector<std::string> args = once({"--speculate", "adaptive", "-n", "24"});
    args.insert(args.end(), strategy.begin(), strategy.end());
    json const j = gen_json(args);
    CHECK(tokens_of(j) == reference_continuation(24));
    CHECK(str(j.at("description")).find("draft length per step: adaptive") != std::string::npos);
  }
}

// --no-mmap reads every file used while generating into memory, the heads and the datastore as
// well as the models: truncating one while the program runs does not end it (a mapped file would,
// with SIGBUS at the next use of its bytes); at worst a later run refuses the truncated file.
TEST_CASE("generate: --no-mmap reads head and datastore files too; truncating them is harmless") {
  test_support::temp_dir dir;
  auto const copy_dir = [&](fs::path const& from, char const* name) {
    fs::path const to = dir.path() / name;
    fs::create_directories(to);
    for (auto const& entry : fs::directory_iterator(from))
      if (entry.is_regular_file()) fs::copy_file(entry.path(), to / entry.path().filename());
    return to;
  };
  fs::path const medusa =
      copy_dir(test_support::source_file("tools/heads/medusa/config.json").parent_path(), "medusa");
  fs::path const eagle =
      copy_dir(test_support::source_file("tools/eagle/eagle3/config.json").parent_path(), "eagle");
  fs::path const datastore = dir.path() / "stories.sdrest";
  fs::copy_file(stories_datastore(), datastore);
  struct use {
    char const* strategy;
    char const* flag;
    fs::path path;  // what the flag names
    fs::path file;  // the file truncated
  };
  for (use const& u : {use{"medusa", "--heads", medusa, medusa / "medusa_lm_head.safetensors"},
                       use{"eagle", "--eagle", eagle, eagle / "model.safetensors"},
                       use{"rest", "--datastore", datastore, datastore}}) {
    CAPTURE(u.strategy);
    // Long enough to be running still when the file is cut: the streamed text comes with the
    // warm-up run, then --repeat runs the request again.
    tools_test::started_process const p = tools_test::start_process(
        program(), {"--model", model(), "--tokenizer", vocab(), "--prompt", "Once upon a time",
                    "--strategy", u.strategy, u.flag, u.path.string(), "--no-mmap", "--ignore-eos",
                    "-n", "400", "--repeat", "40"});
    auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (fs::file_size(p.out_path) == 0 && tools_test::still_running(p) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    fs::resize_file(u.file, 8);
    bool const cut_while_running = tools_test::still_running(p);
    process_result const r = tools_test::finish_process(p);
    INFO("stderr: " << r.err);
    CHECK(cut_while_running);
    // The run under way finishes on the copy in memory; a later one of --repeat reads the file
    // again and refuses it, with one line naming it.
    CHECK(r.signal == 0);
    CHECK(r.out.rfind("Once upon a time", 0) == 0);
    if (r.status != 0) {
      CHECK(r.status == 1);
      CHECK(r.err.find(u.file.string()) != std::string::npos);
      CHECK(r.err.find('\n') == r.err.size() - 1);
    }
  }
}

// More threads than cores: a warning, and a run that still ends in time (an oversubscribed pool
// sleeps rather than spins).
TEST_CASE("generate: --threads beyond the cores available warns") {
  std::size_t const cores = specdec::available_cores();
  std::string const many = std::to_string(std::min<std::size_t>(1024, 4 * cores + 4));
  process_result const r = gen(once({"--threads", many, "-n", "24", "--json"}));
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.find("specdec-generate: warning: --threads " + many + " exceeds the " +
                   std::to_string(cores) + " cores available") != std::string::npos);
  CHECK(tokens_of(parse_json(r.out)) == reference_continuation(24));
  MESSAGE("--threads ", many, " on ", cores, " cores: ", r.seconds, " s");
  // Within the cores: no warning.
  process_result const within = gen(once({"--threads", std::to_string(cores), "-n", "4"}));
  CHECK(within.status == 0);
  CHECK(within.err.find("warning") == std::string::npos);
}

TEST_CASE("generate: messages say what is wrong") {
  // A directory is a directory, not a missing file.
  fs::path const dir = tools_test::scratch_dir() / "a_directory";
  fs::create_directories(dir);
  process_result r = gen_model(dir.string(), once({}));
  CHECK(r.status == 2);
  CHECK(r.err.find("--model: '" + dir.string() + "' is a directory, not a file") !=
        std::string::npos);
  // A model whose vocabulary differs from the tokenizer's: named as such, not as truncation.
  fs::path const m600 = tools_test::scratch_dir() / "vocab600.bin";
  specdec::llama_config c = test_support::shapes::vocab_300();
  c.vocab_size = 600;
  specdec::write_llama2c(m600, specdec::make_random_llama(c, 2));
  r = gen_model(m600.string(), once({}));
  CHECK(r.status == 1);
  CHECK(r.err.find("the vocabulary has 512 tokens but the model") != std::string::npos);
  CHECK(r.err.find("truncated") == std::string::npos);
}

TEST_CASE("generate: --compare and --repeat warm up, then report medians and spreads") {
  // The baseline against itself is about 1x once both are warm (cold, the first run measured
  // 0.13x).
  json const j =
      gen_json(once({"--strategy", "autoregressive", "-n", "64", "--compare", "--repeat", "5"}));
  json const& t = j.at("timing");
  CHECK(num(t.at("runs")) == 5);
  CHECK(num(t.at("warmup_runs")) == 1);
  for (char const* key : {"tokens_per_second", "baseline_tokens_per_second", "speedup"}) {
    CAPTURE(key);
    json const& s = t.at(key);
    CHECK(num(s.at("min")) <= num(s.at("median")));
    CHECK(num(s.at("median")) <= num(s.at("max")));
    CHECK(num(s.at("min")) > 0.0);
  }
  CHECK(num(t.at("speedup").at("median")) == doctest::Approx(num(j.at("stats").at("speedup"))));
  CHECK(num(t.at("speedup").at("median")) > 0.33);
  CHECK(num(t.at("speedup").at("median")) < 3.0);
  // The default --repeat 1 warms up too.
  json const once_more = gen_json(once({"--strategy", "prompt-lookup", "-n", "16", "--compare"}));
  CHECK(num(once_more.at("timing").at("warmup_runs")) == 1);
  CHECK(num(once_more.at("timing").at("runs")) == 1);
  // Without --compare or --repeat the one run is the measurement.
  json const plain = gen_json(once({"--strategy", "prompt-lookup", "-n", "16"}));
  CHECK(num(plain.at("timing").at("warmup_runs")) == 0);
  CHECK(!plain.at("timing").contains("speedup"));
  // The table shows the spreads.
  process_result const r =
      gen(once({"--strategy", "prompt-lookup", "-n", "16", "--compare", "--repeat", "3"}));
  REQUIRE(r.status == 0);
  CHECK(r.out.find("median of 3 runs after a warm-up run; min-max ") != std::string::npos);
  CHECK(r.out.find("per pair of runs") != std::string::npos);
}

TEST_CASE("generate: --stream-json writes a line per token, then the --json object") {
  process_result const r =
      gen(once({"--strategy", "prompt-lookup", "--branches", "2", "-n", "40", "--stream-json"}));
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  std::vector<json> const lines = json_lines(r.out);
  REQUIRE(lines.size() == 41);
  json const& done = lines.back();
  CHECK(str(done.at("event")) == "done");
  CHECK(tokens_of(done) == reference_continuation(40));
  std::size_t drafted = 0, bonus = 0;
  std::string text;
  for (std::size_t i = 0; i < 40; ++i) {
    CAPTURE(i);
    json const& e = lines[i];
    CHECK(str(e.at("event")) == "token");
    CHECK(num(e.at("index")) == static_cast<double>(i));
    CHECK(num(e.at("token")) == static_cast<double>(reference_continuation(40)[i]));
    CHECK(num(e.at("depth")) >= 1);
    (boolean(e.at("drafted")) ? drafted : bonus) += 1;
    if (i > 0 && num(lines[i - 1].at("step")) == num(e.at("step")))
      CHECK(num(e.at("depth")) == num(lines[i - 1].at("depth")) + 1);
    text += str(e.at("text"));
  }
  CHECK(static_cast<double>(drafted) == num(done.at("stats").at("accepted")));
  CHECK(static_cast<double>(bonus) == num(done.at("stats").at("steps")));
  CHECK(text == str(done.at("text")));
}

TEST_CASE("generate: --logprobs gives each token's log-probability and the row's top tokens") {
  json const j =
      gen_json(once({"--strategy", "draft", "--draft", model(), "-n", "12", "--logprobs", "3"}));
  json const& lp = j.at("logprobs");
  std::vector<std::int64_t> const tokens = tokens_of(j);
  REQUIRE(lp.size() == tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    CAPTURE(i);
    json const& e = lp[i];
    CHECK(num(e.at("token")) == static_cast<double>(tokens[i]));
    double const l = num(e.at("logprob"));
    CHECK(l <= 0.0);
    REQUIRE(e.at("top").size() == 3);
    // Greedy decoding: the token is the most likely one of its row.
    CHECK(num(e.at("top")[0].at("token")) == static_cast<double>(tokens[i]));
    CHECK(num(e.at("top")[0].at("logprob")) == doctest::Approx(l));
    double mass = 0.0;
    for (std::size_t k = 0; k < 3; ++k) {
      mass += std::exp(num(e.at("top")[k].at("logprob")));
      if (k > 0) CHECK(num(e.at("top")[k].at("logprob")) <= num(e.at("top")[k - 1].at("logprob")));
    }
    CHECK(mass <= 1.0 + 1e-6);
  }
  // With --stream-json each line carries its token's.
  process_result const r =
      gen(once({"--strategy", "autoregressive", "-n", "4", "--stream-json", "--logprobs", "0"}));
  REQUIRE(r.status == 0);
  std::vector<json> const lines = json_lines(r.out);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0].at("top").empty());
  CHECK(num(lines[0].at("logprob")) <= 0.0);
}

TEST_CASE("generate: --repeat-last-n limits the penalties to the last N tokens") {
  auto const run = [&](std::initializer_list<std::string> more) {
    std::vector<std::string> args = once({"--strategy", "autoregressive", "-n", "40"});
    args.insert(args.end(), more);
    return tokens_of(gen_json(args));
  };
  auto const whole = run({"--repetition-penalty", "1.8"});
  CHECK(run({"--repetition-penalty", "1.8", "--repeat-last-n", "0"}) == whole);
  CHECK(run({"--repetition-penalty", "1.8", "--repeat-last-n", "100000"}) == whole);
  auto const windowed = run({"--repetition-penalty", "1.8", "--repeat-last-n", "8"});
  CHECK(windowed != whole);
  CHECK(windowed != reference_continuation(40));
  // Under speculation too (the verifier's rows see the window over the history and the path).
  std::vector<std::string> args =
      once({"--strategy", "prompt-lookup", "--branches", "3", "-n", "40", "--repetition-penalty",
            "1.8", "--repeat-last-n", "8", "--compare"});
  json const j = gen_json(args);
  CHECK(boolean(j.at("stats").at("outputs_identical")));
  CHECK(tokens_of(j) == windowed);
}

TEST_CASE("generate: --verifier typical, the draft's own threads and context") {
  json const typical = gen_json(once({"--strategy", "prompt-lookup", "-n", "32", "--temp", "0.8",
                                      "--seed", "4", "--verifier", "typical"}));
  CHECK(str(typical.at("verifier")) == "typical acceptance (lossy)");
  CHECK(tokens_of(typical).size() == 32);
  // The threshold min(E, D exp(-H)) at 0 accepts every draft of positive probability.
  json const all =
      gen_json(once({"--strategy", "draft", "--draft", random_draft(), "-n", "32", "--temp", "1",
                     "--verifier", "typical", "--typical-epsilon", "0", "--typical-delta", "0"}));
  json const some = gen_json(once({"--strategy", "draft", "--draft", random_draft(), "-n", "32",
                                   "--temp", "1", "--verifier", "typical"}));
  CHECK(num(all.at("stats").at("acceptance_rate")) >= num(some.at("stats").at("acceptance_rate")));
  CHECK(num(all.at("stats").at("acceptance_rate")) > 0.5);

  json const base = gen_json(once({"--strategy", "draft", "--draft", model(), "-n", "48"}));
  json const own = gen_json(once({"--strategy", "draft", "--draft", model(), "-n", "48",
                                  "--draft-threads", "2", "--draft-context", "16"}));
  CHECK(tokens_of(own) == reference_continuation(48));
  // Past its 16 positions the draft drafts nothing.
  CHECK(num(own.at("stats").at("drafted")) < num(base.at("stats").at("drafted")));
}

TEST_CASE("generate: --report draws the run as SVG or HTML") {
  fs::path const svg = tools_test::scratch_dir() / "run.svg";
  json const j = gen_json(once(
      {"--strategy", "prompt-lookup", "--branches", "3", "-n", "60", "--report", svg.string()}));
  std::string const picture = tools_test::read_file(svg);
  CHECK(picture.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  for (char const* part : {"Acceptance rate by depth", "Tokens committed per step",
                           "Draft tree of step", "accepted", "bonus token", "</svg>"}) {
    CAPTURE(part);
    CHECK(picture.find(part) != std::string::npos);
  }
  CHECK(picture.find(str(j.at("description"))) != std::string::npos);
  fs::path const html = tools_test::scratch_dir() / "run.html";
  process_result const r = gen(once({"--strategy", "draft", "--draft", model(), "-n", "30",
                                     "--report", html.string(), "--report-step", "2"}));
  REQUIRE(r.status == 0);
  std::string const page = tools_test::read_file(html);
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(page.find("<svg") != std::string::npos);
  CHECK(page.find("Draft tree of step 2 ") != std::string::npos);
  CHECK(page.find("<script") == std::string::npos);
  // The baseline drafts nothing: the picture says so.
  fs::path const ar = tools_test::scratch_dir() / "ar.svg";
  REQUIRE(gen(once({"--strategy", "autoregressive", "-n", "8", "--report", ar.string()})).status ==
          0);
  CHECK(tools_test::read_file(ar).find("this strategy drafts nothing") != std::string::npos);
}

TEST_CASE("generate: options that would do nothing are refused") {
  check_error(once({"--logprobs", "3"}), 2, "--logprobs applies to --json and --stream-json");
  check_error(once({"--json", "--stream-json"}), 2, "give --json or --stream-json, not both");
  check_error(once({"--repeat-last-n", "8"}), 2, "--repeat-last-n applies to the penalties");
  check_error(once({"--report-step", "1"}), 2, "--report-step applies to --report only");
  check_error(once({"--report", "x.png"}), 2, "must end in .svg or .html");
  check_error(once({"--typical-epsilon", "0.1", "--temp", "1"}), 2,
              "--typical-epsilon applies to --verifier typical only");
  check_error(once({"--verifier", "typical"}), 2, "--verifier typical applies to sampling only");
  check_error(once({"--verifier", "bogus", "--temp", "1"}), 2, "unknown verifier 'bogus'");
  check_error(once({"--verifier", "typical", "--temp", "1", "--strategy", "autoregressive"}), 2,
              "(not autoregressive)");
  check_error(once({"--typical-epsilon", "1", "--verifier", "typical", "--temp", "1"}), 2,
              "--typical-epsilon must be in [0, 1)");
  check_error(once({"--strategy", "layer-skip", "--draft-threads", "2"}), 2,
              "--draft-threads applies to --strategy draft and pard only");
}

#endif  // SPECDEC_GENERATE_PATH
