// bench_rest: the REST datastore and proposer.
//
// 1. Build throughput (suffix array by SA-IS + bucket table) at 1M and 10M corpus tokens, in
//    tokens/s, against a yardstick measured in the same run: std::sort of the same number of
//    32-bit keys (`vs_sort` = sort time / build time; above 1 means building the whole suffix
//    array is faster than merely sorting the tokens).
// 2. Query latency: one `rest_proposer::propose` (longest-suffix match by binary search over the
//    suffix array, continuations, frequency trie, pruning, draft tree) with the default
//    configuration (n_max 16, 128 occurrences, depth 8, 32 nodes), as a share of one decode step
//    of the stories260K fixture measured in the same run (`step_share`; the bar is <= 5% at 10M).
//    The step is a greedy REST decoding step on the fixture (1 thread): its target forward over
//    the drafted tree, verification and commit, the mean of (total - prefill) / steps over the 14
//    TinyStories prompts, 128 new tokens each, with the 1M fixture-sample datastore.
// 3. The proposer inside that decode (BM_decode, 1M and 10M datastores): its time per step and its
//    share of the step (`propose_share`) with the caches as the forwards leave them.
//
// Corpora (synthetic, both stated in the output):
// - "fixture": 200 stories of 256 tokens sampled from stories260K itself (temperature 1, top-p
//   0.9, seeds 1..200) repeated in random order up to the size, each copy with 3% of its tokens
//   replaced by uniform random ids (vocabulary 512): long, frequent matches as in a domain corpus.
//   Queries: contexts (the last 64 tokens) at random points of 50 held-out samples (seeds 1001..).
// - "zipf": i.i.d. ids from a Zipf(1.1) law over a 32,000-id vocabulary, documents of 512:
//   short matches over large ranges (the worst case for the binary searches). Queries: held-out
//   Zipf contexts.
//
// Run (Release): build/<dir>/benchmarks/bench_rest
// Environment: SPECDEC_MODEL_DIR, SPECDEC_DATA_DIR (default ../shared/{models,data} next to the
// repository).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "jsonl.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/rest.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"

namespace sd = specdec;
namespace fs = std::filesystem;

namespace {

constexpr std::uint32_t sep = sd::rest_datastore::separator;

fs::path shared_dir(char const* var, char const* leaf) {
  if (char const* v = std::getenv(var); v != nullptr && *v != '\0') return v;
  return fs::path(__FILE__).parent_path().parent_path().parent_path() / "shared" / leaf;
}

std::shared_ptr<sd::llama_weights const> const& fixture_weights() {
  static auto const w = std::make_shared<sd::llama_weights const>(
      sd::load_model(shared_dir("SPECDEC_MODEL_DIR", "models") / "stories260K.bin"));
  return w;
}

sd::sampler sampling() {
  sd::sampling_params p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  return sd::sampler(p);
}

//! `count` stories of 256 tokens sampled from the fixture after BOS, seeds first..first+count-1.
std::vector<std::vector<sd::token_id>> fixture_samples(std::size_t count, std::uint64_t first) {
  sd::cpu_llama model(fixture_weights(), {.threads = 1});
  sd::decode_config c;
  c.max_new_tokens = 256;
  sd::autoregressive_decoder ar(model, sampling(), c);
  std::vector<sd::token_id> const bos{1};
  std::vector<std::vector<sd::token_id>> out;
  for (std::size_t i = 0; i < count; ++i) {
    ar.config().seed = first + i;
    out.push_back(ar.generate(bos).tokens);
  }
  return out;
}

std::vector<std::vector<sd::token_id>> const& training_samples() {
  static auto const s = fixture_samples(200, 1);
  return s;
}
std::vector<std::vector<sd::token_id>> const& heldout_samples() {
  static auto const s = fixture_samples(50, 1001);
  return s;
}

//! The "fixture" corpus of `n` entries (see the file comment).
std::vector<std::uint32_t> fixture_corpus(std::size_t n) {
  auto const& docs = training_samples();
  std::mt19937_64 rng(42);
  std::vector<std::uint32_t> c;
  c.reserve(n + 512);
  while (c.size() < n) {
    auto const& d = docs[rng() % docs.size()];
    for (sd::token_id t : d)
      c.push_back(rng() % 100 < 3 ? static_cast<std::uint32_t>(rng() % 512)
                                  : static_cast<std::uint32_t>(t));
    c.push_back(sep);
  }
  c.resize(n);
  return c;
}

//! Zipf(s) over [0, vocab) by inverse CDF.
class zipf {
 public:
  zipf(std::size_t vocab, double s) : cdf_(vocab) {
    double sum = 0.0;
    for (std::size_t k = 0; k < vocab; ++k) sum += 1.0 / std::pow(static_cast<double>(k + 1), s);
    double acc = 0.0;
    for (std::size_t k = 0; k < vocab; ++k) {
      acc += 1.0 / std::pow(static_cast<double>(k + 1), s) / sum;
      cdf_[k] = acc;
    }
  }
  template <class Rng>
  std::uint32_t operator()(Rng& rng) const {
    double const u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    return static_cast<std::uint32_t>(std::min<std::size_t>(
        static_cast<std::size_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin()),
        cdf_.size() - 1));
  }

