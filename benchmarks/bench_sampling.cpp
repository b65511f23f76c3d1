// Sampling from logits with each sampler policy, and softmax, at real vocabulary sizes (32000:
// Llama 2; 128256: Llama 3; 151936: Qwen 2) on peaked and flat rows, one row at a time and in
// batches of 32 rows.
//
// Rows: "peaked" is N(0, 3) plus five spikes at 16..20 (the top token holds most of the mass, as
// in a confident language model); "flat" is N(0, 1) (top-p 0.9 keeps most of the vocabulary: the
// worst case for truncation).
//
// Every benchmark times its subject and, interleaved in the same loop on the same rows, two
// yardsticks: memcpy of the row bytes and one softmax of the row. Counters:
//   ns_per_row  subject time per row
//   GBps        logits bytes read per second by the subject
//   x_softmax   subject time / softmax time (the bar for top-p: <= 4)
//   x_memcpy    subject time / memcpy time
//   ref_speedup reference time / subject time (the double, full-sort reference of
//               reference/sampling.hpp; single rows only, measured once per benchmark)

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "specdec/reference/sampling.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/sampling/softmax.hpp"

namespace sd = specdec;

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

enum class kind { peaked, flat };

std::vector<float> make_rows(kind k, std::size_t vocab, std::size_t rows, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<std::size_t> pick(0, vocab - 1);
  std::vector<float> out(vocab * rows);
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = out.data() + r * vocab;
    for (std::size_t i = 0; i < vocab; ++i)
      row[i] = (k == kind::peaked ? 3.0f : 1.0f) * normal(gen);
    if (k == kind::peaked)
      for (int s = 0; s < 5; ++s) row[pick(gen)] = 16.0f + static_cast<float>(s);
  }
  return out;
}

struct policy {
  char const* name;
  sd::sampling_params params;
};

std::vector<policy> policies(std::size_t vocab) {
  std::vector<policy> out;
  sd::sampling_params p;
  p.temperature = 0.8f;
  out.push_back({"temperature", p});
  p = {};
  p.top_k = 50;
  out.push_back({"top_k_50", p});
  p = {};
  p.top_p = 0.9f;
  out.push_back({"top_p_0.9", p});
  p = {};
  p.min_p = 0.05f;
  out.push_back({"min_p_0.05", p});
  p = {};
  p.repetition_penalty = 1.1f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.5f;
  out.push_back({"penalties_512", p});
  p.temperature = 0.8f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  for (std::int32_t t = 0; t < 10; ++t)
    p.logit_bias.emplace_back(
        static_cast<sd::token_id>((static_cast<std::size_t>(t) * 7919u) % vocab), 0.5f);
  out.push_back({"combined", p});
  p = {};
  p.temperature = 0.0f;
  out.push_back({"greedy", p});
  return out;
}

std::vector<sd::token_id> make_history(std::size_t vocab) {
  std::mt19937_64 gen(77);
  std::uniform_int_distribution<sd::token_id> tok(0, static_cast<sd::token_id>(vocab) - 1);
  std::vector<sd::token_id> h(512);
  for (auto& t : h) t = tok(gen);
  return h;
}

// Subject: `subject(row_index)` processes one row; yardsticks run on the same row right after.
template <class Subject>
void run_interleaved(benchmark::State& state, std::vector<float> const& rows, std::size_t vocab,
                     std::size_t batch, Subject&& subject) {
  std::vector<float> scratch(vocab);
  std::vector<float> copy(vocab * batch);
  double subject_s = 0.0, softmax_s = 0.0, memcpy_s = 0.0;
  std::size_t done = 0;
  for (auto _ : state) {
    auto t0 = clock_type::now();
    for (std::size_t r = 0; r < batch; ++r) subject(r);
    double const dt = seconds_since(t0);
    state.SetIterationTime(dt);
    subject_s += dt;

    t0 = clock_type::now();
    for (std::size_t r = 0; r < batch; ++r)
      sd::softmax(std::span<float const>(rows.data() + r * vocab, vocab), scratch);
    benchmark::DoNotOptimize(scratch.data());
    softmax_s += seconds_since(t0);

    t0 = clock_type::now();
    std::memcpy(copy.data(), rows.data(), batch * vocab * sizeof(float));
    benchmark::DoNotOptimize(copy.data());
    benchmark::ClobberMemory();
    memcpy_s += seconds_since(t0);
    done += batch;
  }
  double const per_row = subject_s / static_cast<double>(done);
  state.counters["ns_per_row"] = per_row * 1e9;
  state.counters["GBps"] = static_cast<double>(vocab * sizeof(float)) / per_row * 1e-9;
  state.counters["x_softmax"] = subject_s / softmax_s;
  state.counters["x_memcpy"] = subject_s / memcpy_s;
}

