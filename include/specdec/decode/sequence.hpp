#pragma once
//! \file
//! `sequence_step`: the speculative step of one sequence, phase by phase -- the one home of
//! the speculative loop. `speculative_decoder` drives one sequence through it, `batch_decoder` many
//! (their drafts scored in one forward), and an engine with its own scheduler can drive it too
//! (examples/own_scheduler.cpp). The phases, in order, each step:
//!
//! 1. `draft_limit()`: the most draft nodes the step may score -- the node budget (`node_budget`),
//!    the positions left in the context - 1, and for chain proposers the tokens still allowed - 1;
//!    none (the request ends, `finish_reason::context_full`) when the context is full;
//! 2. `context(max_nodes)`: what the proposer sees (committed tokens, the target's hidden rows of
//!    the last committed tokens when it reads them, the node budget, the request's Philox stream);
//!    the caller runs the proposer into `tree()`, then `end_propose()` (which drops what a
//!    proposer drafting on the target -- `uses_target` -- left in its cache), then `auxiliary(add)`
//!    for a proposer with auxiliary tokens, then `check_draft(max_nodes)`;
//! 3. `request(...)`: the target forward that scores the draft (tree rows at positions base +
//!    depth with the tree's ancestor mask, then the auxiliary tokens; the prompt's rows first when
//!    the request's prefill rides in its first step), with the hidden rows the proposer reads;
//! 4. `verify(verifier, rows, policy)`: the verifier's walk of the tree's rows;
//! 5. `commit(cache, rows, hidden, accept)`: the target cache keeps the root and the accepted nodes
//!    (`commit_to_cache`), the hidden rows of those nodes are kept for the next step, `accept()`
//!    lets the proposer observe and accept the outcome, and the accepted tokens and the bonus are
//!    emitted through the stop checks.
//! A proposer that reads the target's hidden states needs them for its first draft: such a
//! request's prompt x_1..x_{t-1} is scored first on its own (`prefill_request`, then `prefilled`).
//!
//! The request's randomness is one Philox stream (config.seed, config.stream) from word 0;
//! proposers that sample draw from it first, then the verifier, so a request is reproducible from
//! its seed whichever driver runs it.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "specdec/core/auxiliary_batch.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/stats.hpp"
#include "specdec/core/target_handle.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/decode/common.hpp"

