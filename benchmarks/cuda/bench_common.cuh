#pragma once
// Shared pieces of the CUDA benchmarks: CUDA-event timing of a batch of back-to-back launches,
// and the yardstick measured in the same run: a device-to-device copy of the bytes a kernel must
// read.

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "specdec/backend/cuda/common.cuh"

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
