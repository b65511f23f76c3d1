#pragma once
//! \file
//! `block_proposer`: block drafting (DFlash, arXiv 2602.06036; DSpark, arXiv 2607.05147). A block
//! drafter (model/block_drafter.hpp) reads the target's features of the committed tokens as its
//! context and drafts the B - 1 tokens after the root in ONE forward of B rows, where a chain
//! drafter runs one forward per token.
//!
//! Each step, with committed tokens x_0..x_{t-1} (root x_{t-1}): the rows of
//! `propose_context::target_hidden` are the features of the tokens the last step committed (at
//! the first step the prompt's but the last), so the runner appends their context rows (the
//! drafter's cache then holds rows 0..t-2, one per token before the root), runs the block of root
//! x_{t-1} and maps rows 1..n to logits. The tokens are then drawn left to right: row i's logits
//! (plus, for a DSpark drafter, the Markov bias after the token drawn at row i - 1, the root for
//! row 1) under the policy give the greedy token or, when sampling, a distribution q_i from which
//! the token is drawn with one word of the request's Philox stream and which is recorded as the
//! chain's q row. q_i depends on the drafted prefix only through the Markov bias, which is part of
//! q_i as recorded, so speculative sampling with min(1, p / q) stays exact.
//!
//! DSpark's confidence head gives each drafted token's probability of acceptance given the earlier
//! ones were; with `block_config::confidence_threshold` > 0 the chain stops before the first token
//! at which the product of confidences (the estimated probability that the whole prefix is
//! accepted) falls below it (the first token is always drafted). It reads only the drafter's own
//! outputs, so sampling stays lossless. `last_confidence()` exposes the per-position estimates.
//!
//! Trees from a block (DDTree, arXiv 2604.12989; `block_shape::tree`, greedy candidates): the
//! `block_config::nodes` paths of highest probability under the block's per-position
//! distributions (log-softmax of row i's logits, with DSpark's Markov bias after the node's own
//! token, so a node's children rank by what its token makes likely), found best first: a heap of
//! (parent, rank) candidates whose score is the parent's path log-probability plus the candidate's
//! own; popping one adds it to the tree and pushes its best child and its next sibling. A child is
//! never more probable than its parent, so the tree holds the most probable paths, parents first.
//! The candidates are deterministic (point masses to the tree verifier); verified greedily, the
//! output is greedy decoding's.
//!
//! After verification nothing needs rolling back: the cache holds context rows of committed tokens
//! only, and the accepted tokens' rows come with the next step's features. A history that does not
//! continue the drafter's (a new sequence without `begin`, an edit) cuts the cache back.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/detail/rows.hpp"
#include "specdec/propose/chain_drafter.hpp"
#include "specdec/propose/sparse_tree.hpp"
#include "specdec/sampling/draw.hpp"

namespace specdec {

//! What runs a block drafter for `block_proposer` (backend/cpu/block_drafter.hpp:
//! `cpu_block_drafter`): its widths, vocabulary, block size and target layers; `context()` rows
//! held, `truncate(n)`, `extend(features)`, `block(root, out)` [B, dim], `logits(out, logits)`,
//! and for DSpark `add_markov(prev, row)` and `confidence(out_row, token, i)`.
template <class R>
concept block_drafter_runner = requires(R& r, R const& cr, matrix_view<float const> in,
                                        matrix_view<float> out, std::span<float> row,
                                        std::span<float const> crow, token_id t) {
  { cr.hidden_size() } -> std::convertible_to<std::size_t>;
  { cr.feature_width() } -> std::convertible_to<std::size_t>;
  { cr.vocab_size() } -> std::convertible_to<std::size_t>;
  { cr.block_size() } -> std::convertible_to<std::size_t>;
  { cr.dspark() } -> std::convertible_to<bool>;
  { cr.target_layers() } -> std::convertible_to<std::span<std::int32_t const>>;
  { cr.max_context() } -> std::convertible_to<std::size_t>;
  { cr.context() } -> std::convertible_to<std::size_t>;
  r.truncate(std::size_t{0});
  r.extend(in);
  r.block(t, out);
  r.logits(in, out);
  r.add_markov(t, row);
  { cr.confidence(crow, t, std::size_t{1}) } -> std::convertible_to<double>;
};

//! What a `block_proposer` drafts from a block.
enum class block_shape {
  chain,  //!< the tokens drawn left to right (greedy, or sampled with q rows)
  tree,   //!< DDTree: the most probable paths through the block's rows (greedy candidates)
};

//! Options of a `block_proposer`.
struct block_config {
  //! Drafts per step (chains) or the depth (trees): at most B - 1; 0 = B - 1.
  std::size_t length = 0;
  //! Trees: nodes per step (the most probable paths), >= 1.
  std::size_t nodes = 32;
  //! DSpark: use the Markov head (when false a DSpark drafter drafts as its DFlash body).
  bool markov = true;
  //! DSpark: stop before the first draft at which the product of the confidence head's estimates
  //! falls below this; 0 disables. In [0, 1].
  float confidence_threshold = 0.0f;

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    SPECDEC_CHECK(length < max_tree_nodes, invalid_argument, "block_config: length ", length,
                  " must be below ", max_tree_nodes);
    SPECDEC_CHECK(nodes >= 1 && nodes < max_tree_nodes, invalid_argument, "block_config: nodes ",
                  nodes, " is outside [1, ", max_tree_nodes - 1, "]");
    SPECDEC_CHECK(confidence_threshold >= 0.0f && confidence_threshold <= 1.0f, invalid_argument,
                  "block_config: confidence_threshold ", confidence_threshold,
                  " is outside [0, 1]");
  }
};

