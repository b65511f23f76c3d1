// bench_batch: batched speculative decoding for serving on the CPU (batch_decoder over
// cpu_batched_llama): committed tokens per second of a batch of B concurrent requests, B = 1, 4,
// 8, 16, 32, without speculation (k = 0), with a fixed draft length k = 1..6, and with the
// adaptive policy (adaptive_speculation, at most 6), every figure against the others measured in
// the same run.
//
// 1. Controlled acceptance ("controlled/batch:B"): a random-weight target of the stories110M shape
//    (bench_e2e's: dim 768, hidden 2048, 12 layers, vocabulary 32000) and bench_e2e's oracle
//    proposer, which drafts each request's own greedy continuation with each drafted token
//    corrupted with probability 1 - a (a = 0.8), so each draft token is accepted with probability
//    a given its predecessors were; greedy. Prompts: 24 random tokens per request (seeded by the
//    request's index, so request i is the same at every batch size). The continuations come from
//    a first run without speculation at the largest batch; every speculative run's output is
//    checked against them. For each B, the 8 policies run in lockstep (all admitted, then one
//    step of each in turn; each round starting one policy later), so that the swings of a shared
//    machine's memory bandwidth fall on every policy alike; SPECDEC_BENCH_REPS x ceil(8 / B)
//    rounds (a small batch's runs are short: more of them); the table shows the median tokens/s
//    of each.
// 2. The stories260K fixture ("fixture/batch:B"): the 14 prompts of tinystories_prompts.jsonl
//    (cycled beyond 14), 128 new tokens each, greedy, prompt lookup (chain, at most 6 tokens) per
//    request, 1 thread, the same policies.
// Tokens/s = tokens committed by all requests / the wall time of the batch decoder's steps
// (prefill included: a request's prompt rides in its first step). The adaptive policy measures
// the model's forward times once (forward_cost_model::calibrate) before the runs, and refines
// them online in each run.
//
// After the benchmarks a summary table per part prints the tokens/s and the ratios, then the
// bars: batch 8 without speculation >= 4x batch 1; speculation's gain at batch 1 with k = 4 >= 2x
// (controlled); at batch 32 the adaptive policy >= 0.95x no speculation; at every batch size the
// adaptive policy >= 0.9x the best fixed k (k = 0 included).
//
// Environment: SPECDEC_MODEL_DIR, SPECDEC_DATA_DIR, SPECDEC_BENCH_THREADS (threads of the
// stories110M-shape model; default all cores), SPECDEC_BENCH_TOKENS (new tokens per controlled
// request; default 64), SPECDEC_BENCH_REPS (rounds at batch 8 and above; default 3).
//
// Run (Release): build/<dir>/benchmarks/bench_batch [--benchmark_filter=controlled|fixture]

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "e2e_support.hpp"
#include "jsonl.hpp"
#include "specdec/backend/cpu/batched_llama.hpp"
#include "specdec/decode/batch_decoder.hpp"
#include "specdec/decode/speculation.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/per_request.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"

namespace sd = specdec;

