#pragma once
//! \file
//! `cuda::step_verifier`: a `verifier` that walks one sequence's draft tree on the device, for the
//! speculative decoder's loop. It takes the target rows where they are: device rows
//! (`cuda::device_rows`, what `cuda_llama::forward(req, cuda_forward_result&)` leaves on the
//! device: the decoder then never copies a logits row) or host rows (uploaded with the tree).
//!
//! One step costs one upload and one download, whatever the tree: the tree (tokens and parents),
//! the generator, the draft's q rows when it has them, the history when the policy's penalties read
//! it, and host rows when given, are staged in pinned memory and sent in one copy; the outcome
//! (flags, accepted count, generator, accepted nodes, emitted tokens) comes back in one copy,
//! after which the verifier waits for its stream (the only wait of a step). Buffers grow with the
//! largest tree seen, then a step allocates nothing.
//!
//! The decisions are the device walk's (verify.cuh): greedy verification when the policy is
//! greedy, else the sampling walk (chains and trees, with or without q rows), which replicates
//! the host verifiers up to rounding at a threshold. Run it on the target model's stream
//! (`cuda_llama::stream()`), so that the rows it reads are complete without a wait.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/forward_result.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/sampling.cuh"
#include "specdec/backend/cuda/verify.cuh"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/sampling/params.hpp"

namespace specdec {

class greedy;

namespace cuda {

//! Where each part of a step's staging lies (byte offsets into one buffer, the same on the host
//! and the device). The upload covers [0, upload_end), the download [download_begin, end).
struct step_layout {
  std::size_t cu = 0, tokens = 0, parents = 0, hist_cu = 0, history = 0, q = 0, rows = 0;
  std::size_t rng = 0, flags = 0, num = 0, nodes = 0, out = 0, end = 0;
  std::size_t upload_end = 0, download_begin = 0;

  //! The layout for a tree of `n` nodes over rows of `vocab`, with `history` tokens staged, q rows
  //! when `with_q`, host rows when `host_rows`.
  [[nodiscard]] static constexpr step_layout of(std::size_t n, std::size_t vocab,
                                                std::size_t history, bool with_q,
                                                bool host_rows) noexcept {
    auto const align = [](std::size_t at, std::size_t a) { return (at + a - 1) / a * a; };
    step_layout l;
    std::size_t at = 0;
    auto take = [&](std::size_t bytes, std::size_t a) {
      at = align(at, a);
      std::size_t const r = at;
      at += bytes;
      return r;
    };
    l.cu = take(2 * sizeof(std::int32_t), 16);
    l.tokens = take(n * sizeof(token_id), 4);
    l.parents = take(n * sizeof(std::int32_t), 4);
    l.hist_cu = take(2 * sizeof(std::int32_t), 4);
    l.history = take(history * sizeof(token_id), 4);
    l.q = take(with_q ? n * vocab * sizeof(float) : 0, 16);
    l.rows = take(host_rows ? n * vocab * sizeof(float) : 0, 16);
    l.rng = take(sizeof(philox), 16);
    l.flags = take(sizeof(std::int32_t), 4);
    l.upload_end = at;
    l.download_begin = l.rng;
    l.num = take(sizeof(std::int32_t), 4);
    l.nodes = take(n * sizeof(std::int32_t), 4);
    l.out = take(n * sizeof(token_id), 4);
    l.end = align(at, 16);
    return l;
  }
};

#if defined(__CUDACC__)

//! Verification of one sequence's draft tree on the device (see the file comment). Satisfies
//! `verifier<step_verifier, greedy>` and `verifier<step_verifier, sampler>`, with host rows, and
//! takes `device_rows` the same way. Lossless, trees supported, q rows used when the tree has them.
class step_verifier {
 public:
  //! A verifier for rows of `vocab` entries on `stream` (the target model's), buffers sized for
  //! trees of `max_nodes` nodes (they grow on demand).
  explicit step_verifier(std::int32_t vocab, cudaStream_t stream = nullptr,
                         std::size_t max_nodes = 64)
      : vocab_(vocab), stream_(stream) {
    SPECDEC_CHECK(vocab > 0, invalid_argument, "step_verifier: vocab ", vocab, " must be positive");
    std::size_t const n = std::max<std::size_t>(max_nodes, 1);
    ensure(n, step_layout::of(n, static_cast<std::size_t>(vocab), 0, false, false).end);
  }

