// specdec-generate --prompts FILE --batch N, run as a program on the stories260K fixture: every
// request's output equals the same prompt run alone (greedy, and sampled with the request's seed),
// the streamed text and the --json objects, the statistics, requests that fail alone, and the
// command-line errors; and the corrupted-file loop of the --prompts reader.
#include "support/doctest.hpp"

#ifdef SPECDEC_GENERATE_PATH

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/prompts.hpp"
#include "support/corrupt.hpp"
#include "support/files.hpp"
#include "tools/generate.hpp"

using namespace generate_test;

namespace {

// The first `n` prompts of tinystories_prompts.jsonl, as a --prompts file (its lines kept).
std::string prompts_file(std::size_t n) {
  fs::path const path = tools_test::scratch_dir() / ("prompts_" + std::to_string(n) + ".jsonl");
  std::ifstream in(tools_test::data_file("tinystories_prompts.jsonl"));
  std::ofstream out(path, std::ios::trunc);
  std::string line;
  for (std::size_t i = 0; i < n && std::getline(in, line); ++i) out << line << '\n';
  return path.string();
}

// The "prompt" of each line of `path`.
std::vector<std::string> prompts_of(std::string const& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(json::parse(line).at("prompt").get<std::string>());
  return out;
}

// Runs with --json and parses stdout: one object per request (by line), then the total.
struct batch_output {
  std::map<std::int64_t, json> requests;  // by line
  json total;
};
batch_output batch_json(std::vector<std::string> args, int status = 0) {
  args.push_back("--json");
  process_result const r = gen(args);
  INFO("stderr: " << r.err);
  REQUIRE(r.status == status);
  batch_output out;
  std::istringstream lines(r.out);
  std::string line;
  std::vector<json> all;
  while (std::getline(lines, line)) all.push_back(parse_json(line));
  REQUIRE(!all.empty());
  for (std::size_t i = 0; i + 1 < all.size(); ++i) {
    REQUIRE(all[i].is_object());
    auto const at = all[i].at("line").get<std::int64_t>();
    CHECK_FALSE(out.requests.contains(at));
    out.requests[at] = all[i];
  }
  REQUIRE(all.back().contains("total"));
  out.total = all.back().at("total");
  return out;
}

}  // namespace

TEST_CASE("generate --prompts: each request equals its prompt run alone, greedy and sampled") {
  std::string const file = prompts_file(5);
  std::vector<std::string> const prompts = prompts_of(file);
  for (std::string const strategy : {"prompt-lookup", "autoregressive"}) {
    CAPTURE(strategy);
    batch_output const b =
        batch_json({"--prompts", file, "--batch", "2", "-n", "40", "--strategy", strategy});
    REQUIRE(b.requests.size() == 5);
    for (std::int64_t line = 1; line <= 5; ++line) {
      CAPTURE(line);
      json const& r = b.requests.at(line);
      json const alone = gen_json({"--prompt", prompts[static_cast<std::size_t>(line - 1)], "-n",
                                   "40", "--strategy", strategy});
      CHECK(tokens_of(r) == tokens_of(alone));
      CHECK(str(r.at("text")) == str(alone.at("text")));
      CHECK(str(r.at("prompt")) == prompts[static_cast<std::size_t>(line - 1)]);
      CHECK(str(r.at("finish_reason")) == str(alone.at("finish_reason")));
      CHECK(num(r.at("stats").at("generated")) == static_cast<double>(tokens_of(r).size()));
    }
    json const& t = b.total;
    CHECK(num(t.at("requests")) == 5);
    CHECK(num(t.at("failed")) == 0);
    CHECK(num(t.at("batch")) == 2);
    CHECK(num(t.at("mean_batch")) <= 2.0);
    CHECK(num(t.at("mean_batch")) > 1.0);
    CHECK(num(t.at("tokens_per_second")) > 0.0);
    CHECK(str(t.at("strategy")) == strategy);
  }
  // Sampled: request at line L has seed --seed + L; with the whole budget drafted each step
  // (--speculate full) it draws what the prompt alone draws with that seed.
  batch_output const s = batch_json({"--prompts", file, "--batch", "3", "-n", "30", "--temp", "1",
                                     "--top-p", "0.9", "--seed", "7"});
  for (std::int64_t line = 1; line <= 5; ++line) {
    CAPTURE(line);
    json const alone =
        gen_json({"--prompt", prompts[static_cast<std::size_t>(line - 1)], "-n", "30", "--temp",
                  "1", "--top-p", "0.9", "--seed", std::to_string(7 + line)});
    CHECK(tokens_of(s.requests.at(line)) == tokens_of(alone));
  }
  CHECK(str(s.total.at("verifier")) == "tree (point masses)");
}

