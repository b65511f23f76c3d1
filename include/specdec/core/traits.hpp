#pragma once
//! \file
//! The compile-time capabilities of proposers, models, sampling policies and verifiers, read from
//! optional
//! `static constexpr bool` members of the same names, and the pairing rule between the two
//! (`compatible_v`) that the decoder checks with `static_assert`.
//!
//! A proposer may declare (an absent member means false):
//! - `produces_trees`: it may emit trees with more than one child per node;
//! - `samples_drafts`: it samples its drafts and records their q rows (`draft_tree::enable_q`);
//! - `needs_target_hidden`: it reads the target's hidden states (`propose_context::target_hidden`):
//!   the final hidden state, or, when it has a member `target_hidden_layers() const` returning a
//!   non-empty span of layer indices, the residual streams after those layers (EAGLE-3);
//! - `has_auxiliary_tokens`: it scores auxiliary tokens beside its tree (`auxiliary_proposer`);
//! - `uses_target`: it drafts with the target itself, through `propose_context::target`
//!   (core/target_handle.hpp); its request's prompt is then in the target's cache before its first
//!   draft;
//! - `skips_target_layers`: its forwards on the target skip layers (`skip_layers`): the target
//!   must declare `supports_skip_layers`;
//! - `views_target_kv`: its forwards on the target attend to a bounded view of the target's
//!   cache (`forward_request::view`): the target must declare `supports_kv_view`.
//!
//! A model may declare (an absent member means false):
//! - `supports_skip_layers`: its forward honours `forward_request::skip_layers`;
//! - `supports_kv_view`: its forward honours `forward_request::view` (`kv_view`); a model that
//!   does not declare it must refuse a request with a view.
//!
//! A sampling policy may declare (an absent member means false):
//! - `device_supported`: the CUDA backend verifies under it (`cuda::step_verifier`): it is
//!   `greedy`, or its `params()` returns the `sampling_params` the device kernels implement, as
//!   `sampler`'s. The device refuses, at compile time, a policy that does not declare it (a
//!   policy of its own, a constraint), so none is silently replaced by its parameters.
//!
//! A verifier may declare (an absent member means the permissive default):
//! - `greedy_only` (default false): it implements greedy verification only;
//! - `supports_trees` (default true): false when it walks chains only;
//! - `needs_draft_probs` (default false): it needs the draft's q rows;
//! - `lossless` (default true): false when it does not preserve the target distribution
//!   (typical acceptance).
//!
//! A type can also specialise `proposer_traits` / `verifier_traits` instead of declaring the
//! members (e.g. to describe a type it cannot change). The `_v` variables read the traits.

#include <concepts>
#include <cstdint>
#include <span>

