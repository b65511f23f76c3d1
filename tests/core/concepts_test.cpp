// Positive and negative static_assert tests of every concept: a minimal model of each concept
// must satisfy it, and dropping or breaking any one requirement must make it fail.
#include "specdec/core/concepts.hpp"

#include "support/doctest.hpp"

#include <vector>

#include "specdec/backend/cpu/block_drafter.hpp"
#include "specdec/backend/cpu/eagle.hpp"
#include "specdec/backend/cpu/heads.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/decode/speculation.hpp"
#include "specdec/propose/block.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/propose/hydra.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/medusa.hpp"
#include "specdec/sampling/policy.hpp"

namespace sd = specdec;

namespace {

// ---- sampling_policy
struct good_policy {
  void distribution(std::span<float const>, std::span<sd::token_id const>, std::span<float>) const {
  }
  sd::token_id sample(std::span<float const>, sd::philox&) const { return 0; }
  bool is_greedy() const { return true; }
  sd::token_id greedy_token(std::span<float const>, std::span<sd::token_id const>) const {
    return 0;
  }
};
struct policy_no_distribution {
  sd::token_id sample(std::span<float const>, sd::philox&) const { return 0; }
  bool is_greedy() const { return true; }
  sd::token_id greedy_token(std::span<float const>, std::span<sd::token_id const>) const {
    return 0;
  }
};
struct policy_sample_returns_float {
  void distribution(std::span<float const>, std::span<sd::token_id const>, std::span<float>) const {
  }
  float sample(std::span<float const>, sd::philox&) const { return 0; }
  bool is_greedy() const { return true; }
  sd::token_id greedy_token(std::span<float const>, std::span<sd::token_id const>) const {
    return 0;
  }
};
struct policy_mutating_distribution {  // distribution() not const: unusable through const&
  void distribution(std::span<float const>, std::span<sd::token_id const>, std::span<float>) {}
  sd::token_id sample(std::span<float const>, sd::philox&) const { return 0; }
  bool is_greedy() const { return true; }
  sd::token_id greedy_token(std::span<float const>, std::span<sd::token_id const>) const {
    return 0;
  }
};
struct policy_no_greedy_token {
  void distribution(std::span<float const>, std::span<sd::token_id const>, std::span<float>) const {
  }
  sd::token_id sample(std::span<float const>, sd::philox&) const { return 0; }
  bool is_greedy() const { return true; }
};
static_assert(sd::sampling_policy<good_policy>);
static_assert(!sd::sampling_policy<policy_no_distribution>);
static_assert(!sd::sampling_policy<policy_sample_returns_float>);
static_assert(!sd::sampling_policy<policy_mutating_distribution>);
static_assert(!sd::sampling_policy<policy_no_greedy_token>);
static_assert(!sd::sampling_policy<int>);

// ---- incremental_policy
struct good_incremental : good_policy {
  using good_policy::distribution;
  using good_policy::greedy_token;
  using state_type = int;
  int begin(sd::token_history) const { return 0; }
  void advance(int&, sd::token_id) const {}
  void distribution(std::span<float const>, int const&, std::span<float>) const {}
  sd::token_id greedy_token(std::span<float const>, int const&) const { return 0; }
};
struct incremental_no_advance : good_policy {  // a state that cannot move forward
  using good_policy::distribution;
  using good_policy::greedy_token;
  using state_type = int;
  int begin(sd::token_history) const { return 0; }
  void distribution(std::span<float const>, int const&, std::span<float>) const {}
  sd::token_id greedy_token(std::span<float const>, int const&) const { return 0; }
};
struct incremental_no_state_rows : good_policy {  // has a state but scores only histories
  using state_type = int;
  int begin(sd::token_history) const { return 0; }
  void advance(int&, sd::token_id) const {}
};
static_assert(sd::incremental_policy<good_incremental>);
static_assert(!sd::incremental_policy<good_policy>);
static_assert(!sd::incremental_policy<incremental_no_advance>);
static_assert(!sd::incremental_policy<incremental_no_state_rows>);
static_assert(!sd::incremental_policy<sd::sampler>);

// ---- device support (core/traits.hpp): opt-in
static_assert(sd::device_supported_v<sd::sampler> && sd::device_supported_v<sd::greedy>);
static_assert(!sd::device_supported_v<good_policy> && !sd::device_supported_v<good_incremental>);

// ---- verifier
struct good_verifier {
  template <class Policy>
  void verify(sd::draft_tree const&, sd::matrix_view<float const>, Policy const&,
              std::span<sd::token_id const>, sd::philox&, sd::verify_result&) {}
};
struct verifier_wrong_args {
  void verify(sd::draft_tree const&, sd::verify_result&) {}
};
struct verifier_no_rng {
  template <class Policy>
  void verify(sd::draft_tree const&, sd::matrix_view<float const>, Policy const&,
              std::span<sd::token_id const>, sd::verify_result&) {}
};
static_assert(sd::verifier<good_verifier, good_policy>);
static_assert(!sd::verifier<good_verifier, policy_no_distribution>);  // policy must be one
static_assert(!sd::verifier<verifier_wrong_args, good_policy>);
static_assert(!sd::verifier<verifier_no_rng, good_policy>);

// ---- proposer and its traits
struct good_proposer {
  void begin(std::span<sd::token_id const>) {}
  void propose(sd::propose_context const& ctx, sd::draft_tree& t) { t.reset(ctx.tokens.back()); }
  void accept(sd::verify_result const&) {}
};
struct tree_sampling_proposer : good_proposer {
  static constexpr bool produces_trees = true;
  static constexpr bool samples_drafts = true;
  static constexpr bool needs_target_hidden = false;
};
struct proposer_no_accept {
  void begin(std::span<sd::token_id const>) {}
  void propose(sd::propose_context const&, sd::draft_tree&) {}
};
struct proposer_no_begin {
  void propose(sd::propose_context const&, sd::draft_tree&) {}
  void accept(sd::verify_result const&) {}
};
static_assert(sd::proposer<good_proposer>);
static_assert(sd::proposer<tree_sampling_proposer>);
static_assert(!sd::proposer<proposer_no_accept>);
static_assert(!sd::proposer<proposer_no_begin>);
static_assert(!sd::produces_trees_v<good_proposer>);
static_assert(!sd::samples_drafts_v<good_proposer>);
static_assert(sd::produces_trees_v<tree_sampling_proposer>);
static_assert(sd::samples_drafts_v<tree_sampling_proposer>);
static_assert(!sd::needs_target_hidden_v<tree_sampling_proposer>);

// ---- kv_cache
struct good_cache {
  std::size_t n = 0;
  std::size_t size() const { return n; }
  std::size_t capacity() const { return 16; }
  void truncate(std::size_t m) { n = m; }
  void keep_path(std::size_t m, std::span<std::int32_t const> keep) { n = m + keep.size(); }
};
struct cache_no_keep_path {
  std::size_t size() const { return 0; }
  std::size_t capacity() const { return 16; }
  void truncate(std::size_t) {}
};
struct cache_no_capacity {
  std::size_t size() const { return 0; }
  void truncate(std::size_t) {}
  void keep_path(std::size_t, std::span<std::int32_t const>) {}
};
static_assert(sd::kv_cache<good_cache>);
static_assert(!sd::kv_cache<cache_no_keep_path>);
static_assert(!sd::kv_cache<cache_no_capacity>);

// ---- causal_lm
struct good_model {
  good_cache cache_;
  std::size_t vocab_size() const { return 4; }
  std::size_t max_context() const { return 16; }
  std::size_t hidden_size() const { return 2; }
  void forward(sd::forward_request const& req, sd::forward_result& out) {
    out.vocab = 4;
    out.logits_count = req.tokens.size();
    out.logits.assign(out.logits_count * 4, 0.0f);
    cache_.n += req.tokens.size();
  }
  good_cache& cache() { return cache_; }
};
struct model_bad_cache {
  cache_no_keep_path cache_;
  std::size_t vocab_size() const { return 4; }
  std::size_t max_context() const { return 16; }
  std::size_t hidden_size() const { return 2; }
  void forward(sd::forward_request const&, sd::forward_result&) {}
  cache_no_keep_path& cache() { return cache_; }
};
struct model_no_forward {
  good_cache cache_;
  std::size_t vocab_size() const { return 4; }
  std::size_t max_context() const { return 16; }
  std::size_t hidden_size() const { return 2; }
  good_cache& cache() { return cache_; }
};
static_assert(sd::causal_lm<good_model>);
static_assert(!sd::causal_lm<model_bad_cache>);
static_assert(!sd::causal_lm<model_no_forward>);

// ---- batch_proposer
struct good_batch_proposer {
  void begin(std::size_t, std::span<sd::token_id const>) {}
  void propose(std::span<sd::batch_propose_item>) {}
  void accept(std::size_t, sd::verify_result const&) {}
  void end(std::size_t) {}
};
struct batch_proposer_no_end {  // a finished request's state would never be freed
  void begin(std::size_t, std::span<sd::token_id const>) {}
  void propose(std::span<sd::batch_propose_item>) {}
  void accept(std::size_t, sd::verify_result const&) {}
};
static_assert(sd::batch_proposer<good_batch_proposer>);
static_assert(!sd::batch_proposer<batch_proposer_no_end>);
static_assert(!sd::batch_proposer<good_proposer>);  // single-sequence signatures

// ---- auxiliary_proposer
struct good_auxiliary : good_proposer {
  static constexpr bool has_auxiliary_tokens = true;
  void auxiliary(sd::propose_context const&, sd::draft_tree const&, sd::auxiliary_batch&) {}
  void observe(sd::matrix_view<float const>, sd::matrix_view<float const>,
               sd::verify_result const&) {}
};
struct auxiliary_undeclared : good_proposer {  // the members without the trait
  void auxiliary(sd::propose_context const&, sd::draft_tree const&, sd::auxiliary_batch&) {}
  void observe(sd::matrix_view<float const>, sd::matrix_view<float const>,
               sd::verify_result const&) {}
};
struct auxiliary_no_observe : good_proposer {
  static constexpr bool has_auxiliary_tokens = true;
  void auxiliary(sd::propose_context const&, sd::draft_tree const&, sd::auxiliary_batch&) {}
};
static_assert(sd::auxiliary_proposer<good_auxiliary>);
static_assert(!sd::auxiliary_proposer<auxiliary_undeclared>);
static_assert(!sd::auxiliary_proposer<auxiliary_no_observe>);

// ---- batched_lm
struct good_batched_model {
  good_cache caches[2];
  std::size_t vocab_size() const { return 4; }
  std::size_t max_context() const { return 16; }
  std::size_t hidden_size() const { return 2; }
  std::size_t max_slots() const { return 2; }
  std::size_t free_slots() const { return 2; }
  std::size_t acquire_slot() { return 0; }
  void release_slot(std::size_t) {}
  void forward(sd::batch_forward_request const&, sd::batch_forward_result&) {}
  good_cache& cache(std::size_t slot) { return caches[slot]; }
};
struct batched_model_no_release {  // slots could never be reused
  good_cache caches[2];
  std::size_t vocab_size() const { return 4; }
  std::size_t max_context() const { return 16; }
  std::size_t hidden_size() const { return 2; }
  std::size_t max_slots() const { return 2; }
  std::size_t free_slots() const { return 2; }
  std::size_t acquire_slot() { return 0; }
  void forward(sd::batch_forward_request const&, sd::batch_forward_result&) {}
  good_cache& cache(std::size_t slot) { return caches[slot]; }
};
static_assert(sd::batched_lm<good_batched_model>);
static_assert(!sd::batched_lm<batched_model_no_release>);
static_assert(!sd::batched_lm<good_model>);  // one sequence, no slots

// ---- speculation_policy
struct good_speculation {
  void choose(std::span<sd::speculation_request const>, std::span<std::size_t>) {}
  void observe(sd::step_cost const&) {}
};
struct speculation_no_observe {
  void choose(std::span<sd::speculation_request const>, std::span<std::size_t>) {}
};
static_assert(sd::speculation_policy<good_speculation>);
static_assert(sd::speculation_policy<sd::fixed_speculation>);
static_assert(!sd::speculation_policy<speculation_no_observe>);

// ---- medusa_heads_runner, hydra_heads_runner, eagle_head_runner, block_drafter_runner
struct good_medusa_runner {
  std::size_t num_heads() const { return 2; }
  std::size_t hidden_size() const { return 2; }
  std::size_t vocab_size() const { return 4; }
  void run(std::span<float const>, sd::matrix_view<float>) {}
};
struct medusa_runner_no_vocab {
  std::size_t num_heads() const { return 2; }
  std::size_t hidden_size() const { return 2; }
  void run(std::span<float const>, sd::matrix_view<float>) {}
};
struct good_hydra_runner {
  std::size_t num_heads() const { return 2; }
  std::size_t hidden_size() const { return 2; }
  std::size_t vocab_size() const { return 4; }
  void run(std::size_t, std::span<float const>, sd::matrix_view<sd::token_id const>,
           sd::matrix_view<float>) {}
};
static_assert(sd::medusa_heads_runner<good_medusa_runner>);
static_assert(!sd::medusa_heads_runner<medusa_runner_no_vocab>);
static_assert(!sd::medusa_heads_runner<good_hydra_runner>);  // a Hydra head reads the path too
static_assert(sd::hydra_heads_runner<good_hydra_runner>);
static_assert(!sd::hydra_heads_runner<good_medusa_runner>);
struct good_eagle_runner {
  good_cache cache_;
  std::size_t hidden_size() const { return 2; }
  std::size_t feature_width() const { return 2; }
  std::size_t vocab_size() const { return 4; }
  std::size_t draft_vocab_size() const { return 4; }
  std::span<sd::token_id const> draft_to_target() const { return {}; }
  std::span<std::int32_t const> target_layers() const { return {}; }
  std::size_t max_context() const { return 16; }
  void forward(sd::eagle_batch const&, sd::matrix_view<float>) {}
  void logits(sd::matrix_view<float const>, sd::matrix_view<float>) {}
  good_cache& cache() { return cache_; }
};
struct eagle_runner_bad_cache : good_eagle_runner {  // its cache cannot roll a tree back
  cache_no_keep_path other_;
  cache_no_keep_path& cache() { return other_; }
};
static_assert(sd::eagle_head_runner<good_eagle_runner>);
static_assert(!sd::eagle_head_runner<eagle_runner_bad_cache>);
static_assert(sd::eagle_head_runner<sd::cpu_eagle_head>);
static_assert(sd::medusa_heads_runner<sd::cpu_medusa_heads>);
static_assert(sd::hydra_heads_runner<sd::cpu_hydra_heads>);
struct good_block_runner {
  std::size_t hidden_size() const { return 2; }
  std::size_t feature_width() const { return 6; }
  std::size_t vocab_size() const { return 4; }
  std::size_t block_size() const { return 4; }
  bool dspark() const { return false; }
  std::span<std::int32_t const> target_layers() const { return {}; }
  std::size_t max_context() const { return 16; }
  std::size_t context() const { return 0; }
  void truncate(std::size_t) {}
  void extend(sd::matrix_view<float const>) {}
  void block(sd::token_id, sd::matrix_view<float>) {}
  void logits(sd::matrix_view<float const>, sd::matrix_view<float>) {}
  void add_markov(sd::token_id, std::span<float>) {}
  double confidence(std::span<float const>, sd::token_id, std::size_t) const { return 1.0; }
};
struct block_runner_no_context : good_block_runner {  // cannot cut its context back
  void truncate() {}
  void truncate(std::size_t) = delete;
};
static_assert(sd::block_drafter_runner<good_block_runner>);
static_assert(!sd::block_drafter_runner<block_runner_no_context>);
static_assert(!sd::block_drafter_runner<good_eagle_runner>);
static_assert(sd::block_drafter_runner<sd::cpu_block_drafter>);

// ---- model traits: what a target must declare for a proposer that drafts on it
static_assert(sd::supports_skip_layers_v<sd::cpu_llama>);
static_assert(!sd::supports_skip_layers_v<good_model>);
static_assert(sd::serves_proposer_v<sd::cpu_llama, sd::layer_skip_proposer<sd::greedy>>);
static_assert(!sd::serves_proposer_v<good_model, sd::layer_skip_proposer<sd::greedy>>);
static_assert(sd::serves_proposer_v<good_model, good_proposer>);
struct kv_viewing_proposer : good_proposer {  // drafts over a view of the target's cache
  static constexpr bool uses_target = true;
  static constexpr bool views_target_kv = true;
};
struct kv_viewing_model : good_model {
  static constexpr bool supports_kv_view = true;
};
static_assert(sd::supports_kv_view_v<sd::cpu_llama>);
static_assert(!sd::supports_kv_view_v<good_model>);
static_assert(sd::supports_kv_view_v<kv_viewing_model>);
static_assert(sd::serves_proposer_v<kv_viewing_model, kv_viewing_proposer>);
static_assert(sd::serves_proposer_v<sd::cpu_llama, kv_viewing_proposer>);
static_assert(!sd::serves_proposer_v<good_model, kv_viewing_proposer>);
static_assert(!sd::serves_proposer_v<kv_viewing_model, sd::layer_skip_proposer<sd::greedy>>);

}  // namespace