namespace specdec {

namespace detail {

//! The pairings of a target, a proposer and a verifier that cannot work, refused at compile time
//! for every driver of the step (both decoders: `static_assert(pairing_checks<...>::ok)`), as far
//! as types can tell (`compatible_v`, `serves_proposer_v`; core/traits.hpp).
template <class Model, class Proposer, class Verifier>
struct pairing_checks {
  static_assert(!(samples_drafts_v<Proposer> && greedy_only_v<Verifier>),
                "specdec: this proposer samples its drafts (and records q rows); a greedy-only "
                "verifier would ignore them. Use a sampling verifier.");
  static_assert(!(needs_draft_probs_v<Verifier> && !samples_drafts_v<Proposer>),
                "specdec: this verifier needs draft probabilities (q rows) but the proposer "
                "drafts deterministic candidates. Use a greedy or tree verifier.");
  static_assert(!(produces_trees_v<Proposer> && !supports_trees_v<Verifier>),
                "specdec: this proposer drafts trees but the verifier handles chains only. Use a "
                "tree verifier.");
  static_assert(serves_proposer_v<Model, Proposer>,
                "specdec: this proposer drafts with a variant of the target's forward (skipped "
                "layers, a view of its cache) that the target does not declare "
                "(supports_skip_layers, supports_kv_view; core/traits.hpp)");
  static constexpr bool ok = true;  //!< reading it instantiates the checks
};

}  // namespace detail

//! The node budget of a step (draft nodes, root excluded): the proposer's own (`max_nodes()`, the
//! most nodes its tree can hold under its configuration) capped by config.max_draft_nodes when
//! set; for a proposer that declares no `max_nodes()`, config.max_draft_nodes or
//! `default_max_draft_nodes`. Below max_tree_nodes. `Proposer` is a `proposer` or a
//! `batch_proposer`.
template <class Proposer>
[[nodiscard]] std::size_t node_budget(Proposer const& proposer, decode_config const& config) {
  std::size_t budget = config.max_draft_nodes.value_or(default_max_draft_nodes);
  if constexpr (requires {
                  { proposer.max_nodes() } -> std::convertible_to<std::size_t>;
                })
    budget = std::min<std::size_t>(proposer.max_nodes(),
                                   config.max_draft_nodes.value_or(max_tree_nodes - 1));
  return std::min(budget, max_tree_nodes - 1);
}

//! Commits a verified step to the target's cache: keeps positions [0, base] (the committed tokens
//! and the root) and the accepted nodes, with `truncate` when they are the first nodes of a chain
//! (nodes 1..m), `keep_path` otherwise. `base` is the root's position; the cache holds the step's
//! rows after it. Throws `errc::internal` when the accepted nodes are not a root-to-node path of
//! `tree`. `keep` is scratch. What an engine with its own loop calls after its verifier.
template <kv_cache Cache>
void commit_to_cache(Cache& cache, std::size_t base, draft_tree const& tree,
                     verify_result const& result, std::vector<std::int32_t>& keep) {
  std::size_t const n = tree.size();
  std::size_t const m = result.num_accepted();
  bool prefix_of_chain = true;
  for (std::size_t i = 0; i < m; ++i) {
    node_index const a = result.accepted_nodes[i];
    SPECDEC_CHECK(a > 0 && static_cast<std::size_t>(a) < n &&
                      tree.depth(a) == static_cast<std::int32_t>(i + 1) &&
                      tree.parent(a) == (i == 0 ? 0 : result.accepted_nodes[i - 1]),
                  internal,
                  "commit_to_cache: the verifier's accepted nodes are not a root-to-node ",
                  "path (entry ", i, " is node ", a, ")");
    prefix_of_chain = prefix_of_chain && a == static_cast<node_index>(i + 1);
  }
  if (prefix_of_chain) {
    cache.truncate(base + m + 1);
  } else {
    keep.clear();
    keep.push_back(0);
    keep.insert(keep.end(), result.accepted_nodes.begin(), result.accepted_nodes.end());
    cache.keep_path(base, keep);
  }
}

//! The speculative step of one sequence (see the file comment). Holds the sequence's state: the
//! committed tokens and stop checks, the draft tree, the verification outcome, the Philox stream,
//! the hidden rows its proposer reads, and the step's statistics.
//!
//! \tparam Proposer the proposer type (a `proposer` or a `batch_proposer`): its traits select the
//!                  hidden rows and auxiliary tokens the step carries.
template <class Proposer>
class sequence_step {
 public:
  static constexpr bool reads_hidden = needs_target_hidden_v<Proposer>;    //!< proposer's trait
  static constexpr bool has_auxiliary = has_auxiliary_tokens_v<Proposer>;  //!< proposer's trait
  static constexpr bool on_target = uses_target_v<Proposer>;               //!< proposer's trait
  //! Whether the prompt must be scored before the first draft: the proposer reads its hidden rows,
  //! its auxiliary tokens would need rows that see the prompt's, or it drafts on the target's
  //! cache, which must hold the prompt.
  static constexpr bool prefills_alone = reads_hidden || has_auxiliary || on_target;

  //! Starts a request: `prompt` (checked by the caller) becomes the committed tokens, `out` is
  //! cleared and will receive the tokens and statistics; `budget` is the node budget
  //! (`node_budget`), `capacity` the positions the target's cache can hold, `hidden_layers` the
  //! layers whose residual streams the proposer reads (`target_hidden_layers`, kept by
  //! reference). `config`, `out`, `on_token` and `observer` must outlive the request.
  void begin(std::span<token_id const> prompt, decode_config const& config, std::size_t budget,
             std::size_t capacity, decode_result& out, token_callback const* on_token = nullptr,
             request_observer const* observer = nullptr,
             std::span<std::int32_t const> hidden_layers = {}) {
    budget_ = budget;
    capacity_ = capacity;
    layers_ = hidden_layers;
    out_ = &out;
    if (tree_.capacity() < budget + 1) tree_.reserve(budget + 1);
    out.stats = request_stats{};
    out.stats.prompt_tokens = prompt.size();
    sink_.begin(config, prompt, out, on_token, budget, observer);
    rng_ = philox(config.seed, config.stream, 0);
    hidden_.clear();
    hidden_view_ = {};
    prompt_rows_ = prompt.size() - 1;
  }

