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

// Random weights of the TinyLlama shape: uniform in [-0.035, 0.035] (std 0.02), norms 1.
std::shared_ptr<sd::llama_weights const> tinyllama() {
  static std::shared_ptr<sd::llama_weights const> cached;
  if (cached) return cached;
  sd::llama_config c;
  c.dim = 2048;
  c.hidden_dim = 5632;
  c.n_layers = 22;
  c.n_heads = 32;
  c.n_kv_heads = 4;
  c.vocab_size = 32000;
  c.seq_len = 2048;
  c.shared_classifier = false;
  auto data = std::make_shared<std::vector<float>>(c.parameter_count());
  std::uint32_t x = 2463534242u;
  for (float& f : *data) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    f = (static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.07f;
  }
  auto w = std::make_shared<sd::llama_weights>();
  w->config = c;
  w->storage = data;
  auto const d = static_cast<std::size_t>(c.dim), h = static_cast<std::size_t>(c.hidden_dim),
             kv = static_cast<std::size_t>(c.kv_dim()), v = static_cast<std::size_t>(c.vocab_size);
  float* p = data->data();
  auto take = [&](std::size_t n) {
    float* r = p;
    p += n;
    return r;
  };
  auto norm = [&](std::size_t n) {
    float* r = take(n);
    std::fill(r, r + n, 1.0f);
    return r;
  };
  w->token_embedding = take(v * d);
  w->layers.resize(static_cast<std::size_t>(c.n_layers));
  for (auto& l : w->layers) {
    l.rms_att = norm(d);
    l.wq = take(d * d);
    l.wk = take(kv * d);
    l.wv = take(kv * d);
    l.wo = take(d * d);
    l.rms_ffn = norm(d);
    l.w1 = take(h * d);
    l.w2 = take(d * h);
    l.w3 = take(h * d);
  }
  w->rms_final = norm(d);
  w->classifier = take(v * d);
  cached = w;
  return cached;
}

void BM_tinyllama(benchmark::State& state) {
  auto const n = static_cast<std::size_t>(state.range(0));
  bool const to_host = state.range(1) != 0;
  static std::unique_ptr<sd::cuda_llama> model;
  if (!model) model = std::make_unique<sd::cuda_llama>(*tinyllama());
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
