#pragma once
// Shared pieces of the CUDA benchmarks: CUDA-event timing of a batch of back-to-back launches,
// the yardsticks measured in the same run (a device-to-device copy of the bytes a kernel must read;
// the device's read bandwidth, from a kernel that only reads), and the random-weight
// TinyLlama-1.1B shape.

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/model/llama_weights.hpp"

namespace bench_cuda {

// Launches per timed iteration (amortises the event overhead; launch latency stays counted).
inline constexpr int reps = 20;

// Seconds per launch of `launch` (which enqueues work on `stream`), averaged over `reps`.
template <class F>
double time_launches(F const& launch, cudaStream_t stream) {
  cudaEvent_t start = nullptr, stop = nullptr;
  SPECDEC_CUDA_CHECK(cudaEventCreate(&start));
  SPECDEC_CUDA_CHECK(cudaEventCreate(&stop));
  SPECDEC_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < reps; ++i) launch();
  SPECDEC_CUDA_CHECK(cudaEventRecord(stop, stream));
  SPECDEC_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  SPECDEC_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return static_cast<double>(ms) * 1e-3 / reps;
}

// Seconds of a device-to-device copy of `bytes` (the bandwidth floor of a kernel that must read
// them), measured like the kernels.
inline double copy_floor(std::size_t bytes, cudaStream_t stream) {
  static specdec::cuda::device_buffer<unsigned char> src, dst;
  src.reserve(bytes);
  dst.reserve(bytes);
  auto const copy = [&] {
    SPECDEC_CUDA_CHECK(
        cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream));
  };
  copy();  // warm-up
  double best = 1e30;
  for (int i = 0; i < 5; ++i) best = std::min(best, time_launches(copy, stream));
  return best;
}

// Reads n 16-byte words (several loads in flight per thread) and keeps a combination of them
// where the compiler cannot drop the loads: the read-bandwidth yardstick.
template <int Unused = 0>
__global__ void read_words_kernel(uint4 const* __restrict__ p, std::size_t n,
                                  unsigned* __restrict__ sink) {
  std::size_t const stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 const a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride),
                d = __ldg(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < n; i += stride) {
    uint4 const a = __ldg(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // never in practice; the loads must happen
}

// The device's read bandwidth in bytes per second: the best of 5 timings of a kernel reading a
// buffer of `bytes` (rounded down to 16 bytes; at least 1 GiB is worth reading, for a stable
// figure), the kind of stream a decode step's weights are.
inline double read_bandwidth(std::size_t bytes, cudaStream_t stream) {
  std::size_t const words = bytes / 16;
  specdec::cuda::device_buffer<uint4> buffer(words);
  specdec::cuda::device_buffer<unsigned> sink(1);
  SPECDEC_CUDA_CHECK(cudaMemsetAsync(buffer.data(), 1, words * 16, stream));
  int device = 0, sms = 0;
  SPECDEC_CUDA_CHECK(cudaGetDevice(&device));
  SPECDEC_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  auto const read = [&] {
    read_words_kernel<<<static_cast<unsigned>(sms * 8), 256, 0, stream>>>(buffer.data(), words,
                                                                          sink.data());
  };
  read();
  double best = 1e30;
  for (int i = 0; i < 5; ++i) best = std::min(best, time_launches(read, stream));
  return static_cast<double>(words * 16) / best;
}

// Random weights of the TinyLlama-1.1B shape (dim 2048, hidden 5632, 22 layers, 32 heads over 4
// kv heads, vocabulary 32000, untied classifier): uniform in [-0.035, 0.035] (std 0.02), norms 1;
// generated once per process.
inline std::shared_ptr<specdec::llama_weights const> tinyllama() {
  static std::shared_ptr<specdec::llama_weights const> cached;
  if (cached) return cached;
  specdec::llama_config c;
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
  auto w = std::make_shared<specdec::llama_weights>();
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

// Runs the timed loop of a Google Benchmark state with manual time, then sets the counters:
// us (per launch), floor_us (the copy yardstick), x_floor (ratio) and GB/s of the bytes read.
template <class F>
void run(benchmark::State& state, F const& launch, std::size_t bytes_read, cudaStream_t stream) {
  launch();
  SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream));
  double total = 0.0;
  std::int64_t n = 0;
  for (auto _ : state) {
    double const t = time_launches(launch, stream);
    state.SetIterationTime(t);
    total += t;
    ++n;
  }
  double const floor = copy_floor(bytes_read, stream);
  double const mean = total / static_cast<double>(n);
  state.counters["us"] = mean * 1e6;
  state.counters["floor_us"] = floor * 1e6;
  state.counters["x_floor"] = mean / floor;
  state.counters["GB/s"] = static_cast<double>(bytes_read) / mean * 1e-9;
}

// Uploads a host vector to a new device buffer.
template <class T>
specdec::cuda::device_buffer<T> upload(std::vector<T> const& v) {
  specdec::cuda::device_buffer<T> d(std::max<std::size_t>(v.size(), 1));
  d.upload(std::span<T const>(v));
  SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

// Logits: N(0, 2) plus (peaked) a few large spikes per row, or (flat) N(0, 0.1).
inline std::vector<float> logits(std::size_t rows, std::size_t vocab, bool peaked,
                                 std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, peaked ? 2.0f : 0.1f);
  std::vector<float> out(rows * vocab);
  for (auto& v : out) v = normal(gen);
  if (peaked) {
    std::uniform_int_distribution<std::size_t> pick(0, vocab - 1);
    for (std::size_t r = 0; r < rows; ++r)
      for (int s = 0; s < 3; ++s)
        out[r * vocab + pick(gen)] += 10.0f + 3.0f * static_cast<float>(s);
  }
  return out;
}

}  // namespace bench_cuda
