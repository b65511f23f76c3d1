#pragma once
//! \file
//! Compile-time facts about verifiers, and the pairing rules between a proposer and a verifier that
//! the decoder checks with `static_assert` where they are decidable at compile time.
//!
//! A verifier declares what it can handle through optional `static constexpr bool` members; absent
//! members mean the permissive default:
//! - `greedy_only`: it implements greedy verification only (accepts the target's argmax);
//! - `chains_only`: it walks chains only, not trees with several children per node;
//! - `requires_draft_probabilities`: it needs the draft's q rows (`draft_tree::enable_q`);
//! - `lossy`: it does not preserve the target distribution (typical acceptance).
//! A type can also specialise `verifier_traits` instead of declaring the members.

#include "specdec/core/concepts.hpp"

namespace specdec {

//! What a verifier can verify. Reads the optional static members listed in the file comment.
template <class V>
struct verifier_traits {
  //! Only greedy verification (argmax matching).
  static constexpr bool greedy_only = requires { requires static_cast<bool>(V::greedy_only); };
  //! Only chains.
  static constexpr bool chains_only = requires { requires static_cast<bool>(V::chains_only); };
  //! Needs the draft distributions (q rows) of the tree.
  static constexpr bool requires_draft_probabilities = requires {
    requires static_cast<bool>(V::requires_draft_probabilities);
  };
  //! Does not preserve the target distribution.
  static constexpr bool lossy = requires { requires static_cast<bool>(V::lossy); };
};

//! Whether proposer P and verifier V can work together, as far as types can tell:
//! - a proposer that samples its drafts needs a verifier that weighs them by their q rows, not a
//!   greedy-only one (which would silently ignore the draft distributions);
//! - a verifier that needs q rows needs a proposer that samples and records them;
//! - a proposer that drafts trees needs a verifier that walks trees.
template <class P, class V>
inline constexpr bool compatible_v =
    !(samples_drafts_v<P> && verifier_traits<V>::greedy_only) &&
    !(verifier_traits<V>::requires_draft_probabilities &&
      !samples_drafts_v<P>)&&!(produces_trees_v<P> && verifier_traits<V>::chains_only);

}  // namespace specdec
