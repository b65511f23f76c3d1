#pragma once
//! \file
//! `rest_proposer`: retrieval-based drafting (REST, He et al. 2023). No model: the longest suffix
//! of the context (at most `n_max` tokens, longest first) is looked up in a `rest_datastore`, the
//! tokens that follow its occurrences are merged into a trie weighted by frequency, the trie is
//! pruned to the node budget keeping the most frequent prefixes, and the result is drafted as a
//! tree of deterministic candidates whose children are ordered by frequency.
//!
//! Retrieval, exactly:
//! 1. `match` = `datastore.longest_suffix_match(context, n_max, n_min)` (the context's trailing
//!    tokens; binary search over the length, each probe a binary search over the suffix array).
//!    No match: the tree is the root alone.
//! 2. Occurrences: all of the match's suffix-array range when it holds at most `max_occurrences`
//!    suffixes, else `max_occurrences` of them evenly spaced over the range (index lo + floor(j *
//!    count / max_occurrences)). The range is sorted by what follows the match, so an evenly
//!    spaced sample keeps the continuations' frequencies (a continuation covering a fraction f of
//!    the range is sampled about f * max_occurrences times) and is deterministic.
//! 3. Continuations: the up to `depth` tokens after each sampled occurrence, stopping at a
//!    document separator or the end of the corpus.
//! 4. Trie: the continuations arrive sorted, so the trie is built in one pass (each continuation
//!    shares its longest common prefix with the previous one); a node's count is the number of
//!    continuations through it.
//! 5. Pruning: the `budget` = min(`max_nodes`, ctx.max_nodes, tree capacity - 1) nodes first in the
//!    order (count descending, depth ascending, token path ascending) -- a total order in which a
//!    parent precedes its children, so the kept nodes form a tree (the most frequent prefixes).
//! 6. Emission: the kept nodes in that same order, so every node's children are added by
//!    decreasing frequency (ties: smaller token id first).
//!
//! Cost per `propose`: O(log(n_max) n_max log N) for the match (N = corpus size) plus O(M depth)
//! for the trie (M = occurrences sampled) and O(M depth + B log B) for the pruning; scratch
//! buffers are sized at construction, so `propose` does not allocate.
//!
//! The datastore is shared read-only (`std::shared_ptr<rest_datastore const>`); each proposer
//! (one per sequence) keeps its own scratch, so proposers on different threads may share one
//! datastore. Drafts are deterministic candidates (no q rows): pair with `greedy_verifier` under
//! greedy decoding and `tree_verifier` under sampling (point masses, lossless).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/propose/rest_datastore.hpp"

namespace specdec {

//! Configuration of `rest_proposer`.
struct rest_config {
  std::size_t n_max = 16;  //!< longest context suffix looked up (>= n_min, <= 256)
  std::size_t n_min = 1;   //!< shortest context suffix accepted as a match (>= 1)
  //! Most occurrences whose continuations enter the trie (evenly spaced over the match's range).
  std::size_t max_occurrences = 128;
  std::size_t depth = 8;       //!< tokens per continuation: the deepest draft node
  std::size_t max_nodes = 32;  //!< node budget of the pruned trie (root excluded)

  //! Throws `errc::invalid_argument` naming the field out of its domain.
  void validate() const {
    SPECDEC_CHECK(n_min >= 1 && n_min <= n_max && n_max <= 256, invalid_argument,
                  "rest_config: need 1 <= n_min <= n_max <= 256 (n_min = ", n_min,
                  ", n_max = ", n_max, ")");
    SPECDEC_CHECK(max_occurrences >= 1 && max_occurrences <= (std::size_t{1} << 20),
                  invalid_argument, "rest_config: max_occurrences = ", max_occurrences,
                  " is outside [1, 2^20]");
    SPECDEC_CHECK(depth >= 1 && depth < max_tree_nodes, invalid_argument,
                  "rest_config: depth = ", depth, " is outside [1, ", max_tree_nodes - 1, "]");
    SPECDEC_CHECK(max_nodes >= 1 && max_nodes < max_tree_nodes, invalid_argument,
                  "rest_config: max_nodes = ", max_nodes, " is outside [1, ", max_tree_nodes - 1,
                  "]");
  }
};

//! REST: drafts the most frequent continuations of the longest context suffix found in a
//! datastore (see the file comment). Deterministic candidates; trees.
class rest_proposer {
 public:
  static constexpr bool produces_trees = true;   //!< the pruned trie is a tree
  static constexpr bool samples_drafts = false;  //!< deterministic candidates, no q rows
  static constexpr bool needs_target_hidden = false;

  //! A proposer over `datastore` (shared, read-only; must not be null) with `config` (validated:
  //! `errc::invalid_argument`).
  explicit rest_proposer(std::shared_ptr<rest_datastore const> datastore, rest_config config = {})
      : datastore_(std::move(datastore)), config_(config) {
    SPECDEC_CHECK(datastore_ != nullptr, invalid_argument, "rest_proposer: null datastore");
    config_.validate();
    std::size_t const nodes = config_.max_occurrences * config_.depth;
    token_.reserve(nodes);
    parent_.reserve(nodes);
    count_.reserve(nodes);
    depth_.reserve(nodes);
    order_.reserve(nodes);
    slot_.reserve(nodes);
    path_.resize(config_.depth);
    starts_.reserve(config_.max_occurrences);
  }

  //! Nothing to index: the datastore is fixed.
  void begin(std::span<token_id const>) noexcept {}

