#pragma once
//! \file
//! `per_request_proposer`: a `batch_proposer` made of one single-sequence `proposer` per request,
//! each made by a factory when its request starts. What proposers without a model need in a batch:
//! prompt lookup (each request indexes its own text), REST (each request's proposer holds a
//! `shared_ptr` to the one read-only datastore, which it only reads, so any number of them share
//! it safely), Jacobi and lookahead (their auxiliary tokens and observations are forwarded), and
//! learned heads (Medusa, Hydra, EAGLE: the hidden rows each request's proposer reads are that
//! request's; a proposer whose head runner keeps per-sequence state, as EAGLE's KV cache, gets a
//! runner of its own per request, see `owning_proposer`). Each request's drafts are exactly those
//! of its proposer alone. A proposer that drafts with the target (`uses_target`, layer-skip) gets
//! the handle on its own request's slot in its context.

#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/core/auxiliary_batch.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"

namespace specdec {

//! One `Proposer` per request (see the file comment). Its capabilities are `Proposer`'s.
//! \tparam Proposer a `proposer`.
template <proposer Proposer>
class per_request_proposer : public proposer_traits<Proposer> {  // its capabilities are Proposer's
  static constexpr bool has_max_nodes = requires(Proposer const& p) {
    { p.max_nodes() } -> std::convertible_to<std::size_t>;
  };

 public:
  //! Makes the proposer of a request from its prompt.
  using factory = std::function<Proposer(std::span<token_id const> prompt)>;

  //! Proposers made by `make` -- called as make(prompt), or make() when it takes no argument --
  //! once per request, and once here with an empty prompt for the node budget (`max_nodes()`).
  //! Throws `errc::invalid_argument` for an empty factory.
  template <class Make>
  requires std::is_invocable_r_v<Proposer, Make&, std::span<token_id const>> ||
      std::is_invocable_r_v<Proposer, Make&>
  explicit per_request_proposer(Make make) {
    if constexpr (std::is_same_v<Make, factory> || std::is_same_v<Make, std::function<Proposer()>>)
      SPECDEC_CHECK(static_cast<bool>(make), invalid_argument, "per_request_proposer: no factory");
    if constexpr (std::is_invocable_r_v<Proposer, Make&, std::span<token_id const>>)
      make_ = std::move(make);
    else
      make_ = [m = std::move(make)](std::span<token_id const>) mutable { return m(); };
    if constexpr (has_max_nodes || needs_target_hidden_v<Proposer>) {
      Proposer const probe = make_({});
      if constexpr (has_max_nodes) max_nodes_ = probe.max_nodes();
      std::span<std::int32_t const> const layers = specdec::target_hidden_layers(probe);
      layers_.assign(layers.begin(), layers.end());
    }
  }

  //! Starts the request in `slot` with a new proposer.
  void begin(std::size_t slot, std::span<token_id const> prompt) {
    if (slot >= proposers_.size()) proposers_.resize(slot + 1);
    proposers_[slot].emplace(make_(prompt));
    proposers_[slot]->begin(prompt);
  }

  //! Each item's proposer drafts its tree; a proposer that throws fails its item alone.
  void propose(std::span<batch_propose_item> items) {
    for (batch_propose_item& item : items) {
      try {
        at(item.slot).propose(item.ctx, *item.tree);
      } catch (...) {
        item.error = std::current_exception();
      }
    }
  }

  //! The request in `slot`'s proposer appends its auxiliary tokens (`auxiliary_proposer`).
  void auxiliary(std::size_t slot, propose_context const& ctx, draft_tree const& tree,
                 auxiliary_batch& aux) requires has_auxiliary_tokens_v<Proposer> {
    at(slot).auxiliary(ctx, tree, aux);
  }
  //! The request in `slot`'s proposer observes its step's rows (`auxiliary_proposer`).
  void observe(std::size_t slot, matrix_view<float const> tree_logits,
               matrix_view<float const> aux_logits,
               verify_result const& result) requires has_auxiliary_tokens_v<Proposer> {
    at(slot).observe(tree_logits, aux_logits, result);
  }

  //! The request in `slot` accepts its step's outcome.
  void accept(std::size_t slot, verify_result const& result) { at(slot).accept(result); }

