#pragma once
//! \file
//! `hydra_proposer`: Hydra (Ankner et al., 2024). Like Medusa's, its heads read the target's last
//! hidden state, but they are sequentially dependent: the head drafting depth d + 1 also reads the
//! token embeddings of the path drafted so far (the root and depths 1..d), so the candidates under
//! different nodes of one depth come from different rankings. The tree's shape is a
//! `sparse_tree` (propose/sparse_tree.hpp) as for Medusa.
//!
//! Each step: h = the last row of `propose_context::target_hidden`; for each depth d, head d runs
//! once for all the nodes of depth d that have children (one batched call through the
//! `hydra_heads_runner`, which also holds the target's token embedding), and each such node's
//! children take the ranks the tree lists of its own ranking. Candidates are point masses, pruned
//! to the step's node budget by estimated path probability as in `medusa_proposer`.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/propose/sparse_tree.hpp"

namespace specdec {

//! What computes Hydra heads for `hydra_proposer`:
//! - `num_heads()`, `hidden_size()`, `vocab_size()`: as for `medusa_heads_runner`;
//! - `run(head, hidden, paths, logits)` writes into `logits` [n, vocab] the logits of head `head`
//!   for the n drafted paths `paths` [n, head + 1] (row r: the root, then the tokens at depths
//!   1..head), all after the hidden row `hidden` [hidden_size]. The runner looks the tokens up in
//!   the target's embedding itself (it holds the target's weights, wherever they live), and one
//!   call per depth lets it stream the head's weights once for every node of the depth.
template <class R>
concept hydra_heads_runner = requires(R& r, R const& cr, std::size_t head,
                                      std::span<float const> hidden,
                                      matrix_view<token_id const> paths,
                                      matrix_view<float> logits) {
  { cr.num_heads() } -> std::convertible_to<std::size_t>;
  { cr.hidden_size() } -> std::convertible_to<std::size_t>;
  { cr.vocab_size() } -> std::convertible_to<std::size_t>;
  r.run(head, hidden, paths, logits);
};

//! Drafts sparse candidate trees with Hydra heads (see the file comment).
//!
//! \tparam Runner a `hydra_heads_runner`; held by reference, it must outlive the proposer.
template <hydra_heads_runner Runner>
class hydra_proposer {
 public:
  static constexpr bool produces_trees = true;       //!< a tree of candidates per step
  static constexpr bool samples_drafts = false;      //!< deterministic candidates, no q rows
  static constexpr bool needs_target_hidden = true;  //!< the heads read the target's hidden row

  //! A proposer drafting `tree` with the heads of `runner`. Throws `errc::invalid_argument` when
  //! the tree is deeper than the heads or uses ranks beyond the vocabulary.
  hydra_proposer(Runner& runner, sparse_tree tree) : runner_(&runner), tree_(std::move(tree)) {
    std::size_t const heads = runner.num_heads(), vocab = runner.vocab_size();
    detail::check_tree_depth(tree_, heads, "hydra_proposer");
    std::size_t const n = tree_.size();
    // Per expanded node: the ranks its children need; per depth: its expanded nodes.
    child_ranks_.assign(n + 1, 0);
    for (std::size_t i = 1; i <= n; ++i) {
      auto const p = static_cast<std::size_t>(tree_.parent(i));
      child_ranks_[p] = std::max(child_ranks_[p], static_cast<std::size_t>(tree_.rank(i)) + 1);
    }
    levels_.assign(tree_.depth(), {});
    std::size_t widest = 0;
    for (std::size_t i = 0; i <= n; ++i) {
      if (!tree_.expanded(i)) continue;
      SPECDEC_CHECK(child_ranks_[i] <= vocab, invalid_argument,
                    "hydra_proposer: the tree uses rank ", child_ranks_[i] - 1, " under node ", i,
                    ", beyond the vocabulary of ", vocab);
      auto& level = levels_[static_cast<std::size_t>(tree_.depth(i))];
      level.push_back(i);
      widest = std::max(widest, level.size());
      ranks_per_row_ = std::max(ranks_per_row_, child_ranks_[i]);
    }
    logits_.resize(widest * vocab);
    paths_.resize(widest * (tree_.depth() + 1));
    ranked_.resize(widest * ranks_per_row_);
    tokens_.resize(n + 1);
    log_prob_.resize(n + 1);
    first_child_.assign(n + 1, 0);
    for (std::size_t i = n; i >= 1; --i)
      first_child_[static_cast<std::size_t>(tree_.parent(i))] = i;
  }

  //! Starts a sequence (the heads keep no state between steps).
  void begin(std::span<token_id const> /*prompt*/) noexcept {}

