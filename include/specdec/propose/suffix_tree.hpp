#pragma once
//! \file
//! `suffix_tree`: a depth-limited suffix tree over a growing set of token sequences, with the
//! drafting query of SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975). The data structure of
//! `suffix_proposer` (propose/suffix.hpp), usable alone.
//!
//! What it holds: every suffix instance (sequence s, start i) of every sequence, cut to its first
//! `depth` tokens, as a path from the root. A node stands for the edge of tokens leading to it
//! (path compression: an edge is a range (sequence, position, length) of a stored sequence, so the
//! memory is linear in the tokens kept) and counts the suffix instances whose path enters it.
//! Every suffix instance ends exactly at the end of a node's edge, so a path that ends inside an
//! edge has the count of that edge's node, and the probability of a continuation is the ratio of
//! the child's count to the parent's. No node has one child of equal count (such pairs are merged:
//! the tree is canonical, the same for the same multiset of sequences, whatever the order in which
//! their tokens were appended). Children are kept in order of count descending, then token id
//! ascending, so the most frequent child is the first (O(1)); the root's children are also
//! indexed by token id, and those of a node with at least 8 children by a hash index.
//!
//! Appending a token to a sequence costs O(depth) node updates (each of the sequence's at most
//! `depth` active suffixes, kept in a ring, moves one token deeper), plus the walks along sibling
//! lists of fewer than 8 children to find a child, and the move of a child whose count grew
//! forward past the siblings it now outranks.
//!
//! Drafting (`speculate`), for a context c: for each match length m = 1, 2, ... up to min(|c|,
//! depth) whose last m tokens of c occur in the tree (stopping at the first m that does not), up to
//! min(max_tokens, floor(m factor + offset)) tokens are drafted from where the match ends, in one
//! of two ways:
//! - path: follow the edge, then the most frequent child, multiplying the probability by each
//!   child's share of its parent's count, while it stays at least `min_probability`;
//! - tree: best first: a priority queue of the continuations by probability (ties: the one queued
//!   first), each popped one drafted, its own continuations (the rest of its edge at the same
//!   probability, or its children at their probabilities if at least `min_probability`) queued.
//! The score of a draft is the sum of its nodes' probabilities, the expected number of accepted
//! tokens under the tree's statistics; the best score wins (ties: the longer match; an empty draft
//! reports no match). `speculate` finds that winner with few drafts: it drafts the matches by
//! decreasing bound of their score and stops at the first bound the best score reaches, and it
//! stops the search for longer matches at one with a single occurrence and nothing after it.
//!
//! Thread safety: none; `suffix_cache` (propose/suffix.hpp) shares one tree between threads.
//!
//! Its length is one topic's: the tree's update rules, its queries and `check()`, the invariant
//! checker the tests rely on, belong together (each rule is checked against the others).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"

namespace specdec {

//! How `suffix_tree::speculate` drafts (see the file comment).
struct suffix_speculation {
  std::size_t max_tokens = 16;   //!< most tokens drafted (nodes, in tree mode)
  float factor = 1.0f;           //!< a match of m tokens allows floor(m factor + offset) tokens
  float offset = 0.0f;           //!< (idem)
  float min_probability = 0.1f;  //!< continuations below this probability are not drafted
  bool tree = false;             //!< best-first tree instead of the most frequent path

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    SPECDEC_CHECK(max_tokens >= 1 && max_tokens < max_tree_nodes, invalid_argument,
                  "suffix_speculation: max_tokens = ", max_tokens, " is outside [1, ",
                  max_tree_nodes - 1, "]");
    SPECDEC_CHECK(std::isfinite(factor) && factor >= 0.0f && std::isfinite(offset),
                  invalid_argument, "suffix_speculation: factor = ", factor,
                  " and offset = ", offset, " must be finite, the factor non-negative");
    SPECDEC_CHECK(min_probability >= 0.0f && min_probability <= 1.0f, invalid_argument,
                  "suffix_speculation: min_probability = ", min_probability, " is outside [0, 1]");
  }
};

