#pragma once
//! \file
//! The sparse candidate trees of the draft-head proposers (propose/medusa.hpp, propose/hydra.hpp):
//! `sparse_tree`, the tree's shape as ranks of the heads' rankings (the reference's
//! `medusa_choices`), given explicitly or built from measured per-head accuracies by the Medusa
//! paper's greedy construction; `head_accuracy`, those accuracies; and the steps both proposers
//! share: the top-ranked tokens of a head's logits and the emission of a drafted tree, pruned to a
//! node budget by estimated path probability.
//!
//! A node at depth d with rank k holds the k-th most likely token (0 = the argmax; ties to the
//! lower id) of head d - 1's logits evaluated for its parent (Medusa: the same ranking for every
//! parent at one depth; Hydra: the ranking of head d - 1 on the parent's path).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <queue>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"
#include "specdec/model/heads.hpp"

namespace specdec {

//! Measured accuracies of K draft heads by rank: at(i, k) is the fraction of positions where the
//! token head i should predict is its rank-k token (k < ranks). Collected by `add`.
class head_accuracy {
 public:
  //! Counters for `heads` heads and the ranks [0, `ranks`).
  head_accuracy(std::size_t heads, std::size_t ranks)
      : heads_(heads), ranks_(ranks), hits_(heads * ranks, 0), positions_(heads, 0) {
    SPECDEC_CHECK(heads >= 1 && ranks >= 1, invalid_argument, "head_accuracy: ", heads,
                  " heads and ", ranks, " ranks");
  }

  //! From a table [heads][ranks] of fractions in [0, 1] (e.g. measured elsewhere).
  explicit head_accuracy(std::vector<std::vector<double>> const& table)
      : head_accuracy(table.size(), table.empty() ? 0 : table.front().size()) {
    fractions_.assign(heads_ * ranks_, 0.0);
    for (std::size_t i = 0; i < heads_; ++i) {
      SPECDEC_CHECK(table[i].size() == ranks_, invalid_argument, "head_accuracy: head ", i, " has ",
                    table[i].size(), " ranks, head 0 has ", ranks_);
      for (std::size_t k = 0; k < ranks_; ++k) {
        double const a = table[i][k];
        SPECDEC_CHECK(std::isfinite(a) && a >= 0.0 && a <= 1.0, invalid_argument,
                      "head_accuracy: accuracy ", a, " of head ", i, " at rank ", k,
                      " is not in [0, 1]");
        fractions_[i * ranks_ + k] = a;
      }
    }
  }

  //! Records one position of head `head` whose expected token is `label`, with the head's
  //! `logits` there: counts a hit at the label's rank (ties to the lower id) when it is below
  //! `ranks()`.
  void add(std::size_t head, std::span<float const> logits, token_id label) {
    SPECDEC_CHECK(head < heads_ && label >= 0 && static_cast<std::size_t>(label) < logits.size(),
                  invalid_argument, "head_accuracy::add: head ", head, ", label ", label);
    float const value = logits[static_cast<std::size_t>(label)];
    std::size_t rank = 0;
    for (std::size_t j = 0; j < logits.size() && rank < ranks_; ++j)
      if (logits[j] > value || (logits[j] == value && j < static_cast<std::size_t>(label))) ++rank;
    ++positions_[head];
    if (rank < ranks_) ++hits_[head * ranks_ + rank];
    fractions_.clear();
  }

  //! Number of heads.
  [[nodiscard]] std::size_t heads() const noexcept { return heads_; }
  //! Ranks measured per head.
  [[nodiscard]] std::size_t ranks() const noexcept { return ranks_; }
  //! Positions recorded for head `i`.
  [[nodiscard]] std::size_t positions(std::size_t i) const noexcept { return positions_[i]; }
  //! The fraction of head i's positions whose token was its rank-k token.
  [[nodiscard]] double at(std::size_t i, std::size_t k) const noexcept {
    if (!fractions_.empty()) return fractions_[i * ranks_ + k];
    return positions_[i] == 0
               ? 0.0
               : static_cast<double>(hits_[i * ranks_ + k]) / static_cast<double>(positions_[i]);
  }
  //! The table [heads][ranks] of `at`.
  [[nodiscard]] std::vector<std::vector<double>> table() const {
    std::vector<std::vector<double>> t(heads_, std::vector<double>(ranks_));
    for (std::size_t i = 0; i < heads_; ++i)
      for (std::size_t k = 0; k < ranks_; ++k) t[i][k] = at(i, k);
    return t;
  }