namespace specdec {

// Whether `T::member` exists and is true / exists and is false (undefined below).
#define SPECDEC_TRAIT_TRUE(T, member)      \
  requires {                               \
    requires static_cast<bool>(T::member); \
  }
#define SPECDEC_TRAIT_FALSE(T, member)      \
  requires {                                \
    requires !static_cast<bool>(T::member); \
  }

//! What a proposer does, from its optional members (see the file comment).
template <class P>
struct proposer_traits {
  //! May emit trees with more than one child per node.
  static constexpr bool produces_trees = SPECDEC_TRAIT_TRUE(P, produces_trees);
  //! Samples its drafts and records their q rows.
  static constexpr bool samples_drafts = SPECDEC_TRAIT_TRUE(P, samples_drafts);
  //! Reads the target's hidden states.
  static constexpr bool needs_target_hidden = SPECDEC_TRAIT_TRUE(P, needs_target_hidden);
  //! Scores auxiliary tokens beside its tree and observes the target's rows.
  static constexpr bool has_auxiliary_tokens = SPECDEC_TRAIT_TRUE(P, has_auxiliary_tokens);
  //! Drafts with the target itself (`propose_context::target`).
  static constexpr bool uses_target = SPECDEC_TRAIT_TRUE(P, uses_target);
  //! Its forwards on the target skip layers.
  static constexpr bool skips_target_layers = SPECDEC_TRAIT_TRUE(P, skips_target_layers);
  //! Its forwards on the target attend to a view of the target's cache.
  static constexpr bool views_target_kv = SPECDEC_TRAIT_TRUE(P, views_target_kv);
};

//! What a model's forward honours besides the core request, from its optional members (see the
//! file comment).
template <class M>
struct model_traits {
  //! Honours `forward_request::skip_layers`.
  static constexpr bool supports_skip_layers = SPECDEC_TRAIT_TRUE(M, supports_skip_layers);
  //! Honours `forward_request::view`.
  static constexpr bool supports_kv_view = SPECDEC_TRAIT_TRUE(M, supports_kv_view);
};

//! What a sampling policy allows besides the host verifiers, from its optional members (see the
//! file comment).
template <class P>
struct policy_traits {
  //! The CUDA backend's verifier honours it.
  static constexpr bool device_supported = SPECDEC_TRAIT_TRUE(P, device_supported);
};

//! What a verifier can verify, from its optional members (see the file comment).
template <class V>
struct verifier_traits {
  //! Greedy verification only (argmax matching).
  static constexpr bool greedy_only = SPECDEC_TRAIT_TRUE(V, greedy_only);
  //! Walks trees, not only chains.
  static constexpr bool supports_trees = !SPECDEC_TRAIT_FALSE(V, supports_trees);
  //! Needs the draft distributions (q rows) of the tree.
  static constexpr bool needs_draft_probs = SPECDEC_TRAIT_TRUE(V, needs_draft_probs);
  //! Preserves the target distribution.
  static constexpr bool lossless = !SPECDEC_TRAIT_FALSE(V, lossless);
};

#undef SPECDEC_TRAIT_TRUE
#undef SPECDEC_TRAIT_FALSE

//! `proposer_traits<P>::produces_trees`.
template <class P>
inline constexpr bool produces_trees_v = proposer_traits<P>::produces_trees;
//! `proposer_traits<P>::samples_drafts`.
template <class P>
inline constexpr bool samples_drafts_v = proposer_traits<P>::samples_drafts;
//! `proposer_traits<P>::needs_target_hidden`.
template <class P>
inline constexpr bool needs_target_hidden_v = proposer_traits<P>::needs_target_hidden;
//! `proposer_traits<P>::has_auxiliary_tokens`.
template <class P>
inline constexpr bool has_auxiliary_tokens_v = proposer_traits<P>::has_auxiliary_tokens;

//! `proposer_traits<P>::uses_target`.
template <class P>
inline constexpr bool uses_target_v = proposer_traits<P>::uses_target;
//! `proposer_traits<P>::skips_target_layers`.
template <class P>
inline constexpr bool skips_target_layers_v = proposer_traits<P>::skips_target_layers;
//! `proposer_traits<P>::views_target_kv`.
template <class P>
inline constexpr bool views_target_kv_v = proposer_traits<P>::views_target_kv;
//! `model_traits<M>::supports_skip_layers`.
template <class M>
inline constexpr bool supports_skip_layers_v = model_traits<M>::supports_skip_layers;
//! `model_traits<M>::supports_kv_view`.
template <class M>
inline constexpr bool supports_kv_view_v = model_traits<M>::supports_kv_view;

//! Whether target model M runs what proposer P asks of it through its handle: a proposer that
//! skips layers needs a model that declares `supports_skip_layers`, one that views the target's
//! cache a model that declares `supports_kv_view`.
template <class M, class P>
inline constexpr bool serves_proposer_v =
    !(skips_target_layers_v<P> && !supports_skip_layers_v<M>)&&!(views_target_kv_v<P> &&
                                                                 !supports_kv_view_v<M>);

//! `policy_traits<P>::device_supported`.
template <class P>
inline constexpr bool device_supported_v = policy_traits<P>::device_supported;

//! `verifier_traits<V>::greedy_only`.
template <class V>
inline constexpr bool greedy_only_v = verifier_traits<V>::greedy_only;
//! `verifier_traits<V>::supports_trees`.
template <class V>
inline constexpr bool supports_trees_v = verifier_traits<V>::supports_trees;
//! `verifier_traits<V>::needs_draft_probs`.
template <class V>
inline constexpr bool needs_draft_probs_v = verifier_traits<V>::needs_draft_probs;
//! `verifier_traits<V>::lossless`.
template <class V>
inline constexpr bool lossless_v = verifier_traits<V>::lossless;

//! The target layers whose residual streams `proposer` reads (its `target_hidden_layers()`, e.g.
//! EAGLE-3's), or none: the final hidden state (when it reads hidden states at all).
template <class Proposer>
[[nodiscard]] std::span<std::int32_t const> target_hidden_layers(Proposer const& proposer) {
  if constexpr (requires {
                  {
                    proposer.target_hidden_layers()
                    } -> std::convertible_to<std::span<std::int32_t const>>;
                })
    return proposer.target_hidden_layers();
  else
    return {};
}

//! Whether proposer P and verifier V can work together, as far as types can tell:
//! - a proposer that samples its drafts needs a verifier that weighs them by their q rows, not a
//!   greedy-only one (which would silently ignore the draft distributions);
//! - a verifier that needs q rows needs a proposer that samples and records them;
//! - a proposer that drafts trees needs a verifier that walks trees.
template <class P, class V>
inline constexpr bool compatible_v = !(samples_drafts_v<P> && greedy_only_v<V>)&&!(
    needs_draft_probs_v<V> && !samples_drafts_v<P>)&&!(produces_trees_v<P> && !supports_trees_v<V>);

}  // namespace specdec
