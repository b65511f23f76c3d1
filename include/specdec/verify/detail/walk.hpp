#pragma once
//! \file
//! The walks of the verifiers over a draft tree: the greedy walk, and the sampling walk shared by
//! the lossless sampling verifiers (`speculative_sampling_verifier`, `tree_verifier`) with its
//! row sources, per-node history or policy state and scratch (`sampling_verifier_core`).
//! Internals, not API.
//!
//! RNG contract, shared by every verifier (greedy.hpp, speculative_sampling.hpp,
//! tree_sampling.hpp, typical_acceptance.hpp) and by the device kernels: for a tree of n nodes, a
//! verifier reads word offset() + j, j >= 1, for the acceptance test of node j (when its rule
//! draws for that test) and word offset() + 0 for the final draw (the residual or bonus token),
//! and reads no other word; then it advances `rng` by exactly n, whatever the outcome, so that a
//! decoder's stream stays aligned whichever verifier runs (and with the device kernels). On error
//! `rng` is unchanged. Each verifier's header says which of these words it reads. Every final
//! draw follows the draw rule of sampling/draw.hpp.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/sampling/draw.hpp"
#include "specdec/verify/detail/checks.hpp"

namespace specdec::detail {

//! The committed history followed by the path to a node: what a penalty-aware policy sees when it
//! scores that node's row. Grows geometrically, so it stops allocating once warm.
class path_history {
 public:
  //! Starts a new tree over `committed` (every committed token, the root last) whose paths are
  //! at most `max_depth` tokens long; reserves room for the longest one (geometric growth).
  void reset(token_history committed, std::size_t max_depth) {
    committed_ = committed;
    copied_ = false;
    std::size_t const need = committed.size() + max_depth;
    if (max_depth > 0 && buf_.capacity() < need) buf_.reserve(std::max<std::size_t>(2 * need, 256));
  }

  //! `committed` followed by the tokens of the path to `node` (root excluded, node included). It
  //! is checked when `committed` is: the path's tokens are checked by `check_inputs`.
  [[nodiscard]] token_history at(draft_tree const& tree, node_index node) {
    if (node == 0) return committed_;
    std::span<token_id const> const committed = committed_.tokens();
    std::size_t const base = committed.size();
    std::size_t const depth = static_cast<std::size_t>(tree.depth(node));
    if (!copied_) {
      buf_.assign(committed.begin(), committed.end());
      copied_ = true;
    }
    buf_.resize(base + depth);
    for (node_index a = node; a > 0; a = tree.parent(a))
      buf_[base + static_cast<std::size_t>(tree.depth(a)) - 1] = tree.token(a);
    std::span<token_id const> const path(buf_.data(), base + depth);
    return committed_.is_checked() ? token_history::checked(path) : token_history(path);
  }

 private:
  token_history committed_;
  std::vector<token_id> buf_;
  bool copied_ = false;
};

//! The incremental states of a policy along the paths of one tree (`incremental_policy`): the
//! root's is `policy.begin(committed)`, a node's is its parent's advanced by the node's token, each
//! computed once, when the walk first asks for it. So a stateful policy (a grammar) costs one
//! `begin` per tree and one `advance` per node the walk reaches, never a re-run of the history.
//! The storage is kept between trees (states are copy-assigned into it), so a warm walk allocates
//! only what copying a state allocates.
template <incremental_policy Policy>
class path_states {
 public:
  using state_type = typename Policy::state_type;

  //! Starts a new tree over `committed` (every committed token, the root last).
  void reset(Policy const& policy, token_history committed, draft_tree const& tree) {
    policy_ = &policy;
    committed_ = committed;
    ready_.assign(tree.size(), 0);
    if (states_.size() < tree.size()) states_.resize(tree.size());
  }

