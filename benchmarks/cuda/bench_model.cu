// cuda_llama decode latency on a random-weight TinyLlama-1.1B shape (dim 2048, hidden 5632, 22
// layers, 32 heads, 4 kv heads, vocab 32000; weights generated in memory), with 256 tokens
// already in the cache: one token (decode), and 5 and 17 tokens scored as a chain (verification).
// Yardstick in the same run: a device-to-device copy of the weight bytes (a decode step must
// stream every weight once); counters x_floor (time / copy time) and the weight GB/s.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "cuda/bench_common.cuh"
#include "specdec/backend/cuda/llama.cuh"

namespace {

namespace sd = specdec;

void BM_tinyllama(benchmark::State& state) {
  auto const n = static_cast<std::size_t>(state.range(0));
  bool const to_host = state.range(1) != 0;
  static std::unique_ptr<sd::cuda_llama> model;
  if (!model) model = std::make_unique<sd::cuda_llama>(*bench_cuda::tinyllama());
  sd::cuda_llama& m = *model;
  constexpr std::size_t context = 256;
  m.reset();
  std::vector<sd::token_id> prompt(context);
  for (std::size_t i = 0; i < context; ++i)
    prompt[i] = static_cast<sd::token_id>((i * 7919) % 32000);
  std::vector<sd::position_t> ppos(context);
  std::iota(ppos.begin(), ppos.end(), 0);
  sd::forward_request pre;
  pre.tokens = prompt;
  pre.positions = ppos;
  std::vector<std::int32_t> const last{static_cast<std::int32_t>(context - 1)};
  pre.logits_rows = last;
  sd::forward_result out;
  m.forward(pre, out);
  std::vector<sd::token_id> toks(n, 5);
  std::vector<sd::position_t> pos(n);
  std::iota(pos.begin(), pos.end(), static_cast<sd::position_t>(context));
  sd::forward_request req;
  req.tokens = toks;
  req.positions = pos;
  auto const step = [&] {
    if (to_host) {
      m.forward(req, out);
    } else {
      (void)m.forward_device(req);
    }
    m.cache().truncate(context);
  };
  bench_cuda::run(state, step, m.weight_bytes(), m.stream());
  state.counters["weight_GB/s"] = state.counters["GB/s"];
  state.SetLabel(to_host ? "logits to host" : "logits on device");
}

}  // namespace

BENCHMARK(BM_tinyllama)
    ->ArgNames({"tokens", "host"})
    ->ArgsProduct({{1, 5, 17}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

BENCHMARK_MAIN();