  //! Drafts under ctx.tokens.back() at most min(max_nodes, ctx.max_nodes) nodes.
  void propose(propose_context const& ctx, draft_tree& tree) {
    SPECDEC_CHECK(!ctx.tokens.empty(), invalid_argument,
                  "rest_proposer: propose with no committed tokens");
    tree.reset(ctx.tokens.back());
    if (tree.has_q()) tree.enable_q(0);
    std::size_t const budget = std::min({config_.max_nodes, ctx.max_nodes, tree.capacity() - 1});
    retrieve(ctx.tokens);
    if (budget == 0 || token_.empty()) return;
    prune(budget);
    for (std::uint32_t const node : order_) {
      std::int32_t const p = parent_[node];
      node_index const under = p < 0 ? 0 : slot_[static_cast<std::size_t>(p)];
      slot_[node] = tree.add_node(under, token_[node]);
    }
  }

  //! Nothing to roll back.
  void accept(verify_result const&) noexcept {}

  //! The match of the last `propose` (its length is 0 when nothing matched).
  [[nodiscard]] rest_match const& last_match() const noexcept { return match_; }
  //! Trie nodes built by the last `propose` (before pruning).
  [[nodiscard]] std::size_t last_trie_size() const noexcept { return token_.size(); }
  //! The node budget: the most draft nodes (root excluded) one `propose` can draft under this
  //! configuration, `rest_config::max_nodes` (the pruned trie's size). The decoder scores at most
  //! this many nodes per step.
  [[nodiscard]] std::size_t max_nodes() const noexcept { return config_.max_nodes; }
  //! The configuration (validated).
  [[nodiscard]] rest_config const& config() const noexcept { return config_; }
  //! The datastore drafts are retrieved from.
  [[nodiscard]] rest_datastore const& datastore() const noexcept { return *datastore_; }

 private:
  //! Steps 1-4: the match, the sampled continuations and their trie (token_, parent_, count_,
  //! depth_; nodes in creation order, which is sorted by token path).
  void retrieve(std::span<token_id const> context) {
    token_.clear();
    parent_.clear();
    count_.clear();
    depth_.clear();
    rest_datastore const& ds = *datastore_;
    match_ = ds.longest_suffix_match(context, config_.n_max, config_.n_min);
    if (match_.empty()) return;
    std::span<std::uint32_t const> const corpus = ds.corpus();
    std::span<std::uint32_t const> const sa = ds.suffix_array();
    std::size_t const count = match_.count();
    std::size_t const samples = std::min(count, config_.max_occurrences);
    // Gather the continuations' starts first, prefetching each suffix-array entry and then each
    // continuation, so that their cache misses overlap instead of queueing behind the trie.
    starts_.resize(samples);
    for (std::size_t j = 0; j < samples; ++j) {
      std::size_t const index =
          match_.lo + (samples == count ? j
                                        : static_cast<std::size_t>(static_cast<std::uint64_t>(j) *
                                                                   count / samples));
      starts_[j] = static_cast<std::uint32_t>(index);
      prefetch(sa.data() + index);
    }
    for (std::size_t j = 0; j < samples; ++j) {
      starts_[j] = static_cast<std::uint32_t>(sa[starts_[j]] + match_.length);
      if (starts_[j] < corpus.size()) prefetch(corpus.data() + starts_[j]);
    }
    std::size_t path_length = 0;  // nodes of the previous continuation on path_
    for (std::size_t j = 0; j < samples; ++j) {
      std::size_t const start = starts_[j];
      std::size_t d = 0;
      for (; d < config_.depth && start + d < corpus.size(); ++d) {
        std::uint32_t const t = corpus[start + d];
        if (t == rest_datastore::separator) break;
        auto const tok = static_cast<token_id>(t);
        if (d < path_length && token_[path_[d]] == tok) {
          ++count_[path_[d]];
          continue;
        }
        path_length = d;  // diverged: the rest of the previous path is closed
        auto const node = static_cast<std::uint32_t>(token_.size());
        token_.push_back(tok);
        parent_.push_back(d == 0 ? -1 : static_cast<std::int32_t>(path_[d - 1]));
        count_.push_back(1);
        depth_.push_back(static_cast<std::uint32_t>(d));
        path_[d] = node;
        ++path_length;
      }
      path_length = std::min(path_length, d);
    }
  }

  static void prefetch(void const* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p);
#else
    (void)p;
#endif
  }

  //! Step 5: order_ = the `budget` best nodes in emission order.
  void prune(std::size_t budget) {
    std::size_t const nodes = token_.size();
    order_.resize(nodes);
    for (std::size_t i = 0; i < nodes; ++i) order_[i] = static_cast<std::uint32_t>(i);
    auto const better = [this](std::uint32_t a, std::uint32_t b) {
      if (count_[a] != count_[b]) return count_[a] > count_[b];
      if (depth_[a] != depth_[b]) return depth_[a] < depth_[b];
      return a < b;
    };
    if (nodes > budget) {
      std::nth_element(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(budget),
                       order_.end(), better);
      order_.resize(budget);
    }
    std::sort(order_.begin(), order_.end(), better);
    slot_.resize(nodes);
  }

  std::shared_ptr<rest_datastore const> datastore_;
  rest_config config_;
  rest_match match_;
  // The trie of the last retrieval, one entry per node (root excluded).
  std::vector<token_id> token_;
  std::vector<std::int32_t> parent_;   //!< parent node, -1 for children of the root
  std::vector<std::uint32_t> count_;   //!< continuations through the node
  std::vector<std::uint32_t> depth_;   //!< 0 for children of the root
  std::vector<std::uint32_t> order_;   //!< kept nodes in emission order
  std::vector<node_index> slot_;       //!< draft-tree index of each emitted node
  std::vector<std::uint32_t> path_;    //!< [depth] nodes of the previous continuation
  std::vector<std::uint32_t> starts_;  //!< [occurrences] corpus position of each continuation
};

}  // namespace specdec