  //! The policy's state after `committed` and the path to `node` (root excluded, node included).
  [[nodiscard]] state_type const& at(draft_tree const& tree, node_index node) {
    auto const i = static_cast<std::size_t>(node);
    if (!ready_[i]) {
      if (node == 0) {
        states_[0] = policy_->begin(committed_);
      } else {
        state_type const& parent = at(tree, tree.parent(node));
        states_[i] = parent;
        policy_->advance(*states_[i], tree.token(node));
      }
      ready_[i] = 1;
    }
    return *states_[i];
  }

  //! This thread's instance (verifiers are not templates of the policy; each is used by one
  //! thread at a time, and a walk finishes before the next starts).
  [[nodiscard]] static path_states& local() {
    thread_local path_states states;
    return states;
  }

 private:
  Policy const* policy_ = nullptr;
  token_history committed_;
  std::vector<std::optional<state_type>> states_;
  std::vector<char> ready_;
};

//! Runs `walk(path)` with what `policy` reads per node: its incremental states along the tree's
//! paths (`path_states`) when it has them, else `plain`, the committed history extended by each
//! path.
template <class Policy, class Walk>
void with_paths(Policy const& policy, token_history committed, draft_tree const& tree,
                path_history& plain, Walk&& walk) {
  if constexpr (incremental_policy<Policy>) {
    path_states<Policy>& states = path_states<Policy>::local();
    states.reset(policy, committed, tree);
    walk(states);
  } else {
    plain.reset(committed, static_cast<std::size_t>(tree.max_depth()));
    walk(plain);
  }
}

//! Row source for the logits entry points: the policy's distribution of row `node` (from the
//! history extended by the path to the node, or the policy's state there: `Paths`), written into
//! `buf`.
template <class Policy, class Paths>
struct policy_rows {
  //! q rows are validated where the walk uses them (the whole tree is not re-read).
  static constexpr bool check_q = true;
  draft_tree const& tree;
  matrix_view<float const> logits;  //!< [tree.size(), vocab], row-major
  Policy const& policy;
  Paths& history;

  std::span<float const> operator()(node_index node, std::span<float> buf) const {
    policy.distribution(logits.row(static_cast<std::size_t>(node)), history.at(tree, node), buf);
    return std::span<float const>(buf.data(), buf.size());
  }
};

//! Row source for the probability entry points: row `node` as given.
struct given_rows {
  //! The probability entry points trust q rows beyond the values they read.
  static constexpr bool check_q = false;
  matrix_view<float const> probs;  //!< [tree.size(), vocab], row-major

  std::span<float const> operator()(node_index node, std::span<float> /*buf*/) const noexcept {
    return probs.row(static_cast<std::size_t>(node));
  }
};

//! Greedy walk: from the root, accept the first child whose token is the policy's greedy token
//! of the current row; the bonus is the greedy token where no child matches. One
//! `greedy_token` call per walked row; no distribution is written.
template <class Policy, class Paths>
void greedy_walk(char const* who, draft_tree const& tree, matrix_view<float const> logits,
                 Policy const& policy, Paths& history, verify_result& out) {
  std::size_t const vocab = logits.cols();
  node_index node = 0;
  for (;;) {
    std::span<float const> const row = logits.row(static_cast<std::size_t>(node));
    token_id const g = policy.greedy_token(row, history.at(tree, node));
    check_policy_token(g, vocab, who, node);
    SPECDEC_CHECK(std::isfinite(row[static_cast<std::size_t>(g)]), numerical, who,
                  ": the target logit of the greedy token ", g, " at node ", node, " is ",
                  row[static_cast<std::size_t>(g)]);
    node_index const child = tree.find_child(node, g);
    if (child < 0) {
      out.tokens.push_back(g);
      return;
    }
    out.accepted_nodes.push_back(child);
    out.tokens.push_back(g);
    node = child;
  }
}

//! Greedy walk over probability rows (argmax of each row, ties to the lowest id).
inline void greedy_walk_probs(char const* who, draft_tree const& tree,
                              matrix_view<float const> probs, verify_result& out) {
  node_index node = 0;
  for (;;) {
    std::span<float const> const row = probs.row(static_cast<std::size_t>(node));
    std::size_t best = 0;
    float best_v = row[0];
    for (std::size_t i = 1; i < row.size(); ++i) {
      if (row[i] > best_v) {
        best_v = row[i];
        best = i;
      }
    }
    SPECDEC_CHECK(std::isfinite(best_v) && best_v > 0.0f, numerical, who,
                  ": the target distribution at node ", node, " has maximum ", best_v,
                  " (NaN/Inf entries or no mass)");
    auto const g = static_cast<token_id>(best);
    node_index const child = tree.find_child(node, g);
    out.tokens.push_back(g);
    if (child < 0) return;
    out.accepted_nodes.push_back(child);
    node = child;
  }
}

//! The uniforms at `rng.offset() + delta` (`philox::uniform_at`), keeping the last Philox block
//! computed: a walk reads words offset + 0 and offset + j of the children it tests, which share
//! few blocks.
class uniform_reader {
 public:
  explicit uniform_reader(philox const& rng) noexcept : rng_(rng) {}
  //! `rng.uniform_at(delta)`.
  [[nodiscard]] float at(std::uint64_t delta) noexcept {
    return word_to_uniform(kept_.word(rng_.seed(), rng_.stream(), rng_.offset() + delta));
  }

