#pragma once
//! \file
//! `draft_tree`: what a proposer drafts and a verifier checks. Node 0 is the root (the last
//! committed token, not yet in the target's KV cache); every other node is a candidate token whose
//! parent precedes it (nodes are stored in topological order). A chain is a tree whose nodes each
//! have one child.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"

namespace specdec {

//! A tree of draft tokens rooted at the last committed token.
//!
//! Per node it stores the token, the parent (-1 for the root), the depth (0 for the root), the
//! children in insertion order, and a bit-packed ancestor mask: bit j of row i is set when node j
//! is node i or one of its ancestors, which is exactly the attention visibility of node i over the
//! tree (`mask()`, rows `mask_stride()` words apart).
//!
//! Optionally it stores draft distributions ("q rows") for proposers that sample: q row n is the
//! distribution over the vocabulary from which the children of node n were drawn. For a chain,
//! q row i - 1 is the distribution node i was drawn from. Trees with q rows may hold duplicate
//! siblings (children drawn i.i.d. can repeat); trees without may not.
//!
//! Capacity is fixed at construction (at most `max_tree_nodes`); building within capacity does not
//! allocate, so a tree can be reused every step through `reset`.
class draft_tree {
 public:
  //! A tree able to hold `capacity` nodes (root included).
  explicit draft_tree(std::size_t capacity = 64) { reserve(capacity); }

  //! Sets the node capacity (root included); must be in [1, max_tree_nodes] and >= size().
  void reserve(std::size_t capacity) {
    SPECDEC_CHECK(capacity >= 1 && capacity <= max_tree_nodes, invalid_argument,
                  "draft_tree: capacity ", capacity, " is outside [1, ", max_tree_nodes, "]");
    SPECDEC_CHECK(capacity >= size(), invalid_argument, "draft_tree: capacity ", capacity,
                  " is below the current size ", size());
    std::size_t const stride = mask_words(capacity);
    if (stride != stride_ && !tokens_.empty()) {
      std::vector<std::uint64_t> mask(capacity * stride, 0);
      for (std::size_t i = 0; i < size(); ++i)
        std::copy_n(mask_.begin() + static_cast<std::ptrdiff_t>(i * stride_), stride_,
                    mask.begin() + static_cast<std::ptrdiff_t>(i * stride));
      mask_ = std::move(mask);
    } else {
      mask_.resize(capacity * stride);
    }
    stride_ = stride;
    capacity_ = capacity;
    tokens_.reserve(capacity);
    parents_.reserve(capacity);
    depths_.reserve(capacity);
    first_child_.reserve(capacity);
    next_sibling_.reserve(capacity);
    num_children_.reserve(capacity);
    if (vocab_ != 0) q_.resize(capacity * vocab_);
  }

  //! Empties the tree and sets its root token. Keeps capacity and whether q rows are stored.
  void reset(token_id root) {
    SPECDEC_CHECK(root >= 0, out_of_range, "draft_tree: root token ", root, " is negative");
    tokens_.clear();
    parents_.clear();
    depths_.clear();
    first_child_.clear();
    next_sibling_.clear();
    num_children_.clear();
    max_depth_ = 0;
    push(root, -1, 0);
  }

  //! Stores q rows of `vocab` entries from now on (vocab = 0 stops storing them). The proposer
  //! writes the q row of every node that gets children; other rows are not read.
  void enable_q(std::size_t vocab) {
    vocab_ = vocab;
    q_.assign(vocab * capacity_, 0.0f);
  }

  //! Appends a node with `token` under `parent` and returns its index.
  //! Throws `errc::out_of_range` for a bad parent or negative token, `errc::context_overflow` when
  //! full, `errc::invalid_argument` for a duplicate sibling in a tree without q rows.
  node_index add_node(node_index parent, token_id token) {
    SPECDEC_CHECK(!tokens_.empty(), invalid_argument, "draft_tree: add_node before reset(root)");
    SPECDEC_CHECK(parent >= 0 && static_cast<std::size_t>(parent) < size(), out_of_range,
                  "draft_tree: parent ", parent, " of new node ", size(),
                  " is not an existing node");
    SPECDEC_CHECK(token >= 0, out_of_range, "draft_tree: node ", size(), " has negative token ",
                  token);
    SPECDEC_CHECK(size() < capacity_, context_overflow, "draft_tree: cannot add node ", size(),
                  ": capacity is ", capacity_, " nodes");
    if (vocab_ == 0) {
      for (node_index c = first_child_[static_cast<std::size_t>(parent)]; c >= 0;
           c = next_sibling_[static_cast<std::size_t>(c)]) {
        SPECDEC_CHECK(tokens_[static_cast<std::size_t>(c)] != token, invalid_argument,
                      "draft_tree: duplicate sibling: token ", token, " is already child ", c,
                      " of node ", parent);
      }
    }
    return push(token, parent, depths_[static_cast<std::size_t>(parent)] + 1);
  }

