#pragma once
//! \file
//! `layer_skip_proposer`: self-speculation (Zhang et al., "Draft & Verify", ACL 2024). The draft
//! is the target itself with some layers skipped, run through the target handle the decoder gives
//! it (core/target_handle.hpp): no second model, no second cache, no extra weights, the same
//! vocabulary by construction. Each step feeds the root and its drafts after the target's committed
//! entries with `forward_request::skip_layers` set, so the draft attends to the full model's keys
//! and values of everything committed (in the layers it runs), and drops its own entries before the
//! step's verification forward.
//!
//! Drafting, the confidence cutoff and the adaptive draft length are those of
//! `draft_model_proposer` (propose/chain_drafter.hpp); here the draft length adapts by default,
//! since how far a layer-skipped model agrees with the full one varies a lot along a sequence.
//!
//! Which layers to skip is the main knob: skipping more makes drafting cheaper and acceptance
//! lower. Middle and late layers usually matter least; the first layer and the last one matter
//! most. A layer beyond the target's is reported by the target's forward at the first draft.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/target_handle.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/propose/chain_drafter.hpp"

namespace specdec {

//! Configuration of `layer_skip_proposer`.
struct layer_skip_config {
  //! Layers (0-based) the draft skips; any order, duplicates ignored; each must be a layer of the
  //! target.
  std::vector<std::int32_t> skip_layers;
  //! Draft length, adaptivity and confidence cutoff (adaptive by default).
  draft_model_config draft = {.k = 4, .adaptive = true, .k_min = 1, .k_max = 8};
};

//! Self-speculative drafting with the target, layers skipped (see the file comment). Any decoder
//! runs it with any target that declares `supports_skip_layers`; a batch decoder runs one per
//! request (`per_request_proposer`), each on its own slot.
//!
//! \tparam Policy a `sampling_policy` for the draft rows; owned.
//! \tparam Mode   greedy candidates or sampled drafts with q rows.
template <sampling_policy Policy, draft_mode Mode = draft_mode::greedy>
class layer_skip_proposer {
 public:
  static constexpr bool produces_trees = false;                       //!< always a chain
  static constexpr bool samples_drafts = Mode == draft_mode::sample;  //!< q rows when sampling
  static constexpr bool uses_target = true;          //!< drafts through `propose_context::target`
  static constexpr bool skips_target_layers = true;  //!< with `forward_request::skip_layers`

  //! Throws `errc::invalid_argument` for a negative layer or an invalid draft configuration.
  layer_skip_proposer(layer_skip_config config, Policy policy)
      : drafter_(config.draft, std::move(policy),
                 {.skip_layers = normalise(std::move(config.skip_layers))}) {}

  //! Starts a sequence (see `proposer`).
  void begin(std::span<token_id const> prompt) { drafter_.begin(prompt); }
  //! Drafts a chain of at most min(current k, ctx.max_nodes) tokens under ctx.tokens.back() on
  //! `ctx.target`. Throws `errc::invalid_argument` without one.
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(ctx.target != nullptr && ctx.target->valid(), invalid_argument,
                  "layer_skip_proposer: no target in the propose context (a decoder gives one to "
                  "proposers that declare uses_target)");
    drafter_.propose(*ctx.target, ctx, tree);
  }
  //! Adapts k to the outcome.
  void accept(verify_result const& result) { drafter_.accept(result); }

  //! The skipped layers, ascending.
  [[nodiscard]] std::span<std::int32_t const> skip_layers() const noexcept {
    return drafter_.skip_layers();
  }
  //! The draft length of the next step (before the context and max_nodes limits).
  [[nodiscard]] std::size_t current_k() const noexcept { return drafter_.current_k(); }
  //! The node budget: the most draft nodes (root excluded) one `propose` can draft under this
  //! configuration, the longest chain (k_max when adaptive, else k). The decoder scores at most
  //! this many nodes per step.
  [[nodiscard]] std::size_t max_nodes() const noexcept { return drafter_.max_nodes(); }
  //! [vocab] the draft's logits after the last token it was fed.
  [[nodiscard]] std::span<float const> last_logits() const { return drafter_.last_logits(); }

 private:
  static std::vector<std::int32_t> normalise(std::vector<std::int32_t> layers) {
    std::sort(layers.begin(), layers.end());
    layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
    SPECDEC_CHECK(layers.empty() || layers.front() >= 0, invalid_argument,
                  "layer_skip_proposer: skip layer ", layers.empty() ? 0 : layers.front(),
                  " is negative");
    return layers;
  }

  detail::chain_drafter<target_handle const, Policy, Mode> drafter_;
};

}  // namespace specdec