 private:
  std::vector<double> cdf_;
};

constexpr std::size_t zipf_vocab = 32000;

std::vector<std::uint32_t> zipf_corpus(std::size_t n, std::uint64_t seed) {
  static zipf const z(zipf_vocab, 1.1);
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> c(n);
  for (std::size_t i = 0; i < n; ++i) c[i] = (i + 1) % 512 == 0 ? sep : z(rng);
  return c;
}

std::vector<std::uint32_t> corpus(int kind, std::size_t n) {
  return kind == 0 ? fixture_corpus(n) : zipf_corpus(n, 7);
}
std::size_t vocab_of(int kind) {
  return kind == 0 ? 512 : zipf_vocab;
}
char const* name_of(int kind) {
  return kind == 0 ? "fixture samples, repeated, 3% perturbed" : "Zipf(1.1), 32000 ids";
}

//! Datastores built once per (kind, size).
std::shared_ptr<sd::rest_datastore const> datastore(int kind, std::size_t n) {
  static std::map<std::pair<int, std::size_t>, std::shared_ptr<sd::rest_datastore const>> cache;
  auto& slot = cache[{kind, n}];
  if (!slot)
    slot = std::make_shared<sd::rest_datastore const>(
        sd::rest_datastore::build(vocab_of(kind), corpus(kind, n)));
  return slot;
}

//! Query contexts (64 tokens each).
std::vector<std::vector<sd::token_id>> const& contexts(int kind) {
  static std::map<int, std::vector<std::vector<sd::token_id>>> cache;
  auto& out = cache[kind];
  if (!out.empty()) return out;
  std::mt19937_64 rng(99);
  if (kind == 0) {
    for (auto const& d : heldout_samples())
      for (int k = 0; k < 20 && d.size() > 80; ++k) {
        std::size_t const end = 64 + rng() % (d.size() - 64);
        out.emplace_back(d.begin() + static_cast<std::ptrdiff_t>(end - 64),
                         d.begin() + static_cast<std::ptrdiff_t>(end));
      }
  } else {
    auto const c = zipf_corpus(64 * 1000, 12345);
    for (std::size_t i = 0; i < 1000; ++i) {
      std::vector<sd::token_id> ctx;
      for (std::size_t k = 0; k < 64; ++k)
        ctx.push_back(c[i * 64 + k] == sep ? 0 : static_cast<sd::token_id>(c[i * 64 + k]));
      out.push_back(std::move(ctx));
    }
  }
  return out;
}

//! A greedy REST decode of the fixture over the 14 TinyStories prompts (128 new tokens each, 1
//! thread) with the fixture-sample datastore of `n` entries; the second of two passes.
struct decode_figures {
  double step_seconds = 0.0;     //!< mean decode step, prefill excluded
  double propose_seconds = 0.0;  //!< of which in the proposer (query + trie + tree)
  double forward_seconds = 0.0;  //!< of which in the target forward
  double mean_tree = 0.0;
  double mean_accepted = 0.0;
};
decode_figures run_decode(std::size_t n) {
  fs::path const models = shared_dir("SPECDEC_MODEL_DIR", "models");
  sd::tokenizer const tok = sd::load_tokenizer(models / "stories260K.bin", models / "tok512.bin");
  std::vector<std::vector<sd::token_id>> prompts;
  for (std::string const& text : bench::jsonl_strings(
           shared_dir("SPECDEC_DATA_DIR", "data") / "tinystories_prompts.jsonl", "prompt"))
    prompts.push_back(tok.encode(text, true));
  if (prompts.empty())
    throw std::runtime_error("bench_rest: no prompts in tinystories_prompts.jsonl");
  sd::cpu_llama target(fixture_weights(), {.threads = 1});
  sd::rest_proposer p(datastore(0, n));
  sd::decode_config c;
  c.max_new_tokens = 128;
  c.max_draft_nodes = 32;
  sd::speculative_decoder dec(target, p, sd::greedy_verifier{}, sd::greedy{}, c);
  sd::request_stats total;
  double decode = 0.0;
  for (int rep = 0; rep < 2; ++rep)
    for (auto const& pr : prompts) {
      auto const res = dec.generate(pr);
      if (rep == 0) continue;  // warm-up pass
      decode += res.stats.total_seconds - res.stats.prefill_seconds;
      total.steps += res.stats.steps;
      total.drafted += res.stats.drafted;
      total.accepted += res.stats.accepted;
      total.propose_seconds += res.stats.propose_seconds;
      total.score_seconds += res.stats.score_seconds;
    }
  auto const steps = static_cast<double>(total.steps);
  decode_figures r;
  r.step_seconds = decode / steps;
  r.propose_seconds = total.propose_seconds / steps;
  r.forward_seconds = total.score_seconds / steps;
  r.mean_tree = total.mean_tree_size();
  r.mean_accepted = total.mean_accepted_length();
  return r;
}