//! Drafts a chain per step with a block drafter (see the file comment).
//!
//! \tparam Runner a `block_drafter_runner`, held by reference (it must outlive the proposer; its
//!                cache belongs to the proposer).
//! \tparam Policy a `sampling_policy` for the draft rows (the target's, so q is in the processed
//!                space of p); owned.
//! \tparam Mode   greedy candidates, or drafts drawn with q rows (propose/chain_drafter.hpp).
//! \tparam Shape  chains, or DDTree's trees (greedy candidates only).
template <block_drafter_runner Runner, sampling_policy Policy, draft_mode Mode = draft_mode::greedy,
          block_shape Shape = block_shape::chain>
class block_proposer {
  static constexpr char const* who = "block_proposer";
  static_assert(Shape == block_shape::chain || Mode == draft_mode::greedy,
                "block_proposer: trees are greedy candidates (draft_mode::greedy)");

 public:
  static constexpr bool produces_trees = Shape == block_shape::tree;  //!< DDTree's trees
  static constexpr bool samples_drafts = Mode == draft_mode::sample;  //!< q rows when sampling
  static constexpr bool needs_target_hidden = true;  //!< the context is the target's features

  //! A proposer over `runner` with `policy` and `config` (validated). Throws
  //! `errc::invalid_argument` for a bad config, a length beyond B - 1, or a confidence threshold
  //! or Markov head asked of a DFlash drafter.
  block_proposer(Runner& runner, Policy policy, block_config config = {})
      : runner_(&runner), policy_(std::move(policy)), config_(config) {
    config_.validate();
    std::size_t const drafts = runner.block_size() - 1;
    SPECDEC_CHECK(config_.length <= drafts, invalid_argument, who, ": length ", config_.length,
                  " exceeds the drafter's ", drafts, " drafts per block");
    if (config_.length == 0) config_.length = drafts;
    SPECDEC_CHECK(config_.confidence_threshold == 0.0f || runner.dspark(), invalid_argument, who,
                  ": a confidence threshold needs a DSpark drafter (this one has no confidence "
                  "head)");
    markov_ = config_.markov && runner.dspark();
    std::size_t const d = runner.hidden_size(), v = runner.vocab_size(), b = runner.block_size();
    out_.resize(b * d);
    logits_.resize(b * v);
    q_.resize(v);
    confidence_.reserve(b);
    if constexpr (Shape == block_shape::tree) {
      std::size_t const k = std::min(config_.nodes, v);
      ranked_.resize((config_.nodes + 1) * k);
      ranked_logp_.resize((config_.nodes + 1) * k);
      depth_.resize(config_.nodes + 1);
      path_.resize(config_.nodes + 1);
      heap_.reserve(config_.nodes + 2);  // each pop pushes at most two
      row_.resize(v);
      exp_.resize(v);
    }
  }

  //! Starts a sequence: empties the drafter's context and binds the policy to the request (a
  //! constrained policy's draft rows are then masked by the request's own constraint state).
  void begin(std::span<token_id const> prompt) {
    if constexpr (!std::is_reference_v<decltype(policy_for_prompt(policy_, prompt.size()))>)
      policy_ = policy_for_prompt(policy_, prompt.size());
    runner_->truncate(0);
    history_.clear();
  }

