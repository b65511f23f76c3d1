// bench_constraint: output constraints (sampling/automaton_constraint.hpp, sampling/constraint.hpp,
// propose/constrained.hpp).
//
// Vocabularies of 32,000 and 128,000 tokens made here (seed 3): the 256 bytes, then words of 2 to
// 10 letters, half of them with a leading space, and punctuation runs, a shape like a BPE
// vocabulary's. The constraint: the JSON Schema of an object with a name (string, at most 16
// characters), an age (integer), an email (string with a pattern) and tags (an array of up to 4
// strings), spaced layout (sampling/json_schema.hpp).
//
// 0. BM_mask_lookup: a node's mask once its state's table is cached (32,000 tokens): the lookup
//    that hands the bitmask over (what xgrammar's published per-token mask times measure).
// 1. BM_mask_row/V: one node's mask once its state's table is cached: the table looked up and the
//    row's disallowed logits set to -inf (what `constrained::distribution` adds before the
//    policy), per row, at the states a random walk of the constraint visits. Yardstick in the
//    same run: copying the row (`vs_copy` = mask time / copy time).
// 2. BM_table_build/V: building one state's token table (the pruned walk of the token trie), per
//    state, over the states of a random walk, each built afresh. Yardstick in the same run: the
//    obvious build, every token's bytes run through the DFA (`vs_naive` = build / naive).
// 3. BM_json_task: the stories260K fixture (1 thread) answering the schema {"name": string of at
//    most 12, "age": integer, "pet": "cat"|"dog"|"bird"} after each of the 14 fixture prompts,
//    greedy, 64 tokens at most. `cost_ratio`: seconds per target forward of constrained
//    autoregressive decoding / unconstrained (one row per forward either way: what the constraint
//    adds to a step). Prompt lookup (k 4, 3 branches) under the constraint, with and without
//    forced spans: tokens per target forward of each (`tpf_lookup`, `tpf_forced`), their ratio
//    `forced_gain`, and `forced_speedup` = tokens per second with forced spans / without.
//    SPECDEC_JSON_TARGET=PATH runs it on another target of the fixture's function: the widened
//    fixture (docs/models.md, "Widened models"), whose forwards stream weights as a large model's
//    do.
//
// Run (Release): build/<dir>/benchmarks/bench_constraint
// Environment: SPECDEC_MODEL_DIR, SPECDEC_DATA_DIR (default ../shared/{models,data} next to the
// repository).

#include <benchmark/benchmark.h>

#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "e2e_support.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/load.hpp"
#include "specdec/propose/constrained.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/sampling/automaton_constraint.hpp"
#include "specdec/sampling/constraint.hpp"
#include "specdec/sampling/json_schema.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"

namespace sd = specdec;

namespace {

char const* const person_schema = R"json({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 16},
    "age": {"type": "integer"},
    "email": {"type": "string", "pattern": "[a-z]{1,12}@[a-z]{1,12}\\.(com|org)"
}
, "tags" : {
  "type" : "array", "items" : {"type" : "string", "maxLength" : 10}, "maxItems" : 4
}
}
, "required" : [ "name", "age" ]
})json";

std::shared_ptr<sd::token_vocabulary const> make_vocabulary(std::size_t size) {
  std::mt19937_64 rng(3);
  std::vector<std::string> bytes;
  bytes.emplace_back();  // an end token
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  std::string const punct = "{}[]\":,. !?'-_@0123456789";
  while (bytes.size() < size) {
    std::string t;
    if (rng() % 8 == 0) {
      for (std::size_t n = 2 + rng() % 3; n > 0; --n) t += punct[rng() % punct.size()];
    } else {
      if (rng() % 2 == 0) t += ' ';
      for (std::size_t n = 2 + rng() % 9; n > 0; --n)
        t += static_cast<char>('a' + static_cast<int>(rng() % 26));
    }
    bytes.push_back(std::move(t));
  }
  return std::make_shared<sd::token_vocabulary const>(std::move(bytes),
                                                      std::vector<sd::token_id>{0});
}

