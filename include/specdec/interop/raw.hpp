#pragma once
//! \file
//! Building specdec's inputs from raw C arrays (a pointer and sizes), for engines written in C or
//! C-style C++, and copying results back out. Every helper validates what it can see -- null
//! pointers with a non-zero size, sizes whose products overflow, parents that do not form a tree,
//! token ids outside the vocabulary -- and throws `specdec::error` with a message naming the
//! argument. What it cannot see is the length of the memory behind a pointer: the caller
//! guarantees that each pointer addresses at least the number of elements its size says.
//!
//! - `raw_span`, `raw_matrix`: spans and `matrix_view`s over caller memory;
//! - `raw_forward_batch` + `make_forward_request`: a `forward_request` over caller arrays;
//! - `assign_draft_tree` / `make_draft_tree`: a `draft_tree` from token and parent arrays (and
//!   optional q rows), reusing the tree's capacity so a hot loop does not allocate;
//! - `copy_accepted`: the accepted tokens (and nodes) of a `verify_result` into caller arrays.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"

namespace specdec::interop {

//! A span over `size` elements at `data`. `data` may be null only when `size` is 0. `what` names
//! the argument in the error message. Throws `errc::invalid_argument`.
template <class T>
[[nodiscard]] std::span<T> raw_span(T* data, std::size_t size, char const* what = "array") {
  SPECDEC_CHECK(data != nullptr || size == 0, invalid_argument, "raw_span: ", what,
                " is null but its size is ", size);
  SPECDEC_CHECK(size <= std::numeric_limits<std::size_t>::max() / sizeof(T), invalid_argument,
                "raw_span: ", what, " has ", size, " elements, more than memory can hold");
  return data == nullptr ? std::span<T>() : std::span<T>(data, size);
}

//! A `matrix_view` of `rows` x `cols` elements at `data`, rows `stride` elements apart (0 = dense,
//! i.e. `cols`). Throws `errc::invalid_argument` for a null `data` with a non-empty shape, a stride
//! below `cols`, or a shape whose extent overflows. Row r of the view is data[r * stride, r *
//! stride + cols).
template <class T>
[[nodiscard]] matrix_view<T> raw_matrix(T* data, std::size_t rows, std::size_t cols,
                                        std::size_t stride = 0) {
  std::size_t const s = stride == 0 ? cols : stride;
  SPECDEC_CHECK(rows == 0 || s <= std::numeric_limits<std::size_t>::max() / sizeof(T) / rows,
                invalid_argument, "raw_matrix: ", rows, " rows of stride ", s,
                " elements overflow the address space");
  if (rows == 0 || cols == 0) {
    SPECDEC_CHECK(s >= cols, invalid_argument, "raw_matrix: stride ", s,
                  " is smaller than the row length ", cols);
    return matrix_view<T>();
  }
  SPECDEC_CHECK(data != nullptr, invalid_argument, "raw_matrix: null data for a ", rows, " x ",
                cols, " matrix");
  return matrix_view<T>(data, rows, cols, stride);
}

//! The arrays of one forward batch as a C-style engine holds them. Sizes are element counts;
//! pointers may be null only when their count is 0 (`mask` null means causal attention within the
//! batch, `logits_rows` null means logits for every row).
struct raw_forward_batch {
  token_id const* tokens = nullptr;           //!< [n] token ids
  position_t const* positions = nullptr;      //!< [n] absolute positions
  std::size_t n = 0;                          //!< batch size
  std::uint64_t const* mask = nullptr;        //!< [n, mask_stride] bit-packed visibility, or null
  std::size_t mask_stride = 0;                //!< 64-bit words per mask row (0 = mask_words(n))
  std::int32_t const* logits_rows = nullptr;  //!< [num_logits_rows] rows that need logits, or null
  std::size_t num_logits_rows = 0;            //!< entries of `logits_rows`
  bool want_hidden = false;                   //!< also return the final hidden states
  std::int32_t hidden_layer = -1;             //!< also return this layer's residual stream (-1: no)
  std::int32_t const* skip_layers = nullptr;  //!< [num_skip_layers] layers to skip, ascending
  std::size_t num_skip_layers = 0;            //!< entries of `skip_layers`
};

//! A `forward_request` over the arrays of `batch` (no copy: they must outlive the request).
//! Checks the pointers against their counts (`errc::invalid_argument`); it does not know the
//! model, so token ids and positions are checked by the overload below or by the model's forward.
[[nodiscard]] inline forward_request make_forward_request(raw_forward_batch const& batch) {
  SPECDEC_CHECK(batch.n > 0, invalid_argument, "make_forward_request: empty batch (n = 0)");
  forward_request req;
  req.tokens = raw_span(batch.tokens, batch.n, "tokens");
  req.positions = raw_span(batch.positions, batch.n, "positions");
  if (batch.mask != nullptr) {
    std::size_t const stride = batch.mask_stride == 0 ? mask_words(batch.n) : batch.mask_stride;
    SPECDEC_CHECK(stride >= mask_words(batch.n), invalid_argument,
                  "make_forward_request: mask rows of ", stride, " words cannot cover a batch of ",
                  batch.n, " tokens (need ", mask_words(batch.n), ")");
    SPECDEC_CHECK(stride <= std::numeric_limits<std::size_t>::max() / 8 / batch.n, invalid_argument,
                  "make_forward_request: a mask of ", batch.n, " rows of ", stride,
                  " words overflows");
    req.mask = raw_span(batch.mask, batch.n * stride, "mask");
    req.mask_stride = stride;
  } else {
    SPECDEC_CHECK(batch.mask_stride == 0, invalid_argument, "make_forward_request: mask_stride ",
                  batch.mask_stride, " is given without a mask");
  }
  req.logits_rows = raw_span(batch.logits_rows, batch.num_logits_rows, "logits_rows");
  req.want_hidden = batch.want_hidden;
  req.hidden_layer = batch.hidden_layer;
  req.skip_layers = raw_span(batch.skip_layers, batch.num_skip_layers, "skip_layers");
  return req;
}

//! As above, then validated for a model of `vocab` tokens and `max_context` positions
//! (`forward_request::validate`: token ids, positions, mask size, logits rows, skip order).
[[nodiscard]] inline forward_request make_forward_request(raw_forward_batch const& batch,
                                                          std::size_t vocab,
                                                          std::size_t max_context) {
  forward_request req = make_forward_request(batch);
  req.validate(vocab, max_context);
  return req;
}

//! Rebuilds `tree` from raw arrays: node i has token `tokens[i]` and parent `parents[i]`
//! (`parents[0]` = -1 for the root, every other parent < i: topological order), `n` >= 1 nodes.
//! With `q` non-null, `q` holds [n, vocab] row-major draft distributions (row i = the distribution
//! node i's children were drawn from; rows of leaves are copied but never read) and the tree
//! stores them (duplicate siblings are then allowed); with `q` null the tree stores none and
//! siblings must be distinct. `vocab` > 0 also checks every token id against it (required with q).
//!
//! Everything is checked before `tree` is touched, so on error it is unchanged: null pointers,
//! n = 0 or above `max_tree_nodes`, negative or out-of-vocabulary tokens, a root with a parent, a
//! parent that does not precede its node (`errc::invalid_argument` / `out_of_range`). The tree's
//! capacity grows if needed; a tree already large enough is refilled without allocating (the q
//! storage is reallocated only when `vocab` or the capacity changes). q rows are copied, not
//! checked: verifiers check the rows their walk reads; call `tree.validate(vocab)` to check all.
inline void assign_draft_tree(draft_tree& tree, token_id const* tokens, node_index const* parents,
                              std::size_t n, float const* q = nullptr, std::size_t vocab = 0) {
  constexpr char const* who = "assign_draft_tree";
  SPECDEC_CHECK(n >= 1, invalid_argument, who, ": a tree needs a root (n = 0)");
  SPECDEC_CHECK(n <= max_tree_nodes, context_overflow, who, ": ", n, " nodes exceed the limit of ",
                max_tree_nodes);
  SPECDEC_CHECK(tokens != nullptr && parents != nullptr, invalid_argument, who, ": ",
                tokens == nullptr ? "tokens" : "parents", " is null for ", n, " nodes");
  SPECDEC_CHECK(q == nullptr || vocab > 0, invalid_argument, who,
                ": q rows are given without their vocabulary size");
  SPECDEC_CHECK(q == nullptr || vocab <= std::numeric_limits<std::size_t>::max() / 4 / n,
                invalid_argument, who, ": ", n, " q rows of ", vocab, " entries overflow");
  SPECDEC_CHECK(parents[0] == -1, invalid_argument, who, ": the root (node 0) has parent ",
                parents[0], ", expected -1");
  for (std::size_t i = 0; i < n; ++i) {
    SPECDEC_CHECK(tokens[i] >= 0, out_of_range, who, ": node ", i, " has negative token ",
                  tokens[i]);
    SPECDEC_CHECK(vocab == 0 || static_cast<std::size_t>(tokens[i]) < vocab, out_of_range, who,
                  ": node ", i, " has token ", tokens[i], ", outside the vocabulary of ", vocab);
    if (i == 0) continue;
    SPECDEC_CHECK(parents[i] >= 0 && static_cast<std::size_t>(parents[i]) < i, invalid_argument,
                  who, ": node ", i, " has parent ", parents[i],
                  "; every parent must be an earlier node (topological order)");
  }
  if (q == nullptr) {
    // Siblings must be distinct: check before touching the tree. A sibling of node i lies between
    // its parent and i, so a chain costs O(n) and a node with c children O(c^2).
    for (std::size_t i = 1; i < n; ++i)
      for (std::size_t j = static_cast<std::size_t>(parents[i]) + 1; j < i; ++j)
        SPECDEC_CHECK(parents[j] != parents[i] || tokens[j] != tokens[i], invalid_argument, who,
                      ": nodes ", j, " and ", i, " are siblings (parent ", parents[i],
                      ") with the same token ", tokens[i],
                      "; a tree without q rows needs distinct siblings");
  }
  if (tree.capacity() < n) tree.reserve(n);
  std::size_t const want_vocab = q == nullptr ? 0 : vocab;
  if (tree.q_vocab() != want_vocab) tree.enable_q(want_vocab);
  tree.reset(tokens[0]);
  for (std::size_t i = 1; i < n; ++i) tree.add_node(parents[i], tokens[i]);
  if (q != nullptr)
    for (std::size_t i = 0; i < n; ++i) {
      std::span<float> row = tree.q_row(static_cast<node_index>(i));
      std::copy_n(q + i * vocab, vocab, row.begin());
    }
}

//! A new tree from raw arrays (see `assign_draft_tree`), with capacity exactly `n`.
[[nodiscard]] inline draft_tree make_draft_tree(token_id const* tokens, node_index const* parents,
                                                std::size_t n, float const* q = nullptr,
                                                std::size_t vocab = 0) {
  draft_tree tree(std::clamp<std::size_t>(n, 1, max_tree_nodes));
  assign_draft_tree(tree, tokens, parents, n, q, vocab);
  return tree;
}

//! A chain tree: `root`, then the `k` tokens at `drafts` (null allowed when k = 0), refilled into
//! `tree` (grown if needed). Same checks and guarantees as `assign_draft_tree` (no q rows).
inline void assign_chain(draft_tree& tree, token_id root, token_id const* drafts, std::size_t k,
                         std::size_t vocab = 0) {
  constexpr char const* who = "assign_chain";
  SPECDEC_CHECK(drafts != nullptr || k == 0, invalid_argument, who, ": drafts is null but k is ",
                k);
  SPECDEC_CHECK(k < max_tree_nodes, context_overflow, who, ": ", k + 1,
                " nodes exceed the limit of ", max_tree_nodes);
  SPECDEC_CHECK(root >= 0 && (vocab == 0 || static_cast<std::size_t>(root) < vocab), out_of_range,
                who, ": root token ", root, " is outside the vocabulary");
  for (std::size_t i = 0; i < k; ++i)
    SPECDEC_CHECK(drafts[i] >= 0 && (vocab == 0 || static_cast<std::size_t>(drafts[i]) < vocab),
                  out_of_range, who, ": draft ", i, " has token ", drafts[i],
                  vocab == 0 ? " (negative)" : ", outside the vocabulary");
  if (tree.capacity() < k + 1) tree.reserve(k + 1);
  if (tree.has_q()) tree.enable_q(0);
  tree.reset(root);
  for (std::size_t i = 0; i < k; ++i) (void)tree.add_node(static_cast<node_index>(i), drafts[i]);
}

//! Copies the accepted tokens of `result` followed by the bonus token into `tokens` (room for
//! `capacity` entries) and, when `nodes` is non-null, the accepted node indices into `nodes` (room
//! for `capacity` entries too). Returns the number of tokens written, num_accepted() + 1. Throws
//! `errc::invalid_argument` when they do not fit or a pointer is null, writing nothing.
inline std::size_t copy_accepted(verify_result const& result, token_id* tokens,
                                 std::size_t capacity, node_index* nodes = nullptr) {
  std::size_t const count = result.tokens.size();
  SPECDEC_CHECK(count == result.accepted_nodes.size() + 1, invalid_argument,
                "copy_accepted: the result holds ", count, " tokens for ",
                result.accepted_nodes.size(), " accepted nodes (not a verifier's output)");
  SPECDEC_CHECK(count <= capacity, invalid_argument, "copy_accepted: ", count,
                " tokens do not fit in ", capacity, " entries");
  SPECDEC_CHECK(tokens != nullptr, invalid_argument, "copy_accepted: tokens is null");
  std::copy(result.tokens.begin(), result.tokens.end(), tokens);
  if (nodes != nullptr)
    std::copy(result.accepted_nodes.begin(), result.accepted_nodes.end(), nodes);
  return count;
}

}  // namespace specdec::interop