//! A draft from a suffix tree: tokens in the order drafted, each under an earlier one or under the
//! context's last token (parent -1).
struct suffix_draft {
  std::vector<token_id> tokens;       //!< [n] drafted tokens
  std::vector<std::int32_t> parents;  //!< [n] index of each token's parent, -1 for the root
  std::vector<float> probabilities;   //!< [n] each token's estimated probability of acceptance
  float score = 0.0f;                 //!< sum of probabilities
  std::size_t match_length = 0;       //!< tokens of context matched (0: nothing drafted)

  //! Empties the draft (keeps capacity).
  void clear() noexcept {
    tokens.clear();
    parents.clear();
    probabilities.clear();
    score = 0.0f;
    match_length = 0;
  }
  //! Number of drafted tokens.
  [[nodiscard]] std::size_t size() const noexcept { return tokens.size(); }
};

namespace detail {
//! A continuation waiting in tree mode's queue.
struct suffix_queued {
  float p;              //!< its probability
  std::uint32_t n;      //!< node
  std::uint32_t off;    //!< tokens of the node's edge already drafted
  std::int32_t parent;  //!< draft index of its parent, -1 for the root
  std::uint32_t order;  //!< queue order, for ties
};
}  // namespace detail

namespace detail {
//! A map from 64-bit keys (never ~0) to 32-bit values that only grows: open addressing with
//! linear probing in a power-of-two table at most half full.
class suffix_child_index {
 public:
  static constexpr std::uint32_t none = 0xFFFFFFFFu;  //!< no value

  //! The value of `key`, or none.
  [[nodiscard]] std::uint32_t find(std::uint64_t key) const noexcept {
    if (keys_.empty()) return none;
    std::size_t const mask = keys_.size() - 1;
    for (std::size_t i = slot(key, mask);; i = (i + 1) & mask) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == empty) return none;
    }
  }
  //! Sets the value of `key`.
  void set(std::uint64_t key, std::uint32_t value) {
    if (2 * (used_ + 1) > keys_.size()) grow();
    std::size_t const mask = keys_.size() - 1;
    std::size_t i = slot(key, mask);
    while (keys_[i] != key && keys_[i] != empty) i = (i + 1) & mask;
    if (keys_[i] == empty) {
      keys_[i] = key;
      ++used_;
    }
    values_[i] = value;
  }
  //! Forgets every key.
  void clear() noexcept {
    keys_.clear();
    values_.clear();
    used_ = 0;
  }
  [[nodiscard]] std::size_t size() const noexcept { return used_; }  //!< keys held
  //! Bytes held.
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return keys_.capacity() * sizeof(std::uint64_t) + values_.capacity() * sizeof(std::uint32_t);
  }

 private:
  static constexpr std::uint64_t empty = ~std::uint64_t{0};
  [[nodiscard]] static std::size_t slot(std::uint64_t key, std::size_t mask) noexcept {
    std::uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h ^ (h >> 32)) & mask;
  }
  void grow() {
    std::vector<std::uint64_t> keys(std::max<std::size_t>(64, 2 * keys_.size()), empty);
    std::vector<std::uint32_t> values(keys.size(), none);
    keys.swap(keys_);
    values.swap(values_);
    used_ = 0;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] != empty) set(keys[i], values[i]);
  }

  std::vector<std::uint64_t> keys_;
  std::vector<std::uint32_t> values_;
  std::size_t used_ = 0;
};
}  // namespace detail

namespace detail {
//! A match length queued for drafting, with the bound of its draft's score and its budget.
struct suffix_candidate {
  float bound;
  std::uint32_t m;
  std::uint32_t budget;
};
}  // namespace detail

//! Scratch of `suffix_tree::speculate`, reused across calls (one per thread).
struct suffix_workspace {
  suffix_draft candidate;                    //!< the draft of the match length being tried
  std::vector<detail::suffix_queued> queue;  //!< tree mode's priority queue
  //! [m - 1] where the context's last m tokens end in the tree: (node, tokens of its edge)
  std::vector<std::pair<std::uint32_t, std::uint32_t>> matches;
  std::vector<detail::suffix_candidate> order;  //!< the matches by decreasing bound
};

