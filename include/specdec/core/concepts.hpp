#pragma once
//! \file
//! The five concepts through which the pieces of specdec plug together: `sampling_policy`,
//! `verifier`, `proposer`, `kv_cache` and `causal_lm` (and `incremental_policy`, a policy with a
//! state advanced token by token; `auxiliary_proposer`, a proposer that scores tokens beside its
//! tree; `batched_lm`, a model that scores many sequences in one forward, for serving). Each
//! requirement is listed with the reason it exists. The compile-time capabilities of proposers and
//! verifiers are in core/traits.hpp.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "specdec/core/auxiliary_batch.hpp"
#include "specdec/core/batch_forward.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"

namespace specdec {

//! A sampling policy: turns one logits row, and the tokens so far, into the exact probability
//! distribution that sampling draws from, and draws from it.
//!
//! Requirements:
//! - `p.distribution(logits, history, probs)` writes into `probs` (same length as `logits`) the
//!   distribution the policy samples from; it sums to 1 (one-hot at the argmax for greedy).
//!   `history` is a `token_history` (the library's callers pass one, which says whether its ids
//!   were checked); a policy may take it as a plain span of token ids instead.
//!   Why: verifiers need the exact target distribution p, and sampling proposers the exact draft
//!   distribution q, for speculation to be lossless under every sampling parameter.
//! - `p.sample(probs, rng)` returns a token drawn from `probs` using one word of `rng`.
//!   Why: the final (bonus or residual) token must come from the same Philox stream on host and
//!   device.
//! - `p.is_greedy()` says whether the distribution is always one-hot.
//!   Why: greedy verification needs only an argmax per row, no distribution and no random draws.
//! - `p.greedy_token(logits, history)` returns the token a greedy policy emits (the argmax after
//!   the policy's logit processing; ties go to the lowest id).
//!   Why: greedy verifiers read a row once and write nothing.
template <class P>
concept sampling_policy = requires(P const& p, std::span<float const> logits, token_history history,
                                   std::span<float> probs, philox& rng) {
  p.distribution(logits, history, probs);
  { p.sample(std::span<float const>(probs), rng) } -> std::same_as<token_id>;
  { p.is_greedy() } -> std::convertible_to<bool>;
  { p.greedy_token(logits, history) } -> std::same_as<token_id>;
};

//! A sampling policy with an incremental state (optional): what it needs of the tokens so far,
//! kept as a state that moves forward one token at a time, so that a stateful policy (a grammar
//! constraint, a stop-sequence matcher) costs one step per token instead of a pass over the
//! history. The verifiers use it when a policy has it: one `begin` per tree, from the committed
//! history, and one `advance` per node their walk reaches (verify/detail/walk.hpp), each node's
//! state derived from its parent's.
//!
//! Requirements, besides `sampling_policy`'s:
//! - `P::state_type`, copyable: a node's state is its parent's, copied and advanced.
//! - `p.begin(history)` returns the state after `history` (every committed token).
//! - `p.advance(state, token)` moves `state` past `token` (a token the state disallows may throw
//!   `specdec::error` or yield a state that allows nothing; the verifiers only advance by drafted
//!   tokens, which the target's row may still reject).
//! - `p.distribution(logits, state, probs)` and `p.greedy_token(logits, state)`: as the history
//!   forms, given the state of that history. The two forms must agree exactly: the decoders call
//!   the history forms where they sample outside a tree.
template <class P>
concept incremental_policy = sampling_policy<P> && std::copyable<typename P::state_type> &&
    requires(P const& p, typename P::state_type& state, typename P::state_type const& at,
             token_history history, token_id token, std::span<float const> logits,
             std::span<float> probs) {
  { p.begin(history) } -> std::same_as<typename P::state_type>;
  p.advance(state, token);
  p.distribution(logits, at, probs);
  { p.greedy_token(logits, at) } -> std::same_as<token_id>;
};

//! The sampling policy of one request whose prompt has `prompt_length` tokens: `p.for_prompt(n)`
//! for a policy that depends on where the output starts (a constraint covers the output only:
//! `constrained`, sampling/constraint.hpp), else `p` itself. Every driver calls it when a request
//! starts.
template <class Policy>
[[nodiscard]] decltype(auto) policy_for_prompt(Policy const& p, std::size_t prompt_length) {
  if constexpr (requires {
                  { p.for_prompt(prompt_length) } -> std::same_as<Policy>;
                }) {
    return p.for_prompt(prompt_length);
  } else {
    return (p);
  }
}

//! A verifier: walks a draft tree against the target's rows and decides the accepted path and the
//! bonus token.
//!
//! Requirements:
//! - `v.verify(tree, target_logits, policy, history, rng, out)` fills `out` with the accepted
//!   nodes and tokens plus the bonus token. `target_logits` has one row per tree node (row i is the
//!   target's next-token logits after the path to node i); `history` (a `token_history`, or a
//!   span of token ids) is every committed token, the root last (penalty-aware policies extend it
//!   with the path of each node they score).
//!   Why: one call per sequence and step is the loop's third stage; `out` is reused so the hot
//!   loop does not allocate; `rng` is advanced by a documented, outcome-independent count so that
//!   host and device consume the same words.
//! - `v` is non-const: verifiers own scratch buffers (a residual row, a path) sized once.
template <class V, class Policy>
concept verifier = sampling_policy<Policy> &&
    requires(V& v, draft_tree const& tree, matrix_view<float const> target_logits,
             Policy const& policy, token_history history, philox& rng, verify_result& out) {
  v.verify(tree, target_logits, policy, history, rng, out);
};

//! A proposer: drafts a tree of candidate tokens for one sequence and updates its own state from
//! what was accepted.
//!
//! Requirements:
//! - `p.begin(prompt)` starts a new sequence with the prompt tokens.
//!   Why: model-based proposers prefill their own caches; retrieval proposers index the prompt.
//! - `p.propose(ctx, tree)` resets `tree` to root `ctx.tokens.back()` and adds at most
//!   `ctx.max_nodes` draft nodes. Why: the loop's first stage.
//! - `p.accept(result)` is told which nodes were accepted and the bonus token.
//!   Why: proposers with state (a draft KV cache, an n-gram index) roll back or extend it.
//! Capabilities that change the loop are declared as static constexpr bool members and read
//! through `proposer_traits` (core/traits.hpp): `produces_trees`, `samples_drafts` (the tree
//! carries q rows and needs a verifier that uses them), `needs_target_hidden`,
//! `has_auxiliary_tokens` (see `auxiliary_proposer`).
template <class P>
concept proposer = requires(P& p, propose_context const& ctx, draft_tree& out,
                            verify_result const& r, std::span<token_id const> prompt) {
  p.begin(prompt);
  p.propose(ctx, out);
  p.accept(r);
};

//! A proposer that drafts for many requests at once (`batch_decoder`), holding the state of each
//! request under its slot: a batched draft model serving the whole batch with one forward per
//! draft position, or independent per-request proposers (`per_request_proposer`).
//!
//! Requirements:
//! - `p.begin(slot, prompt)` starts a request in `slot` (a slot not in use by another request).
//!   Why: as `proposer::begin`, per request.
//! - `p.propose(items)` drafts for every item: item i's tree gets root
//!   `items[i].ctx.tokens.back()` and at most `items[i].ctx.max_nodes` nodes, as
//!   `proposer::propose` would for that request alone. A failure that concerns one request only
//!   is stored in its `error`; an exception fails every request of the call.
//!   Why: one call per step lets a model-based proposer batch its forwards across requests.
//! - `p.accept(slot, result)`: as `proposer::accept`, for the request in `slot`.
//! - `p.end(slot)`: the request left (finished, cancelled or failed); its state may go.
//!   Why: slots are reused by later requests.
//! Capabilities are declared as for `proposer` (`proposer_traits`): `produces_trees`,
//! `samples_drafts`.
template <class P>
concept batch_proposer = requires(P& p, std::size_t slot, std::span<token_id const> prompt,
                                  std::span<batch_propose_item> items, verify_result const& r) {
  p.begin(slot, prompt);
  p.propose(items);
  p.accept(slot, r);
  p.end(slot);
};

//! A proposer that adds auxiliary tokens to the target forward of each step and learns from the
//! target's rows: lookahead decoding's Jacobi window scored beside its verification tree, Jacobi
//! decoding refining its guesses from the target's own predictions, or any strategy that wants
//! extra target rows for free in the forward it already pays for.
//!
//! Requirements (beyond `proposer`):
//! - `P::has_auxiliary_tokens` is true. Why: the decoder selects the extended step at compile time
//!   (`if constexpr`), so proposers without it pay nothing.
//! - `p.auxiliary(ctx, tree, aux)` is called once per step after `propose`, with the tree just
//!   proposed and `aux` reset to hold it (rows [0, tree.size()) with the tree's mask, positions
//!   base + depth); it appends tokens with `aux.add(token, position, wants_logits)` (at most
//!   `aux.room()`, positions below `aux.position_limit()`) and sets their visibility with
//!   `aux.attend(row, col)`. Tree rows never see auxiliary rows.
//!   Why: one forward scores both; the tree's logits stay exactly those of the tree alone, so
//!   verification is unchanged and lossless; the auxiliary rows cost batch rows, not forwards.
//! - `p.observe(tree_logits, aux_logits, result)` is called after verification and before
//!   `accept`: `tree_logits` is [tree.size(), vocab] (row i after the path to node i), `aux_logits`
//!   is [aux.num_aux_logits(), vocab], the rows of the auxiliary tokens added with
//!   `wants_logits`, in batch order; `result` is the verification outcome. Both views are valid
//!   only during the call. Why: the proposer's next guesses come from these rows (lookahead's
//!   next Jacobi level, Jacobi's refined block); the outcome says how far the sequence moved.
//! The auxiliary KV entries are dropped when the step is committed (only the root and the
//! accepted nodes are kept), so a proposer can put anything there.
template <class P>
concept auxiliary_proposer = proposer<P> && proposer_traits<P>::has_auxiliary_tokens &&
    requires(P& p, propose_context const& ctx, draft_tree const& tree, auxiliary_batch& aux,
             matrix_view<float const> rows, verify_result const& r) {
  p.auxiliary(ctx, tree, aux);
  p.observe(rows, rows, r);
};

//! A KV cache that can drop rejected speculation.
//!
//! Requirements:
//! - `c.size()`: number of positions stored. Why: the next forward appends after them.
//! - `c.capacity()`: most positions it can hold. Why: callers check before a forward.
//! - `c.truncate(n)`: drops positions >= n (n <= size()). Why: chain rollback.
//! - `c.keep_path(n, keep)`: keeps positions [0, n), then moves position n + keep[i] to n + i and
//!   drops the rest; `keep` is strictly ascending. Why: after a tree step only the accepted path
//!   survives, compacted to consecutive positions.
template <class C>
concept kv_cache = requires(C& c, C const& cc, std::size_t n, std::span<std::int32_t const> keep) {
  { cc.size() } -> std::convertible_to<std::size_t>;
  { cc.capacity() } -> std::convertible_to<std::size_t>;
  c.truncate(n);
  c.keep_path(n, keep);
};

//! The adapter an engine implements to plug its model in.
//!
//! Requirements:
//! - `m.vocab_size()`, `m.max_context()`, `m.hidden_size()`. Why: buffers are sized once and
//!   requests validated against them.
//! - `m.forward(req, out)` scores `req` (see `forward_request`: tokens at positions with a
//!   visibility mask over the batch, against the cache) and appends the batch's KV entries.
//!   Why: one call scores a whole draft tree (or a lookahead window, which is not a tree).
//! - `m.cache()` is a `kv_cache`. Why: the decoder commits or rolls back speculation.
template <class M>
concept causal_lm = requires(M& m, M const& cm, forward_request const& req, forward_result& out) {
  { cm.vocab_size() } -> std::convertible_to<std::size_t>;
  { cm.max_context() } -> std::convertible_to<std::size_t>;
  { cm.hidden_size() } -> std::convertible_to<std::size_t>;
  m.forward(req, out);
  requires kv_cache<std::remove_cvref_t<decltype(m.cache())>>;
};

//! A model that scores several sequences in one forward (serving many requests at once), each
//! sequence in its own slot with its own KV cache: the sibling of `causal_lm` that
//! `batch_decoder` drives.
//!
//! Requirements:
//! - `m.vocab_size()`, `m.max_context()`, `m.hidden_size()`, as for `causal_lm`.
//! - `m.max_slots()`: most sequences held at once. `m.free_slots()`: slots not in use now.
//!   Why: a serving loop admits requests while slots are free and queues the others.
//! - `m.acquire_slot()` returns a free slot (index < max_slots()) with an empty cache and marks it
//!   in use; throws `errc::context_overflow` when none is free. `m.release_slot(slot)` frees it
//!   for reuse (throws `errc::invalid_argument` for a slot not in use). Why: requests come and go
//!   between steps (continuous batching); a finished request's slot, and its memory, serve the
//!   next one.
//! - `m.cache(slot)` is a `kv_cache`. Why: each sequence commits or rolls back its own
//!   speculation (truncate / keep_path) by its own accepted length.
//! - `m.forward(req, out)` scores every segment of `req` (see `batch_forward_request`) against its
//!   slot's cache, as a `causal_lm` would score that segment alone, and appends each segment's KV
//!   entries to its slot's cache; `out` holds the segments' logits rows one after the other.
//!   Why: one forward per step for the whole batch, so the weights are read once for all its
//!   requests -- what makes batching pay on a memory-bound device.
template <class M>
concept batched_lm = requires(M& m, M const& cm, batch_forward_request const& req,
                              batch_forward_result& out, std::size_t slot) {
  { cm.vocab_size() } -> std::convertible_to<std::size_t>;
  { cm.max_context() } -> std::convertible_to<std::size_t>;
  { cm.hidden_size() } -> std::convertible_to<std::size_t>;
  { cm.max_slots() } -> std::convertible_to<std::size_t>;
  { cm.free_slots() } -> std::convertible_to<std::size_t>;
  { m.acquire_slot() } -> std::same_as<std::size_t>;
  m.release_slot(slot);
  m.forward(req, out);
  requires kv_cache<std::remove_cvref_t<decltype(m.cache(slot))>>;
};

}  // namespace specdec
