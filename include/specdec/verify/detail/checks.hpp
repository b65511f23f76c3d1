#pragma once
//! \file
//! The input checks every verifier makes: the tree and its rows, the tokens a policy returns, the
//! probabilities a walk reads, q rows, and the result's reserved room. Internals, not API.

#include <cmath>
#include <cstddef>
#include <span>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/detail/rows.hpp"

namespace specdec::detail {

//! Checks what every verifier needs up front: a non-empty tree, `rows` == tree.size(), vocab >= 1,
//! every token id < vocab and, with q rows, their vocabulary. O(nodes): the rows themselves are
//! checked where they are read (`draft_tree::validate` would read every q row, O(nodes x vocab)).
inline void check_inputs(char const* who, draft_tree const& tree, std::size_t rows,
                         std::size_t vocab) {
  SPECDEC_CHECK(!tree.empty(), invalid_argument, who, ": the draft tree is empty (no root)");
  SPECDEC_CHECK(vocab >= 1, invalid_argument, who, ": target rows have 0 columns (vocabulary 0)");
  SPECDEC_CHECK(rows == tree.size(), invalid_argument, who, ": ", rows,
                " target rows for a draft tree of ", tree.size(), " nodes (one row per node)");
  for (std::size_t i = 0; i < tree.size(); ++i) {
    token_id const t = tree.token(static_cast<node_index>(i));
    SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < vocab, out_of_range, who, ": node ", i,
                  " has token ", t, ", outside the vocabulary of ", vocab);
  }
  SPECDEC_CHECK(!tree.has_q() || tree.q_vocab() == vocab, invalid_argument, who, ": q rows have ",
                tree.q_vocab(), " entries but target rows have ", vocab);
}

//! Checks that `history` (the committed tokens) ends with the tree's root, the token whose
//! row the root's children were scored from; an empty history (a policy that reads none) passes.
inline void check_history(char const* who, draft_tree const& tree, token_history history) {
  std::span<token_id const> const h = history.tokens();
  SPECDEC_CHECK(h.empty() || h.back() == tree.root(), invalid_argument, who,
                ": the history ends with token ", h.empty() ? no_token : h.back(),
                ", not with the tree's root ", tree.root(),
                " (the history is every committed token, the root last)");
}

//! Checks a token a policy returned.
inline void check_policy_token(token_id t, std::size_t vocab, char const* who, node_index node) {
  SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < vocab, out_of_range, who,
                ": the policy returned token ", t, " at node ", node,
                ", outside the vocabulary of ", vocab);
}

//! Throws `errc::numerical` unless `v` is a finite probability (>= 0).
inline void check_probability(float v, char const* who, char const* what, node_index node,
                              token_id token) {
  SPECDEC_CHECK(std::isfinite(v) && v >= 0.0f, numerical, who, ": ", what, " at node ", node,
                " for token ", token, " is ", v, ", not a finite probability");
}

//! Checks a q row the way `draft_tree::validate` does (every entry finite and >= 0, the sum within
//! 1e-3 of 1), in one vectorised pass (`detail::sum_checked`). Throws `errc::numerical` naming
//! the node.
inline void check_q_row(std::span<float const> q, char const* who, node_index node) {
  bool bad = false;
  double const sum = sum_checked(q.data(), q.size(), bad);
  SPECDEC_CHECK(!bad && std::isfinite(sum), numerical, who, ": q row ", node,
                " has NaN/Inf or negative entries");
  SPECDEC_CHECK(std::abs(sum - 1.0) < 1e-3, numerical, who, ": q row ", node, " sums to ", sum,
                ", not 1");
}

//! Empties `out` and reserves room for the longest path of `tree` (its accepted nodes, and their
//! tokens plus the bonus), so that a verifier's walk does not allocate once warm.
inline void prepare_result(draft_tree const& tree, verify_result& out) {
  out.clear();
  auto const depth = static_cast<std::size_t>(tree.max_depth());
  out.accepted_nodes.reserve(depth);
  out.tokens.reserve(depth + 1);
}

}  // namespace specdec::detail
