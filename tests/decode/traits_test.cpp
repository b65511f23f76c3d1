// Compile-time pairing rules between proposers and verifiers (the decoder static_asserts them) and
// the traits each proposer declares.
#include "support/doctest.hpp"

#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"
#include "support/toy_model.hpp"

namespace sd = specdec;

namespace {

using greedy_drafts = sd::draft_model_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::greedy>;
using sampled_drafts = sd::draft_model_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample>;
using skip_sampled = sd::layer_skip_proposer<sd::sampler, sd::draft_mode::sample>;
using lookup = sd::prompt_lookup_proposer;

// What the verifiers of verify/ declare, read under the members' own names.
static_assert(sd::verifier_traits<sd::greedy_verifier>::greedy_only);
static_assert(sd::greedy_only_v<sd::greedy_verifier>);
static_assert(sd::supports_trees_v<sd::greedy_verifier>);
static_assert(!sd::supports_trees_v<sd::speculative_sampling_verifier>);
static_assert(!sd::verifier_traits<sd::speculative_sampling_verifier>::supports_trees);
// Speculative sampling verifies point masses when a chain has no q rows, so it needs none.
static_assert(!sd::needs_draft_probs_v<sd::speculative_sampling_verifier>);
static_assert(!sd::needs_draft_probs_v<sd::tree_verifier>);
static_assert(sd::lossless_v<sd::tree_verifier>);
static_assert(!sd::lossless_v<sd::typical_acceptance_verifier>);

// A type declaring nothing gets the permissive defaults.
struct bare_verifier {};
static_assert(!sd::greedy_only_v<bare_verifier>);
static_assert(sd::supports_trees_v<bare_verifier>);
static_assert(!sd::needs_draft_probs_v<bare_verifier>);
static_assert(sd::lossless_v<bare_verifier>);

// Proposer traits, under the same scheme.
struct bare_proposer {};
static_assert(!sd::proposer_traits<bare_proposer>::produces_trees);
static_assert(!sd::samples_drafts_v<bare_proposer>);
static_assert(!sd::needs_target_hidden_v<bare_proposer>);
static_assert(!sd::has_auxiliary_tokens_v<bare_proposer>);
static_assert(sd::produces_trees_v<sd::prompt_lookup_proposer>);
static_assert(sd::samples_drafts_v<sampled_drafts>);
static_assert(!sd::samples_drafts_v<greedy_drafts>);

// A traits specialisation describes a type that cannot declare the members.
struct foreign_verifier {
  static constexpr bool supports_trees = true;
};
}  // namespace
template <>
struct specdec::verifier_traits<foreign_verifier> {
  static constexpr bool greedy_only = false;
  static constexpr bool supports_trees = false;
  static constexpr bool needs_draft_probs = false;
  static constexpr bool lossless = true;
};
namespace {
static_assert(!sd::supports_trees_v<foreign_verifier>);
static_assert(!sd::compatible_v<sd::prompt_lookup_proposer, foreign_verifier>);

// Pairings that work.
static_assert(sd::compatible_v<greedy_drafts, sd::greedy_verifier>);
static_assert(sd::compatible_v<greedy_drafts, sd::tree_verifier>);
static_assert(sd::compatible_v<sampled_drafts, sd::speculative_sampling_verifier>);
static_assert(sd::compatible_v<sampled_drafts, sd::tree_verifier>);
static_assert(sd::compatible_v<skip_sampled, sd::speculative_sampling_verifier>);
static_assert(sd::compatible_v<lookup, sd::greedy_verifier>);
static_assert(sd::compatible_v<lookup, sd::tree_verifier>);
static_assert(sd::compatible_v<greedy_drafts, sd::speculative_sampling_verifier>);
// Pairings the decoder rejects at compile time.
static_assert(!sd::compatible_v<sampled_drafts, sd::greedy_verifier>);  // q rows ignored
static_assert(!sd::compatible_v<skip_sampled, sd::greedy_verifier>);
static_assert(!sd::compatible_v<lookup, sd::speculative_sampling_verifier>);  // chains only
// A verifier that declares it needs q rows rejects deterministic candidates.
struct needs_q_verifier {
  static constexpr bool needs_draft_probs = true;
};
static_assert(!sd::compatible_v<greedy_drafts, needs_q_verifier>);
static_assert(sd::compatible_v<sampled_drafts, needs_q_verifier>);

// The decoders model what they claim.
static_assert(sd::causal_lm<sd::cpu_llama>);
static_assert(sd::proposer<greedy_drafts> && sd::proposer<sampled_drafts> &&
              sd::proposer<skip_sampled> && sd::proposer<lookup>);

// The decoder class itself is instantiable for every compatible pairing (a mismatched one would
// fail its static_assert, which cannot be tested without a failing build).
template <class P, class V>
concept decoder_type = requires {
  sizeof(sd::speculative_decoder<sd::cpu_llama, P, V, sd::sampler>);
};
static_assert(decoder_type<sampled_drafts, sd::speculative_sampling_verifier>);
static_assert(decoder_type<lookup, sd::tree_verifier>);
static_assert(decoder_type<greedy_drafts, sd::greedy_verifier>);

}  // namespace

TEST_CASE("typical acceptance runs through the decoder (lossy, opt-in)") {
  toy::toy_lm target(24, 200);
  toy::toy_lm draft(24, 200, 7, 6.0f, 0.5f);
  sd::sampling_params params;
  params.temperature = 1.0f;
  sd::draft_model_proposer p(draft, target, sd::sampler(params), {.k = 3});
  sd::decode_config c;
  c.max_new_tokens = 40;
  sd::speculative_decoder dec(target, p, sd::typical_acceptance_verifier{}, sd::sampler(params), c);
  std::vector<sd::token_id> const prompt{1, 2, 3};
  auto const r = dec.generate(prompt);
  CHECK(r.tokens.size() == 40);
  CHECK(r.stats.accepted > 0);
}
