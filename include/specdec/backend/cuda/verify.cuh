#pragma once
//! \file
//! Verification on the device for ragged batches of draft trees, with the decisions of the host
//! verifiers (verify/greedy.hpp, verify/speculative_sampling.hpp, verify/tree_sampling.hpp):
//!
//! - `launch_verify_greedy`: the greedy walk (accept the child whose token is the row's argmax
//!   after logit processing; the bonus is the argmax where no child matches).
//! - `launch_verify`: the sampling walk of verify/detail/walk.hpp's `sampling_walk`: chains and
//! trees (chains of logits under a plain temperature in one launch: chain_verify.cuh)
//!   with q rows (accept iff p(x) > 0 and (p(x) >= q(x) or u q(x) < p(x)); residual
//!   max(p - q, 0)), and trees without q rows (point masses: accept iff p(x) > 0 and
//!   (p(x) >= m or u m < p(x)), m the mass not yet rejected; draw from p without the rejected
//!   tokens).
//!
//! RNG contract (the host's): for a tree of n nodes, the acceptance test of node j >= 1 reads
//! Philox word offset + j and the final (residual or bonus) draw reads word offset + 0; the state
//! then advances by n whatever the outcome (greedy reads no word and still advances by n). On a
//! flagged sequence (see `device_error`) the state is left unchanged.
//!
//! With the policy's target distribution p computed as the host computes it (row_stats.cuh,
//! process_logits.cuh and distribution.cuh replicate the float arithmetic; only double additions
//! run in a different order), the decisions are the host's except where a uniform lies within
//! rounding of a threshold.
//!
//! Layouts: rows are flattened [num_tokens, vocab] with sequence b owning rows
//! [layout.begin(b), layout.end(b)) (ragged cumulative counts), or the padded
//! [batch, k + 1, vocab] layout (`ragged_layout::padded`). `cuda_verifier` packs host
//! `draft_tree`s and returns host `verify_result`s.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/backend/cuda/chain_verify.cuh"
#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/distribution.cuh"
#include "specdec/backend/cuda/greedy_walk.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/process_logits.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/backend/cuda/sampling.cuh"
#include "specdec/backend/cuda/verify_inputs.cuh"
#include "specdec/backend/cuda/walk.cuh"
#include "specdec/backend/cuda/walk_common.cuh"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"

