#pragma once
//! \file
//! `sparse_kv_proposer`: self-speculation over a bounded view of the target's own cache, the
//! StreamingLLM draft of MagicDec (Sadhukhan et al., arXiv 2408.11049) and the draft-cache idea of
//! TriForce (Sun et al., arXiv 2404.11912). The draft is the target itself, every layer of it, run
//! through the target handle the decoder gives it (core/target_handle.hpp), but each draft token
//! attends to a fixed budget of cache positions -- `sinks` leading positions (attention sinks) and
//! the most recent ones, the window -- instead of the whole context (`forward_request::view`).
//! Where the cache is long (large batch x context), loading it dominates a decode step: verifying
//! k tokens costs about one step, while a draft step reads a bounded cache, so the draft gets
//! cheaper relative to the target as the context grows, and its acceptance stays high (MagicDec
//! reports about 0.8 with a budget of 512 from 4K to 100K tokens).
//!
//! The view moves with the sequence (rolling eviction): at each draft forward the window is the
//! last positions of the cache, the committed tokens and the drafts fed so far, so verified tokens
//! enter it and rejected ones leave it with the target's rollback. Positions are absolute: the
//! kept keys keep the rotation of the position they were cached at and the draft's queries use
//! their own positions, as the target's do; nothing is re-rotated. The committed entries the draft
//! reads are the target's own (written by the verification forward), so after a fully accepted
//! step the next draft feeds only the root.
//!
//! Drafting, the confidence cutoff and the adaptive draft length are those of
//! `draft_model_proposer` (propose/chain_drafter.hpp); the draft length adapts by default. A
//! budget that covers the whole context makes the draft the target itself: every greedy draft is
//! accepted. The target must declare `supports_kv_view` (`cpu_llama` does).

#include <cstddef>
#include <span>
#include <utility>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/target_handle.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/propose/chain_drafter.hpp"

namespace specdec {

//! Configuration of `sparse_kv_proposer`.
struct sparse_kv_config {
  //! Leading cache positions always in the draft's view (StreamingLLM's attention sinks; 16 as
  //! MagicDec's reference).
  std::size_t sinks = 16;
  //! Cache positions in the draft's view in all: the sinks and a window of the most recent ones
  //! (> sinks).
  std::size_t budget = 512;
  //! Draft length, adaptivity and confidence cutoff (adaptive by default).
  draft_model_config draft = {.k = 4, .adaptive = true, .k_min = 1, .k_max = 8};

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    SPECDEC_CHECK(budget > sinks, invalid_argument, "sparse_kv_config: budget ", budget,
                  " must exceed sinks ", sinks, " (the window holds budget - sinks positions)");
    draft.validate();
  }
};

//! Self-speculative drafting with the target over a bounded view of its cache (see the file
//! comment). Any decoder runs it with any target that declares `supports_kv_view`; a batch decoder
//! runs one per request (`per_request_proposer`), each on its own slot.
//!
//! \tparam Policy a `sampling_policy` for the draft rows; owned.
//! \tparam Mode   greedy candidates or sampled drafts with q rows.
template <sampling_policy Policy, draft_mode Mode = draft_mode::greedy>
class sparse_kv_proposer {
 public:
  static constexpr bool produces_trees = false;                       //!< always a chain
  static constexpr bool samples_drafts = Mode == draft_mode::sample;  //!< q rows when sampling
  static constexpr bool uses_target = true;      //!< drafts through `propose_context::target`
  static constexpr bool views_target_kv = true;  //!< with `forward_request::view`

  //! Throws `errc::invalid_argument` for an invalid configuration.
  sparse_kv_proposer(sparse_kv_config config, Policy policy)
      : config_((config.validate(), config)),
        drafter_(config.draft, std::move(policy),
                 {.sinks = config.sinks, .window = config.budget - config.sinks}) {}

  //! Starts a sequence (see `proposer`).
  void begin(std::span<token_id const> prompt) { drafter_.begin(prompt); }
  //! Drafts a chain of at most min(current k, ctx.max_nodes) tokens under ctx.tokens.back() on
  //! `ctx.target`. Throws `errc::invalid_argument` without one.
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(ctx.target != nullptr && ctx.target->valid(), invalid_argument,
                  "sparse_kv_proposer: no target in the propose context (a decoder gives one to "
                  "proposers that declare uses_target)");
    drafter_.propose(*ctx.target, ctx, tree);
  }
  //! Adapts k to the outcome.
  void accept(verify_result const& result) { drafter_.accept(result); }

  //! The configuration (validated).
  [[nodiscard]] sparse_kv_config const& config() const noexcept { return config_; }
  //! The draft length of the next step (before the context and max_nodes limits).
  [[nodiscard]] std::size_t current_k() const noexcept { return drafter_.current_k(); }
  //! The node budget: the longest chain one `propose` can draft (k_max when adaptive, else k).
  [[nodiscard]] std::size_t max_nodes() const noexcept { return drafter_.max_nodes(); }
  //! [vocab] the draft's logits after the last token it was fed.
  [[nodiscard]] std::span<float const> last_logits() const { return drafter_.last_logits(); }

 private:
  sparse_kv_config config_;
  detail::chain_drafter<target_handle const, Policy, Mode> drafter_;
};

}  // namespace specdec
