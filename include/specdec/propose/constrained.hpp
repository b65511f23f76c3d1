#pragma once
//! \file
//! `constrained_proposer`: any proposer under an output constraint (sampling/constraint.hpp).
//! Pair it with the same constraint in the sampling policy (`constrained`), which is what keeps
//! verification exact; this wrapper only makes the drafts better:
//!
//! - forced spans (jump-forward): when every continuation of the constraint's state starts with
//!   the same bytes (`forced_bytes`: the keys and punctuation of a JSON object, the literal parts
//!   of a pattern), those bytes are tokenised (`encode`, the tokenizer's own encoding) and, cut at
//!   the first token the constraint does not allow and at the node budget, proposed as the draft
//!   instead of the wrapped proposer's. The target verifies them like any draft, so this is exact
//!   whatever the target prefers; they are accepted whenever the target's constrained choice
//!   agrees with the tokenizer's encoding of the forced text, which it nearly always does.
//!   In a tree with q rows (a sampling proposer) their q rows are one-hot: a draft from a point
//!   mass, verified exactly by speculative sampling.
//! - pruning: the wrapped proposer's draft loses every node whose path leaves the constraint (no
//!   row is scored for a token the target cannot emit). Only trees of deterministic candidates are
//!   pruned: a child drawn from q rows must stay (verification's residual depends on it), so a
//!   sampled draft is left as it is (pass the draft the constrained policy to keep it valid).
//!   The wrapped proposer's `accept` sees its own tree's node indices.
//!
//! The wrapped proposer must not read the target's hidden rows nor add auxiliary tokens (heads,
//! EAGLE, lookahead): those run under the constrained policy alone.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/sampling/constraint.hpp"

namespace specdec {

//! Configuration of `constrained_proposer`.
struct constrained_proposer_config {
  //! Propose forced spans as the draft.
  bool forced_spans = true;
  //! Most bytes of a forced span looked at per step.
  std::size_t max_forced_bytes = 128;
};

//! `Proposer` under `Constraint` (see the file comment). Owns the wrapped proposer, or refers to
//! it when `Proposer` is a reference type (`constrained_proposer<P&, C>`: the caller's proposer,
//! which must outlive this one).
template <class Proposer, constraint Constraint>
requires proposer<std::remove_cvref_t<Proposer>>
class constrained_proposer {
  using inner_type = std::remove_cvref_t<Proposer>;
  static_assert(!needs_target_hidden_v<inner_type> && !has_auxiliary_tokens_v<inner_type> &&
                    !uses_target_v<inner_type>,
                "constrained_proposer: the wrapped proposer reads the target or scores auxiliary "
                "tokens; use the constrained policy alone with it");

 public:
  //! Trees when the wrapped proposer drafts trees.
  static constexpr bool produces_trees = produces_trees_v<inner_type>;
  //! q rows when the wrapped proposer samples.
  static constexpr bool samples_drafts = samples_drafts_v<inner_type>;

  //! The bytes -> tokens function of forced spans (the tokenizer's encoding, without BOS).
  using encoder = std::function<std::vector<token_id>(std::string_view)>;

  //! `inner` under `constraint` (null: no constraint, `inner` as it is); `encode` tokenises forced
  //! spans (required when `config.forced_spans`).
  constrained_proposer(Proposer inner, std::shared_ptr<Constraint const> constraint, encoder encode,
                       constrained_proposer_config config = {})
      : inner_(std::forward<Proposer>(inner)),
        constraint_(std::move(constraint)),
        encode_(std::move(encode)),
        config_(config) {
    SPECDEC_CHECK(!config_.forced_spans || !constraint_ || static_cast<bool>(encode_),
                  invalid_argument,
                  "constrained_proposer: forced spans need an encoder (the tokenizer's encode)");
  }

  //! Starts a request: the constraint covers what follows `prompt`.
  void begin(std::span<token_id const> prompt) {
    inner_.begin(prompt);
    prefix_ = prompt.size();
    seen_ = prompt.size();
    if (constraint_) state_ = constraint_->start();
    last_forced_ = false;
  }

