// CUDA sampling from logits (temperature only, top-k 50, top-p 0.9) on peaked and flat rows at
// batch 1, 16 and 64, vocab 32000 and 128256, against the bandwidth floor measured in the same
// run (a device-to-device copy of the logits rows), and the plain softmax. launch_sample runs the
// pivot kernel (distribution and draw in one launch); BM_sample_radix runs the earlier pipeline
// (the radix-selection distribution, then the walk's draw) on the same rows, for comparison.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/bench_common.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/backend/cuda/sampling.cuh"
#include "specdec/backend/cuda/softmax.cuh"

namespace {

namespace sc = specdec::cuda;

enum policy_kind : std::int64_t { temperature = 0, top_k = 1, top_p = 2, combined = 3 };

void BM_sample(benchmark::State& state) {
  auto const rows = static_cast<std::int32_t>(state.range(0));
  auto const vocab = static_cast<std::int32_t>(state.range(1));
  auto const kind = static_cast<policy_kind>(state.range(2));
  bool const peaked = state.range(3) != 0;
  auto const host = bench_cuda::logits(static_cast<std::size_t>(rows),
                                       static_cast<std::size_t>(vocab), peaked, 3);
  auto const logits = bench_cuda::upload(host);
  std::vector<specdec::philox> rngs;
  for (std::int32_t r = 0; r < rows; ++r) rngs.emplace_back(1, static_cast<std::uint64_t>(r));
  auto rng = bench_cuda::upload(rngs);
  sc::device_buffer<specdec::token_id> tokens(static_cast<std::size_t>(rows));
  sc::sampling_workspace ws(vocab, rows);
  specdec::sampling_params sp;
  if (kind == top_k || kind == combined) sp.top_k = 50;
  if (kind == top_p || kind == combined) sp.top_p = 0.9f;
  if (kind == combined) sp.temperature = 0.8f;
  sc::device_sampler const pol(sp);
  sc::sample_params p;
  p.logits = logits.data();
  p.stride = vocab;
  p.rows = rows;
  p.vocab = vocab;
  p.rng = rng.data();
  p.tokens = tokens.data();
  std::size_t const bytes =
      static_cast<std::size_t>(rows) * static_cast<std::size_t>(vocab) * sizeof(float);
  bench_cuda::run(
      state, [&] { sc::throw_if_failed(sc::launch_sample(p, pol.policy(), ws, nullptr), "bench"); },
      bytes, nullptr);
  static char const* const names[] = {"temperature", "top-k 50", "top-p 0.9", "top-k+top-p"};
  state.SetLabel(std::string(names[kind]) + (peaked ? ", peaked" : ", flat"));
}

void BM_sample_radix(benchmark::State& state) {
  auto const rows = static_cast<std::int32_t>(state.range(0));
  auto const vocab = static_cast<std::int32_t>(state.range(1));
  auto const kind = static_cast<policy_kind>(state.range(2));
  auto const host =
      bench_cuda::logits(static_cast<std::size_t>(rows), static_cast<std::size_t>(vocab), true, 3);
  auto const logits = bench_cuda::upload(host);
  std::vector<specdec::philox> rngs;
  for (std::int32_t r = 0; r < rows; ++r) rngs.emplace_back(1, static_cast<std::uint64_t>(r));
  auto rng = bench_cuda::upload(rngs);
  sc::device_buffer<specdec::token_id> tokens(static_cast<std::size_t>(rows));
  sc::sampling_workspace ws(vocab, rows);
  specdec::sampling_params sp;
  if (kind == top_k) sp.top_k = 50;
  if (kind == top_p) sp.top_p = 0.9f;
  sc::device_sampler const pol(sp);
  sc::distribution_params dp;
  dp.z = logits.data();
  dp.z_stride = vocab;
  dp.probs = ws.work();
  dp.probs_stride = vocab;
  dp.rows = rows;
  dp.vocab = vocab;
  dp.policy = pol.policy();
  sc::walk_params w;
  w.layout = sc::ragged_layout::padded(rows, 1);
  w.vocab = vocab;
  w.tokens = ws.zeros();
  w.rng = rng.data();
  w.num_accepted = ws.num_accepted();
  w.accepted_nodes = ws.accepted();
  w.out_tokens = tokens.data();
  w.scratch = ws.draw();
  w.plan = sc::plan_chunks(vocab, rows, w.scratch.multiprocessors);
  w.target = ws.work();
  w.target_stride = vocab;
  w.target_is_probs = true;
  std::size_t const bytes =
      static_cast<std::size_t>(rows) * static_cast<std::size_t>(vocab) * sizeof(float);
  bench_cuda::run(
      state,
      [&] {
        sc::throw_if_failed(sc::launch_distribution_radix(dp, nullptr), "bench");
        sc::throw_if_failed(sc::launch_walk_draw(w, nullptr), "bench");
      },
      bytes, nullptr);
  state.SetLabel(kind == top_k ? "radix + walk, top-k 50, peaked"
                               : "radix + walk, top-p 0.9, peaked");
}

void BM_softmax(benchmark::State& state) {
  auto const rows = static_cast<std::int32_t>(state.range(0));
  auto const vocab = static_cast<std::int32_t>(state.range(1));
  auto const host =
      bench_cuda::logits(static_cast<std::size_t>(rows), static_cast<std::size_t>(vocab), true, 4);
  auto const logits = bench_cuda::upload(host);
  sc::device_buffer<float> probs(host.size());
  sc::draw_workspace ws(vocab, rows, 1);
  sc::row_stats_params rs;
  rs.rows = logits.data();
  rs.stride = vocab;
  rs.num_rows = rows;
  rs.vocab = vocab;
  rs.plan = sc::plan_chunks(vocab, rows, ws.scratch().multiprocessors);
  rs.scratch = ws.scratch();
  std::size_t const bytes = host.size() * sizeof(float);
  bench_cuda::run(
      state,
      [&] {
        sc::throw_if_failed(sc::launch_softmax(rs, probs.data(), vocab, nullptr, nullptr), "bench");
      },
      bytes, nullptr);
}

}  // namespace

BENCHMARK(BM_sample)
    ->ArgNames({"rows", "vocab", "policy", "peaked"})
    ->ArgsProduct({{1, 16, 64}, {32000, 128256}, {0, 1, 2, 3}, {1, 0}})
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_sample_radix)
    ->ArgNames({"rows", "vocab", "policy"})
    ->ArgsProduct({{1, 16}, {32000, 128256}, {1, 2}})
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_softmax)
    ->ArgNames({"rows", "vocab"})
    ->ArgsProduct({{1, 16, 64}, {32000, 128256}})
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