namespace specdec::cuda {

#if defined(__CUDACC__)

namespace detail {

inline launch_status check_verify(verify_inputs const& in, sampling_workspace const& ws,
                                  char const* what) noexcept {
  if (!in.layout.valid()) return fail(status::invalid_argument, what);
  if (in.layout.batch == 0) return {};
  if (in.vocab <= 0 || in.target == nullptr || in.target_stride < in.vocab ||
      in.tokens == nullptr || in.rng == nullptr || in.num_accepted == nullptr ||
      in.accepted_nodes == nullptr || in.out_tokens == nullptr)
    return fail(status::invalid_argument, what);
  if (in.layout.total_rows > ws.max_rows() || in.layout.batch > ws.max_rows() ||
      in.vocab != ws.vocab())
    return fail(status::out_of_range, what);
  return {};
}

inline walk_params walk_from(verify_inputs const& in, sampling_workspace const& ws) noexcept {
  walk_params w;
  w.layout = in.layout;
  w.vocab = in.vocab;
  w.target = in.target;
  w.target_stride = in.target_stride;
  w.target_is_probs = in.target_is_probs;
  w.tokens = in.tokens;
  w.parents = in.parents;
  w.q = in.q;
  w.q_stride = in.q_stride;
  w.rng = in.rng;
  w.num_accepted = in.num_accepted;
  w.accepted_nodes = in.accepted_nodes;
  w.out_tokens = in.out_tokens;
  w.error_flags = in.error_flags;
  w.scratch = ws.draw();
  return w;
}

// Bias and penalties (history + path per node) into the work rows; returns them.
inline launch_status process_for_verify(verify_inputs const& in, device_policy const& policy,
                                        sampling_workspace& ws, cudaStream_t stream,
                                        float const*& z, std::int64_t& z_stride) {
  z = in.target;
  z_stride = in.target_stride;
  if (!policy.processing() || in.target_is_probs) return {};
  process_params pp;
  pp.logits = in.target;
  pp.stride = in.target_stride;
  pp.out = ws.work();
  pp.out_stride = in.vocab;
  pp.layout = in.layout;
  pp.vocab = in.vocab;
  pp.policy = policy;
  pp.history = in.history;
  pp.cu_history = in.cu_history;
  pp.tokens = in.tokens;
  pp.parents = in.parents;
  if (policy.penalties()) pp.counts = ws.counts(pp.count_slots);
  pp.error_flags = in.error_flags;
  launch_status const st = launch_process_logits(pp, stream);
  if (!st.ok()) return st;
  z = ws.work();
  z_stride = in.vocab;
  return {};
}

}  // namespace detail

//! Greedy verification (see the file comment). Logit bias and penalties of `policy` are applied
//! (each node's row sees the history plus its path); the policy must be greedy unless the rows
//! are probabilities (then each row's argmax is its target token).
inline launch_status launch_verify_greedy(verify_inputs const& in, device_policy const& policy,
                                          sampling_workspace& ws, cudaStream_t stream) {
  launch_status st = detail::check_verify(in, ws, "launch_verify_greedy: parameters");
  if (!st.ok() || in.layout.batch == 0) return st;
  if (!in.target_is_probs && !policy.greedy)
    return fail(status::invalid_argument, "launch_verify_greedy: the policy is not greedy");
  float const* z = nullptr;
  std::int64_t z_stride = 0;
  st = detail::process_for_verify(in, policy, ws, stream, z, z_stride);
  if (!st.ok()) return st;
  walk_params w = detail::walk_from(in, ws);
  w.target = z;
  w.target_stride = z_stride;
  w.plan = plan_chunks(in.vocab, in.layout.batch, w.scratch.multiprocessors);
  return launch_greedy_walk(w, stream);
}

//! Sampling verification (chains and trees, with or without q rows; see the file comment) under
//! `policy`. Plain temperature policies draw straight from the logits (row statistics over
//! several blocks per row, then the walk); truncating (or greedy) policies first write each row's
//! distribution into the workspace.
inline launch_status launch_verify(verify_inputs const& in, device_policy const& policy,
                                   sampling_workspace& ws, cudaStream_t stream) {
  launch_status st = detail::check_verify(in, ws, "launch_verify: parameters");
  if (!st.ok() || in.layout.batch == 0) return st;
  if (in.q != nullptr && in.q_stride < in.vocab)
    return fail(status::invalid_argument, "launch_verify: q_stride");
  if (policy.greedy && !in.target_is_probs) return launch_verify_greedy(in, policy, ws, stream);
  // Chains from logits under a plain temperature: one launch (chain_verify.cuh).
  if (chain_verify_applies(in, policy)) return launch_verify_chain(in, policy, stream);
  walk_params w = detail::walk_from(in, ws);
  if (in.target_is_probs) {
    w.plan = plan_chunks(in.vocab, in.layout.batch, w.scratch.multiprocessors);
    return launch_walk_draw(w, stream);
  }
  float const* z = nullptr;
  std::int64_t z_stride = 0;
  st = detail::process_for_verify(in, policy, ws, stream, z, z_stride);
  if (!st.ok()) return st;
  if (policy.truncation()) {
    distribution_params dp;
    dp.z = z;
    dp.z_stride = z_stride;
    dp.probs = ws.work();
    dp.probs_stride = in.vocab;
    dp.rows = in.layout.total_rows;
    dp.vocab = in.vocab;
    dp.policy = policy;
    dp.row_flags = ws.row_flags();
    cudaError_t const e = cudaMemsetAsync(
        ws.row_flags(), 0, static_cast<std::size_t>(in.layout.total_rows) * sizeof(std::int32_t),
        stream);
    if (e != cudaSuccess) return launch_status{status::cuda_error, e, "launch_verify: memset"};
    st = launch_distribution(dp, stream);
    if (!st.ok()) return st;
    w.target = ws.work();
    w.target_stride = in.vocab;
    w.target_is_probs = true;
    w.plan = plan_chunks(in.vocab, in.layout.batch, w.scratch.multiprocessors);
    return launch_walk_draw(w, stream);
  }
  row_stats_params rs;
  rs.rows = z;
  rs.stride = z_stride;
  rs.num_rows = in.layout.total_rows;
  rs.vocab = in.vocab;
  rs.inv_temperature = policy.inv_temperature;
  rs.plan = plan_chunks(in.vocab, in.layout.total_rows, ws.draw().multiprocessors);
  rs.scratch = ws.draw();
  st = launch_row_stats(rs, stream);
  if (!st.ok()) return st;
  w.plan = plan_chunks(in.vocab, in.layout.batch, ws.draw().multiprocessors);
  w.stats_plan = rs.plan;
  w.target = z;
  w.target_stride = z_stride;
  w.inv_temperature = policy.inv_temperature;
  return launch_walk_draw(w, stream);
}

//! Which walk `cuda_verifier::verify` runs.
enum class verify_kind {
  greedy,    //!< `greedy_verifier`
  sampling,  //!< `speculative_sampling_verifier` (chains with q rows) / `tree_verifier`
};

//! Host-facing batch verification: packs host trees and histories, runs the kernels on target
//! rows already on the device, and returns host `verify_result`s and advanced generators. The
//! results equal the host verifiers' `verify_batch` (see the file comment for rounding).
class cuda_verifier {
 public:
  //! Buffers for up to `max_rows` tree nodes in total (and as many sequences) of `vocab` entries.
  cuda_verifier(std::int32_t vocab, std::int32_t max_rows) : ws_(vocab, max_rows) {}