  //! A chain: root, then `drafts` in order.
  [[nodiscard]] static draft_tree chain(token_id root, std::span<token_id const> drafts) {
    draft_tree tree(drafts.size() + 1);
    tree.reset(root);
    node_index prev = 0;
    for (token_id t : drafts) prev = tree.add_node(prev, t);
    return tree;
  }

  //! The union of root-to-leaf `paths` (each a token sequence after the root), sharing prefixes.
  [[nodiscard]] static draft_tree from_paths(token_id root,
                                             std::span<std::vector<token_id> const> paths) {
    std::size_t total = 1;
    for (auto const& p : paths) total += p.size();
    draft_tree tree(std::clamp<std::size_t>(total, 1, max_tree_nodes));
    tree.reset(root);
    for (auto const& path : paths) {
      node_index at = 0;
      for (token_id t : path) {
        node_index const found = tree.find_child(at, t);
        at = found >= 0 ? found : tree.add_node(at, t);
      }
    }
    return tree;
  }

  //! A tree from explicit arrays: node i has `tokens[i]` and parent `parents[i]` (parents[0] must
  //! be -1 and every other parent must precede its child). Rejects bad parents and cycles.
  [[nodiscard]] static draft_tree from_parents(std::span<token_id const> tokens,
                                               std::span<node_index const> parents) {
    SPECDEC_CHECK(tokens.size() == parents.size(), invalid_argument, "draft_tree: ", tokens.size(),
                  " tokens but ", parents.size(), " parents");
    SPECDEC_CHECK(!tokens.empty(), invalid_argument, "draft_tree: a tree needs a root");
    SPECDEC_CHECK(tokens.size() <= max_tree_nodes, context_overflow, "draft_tree: ", tokens.size(),
                  " nodes exceed the limit of ", max_tree_nodes);
    SPECDEC_CHECK(parents[0] == -1, invalid_argument, "draft_tree: the root (node 0) has parent ",
                  parents[0], ", expected -1");
    for (std::size_t i = 1; i < parents.size(); ++i) {
      node_index const p = parents[i];
      SPECDEC_CHECK(p >= 0 && static_cast<std::size_t>(p) < parents.size(), out_of_range,
                    "draft_tree: node ", i, " has parent ", p, ", not a node of this ",
                    parents.size(), "-node tree");
      if (static_cast<std::size_t>(p) >= i) {
        // Follow the parent chain: reaching i again is a cycle, else the order is just wrong.
        std::size_t at = i;
        for (std::size_t steps = 0; steps <= parents.size(); ++steps) {
          node_index const next = parents[at];
          if (next < 0) break;
          at = static_cast<std::size_t>(next);
          SPECDEC_CHECK(at != i, invalid_argument, "draft_tree: node ", i,
                        " is its own ancestor (a cycle through parent ", p, ")");
        }
        SPECDEC_THROW(invalid_argument, "draft_tree: node ", i, " has parent ", p,
                      " which does not precede it (nodes must be in topological order)");
      }
    }
    draft_tree tree(tokens.size());
    tree.reset(tokens[0]);
    for (std::size_t i = 1; i < tokens.size(); ++i) tree.add_node(parents[i], tokens[i]);
    return tree;
  }

  //! Number of nodes, root included.
  [[nodiscard]] std::size_t size() const noexcept { return tokens_.size(); }
  //! Number of draft nodes (root excluded).
  [[nodiscard]] std::size_t num_drafted() const noexcept { return size() == 0 ? 0 : size() - 1; }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] bool empty() const noexcept { return tokens_.empty(); }

