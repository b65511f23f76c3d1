// CPU backend forward latency: decode (1 token) and verification batches (chains and trees of 2 to
// 17 tokens) with a few hundred tokens of context in the cache, on the stories260K fixture and on
// random-weight models of the stories110M and TinyLlama-1.1B shapes.
//
// Yardstick, measured in the same run and interleaved with the forwards: streaming the bytes a
// decode step must read (every weight matrix, the classifier, the norms) once with the same
// threads, a STREAM-like read (a vectorised sum with the same software prefetch as the forward's
// kernels, each tensor split across the threads as the forward splits it). Counters:
//   decode:  bw_ratio = stream time / decode time (1.0 = decode at the bandwidth bound),
//            stream_GBps, decode_GBps (weight bytes / decode time), tok_per_s
//   verify:  x_decode = batch time / 1-token time, measured alternately in the same loop
//   prefill: tok_per_s
//   decode_view: x_full = decode time with a view of the cache (16 sinks and a recent window, the
//            budget in the name) / decode time over the whole cache, measured alternately in the
//            same loop, with SPECDEC_BENCH_VIEW_CONTEXT tokens in the cache (default 2048)
//   matmul_vs_eigen (built only when CMake found Eigen, the one use of Eigen in the project):
//            eigen_over_tiled = Eigen's product time / the tiled kernel's, eigen_ms
// Environment: SPECDEC_MODEL_DIR (stories260K.bin), SPECDEC_BENCH_THREADS (default 2),
// SPECDEC_BENCH_CONTEXT (tokens in the cache, default 256).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "specdec/backend/cpu/kernels.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/backend/cpu/thread_pool.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"

#if defined(SPECDEC_BENCH_EIGEN)
#include "eigen_gemm.hpp"
#endif

namespace sd = specdec;

