#pragma once
//! \file
//! `lookahead_proposer`: lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of
//! LLM Inference Using Lookahead Decoding"). No draft model: every target forward runs two
//! branches side by side -- the verification branch (up to G candidate n-grams from an n-gram
//! pool, as a draft tree) and the lookahead branch (a Jacobi window of W columns over N - 1
//! levels, as auxiliary tokens, see `auxiliary_proposer`) whose outputs feed the pool.
//!
//! The window. Level l column i holds a guess for the token at position root + l + i; level 0
//! column 0 is the root itself (the tree's node 0). The token at (l, i) sees the root, level 0
//! columns 1..i and levels 1..l of column i: a causal sequence of consecutive positions root + 1
//! .. root + l + i, so its output is the target's (greedy) next token after that sequence. Only
//! the top level's W outputs are read; with W = 5, N = 4 the branch is 4 + 5 + 5 = 14 tokens.
//! Tree nodes never see the window, so the tree's rows are those of the tree alone.
//!
//! Each step, with O[i] the argmax of the top level's column i (raw logits, lowest id on ties):
//! 1. when the window is full (N - 1 levels), every column gives an n-gram (level 0 column i --
//!    the root for i = 0 --, levels 1..N-2 of column i, O[i]) -- N tokens at consecutive positions
//!    -- which enters the pool under its first token;
//! 2. the window moves with the sequence: with s tokens committed this step (accepted + bonus),
//!    the rows [levels..., O] drop their oldest row when the window is full (while warming up,
//!    after `begin`, it grows by one level per step instead) and every row shifts left by the
//!    remaining s - 1 (or s) columns, so that each guess keeps its absolute position; the columns
//!    uncovered on the right are filled with tokens of the sequence so far (deterministic
//!    pseudo-random picks, seeded by `seed`).
//!    At `begin` the window is level 0 alone, filled the same way.
//!
//! The pool maps a token to at most G continuations (N - 1 tokens each), most recently added or
//! refreshed first (an n-gram seen again moves to the front; the least recent falls off). With
//! `pool_from_context` the n-grams of the prompt and of every committed token enter it too.
//!
//! The verification branch: the pool's continuations for the root, most recent first, at most G,
//! merged into a tree of deterministic candidates (shared prefixes share nodes) within the node
//! budget. Verify with `greedy_verifier` (greedy) or `tree_verifier` (sampling: point masses,
//! lossless). The window always follows the target's greedy predictions, whatever the policy.
//!
//! When the window does not fit the step (near the end of the context: positions or cache room),
//! the step runs without it and the window stays as it was.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/core/auxiliary_batch.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/sampling/draw.hpp"

namespace specdec {

//! Configuration of `lookahead_proposer`.
struct lookahead_config {
  std::size_t window = 5;  //!< W: columns of the Jacobi window, in [1, 256]
  std::size_t ngram = 4;   //!< N: n-gram size; the window has N - 1 levels; in [2, 16]
  std::size_t guesses =
      5;  //!< G: candidate n-grams verified per step (and kept per token), [0, 256]
  //! Also feed the pool with the n-grams of the prompt and of the committed tokens.
  bool pool_from_context = true;
  std::uint64_t seed = 0;  //!< seed of the fill tokens' picks

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    SPECDEC_CHECK(window >= 1 && window <= 256, invalid_argument,
                  "lookahead_config: window = ", window, " is outside [1, 256]");
    SPECDEC_CHECK(ngram >= 2 && ngram <= 16, invalid_argument, "lookahead_config: ngram = ", ngram,
                  " is outside [2, 16]");
    SPECDEC_CHECK(guesses <= 256, invalid_argument, "lookahead_config: guesses = ", guesses,
                  " is outside [0, 256]");
  }
};

namespace detail {

//! Lookahead's n-gram pool: for each first token, at most `capacity` continuations of `length`
//! tokens, most recent first. Open addressing from token to slot; slots grow by doubling.
class ngram_pool {
 public:
  //! An empty pool of continuations of `length` tokens, at most `capacity` per key.
  explicit ngram_pool(std::size_t length = 1, std::size_t capacity = 1)
      : length_(length), capacity_(capacity) {}

  //! Forgets everything (keeps the memory).
  void clear() noexcept {
    std::fill(keys_.begin(), keys_.end(), no_token);
    slots_used_ = 0;
    std::fill(counts_.begin(), counts_.end(), 0u);
  }