namespace {

constexpr std::size_t batch_sizes[] = {1, 4, 8, 16, 32};
constexpr std::size_t max_k = 6;  // the largest fixed k, and the adaptive policy's cap
constexpr double controlled_acceptance = 0.8;
constexpr std::size_t fixture_tokens = 128;
constexpr std::size_t policies = max_k + 2;  // k = 0..max_k, then adaptive

std::string policy_name(std::size_t p) {
  return p <= max_k ? "k=" + std::to_string(p) : "adaptive";
}

//! SPECDEC_BENCH_REPS (default 3).
std::size_t bench_reps() {
  return bench::env_count("SPECDEC_BENCH_REPS", 3);
}
//! Rounds at batch B: SPECDEC_BENCH_REPS x ceil(8 / B) (see the file comment).
std::size_t rounds_at(std::size_t batch) {
  return bench_reps() * ((8 + batch - 1) / batch);
}

//! What one batched run measured.
struct run_result {
  double tokens_per_second = 0.0;
  double decode_tokens_per_second = 0.0;  //!< the steps without prompt rows alone
  double mean_draft = 0.0;                //!< draft tokens per request and step
  double accepted_length = 0.0;
  bool matched = true;  //!< every output equals its expected continuation
};

//! A policy's runs at one batch size.
struct cell {
  std::vector<double> rates;         //!< tokens/s of each round
  std::vector<double> decode_rates;  //!< tokens/s of each round's decode phase (no prompt rows)
  double mean_draft = 0.0, accepted_length = 0.0;
  [[nodiscard]] double rate() const { return rates.empty() ? 0.0 : bench::median(rates); }
  [[nodiscard]] double decode_rate() const {
    return decode_rates.empty() ? 0.0 : bench::median(decode_rates);
  }
};

//! One batch size's row of a part's table.
struct row {
  std::size_t batch = 0;
  cell cells[policies];
};

struct part {
  std::string title;
  std::vector<row> rows;
  std::size_t rounds = 0;
};
part controlled_part, fixture_part;

//! One policy's batched run over a model, driven a step at a time (see `run_rounds`).
class stepped_run {
 public:
  virtual ~stepped_run() = default;
  //! One batched step; returns the requests still waiting or running.
  virtual std::size_t step() = 0;
  //! What the finished run measured.
  virtual run_result result() = 0;
};

//! `prompts` as concurrent requests (all submitted at once, `new_tokens` each, greedy) with the
//! proposer `make()` returns and speculation `spec`; when `expected` is given, `result` checks
//! each output against it.
template <class Proposer, class Spec>
class batch_run final : public stepped_run {
 public:
  template <class Make>
  batch_run(sd::cpu_batched_llama& model, Make&& make, Spec spec,
            std::vector<std::vector<sd::token_id>> const& prompts, std::size_t new_tokens,
            std::vector<std::vector<sd::token_id>> const* expected)
      : proposer_(make()), decoder_(model, proposer_, {}, std::move(spec)), expected_(expected) {
    sd::decode_config config;
    config.max_new_tokens = new_tokens;
    config.max_draft_nodes = max_k;
    for (auto const& p : prompts) ids_.push_back(decoder_.submit(p, sd::greedy{}, config));
  }

  std::size_t step() override { return decoder_.step(); }

  run_result result() override {
    run_result out;
    sd::batch_stats const& s = decoder_.stats();
    out.tokens_per_second = s.tokens_per_second();
    out.decode_tokens_per_second = s.decode_tokens_per_second();
    out.mean_draft = s.request_steps == 0
                         ? 0.0
                         : static_cast<double>(s.drafted) / static_cast<double>(s.request_steps);
    out.accepted_length = s.mean_accepted_length();
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      auto const r = decoder_.take(ids_[i]);
      if (!r || r->failed() || (expected_ != nullptr && r->result.tokens != (*expected_)[i]))
        out.matched = false;
    }
    return out;
  }

 private:
  Proposer proposer_;  // before decoder_, which refers to it
  sd::batch_decoder<sd::cpu_batched_llama, Proposer, sd::greedy_verifier, sd::greedy, Spec>
      decoder_;
  std::vector<std::vector<sd::token_id>> const* expected_;
  std::vector<std::uint64_t> ids_;
};

//! Policy p's run (fixed k = p up to max_k, then the adaptive policy `adaptive`) with the proposer
//! `make()` returns.
template <class Make>
std::unique_ptr<stepped_run> make_run(std::size_t p, sd::cpu_batched_llama& model, Make&& make,
                                      sd::adaptive_speculation const& adaptive,
                                      std::vector<std::vector<sd::token_id>> const& prompts,
                                      std::size_t new_tokens,
                                      std::vector<std::vector<sd::token_id>> const* expected) {
  using proposer = decltype(make());
  if (p <= max_k)
    return std::make_unique<batch_run<proposer, sd::fixed_speculation>>(
        model, make, sd::fixed_speculation(p), prompts, new_tokens, expected);
  return std::make_unique<batch_run<proposer, sd::adaptive_speculation>>(
      model, make, adaptive, prompts, new_tokens, expected);
}

//! `reps` rounds of every policy p (`make(p)`, a stepped_run) into `r`'s cells. A round runs the
//! policies in lockstep -- all of them admitted, then one step of each in turn until every one
//! has finished -- so that every policy meets the same swings of the machine's speed (a VM whose
//! memory bandwidth moves by 20% within seconds would otherwise favour whichever policy ran in a
//! fast moment); round i steps them starting at policy i mod policies. Each run's tokens/s counts
//! its own steps' time only. Returns whether every run matched.
template <class Make>
bool run_rounds(row& r, std::size_t reps, Make&& make) {
  bool matched = true;
  for (std::size_t round = 0; round < reps; ++round) {
    std::vector<std::unique_ptr<stepped_run>> runs(policies);
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < policies; ++i) order.push_back((round + i) % policies);
    for (std::size_t p : order) runs[p] = make(p);
    for (bool busy = true; busy;) {
      busy = false;
      for (std::size_t p : order) {
        if (runs[p] == nullptr) continue;
        if (runs[p]->step() > 0) {
          busy = true;
          continue;
        }
        run_result const got = runs[p]->result();
        runs[p].reset();  // its slots back to the model
        matched = matched && got.matched;
        r.cells[p].rates.push_back(got.tokens_per_second);
        r.cells[p].decode_rates.push_back(got.decode_tokens_per_second);
        r.cells[p].mean_draft = got.mean_draft;
        r.cells[p].accepted_length = got.accepted_length;
      }
    }
  }
  return matched;
}