  //! Whether the request is over (its reason is in the result).
  [[nodiscard]] bool done() const noexcept { return sink_.done(); }
  //! The committed tokens (prompt + emitted), the root of the next draft last.
  [[nodiscard]] std::span<token_id const> committed() const noexcept { return sink_.committed(); }
  //! The root's position: the positions the target's cache holds between steps.
  [[nodiscard]] std::size_t base() const noexcept { return sink_.committed().size() - 1; }
  //! The node budget.
  [[nodiscard]] std::size_t budget() const noexcept { return budget_; }
  //! Positions the target's cache can hold.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  //! The request's Philox stream.
  [[nodiscard]] philox& rng() noexcept { return rng_; }
  //! The draft tree of this step.
  [[nodiscard]] draft_tree& tree() noexcept { return tree_; }
  [[nodiscard]] draft_tree const& tree() const noexcept { return tree_; }
  //! The verification outcome of this step.
  [[nodiscard]] verify_result const& result() const noexcept { return result_; }
  //! This step's statistics so far.
  [[nodiscard]] step_stats const& stats() const noexcept { return step_; }
  //! The auxiliary tokens of this step (auxiliary proposers).
  [[nodiscard]] auxiliary_batch const& aux() const noexcept { return aux_; }
  //! Tokens still allowed by max_new_tokens.
  [[nodiscard]] std::size_t remaining() const noexcept { return sink_.remaining(); }
  //! Rows the step's forward scores: the tree and the auxiliary tokens.
  [[nodiscard]] std::size_t scored_rows() const noexcept {
    if constexpr (has_auxiliary) return aux_.size();
    return tree_.size();
  }

  //! Phase 1: the most draft nodes this step may score (see the file comment), or nullopt when the
  //! context is full: the request then ends (`finish_reason::context_full`). Starts the step.
  [[nodiscard]] std::optional<std::size_t> draft_limit() {
    step_ = step_stats{};
    std::size_t const b = base();
    if (b >= capacity_) {
      sink_.context_full();
      return std::nullopt;
    }
    std::size_t limit = std::min(budget_, capacity_ - b - 1);
    // A chain deeper than the tokens still allowed cannot be used: a step emits at most its
    // accepted drafts plus one. (A tree's node count is not its depth, so trees keep the bound.)
    if constexpr (!produces_trees_v<Proposer>) limit = std::min(limit, sink_.remaining() - 1);
    return limit;
  }

  //! The handle on this sequence's target cache that a proposer declaring `uses_target` drafts
  //! with (set by the driver after `begin`; see core/target_handle.hpp).
  void bind_target(target_handle handle) noexcept requires on_target { handle_ = handle; }

  //! Phase 2: what the proposer sees for a draft of at most `max_nodes` nodes.
  [[nodiscard]] propose_context context(std::size_t max_nodes) noexcept {
    propose_context ctx;
    ctx.tokens = committed();
    ctx.target_hidden = hidden_view_;
    ctx.max_nodes = max_nodes;
    ctx.rng = &rng_;
    if constexpr (on_target) {
      handle_.set_committed(base());
      ctx.target = &handle_;
    }
    return ctx;
  }

  //! Phase 2, right after the proposer: drops whatever its forwards on the target left after the
  //! committed positions, before the step's own forward. No-op for other proposers.
  void end_propose() {
    if constexpr (on_target) handle_.rollback();
  }

  //! Phase 2, auxiliary proposers: resets the auxiliary batch to the tree just drafted (room: the
  //! cache's free positions) and calls `add(aux)`, which runs the proposer's `auxiliary`.
  template <class Add>
  void auxiliary(Add&& add) requires has_auxiliary {
    std::size_t const b = base();
    std::size_t const free = capacity_ - b;
    std::size_t const room =
        tree_.size() < free ? std::min(free - tree_.size(), max_tree_nodes) : 0;
    aux_.reset(tree_, static_cast<position_t>(b), room, capacity_);
    add(aux_);
    aux_.finalize();
    step_.aux_tokens = aux_.num_aux();
  }

  //! Phase 2: checks the draft against the step's context (root = the last committed token, at
  //! most `max_nodes` nodes); throws `errc::invalid_argument` naming `who` otherwise.
  void check_draft(std::size_t max_nodes, char const* who = "sequence_step") {
    std::span<token_id const> const c = committed();
    SPECDEC_CHECK(!tree_.empty() && tree_.root() == c.back(), invalid_argument, who,
                  ": the proposer's tree must have the last committed token ", c.back(),
                  " as its root");
    SPECDEC_CHECK(tree_.num_drafted() <= max_nodes, invalid_argument, who,
                  ": the proposer drafted ", tree_.num_drafted(),
                  " nodes, more than max_nodes = ", max_nodes);
    step_.tree_size = tree_.num_drafted();
    step_.tree_depth = static_cast<std::size_t>(tree_.max_depth());
  }

  //! Prompt rows a prefill scores (x_1..x_{t-1}); 0 once they are in the cache.
  [[nodiscard]] std::size_t prompt_rows() const noexcept { return prompt_rows_; }