  //! Drafts into `tree` (see the file comment).
  void propose(propose_context const& ctx, draft_tree& tree) {
    last_forced_ = false;
    map_.clear();  // the wrapped proposer's tree is the one verified unless pruning says otherwise
    if (!constraint_) {
      inner_.propose(ctx, tree);
      return;
    }
    follow(ctx.tokens);
    if (config_.forced_spans && ctx.max_nodes > 0 && propose_forced(ctx, tree)) {
      last_forced_ = true;
      ++forced_steps_;
      return;
    }
    inner_.propose(ctx, tree);
    if (!tree.has_q()) prune(tree);
  }

  //! Passes the outcome to the wrapped proposer, in its own tree's node indices (nothing after a
  //! forced step, which it did not draft).
  void accept(verify_result const& result) {
    if (last_forced_) {
      for (node_index n : result.accepted_nodes)
        for (int kind = 0; kind < 2; ++kind)
          if ((branch_[static_cast<std::size_t>(n)] >> kind) & 1) ++followed_[kind];
      return;
    }
    if (map_.empty()) {
      inner_.accept(result);
      return;
    }
    mapped_.tokens = result.tokens;
    mapped_.accepted_nodes.clear();
    for (node_index n : result.accepted_nodes)
      mapped_.accepted_nodes.push_back(map_[static_cast<std::size_t>(n)]);
    inner_.accept(mapped_);
  }

  //! The wrapped proposer's node budget.
  [[nodiscard]] std::size_t max_nodes() const requires requires(inner_type const& p) {
    p.max_nodes();
  }
  { return inner_.max_nodes(); }

  [[nodiscard]] inner_type& inner() noexcept { return inner_; }
  [[nodiscard]] inner_type const& inner() const noexcept { return inner_; }
  //! Steps whose draft was a forced span.
  [[nodiscard]] std::size_t forced_steps() const noexcept { return forced_steps_; }
  //! Draft nodes removed by pruning.
  [[nodiscard]] std::size_t pruned_nodes() const noexcept { return pruned_; }

 private:
  //! Advances the tracked state over the tokens committed since the last step (rebuilding it
  //! from the prompt's end when the sequence was edited).
  void follow(std::span<token_id const> tokens) {
    if (tokens.size() < seen_ || !tracking_ok_) {
      state_ = constraint_->start();
      seen_ = prefix_;
      tracking_ok_ = true;
    }
    for (; seen_ < tokens.size(); ++seen_)
      if (!constraint_->advance(state_, tokens[seen_])) tracking_ok_ = false;
  }

  //! The tokens of `bytes` under the constraint from the tracked state, cut at the first token it
  //! does not allow: the encoder's tokenisation (kind 0), or one token per byte (kind 1).
  std::vector<token_id> tokenise(std::string const& bytes, int kind) const {
    std::vector<token_id> span;
    if (kind == 0) {
      span = encode_(bytes);
    } else if constexpr (requires(Constraint const& c) { c.vocabulary().single(0); }) {
      for (char b : bytes) {
        token_id const t = constraint_->vocabulary().single(static_cast<std::uint8_t>(b));
        if (t == no_token) break;
        span.push_back(t);
      }
    }
    auto s = state_;
    std::size_t n = 0;
    while (n < span.size() && constraint_->advance(s, span[n])) ++n;
    span.resize(n);
    return span;
  }

