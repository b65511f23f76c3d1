#pragma once
//! \file
//! `prompt_lookup_proposer`: drafts by n-gram matching against the sequence itself (prompt lookup
//! decoding, Saxena 2023; the "ngram" proposer of vLLM). No model: the last n committed tokens are
//! looked up in the prompt and the output so far, and what followed an earlier occurrence is
//! drafted.
//!
//! Lookup: for n = n_max down to n_min, the last n tokens are matched against every earlier
//! position; the first n with a match wins. Among its occurrences (at most `max_candidates` are
//! examined, most recent first), continuations of the full length k come first, then longer before
//! shorter, most recent first among equals. The first continuation is drafted as a chain; with
//! `max_branches` > 1, further distinct continuations are merged into a tree (shared prefixes are
//! shared nodes) until `max_branches` branches or the node budget is reached.
//!
//! Index: for each n, a hash table maps an n-gram to its most recent start, and a per-position link
//! to the previous start of the same n-gram (a linked list through an array), so a lookup walks
//! occurrences newest first without rescanning the history. The index is extended incrementally at
//! each `propose` with the tokens committed since the last one (amortised O(n_max - n_min + 1) per
//! token); hash collisions are resolved by comparing the tokens.
//!
//! Drafts are deterministic candidates (no q rows). Whether they are trees or chains is a template
//! parameter, so that the decoder's pairing checks see it at compile time:
//! `prompt_lookup_proposer` (= `basic_prompt_lookup_proposer<draft_shape::tree>`) may draft trees
//! (with `max_branches` > 1) and pairs with a greedy verifier or a tree verifier (which treats each
//! candidate as a point mass, lossless for any number of children);
//! `prompt_lookup_chain_proposer` (= `basic_prompt_lookup_proposer<draft_shape::chain>`) always
//! drafts a chain (`max_branches` must be 1) and also pairs with `speculative_sampling_verifier`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"

namespace specdec {

//! The shape of the drafts of a proposer whose shape is a template parameter.
enum class draft_shape {
  chain,  //!< always a chain (`produces_trees` is false: any verifier, chains-only ones included)
  tree,   //!< may draft trees (`produces_trees` is true: needs a verifier that walks trees)
};

//! Configuration of `basic_prompt_lookup_proposer`.
struct prompt_lookup_config {
  std::size_t n_max = 3;  //!< longest n-gram matched (<= 16)
  std::size_t n_min = 1;  //!< shortest n-gram matched (>= 1, <= n_max)
  std::size_t k = 8;      //!< most tokens drafted per continuation (tree depth)
  //! Most distinct continuations merged into the tree (1 = always a chain; must be 1 for
  //! `draft_shape::chain`).
  std::size_t max_branches = 1;
  //! Most occurrences examined per lookup (bounds the cost of frequent n-grams).
  std::size_t max_candidates = 64;

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    SPECDEC_CHECK(n_min >= 1 && n_min <= n_max && n_max <= 16, invalid_argument,
                  "prompt_lookup_config: need 1 <= n_min <= n_max <= 16 (n_min = ", n_min,
                  ", n_max = ", n_max, ")");
    SPECDEC_CHECK(k >= 1 && k < max_tree_nodes, invalid_argument, "prompt_lookup_config: k = ", k,
                  " is outside [1, ", max_tree_nodes - 1, "]");
    SPECDEC_CHECK(max_branches >= 1 && max_branches < max_tree_nodes, invalid_argument,
                  "prompt_lookup_config: max_branches = ", max_branches, " is outside [1, ",
                  max_tree_nodes - 1, "]");
    SPECDEC_CHECK(max_candidates >= 1, invalid_argument,
                  "prompt_lookup_config: max_candidates must be at least 1");
  }
};

namespace detail {

//! The occurrences of every n-gram (one n) of a growing token sequence: a hash table from n-gram
//! to its most recent start and a link from each start to the previous start of the same n-gram.
//! Only n-grams that have a continuation are indexed (start s with s + n < length).
class ngram_index {
 public:
  //! An empty index of n-grams of length `n`.
  explicit ngram_index(std::size_t n = 1) : n_(n) {}

  //! Forgets every entry and reserves room for `expected` positions.
  void clear(std::size_t expected) {
    indexed_ = 0;
    used_ = 0;
    std::size_t slots = 64;
    while (slots < 2 * expected) slots *= 2;
    keys_.assign(slots, 0);
    heads_.assign(slots, -1);
    prev_.clear();
    prev_.reserve(expected);
  }