//! A depth-limited suffix tree over token sequences (see the file comment). Copyable.
class suffix_tree {
 public:
  using sequence_id = std::uint32_t;                    //!< a sequence's index, from 0
  static constexpr std::size_t max_depth = 256;         //!< largest `depth`
  static constexpr token_id max_token = (1 << 24) - 1;  //!< largest token id held
  static constexpr std::uint32_t none = 0xFFFFFFFFu;    //!< no node

  //! An empty tree keeping suffixes of at most `depth` tokens (in [1, max_depth]; else
  //! `errc::invalid_argument`).
  explicit suffix_tree(std::size_t depth = 24) : depth_(depth) {
    SPECDEC_CHECK(depth >= 1 && depth <= max_depth, invalid_argument, "suffix_tree: depth ", depth,
                  " is outside [1, ", max_depth, "]");
    clear();
  }

  //! Forgets every sequence.
  void clear() {
    nodes_.assign(1, node{});
    nodes_[0].length = 0;
    free_.clear();
    root_children_.clear();
    wide_children_.clear();
    sequences_.clear();
    tokens_ = 0;
  }

  //! Adds an empty sequence and returns its id.
  sequence_id add_sequence() {
    SPECDEC_CHECK(sequences_.size() < none, out_of_range, "suffix_tree: too many sequences");
    sequences_.emplace_back();
    sequences_.back().active.assign(depth_, 0);
    return static_cast<sequence_id>(sequences_.size() - 1);
  }

  //! Appends `token` to sequence `s`. Throws `errc::out_of_range` for an unknown or finished
  //! sequence or a token outside [0, max_token].
  void append(sequence_id s, token_id token) {
    SPECDEC_CHECK(s < sequences_.size() && !sequences_[s].finished, out_of_range,
                  "suffix_tree: append to ", s < sequences_.size() ? "finished" : "unknown",
                  " sequence ", s);
    SPECDEC_CHECK(token >= 0 && token <= max_token, out_of_range, "suffix_tree: token ", token,
                  " is outside [0, ", max_token, "]");
    SPECDEC_CHECK(sequences_[s].tokens.size() < none - 1 && nodes_.size() < none - 2, out_of_range,
                  "suffix_tree: sequence ", s, " or the tree is too large");
    sequence& q = sequences_[s];
    // The empty suffix starting at the new token joins the window; a suffix of `depth` tokens
    // leaves it (it cannot grow).
    if (q.count == depth_) {
      q.head = (q.head + 1) % depth_;
      --q.count;
    }
    q.active[(q.head + q.count) % depth_] = 0;
    ++q.count;
    q.tokens.push_back(token);
    ++tokens_;
    ++nodes_[0].count;
    auto const at = static_cast<std::uint32_t>(q.tokens.size() - 1);
    std::size_t slot = q.head;
    for (std::size_t i = 0; i < q.count; ++i) {
      q.active[slot] = extend(q.active[slot], s, token, at);
      if (++slot == depth_) slot = 0;
    }
  }

  //! Appends `tokens` to sequence `s` (as `append` each).
  void extend(sequence_id s, std::span<token_id const> tokens) {
    for (token_id const t : tokens) append(s, t);
  }

  //! Marks sequence `s` finished: it takes no more tokens, and its window is released.
  void finish(sequence_id s) {
    SPECDEC_CHECK(s < sequences_.size(), out_of_range, "suffix_tree: finish unknown sequence ", s);
    sequence& q = sequences_[s];
    q.finished = true;
    q.count = 0;
    q.active = {};
  }

  //! The tokens of sequence `s`.
  [[nodiscard]] std::span<token_id const> sequence_tokens(sequence_id s) const {
    SPECDEC_CHECK(s < sequences_.size(), out_of_range, "suffix_tree: unknown sequence ", s);
    return sequences_[s].tokens;
  }
  //! Whether sequence `s` is finished.
  [[nodiscard]] bool finished(sequence_id s) const {
    SPECDEC_CHECK(s < sequences_.size(), out_of_range, "suffix_tree: unknown sequence ", s);
    return sequences_[s].finished;
  }