//! Drafts nothing (the continuations' run).
struct no_draft {
  void begin(std::span<sd::token_id const>) {}
  void propose(sd::propose_context const& ctx, sd::draft_tree& tree) {
    tree.reset(ctx.tokens.back());
  }
  void accept(sd::verify_result const&) {}
};

// ---------------------------------------------------------------------------------------------
// 1. Controlled acceptance at the stories110M shape.

struct controlled_setup {
  std::unique_ptr<sd::cpu_batched_llama> model;
  std::vector<std::vector<sd::token_id>> prompts;       // [32]
  std::vector<std::vector<sd::token_id>> continuation;  // [32] greedy, new tokens only
  std::optional<sd::adaptive_speculation> adaptive;     // calibrated
  std::size_t new_tokens = 0;

  static controlled_setup& get() {
    static controlled_setup s = [] {
      controlled_setup x;
      x.new_tokens = bench::env_count("SPECDEC_BENCH_TOKENS", 64);
      std::size_t const most = batch_sizes[std::size(batch_sizes) - 1];
      x.model = std::make_unique<sd::cpu_batched_llama>(
          bench::stories110m(),
          sd::cpu_batched_llama_options{.model = {.threads = bench::bench_threads()},
                                        .max_slots = policies * most});
      std::size_t const vocab = x.model->vocab_size();
      for (std::size_t i = 0; i < most; ++i) {
        std::mt19937_64 rng(1000 + i);
        std::vector<sd::token_id> p(24);
        p[0] = 1;
        for (std::size_t j = 1; j < p.size(); ++j) p[j] = static_cast<sd::token_id>(rng() % vocab);
        x.prompts.push_back(std::move(p));
      }
      // The greedy continuations (and a warm-up of every slot).
      sd::per_request_proposer<no_draft> none([] { return no_draft{}; });
      sd::batch_decoder<sd::cpu_batched_llama, sd::per_request_proposer<no_draft>,
                        sd::greedy_verifier, sd::greedy>
          decoder(*x.model, none, {}, sd::fixed_speculation(0));
      sd::decode_config config;
      config.max_new_tokens = x.new_tokens;
      std::vector<std::uint64_t> ids;
      for (auto const& p : x.prompts) ids.push_back(decoder.submit(p, sd::greedy{}, config));
      decoder.run();
      for (std::uint64_t id : ids) x.continuation.push_back(decoder.take(id)->result.tokens);
      x.adaptive.emplace(sd::adaptive_speculation_options{.max_k = max_k});
      x.adaptive->calibrate(*x.model);
      return x;
    }();
    return s;
  }
};

//! The oracle of each request: its continuation, its own seed.
sd::per_request_proposer<bench::oracle_proposer> oracles(controlled_setup const& s,
                                                         std::size_t batch) {
  return sd::per_request_proposer<bench::oracle_proposer>(
      [&s, batch](std::span<sd::token_id const> prompt) {
        std::size_t const vocab = s.model->vocab_size();
        for (std::size_t i = 0; i < batch; ++i) {
          if (std::equal(prompt.begin(), prompt.end(), s.prompts[i].begin(), s.prompts[i].end())) {
            std::vector<sd::token_id> seq = s.prompts[i];
            seq.insert(seq.end(), s.continuation[i].begin(), s.continuation[i].end());
            return bench::oracle_proposer(std::move(seq), max_k, controlled_acceptance, vocab,
                                          2024 + i);
          }
        }
        return bench::oracle_proposer({}, max_k, controlled_acceptance, vocab, 0);
      });
}