  //! Resets `tree` to the root ctx.tokens.back() and drafts the sparse tree, depth by depth, from
  //! the heads on the last row of ctx.target_hidden; at most min(ctx.max_nodes, tree.capacity() -
  //! 1) nodes. Drafts nothing without a hidden row. Errors as `medusa_proposer::propose`.
  void propose(propose_context const& ctx, draft_tree& tree) {
    std::size_t budget = 0;
    std::span<float const> const hidden = detail::start_heads_step(
        ctx, tree, tree_, runner_->hidden_size(), budget, "hydra_proposer");
    if (hidden.empty()) return;
    std::size_t const vocab = runner_->vocab_size();
    bool const prune = budget < tree_.size();
    tokens_[0] = ctx.tokens.back();
    log_prob_[0] = 0.0;
    for (std::size_t d = 0; d < levels_.size(); ++d) {
      std::vector<std::size_t> const& level = levels_[d];
      std::size_t const m = level.size();
      // Row r: the path of level[r], root first.
      matrix_view<token_id> const paths(paths_.data(), m, d + 1);
      for (std::size_t r = 0; r < m; ++r) {
        std::size_t node = level[r];
        for (std::size_t j = d + 1; j-- > 0;) {
          paths(r, j) = tokens_[node];
          node = static_cast<std::size_t>(std::max(tree_.parent(node), 0));
        }
      }
      matrix_view<float> const logits(logits_.data(), m, vocab);
      runner_->run(d, hidden, paths, logits);
      for (std::size_t r = 0; r < m; ++r) {
        std::size_t const parent = level[r];
        std::span<token_id> const ranked =
            std::span<token_id>(ranked_).subspan(r * ranks_per_row_, ranks_per_row_);
        detail::top_ranks(logits.row(r), child_ranks_[parent], ranked, "hydra_proposer");
        double const normalizer = prune ? detail::log_sum_exp(logits.row(r)) : 0.0;
        for (std::size_t c = first_child_[parent];
             c != 0 && c <= tree_.size() && static_cast<std::size_t>(tree_.parent(c)) == parent;
             ++c) {
          token_id const t = ranked[static_cast<std::size_t>(tree_.rank(c))];
          tokens_[c] = t;
          if (prune)
            log_prob_[c] = log_prob_[parent] +
                           static_cast<double>(logits(r, static_cast<std::size_t>(t))) - normalizer;
        }
      }
    }
    writer_.write(tree_, tokens_, log_prob_, budget, tree);
  }

  //! Nothing to roll back: the heads keep no state between steps.
  void accept(verify_result const& /*result*/) noexcept {}

  //! The node budget: the sparse tree's drafted nodes.
  [[nodiscard]] std::size_t max_nodes() const noexcept { return tree_.size(); }
  //! The tree drafted each step.
  [[nodiscard]] sparse_tree const& shape() const noexcept { return tree_; }

 private:
  Runner* runner_;
  sparse_tree tree_;
  std::vector<std::size_t> child_ranks_;          // [size + 1] ranks the children of a node use
  std::vector<std::vector<std::size_t>> levels_;  // [depth] the expanded nodes of each depth
  std::vector<std::size_t> first_child_;          // [size + 1] first child (0: none)
  std::size_t ranks_per_row_ = 0;                 // the most ranks any node's children use
  std::vector<float> logits_;                     // [widest level, vocab]
  std::vector<token_id> paths_;                   // [widest level, depth + 1]
  std::vector<token_id> ranked_;                  // [widest level, ranks_per_row]
  std::vector<token_id> tokens_;                  // [size + 1] the token of every tree node
  std::vector<double> log_prob_;                  // [size + 1] estimated log path probability
  detail::sparse_tree_writer writer_;
};

//! Measures the rank accuracies of Hydra heads on a sequence the target produced itself (see
//! `measure_medusa_accuracy`), teacher-forced: at position s head i reads the path tokens[s + 1 ..
//! s + i + 1] (the root is the target's own next token) and should predict tokens[s + i + 2]. The
//! accuracy of head i is thus conditional on the path before it being right.
template <hydra_heads_runner Runner>
void measure_hydra_accuracy(Runner& runner, matrix_view<float const> hidden,
                            std::span<token_id const> tokens, head_accuracy& accuracy) {
  std::size_t const heads = std::min(runner.num_heads(), accuracy.heads());
  detail::check_measure_inputs(hidden, tokens, runner.hidden_size(), "measure_hydra_accuracy");
  std::vector<float> logits(runner.vocab_size());
  std::vector<token_id> path;
  for (std::size_t i = 0; i < heads; ++i) {
    for (std::size_t s = 0; s + i + 2 < tokens.size(); ++s) {
      path.assign(tokens.begin() + static_cast<std::ptrdiff_t>(s + 1),
                  tokens.begin() + static_cast<std::ptrdiff_t>(s + i + 2));
      runner.run(i, hidden.row(s), matrix_view<token_id const>(path.data(), 1, i + 1),
                 matrix_view<float>(logits.data(), 1, logits.size()));
      accuracy.add(i, logits, tokens[s + i + 2]);
    }
  }
}

}  // namespace specdec