namespace {

using clock_type = std::chrono::steady_clock;

std::size_t env_size(char const* name, std::size_t fallback) {
  char const* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  return static_cast<std::size_t>(std::strtoull(v, nullptr, 10));
}

std::size_t bench_threads() {
  return env_size("SPECDEC_BENCH_THREADS", 2);
}
std::size_t bench_context() {
  return env_size("SPECDEC_BENCH_CONTEXT", 256);
}

sd::llama_config shape(std::int32_t dim, std::int32_t hidden, std::int32_t layers,
                       std::int32_t heads, std::int32_t kv_heads, std::int32_t vocab,
                       std::int32_t seq_len, bool shared) {
  sd::llama_config c;
  c.dim = dim;
  c.hidden_dim = hidden;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.vocab_size = vocab;
  c.seq_len = seq_len;
  c.shared_classifier = shared;
  return c;
}

// One model under test, its prefilled context and the tensors a decode step streams.
struct model_under_test {
  std::shared_ptr<sd::llama_weights const> weights;
  std::unique_ptr<sd::cpu_llama> model;
  std::vector<std::span<float const>> streamed;  // every tensor a decode step reads in full
  std::size_t streamed_bytes = 0;
  std::size_t context = 0;
  std::string error;
};

void collect_streamed(model_under_test& m) {
  sd::llama_weights const& w = *m.weights;
  sd::llama_config const& c = w.config;
  auto const d = static_cast<std::size_t>(c.dim), h = static_cast<std::size_t>(c.hidden_dim),
             kv = static_cast<std::size_t>(c.kv_dim()), v = static_cast<std::size_t>(c.vocab_size);
  auto add = [&](float const* p, std::size_t n) { m.streamed.emplace_back(p, n); };
  for (auto const& l : w.layers) {
    add(l.rms_att, d);
    add(l.wq, d * d);
    add(l.wk, kv * d);
    add(l.wv, kv * d);
    add(l.wo, d * d);
    add(l.rms_ffn, d);
    add(l.w1, h * d);
    add(l.w3, h * d);
    add(l.w2, d * h);
  }
  add(w.rms_final, d);
  add(w.classifier, v * d);
  m.streamed_bytes = 0;
  for (auto s : m.streamed) m.streamed_bytes += s.size_bytes();
}

model_under_test& get_model(std::string const& name, std::size_t const ctx = bench_context()) {
  static std::map<std::string, model_under_test> models;
  std::string const key = name + "@" + std::to_string(ctx);
  auto it = models.find(key);
  if (it != models.end()) return it->second;
  model_under_test& m = models[key];
  try {
    if (name == "stories260K") {
      char const* dir = std::getenv("SPECDEC_MODEL_DIR");
      if (dir == nullptr) {
        m.error = "SPECDEC_MODEL_DIR is not set (needs stories260K.bin)";
        return m;
      }
      m.weights = std::make_shared<sd::llama_weights const>(
          sd::load_model(std::filesystem::path(dir) / "stories260K.bin"));
    } else if (name == "stories110M") {
      m.weights = std::make_shared<sd::llama_weights const>(
          sd::make_random_llama(shape(768, 2048, 12, 12, 12, 32000, 1024, true), 110));
    } else if (name == "tinyllama1.1B") {
      m.weights = std::make_shared<sd::llama_weights const>(
          sd::make_random_llama(shape(2048, 5632, 22, 32, 4, 32000, 2048, false), 1100));
    } else {
      m.error = "unknown model " + name;
      return m;
    }
    collect_streamed(m);
    m.model = std::make_unique<sd::cpu_llama>(
        m.weights, sd::cpu_llama_options{.threads = bench_threads(), .max_context = ctx + 64});
    // Prefill the context in one batch.
    std::vector<sd::token_id> tokens(ctx);
    std::vector<sd::position_t> positions(ctx);
    for (std::size_t i = 0; i < ctx; ++i) {
      tokens[i] = static_cast<sd::token_id>((i * 7919 + 1) % m.model->vocab_size());
      positions[i] = static_cast<sd::position_t>(i);
    }
    std::int32_t const last = static_cast<std::int32_t>(ctx - 1);
    sd::forward_request req;
    req.tokens = tokens;
    req.positions = positions;
    req.logits_rows = std::span<std::int32_t const>(&last, 1);
    sd::forward_result out;
    m.model->forward(req, out);
    m.context = ctx;
  } catch (std::exception const& e) {
    m.error = e.what();
  }
  return m;
}

// The yardstick: sums every streamed tensor, each split across the pool's threads like the
// forward's matrix products. Returns the sum (kept so the reads are not optimised away).
float stream_read(sd::thread_pool& pool, std::vector<std::span<float const>> const& tensors) {
  std::vector<float> partial(pool.size() * 16, 0.0f);  // one cache line per thread
  for (auto const s : tensors) {
    pool.run([&](std::size_t t) {
      // 16 independent sums (vectorised by the compiler whatever the target: the read, not the
      // arithmetic, bounds it), prefetched ahead as the forward's kernels do.
      constexpr std::size_t lanes = 16, ahead = 4096;
      std::size_t const threads = pool.size();
      std::size_t const b = s.size() * t / threads, e = s.size() * (t + 1) / threads;
      float acc[lanes] = {};
      float const* p = s.data();
      std::size_t i = b;
      for (; i + lanes <= e; i += lanes) {
        __builtin_prefetch(p + i + ahead, 0, 2);
        for (std::size_t j = 0; j < lanes; ++j) acc[j] += p[i + j] * p[i + j];
      }
      float total = 0.0f;
      for (float const x : acc) total += x;
      for (; i < e; ++i) total += p[i];
      partial[t * 16] += total;
    });
  }
  return std::accumulate(partial.begin(), partial.end(), 0.0f);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// A batch of n tokens after the context: a chain (node i's parent is i - 1) or a binary tree
// (heap order: node i's parent is (i - 1) / 2).
struct batch {
  std::vector<sd::token_id> tokens;
  std::vector<sd::position_t> positions;
  std::vector<std::uint64_t> mask;
  std::size_t stride = 0;
};

batch make_batch(std::size_t n, bool tree, std::size_t context, std::size_t vocab) {
  std::vector<sd::token_id> tokens(n);
  std::vector<sd::node_index> parents(n);
  for (std::size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<sd::token_id>((i * 31 + 5) % vocab);
    parents[i] = i == 0 ? -1 : static_cast<sd::node_index>(tree ? (i - 1) / 2 : i - 1);
  }
  auto const t = sd::draft_tree::from_parents(tokens, parents);
  batch b;
  b.tokens = tokens;
  for (std::size_t i = 0; i < n; ++i)
    b.positions.push_back(static_cast<sd::position_t>(context) +
                          t.depth(static_cast<sd::node_index>(i)));
  b.mask.assign(t.mask().begin(), t.mask().end());
  b.stride = t.mask_stride();
  return b;
}

double timed_forward(sd::cpu_llama& model, batch const& b, sd::forward_result& out,
                     std::size_t context, sd::kv_view view = {}) {
  sd::forward_request req;
  req.tokens = b.tokens;
  req.positions = b.positions;
  req.mask = b.mask;
  req.mask_stride = b.stride;
  req.view = view;
  auto const t0 = clock_type::now();
  model.forward(req, out);
  double const s = seconds_since(t0);
  model.cache().truncate(context);
  benchmark::DoNotOptimize(out.logits.data());
  return s;
}

void bm_stream(benchmark::State& state, std::string const& name) {
  model_under_test& m = get_model(name);
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(stream_read(*m.model->pool(), m.streamed));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(m.streamed_bytes));
  state.counters["weight_MB"] = double(m.streamed_bytes) / 1e6;
}

void bm_decode(benchmark::State& state, std::string const& name) {
  model_under_test& m = get_model(name);
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  batch const one = make_batch(1, false, m.context, m.model->vocab_size());
  sd::forward_result out;
  (void)timed_forward(*m.model, one, out, m.context);  // warm-up (buffers)
  double decode_s = 0, stream_s = 0;
  for (auto _ : state) {
    auto const t0 = clock_type::now();
    benchmark::DoNotOptimize(stream_read(*m.model->pool(), m.streamed));
    stream_s += seconds_since(t0);
    double const s = timed_forward(*m.model, one, out, m.context);
    decode_s += s;
    state.SetIterationTime(s);
  }
  double const iters = double(state.iterations());
  double const bytes = double(m.streamed_bytes);
  state.counters["tok_per_s"] = iters / decode_s;
  state.counters["stream_GBps"] = bytes * iters / stream_s / 1e9;
  state.counters["decode_GBps"] = bytes * iters / decode_s / 1e9;
  state.counters["bw_ratio"] = stream_s / decode_s;
  state.counters["context"] = double(m.context);
  state.counters["weight_MB"] = bytes / 1e6;
}

void bm_verify(benchmark::State& state, std::string const& name, bool tree) {
  model_under_test& m = get_model(name);
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  auto const n = static_cast<std::size_t>(state.range(0));
  batch const one = make_batch(1, false, m.context, m.model->vocab_size());
  batch const many = make_batch(n, tree, m.context, m.model->vocab_size());
  sd::forward_result out;
  (void)timed_forward(*m.model, many, out, m.context);  // warm-up (buffers)
  double one_s = 0, many_s = 0;
  for (auto _ : state) {
    one_s += timed_forward(*m.model, one, out, m.context);
    double const s = timed_forward(*m.model, many, out, m.context);
    many_s += s;
    state.SetIterationTime(s);
  }
  double const iters = double(state.iterations());
  state.counters["x_decode"] = many_s / one_s;
  state.counters["decode_ms"] = one_s / iters * 1e3;
  state.counters["tokens"] = double(n);
}

// One token decoded over a view of a long cache (16 sinks and a window, range(0) positions in
// all) against the same token over the whole cache, alternately.
void bm_decode_view(benchmark::State& state, std::string const& name) {
  model_under_test& m = get_model(name, env_size("SPECDEC_BENCH_VIEW_CONTEXT", 2048));
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  auto const budget = static_cast<std::size_t>(state.range(0));
  sd::kv_view const view{.sinks = 16, .window = budget - 16};
  batch const one = make_batch(1, false, m.context, m.model->vocab_size());
  sd::forward_result out;
  (void)timed_forward(*m.model, one, out, m.context, view);  // warm-up (buffers)
  double full_s = 0, view_s = 0;
  for (auto _ : state) {
    full_s += timed_forward(*m.model, one, out, m.context);
    double const s = timed_forward(*m.model, one, out, m.context, view);
    view_s += s;
    state.SetIterationTime(s);
  }
  double const iters = double(state.iterations());
  state.counters["x_full"] = view_s / full_s;
  state.counters["full_ms"] = full_s / iters * 1e3;
  state.counters["context"] = double(m.context);
}

void bm_prefill(benchmark::State& state, std::string const& name) {
  model_under_test& m = get_model(name);
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  // A separate model on the same weights so the decode context stays intact.
  std::size_t const n = m.context;
  sd::cpu_llama model(m.weights, {.max_context = n, .batch_capacity = n, .pool = m.model->pool()});
  std::vector<sd::token_id> tokens(n);
  std::vector<sd::position_t> positions(n);
  for (std::size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<sd::token_id>((i * 13 + 3) % model.vocab_size());
    positions[i] = static_cast<sd::position_t>(i);
  }
  std::int32_t const last = static_cast<std::int32_t>(n - 1);
  sd::forward_request req;
  req.tokens = tokens;
  req.positions = positions;
  req.logits_rows = std::span<std::int32_t const>(&last, 1);
  sd::forward_result out;
  for (auto _ : state) {
    model.reset();
    auto const t0 = clock_type::now();
    model.forward(req, out);
    state.SetIterationTime(seconds_since(t0));
  }
  state.counters["tok_per_s"] =
      benchmark::Counter(double(n) * double(state.iterations()), benchmark::Counter::kIsRate);
}

#if defined(SPECDEC_BENCH_EIGEN)
// The layer matrix products of one forward (q, k, v, o, gate, up, down of every layer) over n
// tokens, rows split across the pool like the forward does, with the tiled kernel or with Eigen.
// Manual time = tiled; eigen_over_tiled = Eigen time / tiled time, measured alternately.
void bm_matmul_vs_eigen(benchmark::State& state, std::string const& name) {
  model_under_test& m = get_model(name);
  if (!m.error.empty()) {
    state.SkipWithError(m.error.c_str());
    return;
  }
  sd::llama_config const& c = m.weights->config;
  auto const d = static_cast<std::size_t>(c.dim), h = static_cast<std::size_t>(c.hidden_dim),
             kv = static_cast<std::size_t>(c.kv_dim());
  auto const n = static_cast<std::size_t>(state.range(0));
  struct product {
    float const* w;
    std::size_t rows, cols;
  };
  std::vector<product> products;
  for (auto const& l : m.weights->layers) {
    products.push_back({l.wq, d, d});
    products.push_back({l.wk, kv, d});
    products.push_back({l.wv, kv, d});
    products.push_back({l.wo, d, d});
    products.push_back({l.w1, h, d});
    products.push_back({l.w3, h, d});
    products.push_back({l.w2, d, h});
  }
  std::vector<float> x(n * std::max(d, h), 0.01f), y(n * std::max(d, h));
  sd::thread_pool& pool = *m.model->pool();
  sd::detail::cpu::model_kernels const& kernels = sd::detail::cpu::active_model_kernels();
  auto pass = [&](bool eigen) {
    auto const t0 = clock_type::now();
    for (auto const& p : products)
      pool.parallel_for(p.rows, sd::detail::cpu::tile_rows, [&](std::size_t r0, std::size_t r1) {
        if (eigen)
          bench::eigen_gemm_nt(p.w, p.cols, r0, r1, x.data(), p.cols, n, p.cols, y.data(), p.rows,
                               false);
        else
          kernels.gemm_nt(p.w, p.cols, r0, r1, x.data(), p.cols, n, p.cols, y.data(), p.rows,
                          false);
      });
    return seconds_since(t0);
  };
  double tiled_s = 0, eigen_s = 0;
  for (auto _ : state) {
    eigen_s += pass(true);
    double const s = pass(false);
    tiled_s += s;
    state.SetIterationTime(s);
  }
  state.counters["eigen_over_tiled"] = eigen_s / tiled_s;
  state.counters["eigen_ms"] = eigen_s / double(state.iterations()) * 1e3;
}
#endif

int register_all() {
  std::vector<std::string> const names{"stories260K", "stories110M", "tinyllama1.1B"};
  for (auto const& name : names) {
    benchmark::RegisterBenchmark(("stream_read/" + name).c_str(), bm_stream, name)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("decode/" + name).c_str(), bm_decode, name)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
    for (bool tree : {false, true}) {
      auto* b = benchmark::RegisterBenchmark(
          ("verify_" + std::string(tree ? "tree" : "chain") + "/" + name).c_str(), bm_verify, name,
          tree);
      b->Unit(benchmark::kMillisecond)->UseManualTime();
      for (int n : {1, 2, 3, 5, 9, 17}) b->Arg(n);
    }
#if defined(SPECDEC_BENCH_EIGEN)
    if (name == "stories110M") {
      auto* b = benchmark::RegisterBenchmark(("matmul_vs_eigen/" + name).c_str(),
                                             bm_matmul_vs_eigen, name);
      b->Unit(benchmark::kMillisecond)->UseManualTime();
      for (int n : {1, 5, 17}) b->Arg(n);
    }
#endif
    if (name != "tinyllama1.1B") {
      auto* b = benchmark::RegisterBenchmark(("decode_view/" + name).c_str(), bm_decode_view, name);
      b->Unit(benchmark::kMillisecond)->UseManualTime()->ArgName("budget");
      for (int n : {64, 512}) b->Arg(n);
    }
    if (name != "tinyllama1.1B")
      benchmark::RegisterBenchmark(("prefill/" + name).c_str(), bm_prefill, name)
          ->Unit(benchmark::kMillisecond)
          ->UseManualTime();
  }
  return 0;
}

int const registered = register_all();

}  // namespace

BENCHMARK_MAIN();
