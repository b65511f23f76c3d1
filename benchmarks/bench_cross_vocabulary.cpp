// bench_cross_vocabulary: drafting with a model of another vocabulary
// (propose/cross_vocabulary.hpp), on the stories260K fixture with the drafts of
// tools/draft/cross: stories_draft_tok1024.bin (its own 1,024-token vocabulary) and
// stories_draft_same_vocab.bin (tok512, the same shape and training recipe).
//
// 0. BM_bridge: building the bridge between tok512 and tok1024 (`vocabulary_bridge::between`:
//    every token's text, the pairs, every target token's draft tokens).
// 1. BM_decode/M: greedy decoding of the 14 fixture prompts, 96 tokens each, k = 4, with the
//    tok1024 draft in mode M (0: intersection, 1: string), and in the same iteration with the
//    same-vocabulary draft and autoregressively. Counters: tokens per target forward (`tpf`,
//    accepted + 1 per step) and its ratio to the same-vocabulary draft's (`tpf_vs_same_vocab`);
//    the proposer's time per step (`propose_us`) and its ratio to the same-vocabulary draft's
//    (`propose_vs_same_vocab`: what the text handling and the larger vocabulary add to the
//    draft's forwards); wall-time speedup against autoregressive decoding (`speedup`) and the
//    same-vocabulary draft's (`same_vocab_speedup`). SPECDEC_CROSS_TARGET=PATH runs the target
//    as another model of the fixture's function: the widened fixture (docs/models.md, "Widened
//    models"), whose forwards stream weights as a large model's do.
//
// Run (Release): build/<dir>/benchmarks/bench_cross_vocabulary
// Environment: SPECDEC_MODEL_DIR, SPECDEC_DATA_DIR (default ../shared/{models,data} next to the
// repository).

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "e2e_support.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/load.hpp"
#include "specdec/propose/cross_vocabulary.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"

namespace sd = specdec;

namespace {

// A file of the repository (the drafts and tokenizer of tools/draft/cross).
std::filesystem::path repository_file(char const* relative) {
  return bench::require(std::filesystem::path(__FILE__).parent_path().parent_path() / relative);
}

sd::tokenizer const& tok1024() {
  static sd::tokenizer const tok =
      sd::load_tokenizer(repository_file("tools/draft/cross/stories_draft_tok1024.bin"),
                         repository_file("tools/draft/cross/tok1024.bin"));
  return tok;
}

std::shared_ptr<sd::llama_weights const> load(char const* relative) {
  return std::make_shared<sd::llama_weights const>(sd::load_model(repository_file(relative)));
}

// What a run of the fixture prompts adds up to.
struct totals {
  std::size_t steps = 0, accepted = 0, tokens = 0;
  double seconds = 0.0, propose = 0.0;
  void add(sd::decode_result const& r) {
    steps += r.stats.steps;
    accepted += r.stats.accepted;
    tokens += r.tokens.size();
    seconds += r.stats.total_seconds;
    propose += r.stats.propose_seconds;
  }
  [[nodiscard]] double tpf() const {
    return static_cast<double>(steps + accepted) / static_cast<double>(steps);
  }
  [[nodiscard]] double propose_us() const { return propose * 1e6 / static_cast<double>(steps); }
  [[nodiscard]] double tokens_per_second() const { return static_cast<double>(tokens) / seconds; }
};

sd::decode_config config() {
  sd::decode_config c;
  c.max_new_tokens = 96;
  return c;
}

template <class Decoder>
void run_prompts(Decoder& dec, totals& t) {
  for (auto const& prompt : bench::fixture_prompts()) t.add(dec.generate(prompt));
}

void BM_bridge(benchmark::State& state) {
  sd::tokenizer const& target = bench::tok512();
  sd::tokenizer const& draft = tok1024();
  for (auto _ : state) {
    auto const bridge = sd::vocabulary_bridge::between(target, draft);
    benchmark::DoNotOptimize(bridge.shared());
  }
}

void BM_decode(benchmark::State& state) {
  std::shared_ptr<sd::llama_weights const> weights = bench::stories260k();
  if (char const* path = std::getenv("SPECDEC_CROSS_TARGET"); path != nullptr && *path != '\0')
    weights = std::make_shared<sd::llama_weights const>(sd::load_model(path));
  auto const mode = state.range(0) == 0 ? sd::vocab_mode::intersection : sd::vocab_mode::string;
  state.SetLabel(mode == sd::vocab_mode::intersection ? "intersection" : "string");
  auto const bridge = std::make_shared<sd::vocabulary_bridge const>(
      sd::vocabulary_bridge::between(bench::tok512(), tok1024()));
  sd::cpu_llama target(weights, {.threads = 1});
  sd::cpu_llama cross_draft(load("tools/draft/cross/stories_draft_tok1024.bin"), {.threads = 1});
  sd::cpu_llama same_draft(load("tools/draft/cross/stories_draft_same_vocab.bin"), {.threads = 1});
  totals autoregressive, same, cross;
  for (auto _ : state) {
    sd::autoregressive_decoder ar(target, sd::greedy{}, config());
    run_prompts(ar, autoregressive);
    sd::draft_model_proposer baseline(same_draft, target, sd::greedy{}, {.k = 4});
    sd::speculative_decoder with_same(target, baseline, sd::greedy_verifier{}, sd::greedy{},
                                      config());
    run_prompts(with_same, same);
    sd::cross_vocabulary_proposer<sd::cpu_llama, sd::greedy> proposer(
        cross_draft, bridge, sd::greedy{}, {.draft = {.k = 4}, .mode = mode});
    sd::speculative_decoder with_cross(target, proposer, sd::greedy_verifier{}, sd::greedy{},
                                       config());
    run_prompts(with_cross, cross);
  }
  state.counters["tpf"] = cross.tpf();
  state.counters["tpf_vs_same_vocab"] = cross.tpf() / same.tpf();
  state.counters["propose_us"] = cross.propose_us();
  state.counters["propose_vs_same_vocab"] = cross.propose_us() / same.propose_us();
  state.counters["speedup"] = cross.tokens_per_second() / autoregressive.tokens_per_second();
  state.counters["same_vocab_speedup"] =
      same.tokens_per_second() / autoregressive.tokens_per_second();
}

}  // namespace

BENCHMARK(BM_bridge)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(2);

BENCHMARK_MAIN();