  //! Number of suffix instances whose first |path| tokens are `path` (|path| <= depth; 0 beyond):
  //! the number of occurrences of `path` as a substring, counting only starts whose suffix reaches
  //! that far. The empty path counts every suffix instance.
  [[nodiscard]] std::size_t count(std::span<token_id const> path) const noexcept {
    if (path.size() > depth_) return 0;
    auto const [n, off] = locate(path);
    return n == none ? 0 : nodes_[n].count;
  }

  //! Drafts the continuation of `context` (see the file comment) into `out` (cleared first).
  //! `how` must be valid (`suffix_speculation::validate`).
  //! `work` holds the scratch (reused across calls; one per thread).
  void speculate(std::span<token_id const> context, suffix_speculation const& how,
                 suffix_draft& out, suffix_workspace& work) const {
    out.clear();
    suffix_draft& scratch = work.candidate;
    // Where each matching suffix of the context ends, shortest first.
    work.matches.clear();
    std::size_t const longest = std::min(context.size(), depth_);
    for (std::size_t m = 1; m <= longest; ++m) {
      auto const at = locate(context.last(m));
      if (at.first == none) break;
      work.matches.push_back(at);
      // One occurrence and nothing after it (in a request's own tree: the context's own end):
      // every longer match is that occurrence again, with nothing to draft.
      node const& x = nodes_[at.first];
      if (x.count == 1 && at.second == x.length && x.first_child == none) break;
    }
    // Each match's bound: a draft of b tokens below depth m has none of probability above the
    // first one's (the edge's 1, or the most frequent child's share), and depth - m levels. Matches
    // are drafted by decreasing bound (ties: the longer first) and one whose bound, with room for
    // rounding, does not exceed the best score is not drafted: it could not win. The winner is the
    // file comment's (the best score, ties to the longer match).
    work.order.clear();
    for (std::size_t m = 1; m <= work.matches.size(); ++m) {
      double const allowed = std::floor(static_cast<double>(m) * how.factor + how.offset + 1e-6);
      std::size_t const budget = allowed <= 0.0 ? 0
                                 : allowed >= static_cast<double>(how.max_tokens)
                                     ? how.max_tokens
                                     : static_cast<std::size_t>(allowed);
      auto const [n, off] = work.matches[m - 1];
      node const& x = nodes_[n];
      float const p1 = off < x.length          ? 1.0f
                       : x.first_child == none ? 0.0f
                                               : static_cast<float>(nodes_[x.first_child].count) /
                                                     static_cast<float>(x.count);
      // A path has at most one token per level; a tree's tokens of one level share at most
      // probability 1.
      auto const levels = static_cast<float>(depth_ - m);
      float const bound = (how.tree ? std::min(static_cast<float>(budget) * p1, levels)
                                    : std::min(static_cast<float>(budget), levels) * p1) *
                          1.001f;
      work.order.push_back(
          {bound, static_cast<std::uint32_t>(m), static_cast<std::uint32_t>(budget)});
    }
    std::sort(work.order.begin(), work.order.end(), [](auto const& a, auto const& b) {
      return a.bound != b.bound ? a.bound > b.bound : a.m > b.m;
    });
    bool any = false;
    for (detail::suffix_candidate const& c : work.order) {
      if (any && c.bound <= out.score) break;  // sorted: no later bound is higher
      auto const [n, off] = work.matches[c.m - 1];
      scratch.clear();
      if (how.tree)
        draft_tree_from(n, off, c.budget, how.min_probability, scratch, work.queue);
      else
        draft_path_from(n, off, c.budget, how.min_probability, scratch);
      if (!any || scratch.score > out.score ||
          (scratch.score == out.score && c.m > out.match_length)) {
        std::swap(out, scratch);
        out.match_length = c.m;
      }
      any = true;
    }
    if (out.size() == 0) out.match_length = 0;
  }

  //! As above, with a workspace of its own (allocates).
  void speculate(std::span<token_id const> context, suffix_speculation const& how,
                 suffix_draft& out) const {
    suffix_workspace work;
    speculate(context, how, out, work);
  }