  //! Verifies sequence b's tree `*trees[b]` against rows [cu(b), cu(b + 1)) of `target`
  //! ([num_tokens, stride] on the device; cu = cumulative tree sizes), with `histories[b]`
  //! (committed tokens, root last) and `rngs[b]` (advanced by the tree size). Trees either all
  //! carry q rows or none does. Throws `specdec::error` for bad shapes or flagged sequences (and
  //! then leaves every generator unchanged).
  void verify(verify_kind kind, std::span<draft_tree const* const> trees, float const* target,
              std::int64_t stride, bool target_is_probs, device_policy const& policy,
              std::span<std::span<token_id const> const> histories, std::span<philox> rngs,
              std::span<verify_result> out, cudaStream_t stream = nullptr) {
    std::size_t const batch = trees.size();
    SPECDEC_CHECK(rngs.size() == batch && out.size() == batch &&
                      (histories.empty() || histories.size() == batch),
                  invalid_argument, "cuda_verifier: ", batch, " trees, ", rngs.size(),
                  " generators, ", out.size(), " results, ", histories.size(), " histories");
    if (batch == 0) return;
    auto const vocab = static_cast<std::size_t>(ws_.vocab());
    // Pack.
    cu_.assign(1, 0);
    tokens_.clear();
    parents_.clear();
    bool const with_q = trees[0] != nullptr && trees[0]->has_q();
    std::size_t max_nodes = 0;
    for (std::size_t b = 0; b < batch; ++b) {
      draft_tree const* t = trees[b];
      SPECDEC_CHECK(t != nullptr && !t->empty(), invalid_argument, "cuda_verifier: tree ", b,
                    " is null or empty");
      SPECDEC_CHECK(t->has_q() == with_q, invalid_argument, "cuda_verifier: tree ", b,
                    with_q ? " has no q rows" : " has q rows", " unlike tree 0");
      if (with_q) t->validate(vocab);
      for (std::size_t i = 0; i < t->size(); ++i) {
        tokens_.push_back(t->token(static_cast<node_index>(i)));
        parents_.push_back(t->parent(static_cast<node_index>(i)));
      }
      max_nodes = std::max(max_nodes, t->size());
      cu_.push_back(static_cast<std::int32_t>(tokens_.size()));
    }
    std::size_t const rows = tokens_.size();
    SPECDEC_CHECK(rows <= static_cast<std::size_t>(ws_.max_rows()), out_of_range,
                  "cuda_verifier: ", rows, " nodes exceed the capacity of ", ws_.max_rows());
    hist_cu_.assign(1, 0);
    hist_.clear();
    for (std::size_t b = 0; b < batch; ++b) {
      if (!histories.empty()) hist_.insert(hist_.end(), histories[b].begin(), histories[b].end());
      hist_cu_.push_back(static_cast<std::int32_t>(hist_.size()));
    }
    ensure(rows, batch, hist_.size(), with_q);
    d_cu_.upload(std::span<std::int32_t const>(cu_), stream);
    d_tokens_.upload(std::span<token_id const>(tokens_), stream);
    d_parents_.upload(std::span<std::int32_t const>(parents_), stream);
    d_hist_cu_.upload(std::span<std::int32_t const>(hist_cu_), stream);
    if (!hist_.empty()) d_hist_.upload(std::span<token_id const>(hist_), stream);
    d_rng_.upload(std::span<philox const>(rngs.data(), batch), stream);
    SPECDEC_CUDA_CHECK(cudaMemsetAsync(d_flags_.data(), 0, batch * sizeof(std::int32_t), stream));
    if (with_q) {
      for (std::size_t b = 0; b < batch; ++b) {
        auto const q = trees[b]->q_rows();
        SPECDEC_CUDA_CHECK(cudaMemcpyAsync(d_q_.data() + static_cast<std::size_t>(cu_[b]) * vocab,
                                           q.data(), q.rows() * vocab * sizeof(float),
                                           cudaMemcpyHostToDevice, stream));
      }
    }
    verify_inputs in;
    in.layout = ragged_layout::ragged(d_cu_.data(), static_cast<std::int32_t>(batch),
                                      static_cast<std::int32_t>(rows),
                                      static_cast<std::int32_t>(max_nodes));
    in.vocab = ws_.vocab();
    in.target = target;
    in.target_stride = stride;
    in.target_is_probs = target_is_probs;
    in.tokens = d_tokens_.data();
    in.parents = d_parents_.data();
    in.q = with_q ? d_q_.data() : nullptr;
    in.q_stride = static_cast<std::int64_t>(vocab);
    in.history = hist_.empty() ? nullptr : d_hist_.data();
    in.cu_history = hist_.empty() ? nullptr : d_hist_cu_.data();
    in.rng = d_rng_.data();
    in.num_accepted = d_num_.data();
    in.accepted_nodes = d_nodes_.data();
    in.out_tokens = d_out_.data();
    in.error_flags = d_flags_.data();
    launch_status const st = kind == verify_kind::greedy
                                 ? launch_verify_greedy(in, policy, ws_, stream)
                                 : launch_verify(in, policy, ws_, stream);
    throw_if_failed(st, "cuda_verifier::verify");
    // Results.
    h_num_.resize(batch);
    h_nodes_.resize(rows);
    h_out_.resize(rows);
    h_flags_.resize(batch);
    h_rng_.resize(batch, philox(0));
    d_flags_.download(std::span<std::int32_t>(h_flags_), stream);
    throw_if_flagged(std::span<std::int32_t const>(h_flags_), "cuda_verifier::verify");
    d_num_.download(std::span<std::int32_t>(h_num_), stream);
    d_nodes_.download(std::span<std::int32_t>(h_nodes_), stream);
    d_out_.download(std::span<token_id>(h_out_), stream);
    d_rng_.download(std::span<philox>(h_rng_), stream);
    for (std::size_t b = 0; b < batch; ++b) {
      auto const first = static_cast<std::size_t>(cu_[b]);
      auto const m = static_cast<std::size_t>(h_num_[b]);
      out[b].clear();
      out[b].accepted_nodes.assign(h_nodes_.begin() + static_cast<std::ptrdiff_t>(first),
                                   h_nodes_.begin() + static_cast<std::ptrdiff_t>(first + m));
      out[b].tokens.assign(h_out_.begin() + static_cast<std::ptrdiff_t>(first),
                           h_out_.begin() + static_cast<std::ptrdiff_t>(first + m + 1));
      rngs[b] = h_rng_[b];
    }
  }

