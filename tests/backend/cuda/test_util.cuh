#pragma once
// Helpers shared by the CUDA tests: device checks, uploads, random rows, and the "decision
// margin" that tells a genuine disagreement from one that sits within float rounding of its
// threshold.

#include "support/doctest.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"

namespace cuda_test {

using specdec::token_id;

// SPECDEC_CUDA_QUICK=1 (used for the compute-sanitizer runs, which are slow) restricts the size
// sweeps to the smaller vocabularies and batches; the full sweep runs without it.
inline bool quick() {
  char const* v = std::getenv("SPECDEC_CUDA_QUICK");
  return v != nullptr && v[0] == '1';
}
// The vocabularies and batch sizes of the sweeps.
inline std::vector<std::size_t> vocabs() {
  return quick() ? std::vector<std::size_t>{111, 32000}
                 : std::vector<std::size_t>{111, 32000, 128256};
}
inline std::vector<std::size_t> batches() {
  return quick() ? std::vector<std::size_t>{1, 7} : std::vector<std::size_t>{1, 7, 64};
}

// Fails the test (does not skip) when no CUDA device is usable.
inline void require_device() {
  int count = 0;
  cudaError_t const e = cudaGetDeviceCount(&count);
  REQUIRE_MESSAGE(
      (e == cudaSuccess && count > 0),
      "no usable CUDA device (cudaGetDeviceCount: " << std::string(cudaGetErrorString(e)) << ")");
}

template <class T>
specdec::cuda::device_buffer<T> upload(std::vector<T> const& host) {
  specdec::cuda::device_buffer<T> d(std::max<std::size_t>(host.size(), 1));
  d.upload(std::span<T const>(host));
  SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

template <class T>
std::vector<T> download(specdec::cuda::device_buffer<T> const& d, std::size_t n,
                        T const& fill = T{}) {
  std::vector<T> host(n, fill);
  d.download(std::span<T>(host));
  return host;
}

// Logits rows: N(0, scale) plus, for "peaked" rows, a few large spikes.
inline std::vector<float> random_logits(std::size_t rows, std::size_t vocab, std::uint32_t seed,
                                        float scale, bool peaked) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_int_distribution<std::size_t> pick(0, vocab - 1);
  std::vector<float> out(rows * vocab);
  for (auto& v : out) v = normal(gen);
  if (peaked) {
    for (std::size_t r = 0; r < rows; ++r)
      for (int s = 0; s < 3; ++s) out[r * vocab + pick(gen)] += 8.0f + 4.0f * static_cast<float>(s);
  }
  return out;
}

// Draw-side margin: how far u * total lies from the boundaries of token t in the running sums of
// w (double), relative to total. Small = within rounding.
template <class W>
double draw_margin(std::size_t vocab, W const& w, float u, token_id t) {
  double total = 0.0;
  for (std::size_t i = 0; i < vocab; ++i) total += std::max(0.0, static_cast<double>(w(i)));
  if (!(total > 0.0) || t < 0) return 0.0;
  double before = 0.0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(t); ++i)
    before += std::max(0.0, static_cast<double>(w(i)));
  double const after = before + std::max(0.0, static_cast<double>(w(static_cast<std::size_t>(t))));
  double const target = static_cast<double>(u) * total;
  return std::min(std::abs(target - before), std::abs(after - target)) / total;
}

// Acceptance-side margin of the test "accept iff p > 0 and (p >= q or u q < p)": relative distance
// of u q from p (0 when p is within rounding of q or of u q).
inline double accept_margin(float p, float q, float u) {
  if (!(p > 0.0f)) return 1.0;
  double const uq = static_cast<double>(u) * static_cast<double>(q);
  double const m1 =
      std::abs(static_cast<double>(p) - static_cast<double>(q)) / static_cast<double>(p);
  double const m2 = std::abs(static_cast<double>(p) - uq) / static_cast<double>(p);
  return std::min(m1, m2);
}

// The smallest decision margin along the host's sampling walk (verify/common.hpp semantics) given
// the target distribution rows p (one per node, as the host policy computes them).
inline double walk_margin(specdec::draft_tree const& tree, std::vector<std::vector<float>> const& p,
                          specdec::philox const& rng, specdec::verify_result const& host) {
  double margin = 1.0;
  float const u0 = rng.uniform_at(0);
  std::size_t const vocab = p[0].size();
  specdec::node_index node = 0;
  std::vector<float> cur = p[0];
  std::size_t step = 0;
  for (;;) {
    specdec::node_index child = tree.first_child(node);
    if (child < 0) {
      margin = std::min(margin,
                        draw_margin(
                            vocab, [&](std::size_t i) { return cur[i]; }, u0, host.tokens.back()));
      return margin;
    }
    specdec::node_index accepted = -1;
    float mass = 1.0f;
    std::vector<token_id> rejected;
    for (; child >= 0; child = tree.next_sibling(child)) {
      token_id const x = tree.token(child);
      float const px = cur[static_cast<std::size_t>(x)];
      float const u = rng.uniform_at(static_cast<std::uint64_t>(child));
      if (tree.has_q()) {
        float const qx = tree.q_row(node)[static_cast<std::size_t>(x)];
        margin = std::min(margin, accept_margin(px, qx, u));
        if (px > 0.0f && (px >= qx || u * qx < px)) {
          accepted = child;
          break;
        }
        auto const q = tree.q_row(node);
        if (tree.next_sibling(child) < 0) {
          margin = std::min(margin, draw_margin(
                                        vocab,
                                        [&](std::size_t i) {
                                          float const d = cur[i] - q[i];
                                          return d < 0.0f ? 0.0f : d;
                                        },
                                        u0, host.tokens.back()));
          return margin;
        }
        double total = 0.0;
        for (std::size_t i = 0; i < vocab; ++i) total += std::max(0.0f, cur[i] - q[i]);
        if (total > 0.0)
          for (std::size_t i = 0; i < vocab; ++i)
            cur[i] = std::max(0.0f, cur[i] - q[i]) * static_cast<float>(1.0 / total);
      } else {
        margin = std::min(margin, accept_margin(px, mass, u));
        if (px > 0.0f && (px >= mass || u * mass < px)) {
          accepted = child;
          break;
        }
        mass -= px;
        rejected.push_back(x);
      }
    }
    if (accepted < 0) {
      margin = std::min(margin, draw_margin(
                                    vocab,
                                    [&](std::size_t i) {
                                      return std::find(rejected.begin(), rejected.end(),
                                                       static_cast<token_id>(i)) != rejected.end()
                                                 ? 0.0f
                                                 : cur[i];
                                    },
                                    u0, host.tokens.back()));
      return margin;
    }
    // Follow the host's path where it went (so a later margin is meaningful).
    if (step < host.accepted_nodes.size()) accepted = host.accepted_nodes[step];
    ++step;
    node = accepted;
    cur = p[static_cast<std::size_t>(node)];
  }
}

// Whether two verify results agree exactly.
inline bool same_result(specdec::verify_result const& a, specdec::verify_result const& b) {
  return a.accepted_nodes == b.accepted_nodes && a.tokens == b.tokens;
}

}  // namespace cuda_test