void bench_controlled(benchmark::State& state, std::size_t batch) {
  controlled_setup& s = controlled_setup::get();
  std::size_t const reps = rounds_at(batch);
  std::vector<std::vector<sd::token_id>> const prompts(
      s.prompts.begin(), s.prompts.begin() + static_cast<long>(batch));
  std::vector<std::vector<sd::token_id>> const expected(
      s.continuation.begin(), s.continuation.begin() + static_cast<long>(batch));
  row r;
  r.batch = batch;
  for (auto _ : state) {
    bool const matched = run_rounds(r, reps, [&](std::size_t p) {
      return make_run(
          p, *s.model, [&] { return oracles(s, batch); }, *s.adaptive, prompts, s.new_tokens,
          &expected);
    });
    if (!matched) state.SkipWithError("an output differs from the greedy continuation");
  }
  for (std::size_t p = 0; p < policies; ++p)
    state.counters["tok_s_" + policy_name(p)] = r.cells[p].rate();
  controlled_part.rows.push_back(std::move(r));
  controlled_part.rounds = bench_reps();
}

// ---------------------------------------------------------------------------------------------
// 2. The fixture.

struct fixture_setup {
  std::unique_ptr<sd::cpu_batched_llama> model;
  std::vector<std::vector<sd::token_id>> prompts;  // the 14 encoded prompts
  std::optional<sd::adaptive_speculation> adaptive;

  static fixture_setup& get() {
    static fixture_setup s = [] {
      fixture_setup x;
      auto const& weights = bench::stories260k();
      x.prompts = bench::fixture_prompts();
      x.model = std::make_unique<sd::cpu_batched_llama>(
          weights, sd::cpu_batched_llama_options{
                       .model = {.threads = 1},
                       .max_slots = policies * batch_sizes[std::size(batch_sizes) - 1]});
      x.adaptive.emplace(sd::adaptive_speculation_options{.max_k = max_k});
      x.adaptive->calibrate(*x.model);
      return x;
    }();
    return s;
  }
};

void bench_fixture(benchmark::State& state, std::size_t batch) {
  fixture_setup& s = fixture_setup::get();
  std::size_t const reps = rounds_at(batch);
  std::vector<std::vector<sd::token_id>> prompts;
  for (std::size_t i = 0; i < batch; ++i) prompts.push_back(s.prompts[i % s.prompts.size()]);
  using lookups = sd::per_request_proposer<sd::prompt_lookup_chain_proposer>;
  auto const make = [] {
    return sd::prompt_lookup_chain_proposer({.n_max = 3, .n_min = 1, .k = max_k});
  };
  row r;
  r.batch = batch;
  for (auto _ : state) {
    bool const matched = run_rounds(r, reps, [&](std::size_t p) {
      return make_run(
          p, *s.model, [&] { return lookups(make); }, *s.adaptive, prompts, fixture_tokens,
          nullptr);
    });
    if (!matched) state.SkipWithError("a request failed");
  }
  for (std::size_t p = 0; p < policies; ++p)
    state.counters["tok_s_" + policy_name(p)] = r.cells[p].rate();
  fixture_part.rows.push_back(std::move(r));
  fixture_part.rounds = bench_reps();
}

// ---------------------------------------------------------------------------------------------
// The summary.

char const* verdict(bool ok) {
  return ok ? "ok" : "MISSED";
}