  //! Appends the context rows of ctx.target_hidden, then drafts a chain of at most
  //! min(length, ctx.max_nodes, the tree's room) tokens under ctx.tokens.back(). Throws
  //! `errc::invalid_argument` for feature rows of the wrong width or that do not continue the
  //! drafter's context, `errc::numerical` for a draft distribution without mass.
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument, who, ": propose with no committed tokens");
    tree.reset(ctx.tokens.back());
    std::size_t const v = runner_->vocab_size();
    if constexpr (Mode == draft_mode::sample) {
      if (tree.q_vocab() != v) tree.enable_q(v);
    } else {
      if (tree.has_q()) tree.enable_q(0);
    }
    confidence_.clear();
    extend(ctx);
    std::size_t const t = ctx.tokens.size();
    std::size_t const budget = std::min(ctx.max_nodes, tree.capacity() - 1);
    std::size_t const n = std::min(config_.length, budget);
    if (n == 0 || t - 1 >= runner_->max_context()) return;
    if constexpr (Mode == draft_mode::sample)
      SPECDEC_CHECK(ctx.rng != nullptr, invalid_argument, who,
                    ": sampling drafts needs propose_context::rng");
    std::size_t const d = runner_->hidden_size();
    std::size_t const b = runner_->block_size();
    token_id const root = ctx.tokens.back();
    runner_->block(root, matrix_view<float>(out_.data(), b, d));
    runner_->logits(matrix_view<float const>(out_.data() + d, n, d),
                    matrix_view<float>(logits_.data(), n, v));
    if constexpr (Shape == block_shape::tree) {
      draft_tree_of(root, n, std::min(config_.nodes, budget), tree);
      return;
    }
    draws_.assign(ctx.tokens.begin(), ctx.tokens.end());
    node_index parent = 0;
    double survival = 1.0;
    token_id prev = root;
    for (std::size_t i = 1; i <= n; ++i) {
      std::span<float> const row(logits_.data() + (i - 1) * v, v);
      if (markov_) runner_->add_markov(prev, row);
      token_history const history = token_history::checked(draws_);
      token_id next = no_token;
      if constexpr (Mode == draft_mode::sample) {
        policy_.distribution(row, history, q_);
        double total = 0.0;
        std::size_t const k = detail::draw_index(q_, ctx.rng->uniform(), total);
        SPECDEC_CHECK(k != detail::no_index, numerical, who, ": the q row of draft ", i,
                      " sums to ", total, " (the policy's distribution has no positive mass)");
        next = static_cast<token_id>(k);
      } else {
        next = policy_.greedy_token(row, history);
      }
      SPECDEC_CHECK(next >= 0 && static_cast<std::size_t>(next) < v, out_of_range, who,
                    ": the policy produced token ", next, " outside the vocabulary of ", v);
      if (runner_->dspark()) {
        double const c =
            runner_->confidence(std::span<float const>(out_.data() + i * d, d), next, i);
        survival *= c;
        if (i > 1 && survival < static_cast<double>(config_.confidence_threshold)) break;
        confidence_.push_back(c);
      }
      if constexpr (Mode == draft_mode::sample)
        std::copy(q_.begin(), q_.end(), tree.q_row(parent).begin());
      parent = tree.add_node(parent, next);
      draws_.push_back(next);
      prev = next;
    }
  }

  //! Nothing to roll back (the context holds committed tokens only).
  void accept(verify_result const& /*result*/) {}

  //! Nodes per step (before the step's budget): the chain's length or the tree's nodes.
  [[nodiscard]] std::size_t max_nodes() const noexcept {
    return Shape == block_shape::tree ? config_.nodes : config_.length;
  }
  //! The target layers whose residual streams the drafter reads.
  [[nodiscard]] std::span<std::int32_t const> target_hidden_layers() const {
    return runner_->target_layers();
  }
  //! The options (length resolved).
  [[nodiscard]] block_config const& config() const noexcept { return config_; }
  //! DSpark: the confidence head's estimate for each token drafted at the last step (empty for a
  //! DFlash drafter).
  [[nodiscard]] std::span<double const> last_confidence() const noexcept { return confidence_; }
  //! Context rows the drafter holds.
  [[nodiscard]] std::size_t context() const noexcept { return runner_->context(); }

 private:
  // Appends the rows of ctx.target_hidden (tokens first .. t - 2, first = t - 1 - rows) after
  // cutting the drafter's context back to `first` when the history was edited.
  void extend(propose_context const& ctx) {
    std::size_t const t = ctx.tokens.size();
    std::size_t const r = ctx.target_hidden.rows();
    SPECDEC_CHECK(r < t, invalid_argument, who, ": ", r, " feature rows for ", t,
                  " committed tokens (the root has none yet)");
    std::size_t const first = t - 1 - r;
    std::size_t const held = runner_->context();
    bool const continues =
        first <= held &&
        (first == 0 || (first <= history_.size() && history_[first - 1] == ctx.tokens[first - 1]));
    SPECDEC_CHECK(continues, invalid_argument, who, ": feature rows from token ", first,
                  " do not continue the drafter's ", held,
                  " context rows (a new sequence needs begin(), and the decoder passes the rows "
                  "of every token it commits)");
    if (first < held) runner_->truncate(first);
    runner_->extend(ctx.target_hidden);
    history_.assign(ctx.tokens.begin(), ctx.tokens.end() - 1);
  }

  // A candidate of the best-first search: the `rank`-th child of tree node `parent`.
  struct candidate {
    double score = 0.0;       // the path's log-probability
    std::uint32_t order = 0;  // creation order (ties to the earlier)
    node_index parent = 0;
    std::uint32_t rank = 0;
  };
  struct worse {
    bool operator()(candidate const& a, candidate const& b) const noexcept {
      return a.score != b.score ? a.score < b.score : a.order > b.order;
    }
  };

  // Ranks node `node`'s children (block row depth + 1, the Markov bias after `token`): their
  // tokens and log-probabilities, best first, into ranked_ / ranked_logp_ at `node`.
  void rank_children(node_index node, std::size_t depth, token_id token, std::size_t k) {
    std::size_t const v = runner_->vocab_size();
    std::span<float const> row(logits_.data() + depth * v, v);
    if (markov_) {
      std::copy(row.begin(), row.end(), row_.begin());
      runner_->add_markov(token, row_);
      row = row_;
    }
    std::span<token_id> const top(ranked_.data() + static_cast<std::size_t>(node) * k, k);
    detail::top_ranks(row, k, top, who);
    float const hi = detail::summarize_row(row, who).max;
    double const lse = static_cast<double>(hi) +
                       std::log(detail::exp_shifted(row.data(), exp_.data(), v, hi, 1.0f));
    for (std::size_t r = 0; r < k; ++r)
      ranked_logp_[static_cast<std::size_t>(node) * k + r] =
          static_cast<double>(row[static_cast<std::size_t>(top[r])]) - lse;
  }

  // DDTree: the `nodes` most probable paths of at most `depth` tokens (see the file comment).
  void draft_tree_of(token_id root, std::size_t depth, std::size_t nodes, draft_tree& tree) {
    std::size_t const k = std::min(config_.nodes, runner_->vocab_size());
    std::vector<candidate>& heap = heap_;  // reserved at construction: no allocation here
    auto const push = [&](candidate c) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), worse{});
    };
    heap.clear();
    std::uint32_t order = 0;
    depth_[0] = 0;
    path_[0] = 0.0;
    rank_children(0, 0, root, k);
    push({ranked_logp_[0], order++, 0, 0});
    while (!heap.empty() && tree.size() <= nodes) {
      std::pop_heap(heap.begin(), heap.end(), worse{});
      candidate const c = heap.back();
      heap.pop_back();
      std::size_t const at = static_cast<std::size_t>(c.parent) * k + c.rank;
      node_index const node = tree.add_node(c.parent, ranked_[at]);
      auto const n = static_cast<std::size_t>(node);
      depth_[n] = depth_[static_cast<std::size_t>(c.parent)] + 1;
      path_[n] = c.score;
      if (c.rank + 1 < k)  // the next sibling
        push({path_[static_cast<std::size_t>(c.parent)] + ranked_logp_[at + 1], order++, c.parent,
              c.rank + 1});
      if (depth_[n] < depth && tree.size() <= nodes) {  // the best child
        rank_children(node, depth_[n], ranked_[at], k);
        push({c.score + ranked_logp_[n * k], order++, node, 0});
      }
    }
  }

  Runner* runner_;
  Policy policy_;
  block_config config_;
  bool markov_ = false;
  std::vector<token_id> history_;  // the tokens whose context rows the drafter holds
  std::vector<token_id> draws_;    // the committed tokens and the step's drafts (the policy's)
  std::vector<float> out_;         // [B, dim] the block's outputs
  std::vector<float> logits_;      // [B, vocab] the drafts' rows
  std::vector<float> q_;           // [vocab] a draft's distribution
  std::vector<double> confidence_;
  // Trees: per node, its children's tokens and log-probabilities [nodes + 1, k], its depth, its
  // path's log-probability; a row with the Markov bias and the exp scratch.
  std::vector<token_id> ranked_;
  std::vector<double> ranked_logp_;
  std::vector<std::size_t> depth_;
  std::vector<double> path_;
  std::vector<candidate> heap_;  // the best-first search's candidates
  std::vector<float> row_;
  std::vector<float> exp_;
};

}  // namespace specdec