  //! The target layers whose residual streams every request's proposer reads (`Proposer`'s
  //! `target_hidden_layers()`, read from a proposer made at construction; empty: the final hidden
  //! state).
  [[nodiscard]] std::span<std::int32_t const> target_hidden_layers() const noexcept requires
      needs_target_hidden_v<Proposer> {
    return layers_;
  }

  //! Drops the request in `slot`'s proposer.
  void end(std::size_t slot) {
    if (slot < proposers_.size()) proposers_[slot].reset();
  }

  //! The node budget of one request's step: `Proposer::max_nodes()` (read from a proposer made at
  //! construction); only when `Proposer` declares one.
  [[nodiscard]] std::size_t max_nodes() const noexcept requires has_max_nodes { return max_nodes_; }

  //! The proposer of the request in `slot` (throws `errc::invalid_argument` when none).
  [[nodiscard]] Proposer& at(std::size_t slot) {
    SPECDEC_CHECK(slot < proposers_.size() && proposers_[slot].has_value(), invalid_argument,
                  "per_request_proposer: no request in slot ", slot);
    return *proposers_[slot];
  }

 private:
  factory make_;
  std::size_t max_nodes_ = 0;
  std::vector<std::int32_t> layers_;                // target_hidden_layers()
  std::vector<std::optional<Proposer>> proposers_;  // [slot]
};

//! A proposer with the runner it drives, owned together: what a `per_request_proposer` factory
//! returns when each request needs a runner of its own (an EAGLE head runner keeps its
//! sequence's KV cache). The runner lives on the heap, so the proposer's reference to it survives
//! moves. Forwards every member of `Proposer` and its capabilities.
//! \tparam Runner   the runner type (e.g. `cpu_eagle_head`).
//! \tparam Proposer a `proposer` made from a `Runner&` (e.g. `eagle_proposer<cpu_eagle_head>`).
template <class Runner, proposer Proposer>
class owning_proposer : public proposer_traits<Proposer> {  // its capabilities are Proposer's
 public:
  //! Owns `runner` (not null) and the proposer `make(*runner)`. Throws `errc::invalid_argument`
  //! for a null runner.
  template <class Make>
  requires std::is_invocable_r_v<Proposer, Make&, Runner&> owning_proposer(
      std::unique_ptr<Runner> runner, Make make)
      : runner_(checked(std::move(runner))), proposer_(make(*runner_)) {}

  void begin(std::span<token_id const> prompt) { proposer_.begin(prompt); }  //!< as Proposer
  void propose(propose_context const& ctx, draft_tree& tree) {               //!< as Proposer
    proposer_.propose(ctx, tree);
  }
  void accept(verify_result const& result) { proposer_.accept(result); }  //!< as Proposer
  //! As Proposer (auxiliary proposers).
  void auxiliary(propose_context const& ctx, draft_tree const& tree,
                 auxiliary_batch& aux) requires has_auxiliary_tokens_v<Proposer> {
    proposer_.auxiliary(ctx, tree, aux);
  }
  //! As Proposer (auxiliary proposers).
  void observe(matrix_view<float const> tree_logits, matrix_view<float const> aux_logits,
               verify_result const& result) requires has_auxiliary_tokens_v<Proposer> {
    proposer_.observe(tree_logits, aux_logits, result);
  }
  //! As Proposer, when it declares one.
  [[nodiscard]] std::size_t max_nodes() const requires requires(Proposer const& p) {
    { p.max_nodes() } -> std::convertible_to<std::size_t>;
  }
  { return proposer_.max_nodes(); }
  //! As Proposer (its `target_hidden_layers()`, or none).
  [[nodiscard]] std::span<std::int32_t const> target_hidden_layers() const {
    return specdec::target_hidden_layers(proposer_);
  }

  [[nodiscard]] Proposer& get() noexcept { return proposer_; }  //!< the proposer
  [[nodiscard]] Runner& runner() noexcept { return *runner_; }  //!< its runner

 private:
  static std::unique_ptr<Runner> checked(std::unique_ptr<Runner> r) {
    SPECDEC_CHECK(r != nullptr, invalid_argument, "owning_proposer: null runner");
    return r;
  }

  std::unique_ptr<Runner> runner_;
  Proposer proposer_;
};

}  // namespace specdec