  //! The prefill of a request whose prompt is scored alone: x_1..x_{t-1} at positions 0..t-2,
  //! causal, logits for the last row only, with the hidden rows the proposer reads. Valid while
  //! this object lives and until the next call. Requires prompt_rows() > 0.
  [[nodiscard]] forward_request prefill_request() {
    std::size_t const n = prompt_rows_;
    std::span<token_id const> const c = committed();
    positions_.resize(n);
    for (std::size_t i = 0; i < n; ++i) positions_[i] = static_cast<position_t>(i);
    last_row_ = static_cast<std::int32_t>(n - 1);
    forward_request req{.tokens = c.first(n),
                        .positions = positions_,
                        .logits_rows = std::span<std::int32_t const>(&last_row_, 1)};
    ask_hidden(req);
    return req;
  }

  //! After the prefill's forward: keeps its hidden rows (`hidden`: the rows of the proposer's
  //! layers, or the final hidden state) for the first draft.
  void prefilled(matrix_view<float const> hidden) {
    prompt_rows_ = 0;
    if constexpr (reads_hidden) keep_hidden(hidden, nullptr);
  }

  //! Phase 3: the forward request that scores the draft -- the tree (positions base + depth, its
  //! ancestor mask), then the auxiliary tokens; when `with_prompt`, the prompt x_1..x_{t-1} first
  //! (causal; the draft's rows see all of it), which is then in the cache after the step. Logits
  //! rows: the tree's, then the auxiliary tokens' that want them. Valid until the next call.
  [[nodiscard]] forward_request request(bool with_prompt = false) {
    std::size_t const n = tree_.size();
    std::size_t const b = base();
    forward_request req;
    if (!with_prompt || prompt_rows_ == 0) {
      tree_.positions(static_cast<position_t>(b), positions_);
      req = forward_request{.tokens = tree_.tokens(),
                            .positions = positions_,
                            .mask = tree_.mask(),
                            .mask_stride = tree_.mask_stride()};
      if constexpr (has_auxiliary) {
        if (aux_.num_aux() > 0) {
          req.tokens = aux_.tokens();
          req.positions = aux_.positions();
          req.mask = aux_.mask();
          req.mask_stride = aux_.mask_stride();
          req.logits_rows = aux_.logits_rows();
        }
      }
    } else if constexpr (!prefills_alone) {
      std::size_t const p = prompt_rows_;  // == b
      std::size_t const total = p + n;
      std::size_t const stride = mask_words(total);
      std::span<token_id const> const c = committed();
      tokens_.assign(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(p));
      tokens_.insert(tokens_.end(), tree_.tokens().begin(), tree_.tokens().end());
      positions_.resize(total);
      mask_.assign(total * stride, 0);
      auto const set = [&](std::size_t row, std::size_t col) {
        mask_[row * stride + col / 64] |= std::uint64_t{1} << (col % 64);
      };
      for (std::size_t i = 0; i < p; ++i) {
        positions_[i] = static_cast<position_t>(i);
        for (std::size_t j = 0; j <= i; ++j) set(i, j);
      }
      logits_rows_.resize(n);
      for (std::size_t i = 0; i < n; ++i) {
        auto const node = static_cast<node_index>(i);
        positions_[p + i] = static_cast<position_t>(p) + tree_.depth(node);
        logits_rows_[i] = static_cast<std::int32_t>(p + i);
        for (std::size_t j = 0; j < p; ++j) set(p + i, j);
        for (node_index a = node; a >= 0; a = a == 0 ? -1 : tree_.parent(a))
          set(p + i, p + static_cast<std::size_t>(a));
      }
      req = forward_request{.tokens = tokens_,
                            .positions = positions_,
                            .mask = mask_,
                            .mask_stride = stride,
                            .logits_rows = logits_rows_};
    } else {
      SPECDEC_CHECK(false, internal, "sequence_step: this proposer's prompt is scored alone ",
                    "(prefill_request), not with its first draft");
    }
    ask_hidden(req);
    return req;
  }

  //! Asks `req` for the hidden rows the proposer reads (none when it reads none).
  void ask_hidden(forward_request& req) const noexcept {
    if constexpr (reads_hidden) {
      req.hidden_layers = layers_;
      req.want_hidden = layers_.empty();
    }
  }

