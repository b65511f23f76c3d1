#pragma once
//! \file
//! Sampling on the device with the semantics of sampling/policy.hpp's `sampler`, step for step:
//! logit bias and penalties (process_logits.cuh), the policy's distribution (distribution.cuh),
//! then the inverse-CDF draw with the row's Philox word offset + 0 (advancing by one).
//!
//! `launch_sample` runs the whole pipeline; plain temperature sampling skips the distribution row
//! and draws straight from the logits (row statistics over several blocks per row, then the walk
//! of walk.cuh over root-only trees); greedy sampling takes the greedy walk. `sampling_workspace`
//! holds the scratch of these launchers and of the verification launchers (verify.cuh).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/distribution.cuh"
#include "specdec/backend/cuda/greedy_walk.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/process_logits.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/backend/cuda/walk.cuh"
#include "specdec/backend/cuda/walk_common.cuh"
#include "specdec/core/types.hpp"

namespace specdec::cuda {

#if defined(__CUDACC__)

//! Device scratch for `launch_sample` and the verification launchers: the draw workspace, a work
//! row per row (processed logits / distributions), root-only trees for sampling, and the
//! penalty counts (allocated on first use).
class sampling_workspace {
 public:
  //! Scratch for up to `max_rows` rows (and sequences) of `vocab` entries.
  sampling_workspace(std::int32_t vocab, std::int32_t max_rows)
      : draw_(vocab, max_rows, max_rows), vocab_(vocab), max_rows_(max_rows) {
    auto const rows = static_cast<std::size_t>(max_rows);
    work_.resize(rows * static_cast<std::size_t>(vocab));
    zeros_.resize(rows);
    zeros_.zero();
    accepted_.resize(rows);
    num_accepted_.resize(rows);
    flags_.resize(rows);
    SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
  }

  //! The draw scratch.
  [[nodiscard]] draw_scratch const& draw() const noexcept { return draw_.scratch(); }
  //! [max_rows, vocab] work rows.
  [[nodiscard]] float* work() noexcept { return work_.data(); }
  //! [max_rows] zero tokens (root-only trees).
  [[nodiscard]] token_id const* zeros() const noexcept { return zeros_.data(); }
  //! [max_rows] scratch outputs.
  [[nodiscard]] std::int32_t* accepted() noexcept { return accepted_.data(); }
  [[nodiscard]] std::int32_t* num_accepted() noexcept { return num_accepted_.data(); }
  //! [max_rows] per-row flags scratch.
  [[nodiscard]] std::int32_t* row_flags() noexcept { return flags_.data(); }
  //! Zeroed [slots, vocab] counts for the penalties (allocated on first use).
  [[nodiscard]] std::int32_t* counts(std::int32_t& slots) {
    if (counts_.empty()) {
      counts_slots_ = std::min<std::int32_t>(max_rows_, 2 * draw_.scratch().multiprocessors);
      counts_.resize(static_cast<std::size_t>(counts_slots_) * static_cast<std::size_t>(vocab_));
      counts_.zero();
      SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
    }
    slots = counts_slots_;
    return counts_.data();
  }
  [[nodiscard]] std::int32_t vocab() const noexcept { return vocab_; }
  [[nodiscard]] std::int32_t max_rows() const noexcept { return max_rows_; }

 private:
  draw_workspace draw_;
  std::int32_t vocab_;
  std::int32_t max_rows_;
  device_buffer<float> work_;
  device_buffer<token_id> zeros_;
  device_buffer<std::int32_t> accepted_;
  device_buffer<std::int32_t> num_accepted_;
  device_buffer<std::int32_t> flags_;
  device_buffer<std::int32_t> counts_;
  std::int32_t counts_slots_ = 0;
};

//! Inputs of `launch_sample`: one token per row.
struct sample_params {
  float const* logits = nullptr;  //!< [rows, stride] on the device
  std::int64_t stride = 0;
  std::int32_t rows = 0;
  std::int32_t vocab = 0;
  token_id const* history = nullptr;         //!< [cu_history[rows]] per-row histories, or null
  std::int32_t const* cu_history = nullptr;  //!< [rows + 1], or null
  rng_state* rng = nullptr;                  //!< [rows] one word read (offset + 0), advanced by 1
  token_id* tokens = nullptr;                //!< [rows] out
  std::int32_t* error_flags = nullptr;       //!< [rows] (or null), zeroed by the caller
};

//! Samples one token per row with `policy` (as `sampler::distribution` then `sampler::sample`).
inline launch_status launch_sample(sample_params const& p, device_policy const& policy,
                                   sampling_workspace& ws, cudaStream_t stream) {
  if (p.rows == 0) return {};
  if (p.logits == nullptr || p.rows < 0 || p.vocab <= 0 || p.stride < p.vocab || p.rng == nullptr ||
      p.tokens == nullptr)
    return fail(status::invalid_argument, "launch_sample: parameters");
  if (p.rows > ws.max_rows() || p.vocab != ws.vocab())
    return fail(status::out_of_range, "launch_sample: workspace too small");
  ragged_layout const layout = ragged_layout::padded(p.rows, 1);
  float const* z = p.logits;
  std::int64_t z_stride = p.stride;
  launch_status st;
  if (policy.processing()) {
    process_params pp;
    pp.logits = p.logits;
    pp.stride = p.stride;
    pp.out = ws.work();
    pp.out_stride = p.vocab;
    pp.layout = layout;
    pp.vocab = p.vocab;
    pp.policy = policy;
    pp.history = p.history;
    pp.cu_history = p.cu_history;
    if (policy.penalties() && p.cu_history != nullptr) pp.counts = ws.counts(pp.count_slots);
    pp.error_flags = p.error_flags;
    st = launch_process_logits(pp, stream);
    if (!st.ok()) return st;
    z = ws.work();
    z_stride = p.vocab;
  }
  walk_params w;
  w.layout = layout;
  w.vocab = p.vocab;
  w.tokens = ws.zeros();
  w.rng = p.rng;
  w.num_accepted = ws.num_accepted();
  w.accepted_nodes = ws.accepted();
  w.out_tokens = p.tokens;
  w.error_flags = p.error_flags;
  w.scratch = ws.draw();
  if (policy.greedy) {
    w.plan = plan_chunks(p.vocab, p.rows, w.scratch.multiprocessors);
    w.target = z;
    w.target_stride = z_stride;
    return launch_greedy_walk(w, stream);
  }
  // Temperature, top-k, top-p, min-p and the draw in one launch (pivot_sampling.cuh); the work
  // rows hold the rows that do not fit in shared memory.
  pivot_params q;
  q.z = z;
  q.z_stride = z_stride;
  q.rows = p.rows;
  q.vocab = p.vocab;
  q.policy = policy;
  q.policy.num_bias = 0;  // applied above
  q.policy.repetition_penalty = 1.0f;
  q.policy.frequency_penalty = 0.0f;
  q.policy.presence_penalty = 0.0f;
  q.probs = ws.work();
  q.probs_stride = p.vocab;
  q.rng = p.rng;
  q.tokens = p.tokens;
  q.error_flags = p.error_flags;
  return launch_pivot_sample(q, stream);
}

#endif  // __CUDACC__

}  // namespace specdec::cuda