//! The table of one part; for the controlled part, the bars' lines.
void print_part(part const& pt, bool controlled) {
  if (pt.rows.empty()) return;
  std::printf("\n%s\n\n", pt.title.c_str());
  std::printf("%6s", "batch");
  for (std::size_t p = 0; p < policies; ++p) std::printf(" %9s", policy_name(p).c_str());
  std::printf(" %7s %7s %8s %8s %9s %9s %10s\n", "adapt k", "acc.len", "vs b=1", "dec b=1",
              "k=4 gain", "adapt/k0", "adapt/best");
  double const base1 = pt.rows.front().batch == 1 ? pt.rows.front().cells[0].rate() : 0.0;
  double const decode1 = pt.rows.front().batch == 1 ? pt.rows.front().cells[0].decode_rate() : 0.0;
  double worst_vs_best = 1e9;
  std::size_t worst_batch = 0;
  for (row const& r : pt.rows) {
    std::printf("%6zu", r.batch);
    double best = 0.0;
    for (std::size_t p = 0; p < policies; ++p) {
      std::printf(" %9.1f", r.cells[p].rate());
      if (p <= max_k) best = std::max(best, r.cells[p].rate());
    }
    double const adaptive = r.cells[max_k + 1].rate();
    double const vs_best = best > 0 ? adaptive / best : 0.0;
    if (vs_best < worst_vs_best) {
      worst_vs_best = vs_best;
      worst_batch = r.batch;
    }
    std::printf(" %7.2f %7.2f %7.2fx %7.2fx %8.2fx %8.2fx %9.2fx\n", r.cells[max_k + 1].mean_draft,
                r.cells[max_k + 1].accepted_length, base1 > 0 ? r.cells[0].rate() / base1 : 0.0,
                decode1 > 0 ? r.cells[0].decode_rate() / decode1 : 0.0,
                r.cells[0].rate() > 0 ? r.cells[4].rate() / r.cells[0].rate() : 0.0,
                r.cells[0].rate() > 0 ? adaptive / r.cells[0].rate() : 0.0, vs_best);
  }
  std::printf("\n");
  if (!controlled) return;  // the bars are set at the stories110M shape
  auto const find = [&](std::size_t b) -> row const* {
    for (row const& r : pt.rows)
      if (r.batch == b) return &r;
    return nullptr;
  };
  row const* b1 = find(1);
  row const* b8 = find(8);
  row const* b32 = find(32);
  if (b1 != nullptr && b8 != nullptr) {
    double const x = b8->cells[0].rate() / b1->cells[0].rate();
    std::printf("bar: batch 8 without speculation >= 4x the tokens/s of batch 1: %.2fx %s\n", x,
                verdict(x >= 4.0));
    double const y = b8->cells[0].decode_rate() / b1->cells[0].decode_rate();
    std::printf(
        "     the same over the decode phase (steps without prompt rows; a prompt's rows cost "
        "the same at any batch): %.2fx %s\n",
        y, verdict(y >= 4.0));
  }
  if (b1 != nullptr) {
    double const x = b1->cells[4].rate() / b1->cells[0].rate();
    std::printf("bar: speculation's gain at batch 1, k = 4, acceptance 0.8 >= 2x: %.2fx %s\n", x,
                verdict(x >= 2.0));
  }
  if (b32 != nullptr) {
    double const x = b32->cells[max_k + 1].rate() / b32->cells[0].rate();
    std::printf("bar: batch 32, adaptive >= 0.95x no speculation: %.3fx %s\n", x,
                verdict(x >= 0.95));
  }
  if (worst_batch != 0)
    std::printf(
        "bar: adaptive >= 0.9x the best fixed k (k = 0..%zu) at every batch size: worst "
        "%.3fx (batch %zu) %s\n",
        max_k, worst_vs_best, worst_batch, verdict(worst_vs_best >= 0.9));
}

void print_summary() {
  if (!controlled_part.rows.empty()) {
    controlled_setup const& s = controlled_setup::get();
    char buf[768];
    std::snprintf(buf, sizeof buf,
                  "controlled acceptance: random-weight stories110M shape (dim 768, 12 layers, "
                  "vocab 32000), %zu threads, greedy,\noracle drafts accepted with probability "
                  "%.1f per token; B requests of 24 prompt + %zu new tokens each, all at once.\n"
                  "Committed tokens/s (median of %zu x ceil(8 / B) rounds, policies in lockstep); "
                  "adapt k = the adaptive policy's mean draft per request and step;\nvs b=1 = "
                  "k=0 tokens/s over "
                  "batch 1's; dec b=1 = the same over the decode phase (steps without prompt "
                  "rows); k=4 gain = k=4 over k=0; adapt/best = adaptive over the best fixed "
                  "k (k=0 included).",
                  bench::bench_threads(), controlled_acceptance, s.new_tokens,
                  controlled_part.rounds);
    controlled_part.title = buf;
    print_part(controlled_part, true);
  }
  if (!fixture_part.rows.empty()) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "stories260K fixture: the 14 TinyStories prompts cycled to B requests, %zu new "
                  "tokens each, greedy, prompt lookup chain (n 1..3) per request,\n1 thread. "
                  "Committed tokens/s (median of %zu x ceil(8 / B) rounds); columns as above.",
                  fixture_tokens, fixture_part.rounds);
    fixture_part.title = buf;
    print_part(fixture_part, false);
  }
}

}  // namespace

int main(int argc, char** argv) {
  for (std::size_t b : batch_sizes)
    benchmark::RegisterBenchmark(("controlled/batch:" + std::to_string(b)).c_str(),
                                 [b](benchmark::State& s) { bench_controlled(s, b); })
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  for (std::size_t b : batch_sizes)
    benchmark::RegisterBenchmark(("fixture/batch:" + std::to_string(b)).c_str(),
                                 [b](benchmark::State& s) { bench_fixture(s, b); })
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary();
  return 0;
}