 private:
  philox const& rng_;
  philox_kept_block kept_;
};

//! Scratch that a sampling walk owns; sized once per vocabulary.
struct walk_scratch {
  std::vector<float> work;         //!< [vocab] a distribution row or a residual
  std::vector<token_id> rejected;  //!< rejected sibling tokens (point-mass mode), ascending

  void prepare(std::size_t vocab, std::size_t nodes) {
    if (work.size() != vocab) work.assign(vocab, 0.0f);
    if (rejected.capacity() < nodes) rejected.reserve(nodes);
  }
};

//! The sampling walk shared by `speculative_sampling_verifier` and `tree_verifier`.
//!
//! From the root, with p the target distribution of the current node:
//! - with q rows (children drawn i.i.d. from q = q_row(node)), each child x in insertion order is
//!   accepted iff p(x) > 0 and (p(x) >= q(x) or u * q(x) < p(x)), u the uniform of its node's
//!   word; on rejection p becomes norm(max(p - q, 0)) (unchanged when that has no mass); when all
//!   children are rejected the token is drawn from max(p - q, 0) of the last p (p if no mass);
//! - without q rows (point masses), with m the mass not yet rejected (1, minus p(x) of each
//!   rejected child), each child x is accepted iff p(x) > 0 and (p(x) >= m or u * m < p(x)); when
//!   all are rejected the token is drawn from p with the rejected tokens removed;
//! - when a child is accepted the walk moves to it; at a leaf the bonus is drawn from p.
template <class Source>
void sampling_walk(char const* who, draft_tree const& tree, Source const& rows, philox const& rng,
                   walk_scratch& scratch, verify_result& out) {
  std::span<float> const work(scratch.work);
  uniform_reader uniforms(rng);
  float const u0 = uniforms.at(0);
  node_index node = 0;
  for (;;) {
    std::span<float const> cur = rows(node, work);
    node_index child = tree.first_child(node);
    if (child < 0) {
      out.tokens.push_back(draw_from(cur, u0, who, node));
      return;
    }
    node_index accepted = -1;
    if (tree.has_q()) {
      std::span<float const> const q = tree.q_row(node);
      if constexpr (Source::check_q) check_q_row(q, who, node);
      for (; child >= 0; child = tree.next_sibling(child)) {
        token_id const x = tree.token(child);
        float const px = cur[static_cast<std::size_t>(x)];
        float const qx = q[static_cast<std::size_t>(x)];
        check_probability(px, who, "the target probability", node, x);
        check_probability(qx, who, "the draft probability", node, x);
        float const u = uniforms.at(static_cast<std::uint64_t>(child));
        if (px > 0.0f && (px >= qx || u * qx < px)) {
          accepted = child;
          break;
        }
        if (tree.next_sibling(child) < 0) {
          out.tokens.push_back(draw_residual(cur, q, u0, who, node));
          return;
        }
        cur = residual_update(cur, q, work, who, node);
      }
    } else {
      float mass = 1.0f;
      scratch.rejected.clear();
      for (; child >= 0; child = tree.next_sibling(child)) {
        token_id const x = tree.token(child);
        float const px = cur[static_cast<std::size_t>(x)];
        check_probability(px, who, "the target probability", node, x);
        float const u = uniforms.at(static_cast<std::uint64_t>(child));
        if (px > 0.0f && (px >= mass || u * mass < px)) {
          accepted = child;
          break;
        }
        mass -= px;
        auto const pos = std::lower_bound(scratch.rejected.begin(), scratch.rejected.end(), x);
        if (pos == scratch.rejected.end() || *pos != x) scratch.rejected.insert(pos, x);
      }
      if (accepted < 0) {
        token_id t = draw_excluding(cur, scratch.rejected, u0, who, node);
        if (t == no_token) {
          // Only rounding can get here: the children covered all of p's mass, so the last
          // rejected child with p > 0 held what was left; it is the token.
          for (node_index c = tree.first_child(node); c >= 0; c = tree.next_sibling(c))
            if (cur[static_cast<std::size_t>(tree.token(c))] > 0.0f) t = tree.token(c);
          SPECDEC_CHECK(t != no_token, numerical, who, ": the target distribution at node ", node,
                        " has no mass");
        }
        out.tokens.push_back(t);
        return;
      }
    }
    out.accepted_nodes.push_back(accepted);
    out.tokens.push_back(tree.token(accepted));
    node = accepted;
  }
}

//! The state and the entry points of the lossless sampling verifiers
//! (`speculative_sampling_verifier`, `tree_verifier`): a greedy policy takes `greedy_walk`, any
//! other `sampling_walk` over the policy's distributions; probability rows take `sampling_walk`
//! directly. Each call checks the inputs, verifies, and advances `rng` by tree.size().
class sampling_verifier_core {
 public:
  //! Verifies `tree` against `target_logits` ([tree.size(), vocab], row-major) under `policy`.
  template <sampling_policy Policy>
  void verify(char const* who, draft_tree const& tree, matrix_view<float const> target_logits,
              Policy const& policy, token_history history, philox& rng, verify_result& out) {
    check_inputs(who, tree, target_logits.rows(), target_logits.cols());
    check_history(who, tree, history);
    prepare(tree, target_logits.cols(), out);
    with_paths(policy, history, tree, history_, [&](auto& paths) {
      if (policy.is_greedy()) {
        greedy_walk(who, tree, target_logits, policy, paths, out);
      } else {
        policy_rows<Policy, std::remove_reference_t<decltype(paths)>> const rows{
            tree, target_logits, policy, paths};
        sampling_walk(who, tree, rows, rng, scratch_, out);
      }
    });
    rng.skip(tree.size());
  }

  //! Verifies `tree` against target distribution rows `target_probs` ([tree.size(), vocab],
  //! row-major).
  void verify_probs(char const* who, draft_tree const& tree, matrix_view<float const> target_probs,
                    philox& rng, verify_result& out) {
    check_inputs(who, tree, target_probs.rows(), target_probs.cols());
    prepare(tree, target_probs.cols(), out);
    sampling_walk(who, tree, given_rows{target_probs}, rng, scratch_, out);
    rng.skip(tree.size());
  }

 private:
  void prepare(draft_tree const& tree, std::size_t vocab, verify_result& out) {
    prepare_result(tree, out);
    scratch_.prepare(vocab, tree.size());
  }

  path_history history_;
  walk_scratch scratch_;
};

}  // namespace specdec::detail
