// CUDA verification kernels against the bandwidth floor measured in the same run (a
// device-to-device copy of the bytes the kernel must read):
// - chain verification (speculative sampling with q rows) at batch 1, 16, 64, k = 4 and 8,
//   vocab 32000 and 128256, from logits (softmax fused) and from given probabilities;
// - greedy chain verification;
// - tree verification with 64-node trees (point masses and sampled children).
// Bytes read: every target row of the batch (the normalisers need them all) plus one q row per
// sequence for the residual; from probabilities, one target row and one q row per sequence.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "cuda/bench_common.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/backend/cuda/sampling.cuh"
#include "specdec/backend/cuda/softmax.cuh"
#include "specdec/backend/cuda/verify.cuh"

namespace {

namespace sc = specdec::cuda;

// Fills rows with N(0, scale) (Box-Muller on Philox words) plus a few spikes per row.
template <int = 0>
__global__ void fill_logits(float* out, std::int64_t rows, std::int32_t vocab, float scale,
                            std::uint64_t seed) {
  std::int64_t const n = rows * vocab;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float const u1 = specdec::philox_uniform(seed, 0, 2 * static_cast<std::uint64_t>(i)) + 1e-7f;
    float const u2 = specdec::philox_uniform(seed, 0, 2 * static_cast<std::uint64_t>(i) + 1);
    float v = scale * sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
    if ((specdec::philox_word(seed, 1, static_cast<std::uint64_t>(i)) % 20000u) == 0u) v += 12.0f;
    out[i] = v;
  }
}

struct chain_setup {
  sc::device_buffer<float> target, q, noisy;
  sc::device_buffer<specdec::token_id> tokens;
  sc::device_buffer<specdec::philox> rng;
  sc::device_buffer<std::int32_t> num, nodes, flags;
  sc::device_buffer<specdec::token_id> out;
  std::unique_ptr<sc::sampling_workspace> ws;
  sc::verify_inputs in;
};

// A padded batch of `batch` sequences of `nodes` rows: target logits, q rows = softmax of noisy
// logits, random tokens.
void prepare(chain_setup& s, std::int32_t batch, std::int32_t nodes, std::int32_t vocab,
             bool with_q, bool tree) {
  auto const rows = static_cast<std::int64_t>(batch) * nodes;
  auto const size = static_cast<std::size_t>(rows) * static_cast<std::size_t>(vocab);
  s.target.resize(size);
  fill_logits<<<1024, 256>>>(s.target.data(), rows, vocab, 2.0f, 1);
  s.ws = std::make_unique<sc::sampling_workspace>(vocab, static_cast<std::int32_t>(rows));
  if (with_q) {
    s.q.resize(size);
    s.noisy.resize(size);
    fill_logits<<<1024, 256>>>(s.noisy.data(), rows, vocab, 2.0f, 1);  // same draws ...
    sc::row_stats_params rs;
    rs.rows = s.noisy.data();
    rs.stride = vocab;
    rs.num_rows = static_cast<std::int32_t>(rows);
    rs.vocab = vocab;
    rs.plan = sc::plan_chunks(vocab, rows, s.ws->draw().multiprocessors);
    rs.scratch = s.ws->draw();
    rs.inv_temperature = 0.8f;  // ... at another temperature: q close to p but not equal
    sc::throw_if_failed(sc::launch_softmax(rs, s.q.data(), vocab, nullptr, nullptr), "bench");
  }
  std::mt19937 gen(5);
  std::vector<specdec::token_id> tokens(static_cast<std::size_t>(rows));
  for (auto& t : tokens) t = static_cast<specdec::token_id>(gen() % static_cast<unsigned>(vocab));
  s.tokens = bench_cuda::upload(tokens);
  std::vector<specdec::philox> rngs;
  for (std::int32_t b = 0; b < batch; ++b) rngs.emplace_back(7, static_cast<std::uint64_t>(b), 0);
  s.rng = bench_cuda::upload(rngs);
  s.num.resize(static_cast<std::size_t>(batch));
  s.flags.resize(static_cast<std::size_t>(batch));
  s.flags.zero();
  s.nodes.resize(static_cast<std::size_t>(rows));
  s.out.resize(static_cast<std::size_t>(rows));
  s.in.layout = sc::ragged_layout::padded(batch, nodes);
  s.in.vocab = vocab;
  s.in.target = s.target.data();
  s.in.target_stride = vocab;
  s.in.tokens = s.tokens.data();
  s.in.q = with_q ? s.q.data() : nullptr;
  s.in.q_stride = vocab;
  s.in.rng = s.rng.data();
  s.in.num_accepted = s.num.data();
  s.in.accepted_nodes = s.nodes.data();
  s.in.out_tokens = s.out.data();
  s.in.error_flags = s.flags.data();
  if (tree) {
    // A 64-node tree per sequence: node i > 0 has parent (i - 1) / 4 (root with 4 children, ...).
    static sc::device_buffer<std::int32_t> parents;
    std::vector<std::int32_t> p(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      auto const i = static_cast<std::int32_t>(r % nodes);
      p[static_cast<std::size_t>(r)] = i == 0 ? -1 : (i - 1) / 4;
    }
    parents = bench_cuda::upload(p);
    s.in.parents = parents.data();
    // Distinct siblings for point masses: token = node index (siblings differ).
    if (!with_q) {
      for (std::int64_t r = 0; r < rows; ++r)
        tokens[static_cast<std::size_t>(r)] = static_cast<specdec::token_id>(r % nodes);
      s.tokens = bench_cuda::upload(tokens);
      s.in.tokens = s.tokens.data();
    }
  }
  SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
}

