// bench_suffix: the suffix tree of suffix decoding (propose/suffix_tree.hpp).
//
// Corpus: the 14 TinyStories stories of tinystories_prompts.jsonl ("story"), tokenised with
// tok512, each taken 20 times in a fixed shuffled order (seed 1): a repeated workload, about
// 60,000 tokens. Contexts: the 64 tokens before 256 positions drawn at random (seed 2) in the
// stories.
//
// 1. BM_suffix_append: a depth-24 tree built from the corpus (each copy one sequence), in
//    tokens/s, against a yardstick measured in the same run: prompt lookup's n-gram index (n
//    = 1..3, propose/prompt_lookup.hpp) of the same tokens as one history (`vs_lookup_index` =
//    index time / tree time: the cost of the tree's counts and compressed paths over a plain hash
//    index).
// 2. BM_suffix_speculate/{path,tree}: one `suffix_tree::speculate` (16 tokens, factor 1, minimum
//    probability 0.1) on the full tree, per context, against one token of greedy autoregressive
//    decoding of the stories260K fixture (1 thread, 64 tokens after each of the 14 prompts)
//    measured in the same run (`token_share` = speculate time / time per token: what drafting
//    from one tree adds to the cheapest step there is).
//
// Run (Release): build/<dir>/benchmarks/bench_suffix
// Environment: SPECDEC_MODEL_DIR, SPECDEC_DATA_DIR (default ../shared/{models,data} next to the
// repository).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "e2e_support.hpp"
#include "jsonl.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/propose/suffix_tree.hpp"
#include "specdec/sampling/policy.hpp"

namespace sd = specdec;

namespace {

struct workload {
  std::vector<std::vector<sd::token_id>> copies;  // the corpus, one sequence per copy
  std::vector<sd::token_id> history;              // the same, as one sequence
  std::vector<std::vector<sd::token_id>> contexts;
};

workload const& the_workload() {
  static workload const w = [] {
    auto const data = bench::shared_dir("SPECDEC_DATA_DIR", "data");
    std::vector<std::vector<sd::token_id>> stories;
    for (std::string const& s :
         bench::jsonl_strings(bench::require(data / "tinystories_prompts.jsonl"), "story"))
      stories.push_back(bench::tok512().encode(s, false));
    workload out;
    for (int r = 0; r < 20; ++r)
      for (auto const& s : stories) out.copies.push_back(s);
    std::shuffle(out.copies.begin(), out.copies.end(), std::mt19937(1));
    for (auto const& c : out.copies) out.history.insert(out.history.end(), c.begin(), c.end());
    std::mt19937 g(2);
    while (out.contexts.size() < 256) {
      auto const& s = stories[g() % stories.size()];
      if (s.size() < 80) continue;
      std::size_t const end = 64 + g() % (s.size() - 64);
      out.contexts.emplace_back(s.begin() + static_cast<std::ptrdiff_t>(end - 64),
                                s.begin() + static_cast<std::ptrdiff_t>(end));
    }
    return out;
  }();
  return w;
}

sd::suffix_tree build_tree(workload const& w) {
  sd::suffix_tree t(24);
  for (auto const& c : w.copies) {
    auto const s = t.add_sequence();
    t.extend(s, c);
    t.finish(s);
  }
  return t;
}

// Seconds per run of f, the best of `runs`.
template <class F>
double best_seconds(int runs, F&& f) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    auto const t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void BM_suffix_append(benchmark::State& state) {
  workload const& w = the_workload();
  for (auto _ : state) benchmark::DoNotOptimize(build_tree(w).num_nodes());
  double const per_tree = best_seconds(3, [&] { benchmark::DoNotOptimize(build_tree(w)); });
  double const per_index = best_seconds(3, [&] {
    sd::prompt_lookup_proposer p({.n_max = 3, .n_min = 1, .k = 16});
    p.begin(w.history);
    benchmark::DoNotOptimize(p.history_size());
  });
  state.counters["tokens"] = static_cast<double>(w.history.size());
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(w.history.size()) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["nodes"] = static_cast<double>(build_tree(w).num_nodes());
  state.counters["vs_lookup_index"] = per_index / per_tree;
}
BENCHMARK(BM_suffix_append)->Unit(benchmark::kMillisecond);

// Seconds per token of greedy autoregressive decoding on the fixture (1 thread), best of 3.
double seconds_per_token() {
  static double const seconds = [] {
    sd::cpu_llama model(bench::stories260k(), {.threads = 1});
    sd::decode_config config;
    config.max_new_tokens = 64;
    sd::autoregressive_decoder ar(model, sd::greedy{}, config);
    std::size_t tokens = 0;
    double const total = best_seconds(3, [&] {
      tokens = 0;
      for (auto const& p : bench::fixture_prompts()) tokens += ar.generate(p).tokens.size();
    });
    return total / static_cast<double>(tokens);
  }();
  return seconds;
}

void BM_suffix_speculate(benchmark::State& state) {
  workload const& w = the_workload();
  bool const tree = state.range(0) == 1;
  state.SetLabel(tree ? "tree" : "path");
  sd::suffix_tree const t = build_tree(w);
  sd::suffix_speculation const how{.max_tokens = 16, .tree = tree};
  sd::suffix_workspace work;
  sd::suffix_draft d;
  std::size_t i = 0;
  std::size_t drafted = 0;
  for (auto _ : state) {
    t.speculate(w.contexts[i], how, d, work);
    drafted += d.size();
    i = (i + 1) % w.contexts.size();
  }
  double const suffix = best_seconds(3,
                                     [&] {
                                       for (auto const& c : w.contexts)
                                         t.speculate(c, how, d, work);
                                     }) /
                        static_cast<double>(w.contexts.size());
  state.counters["drafted_per_call"] =
      static_cast<double>(drafted) / static_cast<double>(state.iterations());
  state.counters["token_share"] = suffix / seconds_per_token();
}
BENCHMARK(BM_suffix_speculate)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
