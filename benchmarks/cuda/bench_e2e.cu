// bench_e2e_cuda (benchmarks/cuda/bench_e2e.cu, built as bench_e2e_cuda like every CUDA
// benchmark): end-to-end decoding on one CUDA device, every figure against a yardstick
// measured in the same run.
//
// 1. The stories260K fixture on the GPU (fused kernels and captured graphs, f32): over the 14
//    prompts of tinystories_prompts.jsonl, 128 new tokens each, greedy, the autoregressive baseline
//    and one strategy alternately, prompt by prompt, SPECDEC_BENCH_REPS rounds (default 3) after
//    a warm-up round: the trained draft model (tools/draft/stories_draft.bin, on its own
//    cuda_llama) with k = 3 and k = 4, and prompt lookup (a chain: n-grams 3..1, k = 4), each on
//    the device-resident step (cuda::step_verifier: the target's rows stay on the device); the
//    draft model with k = 4 also with host verification (greedy_verifier on downloaded rows), to
//    show what the device step saves; and the heads (the fixture's Medusa and Hydra heads with
//    their committed sparse trees, the EAGLE-1 and EAGLE-3 heads with dynamic trees of depth 8,
//    top-6, 32 nodes) on the device (cuda_medusa_heads, cuda_hydra_heads, cuda_eagle_head), their
//    target forwards bringing the hidden rows to the host for the proposer and greedy_verifier.
//    Counters: tokens/s of both (generated tokens over wall
//    time, prefill included), their ratio, the mean accepted length; every strategy's tokens
//    must equal the baseline's (greedy), else the benchmark fails.
// 2. The TinyLlama-1.1B shape (random weights, 256 tokens of context) in f32, f16 and bf16: one
//    decode step (1 token) and the scoring of 5 tokens (a chain), logits left on the device,
//    alternating, 20 steps per sample; the yardstick is the device's read bandwidth, measured in
//    the same benchmark by a kernel that only reads a buffer of the step's bytes. Counters: ms per
//    step, the step bytes (every weight a step reads), x_bw = time / (bytes / bandwidth) (the bar:
//    <= 1.3 in bf16), the bandwidth, and x_one = 5-token time / 1-token time (bar <= 1.15).
//
// Environment: SPECDEC_MODEL_DIR, SPECDEC_DATA_DIR (default ../shared/{models,data} next to the
// repository), SPECDEC_BENCH_REPS (fixture rounds, default 3).
//
// Run (Release): build/<dir>/benchmarks/bench_e2e_cuda [--benchmark_filter=fixture|tinyllama]
// tests/backend/cuda/bars.py reads its JSON output (--benchmark_out) and prints the bars.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/bench_common.cuh"
#include "jsonl.hpp"
#include "specdec/backend/cuda/eagle.cuh"
#include "specdec/backend/cuda/heads.cuh"
#include "specdec/backend/cuda/llama.cuh"
#include "specdec/backend/cuda/step_verifier.cuh"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/eagle.hpp"
#include "specdec/model/eagle_file.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/propose/hydra.hpp"
#include "specdec/propose/medusa.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"

namespace {

namespace sd = specdec;
namespace fs = std::filesystem;

fs::path shared_dir(char const* var, char const* sub) {
  if (char const* v = std::getenv(var); v != nullptr && *v != '\0') return v;
  return fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path() / "shared" /
         sub;
}

fs::path require(fs::path const& p) {
  if (!fs::exists(p)) {
    std::fprintf(stderr, "bench_e2e_cuda: missing %s (set SPECDEC_MODEL_DIR / SPECDEC_DATA_DIR)\n",
                 p.string().c_str());
    std::exit(1);
  }
  return p;
}

std::size_t env_count(char const* var, std::size_t fallback) {
  char const* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  unsigned long long const n = std::strtoull(v, &end, 10);
  return end != v && *end == '\0' && n > 0 ? static_cast<std::size_t>(n) : fallback;
}

// ---------------------------------------------------------------------------------------------
// 1. The fixture.

constexpr std::size_t fixture_tokens = 128;

//! The fixture's models on the device and its prompts, built once.
struct fixture {
  std::shared_ptr<sd::llama_weights const> weights;  // the target's, on the host (for the heads)
  std::unique_ptr<sd::cuda_llama> target;
  std::unique_ptr<sd::cuda_llama> draft;
  std::vector<std::vector<sd::token_id>> prompts;