  //! Phase 4: the verifier walks the tree against `rows` (one per tree node, host or device) under
  //! `policy`, writing the accepted path and the bonus token.
  template <class Verifier, class Rows, class Policy>
  void verify(Verifier& verifier, Rows const& rows, Policy const& policy,
              char const* who = "sequence_step") {
    // The committed tokens were checked as they were committed (the prompt by check_prompt, the
    // rest by the verifier that produced them).
    verifier.verify(tree_, rows, policy, token_history::checked(committed()), rng_, result_);
    SPECDEC_CHECK(result_.tokens.size() == result_.accepted_nodes.size() + 1, internal, who,
                  ": the verifier returned ", result_.tokens.size(), " tokens for ",
                  result_.accepted_nodes.size(), " accepted nodes");
  }

  //! Phase 5: commits the verified step (see the file comment). `cache` is the target's cache of
  //! this sequence, holding base() positions and the step's rows (the prompt's too when it rode
  //! along); `rows` the tree's host logits rows for token events (empty when they stay on a
  //! device); `hidden` the step's hidden rows of the tree's nodes (proposers that read them);
  //! `accept()` runs the proposer's `observe` and `accept`. Returns the step's statistics, also
  //! added to the request's.
  template <kv_cache Cache, class Accept>
  step_stats const& commit(Cache& cache, matrix_view<float const> rows,
                           matrix_view<float const> hidden, Accept&& accept,
                           char const* who = "sequence_step") {
    std::size_t const b = base();
    // Before the step the cache held b positions, or none when the prompt (b rows) rode along.
    std::size_t const expected = b + scored_rows();
    SPECDEC_CHECK(cache.size() == expected, internal, who, ": the target cache holds ",
                  cache.size(), " positions, expected ", expected);
    prompt_rows_ = 0;
    commit_to_cache(cache, b, tree_, result_, keep_);
    if constexpr (reads_hidden) keep_hidden(hidden, &result_);
    accept();
    std::size_t const m = result_.num_accepted();
    step_.accepted = m;
    std::size_t const emitted_before = sink_.emitted();
    std::size_t const step_index = out_->stats.steps;
    for (std::size_t i = 0; i < result_.tokens.size(); ++i) {
      // Token i was scored by the row of its parent: the root, then the accepted nodes.
      node_index const parent = i == 0 ? 0 : result_.accepted_nodes[i - 1];
      detail::token_origin const origin{.step = step_index,
                                        .depth = i + 1,
                                        .drafted = i < m,
                                        .logits = rows.empty()
                                                      ? std::span<float const>{}
                                                      : rows.row(static_cast<std::size_t>(parent))};
      if (sink_.emit(result_.tokens[i], origin)) break;
    }
    step_.emitted = sink_.emitted() - emitted_before;
    out_->stats.add(step_);
    return step_;
  }

  //! Ends the request for a full context (`finish_reason::context_full`).
  void context_full() { sink_.context_full(); }

 private:
  // Copies into hidden_ the rows of the nodes the next draft reads: every row (the prefill,
  // `accepted` null), or the root's and the accepted nodes', in order.
  void keep_hidden(matrix_view<float const> all, verify_result const* accepted) {
    if (all.empty()) {
      hidden_view_ = {};
      return;
    }
    std::size_t const h = all.cols();
    std::size_t const count = accepted == nullptr ? all.rows() : accepted->num_accepted() + 1;
    hidden_.resize(count * h);
    for (std::size_t r = 0; r < count; ++r) {
      std::size_t const node = accepted == nullptr ? r
                               : r == 0            ? 0
                                        : static_cast<std::size_t>(accepted->accepted_nodes[r - 1]);
      std::span<float const> const src = all.at_row(node);
      std::copy(src.begin(), src.end(), hidden_.begin() + static_cast<std::ptrdiff_t>(r * h));
    }
    hidden_view_ = matrix_view<float const>(hidden_.data(), count, h);
  }

  std::size_t budget_ = 0;
  std::size_t capacity_ = 0;
  std::size_t prompt_rows_ = 0;  // prompt rows not yet in the cache
  std::span<std::int32_t const> layers_;
  decode_result* out_ = nullptr;
  detail::token_sink sink_;
  philox rng_{0};
  draft_tree tree_{1};
  verify_result result_;
  step_stats step_;
  auxiliary_batch aux_;
  std::vector<float> hidden_;  // the rows the next draft reads
  matrix_view<float const> hidden_view_;
  std::vector<token_id> tokens_;  // a prompt riding with the tree
  std::vector<position_t> positions_;
  std::vector<std::uint64_t> mask_;
  std::vector<std::int32_t> logits_rows_;
  std::vector<std::int32_t> keep_;
  std::int32_t last_row_ = 0;
  target_handle handle_;
};

}  // namespace specdec