  //! Indexes the new n-grams of `history`, which extends what was indexed before.
  void extend(std::span<token_id const> history) {
    if (heads_.empty()) clear(history.size());
    while (indexed_ + n_ < history.size()) {
      std::size_t const s = indexed_;
      std::uint64_t const key = hash(history.subspan(s, n_));
      if (2 * (used_ + 1) > heads_.size()) grow();
      std::size_t slot = find_slot(key);
      if (heads_[slot] < 0) {
        keys_[slot] = key;
        ++used_;
      }
      prev_.push_back(heads_[slot]);
      heads_[slot] = static_cast<std::int32_t>(s);
      ++indexed_;
    }
  }

  //! The most recent indexed start whose n-gram hashes like `gram`, or -1.
  [[nodiscard]] std::int32_t latest(std::span<token_id const> gram) const noexcept {
    if (heads_.empty()) return -1;
    return heads_[find_slot(hash(gram))];
  }
  //! The previous start with the same hash as start `s`, or -1.
  [[nodiscard]] std::int32_t previous(std::int32_t s) const noexcept {
    return prev_[static_cast<std::size_t>(s)];
  }
  //! The n-gram length.
  [[nodiscard]] std::size_t n() const noexcept { return n_; }
  //! Number of starts indexed.
  [[nodiscard]] std::size_t indexed() const noexcept { return indexed_; }

  //! A 64-bit hash of a token sequence (splitmix64 finaliser folded over the tokens).
  [[nodiscard]] static std::uint64_t hash(std::span<token_id const> gram) noexcept {
    std::uint64_t h = 0x9E3779B97F4A7C15ull * (gram.size() + 1);
    for (token_id t : gram) {
      h ^= static_cast<std::uint64_t>(static_cast<std::uint32_t>(t)) + 0x9E3779B97F4A7C15ull +
           (h << 6) + (h >> 2);
      h ^= h >> 30;
      h *= 0xBF58476D1CE4E5B9ull;
      h ^= h >> 27;
      h *= 0x94D049BB133111EBull;
      h ^= h >> 31;
    }
    return h;
  }

 private:
  //! The slot holding `key`, or the empty slot where it would go (linear probing).
  [[nodiscard]] std::size_t find_slot(std::uint64_t key) const noexcept {
    std::size_t const mask = heads_.size() - 1;
    std::size_t slot = static_cast<std::size_t>(key) & mask;
    while (heads_[slot] >= 0 && keys_[slot] != key) slot = (slot + 1) & mask;
    return slot;
  }

  void grow() {
    std::vector<std::uint64_t> keys(keys_.size() * 2, 0);
    std::vector<std::int32_t> heads(heads_.size() * 2, -1);
    keys_.swap(keys);
    heads_.swap(heads);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (heads[i] < 0) continue;
      std::size_t const slot = find_slot(keys[i]);
      keys_[slot] = keys[i];
      heads_[slot] = heads[i];
    }
  }

  std::size_t n_;
  std::size_t indexed_ = 0;
  std::size_t used_ = 0;
  std::vector<std::uint64_t> keys_;
  std::vector<std::int32_t> heads_;  //!< most recent start per slot, -1 = empty slot
  std::vector<std::int32_t> prev_;   //!< [indexed_] previous start with the same key, or -1
};

}  // namespace detail

//! Prompt lookup decoding: drafts the continuation of an earlier occurrence of the latest n-gram
//! (see the file comment). Deterministic candidates; a chain when `max_branches` is 1.
//! \tparam Shape `draft_shape::tree` (the default): several continuations may make a tree;
//!               `draft_shape::chain`: always a chain, declared so (`produces_trees` is false).
template <draft_shape Shape = draft_shape::tree>
class basic_prompt_lookup_proposer {
 public:
  //! Several continuations make a tree (`draft_shape::tree`); a chain proposer never does.
  static constexpr bool produces_trees = Shape == draft_shape::tree;
  static constexpr bool samples_drafts = false;       //!< deterministic candidates, no q rows
  static constexpr bool needs_target_hidden = false;  //!< works on tokens only

  //! A proposer with `config` (validated: `errc::invalid_argument`, also for `max_branches` > 1
  //! with `draft_shape::chain`).
  explicit basic_prompt_lookup_proposer(prompt_lookup_config config = {}) : config_(config) {
    config_.validate();
    SPECDEC_CHECK(produces_trees || config_.max_branches == 1, invalid_argument,
                  "prompt_lookup_proposer: max_branches = ", config_.max_branches,
                  " drafts trees, but this proposer drafts chains (draft_shape::chain); use "
                  "draft_shape::tree or max_branches = 1");
    for (std::size_t n = config_.n_min; n <= config_.n_max; ++n) index_.emplace_back(n);
    candidates_.reserve(config_.max_candidates);
  }

  //! Starts a sequence: indexes the prompt.
  void begin(std::span<token_id const> prompt) {
    history_.clear();
    history_.reserve(prompt.size() + 4096);
    for (auto& index : index_) index.clear(prompt.size() + 4096);
    sync(prompt);
  }