  //! Adds continuation `cont` ([length]) under `key`, or moves it to the front if present.
  void insert(token_id key, std::span<token_id const> cont) {
    if (capacity_ == 0 || key < 0 || cont.size() != length_) return;
    std::size_t const slot = find_or_create(key);
    token_id* const base = entries_.data() + slot * capacity_ * length_;
    std::uint32_t& count = counts_[slot];
    std::size_t found = count;
    for (std::size_t k = 0; k < count; ++k) {
      if (std::equal(cont.begin(), cont.end(), base + k * length_)) {
        found = k;
        break;
      }
    }
    // Shift entries [0, found) (or all, dropping the last when full) one place back.
    std::size_t const moved = found < count ? found : std::min<std::size_t>(count, capacity_ - 1);
    std::copy_backward(base, base + moved * length_, base + (moved + 1) * length_);
    std::copy(cont.begin(), cont.end(), base);
    if (found == count && count < capacity_) ++count;
  }

  //! Number of continuations under `key`.
  [[nodiscard]] std::size_t count(token_id key) const noexcept {
    std::size_t const slot = find(key);
    return slot == npos ? 0 : counts_[slot];
  }
  //! Continuation k (0 = most recent) under `key`, [length]; k < count(key).
  [[nodiscard]] std::span<token_id const> entry(token_id key, std::size_t k) const noexcept {
    std::size_t const slot = find(key);
    return std::span<token_id const>(entries_.data() + (slot * capacity_ + k) * length_, length_);
  }
  //! Keys with at least one continuation.
  [[nodiscard]] std::size_t num_keys() const noexcept { return slots_used_; }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  static std::size_t hash(token_id key) noexcept {
    auto h = static_cast<std::uint64_t>(static_cast<std::uint32_t>(key)) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
  //! The slot of `key`, a new one when absent.
  std::size_t find_or_create(token_id key) {
    if (2 * (slots_used_ + 1) > keys_.size()) grow();
    std::size_t const found = find(key);
    if (found != npos) return found;
    std::size_t const mask = keys_.size() - 1;
    std::size_t i = hash(key) & mask;
    while (keys_[i] != no_token) i = (i + 1) & mask;
    keys_[i] = key;
    slot_index_[i] = static_cast<std::uint32_t>(slots_used_);
    ++slots_used_;
    if (counts_.size() < slots_used_) {
      counts_.resize(slots_used_, 0);
      entries_.resize(slots_used_ * capacity_ * length_, 0);
    }
    counts_[slots_used_ - 1] = 0;
    return slots_used_ - 1;
  }
  //! The slot of `key`, or npos.
  [[nodiscard]] std::size_t find(token_id key) const noexcept {
    if (keys_.empty() || key < 0) return npos;
    std::size_t const mask = keys_.size() - 1;
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (keys_[i] == key) return slot_index_[i];
      if (keys_[i] == no_token) return npos;
    }
  }
  void grow() {
    std::size_t const size = keys_.empty() ? 64 : 2 * keys_.size();
    std::vector<token_id> keys(size, no_token);
    std::vector<std::uint32_t> index(size, 0);
    std::size_t const mask = size - 1;
    for (std::size_t j = 0; j < keys_.size(); ++j) {
      if (keys_[j] == no_token) continue;
      std::size_t i = hash(keys_[j]) & mask;
      while (keys[i] != no_token) i = (i + 1) & mask;
      keys[i] = keys_[j];
      index[i] = slot_index_[j];
    }
    keys_.swap(keys);
    slot_index_.swap(index);
  }

  std::size_t length_;
  std::size_t capacity_;
  std::size_t slots_used_ = 0;
  std::vector<token_id> keys_;             //!< hash table of keys, no_token = empty
  std::vector<std::uint32_t> slot_index_;  //!< slot of each hash-table key
  std::vector<std::uint32_t> counts_;      //!< [slots] continuations per slot
  std::vector<token_id> entries_;          //!< [slots, capacity, length]
};

}  // namespace detail

//! Lookahead decoding (see the file comment): a verification tree of pooled n-grams plus a Jacobi
//! window scored as auxiliary tokens in the same forward. Deterministic candidates; trees.
class lookahead_proposer {
 public:
  static constexpr bool produces_trees = true;        //!< several n-grams make a tree
  static constexpr bool samples_drafts = false;       //!< deterministic candidates, no q rows
  static constexpr bool needs_target_hidden = false;  //!< only logits
  static constexpr bool has_auxiliary_tokens = true;  //!< the Jacobi window