  [[nodiscard]] token_id root() const noexcept { return tokens_.front(); }
  [[nodiscard]] token_id token(node_index i) const noexcept { return tokens_[idx(i)]; }
  [[nodiscard]] node_index parent(node_index i) const noexcept { return parents_[idx(i)]; }
  [[nodiscard]] std::int32_t depth(node_index i) const noexcept { return depths_[idx(i)]; }
  [[nodiscard]] std::int32_t max_depth() const noexcept { return max_depth_; }
  [[nodiscard]] std::int32_t num_children(node_index i) const noexcept {
    return num_children_[idx(i)];
  }
  //! First child of node i in insertion order, or -1.
  [[nodiscard]] node_index first_child(node_index i) const noexcept { return first_child_[idx(i)]; }
  //! Next sibling of node i in insertion order, or -1.
  [[nodiscard]] node_index next_sibling(node_index i) const noexcept {
    return next_sibling_[idx(i)];
  }
  //! Whether this tree is a chain (every node has at most one child).
  [[nodiscard]] bool is_chain() const noexcept {
    return static_cast<std::size_t>(max_depth_) + 1 == size();
  }
  //! The child of `node` carrying `token`, or -1.
  [[nodiscard]] node_index find_child(node_index node, token_id token) const noexcept {
    for (node_index c = first_child_[idx(node)]; c >= 0; c = next_sibling_[idx(c)])
      if (tokens_[idx(c)] == token) return c;
    return -1;
  }

  //! Writes into `out` (resized to size()) the absolute position of every node when the root
  //! sits at position `base`: base + depth. The positions a forward scores the tree at.
  void positions(position_t base, std::vector<position_t>& out) const {
    out.resize(size());
    for (std::size_t i = 0; i < size(); ++i) out[i] = base + depths_[i];
  }
  //! Writes into `out` the nodes from the root's child down to `node` (node included; empty for
  //! the root): the path a verifier accepts when it accepts `node`.
  void path_to(node_index node, std::vector<node_index>& out) const {
    out.clear();
    for (node_index a = node; a > 0; a = parents_[idx(a)]) out.push_back(a);
    std::reverse(out.begin(), out.end());
  }

  [[nodiscard]] std::span<token_id const> tokens() const noexcept { return tokens_; }
  [[nodiscard]] std::span<node_index const> parents() const noexcept { return parents_; }
  [[nodiscard]] std::span<std::int32_t const> depths() const noexcept { return depths_; }

  //! The ancestor mask, [size(), mask_stride()] 64-bit words, row-major; bit j of row i (word
  //! j / 64, bit j % 64) is set when node j is node i or an ancestor of node i.
  [[nodiscard]] std::span<std::uint64_t const> mask() const noexcept {
    return std::span<std::uint64_t const>(mask_.data(), size() * stride_);
  }
  //! Words per mask row (>= mask_words(size())).
  [[nodiscard]] std::size_t mask_stride() const noexcept { return stride_; }
  //! Whether node j is node i or one of its ancestors.
  [[nodiscard]] bool is_ancestor_or_self(node_index j, node_index i) const noexcept {
    return (mask_[idx(i) * stride_ + idx(j) / 64] >> (idx(j) % 64)) & 1u;
  }

  //! Vocabulary of the q rows, or 0 when none are stored.
  [[nodiscard]] std::size_t q_vocab() const noexcept { return vocab_; }
  [[nodiscard]] bool has_q() const noexcept { return vocab_ != 0; }
  //! q row of node i: the distribution its children were drawn from. [q_vocab()] floats.
  [[nodiscard]] std::span<float> q_row(node_index i) noexcept {
    return std::span<float>(q_.data() + idx(i) * vocab_, vocab_);
  }
  [[nodiscard]] std::span<float const> q_row(node_index i) const noexcept {
    return std::span<float const>(q_.data() + idx(i) * vocab_, vocab_);
  }
  //! All q rows as a [size(), q_vocab()] view.
  [[nodiscard]] matrix_view<float const> q_rows() const {
    return has_q() ? matrix_view<float const>(q_.data(), size(), vocab_)
                   : matrix_view<float const>();
  }