 private:
  std::size_t heads_, ranks_;
  std::vector<std::size_t> hits_;       // [heads, ranks]
  std::vector<std::size_t> positions_;  // [heads]
  std::vector<double> fractions_;       // [heads, ranks] when given as a table
};

//! The shape of a sparse candidate tree: node 0 is the root, nodes 1..size() the drafted nodes in
//! canonical order (by depth, then lexicographically by path: parents before children), each with
//! its parent, depth and rank. Built from explicit paths (`from_choices`) or from accuracies
//! (`build`).
class sparse_tree {
 public:
  //! The tree of `choices` (tree.json's paths, in any order). Throws `errc::invalid_argument`
  //! naming the path when one repeats, lacks its parent path, is empty or has a negative rank,
  //! and when there are more than max_tree_nodes - 1 paths.
  [[nodiscard]] static sparse_tree from_choices(tree_choices const& choices) {
    SPECDEC_CHECK(choices.size() < max_tree_nodes, invalid_argument,
                  "sparse_tree: ", choices.size(), " paths, the most a tree can hold is ",
                  max_tree_nodes - 1);
    tree_choices sorted = choices;
    std::sort(sorted.begin(), sorted.end(), [](auto const& a, auto const& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
    std::map<std::vector<std::int32_t>, std::int32_t> index;
    index[{}] = 0;
    sparse_tree t;
    for (std::vector<std::int32_t> const& path : sorted) {
      SPECDEC_CHECK(!path.empty(), invalid_argument, "sparse_tree: an empty path");
      for (std::int32_t k : path)
        SPECDEC_CHECK(k >= 0, invalid_argument, "sparse_tree: path ", text(path),
                      " has a negative rank");
      SPECDEC_CHECK(!index.contains(path), invalid_argument, "sparse_tree: path ", text(path),
                    " is given twice");
      std::vector<std::int32_t> const parent(path.begin(), path.end() - 1);
      auto const it = index.find(parent);
      SPECDEC_CHECK(it != index.end(), invalid_argument, "sparse_tree: path ", text(path),
                    " has no parent path ", text(parent), " in the tree");
      index[path] = static_cast<std::int32_t>(t.parents_.size());
      t.push(it->second, path.back());
    }
    return t;
  }

  //! The Medusa sparse tree of `nodes` drafted nodes for heads of accuracies `accuracy`: starting
  //! from the depth-1 candidates, repeatedly add the candidate path [k_1, ..., k_d] of highest
  //! expected acceptance prod_j at(j - 1, k_j) (ties: the lexicographically smaller path) and make
  //! its children (ranks [0, ranks) of the next head, up to the last head) candidates. Fewer nodes
  //! when the heads' ranks run out.
  [[nodiscard]] static sparse_tree build(head_accuracy const& accuracy, std::size_t nodes) {
    SPECDEC_CHECK(nodes < max_tree_nodes, invalid_argument, "sparse_tree::build: ", nodes,
                  " nodes, the most a tree can hold is ", max_tree_nodes - 1);
    using candidate = std::pair<double, std::vector<std::int32_t>>;
    auto const worse = [](candidate const& a, candidate const& b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    };
    std::priority_queue<candidate, std::vector<candidate>, decltype(worse)> heap(worse);
    for (std::size_t k = 0; k < accuracy.ranks(); ++k)
      heap.push({accuracy.at(0, k), {static_cast<std::int32_t>(k)}});
    tree_choices chosen;
    std::vector<double> expected;
    while (!heap.empty() && chosen.size() < nodes) {
      candidate c = heap.top();
      heap.pop();
      if (c.second.size() < accuracy.heads()) {
        for (std::size_t k = 0; k < accuracy.ranks(); ++k) {
          std::vector<std::int32_t> child = c.second;
          child.push_back(static_cast<std::int32_t>(k));
          heap.push({c.first * accuracy.at(c.second.size(), k), std::move(child)});
        }
      }
      chosen.push_back(std::move(c.second));
      expected.push_back(c.first);
    }
    sparse_tree t = from_choices(chosen);
    // Expected acceptance per node, in the canonical order.
    std::map<std::vector<std::int32_t>, double> by_path;
    for (std::size_t i = 0; i < chosen.size(); ++i) by_path[chosen[i]] = expected[i];
    tree_choices const canonical = t.choices();
    t.expected_.assign(t.size() + 1, 1.0);
    for (std::size_t i = 0; i < canonical.size(); ++i) t.expected_[i + 1] = by_path[canonical[i]];
    return t;
  }

  //! A chain of `depth` nodes, each the argmax of its head.
  [[nodiscard]] static sparse_tree chain(std::size_t depth) {
    tree_choices c;
    for (std::size_t d = 1; d <= depth; ++d) c.emplace_back(d, 0);
    return from_choices(c);
  }

  //! Drafted nodes (root excluded).
  [[nodiscard]] std::size_t size() const noexcept { return parents_.size() - 1; }
  //! The deepest node's depth (0 for a root alone).
  [[nodiscard]] std::size_t depth() const noexcept { return ranks_needed_.size(); }
  //! Parent of node i (-1 for the root).
  [[nodiscard]] std::int32_t parent(std::size_t i) const noexcept { return parents_[i]; }
  //! Depth of node i (0 for the root).
  [[nodiscard]] std::int32_t depth(std::size_t i) const noexcept { return depths_[i]; }
  //! Rank of node i in its head's ranking (-1 for the root).
  [[nodiscard]] std::int32_t rank(std::size_t i) const noexcept { return ranks_[i]; }
  //! Whether node i has children.
  [[nodiscard]] bool expanded(std::size_t i) const noexcept { return children_[i] > 0; }
  //! How many top tokens of head d (the one drafting depth d + 1) some node uses: max rank + 1.
  [[nodiscard]] std::size_t ranks_needed(std::size_t d) const noexcept { return ranks_needed_[d]; }
  //! The expected acceptance of node i from the accuracies it was built from (1 for the root), or
  //! empty for a tree given by its paths.
  [[nodiscard]] std::span<double const> expected() const noexcept { return expected_; }
  //! 1 + the sum of the nodes' expected acceptance: the expected tokens per step (0 when the tree
  //! was given by its paths).
  [[nodiscard]] double expected_length() const noexcept {
    double s = 0.0;
    for (double e : expected_) s += e;
    return s;
  }

  //! The path of ranks of every drafted node, in the canonical order (tree.json's content).
  [[nodiscard]] tree_choices choices() const {
    tree_choices out(size());
    for (std::size_t i = 1; i < parents_.size(); ++i) {
      out[i - 1] = parents_[i] == 0 ? std::vector<std::int32_t>{}
                                    : out[static_cast<std::size_t>(parents_[i]) - 1];
      out[i - 1].push_back(ranks_[i]);
    }
    return out;
  }

 private:
  sparse_tree() : parents_{-1}, depths_{0}, ranks_{-1}, children_{0} {}

  void push(std::int32_t parent, std::int32_t rank) {
    auto const p = static_cast<std::size_t>(parent);
    std::int32_t const d = depths_[p] + 1;
    parents_.push_back(parent);
    depths_.push_back(d);
    ranks_.push_back(rank);
    children_.push_back(0);
    ++children_[p];
    auto const head = static_cast<std::size_t>(d - 1);
    if (ranks_needed_.size() <= head) ranks_needed_.resize(head + 1, 0);
    ranks_needed_[head] = std::max(ranks_needed_[head], static_cast<std::size_t>(rank) + 1);
  }

  static std::string text(std::vector<std::int32_t> const& path) {
    return tree_choices_text({path}).substr(1, tree_choices_text({path}).size() - 3);
  }

  std::vector<std::int32_t> parents_, depths_, ranks_, children_;
  std::vector<std::size_t> ranks_needed_;  // [depth]
  std::vector<double> expected_;           // [size + 1] when built from accuracies
};

namespace detail {

//! out[0..k) = the k highest entries of `row` by value, descending, ties to the lower id
//! (k <= out.size(), k <= row.size()). Throws `errc::numerical` (naming `who`) for a NaN.
inline void top_ranks(std::span<float const> row, std::size_t k, std::span<token_id> out,
                      char const* who) {
  SPECDEC_ASSERT(k <= out.size() && k <= row.size());
  std::size_t have = 0;
  bool nan = false;
  for (std::size_t j = 0; j < row.size(); ++j) {
    float const v = row[j];
    nan = nan || v != v;
    if (have == k && !(v > row[static_cast<std::size_t>(out[k - 1])])) continue;
    std::size_t at = have < k ? have++ : k - 1;  // the slot it takes, then moved up
    while (at > 0 && v > row[static_cast<std::size_t>(out[at - 1])]) {
      out[at] = out[at - 1];
      --at;
    }
    out[at] = static_cast<token_id>(j);
  }
  SPECDEC_CHECK(!nan, numerical, who, ": a head produced NaN logits");
}

//! Throws `errc::invalid_argument` (naming `who`) when `shape` is deeper than `heads` heads.
inline void check_tree_depth(sparse_tree const& shape, std::size_t heads, char const* who) {
  SPECDEC_CHECK(shape.depth() <= heads, invalid_argument, who, ": a tree of depth ", shape.depth(),
                " needs more than the ", heads, " heads");
}

//! The start of a draft-head proposer's step: resets `tree` to the root ctx.tokens.back() (without
//! q rows: the candidates are point masses), sets `budget` to min(ctx.max_nodes, tree.capacity()
//! - 1), and returns the hidden row the heads read (the last row of ctx.target_hidden), or an
//! empty span when nothing is to be drafted (no budget, an empty shape, no hidden row). Throws
//! `errc::invalid_argument` (naming `who`) for no committed token or a row of the wrong width.
[[nodiscard]] inline std::span<float const> start_heads_step(propose_context const& ctx,
                                                             draft_tree& tree,
                                                             sparse_tree const& shape,
                                                             std::size_t hidden_size,
                                                             std::size_t& budget, char const* who) {
  SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument, who, ": propose with no committed tokens");
  tree.reset(ctx.tokens.back());
  if (tree.has_q()) tree.enable_q(0);
  budget = std::min(ctx.max_nodes, tree.capacity() - 1);
  if (budget == 0 || shape.size() == 0 || ctx.target_hidden.empty()) return {};
  SPECDEC_CHECK(ctx.target_hidden.cols() == hidden_size, invalid_argument, who, ": hidden rows of ",
                ctx.target_hidden.cols(), " floats for heads reading ", hidden_size);
  return ctx.target_hidden.row(ctx.target_hidden.rows() - 1);
}

//! Checks the inputs of an accuracy measurement: one hidden row of `width` floats per token.
inline void check_measure_inputs(matrix_view<float const> hidden, std::span<token_id const> tokens,
                                 std::size_t width, char const* who) {
  SPECDEC_CHECK(hidden.rows() == tokens.size() && hidden.cols() == width, invalid_argument, who,
                ": ", hidden.rows(), " x ", hidden.cols(), " hidden rows for ", tokens.size(),
                " tokens and heads of width ", width);
}

//! log(sum exp(row)) in double (the log-normaliser of a head's softmax).
[[nodiscard]] inline double log_sum_exp(std::span<float const> row) noexcept {
  float top = -std::numeric_limits<float>::infinity();
  for (float v : row) top = std::max(top, v);
  if (!std::isfinite(top)) return static_cast<double>(top);
  double s = 0.0;
  for (float v : row) s += std::exp(static_cast<double>(v) - static_cast<double>(top));
  return static_cast<double>(top) + std::log(s);
}

//! Writes a drafted sparse tree into a `draft_tree`, pruned to a node budget; owns its scratch
//! (sized once per tree shape, so that drafting does not allocate).
class sparse_tree_writer {
 public:
  //! Appends to `out` (reset to its root) node i of `shape` (1..shape.size()) with token
  //! `tokens[i]` and log path probability `log_prob[i]` (estimated by the heads; read only when
  //! pruning). Keeps every node when they fit `budget`, else the `budget` nodes of highest path
  //! probability (ties: the earlier node); a child is never more probable than its parent, so the
  //! kept nodes form a subtree.
  void write(sparse_tree const& shape, std::span<token_id const> tokens,
             std::span<double const> log_prob, std::size_t budget, draft_tree& out) {
    std::size_t const n = shape.size();
    keep_.assign(n + 1, budget < n ? -1 : 1);
    keep_[0] = 0;
    if (budget < n) {
      order_.resize(n);
      for (std::size_t i = 0; i < n; ++i) order_[i] = static_cast<std::int32_t>(i + 1);
      std::sort(order_.begin(), order_.end(), [&](std::int32_t a, std::int32_t b) {
        double const pa = log_prob[static_cast<std::size_t>(a)];
        double const pb = log_prob[static_cast<std::size_t>(b)];
        return pa != pb ? pa > pb : a < b;
      });
      for (std::size_t i = 0; i < budget; ++i) keep_[static_cast<std::size_t>(order_[i])] = 1;
    }
    for (std::size_t i = 1; i <= n; ++i) {
      if (keep_[i] < 0) continue;
      std::int32_t const parent = keep_[static_cast<std::size_t>(shape.parent(i))];
      if (parent < 0) {  // unreachable (see above); keeps the tree well-formed regardless
        keep_[i] = -1;
        continue;
      }
      keep_[i] = out.add_node(parent, tokens[i]);
    }
  }

 private:
  std::vector<std::int32_t> keep_;   // [n + 1] the draft node of each shape node, or -1
  std::vector<std::int32_t> order_;  // [n] shape nodes by path probability
};

}  // namespace detail

}  // namespace specdec
