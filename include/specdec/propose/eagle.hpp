#pragma once
//! \file
//! `eagle_proposer`: EAGLE (Li et al., 2024), EAGLE-2 (2024) and EAGLE-3 (2025). A one-layer
//! draft head autoregresses on the target's FEATURES rather than on tokens: for each committed
//! token x_j it reads the target's feature f_j of that token with the next token x_{j+1}
//! (model/eagle.hpp gives the computation), keeps its own KV cache over those pairs, and drafts by
//! feeding its own outputs back as the features of the tokens it drafts.
//!
//! Each step, with committed tokens x_0..x_{t-1} (root x_{t-1}): the rows of
//! `propose_context::target_hidden` are the TRUE features of the tokens the last step committed
//! (the root of the last step and its accepted nodes; at the first step the prompt's tokens but the
//! last), so the proposer appends their pairs to the head's cache, the last one pairing f_{t-2}
//! with the root. That entry's output o predicts the root's children. Tree nodes are then drafted
//! depth by depth, each expanded node getting a head entry (input: its parent's output, token: its
//! own, position t - 2 + depth) that sees the committed entries and its ancestors' entries only
//! (one batched head call per depth, with a tree mask), whose output predicts its children. After
//! the step the tree entries are dropped (`accept`): the accepted tokens' entries are recomputed
//! from the target's true features at the next step, as the reference does, so the cache holds the
//! committed pairs only and rolls back exactly after a partial, a full or no acceptance.
//!
//! Two tree modes:
//! - EAGLE-2's dynamic tree (`eagle_tree_config`: depth D, top-k K, N nodes): the root's children
//!   are the head's top K tokens; then for each depth d < D, the K candidates of depth d with the
//!   highest path confidence (the sum of the head's log-probabilities along the path) are expanded,
//!   each into its top K children. Of all the candidates drafted (K + (D - 1) K^2), the N of
//!   highest path confidence are kept (ties to the earlier candidate). A child is never more
//!   confident than its parent, so the kept nodes include their ancestors.
//! - EAGLE-1's static tree: a `sparse_tree` of ranks (propose/sparse_tree.hpp, as Medusa's), node
//!   [k_1, ..., k_d] holding the k_d-th most likely token of the head's output at its parent; the
//!   nodes that have children get head entries. Pruned to the step's budget by path probability.
//!
//! The candidates are deterministic (the head's top tokens, no randomness): point masses to the
//! verifiers. `greedy_verifier` (or `tree_verifier`) gives output identical to greedy decoding;
//! under sampling `tree_verifier` is lossless (each candidate is tried with probability p(c) and
//! removed from p on rejection, docs/verification.md), which is the rule the EAGLE-2 reference
//! applies to its top-k candidates. The proposer declares `needs_target_hidden`, and through
//! `target_hidden_layers()` which features it reads: EAGLE-1 the final hidden state, EAGLE-3 the
//! residual streams after the layers its config names (the decoder asks the target for them).

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
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
#include "specdec/model/eagle.hpp"
#include "specdec/propose/sparse_tree.hpp"