  //! The workspace (for callers that launch kernels themselves).
  [[nodiscard]] sampling_workspace& workspace() noexcept { return ws_; }

 private:
  void ensure(std::size_t rows, std::size_t batch, std::size_t history, bool with_q) {
    d_cu_.reserve(batch + 1);
    d_tokens_.reserve(rows);
    d_parents_.reserve(rows);
    d_hist_cu_.reserve(batch + 1);
    d_hist_.reserve(std::max<std::size_t>(history, 1));
    d_rng_.reserve(batch);
    d_num_.reserve(batch);
    d_nodes_.reserve(rows);
    d_out_.reserve(rows);
    d_flags_.reserve(batch);
    if (with_q) d_q_.reserve(rows * static_cast<std::size_t>(ws_.vocab()));
  }

  sampling_workspace ws_;
  std::vector<std::int32_t> cu_, parents_, hist_cu_, h_num_, h_nodes_, h_flags_;
  std::vector<token_id> tokens_, hist_, h_out_;
  std::vector<philox> h_rng_;
  device_buffer<std::int32_t> d_cu_, d_parents_, d_hist_cu_, d_num_, d_nodes_, d_flags_;
  device_buffer<token_id> d_tokens_, d_hist_, d_out_;
  device_buffer<philox> d_rng_;
  device_buffer<float> d_q_;
};

#endif  // __CUDACC__

}  // namespace specdec::cuda
