#pragma once
//! \file
//! `medusa_proposer`: Medusa (Cai et al., 2024). K small heads on the target's last hidden state
//! draft the next step's whole candidate tree with no draft model: head i ranks the candidates for
//! the token i + 1 positions after the root (tree depth i + 1), and the tree takes, at each node,
//! the ranks a `sparse_tree` lists (propose/sparse_tree.hpp).
//!
//! Each step the proposer reads the last row of `propose_context::target_hidden` (the hidden state
//! of the token before the root, which the decoder gathers from the scoring forward of the
//! previous step, so the heads cost no extra target forward), runs the heads through a
//! `medusa_heads_runner` (the backend that holds them: backend/cpu/heads.hpp,
//! backend/cuda/heads.cuh) and writes the candidate tree. The candidates are deterministic (point
//! masses): verify with `greedy_verifier`, `tree_verifier` (lossless under any sampling policy) or
//! `typical_acceptance_verifier` (lossy, opt-in). When the step's node budget is below the tree's
//! size, the nodes of highest estimated path probability are kept (the product along the path of
//! each head's softmax probability of the node's token).

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

//! What computes Medusa heads for `medusa_proposer`:
//! - `num_heads()`, `hidden_size()`, `vocab_size()`: the number of heads K, the width of the
//!   target's hidden row they read and the logits per head (the target's vocabulary), so that the
//!   proposer sizes its buffers once and checks the tree against the heads;
//! - `run(hidden, logits)` writes into `logits` [K, vocab] the logits of every head on the hidden
//!   row `hidden` [hidden_size] (row i = head i): all heads of one step in one call, so a backend
//!   can batch them and keep them on its device until the ranking.
template <class R>
concept medusa_heads_runner = requires(R& r, R const& cr, std::span<float const> hidden,
                                       matrix_view<float> logits) {
  { cr.num_heads() } -> std::convertible_to<std::size_t>;
  { cr.hidden_size() } -> std::convertible_to<std::size_t>;
  { cr.vocab_size() } -> std::convertible_to<std::size_t>;
  r.run(hidden, logits);
};

//! Drafts sparse candidate trees with Medusa heads (see the file comment).
//!
//! \tparam Runner a `medusa_heads_runner`; held by reference, it must outlive the proposer.
template <medusa_heads_runner Runner>
class medusa_proposer {
 public:
  static constexpr bool produces_trees = true;       //!< a tree of candidates per step
  static constexpr bool samples_drafts = false;      //!< deterministic candidates, no q rows
  static constexpr bool needs_target_hidden = true;  //!< the heads read the target's hidden row

  //! A proposer drafting `tree` with the heads of `runner`. Throws `errc::invalid_argument` when
  //! the tree is deeper than the heads or uses ranks beyond the vocabulary.
  medusa_proposer(Runner& runner, sparse_tree tree) : runner_(&runner), tree_(std::move(tree)) {
    std::size_t const heads = runner.num_heads(), vocab = runner.vocab_size();
    detail::check_tree_depth(tree_, heads, "medusa_proposer");
    offsets_.assign(tree_.depth() + 1, 0);
    for (std::size_t d = 0; d < tree_.depth(); ++d) {
      SPECDEC_CHECK(tree_.ranks_needed(d) <= vocab, invalid_argument,
                    "medusa_proposer: the tree uses rank ", tree_.ranks_needed(d) - 1, " of head ",
                    d, ", beyond the vocabulary of ", vocab);
      offsets_[d + 1] = offsets_[d] + tree_.ranks_needed(d);
    }
    logits_.resize(heads * vocab);
    ranked_.resize(offsets_.back());
    normalizer_.resize(tree_.depth());
    tokens_.resize(tree_.size() + 1);
    log_prob_.resize(tree_.size() + 1);
  }

  //! Starts a sequence (the heads keep no state between steps).
  void begin(std::span<token_id const> /*prompt*/) noexcept {}