  //! A proposer with `config` (validated: `errc::invalid_argument`).
  explicit lookahead_proposer(lookahead_config config = {})
      : config_(validated(config)),
        pool_(config.ngram - 1, config.guesses),
        levels_((config.ngram - 1) * config.window, 0),
        next_((config.ngram) * config.window, 0),
        outputs_(config.window, 0),
        rows_((config.ngram - 1) * config.window, 0) {}

  //! Starts a sequence: empties the pool (then adds the prompt's n-grams when
  //! `pool_from_context`) and resets the window to level 0 filled from the prompt.
  void begin(std::span<token_id const> prompt) {
    pool_.clear();
    history_.clear();
    history_.reserve(prompt.size() + 4096);
    pooled_ = 0;
    fill_state_ = config_.seed;
    sync(prompt);
    levels_used_ = 1;
    for (std::size_t i = 0; i < config_.window; ++i) level(0)[i] = fill_token();
    active_ = false;
  }

  //! The verification branch: the pool's continuations of the root (most recent first, at most
  //! G), merged into a tree within min(ctx.max_nodes, tree capacity - 1) nodes.
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument,
                  "lookahead_proposer: propose with no committed tokens");
    root_ = ctx.tokens.back();
    tree.reset(root_);
    if (tree.has_q()) tree.enable_q(0);
    sync(ctx.tokens);
    active_ = false;
    std::size_t const budget = std::min(ctx.max_nodes, tree.capacity() - 1);
    std::size_t const candidates = std::min(pool_.count(root_), config_.guesses);
    for (std::size_t k = 0; k < candidates && tree.num_drafted() < budget; ++k) {
      node_index at = 0;
      for (token_id const t : pool_.entry(root_, k)) {
        node_index child = tree.find_child(at, t);
        if (child < 0) {
          if (tree.num_drafted() >= budget) break;
          child = tree.add_node(at, t);
        }
        at = child;
      }
    }
  }

  //! The lookahead branch: the window's tokens after the tree (level 0 columns 1..W-1, then
  //! levels 1..), each seeing the root and its causal sequence (see the file comment); only the
  //! top level's rows ask for logits. Skipped when the window does not fit.
  void auxiliary(propose_context const&, draft_tree const&, auxiliary_batch& aux) {
    active_ = false;
    std::size_t const w = config_.window, levels = levels_used_;
    std::size_t const count = (w - 1) + (levels - 1) * w;
    auto const base = static_cast<std::size_t>(aux.base());
    if (count > aux.room() || base + (levels - 1) + (w - 1) >= aux.position_limit()) return;
    for (std::size_t l = 0; l < levels; ++l) {
      bool const top = l + 1 == levels;
      for (std::size_t i = l == 0 ? 1 : 0; i < w; ++i) {
        std::size_t const row = aux.add(level(l)[i], static_cast<position_t>(base + l + i), top);
        rows_[l * w + i] = row;
        aux.attend(row, 0);
        for (std::size_t j = 1; j <= i; ++j) aux.attend(row, rows_[j]);  // level 0, columns 1..i
        for (std::size_t k = 1; k < l; ++k) aux.attend(row, rows_[k * w + i]);
      }
    }
    active_ = true;
  }

  //! Reads the top level's outputs, feeds the pool (full window) and moves the window by the
  //! tokens committed this step.
  void observe(matrix_view<float const> tree_logits, matrix_view<float const> aux_logits,
               verify_result const& result) {
    if (!active_) return;
    active_ = false;
    std::size_t const w = config_.window, n = config_.ngram, levels = levels_used_;
    std::size_t const expected = levels == 1 ? w - 1 : w;
    SPECDEC_CHECK(aux_logits.rows() == expected && tree_logits.rows() >= 1, internal,
                  "lookahead_proposer: observe got ", aux_logits.rows(), " window rows, expected ",
                  expected);
    for (std::size_t i = 0; i < w; ++i) {
      std::span<float const> const row =
          levels == 1 ? (i == 0 ? tree_logits.row(0) : aux_logits.row(i - 1)) : aux_logits.row(i);
      outputs_[i] = detail::argmax_token(row);
    }
    if (levels == n - 1) {
      token_id gram[16];
      for (std::size_t i = 0; i < w; ++i) {
        for (std::size_t l = 1; l < levels; ++l) gram[l - 1] = level(l)[i];
        gram[levels - 1] = outputs_[i];
        pool_.insert(i == 0 ? root_ : level(0)[i], std::span<token_id const>(gram, n - 1));
      }
    }
    // Rows [levels..., outputs]; drop the oldest when full; shift by the remaining columns.
    std::size_t const s = result.num_accepted() + 1;
    std::size_t const drop = levels + 1 > n - 1 ? 1 : 0;
    std::size_t const shift = s - drop;
    std::size_t const next_levels = levels + 1 - drop;
    for (std::size_t l = 0; l < next_levels; ++l) {
      std::size_t const from = l + drop;  // source row: a level, or the outputs (from == levels)
      token_id const* src = from == levels ? outputs_.data() : level(from).data();
      for (std::size_t i = 0; i < w; ++i)
        next_[l * w + i] = i + shift < w ? src[i + shift] : fill_token();
    }
    std::copy_n(next_.begin(), next_levels * w, levels_.begin());
    levels_used_ = next_levels;
  }

  //! Nothing else to update: the pool learnt from the window in `observe`.
  void accept(verify_result const&) noexcept {}

  //! The node budget: the most draft nodes (root excluded) one `propose` can draft under this
  //! configuration, G x (N - 1) (at most G pooled continuations of N - 1 tokens each). The Jacobi
  //! window's auxiliary tokens are not draft nodes and are not counted. The decoder scores at most
  //! this many tree nodes per step.
  [[nodiscard]] std::size_t max_nodes() const noexcept {
    return std::min(config_.guesses * (config_.ngram - 1), max_tree_nodes - 1);
  }
  //! The configuration (validated).
  [[nodiscard]] lookahead_config const& config() const noexcept { return config_; }
  //! Levels of the window now (1 after `begin`, N - 1 once warmed up).
  [[nodiscard]] std::size_t window_levels() const noexcept { return levels_used_; }
  //! Level `l` of the window, [W] tokens (column 0 of level 0 stands for the root).
  [[nodiscard]] std::span<token_id const> window_level(std::size_t l) const noexcept {
    return std::span<token_id const>(levels_.data() + l * config_.window, config_.window);
  }
  //! Continuations pooled under `key`, and continuation k of them (most recent first).
  [[nodiscard]] std::size_t pool_count(token_id key) const noexcept { return pool_.count(key); }
  [[nodiscard]] std::span<token_id const> pool_entry(token_id key, std::size_t k) const noexcept {
    return pool_.entry(key, k);
  }

 private:
  static lookahead_config const& validated(lookahead_config const& c) {
    c.validate();
    return c;
  }

  std::span<token_id> level(std::size_t l) noexcept {
    return std::span<token_id>(levels_.data() + l * config_.window, config_.window);
  }

  //! Brings the history up to `tokens` (rebuilding when it is not an extension) and pools the
  //! n-grams that end in new tokens.
  void sync(std::span<token_id const> tokens) {
    if (!detail::extends_history(history_, tokens)) {
      history_.clear();
      pooled_ = 0;
    }
    history_.insert(history_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(history_.size()),
                    tokens.end());
    std::size_t const n = config_.ngram;
    if (!config_.pool_from_context) return;
    for (; pooled_ + n <= history_.size(); ++pooled_)
      pool_.insert(history_[pooled_],
                   std::span<token_id const>(history_.data() + pooled_ + 1, n - 1));
  }

  //! A token of the sequence so far, picked by a splitmix64 stream (0 for an empty sequence).
  token_id fill_token() noexcept {
    if (history_.empty()) return 0;
    std::uint64_t z = (fill_state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return history_[static_cast<std::size_t>(z % history_.size())];
  }

  lookahead_config config_;
  detail::ngram_pool pool_;
  std::vector<token_id> levels_;   //!< [N - 1, W] the window (levels_used_ rows valid)
  std::vector<token_id> next_;     //!< [N, W] scratch for the moved window
  std::vector<token_id> outputs_;  //!< [W] the top level's outputs this step
  std::vector<std::size_t> rows_;  //!< [N - 1, W] batch rows of the window's tokens this step
  std::vector<token_id> history_;  //!< prompt + committed tokens
  std::size_t pooled_ = 0;         //!< n-grams of history_ pooled (start index)
  std::size_t levels_used_ = 1;
  std::uint64_t fill_state_ = 0;
  token_id root_ = 0;
  bool active_ = false;  //!< the window was added this step
};

}  // namespace specdec
