#pragma once
//! \file
//! Per-step and per-request statistics of speculative decoding.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace specdec {

//! What happened in one propose -> score -> verify -> commit step. `request_stats::add` sums the
//! phase seconds of a step given to it; the library's decoders time the phases per request
//! instead (back to back, one tick-counter read per boundary, so each phase includes the
//! bookkeeping around its call and together they cover the decode loop's wall time) and write the
//! totals into `request_stats` when the request ends, leaving these per-step fields at 0.
struct step_stats {
  std::size_t tree_size = 0;     //!< draft nodes proposed (root excluded)
  std::size_t tree_depth = 0;    //!< deepest draft node
  std::size_t aux_tokens = 0;    //!< auxiliary tokens scored beside the tree (auxiliary_proposer)
  std::size_t accepted = 0;      //!< draft tokens accepted
  std::size_t emitted = 0;       //!< tokens committed this step (accepted + bonus, after stops)
  double propose_seconds = 0.0;  //!< time in the proposer
  double score_seconds = 0.0;    //!< time in the target forward
  double verify_seconds = 0.0;   //!< time in the verifier
  double commit_seconds = 0.0;   //!< time committing (cache compaction, proposer update)
};

//! Statistics accumulated over one request.
struct request_stats {
  std::size_t prompt_tokens = 0;
  std::size_t generated = 0;   //!< tokens emitted after the prompt
  std::size_t steps = 0;       //!< decode steps (one target scoring forward each)
  std::size_t drafted = 0;     //!< draft nodes proposed over all steps
  std::size_t accepted = 0;    //!< draft tokens accepted over all steps
  std::size_t aux_tokens = 0;  //!< auxiliary tokens scored beside the trees over all steps
  std::size_t max_tree_size = 0;
  //! accepted_at_depth[d] counts steps whose accepted path reached depth d + 1;
  //! drafted_at_depth[d] counts steps whose tree reached depth d + 1. Their ratio is the
  //! acceptance rate at depth d + 1 given that depth was drafted.
  std::vector<std::size_t> accepted_at_depth;
  std::vector<std::size_t> drafted_at_depth;
  double prefill_seconds = 0.0;
  double propose_seconds = 0.0;
  double score_seconds = 0.0;
  double verify_seconds = 0.0;
  double commit_seconds = 0.0;
  double total_seconds = 0.0;  //!< wall time of the whole request, prefill included

  //! Adds one step.
  void add(step_stats const& s) {
    ++steps;
    drafted += s.tree_size;
    accepted += s.accepted;
    aux_tokens += s.aux_tokens;
    generated += s.emitted;
    max_tree_size = std::max(max_tree_size, s.tree_size);
    if (drafted_at_depth.size() < s.tree_depth) drafted_at_depth.resize(s.tree_depth, 0);
    if (accepted_at_depth.size() < s.tree_depth) accepted_at_depth.resize(s.tree_depth, 0);
    for (std::size_t d = 0; d < s.tree_depth; ++d) ++drafted_at_depth[d];
    for (std::size_t d = 0; d < s.accepted && d < accepted_at_depth.size(); ++d)
      ++accepted_at_depth[d];
    propose_seconds += s.propose_seconds;
    score_seconds += s.score_seconds;
    verify_seconds += s.verify_seconds;
    commit_seconds += s.commit_seconds;
  }

  //! Mean tokens committed per step (accepted + 1): the speedup bound if drafting were free.
  [[nodiscard]] double mean_accepted_length() const noexcept {
    return steps == 0 ? 0.0 : static_cast<double>(accepted + steps) / static_cast<double>(steps);
  }
  //! Fraction of drafted nodes accepted.
  [[nodiscard]] double acceptance_rate() const noexcept {
    return drafted == 0 ? 0.0 : static_cast<double>(accepted) / static_cast<double>(drafted);
  }
  //! Mean draft nodes per step.
  [[nodiscard]] double mean_tree_size() const noexcept {
    return steps == 0 ? 0.0 : static_cast<double>(drafted) / static_cast<double>(steps);
  }
  //! Generated tokens per second of wall time (prefill included).
  [[nodiscard]] double tokens_per_second() const noexcept {
    return total_seconds <= 0.0 ? 0.0 : static_cast<double>(generated) / total_seconds;
  }
};

}  // namespace specdec