TEST_CASE("the minimal models of the concepts work as the concepts describe") {
  good_model m;
  std::vector<sd::token_id> tokens{1, 2, 3};
  std::vector<sd::position_t> positions{0, 1, 2};
  sd::forward_request req{.tokens = tokens, .positions = positions};
  req.validate(m.vocab_size(), m.max_context());
  sd::forward_result out;
  m.forward(req, out);
  CHECK(m.cache().size() == 3);
  CHECK(out.logits_view().rows() == 3);
  std::vector<std::int32_t> keep{0, 2};
  m.cache().keep_path(1, keep);
  CHECK(m.cache().size() == 3);
}

TEST_CASE("forward_request validation and visibility") {
  std::vector<sd::token_id> tokens{1, 2, 3};
  std::vector<sd::position_t> positions{0, 1, 2};
  sd::forward_request req{.tokens = tokens, .positions = positions};
  CHECK(req.visible(2, 1));
  CHECK(!req.visible(1, 2));
  CHECK_THROWS_AS(req.validate(3, 16), sd::error);       // token 3 >= vocab 3
  CHECK_THROWS_AS(req.validate(4, 2), sd::error);        // position 2 >= context 2
  std::vector<std::uint64_t> mask{0b001, 0b011, 0b101};  // node 2 sees 0 and itself, not 1
  req.mask = mask;
  req.mask_stride = 1;
  CHECK_NOTHROW(req.validate(4, 16));
  CHECK(req.visible(2, 0));
  CHECK(!req.visible(2, 1));
  req.mask_stride = 0;
  CHECK_THROWS_AS(req.validate(4, 16), sd::error);
  req.mask_stride = 1;
  std::vector<std::int32_t> rows{3};
  req.logits_rows = rows;
  CHECK_THROWS_AS(req.validate(4, 16), sd::error);
  req.logits_rows = {};
  std::vector<std::int32_t> skip{2, 1};
  req.skip_layers = skip;
  CHECK_THROWS_AS(req.validate(4, 16), sd::error);
  std::vector<sd::position_t> short_positions{0};
  sd::forward_request bad{.tokens = tokens, .positions = short_positions};
  CHECK_THROWS_AS(bad.validate(4, 16), sd::error);
}