  static fixture& get() {
    static fixture f = [] {
      fixture x;
      fs::path const models = shared_dir("SPECDEC_MODEL_DIR", "models");
      fs::path const data = shared_dir("SPECDEC_DATA_DIR", "data");
      auto const weights = std::make_shared<sd::llama_weights const>(
          sd::load_model(require(models / "stories260K.bin")));
      fs::path const draft_file = fs::path(__FILE__).parent_path().parent_path().parent_path() /
                                  "tools" / "draft" / "stories_draft.bin";
      auto const draft =
          std::make_shared<sd::llama_weights const>(sd::load_model(require(draft_file)));
      x.weights = weights;
      x.target = std::make_unique<sd::cuda_llama>(weights);
      x.draft = std::make_unique<sd::cuda_llama>(draft);
      sd::tokenizer const tok =
          sd::load_tokenizer(models / "stories260K.bin", require(models / "tok512.bin"));
      for (std::string const& text :
           test_support::jsonl_strings(require(data / "tinystories_prompts.jsonl"), "prompt"))
        x.prompts.push_back(tok.encode(text, true));
      if (x.prompts.size() != 14) {
        std::fprintf(stderr, "bench_e2e_cuda: expected 14 prompts, read %zu\n", x.prompts.size());
        std::exit(1);
      }
      return x;
    }();
    return f;
  }
};

sd::decode_config fixture_config() {
  sd::decode_config c;
  c.max_new_tokens = fixture_tokens;  // no EOS: every request generates exactly this many
  return c;
}

//! Sums of a set of requests.
struct totals {
  std::size_t generated = 0, steps = 0, accepted = 0;
  double seconds = 0.0;
  void add(sd::request_stats const& s) {
    generated += s.generated;
    steps += s.steps;
    accepted += s.accepted;
    seconds += s.total_seconds;
  }
  [[nodiscard]] double tokens_per_second() const {
    return seconds > 0.0 ? static_cast<double>(generated) / seconds : 0.0;
  }
};

//! Every prompt through the baseline and `decoder` in turn: a warm-up round (graphs captured),
//! then SPECDEC_BENCH_REPS timed rounds.
template <class Decoder>
void run_fixture(benchmark::State& state, Decoder& decoder) {
  fixture& f = fixture::get();
  sd::autoregressive_decoder baseline(*f.target, sd::greedy{}, fixture_config());
  std::size_t const reps = env_count("SPECDEC_BENCH_REPS", 3);
  totals spec, base;
  bool identical = true;
  sd::decode_result b, r;
  for (auto _ : state) {
    for (std::size_t round = 0; round <= reps; ++round) {
      for (auto const& prompt : f.prompts) {
        baseline.generate(prompt, b);
        decoder.generate(prompt, r);
        identical = identical && r.tokens == b.tokens;
        if (round == 0) continue;  // warm-up
        base.add(b.stats);
        spec.add(r.stats);
      }
    }
    state.SetIterationTime(spec.seconds);
  }
  if (!identical) {
    state.SkipWithError("the strategy's greedy output differs from the baseline's");
    return;
  }
  state.counters["tok_per_s"] = spec.tokens_per_second();
  state.counters["base_tok_per_s"] = base.tokens_per_second();
  state.counters["speedup"] = spec.tokens_per_second() / base.tokens_per_second();
  state.counters["accepted_len"] =
      spec.steps > 0
          ? static_cast<double>(spec.accepted + spec.steps) / static_cast<double>(spec.steps)
          : 0.0;
}

//! The baseline alone (the autoregressive bar: tokens/s on the device).
void bench_autoregressive(benchmark::State& state) {
  fixture& f = fixture::get();
  sd::autoregressive_decoder baseline(*f.target, sd::greedy{}, fixture_config());
  run_fixture(state, baseline);
}

sd::cuda::step_verifier device_verifier() {
  fixture& f = fixture::get();
  return sd::cuda::step_verifier(static_cast<std::int32_t>(f.target->vocab_size()),
                                 f.target->stream());
}

void bench_draft(benchmark::State& state, std::size_t k, bool device_step) {
  fixture& f = fixture::get();
  sd::draft_model_proposer<sd::cuda_llama, sd::greedy> proposer(*f.draft, f.target->vocab_size(),
                                                                sd::greedy{}, {.k = k});
  if (device_step) {
    sd::speculative_decoder decoder(*f.target, proposer, device_verifier(), sd::greedy{},
                                    fixture_config());
    static_assert(std::is_same_v<decltype(decoder)::result_type, sd::cuda_forward_result>);
    run_fixture(state, decoder);
  } else {
    sd::speculative_decoder decoder(*f.target, proposer, sd::greedy_verifier{}, sd::greedy{},
                                    fixture_config());
    run_fixture(state, decoder);
  }
}

void bench_prompt_lookup(benchmark::State& state) {
  fixture& f = fixture::get();
  sd::prompt_lookup_proposer proposer({.n_max = 3, .n_min = 1, .k = 4});
  sd::speculative_decoder decoder(*f.target, proposer, device_verifier(), sd::greedy{},
                                  fixture_config());
  run_fixture(state, decoder);
}

//! tools/<dir>/<kind> of this repository (the heads trained for the fixture).
fs::path tools_dir(char const* dir, char const* kind) {
  return fs::path(__FILE__).parent_path().parent_path().parent_path() / "tools" / dir / kind;
}

void bench_heads(benchmark::State& state, bool hydra) {
  fixture& f = fixture::get();
  sd::llama_weights const& target = *f.weights;
  fs::path const dir = tools_dir("heads", hydra ? "hydra" : "medusa");
  sd::sparse_tree tree =
      sd::sparse_tree::from_choices(sd::read_tree_choices(require(dir / sd::heads_tree_file)));
  if (hydra) {
    sd::cuda_hydra_heads heads(sd::load_hydra_heads(dir, target.config), target);
    sd::hydra_proposer proposer(heads, std::move(tree));
    sd::speculative_decoder decoder(*f.target, proposer, sd::greedy_verifier{}, sd::greedy{},
                                    fixture_config());
    run_fixture(state, decoder);
  } else {
    sd::cuda_medusa_heads heads(sd::load_medusa_heads(dir, target.config));
    sd::medusa_proposer proposer(heads, std::move(tree));
    sd::speculative_decoder decoder(*f.target, proposer, sd::greedy_verifier{}, sd::greedy{},
                                    fixture_config());
    run_fixture(state, decoder);
  }
}

void bench_eagle(benchmark::State& state, char const* kind) {
  fixture& f = fixture::get();
  fs::path const dir = tools_dir("eagle", kind);
  require(dir / "config.json");
  sd::cuda_eagle_head head(sd::load_eagle_head(dir, f.weights));
  sd::eagle_proposer proposer(head, sd::eagle_tree_config{.depth = 8, .top_k = 6, .nodes = 32});
  sd::speculative_decoder decoder(*f.target, proposer, sd::greedy_verifier{}, sd::greedy{},
                                  fixture_config());
  run_fixture(state, decoder);
}

// ---------------------------------------------------------------------------------------------
// 2. The TinyLlama shape.

constexpr std::size_t tiny_context = 256;

//! One model per dtype, built once (the host weights are generated once).
sd::cuda_llama& tiny_model(sd::weight_dtype t) {
  static std::map<sd::weight_dtype, std::unique_ptr<sd::cuda_llama>> models;
  auto& m = models[t];
  if (!m)
    m = std::make_unique<sd::cuda_llama>(*bench_cuda::tinyllama(),
                                         sd::cuda_llama_options{.max_context = 1024, .dtype = t});
  return *m;
}

void bench_tinyllama(benchmark::State& state, sd::weight_dtype t) {
  sd::cuda_llama& m = tiny_model(t);
  m.reset();
  std::vector<sd::token_id> prompt(tiny_context);
  for (std::size_t i = 0; i < tiny_context; ++i)
    prompt[i] = static_cast<sd::token_id>((i * 7919) % 32000);
  std::vector<sd::position_t> ppos(tiny_context);
  std::iota(ppos.begin(), ppos.end(), 0);
  std::vector<std::int32_t> const last{static_cast<std::int32_t>(tiny_context - 1)};
  sd::cuda_forward_result out;
  m.forward({.tokens = prompt, .positions = ppos, .logits_rows = last}, out);
  auto const step_of = [&](std::size_t n) {
    std::vector<sd::token_id> toks(n, 5);
    std::vector<sd::position_t> pos(n);
    std::iota(pos.begin(), pos.end(), static_cast<sd::position_t>(tiny_context));
    return [&m, &out, toks, pos] {
      m.forward({.tokens = toks, .positions = pos}, out);
      m.cache().truncate(tiny_context);
    };
  };
  auto const one = step_of(1);
  auto const five = step_of(5);
  one();
  five();
  SPECDEC_CUDA_CHECK(cudaStreamSynchronize(m.stream()));
  double t1 = 0.0, t5 = 0.0;
  std::size_t samples = 0;
  for (auto _ : state) {
    double const a = bench_cuda::time_launches(one, m.stream());
    double const b = bench_cuda::time_launches(five, m.stream());
    state.SetIterationTime(a);
    t1 += a;
    t5 += b;
    ++samples;
  }
  t1 /= static_cast<double>(samples);
  t5 /= static_cast<double>(samples);
  double const bandwidth = bench_cuda::read_bandwidth(m.step_bytes(), m.stream());
  double const floor = static_cast<double>(m.step_bytes()) / bandwidth;
  state.counters["ms"] = t1 * 1e3;
  state.counters["ms_5"] = t5 * 1e3;
  state.counters["step_GB"] = static_cast<double>(m.step_bytes()) * 1e-9;
  state.counters["read_GB/s"] = bandwidth * 1e-9;
  state.counters["x_bw"] = t1 / floor;
  state.counters["x_one"] = t5 / t1;
  state.counters["weight_GB/s"] = static_cast<double>(m.step_bytes()) / t1 * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("fixture/autoregressive", bench_autoregressive)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  for (std::size_t k : {3u, 4u})
    benchmark::RegisterBenchmark(("fixture/draft_k" + std::to_string(k)).c_str(),
                                 [k](benchmark::State& s) { bench_draft(s, k, true); })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("fixture/draft_k4_host_verify",
                               [](benchmark::State& s) { bench_draft(s, 4, false); })
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("fixture/prompt_lookup", bench_prompt_lookup)
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
  for (bool hydra : {false, true})
    benchmark::RegisterBenchmark(hydra ? "fixture/hydra" : "fixture/medusa",
                                 [hydra](benchmark::State& s) { bench_heads(s, hydra); })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  for (char const* kind : {"eagle1", "eagle3"})
    benchmark::RegisterBenchmark((std::string("fixture/") + kind).c_str(),
                                 [kind](benchmark::State& s) { bench_eagle(s, kind); })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  for (sd::weight_dtype t : {sd::weight_dtype::f32, sd::weight_dtype::f16, sd::weight_dtype::bf16})
    benchmark::RegisterBenchmark(("tinyllama/" + std::string(sd::to_string(t))).c_str(),
                                 [t](benchmark::State& s) { bench_tinyllama(s, t); })
        ->Iterations(5)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