void bench_policy(benchmark::State& state, kind k, std::size_t vocab, std::size_t batch,
                  policy const& pol) {
  std::vector<float> const rows = make_rows(k, vocab, batch, 1000 + vocab);
  std::vector<sd::token_id> const history = make_history(vocab);
  sd::sampler const s(pol.params);
  std::vector<float> probs(vocab);
  sd::philox rng(42);
  sd::token_id sink = 0;
  auto const subject = [&](std::size_t r) {
    std::span<float const> const row(rows.data() + r * vocab, vocab);
    if (s.is_greedy()) {
      sink ^= s.greedy_token(row, history);
    } else {
      s.distribution(row, history, probs);
      sink ^= s.sample(probs, rng);
    }
  };
  run_interleaved(state, rows, vocab, batch, subject);
  benchmark::DoNotOptimize(sink);
  if (batch == 1) {
    // The reference on the same row: best of three calls.
    double best = 1e300;
    for (int rep = 0; rep < 3; ++rep) {
      auto const t0 = clock_type::now();
      std::vector<double> const q = sd::reference_distribution(
          pol.params, std::span<float const>(rows.data(), vocab), history);
      benchmark::DoNotOptimize(sd::reference_sample(q, 0.5));
      best = std::min(best, seconds_since(t0));
    }
    state.counters["ref_speedup"] = best / (state.counters["ns_per_row"].value * 1e-9);
  }
}

void bench_softmax(benchmark::State& state, kind k, std::size_t vocab, std::size_t batch) {
  std::vector<float> const rows = make_rows(k, vocab, batch, 1000 + vocab);
  std::vector<float> probs(vocab);
  run_interleaved(state, rows, vocab, batch, [&](std::size_t r) {
    sd::softmax(std::span<float const>(rows.data() + r * vocab, vocab), probs);
    benchmark::DoNotOptimize(probs.data());
  });
  if (batch == 1) {
    double best = 1e300;
    for (int rep = 0; rep < 3; ++rep) {
      auto const t0 = clock_type::now();
      benchmark::DoNotOptimize(sd::reference_softmax(std::span<float const>(rows.data(), vocab)));
      best = std::min(best, seconds_since(t0));
    }
    state.counters["ref_speedup"] = best / (state.counters["ns_per_row"].value * 1e-9);
  }
}

void bench_sample_from(benchmark::State& state, kind k, std::size_t vocab, std::size_t batch) {
  std::vector<float> rows = make_rows(k, vocab, batch, 1000 + vocab);
  for (std::size_t r = 0; r < batch; ++r) {
    std::span<float> const row(rows.data() + r * vocab, vocab);
    sd::softmax(row, row);
  }
  sd::philox rng(3);
  sd::token_id sink = 0;
  run_interleaved(state, rows, vocab, batch, [&](std::size_t r) {
    sink ^= sd::sample_from(std::span<float const>(rows.data() + r * vocab, vocab), rng.uniform());
  });
  benchmark::DoNotOptimize(sink);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (std::size_t vocab : {32000u, 128256u, 151936u}) {
    for (kind k : {kind::peaked, kind::flat}) {
      for (std::size_t batch : {1u, 32u}) {
        std::string const suffix = std::string(k == kind::peaked ? "peaked" : "flat") + "/V" +
                                   std::to_string(vocab) + "/batch" + std::to_string(batch);
        benchmark::RegisterBenchmark(("softmax/" + suffix).c_str(), bench_softmax, k, vocab, batch)
            ->UseManualTime();
        benchmark::RegisterBenchmark(("sample_from/" + suffix).c_str(), bench_sample_from, k, vocab,
                                     batch)
            ->UseManualTime();
        for (policy const& pol : policies(vocab)) {
          benchmark::RegisterBenchmark(("sample/" + std::string(pol.name) + "/" + suffix).c_str(),
                                       bench_policy, k, vocab, batch, pol)
              ->UseManualTime();
        }
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
