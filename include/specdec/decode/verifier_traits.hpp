#pragma once
//! \file
//! Compile-time facts about verifiers, and the pairing rules between a proposer and a verifier that
//! the decoder checks with `static_assert` where they are decidable at compile time.
//!
//! A verifier declares what it can handle through optional `static constexpr bool` members (the
//! verifiers of verify/ declare all of them); an absent member means the permissive default:
//! - `greedy_only` (default false): it implements greedy verification only;
//! - `supports_trees` (default true): false when it walks chains only;
//! - `needs_draft_probs` (default false): it needs the draft's q rows (`draft_tree::enable_q`);
//! - `lossless` (default true): false when it does not preserve the target distribution
//!   (typical acceptance).
//! A type can also specialise `verifier_traits` instead of declaring the members.

#include "specdec/core/concepts.hpp"

namespace specdec {

//! What a verifier can verify. Reads the optional static members listed in the file comment.
template <class V>
struct verifier_traits {
  //! Only greedy verification (argmax matching).
  static constexpr bool greedy_only = requires { requires static_cast<bool>(V::greedy_only); };
  //! Only chains.
  static constexpr bool chains_only = requires { requires !static_cast<bool>(V::supports_trees); };
  //! Needs the draft distributions (q rows) of the tree.
  static constexpr bool requires_draft_probabilities = requires {
    requires static_cast<bool>(V::needs_draft_probs);
  };
  //! Does not preserve the target distribution.
  static constexpr bool lossy = requires { requires !static_cast<bool>(V::lossless); };
};

//! Whether proposer P and verifier V can work together, as far as types can tell:
//! - a proposer that samples its drafts needs a verifier that weighs them by their q rows, not a
//!   greedy-only one (which would silently ignore the draft distributions);
//! - a verifier that needs q rows needs a proposer that samples and records them;
//! - a proposer that drafts trees needs a verifier that walks trees.
template <class P, class V>
inline constexpr bool compatible_v = [] {
  using traits = verifier_traits<V>;
  if (samples_drafts_v<P> && traits::greedy_only) return false;
  if (traits::requires_draft_probabilities && !samples_drafts_v<P>) return false;
  if (produces_trees_v<P> && traits::chains_only) return false;
  return true;
}();

}  // namespace specdec