  //! Verifies `tree` against its target rows `rows` on the device ([tree.size(), vocab]; row i
  //! after the path to node i) under `policy` (`greedy` or `sampler`), with `history` (the
  //! committed tokens, root last; read by the penalties only), advancing `rng` by the tree size.
  //! Throws `specdec::error` for bad shapes or a flagged sequence (then `rng` is unchanged).
  template <class Policy>
  void verify(draft_tree const& tree, device_rows rows, Policy const& policy, token_history history,
              philox& rng, verify_result& out) {
    run(tree, rows.data(), rows.rows(), rows.cols(), rows.stride(), nullptr, policy, history, rng,
        out);
  }

  //! As above with host rows, uploaded with the tree.
  template <class Policy>
  void verify(draft_tree const& tree, matrix_view<float const> rows, Policy const& policy,
              token_history history, philox& rng, verify_result& out) {
    run(tree, nullptr, rows.rows(), rows.cols(), rows.stride(), &rows, policy, history, rng, out);
  }

  //! The stream the kernels run on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

 private:
  template <class Policy>
  device_policy const& policy_of(Policy const& policy) {
    static_assert(device_supported_v<Policy>,
                  "cuda::step_verifier: this sampling policy does not declare device_supported "
                  "(core/traits.hpp); the device implements greedy and sampler's parameters");
    if constexpr (std::is_same_v<Policy, greedy>) {
      static constexpr device_policy greedy_policy{.greedy = true};
      return greedy_policy;
    } else {
      sampling_params const& p = policy.params();
      if (!sampler_ || !same(sampler_->params(), p)) sampler_ = std::make_unique<device_sampler>(p);
      return sampler_->policy();
    }
  }

  static bool same(sampling_params const& a, sampling_params const& b) noexcept {
    return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p &&
           a.min_p == b.min_p && a.repetition_penalty == b.repetition_penalty &&
           a.frequency_penalty == b.frequency_penalty && a.presence_penalty == b.presence_penalty &&
           a.penalty_last_n == b.penalty_last_n && a.logit_bias == b.logit_bias;
  }

  template <class Policy>
  void run(draft_tree const& tree, float const* device_data, std::size_t num_rows, std::size_t cols,
           std::size_t stride, matrix_view<float const> const* host_rows, Policy const& policy,
           token_history history, philox& rng, verify_result& out) {
    constexpr char const* who = "step_verifier::verify";
    std::size_t const n = tree.size();
    auto const vocab = static_cast<std::size_t>(vocab_);
    SPECDEC_CHECK(n > 0, invalid_argument, who, ": empty tree");
    SPECDEC_CHECK(num_rows >= n && cols == vocab && stride >= cols, invalid_argument, who,
                  ": rows [", num_rows, ", ", cols, "] for a tree of ", n,
                  " nodes over a vocabulary of ", vocab);
    SPECDEC_CHECK(n <= static_cast<std::size_t>(INT32_MAX / 2), out_of_range, who, ": ", n,
                  " nodes");
    device_policy const& dp = policy_of(policy);
    bool const with_q = tree.has_q() && !dp.greedy;
    if (with_q) tree.validate(vocab);
    std::span<token_id const> const hist =
        dp.penalties() ? history.tokens() : std::span<token_id const>();
    bool const host = host_rows != nullptr;
    step_layout const l = step_layout::of(n, vocab, hist.size(), with_q, host);
    ensure(n, l.end);

    // Stage.
    std::byte* h = host_.get();
    auto* cu = reinterpret_cast<std::int32_t*>(h + l.cu);
    cu[0] = 0;
    cu[1] = static_cast<std::int32_t>(n);
    auto* tokens = reinterpret_cast<token_id*>(h + l.tokens);
    auto* parents = reinterpret_cast<std::int32_t*>(h + l.parents);
    bool chain = true;  // a chain goes without parents (the launchers' one-launch chain path)
    for (std::size_t i = 0; i < n; ++i) {
      tokens[i] = tree.token(static_cast<node_index>(i));
      parents[i] = tree.parent(static_cast<node_index>(i));
      chain = chain && parents[i] == static_cast<std::int32_t>(i) - 1;
    }
    auto* hist_cu = reinterpret_cast<std::int32_t*>(h + l.hist_cu);
    hist_cu[0] = 0;
    hist_cu[1] = static_cast<std::int32_t>(hist.size());
    if (!hist.empty()) std::memcpy(h + l.history, hist.data(), hist.size() * sizeof(token_id));
    if (with_q) {
      matrix_view<float const> const q = tree.q_rows();
      for (std::size_t i = 0; i < n; ++i)
        std::memcpy(h + l.q + i * vocab * sizeof(float), q.row(i).data(), vocab * sizeof(float));
    }
    if (host)
      for (std::size_t i = 0; i < n; ++i)
        std::memcpy(h + l.rows + i * vocab * sizeof(float), host_rows->row(i).data(),
                    vocab * sizeof(float));
    std::memcpy(h + l.rng, &rng, sizeof(philox));
    *reinterpret_cast<std::int32_t*>(h + l.flags) = 0;

    std::byte* d = device_.data();
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(d, h, l.upload_end, cudaMemcpyHostToDevice, stream_));
    verify_inputs in;
    in.layout = ragged_layout::ragged(reinterpret_cast<std::int32_t const*>(d + l.cu), 1,
                                      static_cast<std::int32_t>(n), static_cast<std::int32_t>(n));
    in.vocab = vocab_;
    in.target = host ? reinterpret_cast<float const*>(d + l.rows) : device_data;
    in.target_stride = host ? static_cast<std::int64_t>(vocab) : static_cast<std::int64_t>(stride);
    in.tokens = reinterpret_cast<token_id const*>(d + l.tokens);
    in.parents = chain ? nullptr : reinterpret_cast<std::int32_t const*>(d + l.parents);
    in.q = with_q ? reinterpret_cast<float const*>(d + l.q) : nullptr;
    in.q_stride = static_cast<std::int64_t>(vocab);
    in.history = hist.empty() ? nullptr : reinterpret_cast<token_id const*>(d + l.history);
    in.cu_history = hist.empty() ? nullptr : reinterpret_cast<std::int32_t const*>(d + l.hist_cu);
    in.rng = reinterpret_cast<philox*>(d + l.rng);
    in.num_accepted = reinterpret_cast<std::int32_t*>(d + l.num);
    in.accepted_nodes = reinterpret_cast<std::int32_t*>(d + l.nodes);
    in.out_tokens = reinterpret_cast<token_id*>(d + l.out);
    in.error_flags = reinterpret_cast<std::int32_t*>(d + l.flags);
    launch_status const st = dp.greedy ? launch_verify_greedy(in, dp, *ws_, stream_)
                                       : launch_verify(in, dp, *ws_, stream_);
    throw_if_failed(st, who);
    SPECDEC_CUDA_CHECK(cudaMemcpyAsync(h + l.download_begin, d + l.download_begin,
                                       l.end - l.download_begin, cudaMemcpyDeviceToHost, stream_));
    SPECDEC_CUDA_CHECK(cudaStreamSynchronize(stream_));