  //! Checks that every token is below `vocab` and, with q rows, that the vocabularies agree and
  //! every q row with children is a finite distribution. Throws `specdec::error` naming the node.
  void validate(std::size_t vocab) const {
    SPECDEC_CHECK(!empty(), invalid_argument, "draft_tree: empty tree (no root)");
    for (std::size_t i = 0; i < size(); ++i)
      SPECDEC_CHECK(static_cast<std::size_t>(tokens_[i]) < vocab, out_of_range, "draft_tree: node ",
                    i, " has token ", tokens_[i], ", outside the vocabulary of ", vocab);
    if (!has_q()) return;
    SPECDEC_CHECK(vocab_ == vocab, invalid_argument, "draft_tree: q rows have ", vocab_,
                  " entries but the vocabulary has ", vocab);
    for (std::size_t i = 0; i < size(); ++i) {
      if (num_children_[i] == 0) continue;
      double sum = 0.0;
      for (float v : q_row(static_cast<node_index>(i))) {
        SPECDEC_CHECK(std::isfinite(v) && v >= 0.0f, numerical, "draft_tree: q row ", i,
                      " has an entry ", v, " that is not a finite probability");
        sum += v;
      }
      SPECDEC_CHECK(std::abs(sum - 1.0) < 1e-3, numerical, "draft_tree: q row ", i, " sums to ",
                    sum, ", not 1");
    }
  }

  //! Graphviz text for the tree; `label` turns a token into its label (default: the id).
  [[nodiscard]] std::string to_dot(std::function<std::string(token_id)> const& label = {}) const {
    std::string out = "digraph draft_tree {\n  node [shape=box];\n";
    for (std::size_t i = 0; i < size(); ++i) {
      std::string text = label ? label(tokens_[i]) : std::to_string(tokens_[i]);
      std::string escaped;
      for (char ch : text) {
        if (ch == '"' || ch == '\\') escaped += '\\';
        if (ch == '\n') {
          escaped += "\\n";
          continue;
        }
        escaped += ch;
      }
      out +=
          "  n" + std::to_string(i) + " [label=\"" + std::to_string(i) + ": " + escaped + "\"];\n";
      if (parents_[i] >= 0)
        out += "  n" + std::to_string(parents_[i]) + " -> n" + std::to_string(i) + ";\n";
    }
    out += "}\n";
    return out;
  }

 private:
  static std::size_t idx(node_index i) noexcept { return static_cast<std::size_t>(i); }

  node_index push(token_id token, node_index parent, std::int32_t depth) {
    auto const i = static_cast<node_index>(tokens_.size());
    tokens_.push_back(token);
    parents_.push_back(parent);
    depths_.push_back(depth);
    first_child_.push_back(-1);
    next_sibling_.push_back(-1);
    num_children_.push_back(0);
    max_depth_ = std::max(max_depth_, depth);
    std::uint64_t* row = mask_.data() + idx(i) * stride_;
    // Trees of up to 64 nodes (one mask word, the usual case) copy the word without a call.
    if (parent >= 0) {
      if (stride_ == 1)
        row[0] = mask_[idx(parent)];
      else
        std::copy_n(mask_.data() + idx(parent) * stride_, stride_, row);
      // Append to the parent's children, keeping insertion order.
      if (first_child_[idx(parent)] < 0) {
        first_child_[idx(parent)] = i;
      } else {
        node_index c = first_child_[idx(parent)];
        while (next_sibling_[idx(c)] >= 0) c = next_sibling_[idx(c)];
        next_sibling_[idx(c)] = i;
      }
      ++num_children_[idx(parent)];
    } else if (stride_ == 1) {
      row[0] = 0;
    } else {
      std::fill_n(row, stride_, 0);
    }
    row[idx(i) / 64] |= std::uint64_t{1} << (idx(i) % 64);
    return i;
  }

  std::vector<token_id> tokens_;
  std::vector<node_index> parents_;
  std::vector<std::int32_t> depths_;
  std::vector<node_index> first_child_;
  std::vector<node_index> next_sibling_;
  std::vector<std::int32_t> num_children_;
  std::vector<std::uint64_t> mask_;
  std::vector<float> q_;
  std::size_t stride_ = 0;
  std::size_t capacity_ = 0;
  std::size_t vocab_ = 0;
  std::int32_t max_depth_ = 0;
};

}  // namespace specdec