//! The step time queries are compared with: the decode at 1M, measured once.
decode_figures const& yardstick() {
  static decode_figures const y = run_decode(1'000'000);
  return y;
}

void BM_build(benchmark::State& state) {
  int const kind = static_cast<int>(state.range(0));
  auto const n = static_cast<std::size_t>(state.range(1));
  state.SetLabel(name_of(kind));
  auto const c = corpus(kind, n);
  double build = 0.0, sort = 0.0;
  std::size_t runs = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    auto ds = sd::rest_datastore::build(vocab_of(kind), c);
    benchmark::DoNotOptimize(ds.suffix_array().data());
    build += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.PauseTiming();
    std::vector<std::uint32_t> keys(c);
    t0 = std::chrono::steady_clock::now();
    std::sort(keys.begin(), keys.end());
    benchmark::DoNotOptimize(keys.data());
    sort += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.ResumeTiming();
    ++runs;
  }
  state.counters["tokens_per_s"] = static_cast<double>(n * runs) / build;
  state.counters["vs_sort"] = sort / build;
  state.counters["MiB"] = static_cast<double>(4 * 2 * n) / 1048576.0;
}

void BM_query(benchmark::State& state) {
  int const kind = static_cast<int>(state.range(0));
  auto const n = static_cast<std::size_t>(state.range(1));
  state.SetLabel(name_of(kind));
  decode_figures const& y = yardstick();
  auto const ds = datastore(kind, n);
  auto const& ctxs = contexts(kind);
  sd::rest_proposer p(ds);
  sd::draft_tree tree(64);
  std::size_t i = 0, nodes = 0, matched = 0, queries = 0;
  auto const t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    sd::propose_context ctx;
    ctx.tokens = ctxs[i];
    ctx.max_nodes = 32;
    p.propose(ctx, tree);
    benchmark::DoNotOptimize(tree.tokens().data());
    nodes += tree.num_drafted();
    matched += p.last_match().length;
    ++queries;
    if (++i == ctxs.size()) i = 0;
  }
  double const per_query =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
      static_cast<double>(queries);
  auto const q = static_cast<double>(queries);
  state.counters["us_per_query"] = per_query * 1e6;
  state.counters["nodes"] = static_cast<double>(nodes) / q;
  state.counters["match_len"] = static_cast<double>(matched) / q;
  state.counters["step_us"] = y.step_seconds * 1e6;
  state.counters["step_share"] = per_query / y.step_seconds;
}

//! The proposer inside a real decode (caches cold after each forward): its share of the step.
void BM_decode(benchmark::State& state) {
  auto const n = static_cast<std::size_t>(state.range(0));
  state.SetLabel("fixture samples datastore; greedy, 14 prompts x 128 tokens, 1 thread");
  (void)datastore(0, n);
  decode_figures r;
  for (auto _ : state) r = run_decode(n);
  state.counters["step_us"] = r.step_seconds * 1e6;
  state.counters["forward_us"] = r.forward_seconds * 1e6;
  state.counters["propose_us"] = r.propose_seconds * 1e6;
  state.counters["propose_share"] = r.propose_seconds / r.step_seconds;
  state.counters["tree"] = r.mean_tree;
  state.counters["accepted_len"] = r.mean_accepted;
}

}  // namespace

BENCHMARK(BM_build)
    ->Args({0, 1'000'000})
    ->Args({0, 10'000'000})
    ->Args({1, 1'000'000})
    ->Args({1, 10'000'000})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK(BM_query)
    ->Args({0, 1'000'000})
    ->Args({0, 10'000'000})
    ->Args({1, 1'000'000})
    ->Args({1, 10'000'000})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_decode)->Arg(1'000'000)->Arg(10'000'000)->Unit(benchmark::kMillisecond)->Iterations(1);

BENCHMARK_MAIN();