    // The outcome.
    throw_if_flagged(std::span<std::int32_t const>(reinterpret_cast<std::int32_t*>(h + l.flags), 1),
                     who);
    std::int32_t const m = *reinterpret_cast<std::int32_t const*>(h + l.num);
    SPECDEC_CHECK(m >= 0 && static_cast<std::size_t>(m) < n, internal, who, ": ", m,
                  " accepted nodes of a tree of ", n);
    auto const* nodes = reinterpret_cast<std::int32_t const*>(h + l.nodes);
    auto const* emitted = reinterpret_cast<token_id const*>(h + l.out);
    out.accepted_nodes.assign(nodes, nodes + m);
    out.tokens.assign(emitted, emitted + m + 1);
    std::memcpy(&rng, h + l.rng, sizeof(philox));
  }

  // Buffers for a tree of `n` nodes and a staging of `bytes` bytes (grown, never shrunk).
  void ensure(std::size_t n, std::size_t bytes) {
    if (n > ws_rows_) {
      std::size_t const rows = std::max(n, 2 * ws_rows_);
      SPECDEC_CHECK(rows <= static_cast<std::size_t>(INT32_MAX), out_of_range,
                    "step_verifier: ", rows, " rows");
      ws_ = std::make_unique<sampling_workspace>(vocab_, static_cast<std::int32_t>(rows));
      ws_rows_ = rows;
    }
    if (bytes > host_bytes_) {
      std::size_t const size = std::max(bytes, 2 * host_bytes_);
      host_.reset();
      host_bytes_ = 0;
      device_.resize(size);
      void* p = nullptr;
      SPECDEC_CUDA_CHECK(cudaMallocHost(&p, size));
      host_.reset(static_cast<std::byte*>(p));
      host_bytes_ = size;
    }
  }

  struct free_pinned {
    void operator()(std::byte* p) const noexcept { cudaFreeHost(p); }
  };

  std::int32_t vocab_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<sampling_workspace> ws_;
  std::size_t ws_rows_ = 0;
  device_buffer<std::byte> device_;
  std::unique_ptr<std::byte, free_pinned> host_;
  std::size_t host_bytes_ = 0;
  std::unique_ptr<device_sampler> sampler_;
};

#endif  // __CUDACC__

}  // namespace cuda
}  // namespace specdec