  //! Drafts the forced span: as a chain of the tokenisation that the target has followed further
  //! so far, and for a tree proposer the other one beside it (sharing their common prefix) until
  //! the target has followed one at least 8 tokens and 4 times as far, within the node budget. The
  //! target of a model never trained on the format picks small tokens; one trained on it picks its
  //! tokenizer's encoding: each is drafted where it pays.
  bool propose_forced(propose_context const& ctx, draft_tree& tree) {
    if (!tracking_ok_ || ctx.tokens.empty()) return false;
    std::string const bytes = constraint_->forced_bytes(state_, config_.max_forced_bytes);
    if (bytes.empty()) return false;
    int const first = followed_[1] > followed_[0] ? 1 : 0;
    std::size_t const lead = followed_[static_cast<std::size_t>(first)];
    std::size_t const other = followed_[static_cast<std::size_t>(1 - first)];
    // The second tokenisation rides along until the target has clearly chosen (rows cost time).
    bool const both = produces_trees && !(lead >= 8 && lead >= 4 * other);
    std::array<std::vector<token_id>, 2> spans{tokenise(bytes, first), {}};
    if (both) spans[1] = tokenise(bytes, 1 - first);
    if (spans[0].empty() && spans[1].empty()) return false;
    tree.reset(ctx.tokens.back());
    map_.clear();
    branch_.assign(1, 0);
    for (std::size_t b = 0; b < 2; ++b) {
      node_index at = 0;
      int const kind = b == 0 ? first : 1 - first;
      for (token_id t : spans[b]) {
        node_index next = tree.find_child(at, t);
        if (next < 0) {
          if (tree.size() > ctx.max_nodes) break;
          if (tree.has_q()) {
            if (tree.first_child(at) >= 0) break;  // a q row is one draw: one child per node
            std::span<float> q = tree.q_row(at);
            std::fill(q.begin(), q.end(), 0.0f);
            q[static_cast<std::size_t>(t)] = 1.0f;
          }
          next = tree.add_node(at, t);
          branch_.push_back(0);
        }
        branch_[static_cast<std::size_t>(next)] |= 1 << kind;
        at = next;
      }
    }
    return tree.size() > 1;
  }

  //! Removes the nodes whose path leaves the constraint; `map_` then holds each kept node's index
  //! in the wrapped proposer's tree (empty when nothing was removed).
  void prune(draft_tree& tree) {
    map_.clear();
    std::size_t const n = tree.size();
    if (n <= 1) return;
    states_.assign(n, state_);
    valid_.assign(n, 1);
    bool removed = false;
    for (std::size_t i = 1; i < n; ++i) {
      auto const p = static_cast<std::size_t>(tree.parent(static_cast<node_index>(i)));
      valid_[i] = valid_[p];
      states_[i] = states_[p];
      if (valid_[i] && !constraint_->advance(states_[i], tree.token(static_cast<node_index>(i))))
        valid_[i] = 0;
      removed = removed || !valid_[i];
    }
    if (!removed) return;
    copy_ = tree;
    tree.reset(copy_.token(0));
    std::vector<node_index>& index = index_;
    index.assign(n, -1);
    index[0] = 0;
    map_.assign(1, 0);
    for (std::size_t i = 1; i < n; ++i) {
      if (!valid_[i]) {
        ++pruned_;
        continue;
      }
      node_index const parent =
          index[static_cast<std::size_t>(copy_.parent(static_cast<node_index>(i)))];
      index[i] = tree.add_node(parent, copy_.token(static_cast<node_index>(i)));
      map_.push_back(static_cast<node_index>(i));
    }
  }

  Proposer inner_;
  std::shared_ptr<Constraint const> constraint_;
  encoder encode_;
  constrained_proposer_config config_;
  std::size_t prefix_ = 0;
  std::size_t seen_ = 0;
  typename Constraint::state_type state_{};
  bool tracking_ok_ = true;
  bool last_forced_ = false;
  std::size_t forced_steps_ = 0;
  std::size_t pruned_ = 0;
  std::vector<typename Constraint::state_type> states_;
  std::vector<char> valid_;
  std::vector<node_index> index_;
  std::vector<node_index> map_;  // pruned tree node -> the wrapped proposer's node
  std::vector<int> branch_;      // forced tree node -> which tokenisations pass through it
  std::array<std::size_t, 2> followed_{};  // accepted forced tokens of each tokenisation
  draft_tree copy_;
  verify_result mapped_;
};

}  // namespace specdec