  //! Drafts under ctx.tokens.back() at most ctx.max_nodes nodes.
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument,
                  "prompt_lookup_proposer: propose with no committed tokens");
    tree.reset(ctx.tokens.back());
    if (tree.has_q()) tree.enable_q(0);
    sync(ctx.tokens);
    std::size_t const budget = std::min(ctx.max_nodes, tree.capacity() - 1);
    if (budget == 0) return;
    std::span<token_id const> const hist = history_;
    std::size_t const length = hist.size();

    for (std::size_t i = index_.size(); i-- > 0;) {
      detail::ngram_index const& index = index_[i];
      std::size_t const n = index.n();
      if (n >= length) continue;
      std::span<token_id const> const gram = hist.subspan(length - n, n);
      collect(index, gram);
      if (candidates_.empty()) continue;
      std::size_t branches = 0;
      for (candidate const& c : candidates_) {
        node_index at = 0;
        bool added = false;
        for (std::size_t j = 0; j < c.length; ++j) {
          token_id const tok = hist[c.start + j];
          node_index child = tree.find_child(at, tok);
          if (child < 0) {
            if (tree.num_drafted() >= budget) break;
            child = tree.add_node(at, tok);
            added = true;
          }
          at = child;
        }
        if (added && ++branches >= config_.max_branches) break;
        if (tree.num_drafted() >= budget) break;
      }
      return;
    }
  }

  //! Nothing to roll back: the committed tokens reach the index at the next `propose`.
  void accept(verify_result const&) noexcept {}

  //! The node budget: the most draft nodes (root excluded) one `propose` can draft under this
  //! configuration, k x max_branches (each of at most `max_branches` continuations adds at most k
  //! nodes), and at most max_tree_nodes - 1. The decoder scores at most this many nodes per step.
  [[nodiscard]] std::size_t max_nodes() const noexcept {
    return std::min(config_.k * config_.max_branches, max_tree_nodes - 1);
  }
  //! The configuration (validated).
  [[nodiscard]] prompt_lookup_config const& config() const noexcept { return config_; }
  //! Tokens indexed so far (prompt + committed output).
  [[nodiscard]] std::size_t history_size() const noexcept { return history_.size(); }

 private:
  struct candidate {
    std::size_t start;   //!< first continuation token
    std::size_t length;  //!< continuation tokens available, <= k
  };

  //! Brings the history and the indexes up to `tokens`; rebuilds when `tokens` does not extend
  //! the history (a caller that did not call `begin`, or edited its sequence).
  void sync(std::span<token_id const> tokens) {
    if (!detail::extends_history(history_, tokens)) {
      history_.clear();
      for (auto& index : index_) index.clear(tokens.size() + 4096);
    }
    history_.insert(history_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(history_.size()),
                    tokens.end());
    for (auto& index : index_) index.extend(history_);
  }

  //! Fills `candidates_` with the occurrences of `gram` (most recent first, at most
  //! max_candidates), then orders them: full length first, then longer first, stable.
  void collect(detail::ngram_index const& index, std::span<token_id const> gram) {
    candidates_.clear();
    std::size_t const length = history_.size();
    std::size_t const n = gram.size();
    std::size_t examined = 0;
    for (std::int32_t s = index.latest(gram); s >= 0 && examined < config_.max_candidates;
         s = index.previous(s), ++examined) {
      auto const start = static_cast<std::size_t>(s);
      if (!std::equal(gram.begin(), gram.end(), history_.begin() + static_cast<std::ptrdiff_t>(s)))
        continue;  // a hash collision
      std::size_t const cont = start + n;
      candidates_.push_back({cont, std::min(config_.k, length - cont)});
    }
    // Insertion sort by length, descending, stable (few candidates; no allocation).
    for (std::size_t i = 1; i < candidates_.size(); ++i) {
      candidate const c = candidates_[i];
      std::size_t j = i;
      while (j > 0 && candidates_[j - 1].length < c.length) {
        candidates_[j] = candidates_[j - 1];
        --j;
      }
      candidates_[j] = c;
    }
  }

  prompt_lookup_config config_;
  std::vector<detail::ngram_index> index_;  //!< [n_max - n_min + 1], index_[i].n() = n_min + i
  std::vector<token_id> history_;
  std::vector<candidate> candidates_;
};

//! Prompt lookup drafting trees (with `max_branches` > 1) or chains; pairs with tree-capable
//! verifiers.
using prompt_lookup_proposer = basic_prompt_lookup_proposer<draft_shape::tree>;
//! Prompt lookup drafting chains only; also pairs with chains-only verifiers
//! (`speculative_sampling_verifier`).
using prompt_lookup_chain_proposer = basic_prompt_lookup_proposer<draft_shape::chain>;

}  // namespace specdec