namespace specdec {

//! What runs an EAGLE head for `eagle_proposer` (backend/cpu/eagle.hpp: `cpu_eagle_head`,
//! backend/cuda/eagle.cuh: `cuda_eagle_head`):
//! - `hidden_size()`, `feature_width()`: the width of the head's outputs and of a target feature;
//! - `vocab_size()`, `draft_vocab_size()`, `draft_to_target()`: the target's vocabulary, the
//!   head's logits per row and the target id of each (empty: the identity);
//! - `target_layers()`: the target layers a feature is made of (empty: the final hidden state);
//! - `max_context()`: entries and positions the head can hold;
//! - `forward(batch, out)`: appends `eagle_batch` rows to the head's cache, outputs [n, dim];
//! - `logits(hidden, logits)`: [n, draft_vocab] logits of n outputs;
//! - `cache()`: the head's KV cache (a `kv_cache`), which the proposer truncates to roll back.
template <class R>
concept eagle_head_runner = requires(R& r, R const& cr, eagle_batch const& batch,
                                     matrix_view<float> out, matrix_view<float const> hidden) {
  { cr.hidden_size() } -> std::convertible_to<std::size_t>;
  { cr.feature_width() } -> std::convertible_to<std::size_t>;
  { cr.vocab_size() } -> std::convertible_to<std::size_t>;
  { cr.draft_vocab_size() } -> std::convertible_to<std::size_t>;
  { cr.draft_to_target() } -> std::convertible_to<std::span<token_id const>>;
  { cr.target_layers() } -> std::convertible_to<std::span<std::int32_t const>>;
  { cr.max_context() } -> std::convertible_to<std::size_t>;
  r.forward(batch, out);
  r.logits(hidden, out);
  { r.cache() } -> kv_cache;
};

//! EAGLE-2's dynamic tree: depth, top-k per expansion, nodes kept.
struct eagle_tree_config {
  std::size_t depth = 6;   //!< D: the deepest drafted level (D - 1 expansions), >= 1
  std::size_t top_k = 8;   //!< K: children per expanded node and nodes expanded per depth, >= 1
  std::size_t nodes = 32;  //!< N: drafted nodes kept per step, >= 1

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    SPECDEC_CHECK(depth >= 1 && depth <= 64, invalid_argument, "eagle_tree_config: depth ", depth,
                  " is outside [1, 64]");
    SPECDEC_CHECK(top_k >= 1 && top_k <= 64, invalid_argument, "eagle_tree_config: top_k ", top_k,
                  " is outside [1, 64]");
    SPECDEC_CHECK(nodes >= 1 && nodes < max_tree_nodes, invalid_argument,
                  "eagle_tree_config: nodes ", nodes, " is outside [1, ", max_tree_nodes - 1, "]");
  }
  //! The candidates one step drafts before the N best are kept: K + (D - 1) K^2.
  [[nodiscard]] std::size_t candidates() const noexcept {
    return top_k + (depth - 1) * top_k * top_k;
  }
};

//! Drafts EAGLE trees with an EAGLE head (see the file comment).
//!
//! \tparam Runner an `eagle_head_runner`; held by reference, it must outlive the proposer, and its
//!                cache belongs to the proposer.
template <eagle_head_runner Runner>
class eagle_proposer {
 public:
  static constexpr bool produces_trees = true;       //!< a tree of candidates per step
  static constexpr bool samples_drafts = false;      //!< deterministic candidates, no q rows
  static constexpr bool needs_target_hidden = true;  //!< the head reads the target's features

  //! EAGLE-2 dynamic trees of `config` (validated). Throws `errc::invalid_argument` for a bad
  //! config or a top-k beyond the draft vocabulary.
  eagle_proposer(Runner& runner, eagle_tree_config config) : runner_(&runner), config_(config) {
    config_.validate();
    SPECDEC_CHECK(config_.top_k <= runner.draft_vocab_size(), invalid_argument,
                  "eagle_proposer: top_k ", config_.top_k, " exceeds the draft vocabulary of ",
                  runner.draft_vocab_size());
    allocate(config_.candidates(), (config_.depth - 1) * config_.top_k, config_.top_k,
             config_.top_k);
  }

  //! EAGLE-1 static trees of shape `shape`. Throws `errc::invalid_argument` when the tree uses
  //! ranks beyond the draft vocabulary.
  eagle_proposer(Runner& runner, sparse_tree shape)
      : runner_(&runner), shape_(std::move(shape)), static_(true) {
    std::size_t const n = shape_.size();
    std::size_t const vocab = runner.draft_vocab_size();
    child_ranks_.assign(n + 1, 0);
    for (std::size_t i = 1; i <= n; ++i) {
      auto const p = static_cast<std::size_t>(shape_.parent(i));
      child_ranks_[p] = std::max(child_ranks_[p], static_cast<std::size_t>(shape_.rank(i)) + 1);
    }
    levels_.assign(shape_.depth(), {});
    std::size_t widest = 1, ranks = 1, expanded = 0;
    for (std::size_t i = 0; i <= n; ++i) {
      if (!shape_.expanded(i)) continue;
      SPECDEC_CHECK(child_ranks_[i] <= vocab, invalid_argument,
                    "eagle_proposer: the tree uses rank ", child_ranks_[i] - 1, " under node ", i,
                    ", beyond the draft vocabulary of ", vocab);
      auto& level = levels_[static_cast<std::size_t>(shape_.depth(i))];
      level.push_back(i);
      widest = std::max(widest, level.size());
      ranks = std::max(ranks, child_ranks_[i]);
      if (i > 0) ++expanded;
    }
    allocate(n, expanded, widest, ranks);
  }