  //! The longest suffix kept.
  [[nodiscard]] std::size_t depth() const noexcept { return depth_; }
  //! Number of sequences.
  [[nodiscard]] std::size_t num_sequences() const noexcept { return sequences_.size(); }
  //! Number of tokens held over all sequences.
  [[nodiscard]] std::size_t num_tokens() const noexcept { return tokens_; }
  //! Number of nodes, root included.
  [[nodiscard]] std::size_t num_nodes() const noexcept { return nodes_.size() - free_.size(); }
  //! Bytes held: nodes, the root's index, the sequences and their windows (capacities).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    std::size_t bytes = nodes_.capacity() * sizeof(node) + free_.capacity() * 4 +
                        root_children_.capacity() * 4 + sequences_.capacity() * sizeof(sequence) +
                        wide_children_.memory_bytes();
    for (sequence const& q : sequences_)
      bytes += q.tokens.capacity() * sizeof(token_id) + q.active.capacity() * 4;
    return bytes;
  }

  //! Checks every invariant (see the file comment) by walking the tree; returns an empty string
  //! when all hold, else the first broken one. O(nodes + tokens x depth).
  [[nodiscard]] std::string check() const {
    std::vector<std::uint32_t> stack;
    std::size_t reached = 0;
    std::size_t indexed = 0;
    std::uint64_t root_sum = 0;
    for (std::size_t t = 0; t < root_children_.size(); ++t) {
      std::uint32_t const c = root_children_[t];
      if (c == none) continue;
      if (nodes_[c].parent != 0 || nodes_[c].token != static_cast<token_id>(t))
        return "root index entry " + std::to_string(t) + " is wrong";
      root_sum += nodes_[c].count;
      stack.push_back(c);
    }
    if (root_sum != nodes_[0].count) return "root count differs from its children's";
    if (nodes_[0].count != tokens_) return "root count differs from the tokens held";
    while (!stack.empty()) {
      std::uint32_t const n = stack.back();
      stack.pop_back();
      ++reached;
      node const& x = nodes_[n];
      std::string const at = "node " + std::to_string(n) + ": ";
      if (x.count == 0 || x.length == 0) return at + "empty";
      if (x.seq >= sequences_.size() ||
          std::size_t{x.pos} + x.length > sequences_[x.seq].tokens.size())
        return at + "edge outside its sequence";
      if (sequences_[x.seq].tokens[x.pos] != x.token) return at + "first token differs";
      if (depth_of(n) > depth_) return at + "deeper than the depth";
      std::uint64_t sum = 0;
      std::size_t children = 0;
      std::uint32_t prev = none;
      for (std::uint32_t c = x.first_child; c != none; c = nodes_[c].next) {
        if (nodes_[c].parent != n) return at + "child with another parent";
        if (prev != none && !before(prev, c)) return at + "children out of order";
        if (prev != none && nodes_[prev].token == nodes_[c].token) return at + "duplicate child";
        sum += nodes_[c].count;
        ++children;
        prev = c;
        stack.push_back(c);
      }
      if (sum > x.count) return at + "children count more than the node";
      if (std::min<std::size_t>(children, 0xFFFF) != x.children)
        return at + "wrong number of children";
      if (children >= wide) {
        indexed += children;
        for (std::uint32_t c = x.first_child; c != none; c = nodes_[c].next) {
          if (wide_children_.find(key(n, nodes_[c].token)) != c)
            return at + "child missing from the index";
        }
      }
      if (children == 1 && sum == x.count) return at + "a single child of equal count (unmerged)";
    }
    if (reached + 1 != num_nodes()) return "unreachable nodes";
    if (indexed != wide_children_.size()) return "stale entries in the index of wide nodes";
    // Every suffix instance is a path ending at a node's end, and the counts are the instances.
    std::vector<std::uint32_t> visits(nodes_.size(), 0);
    for (sequence_id s = 0; s < sequences_.size(); ++s) {
      std::span<token_id const> const q = sequences_[s].tokens;
      for (std::size_t i = 0; i < q.size(); ++i) {
        std::size_t const len = std::min(depth_, q.size() - i);
        std::uint32_t n = 0;
        std::size_t k = 0;
        while (k < len) {
          n = child(n, q[i + k]);
          if (n == none)
            return "suffix " + std::to_string(i) + " of sequence " + std::to_string(s) +
                   " is missing";
          node const& x = nodes_[n];
          for (std::size_t j = 0; j < x.length; ++j)
            if (k + j >= len || sequences_[x.seq].tokens[x.pos + j] != q[i + k + j])
              return "suffix " + std::to_string(i) + " of sequence " + std::to_string(s) +
                     " does not end at a node's end";
          k += x.length;
          ++visits[n];
        }
      }
    }
    for (std::size_t n = 1; n < nodes_.size(); ++n)
      if (!is_free(static_cast<std::uint32_t>(n)) && visits[n] != nodes_[n].count)
        return "node " + std::to_string(n) + " counts " + std::to_string(nodes_[n].count) +
               " instances, " + std::to_string(visits[n]) + " pass";
    return {};
  }

 private:
  using queued = detail::suffix_queued;
  //! Nodes with this many children find a child by a hash lookup instead of their sibling list.
  static constexpr std::uint16_t wide = 8;
  struct node {
    token_id token = 0;           //!< first token of the edge
    std::uint32_t count = 0;      //!< suffix instances entering the node
    std::uint32_t parent = none;  //!< parent node
    std::uint32_t first_child = none;
    std::uint32_t next = none;  //!< next sibling (count descending, token ascending)
    std::uint32_t seq = 0;      //!< the edge is sequences_[seq].tokens[pos, pos + length)
    std::uint32_t pos = 0;
    std::uint16_t length = 1;    //!< <= max_depth
    std::uint16_t children = 0;  //!< number of children (saturates)
  };
  struct sequence {
    std::vector<token_id> tokens;
    std::vector<std::uint32_t> active;  //!< ring of the nodes where the growing suffixes end
    std::size_t head = 0;               //!< ring start: the longest growing suffix
    std::size_t count = 0;              //!< growing suffixes
    bool finished = false;
  };

  //! Whether sibling a comes before sibling b (count descending, then token ascending).
  [[nodiscard]] bool before(std::uint32_t a, std::uint32_t b) const noexcept {
    node const& x = nodes_[a];
    node const& y = nodes_[b];
    return x.count != y.count ? x.count > y.count : x.token < y.token;
  }

  [[nodiscard]] bool is_free(std::uint32_t n) const noexcept {
    return nodes_[n].count == 0 && n != 0;
  }

  //! Tokens from the root to the end of node n's edge.
  [[nodiscard]] std::size_t depth_of(std::uint32_t n) const noexcept {
    std::size_t d = 0;
    for (; n != 0; n = nodes_[n].parent) d += nodes_[n].length;
    return d;
  }

  //! The child of n whose edge starts with `token`, or none.
  [[nodiscard]] std::uint32_t child(std::uint32_t n, token_id token) const noexcept {
    if (n == 0) {
      auto const t = static_cast<std::size_t>(token);
      return t < root_children_.size() ? root_children_[t] : none;
    }
    if (nodes_[n].children >= wide) return wide_children_.find(key(n, token));
    for (std::uint32_t c = nodes_[n].first_child; c != none; c = nodes_[c].next)
      if (nodes_[c].token == token) return c;
    return none;
  }

  //! The key of p's child starting with `token` in wide_children_.
  [[nodiscard]] static std::uint64_t key(std::uint32_t p, token_id token) noexcept {
    return (std::uint64_t{p} << 32) | static_cast<std::uint32_t>(token);
  }

  //! Where `path` ends: its node and the tokens of that node's edge it covers (in [1, length]),
  //! or (0, 0) for the empty path, or (none, 0) when the path does not occur.
  [[nodiscard]] std::pair<std::uint32_t, std::uint32_t> locate(
      std::span<token_id const> path) const noexcept {
    std::uint32_t n = 0;
    std::uint32_t off = 0;
    token_id const* edge = nullptr;  // the tokens of n's edge
    for (token_id const t : path) {
      if (off == nodes_[n].length) {
        n = child(n, t);  // its edge starts with t
        if (n == none) return {none, 0};
        node const& x = nodes_[n];
        edge = sequences_[x.seq].tokens.data() + x.pos;
        off = 1;
        continue;
      }
      if (edge[off] != t) return {none, 0};
      ++off;
    }
    return {n, off};
  }

  std::uint32_t new_node(token_id token, std::uint32_t count, std::uint32_t parent,
                         std::uint32_t seq, std::uint32_t pos, std::uint32_t length) {
    std::uint32_t n;
    if (!free_.empty()) {
      n = free_.back();
      free_.pop_back();
    } else {
      n = static_cast<std::uint32_t>(nodes_.size());
      nodes_.emplace_back();
    }
    nodes_[n] =
        node{token, count, parent, none, none, seq, pos, static_cast<std::uint16_t>(length), 0};
    return n;
  }

  void release(std::uint32_t n) {
    nodes_[n] = node{};
    nodes_[n].count = 0;
    free_.push_back(n);
  }

  //! Links n (not linked) among p's children at its place in the order.
  void insert_child(std::uint32_t p, std::uint32_t n) {
    if (p == 0) {
      auto const t = static_cast<std::size_t>(nodes_[n].token);
      if (t >= root_children_.size()) root_children_.resize(t + 1, none);
      root_children_[t] = n;
      return;
    }
    std::uint32_t* link = &nodes_[p].first_child;
    while (*link != none && before(*link, n)) link = &nodes_[*link].next;
    nodes_[n].next = *link;
    *link = n;
    node& parent = nodes_[p];
    if (parent.children < 0xFFFF) ++parent.children;
    if (parent.children == wide) {  // p becomes wide: index all its children
      for (std::uint32_t c = parent.first_child; c != none; c = nodes_[c].next)
        wide_children_.set(key(p, nodes_[c].token), c);
    } else if (parent.children > wide) {
      wide_children_.set(key(p, nodes_[n].token), n);
    }
  }

  //! After n's count grew, moves n forward among p's children to its place in the order (the
  //! index of a wide node is unchanged: same parent, same token).
  void promote(std::uint32_t p, std::uint32_t n) {
    if (p == 0) return;
    std::uint32_t* link = &nodes_[p].first_child;
    while (*link != n && before(*link, n)) link = &nodes_[*link].next;
    if (*link == n) return;  // in place already
    std::uint32_t* const to = link;
    while (*link != n) link = &nodes_[*link].next;
    *link = nodes_[n].next;
    nodes_[n].next = *to;
    *to = n;
  }

  //! Replaces child `old` of p by `now` (same first token) at the same place in the order.
  void replace_child(std::uint32_t p, std::uint32_t old, std::uint32_t now) {
    if (p == 0) {
      root_children_[static_cast<std::size_t>(nodes_[now].token)] = now;
      return;
    }
    std::uint32_t* link = &nodes_[p].first_child;
    while (*link != old) link = &nodes_[*link].next;
    nodes_[now].next = nodes_[old].next;
    *link = now;
    if (nodes_[p].children >= wide) wide_children_.set(key(p, nodes_[now].token), now);
  }

  //! The suffix ending at node x (of sequence s) grows by `token`, at position `at` of s; returns
  //! the node where it ends now.
  std::uint32_t extend(std::uint32_t x, sequence_id s, token_id token, std::uint32_t at) {
    std::uint32_t const c = child(x, token);
    if (c == none) {
      if (x != 0 && nodes_[x].count == 1) {
        // The only instance through x is this one, which ends there: x is a leaf of s; lengthen.
        node& n = nodes_[x];
        ++n.length;
        n.seq = s;
        n.pos = at + 1 - n.length;
        return x;
      }
      std::uint32_t const leaf = new_node(token, 1, x, s, at, 1);
      insert_child(x, leaf);
      return leaf;
    }
    if (x != 0 && nodes_[x].count == nodes_[c].count + 1) {
      // This instance is the only one ending at x and c is x's only child: after the step no
      // instance ends at x, so x and c's first token become one node.
      if (nodes_[c].length == 1) {
        std::uint32_t const p = nodes_[x].parent;
        node& n = nodes_[c];
        n.token = nodes_[x].token;
        n.length = static_cast<std::uint16_t>(nodes_[x].length + 1);
        n.count += 1;
        n.parent = p;
        n.seq = s;
        n.pos = at + 1 - n.length;
        replace_child(p, x, c);
        release(x);
        return c;
      }
      node& n = nodes_[x];
      ++n.length;
      n.seq = s;
      n.pos = at + 1 - n.length;
      node& m = nodes_[c];
      --m.length;
      ++m.pos;
      m.token = sequences_[m.seq].tokens[m.pos];
      return x;
    }
    if (nodes_[c].length == 1) {
      node& n = nodes_[c];
      ++n.count;
      n.seq = s;
      n.pos = at;
      promote(x, c);
      return c;
    }
    // Split c after its first token: the new node m, in c's place, ends where this instance ends.
    std::uint32_t const m = new_node(token, nodes_[c].count + 1, x, s, at, 1);
    replace_child(x, c, m);
    node& rest = nodes_[c];
    --rest.length;
    ++rest.pos;
    rest.token = sequences_[rest.seq].tokens[rest.pos];
    rest.parent = m;
    rest.next = none;
    nodes_[m].first_child = c;
    nodes_[m].children = 1;
    promote(x, m);
    return m;
  }

  //! Path mode from (n, off) (see the file comment).
  void draft_path_from(std::uint32_t n, std::uint32_t off, std::size_t budget, float min_p,
                       suffix_draft& out) const {
    float p = 1.0f;
    while (out.size() < budget) {
      node const& x = nodes_[n];
      if (off < x.length) {
        out.parents.push_back(static_cast<std::int32_t>(out.size()) - 1);
        out.tokens.push_back(sequences_[x.seq].tokens[x.pos + off]);
        out.probabilities.push_back(p);
        out.score += p;
        ++off;
        continue;
      }
      if (x.first_child == none) break;
      node const& c = nodes_[x.first_child];
      p *= static_cast<float>(c.count) / static_cast<float>(x.count);
      if (p < min_p) break;
      n = x.first_child;
      off = 0;
    }
  }

  //! Tree mode from (n, off) (see the file comment).
  void draft_tree_from(std::uint32_t n, std::uint32_t off, std::size_t budget, float min_p,
                       suffix_draft& out, std::vector<queued>& heap) const {
    heap.clear();
    std::uint32_t order = 0;
    auto const worse = [](queued const& a, queued const& b) {
      return a.p != b.p ? a.p < b.p : a.order > b.order;
    };
    auto const push = [&](queued q) {
      q.order = order++;
      heap.push_back(q);
      std::push_heap(heap.begin(), heap.end(), worse);
    };
    push({1.0f, n, off, -1, 0});
    while (out.size() < budget && !heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      queued const q = heap.back();
      heap.pop_back();
      node const& x = nodes_[q.n];
      if (q.off < x.length) {
        out.parents.push_back(q.parent);
        out.tokens.push_back(sequences_[x.seq].tokens[x.pos + q.off]);
        out.probabilities.push_back(q.p);
        out.score += q.p;
        push({q.p, q.n, q.off + 1, static_cast<std::int32_t>(out.size()) - 1, 0});
        continue;
      }
      for (std::uint32_t c = x.first_child; c != none; c = nodes_[c].next) {
        float const p = q.p * static_cast<float>(nodes_[c].count) / static_cast<float>(x.count);
        if (p >= min_p) push({p, c, 0, q.parent, 0});
      }
    }
  }

  std::size_t depth_;
  std::vector<node> nodes_;                   //!< [0] is the root
  std::vector<std::uint32_t> free_;           //!< released nodes, reused first
  std::vector<std::uint32_t> root_children_;  //!< [token] the root's child, or none
  //! (node, token) -> child, for the children of nodes with at least `wide` children
  detail::suffix_child_index wide_children_;
  std::vector<sequence> sequences_;
  std::size_t tokens_ = 0;
};

}  // namespace specdec