// Every strategy serves --prompts: the heads', EAGLE's and the block drafters' proposers read the
// target's hidden rows, lookahead's and Jacobi's add auxiliary tokens, layer-skip drafts with its
// own instance per request; each request's greedy output equals its prompt run alone with the same
// strategy.
TEST_CASE("generate --prompts: every strategy serves a batch as it runs alone") {
  std::string const file = prompts_file(3);
  std::vector<std::string> const prompts = prompts_of(file);
  auto const dir = [](char const* config) {
    return test_support::source_file(config).parent_path().string();
  };
  std::vector<std::vector<std::string>> const strategies = {
      {"--strategy", "medusa", "--heads", dir("tools/heads/medusa/config.json")},
      {"--strategy", "hydra", "--heads", dir("tools/heads/hydra/config.json")},
      {"--strategy", "eagle", "--eagle", dir("tools/eagle/eagle3/config.json")},
      {"--strategy", "eagle", "--eagle", dir("tools/eagle/eagle1/config.json"), "--tree-nodes",
       "12"},
      {"--strategy", "pard", "--draft",
       test_support::source_file("tools/draft/pard/stories_pard.bin").string(), "--mask-token", "0",
       "-k", "6"},
      {"--strategy", "dflash", "--block", dir("tools/block/dflash/config.json")},
      {"--strategy", "dspark", "--block", dir("tools/block/dspark/config.json"),
       "--block-confidence", "0.2"},
      {"--strategy", "lookahead"},
      {"--strategy", "jacobi"},
      {"--strategy", "layer-skip", "--skip-layers", "2"},
      {"--strategy", "sparse-kv", "--sinks", "4", "--budget", "24"},
      {"--strategy", "sparse-kv", "--kv-policy", "snapkv", "--kv-budget", "8", "--kv-window", "2"},
      {"--strategy", "draft", "--draft",
       test_support::source_file("tools/draft/stories_draft.bin").string()},
      {"--strategy", "draft", "--draft",
       test_support::source_file("tools/draft/cross/stories_draft_tok1024.bin").string(),
       "--draft-tokenizer", test_support::source_file("tools/draft/cross/tok1024.bin").string()},
      {"--strategy", "draft", "--draft",
       test_support::source_file("tools/draft/cross/stories_draft_tok1024.bin").string(),
       "--draft-tokenizer", test_support::source_file("tools/draft/cross/tok1024.bin").string(),
       "--vocab-mode", "string"}};
  for (auto const& strategy : strategies) {
    CAPTURE(strategy[1]);
    std::vector<std::string> args = {"--prompts", file, "--batch", "2", "-n", "24"};
    args.insert(args.end(), strategy.begin(), strategy.end());
    batch_output const b = batch_json(args);
    REQUIRE(b.requests.size() == 3);
    CHECK(num(b.total.at("failed")) == 0);
    CHECK(num(b.total.at("drafted")) > 0);
    for (std::int64_t line = 1; line <= 3; ++line) {
      CAPTURE(line);
      std::vector<std::string> one = {"--prompt", prompts[static_cast<std::size_t>(line - 1)], "-n",
                                      "24"};
      one.insert(one.end(), strategy.begin(), strategy.end());
      json const alone = gen_json(one);
      CHECK(tokens_of(b.requests.at(line)) == tokens_of(alone));
    }
  }
}

TEST_CASE("generate --prompts: adaptive speculation and REST keep greedy outputs") {
  std::string const file = prompts_file(4);
  std::vector<std::string> const prompts = prompts_of(file);
  std::string const datastore = stories_datastore();
  for (auto const& extra :
       {std::vector<std::string>{"--speculate", "adaptive"},
        std::vector<std::string>{"--strategy", "rest", "--datastore", datastore},
        std::vector<std::string>{"--strategy", "rest", "--datastore", datastore, "--speculate",
                                 "adaptive"}}) {
    std::vector<std::string> args = {"--prompts", file, "--batch", "4", "-n", "32"};
    args.insert(args.end(), extra.begin(), extra.end());
    batch_output const b = batch_json(args);
    REQUIRE(b.requests.size() == 4);
    for (std::int64_t line = 1; line <= 4; ++line) {
      CAPTURE(line);
      json const alone = gen_json({"--prompt", prompts[static_cast<std::size_t>(line - 1)], "-n",
                                   "32", "--strategy", "autoregressive"});
      CHECK(tokens_of(b.requests.at(line)) == tokens_of(alone));
    }
  }
}