  //! Starts a sequence: empties the head's cache.
  void begin(std::span<token_id const> /*prompt*/) {
    runner_->cache().truncate(0);
    committed_ = 0;
    pending_rows_ = 0;
    history_.clear();
    have_out_ = false;
  }

  //! Appends the pairs of the rows of ctx.target_hidden (the features of the tokens committed
  //! since the last step) to the head's cache, then resets `tree` to the root ctx.tokens.back()
  //! and drafts at most min(max_nodes(), ctx.max_nodes, tree.capacity() - 1) nodes. A step that
  //! may draft nothing (a speculation policy's choice) only keeps the rows: the head reads them,
  //! all in one call, at the next step that drafts. Throws `errc::invalid_argument` for feature
  //! rows of the wrong width or that do not continue the head's pairs, `errc::numerical` for NaN
  //! logits.
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument,
                  "eagle_proposer: propose with no committed tokens");
    tree.reset(ctx.tokens.back());
    if (tree.has_q()) tree.enable_q(0);
    std::size_t const budget = std::min({max_nodes(), ctx.max_nodes, tree.capacity() - 1});
    if (budget == 0) {
      defer(ctx);
      return;
    }
    extend(ctx);
    std::size_t const t = ctx.tokens.size();
    // Entries the head can still take, and positions (a node at depth d sits at t - 2 + d).
    std::size_t const cap = runner_->max_context();
    std::size_t const room = cap > committed_ ? cap - committed_ : 0;
    std::size_t const deepest = cap + 1 >= t ? cap + 1 - t : 0;  // deepest depth with a position
    if (!have_out_ || budget == 0 || deepest == 0) return;
    n_nodes_ = 0;
    n_entries_ = 0;
    n_outs_ = 0;
    if (static_)
      draft_static(ctx, budget, room, deepest, tree);
    else
      draft_dynamic(budget, room, deepest, tree);
  }

  //! Drops the tree's entries from the head's cache: it holds the committed pairs again (the
  //! accepted tokens' pairs are appended from the target's true features at the next step).
  void accept(verify_result const& /*result*/) { runner_->cache().truncate(committed_); }

  //! The node budget: N (dynamic trees) or the static tree's size.
  [[nodiscard]] std::size_t max_nodes() const noexcept {
    return static_ ? shape_.size() : config_.nodes;
  }
  //! The target layers whose residual streams the head reads (what the decoder asks the target
  //! for; empty: the final hidden state).
  [[nodiscard]] std::span<std::int32_t const> target_hidden_layers() const {
    return runner_->target_layers();
  }
  //! The dynamic tree's configuration (unused in static mode).
  [[nodiscard]] eagle_tree_config const& config() const noexcept { return config_; }
  //! Whether trees are static (a `sparse_tree`) rather than dynamic.
  [[nodiscard]] bool static_tree() const noexcept { return static_; }
  //! Committed pairs in the head's cache.
  [[nodiscard]] std::size_t committed_entries() const noexcept { return committed_; }
  //! Committed pairs whose feature rows wait for the next step that drafts.
  [[nodiscard]] std::size_t pending_entries() const noexcept { return pending_rows_; }
  //! [hidden_size] the output of the last committed pair (what predicts the root's children).
  [[nodiscard]] std::span<float const> last_output() const noexcept {
    return have_out_ ? std::span<float const>(last_out_) : std::span<float const>();
  }
  //! [draft_vocab] the head's logits at the root (the depth-1 ranking) of the last step.
  [[nodiscard]] std::span<float const> root_logits() const noexcept {
    return std::span<float const>(root_logits_);
  }

 private:
  // A drafted candidate (dynamic) or tree node (static).
  struct node {
    token_id token = 0;
    std::int32_t parent = -1;  // candidate index, -1 for the root
    std::int32_t depth = 0;
    double score = 0.0;       // log path probability
    std::int32_t entry = -1;  // head cache entry when expanded
    std::int32_t out = -1;    // row of outs_ when expanded
    std::int32_t draft = -1;  // index in the emitted draft tree
  };

  // Sizes every buffer for `nodes` candidates, `entries` tree rows per step, at most `widest`
  // rows per head call and `ranks` ranks read per row (drafting then allocates nothing).
  void allocate(std::size_t nodes, std::size_t entries, std::size_t widest, std::size_t ranks) {
    std::size_t const d = runner_->hidden_size(), v = runner_->draft_vocab_size();
    nodes_.resize(nodes + 1);
    outs_.resize((entries + 1) * d);
    last_out_.resize(d);
    root_logits_.resize(v);
    exp_.resize(v);
    logits_.resize(widest * v);
    in_.resize(widest * d);
    batch_tokens_.resize(widest);
    batch_positions_.resize(widest);
    batch_nodes_.resize(widest);
    ranked_.resize(ranks);
    order_.resize(nodes + 1);
    mask_.resize(widest * mask_words(entries + 1));
    tokens_.resize(nodes + 1);
    log_prob_.resize(nodes + 1);
  }

  // Checks that ctx.target_hidden's rows continue the head's pairs (fed, or pending), drops
  // those they replace (a head cache entry, or a pending row, from their first pair on) and
  // notes the committed tokens.
  void check_rows(propose_context const& ctx) {
    std::size_t const t = ctx.tokens.size();
    std::size_t const r = ctx.target_hidden.rows();
    SPECDEC_CHECK(r < t, invalid_argument, "eagle_proposer: ", r, " feature rows for ", t,
                  " committed tokens (the root has none yet)");
    std::size_t const first = t - 1 - r;  // the first new pair's index
    std::size_t const known = committed_ + pending_rows_;
    runner_->cache().truncate(std::min(runner_->cache().size(), committed_));
    // The last kept pair, first - 1, paired f_{first - 1} with x_first.
    bool const continues =
        first <= known &&
        (first == 0 || (first < history_.size() && history_[first] == ctx.tokens[first]));
    SPECDEC_CHECK(continues, invalid_argument, "eagle_proposer: feature rows from token ", first,
                  " do not continue the head's ", known,
                  " pairs (a new sequence needs begin(), and the decoder passes the rows of "
                  "every token it commits)");
    if (first < committed_) {
      runner_->cache().truncate(first);
      committed_ = first;
      have_out_ = false;
    }
    pending_rows_ = first - committed_;
    history_.assign(ctx.tokens.begin(), ctx.tokens.end());
    SPECDEC_CHECK(r == 0 || ctx.target_hidden.cols() == runner_->feature_width(), invalid_argument,
                  "eagle_proposer: feature rows of ", ctx.target_hidden.cols(),
                  " floats for a head reading ", runner_->feature_width());
  }

  // Keeps ctx.target_hidden's rows after the pending ones (see `propose`).
  void defer(propose_context const& ctx) {
    check_rows(ctx);
    std::size_t const r = ctx.target_hidden.rows(), w = runner_->feature_width();
    if (r == 0) return;
    pending_.resize((pending_rows_ + r) * w);
    for (std::size_t i = 0; i < r; ++i) {
      std::span<float const> const row = ctx.target_hidden.row(i);
      std::copy(row.begin(), row.end(),
                pending_.begin() + static_cast<std::ptrdiff_t>((pending_rows_ + i) * w));
    }
    pending_rows_ += r;
    have_out_ = false;  // last_out_ is no longer the last pair's output
  }

  // Appends the pending pairs and those of ctx.target_hidden to the head's cache (see `propose`).
  void extend(propose_context const& ctx) {
    matrix_view<float const> rows = ctx.target_hidden;
    if (pending_rows_ > 0) {  // the pending rows, then ctx's, in one call of the head
      defer(ctx);
      rows = matrix_view<float const>(pending_.data(), pending_rows_, runner_->feature_width());
    } else {
      check_rows(ctx);  // then pending_rows_ stays 0: ctx's rows start at a fed pair
    }
    std::size_t const r = rows.rows();
    if (r == 0) return;
    std::size_t const first = committed_;
    std::size_t const d = runner_->hidden_size();
    feed_positions_.resize(r);
    feed_out_.resize(r * d);
    for (std::size_t i = 0; i < r; ++i) feed_positions_[i] = static_cast<position_t>(first + i);
    eagle_batch const batch{.inputs = rows,
                            .from_target = true,
                            .tokens = ctx.tokens.subspan(first + 1, r),
                            .positions = feed_positions_};
    runner_->forward(batch, matrix_view<float>(feed_out_.data(), r, d));
    committed_ = first + r;
    pending_rows_ = 0;
    std::copy(feed_out_.end() - static_cast<std::ptrdiff_t>(d), feed_out_.end(), last_out_.begin());
    have_out_ = true;
    runner_->logits(matrix_view<float const>(last_out_.data(), 1, d),
                    matrix_view<float>(root_logits_.data(), 1, root_logits_.size()));
  }

  // log(sum exp(row)): the row's maximum (checked: NaN and +inf throw) plus the log of the sum of
  // exp(row - max), both by the vectorised row passes of the sampling kernels (detail/rows.hpp).
  [[nodiscard]] double log_sum_exp(std::span<float const> row) {
    float const top = detail::summarize_row(row, "eagle_proposer").max;
    double const sum = detail::exp_shifted(row.data(), exp_.data(), row.size(), top, 1.0f);
    return static_cast<double>(top) + std::log(sum);
  }

  // The target id of draft id `i`.
  [[nodiscard]] token_id target_id(token_id i) const noexcept {
    std::span<token_id const> const map = runner_->draft_to_target();
    return map.empty() ? i : map[static_cast<std::size_t>(i)];
  }

  // The head's output a node's children are predicted from: its own entry's output (the root's:
  // the last committed pair's).
  [[nodiscard]] float const* output_of(std::int32_t n) const noexcept {
    if (n < 0) return last_out_.data();
    return outs_.data() + static_cast<std::size_t>(nodes_[static_cast<std::size_t>(n)].out) *
                              runner_->hidden_size();
  }

  // Runs the head for the nodes batch_nodes_[0, m) (all of depth `depth`): one entry each (input:
  // the parent's output, token: the node's, position t - 2 + depth) seeing the committed entries
  // and its ancestors' entries; their outputs go to outs_ and their logits to logits_ [m, vocab].
  void expand(std::size_t m, std::size_t depth) {
    std::size_t const d = runner_->hidden_size(), v = runner_->draft_vocab_size();
    std::size_t const size = runner_->cache().size();
    std::size_t const words = mask_words(size - committed_ + m);
    std::fill(mask_.begin(), mask_.begin() + static_cast<std::ptrdiff_t>(m * words), 0);
    for (std::size_t r = 0; r < m; ++r) {
      node& nd = nodes_[static_cast<std::size_t>(batch_nodes_[r])];
      float const* const in = output_of(nd.parent);
      std::copy(in, in + d, in_.begin() + static_cast<std::ptrdiff_t>(r * d));
      batch_tokens_[r] = nd.token;
      batch_positions_[r] = static_cast<position_t>(committed_ - 1 + depth);
      std::uint64_t* const row = mask_.data() + r * words;
      auto const set = [&](std::size_t e) { row[e / 64] |= std::uint64_t{1} << (e % 64); };
      set(size + r - committed_);
      for (std::int32_t a = nd.parent; a >= 0; a = nodes_[static_cast<std::size_t>(a)].parent)
        set(static_cast<std::size_t>(nodes_[static_cast<std::size_t>(a)].entry) - committed_);
      nd.entry = static_cast<std::int32_t>(size + r);
      nd.out = static_cast<std::int32_t>(n_outs_ + r);
    }
    // Draft tokens are target ids already; the head pairs each row with it.
    eagle_batch const batch{.inputs = matrix_view<float const>(in_.data(), m, d),
                            .from_target = false,
                            .tokens = std::span<token_id const>(batch_tokens_.data(), m),
                            .positions = std::span<position_t const>(batch_positions_.data(), m),
                            .shared = committed_,
                            .mask = std::span<std::uint64_t const>(mask_.data(), m * words),
                            .mask_stride = words};
    matrix_view<float> const outs(outs_.data() + n_outs_ * d, m, d);
    runner_->forward(batch, outs);
    runner_->logits(outs, matrix_view<float>(logits_.data(), m, v));
    n_outs_ += m;
    n_entries_ += m;
  }

  // Adds the top `k` children of node `parent` (-1: the root) from the logits row `row`, with
  // scores the parent's plus their log-probability.
  void add_children(std::int32_t parent, std::span<float const> row, std::size_t k,
                    std::int32_t depth) {
    std::span<token_id> const top = std::span<token_id>(ranked_).first(k);
    detail::top_ranks(row, k, top, "eagle_proposer");
    double const lse = log_sum_exp(row);
    double const base = parent < 0 ? 0.0 : nodes_[static_cast<std::size_t>(parent)].score;
    for (std::size_t i = 0; i < k; ++i) {
      node& c = nodes_[n_nodes_++];
      c = node{};
      c.token = target_id(top[i]);
      c.parent = parent;
      c.depth = depth;
      c.score = base + static_cast<double>(row[static_cast<std::size_t>(top[i])]) - lse;
    }
  }

  // EAGLE-2: expand depth by depth, keep the best `budget` candidates.
  void draft_dynamic(std::size_t budget, std::size_t room, std::size_t deepest, draft_tree& tree) {
    std::size_t const k = config_.top_k, v = runner_->draft_vocab_size();
    std::size_t const depth = std::min(config_.depth, deepest);
    add_children(-1, root_logits_, k, 1);
    std::size_t level = 0;  // first candidate of the current depth
    for (std::size_t dep = 1; dep < depth; ++dep) {
      if (n_entries_ + k > room) break;  // the head's cache is full
      // The K most confident candidates of this depth (ties to the earlier one).
      std::size_t const count = n_nodes_ - level;
      std::size_t const m = std::min(k, count);
      for (std::size_t i = 0; i < count; ++i) order_[i] = static_cast<std::int32_t>(level + i);
      std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(m),
                        order_.begin() + static_cast<std::ptrdiff_t>(count),
                        [&](std::int32_t a, std::int32_t b) { return better(a, b); });
      for (std::size_t r = 0; r < m; ++r) batch_nodes_[r] = order_[r];
      expand(m, dep);
      level = n_nodes_;
      for (std::size_t r = 0; r < m; ++r)
        add_children(batch_nodes_[r], std::span<float const>(logits_).subspan(r * v, v), k,
                     static_cast<std::int32_t>(dep + 1));
    }
    // Keep the `budget` best candidates, emitted by depth (parents first).
    std::size_t const keep = std::min(budget, n_nodes_);
    for (std::size_t i = 0; i < n_nodes_; ++i) order_[i] = static_cast<std::int32_t>(i);
    std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(keep),
                      order_.begin() + static_cast<std::ptrdiff_t>(n_nodes_),
                      [&](std::int32_t a, std::int32_t b) { return better(a, b); });
    std::sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(keep));
    for (std::size_t i = 0; i < n_nodes_; ++i) nodes_[i].draft = -1;
    for (std::size_t i = 0; i < keep; ++i) {
      node& nd = nodes_[static_cast<std::size_t>(order_[i])];
      std::int32_t const parent =
          nd.parent < 0 ? 0 : nodes_[static_cast<std::size_t>(nd.parent)].draft;
      if (parent < 0) continue;  // unreachable: a kept node's parent is at least as confident
      nd.draft = tree.add_node(parent, nd.token);
    }
  }

  // Whether candidate a ranks before candidate b: higher path confidence, then created earlier.
  [[nodiscard]] bool better(std::int32_t a, std::int32_t b) const noexcept {
    double const sa = nodes_[static_cast<std::size_t>(a)].score;
    double const sb = nodes_[static_cast<std::size_t>(b)].score;
    return sa != sb ? sa > sb : a < b;
  }

  // EAGLE-1: the static tree, expanded nodes batched per depth.
  void draft_static(propose_context const& ctx, std::size_t budget, std::size_t room,
                    std::size_t deepest, draft_tree& tree) {
    std::size_t const n = shape_.size(), v = runner_->draft_vocab_size();
    tokens_[0] = ctx.tokens.back();
    log_prob_[0] = 0.0;
    // nodes_[i - 1] is shape node i (its parent index shifted the same way; -1: the root).
    for (std::size_t i = 1; i <= n; ++i) {
      node& nd = nodes_[i - 1];
      nd = node{};
      nd.parent = shape_.parent(i) - 1;
      nd.depth = shape_.depth(i);
    }
    std::fill(tokens_.begin() + 1, tokens_.end(), token_id{0});
    std::fill(log_prob_.begin() + 1, log_prob_.end(), -std::numeric_limits<double>::infinity());
    std::size_t const depth = std::min(shape_.depth(), deepest);
    std::size_t drafted = 0;  // nodes given a token
    for (std::size_t dep = 0; dep < depth; ++dep) {
      std::vector<std::size_t> const& level = levels_[dep];
      std::size_t const m = level.size();
      std::span<float const> rows = root_logits_;
      if (dep > 0) {
        if (n_entries_ + m > room) break;  // the head's cache is full
        for (std::size_t r = 0; r < m; ++r)
          batch_nodes_[r] = static_cast<std::int32_t>(level[r] - 1);
        expand(m, dep);
        rows = logits_;
      }
      for (std::size_t r = 0; r < m; ++r) {
        std::size_t const parent = level[r];
        std::span<float const> const row = rows.subspan(r * v, v);
        std::span<token_id> const top = std::span<token_id>(ranked_).first(child_ranks_[parent]);
        detail::top_ranks(row, top.size(), top, "eagle_proposer");
        double const lse = log_sum_exp(row);
        for (std::size_t c = parent + 1; c <= n; ++c) {
          if (static_cast<std::size_t>(shape_.parent(c)) != parent) continue;
          token_id const id = top[static_cast<std::size_t>(shape_.rank(c))];
          tokens_[c] = target_id(id);
          nodes_[c - 1].token = tokens_[c];
          log_prob_[c] =
              log_prob_[parent] + static_cast<double>(row[static_cast<std::size_t>(id)]) - lse;
          ++drafted;
        }
      }
    }
    // Nodes below the depth reached (a full head cache or context) keep a log-probability of
    // -infinity and are pruned with a budget of at most the nodes drafted.
    writer_.write(shape_, tokens_, log_prob_, std::min(budget, drafted), tree);
  }

  Runner* runner_;
  eagle_tree_config config_;
  sparse_tree shape_ = sparse_tree::chain(0);
  bool static_ = false;
  std::vector<std::size_t> child_ranks_;          // static: [size + 1] ranks a node's children use
  std::vector<std::vector<std::size_t>> levels_;  // static: [depth] the expanded nodes per depth
  detail::sparse_tree_writer writer_;             // static: emission pruned to the budget
  std::vector<token_id> tokens_;                  // static: [size + 1] the token of every node
  std::vector<double> log_prob_;                  // static: [size + 1] log path probability

  std::size_t committed_ = 0;       // committed pairs in the head's cache
  std::vector<float> pending_;      // [pending_rows_, feature width] rows of pairs not yet fed
  std::size_t pending_rows_ = 0;    // pairs committed_, committed_ + 1, ... waiting in pending_
  std::vector<token_id> history_;   // the committed tokens at the last step (root included)
  bool have_out_ = false;           // whether last_out_ holds the last pair's output
  std::vector<float> last_out_;     // [dim] the output of the last committed pair
  std::vector<float> root_logits_;  // [draft_vocab] its logits
  std::vector<position_t> feed_positions_;
  std::vector<float> feed_out_;  // [rows, dim] the outputs of the pairs fed this step

  std::vector<node> nodes_;  // candidates (dynamic) or shape nodes (static)
  std::size_t n_nodes_ = 0, n_entries_ = 0, n_outs_ = 0;
  std::vector<float> outs_;    // [expanded, dim] outputs of the expanded nodes
  std::vector<float> logits_;  // [widest batch, draft_vocab]
  std::vector<float> exp_;     // [draft_vocab] scratch of log_sum_exp
  std::vector<float> in_;      // [widest batch, dim] a batch's inputs
  std::vector<token_id> batch_tokens_;
  std::vector<position_t> batch_positions_;
  std::vector<std::int32_t> batch_nodes_;
  std::vector<token_id> ranked_;     // top ranks of one row
  std::vector<std::int32_t> order_;  // candidates by confidence
  std::vector<std::uint64_t> mask_;  // [widest batch, mask words]
};

}  // namespace specdec
