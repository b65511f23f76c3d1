#pragma once
//! \file
//! `layer_skip_proposer`: self-speculation (Zhang et al., "Draft & Verify", ACL 2024). The draft
//! is the target itself with some layers skipped: a second model instance built from the same
//! shared weights, with its own KV cache, and `forward_request::skip_layers` set in every draft
//! forward. No extra weights, the same vocabulary by construction.
//!
//! Drafting, rollback, the confidence cutoff and the adaptive draft length are those of
//! `draft_model_proposer` (see propose/draft_model.hpp); here the draft length adapts by default,
//! since how far a layer-skipped model agrees with the full one varies a lot along a sequence.
//!
//! Which layers to skip is the main knob: skipping more makes drafting cheaper and acceptance
//! lower. Middle and late layers usually matter least; the first layer and the last one matter
//! most. The skip set must be the same for every forward of the draft instance (its cache holds
//! the K/V of the layers that run, only).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/propose/draft_model.hpp"

namespace specdec {

//! Configuration of `layer_skip_proposer`.
struct layer_skip_config {
  //! Layers (0-based) the draft skips; any order, duplicates ignored; each must be a layer of the
  //! model.
  std::vector<std::int32_t> skip_layers;
  //! Draft length, adaptivity and confidence cutoff (adaptive by default).
  draft_model_config draft = {.k = 4, .adaptive = true, .k_min = 1, .k_max = 8};
};

//! Self-speculative drafting with a layer-skipped instance of the target model.
//!
//! \tparam Model  a `causal_lm` that honours `forward_request::skip_layers`; the proposer owns its
//!                draft instance, built from the constructor's trailing arguments (for the CPU
//!                backend: the same `std::shared_ptr<llama_weights const>` as the target, and
//!                options), so the weights are shared and the cache is its own.
//! \tparam Policy a `sampling_policy` for the draft rows; owned.
//! \tparam Mode   greedy candidates or sampled drafts with q rows.
template <causal_lm Model, sampling_policy Policy, draft_mode Mode = draft_mode::greedy>
class layer_skip_proposer {
 public:
  static constexpr bool produces_trees = false;                       //!< always a chain
  static constexpr bool samples_drafts = Mode == draft_mode::sample;  //!< q rows when sampling
  static constexpr bool needs_target_hidden = false;                  //!< runs on tokens only

  //! A proposer whose draft instance is `Model(model_args...)`. Throws `errc::invalid_argument`
  //! for a negative layer, a layer beyond the model's (when the model has `n_layers()`; other
  //! models report it at the first draft forward) or an invalid draft configuration.
  template <class... ModelArgs>
  requires std::constructible_from<Model, ModelArgs&&...> layer_skip_proposer(
      layer_skip_config config, Policy policy, ModelArgs&&... model_args)
      : model_(std::forward<ModelArgs>(model_args)...),
        drafter_(config.draft, std::move(policy), normalise(std::move(config.skip_layers))) {
    if constexpr (requires(Model const& m) {
                    { m.n_layers() } -> std::convertible_to<std::size_t>;
                  }) {
      std::span<std::int32_t const> const layers = drafter_.skip_layers();
      SPECDEC_CHECK(layers.empty() || static_cast<std::size_t>(layers.back()) < model_.n_layers(),
                    invalid_argument, "layer_skip_proposer: skip layer ",
                    layers.empty() ? 0 : layers.back(), " is beyond the model's ",
                    model_.n_layers(), " layers");
    }
  }

  //! Starts a sequence (see `proposer`).
  void begin(std::span<token_id const> prompt) { drafter_.begin(model_, prompt); }
  //! Drafts a chain of at most min(current k, ctx.max_nodes) tokens under ctx.tokens.back().
  void propose(propose_context const& ctx, draft_tree& tree) {
    drafter_.propose(model_, ctx, tree);
  }
  //! Rolls the draft cache back to the accepted tokens and adapts k.
  void accept(verify_result const& result) { drafter_.accept(model_, result); }

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
  //! Positions held in the draft instance's cache.
  [[nodiscard]] std::size_t cached_positions() const noexcept { return drafter_.cached(); }
  //! [vocab] the draft's logits after the last token it was fed.
  [[nodiscard]] std::span<float const> last_logits() const { return drafter_.last_logits(); }
  //! The draft instance.
  [[nodiscard]] Model& model() noexcept { return model_; }

 private:
  static std::vector<std::int32_t> normalise(std::vector<std::int32_t> layers) {
    std::sort(layers.begin(), layers.end());
    layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
    SPECDEC_CHECK(layers.empty() || layers.front() >= 0, invalid_argument,
                  "layer_skip_proposer: skip layer ", layers.empty() ? 0 : layers.front(),
                  " is negative");
    return layers;
  }

  Model model_;
  detail::chain_drafter<Model, Policy, Mode> drafter_;
};

}  // namespace specdec