void BM_chain_verify(benchmark::State& state) {
  auto const batch = static_cast<std::int32_t>(state.range(0));
  auto const k = static_cast<std::int32_t>(state.range(1));
  auto const vocab = static_cast<std::int32_t>(state.range(2));
  bool const probs = state.range(3) != 0;
  chain_setup s;
  prepare(s, batch, k + 1, vocab, true, false);
  specdec::sampling_params sp;
  sc::device_sampler const pol(sp);
  std::size_t bytes = 0;
  if (probs) {
    // The target rows as probabilities (an engine with a fused softmax has them).
    sc::row_stats_params rs;
    rs.rows = s.target.data();
    rs.stride = vocab;
    rs.num_rows = batch * (k + 1);
    rs.vocab = vocab;
    rs.plan = sc::plan_chunks(vocab, rs.num_rows, s.ws->draw().multiprocessors);
    rs.scratch = s.ws->draw();
    sc::throw_if_failed(sc::launch_softmax(rs, s.noisy.data(), vocab, nullptr, nullptr), "bench");
    s.in.target = s.noisy.data();
    s.in.target_is_probs = true;
    bytes = static_cast<std::size_t>(batch) * 2 * static_cast<std::size_t>(vocab) * sizeof(float);
  } else {
    bytes = static_cast<std::size_t>(batch) * static_cast<std::size_t>(k + 2) *
            static_cast<std::size_t>(vocab) * sizeof(float);
  }
  bench_cuda::run(
      state,
      [&] { sc::throw_if_failed(sc::launch_verify(s.in, pol.policy(), *s.ws, nullptr), "bench"); },
      bytes, nullptr);
  state.SetLabel(probs ? "probs" : "logits");
}

void BM_greedy_verify(benchmark::State& state) {
  auto const batch = static_cast<std::int32_t>(state.range(0));
  auto const k = static_cast<std::int32_t>(state.range(1));
  auto const vocab = static_cast<std::int32_t>(state.range(2));
  chain_setup s;
  prepare(s, batch, k + 1, vocab, false, false);
  specdec::sampling_params gp;
  gp.temperature = 0.0f;
  sc::device_sampler const pol(gp);
  std::size_t const bytes = static_cast<std::size_t>(batch) * static_cast<std::size_t>(k + 1) *
                            static_cast<std::size_t>(vocab) * sizeof(float);
  bench_cuda::run(
      state,
      [&] {
        sc::throw_if_failed(sc::launch_verify_greedy(s.in, pol.policy(), *s.ws, nullptr), "bench");
      },
      bytes, nullptr);
}

void BM_tree_verify(benchmark::State& state) {
  auto const batch = static_cast<std::int32_t>(state.range(0));
  auto const vocab = static_cast<std::int32_t>(state.range(1));
  bool const with_q = state.range(2) != 0;
  constexpr std::int32_t nodes = 64;
  chain_setup s;
  prepare(s, batch, nodes, vocab, with_q, true);
  specdec::sampling_params sp;
  sc::device_sampler const pol(sp);
  std::size_t const bytes = static_cast<std::size_t>(batch) * static_cast<std::size_t>(nodes + 1) *
                            static_cast<std::size_t>(vocab) * sizeof(float);
  bench_cuda::run(
      state,
      [&] { sc::throw_if_failed(sc::launch_verify(s.in, pol.policy(), *s.ws, nullptr), "bench"); },
      bytes, nullptr);
  state.SetLabel(with_q ? "sampled children" : "point masses");
}

}  // namespace

BENCHMARK(BM_chain_verify)
    ->ArgNames({"batch", "k", "vocab", "probs"})
    ->ArgsProduct({{1, 16, 64}, {4, 8}, {32000, 128256}, {0, 1}})
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_greedy_verify)
    ->ArgNames({"batch", "k", "vocab"})
    ->ArgsProduct({{1, 16, 64}, {4}, {32000, 128256}})
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_tree_verify)
    ->ArgNames({"batch", "vocab", "q"})
    ->ArgsProduct({{1, 16}, {32000, 128256}, {0, 1}})
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