// The states of a random walk of `c` (random allowed tokens until the output is complete).
std::vector<sd::automaton_constraint::state_type> walk_states(sd::automaton_constraint const& c,
                                                              std::size_t count) {
  std::mt19937_64 rng(5);
  std::vector<sd::automaton_constraint::state_type> out;
  auto s = c.start();
  while (out.size() < count) {
    if (c.complete(s)) s = c.start();
    out.push_back(s);
    auto const& mask = c.allowed(s);
    std::vector<sd::token_id> allowed;
    for (std::size_t w = 0; w < mask.size(); ++w)
      for (std::uint64_t bits = mask[w]; bits != 0; bits &= bits - 1)
        allowed.push_back(
            static_cast<sd::token_id>(w * 64 + static_cast<std::size_t>(std::countr_zero(bits))));
    sd::token_id t = allowed[rng() % allowed.size()];
    if (c.vocabulary().is_end(t)) {
      s = c.start();
      continue;
    }
    (void)c.advance(s, t);
  }
  return out;
}

void BM_mask_row(benchmark::State& state) {
  auto const vocab_size = static_cast<std::size_t>(state.range(0));
  auto const vocab = make_vocabulary(vocab_size);
  auto const c = sd::json_schema_constraint(person_schema, vocab);
  auto const states = walk_states(*c, 64);
  for (auto s : states) (void)c->table(s);  // cached
  std::vector<float> logits(vocab_size), out(vocab_size);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& x : logits) x = normal(rng);
  std::size_t i = 0;
  for (auto _ : state) {
    std::span<std::uint64_t const> const mask = c->allowed(states[i++ % states.size()]);
    sd::detail::apply_token_mask(logits, mask, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  // The yardstick: a copy of the row.
  auto const start = std::chrono::steady_clock::now();
  std::size_t const copies = 20000;
  for (std::size_t k = 0; k < copies; ++k) {
    std::memcpy(out.data(), logits.data(), vocab_size * sizeof(float));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  double const copy_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
      static_cast<double>(copies);
  state.counters["copy_ns"] = copy_ns;
  state.counters["vs_copy"] =
      benchmark::Counter(copy_ns * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  // Read as (mask time per row) / (copy time per row): kIsRate divides by the run's time and
  // kInvert turns it over.
}

void BM_table_build(benchmark::State& state) {
  auto const vocab_size = static_cast<std::size_t>(state.range(0));
  auto const vocab = make_vocabulary(vocab_size);
  sd::byte_dfa const dfa = sd::compile_json_schema(std::string(person_schema));
  auto const probe = std::make_shared<sd::automaton_constraint const>(sd::byte_dfa(dfa), vocab);
  auto const states = walk_states(*probe, 16);
  double naive_seconds = 0.0;
  std::size_t built = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto const c = std::make_shared<sd::automaton_constraint const>(sd::byte_dfa(dfa), vocab);
    state.ResumeTiming();
    for (auto s : states) benchmark::DoNotOptimize(c->table(s).count);
    built += states.size();
    state.PauseTiming();
    // The obvious build of the same tables: every token's bytes through the DFA.
    auto const start = std::chrono::steady_clock::now();
    for (auto s : states) {
      std::size_t count = 0;
      for (std::size_t t = 0; t < vocab->size(); ++t) {
        std::string_view const b = vocab->bytes(static_cast<sd::token_id>(t));
        if (b.empty()) continue;
        count += dfa.run(s, b) >= 0 ? 1 : 0;
      }
      benchmark::DoNotOptimize(count);
    }
    naive_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(built));
  state.counters["naive_us_per_state"] = naive_seconds * 1e6 / static_cast<double>(built);
}

void BM_json_task(benchmark::State& state) {
  // SPECDEC_JSON_TARGET: another target with the fixture's function (the widened fixture of
  // specdec-widen, where forwards stream weights), else stories260K itself.
  std::shared_ptr<sd::llama_weights const> weights = bench::stories260k();
  if (char const* path = std::getenv("SPECDEC_JSON_TARGET"); path != nullptr && *path != '\0') {
    weights = std::make_shared<sd::llama_weights const>(sd::load_model(path));
    state.SetLabel(path);
  }
  auto const& tok = bench::tok512();
  auto const vocab = std::make_shared<sd::token_vocabulary const>(sd::token_vocabulary::of(tok));
  auto const c = sd::json_schema_constraint(
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
          "age": {"type": "integer"}, "pet": {"enum": ["cat", "dog", "bird"]}},
          "required": ["name", "age", "pet"]})",
      vocab);
  using policy = sd::constrained<sd::sampler, sd::automaton_constraint>;
  sd::sampling_params greedy_params;
  greedy_params.temperature = 0.0f;
  sd::cpu_llama target(weights, {.threads = 1});
  sd::decode_config config;
  config.max_new_tokens = 64;
  config.eos_tokens = tok.end_of_text();
  auto const encoder = [&tok](std::string_view t) { return tok.encode(t, false, false); };
  struct totals {
    std::size_t tokens = 0, forwards = 0;
    double seconds = 0.0;
    void add(sd::decode_result const& r) {
      tokens += r.tokens.size();
      forwards += r.stats.steps;
      seconds += r.stats.total_seconds - r.stats.prefill_seconds;
    }
    [[nodiscard]] double per_forward() const { return seconds / static_cast<double>(forwards); }
    [[nodiscard]] double tokens_per_forward() const {
      return static_cast<double>(tokens) / static_cast<double>(forwards);
    }
  };
  auto const autoregressive = [&](std::shared_ptr<sd::automaton_constraint const> constraint,
                                  totals& t) {
    sd::autoregressive_decoder dec(target, policy(sd::sampler(greedy_params), constraint), config);
    for (auto const& prompt : bench::fixture_prompts()) t.add(dec.generate(prompt));
  };
  auto const lookup = [&](bool forced, totals& t) {
    sd::prompt_lookup_proposer inner({.k = 4, .max_branches = 3});
    sd::constrained_proposer<sd::prompt_lookup_proposer&, sd::automaton_constraint> p(
        inner, c, encoder, {.forced_spans = forced});
    sd::speculative_decoder dec(target, p, sd::greedy_verifier{},
                                policy(sd::sampler(greedy_params), c), config);
    for (auto const& prompt : bench::fixture_prompts()) t.add(dec.generate(prompt));
  };
  totals plain, constrained, unforced, forced;
  for (auto _ : state) {
    autoregressive(nullptr, plain);
    autoregressive(c, constrained);
    lookup(false, unforced);
    lookup(true, forced);
  }
  state.counters["cost_ratio"] = constrained.per_forward() / plain.per_forward();
  state.counters["tpf_lookup"] = unforced.tokens_per_forward();
  state.counters["tpf_forced"] = forced.tokens_per_forward();
  state.counters["forced_gain"] = forced.tokens_per_forward() / unforced.tokens_per_forward();
  state.counters["forced_speedup"] = (static_cast<double>(forced.tokens) / forced.seconds) /
                                     (static_cast<double>(unforced.tokens) / unforced.seconds);
}

void BM_mask_lookup(benchmark::State& state) {
  auto const vocab = make_vocabulary(32000);
  auto const c = sd::json_schema_constraint(person_schema, vocab);
  auto const states = walk_states(*c, 64);
  for (auto s : states) (void)c->table(s);
  std::size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(c->allowed(states[i++ % states.size()]).data());
}

}  // namespace

BENCHMARK(BM_mask_lookup);
BENCHMARK(BM_mask_row)->Arg(32000)->Arg(128000)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_table_build)->Arg(32000)->Arg(128000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_json_task)->Unit(benchmark::kMillisecond)->Iterations(3);

BENCHMARK_MAIN();