  //! Resets `tree` to the root ctx.tokens.back() and drafts the sparse tree from the heads on the
  //! last row of ctx.target_hidden, at most min(ctx.max_nodes, tree.capacity() - 1) nodes. Drafts
  //! nothing when there is no hidden row (a one-token prompt's first step). Throws
  //! `errc::invalid_argument` for a hidden row of the wrong width, `errc::numerical` for NaN
  //! logits.
  void propose(propose_context const& ctx, draft_tree& tree) {
    std::size_t budget = 0;
    std::span<float const> const hidden = detail::start_heads_step(
        ctx, tree, tree_, runner_->hidden_size(), budget, "medusa_proposer");
    if (hidden.empty()) return;
    std::size_t const vocab = runner_->vocab_size();
    matrix_view<float> const logits(logits_.data(), runner_->num_heads(), vocab);
    runner_->run(hidden, logits);
    for (std::size_t d = 0; d < tree_.depth(); ++d)
      detail::top_ranks(logits.row(d), tree_.ranks_needed(d),
                        std::span<token_id>(ranked_).subspan(offsets_[d]), "medusa_proposer");
    bool const prune = budget < tree_.size();
    if (prune)
      for (std::size_t d = 0; d < tree_.depth(); ++d)
        normalizer_[d] = detail::log_sum_exp(logits.row(d));
    log_prob_[0] = 0.0;
    for (std::size_t i = 1; i <= tree_.size(); ++i) {
      auto const head = static_cast<std::size_t>(tree_.depth(i) - 1);
      token_id const t = ranked_[offsets_[head] + static_cast<std::size_t>(tree_.rank(i))];
      tokens_[i] = t;
      if (prune)
        log_prob_[i] = log_prob_[static_cast<std::size_t>(tree_.parent(i))] +
                       static_cast<double>(logits(head, static_cast<std::size_t>(t))) -
                       normalizer_[head];
    }
    writer_.write(tree_, tokens_, log_prob_, budget, tree);
  }

  //! Nothing to roll back: the heads keep no state between steps.
  void accept(verify_result const& /*result*/) noexcept {}

  //! The node budget: the sparse tree's drafted nodes.
  [[nodiscard]] std::size_t max_nodes() const noexcept { return tree_.size(); }
  //! The tree drafted each step.
  [[nodiscard]] sparse_tree const& shape() const noexcept { return tree_; }
  //! [num_heads, vocab] the heads' logits of the last step.
  [[nodiscard]] matrix_view<float const> last_logits() const {
    return matrix_view<float const>(logits_.data(), runner_->num_heads(), runner_->vocab_size());
  }

 private:
  Runner* runner_;
  sparse_tree tree_;
  std::vector<std::size_t> offsets_;  // [depth + 1] where each head's ranked tokens start
  std::vector<float> logits_;         // [heads, vocab]
  std::vector<token_id> ranked_;      // per head, its top ranks_needed(d) tokens
  std::vector<double> normalizer_;    // [depth] log-sum-exp of each head's logits (pruning)
  std::vector<token_id> tokens_;      // [size + 1] the token of every tree node
  std::vector<double> log_prob_;      // [size + 1] estimated log path probability (pruning)
  detail::sparse_tree_writer writer_;
};

//! Measures the rank accuracies of Medusa heads on a sequence the target produced itself:
//! `tokens` [T] and `hidden` [T, hidden_size], row s the target's final hidden state after
//! tokens[0..s] (one forward with `want_hidden` over the sequence gives them). At every position
//! s, head i's expected token is tokens[s + i + 2] (when it exists). On the target's own greedy
//! continuation these are the tokens greedy verification accepts, so the accuracies measured there
//! are the ones a tree for greedy decoding should be built from (`sparse_tree::build`).
template <medusa_heads_runner Runner>
void measure_medusa_accuracy(Runner& runner, matrix_view<float const> hidden,
                             std::span<token_id const> tokens, head_accuracy& accuracy) {
  std::size_t const heads = std::min(runner.num_heads(), accuracy.heads());
  detail::check_measure_inputs(hidden, tokens, runner.hidden_size(), "measure_medusa_accuracy");
  std::vector<float> logits(runner.num_heads() * runner.vocab_size());
  matrix_view<float> const view(logits.data(), runner.num_heads(), runner.vocab_size());
  for (std::size_t s = 0; s + 2 < tokens.size(); ++s) {
    runner.run(hidden.row(s), view);
    for (std::size_t i = 0; i < heads && s + i + 2 < tokens.size(); ++i)
      accuracy.add(i, view.row(i), tokens[s + i + 2]);
  }
}

}  // namespace specdec