TEST_CASE("generate --prompts: suffix decoding keeps greedy outputs and warms its cache file") {
  std::string const file = prompts_file(4);
  std::vector<std::string> const prompts = prompts_of(file);
  fs::path const cache = tools_test::scratch_dir() / "suffix_batch.sdsuffix";
  fs::remove(cache);
  std::vector<std::string> const suffix = {"--strategy", "suffix", "--suffix-cache",
                                           cache.string()};
  std::vector<json> alone;
  for (std::string const& p : prompts)
    alone.push_back(gen_json({"--prompt", p, "-n", "32", "--strategy", "autoregressive"}));
  double accepted[2] = {};
  for (int run = 0; run < 2; ++run) {  // the second run starts from the first one's file
    CAPTURE(run);
    std::vector<std::string> args = {"--prompts", file, "--batch", "4", "-n", "32"};
    args.insert(args.end(), suffix.begin(), suffix.end());
    if (run == 1) args.push_back("--suffix-tree");
    batch_output const b = batch_json(args);
    REQUIRE(b.requests.size() == 4);
    for (std::int64_t line = 1; line <= 4; ++line) {
      CAPTURE(line);
      CHECK(tokens_of(b.requests.at(line)) == tokens_of(alone[static_cast<std::size_t>(line - 1)]));
    }
    CHECK(fs::exists(cache));
    accepted[run] = num(b.total.at("accepted"));
  }
  CHECK(accepted[1] > 2 * accepted[0]);  // the same prompts again: the outputs are in the cache
  // A single request drafts from the file as well.
  std::vector<std::string> one = {"--prompt", prompts[0], "-n", "32"};
  one.insert(one.end(), suffix.begin(), suffix.end());
  json const warm = gen_json(one);
  CHECK(tokens_of(warm) == tokens_of(alone[0]));
  // A damaged file is refused, naming it.
  {
    std::fstream f(cache, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(60);
    f.put('\x7f');
  }
  check_error(one, 1, "suffix_cache: '" + cache.string() + "'");
}

TEST_CASE("generate --prompts: one draft model serves the batch, greedy and sampled") {
  std::string const file = prompts_file(4);
  std::vector<std::string> const prompts = prompts_of(file);
  std::string const draft = test_support::source_file("tools/draft/stories_draft.bin").string();
  for (std::string const temp : {"0", "1"}) {
    CAPTURE(temp);
    std::vector<std::string> sampling;
    if (temp != "0") sampling = {"--temp", temp, "--seed", "3"};
    std::vector<std::string> args = {"--prompts", file,      "--batch", "3",  "-n",
                                     "36",        "--draft", draft,     "-k", "3"};
    args.insert(args.end(), sampling.begin(), sampling.end());
    batch_output const b = batch_json(args);
    REQUIRE(b.requests.size() == 4);
    CHECK(str(b.total.at("verifier")) == (temp == "0" ? "greedy" : "speculative sampling"));
    CHECK(num(b.total.at("accepted")) > 0);
    for (std::int64_t line = 1; line <= 4; ++line) {
      CAPTURE(line);
      std::vector<std::string> one = {"--prompt", prompts[static_cast<std::size_t>(line - 1)],
                                      "-n",       "36",
                                      "--draft",  draft,
                                      "-k",       "3"};
      if (temp != "0") one.insert(one.end(), {"--temp", temp, "--seed", std::to_string(3 + line)});
      CHECK(tokens_of(b.requests.at(line)) == tokens_of(gen_json(one)));
    }
  }
  check_error({"--prompts", file, "--draft", draft, "--adaptive"}, 2,
              "--adaptive does not apply to --prompts");
}

TEST_CASE("generate --prompts: text mode streams each request after its line number") {
  std::string const file = prompts_file(3);
  std::vector<std::string> const prompts = prompts_of(file);
  process_result const r = gen({"--prompts", file, "--batch", "2", "-n", "24"});
  INFO("stderr: " << r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());
  // Each request's lines, in order, rebuild its prompt and its text.
  std::map<int, std::string> text;
  std::map<int, std::string> ends;
  std::istringstream lines(r.out);
  std::string line;
  bool table = false;
  while (std::getline(lines, line)) {
    if (line.rfind("-- ", 0) == 0) table = true;
    if (table || line.empty()) continue;
    std::size_t const colon = line.find(": ");
    REQUIRE(colon != std::string::npos);
    int const n = std::stoi(line.substr(0, colon));
    std::string const rest = line.substr(colon + 2);
    if (rest.rfind("-- ", 0) == 0) {
      ends[n] = rest;
      continue;
    }
    CHECK_FALSE(ends.contains(n));  // nothing after its end line
    text[n] += (text[n].empty() ? "" : " ") + rest;
  }
  REQUIRE(text.size() == 3);
  for (int n = 1; n <= 3; ++n) {
    CAPTURE(n);
    json const alone = gen_json({"--prompt", prompts[static_cast<std::size_t>(n - 1)], "-n", "24"});
    std::string const want = prompts[static_cast<std::size_t>(n - 1)] + str(alone.at("text"));
    // Lines are cut at spaces (one space lost per cut) and at newlines.
    std::string a = text[n], b = want;
    std::erase_if(a, [](char c) { return c == ' ' || c == '\n'; });
    std::erase_if(b, [](char c) { return c == ' ' || c == '\n'; });
    CHECK(a == b);
    CHECK(ends[n] == "-- max_tokens, 24 tokens");
  }
  CHECK(r.out.find("3 requests, 2 at a time, speculation full") != std::string::npos);
  CHECK(r.out.find("72 tokens from 3 requests (0 failed)") != std::string::npos);
}

TEST_CASE("generate --prompts: a request that cannot run fails alone") {
  fs::path const path = tools_test::scratch_dir() / "prompts_long.jsonl";
  {
    std::ofstream out(path, std::ios::trunc);
    out << R"({"prompt": "Once upon a time"})" << '\n';
    out << R"({"prompt": ")" << std::string(3000, 'a') << R"("})" << '\n';  // beyond --context
    out << '\n';                                                            // blank: skipped
    out << R"({"id": 9, "turns": ["One day, a girl", "and then"]})" << '\n';
    out << R"({"prompt": "Tim and Sue played ball."})" << '\n';
    out << R"({"prompt": "A cat sat on the big red mat. The cat was happy and it sat there"})"
        << '\n';
  }
  batch_output const b =
      batch_json({"--prompts", path.string(), "--batch", "2", "-n", "16", "--context", "24"}, 1);
  REQUIRE(b.requests.size() == 5);
  CHECK(str(b.requests.at(2).at("finish_reason")) == "failed");
  CHECK(str(b.requests.at(2).at("error")).find("more than the context of 24") != std::string::npos);
  CHECK(str(b.requests.at(1).at("finish_reason")) == "max_tokens");
  CHECK(str(b.requests.at(4).at("prompt")) == "One day, a girl");      // the first turn
  CHECK(str(b.requests.at(5).at("finish_reason")) == "context_full");  // 11 + 16 > 24
  // 25 tokens: refused by the decoder, not before encoding (its bytes could have fitted).
  CHECK(str(b.requests.at(6).at("finish_reason")) == "failed");
  CHECK(str(b.requests.at(6).at("error")).find("a prompt of 25 tokens does not fit the context") !=
        std::string::npos);
  CHECK(num(b.total.at("failed")) == 2);
  CHECK(num(b.total.at("requests")) == 5);
  json const alone = gen_json({"--prompt", "Once upon a time", "-n", "16", "--context", "24"});
  CHECK(tokens_of(b.requests.at(1)) == tokens_of(alone));
  process_result const r =
      gen({"--prompts", path.string(), "--batch", "2", "-n", "16", "--context", "24"});
  CHECK(r.status == 1);
  CHECK(r.err == "specdec-generate: 2 of 5 requests failed (see their lines)\n");
  CHECK(r.out.find("2: -- failed: ") != std::string::npos);
}

// A batch whose caches, trees and rows cannot fit is refused before it runs, with the estimate:
// 1,024 requests that may each grow to 900,000 positions need more than a terabyte.
TEST_CASE("generate --prompts: a batch beyond the memory is refused up front") {
  fs::path const many = tools_test::scratch_dir() / "prompts_1024.jsonl";
  {
    std::ofstream out(many, std::ios::trunc);
    for (int i = 0; i < 1024; ++i) out << "{\"prompt\": \"Once upon a time\"}\n";
  }
  process_result const r =
      gen({"--prompts", many.string(), "--batch", "1024", "--strategy", "rest", "--datastore",
           stories_datastore(), "--max-nodes", "4095", "--context", "1000000", "-n", "900000"});
  INFO("stderr: " << r.err);
  CHECK(r.status == 1);
  CHECK(r.err.find("--prompts with --batch 1024 and 4095 draft nodes per request and step (an "
                   "estimate) needs ") != std::string::npos);
  CHECK(r.err.find("of memory is available") != std::string::npos);
  CHECK(r.out.empty());
}

TEST_CASE("generate --prompts: command-line and file errors") {
  std::string const file = prompts_file(2);
  check_error({"--prompts", file, "--prompt", "x"}, 2, "not both");
  check_error({"--batch", "2", "--prompt", "x"}, 2, "--batch applies to --prompts only");
  check_error({"--prompts", file, "--speculate", "eager"}, 2, "unknown --speculate policy");
  check_error({"--prompts", file, "--batch", "0"}, 2, "--batch");
  for (std::string const flag : {"--compare", "--stream-json"})
    check_error({"--prompts", file, flag}, 2, flag + " does not apply to --prompts");
  check_error({"--prompts", "/nonexistent/p.jsonl"}, 2, "--prompts: no such file");
  fs::path const bad = tools_test::scratch_dir() / "prompts_bad.jsonl";
  tools_test::write_file(bad, "{\"prompt\": \"ok\"}\n{\"prompt\": 3}\n");
  check_error({"--prompts", bad.string()}, 1, "line 2 has no \"prompt\" string");
  tools_test::write_file(bad, "{\"prompt\": \"ok\"}\nnot json\n");
  check_error({"--prompts", bad.string()}, 1, "line 2 is not JSON");
  tools_test::write_file(bad, "\n\n");
  check_error({"--prompts", bad.string()}, 1, "holds no prompt");
  process_result const help = tools_test::run_process(program(), {"--help"});
  for (char const* flag : {"--prompts", "--batch", "--speculate"})
    CHECK(help.out.find(flag) != std::string::npos);
}

// A NUL byte would end a line for the JSON parser, which would ignore what follows it: refused,
// naming the line (as a strict parser refuses it).
TEST_CASE("generate: a --prompts line holding a NUL byte is refused") {
  fs::path const path = tools_test::scratch_dir() / "nul.jsonl";
  std::string const nul(1, '\0');
  tools_test::write_file(
      path, "{\"prompt\": \"Once\"}\n{\"prompt\": \"upon\"}" + nul + "{\"prompt\": \"a time\"}\n");
  try {
    (void)generate::read_prompts(path);
    FAIL("a line with a NUL byte was read");
  } catch (specdec::error const& e) {
    CHECK(e.code() == specdec::errc::bad_file);
    CHECK(std::string(e.what()).find("line 2 holds a NUL byte at column 19") != std::string::npos);
  }
  tools_test::write_file(path, "{\"prompt\": \"Once\"}" + nul + "\n");
  CHECK_THROWS_AS((void)generate::read_prompts(path), specdec::error);
}

TEST_CASE("corrupted --prompts files are refused or read" * doctest::skip()) {
  test_support::temp_dir dir;
  std::ifstream in(tools_test::data_file("tinystories_prompts.jsonl"), std::ios::binary);
  std::vector<char> const chars((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  auto const probe = [](fs::path const& path) {
    std::vector<generate::numbered_prompt> const prompts = generate::read_prompts(path);
    REQUIRE(!prompts.empty());
    for (auto const& p : prompts) {
      REQUIRE(p.line >= 1);
      (void)tok().encode(p.text, true);  // the prompt is used as the program uses it
    }
  };
  auto const counts =
      test_support::corrupt_file_loop(bytes, 256, 61, 300, dir.file("variant.jsonl"), probe);
  MESSAGE("--prompts variants: ", counts.refused, " refused, ", counts.accepted, " read");
  CHECK(counts.refused > 0);
  CHECK(counts.accepted > 0);
}

#endif  // SPECDEC_GENERATE_PATH
