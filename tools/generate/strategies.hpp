#pragma once
// specdec-generate's strategies, each declared once in `strategies`: its --strategy name, its
// one-line help, its own options (option.hpp), the checks between them, and how it builds its
// proposer and verifier and runs one request. The command-line parser, the --help text, the
// checks and the construction all read this table (options.hpp, specdec-generate.cpp).
//
// Adding a strategy: declare its options (an `option_spec` each), write a `run_<name>(session&)`
// function (declared here, defined in strategies.cpp) that reads them from `session::values`,
// builds the proposer and calls `run_candidates` or `run_speculative`, add one row to
// `strategies`, and serve it in batches in batch.cpp. An option of a strategy is refused with
// any other strategy; a flag may be declared by several strategies (each with its own default and
// domain) when it means the same thing for each.
//
// Node budgets are the proposers' own (`max_nodes()`): the decoder sizes each step's tree from
// the proposer, so the options say what to draft and nothing here computes a budget.
//
// Verification: temperature 0 is greedy, checked token by token by `greedy_verifier` (the output
// equals plain greedy decoding). Above 0 the sampler's distribution is verified losslessly: a
// sampled draft chain (draft model, layer skip) by `speculative_sampling_verifier` with the
// draft's q rows, deterministic candidates (prompt lookup, REST, lookahead, Medusa and Hydra heads,
// EAGLE; chains or trees) by `tree_verifier`, which treats each candidate as a point mass. Any
// speculative strategy may opt into typical acceptance instead (--verifier typical: lossy).
//
// Constrained output (--regex, --json-schema): every decoder samples under `cli_policy`, the
// sampler under the constraint (a null constraint: the sampler as it is), so verification stays
// exact with respect to the constrained distribution whatever the proposer drafts. The proposers
// that draft from tokens alone (draft model, prompt lookup, REST, suffix) are also wrapped in
// `constrained_proposer` (forced spans, pruned drafts: `run_speculative`); those that read the
// target's hidden rows, score auxiliary tokens or draft with the target run under the policy
// alone. Each strategy's decoder is compiled once, for both.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "generate/models.hpp"
#include "generate/option.hpp"
#include "specdec/backend/cpu/block_drafter.hpp"
#include "specdec/backend/cpu/eagle.hpp"
#include "specdec/backend/cpu/heads.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/traits.hpp"
#include "specdec/core/types.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/decode/speculation.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/block_drafter_file.hpp"
#include "specdec/model/eagle.hpp"
#include "specdec/model/eagle_file.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/mapped_file.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/block.hpp"
#include "specdec/propose/constrained.hpp"
#include "specdec/propose/cross_vocabulary.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/propose/hydra.hpp"
#include "specdec/propose/jacobi.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/lookahead.hpp"
#include "specdec/propose/medusa.hpp"
#include "specdec/propose/parallel_draft.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/propose/rest.hpp"
#include "specdec/propose/sparse_kv.hpp"
#include "specdec/propose/sparse_tree.hpp"
#include "specdec/propose/suffix.hpp"
#include "specdec/sampling/automaton_constraint.hpp"
#include "specdec/sampling/constraint.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#include "specdec/verify/typical_acceptance.hpp"

namespace generate {

namespace sd = specdec;

//! The sampling policy of every decoder: the sampler under the output constraint (--regex,
//! --json-schema), or the sampler alone when the constraint is null. The draft model, layer-skip
//! and sparse-KV proposers draft under it too (their drafts and q rows masked); the batched draft
//! model, one policy for every request, takes the plain sampler (`cli_policy::policy()`).
using cli_policy = sd::constrained<sd::sampler, sd::automaton_constraint>;

//! The output constraint of a run (--regex, --json-schema), or none.
struct output_constraint {
  std::shared_ptr<sd::automaton_constraint const> automaton;  //!< null: no constraint
  std::string kind;          //!< "regex" or "json_schema" (empty: none)
  std::string source;        //!< the pattern, or the schema file's path
  bool forced_spans = true;  //!< wrapped proposers draft forced spans (not --no-forced-spans)
  //! Whether a constraint applies.
  explicit operator bool() const noexcept { return automaton != nullptr; }
};

//! What `constrained_proposer` did to a run's drafts (a wrapped proposer under a constraint).
struct constrained_drafts {
  std::size_t forced_steps = 0;  //!< steps whose draft was a forced span
  std::size_t pruned_nodes = 0;  //!< draft nodes removed for leaving the constraint
};

//! What one request produced, and how it was run.
struct run_output {
  sd::decode_result result;  //!< tokens, finish reason and statistics
  std::string description;   //!< the strategy and its settings, e.g. "draft model, k = 4"
  std::string verifier;      //!< "greedy", "speculative sampling", "tree (point masses)" or "none"
  //! The constrained proposer's counts, when the proposer was wrapped under a constraint.
  std::optional<constrained_drafts> constrained = std::nullopt;
};

//! The draft-length policy --speculate chose, at run time: `adaptive_speculation` (its state
//! shared by the copies, so that the costs it measured and learnt serve every run of the session),
//! or `fixed_speculation` of k draft tokens (the whole budget by default, none for the
//! autoregressive baseline). One type for both, so that each strategy's decoder is compiled once
//! rather than once per policy.
class chosen_speculation {
 public:
  //! The fixed policy of `k` draft tokens per request and step (the default: the whole budget).
  explicit chosen_speculation(std::size_t k = std::numeric_limits<std::size_t>::max())
      : fixed_(k) {}
  //! The adaptive policy.
  explicit chosen_speculation(sd::adaptive_speculation adaptive)
      : adaptive_(std::make_shared<sd::adaptive_speculation>(std::move(adaptive))) {}

  //! Calibrates the adaptive policy's costs on `model`, once (nothing for the fixed one).
  template <class Model>
  requires sd::batched_lm<Model> || sd::causal_lm<Model>
  void prepare(Model& model) {
    if (adaptive_) adaptive_->prepare(model);
  }
  void choose(std::span<sd::speculation_request const> requests, std::span<std::size_t> draft) {
    if (adaptive_)
      adaptive_->choose(requests, draft);
    else
      fixed_.choose(requests, draft);
  }
  void observe(sd::step_cost const& cost) {
    if (adaptive_) adaptive_->observe(cost);
  }
  //! Whether this is the adaptive policy.
  [[nodiscard]] bool adaptive() const noexcept { return adaptive_ != nullptr; }

 private:
  sd::fixed_speculation fixed_;
  std::shared_ptr<sd::adaptive_speculation> adaptive_;
};
static_assert(sd::speculation_policy<chosen_speculation>);

//! What every strategy runs against: the parsed options, the loaded target, the prompt, the
//! decode configuration and sampling policy, the verifier asked for, what observes the run
//! (the streamed text, --stream-json, --logprobs, --report; empty for timed runs), and the device
//! its models run on (models.hpp; build them with `make_lm`).
struct session {
  option_values const& values;                       //!< every option given
  std::shared_ptr<sd::llama_weights const> weights;  //!< the target's weights
  lm& target;                                        //!< the target model
  sd::cpu_llama_options model_options;   //!< options of another model instance (draft, layer skip)
  std::span<sd::token_id const> prompt;  //!< BOS + the encoded prompt
  sd::decode_config config;              //!< stops, length, seed (no node cap)
  cli_policy policy;                     //!< the sampling policy of every row
  bool greedy = true;                    //!< temperature 0
  sd::request_observer observer;         //!< per committed token and per step, or empty
  //! --verifier typical: typical acceptance with these parameters instead of the lossless
  //! verifier the strategy and temperature call for.
  std::optional<sd::typical_acceptance_params> typical;
  sd::file_access access = sd::file_access::map;   //!< how every file is read (--no-mmap)
  device_kind device = device_kind::cpu;           //!< where the models run (--device)
  sd::weight_dtype dtype = sd::weight_dtype::f32;  //!< their matrices on a CUDA device (--dtype)
  chosen_speculation speculation = chosen_speculation();  //!< each step's draft length
  //! The output constraint (its automaton is the policy's); none by default.
  output_constraint constraint = {};
  //! The vocabulary: what tokenises forced spans (needed under a constraint).
  sd::tokenizer const* tok = nullptr;
};

//! A model over `weights` on `device`: a cpu_llama with `options`, or a cuda_llama with the
//! context of `options` and its matrices as `dtype`.
inline lm make_lm(device_kind device, sd::weight_dtype dtype,
                  std::shared_ptr<sd::llama_weights const> weights,
                  sd::cpu_llama_options const& options) {
  if (device == device_kind::cuda)
    return lm(make_cuda_backend(weights, dtype, options.max_context));
  return lm(std::make_unique<lm_model<sd::cpu_llama>>(std::move(weights), options));
}

//! A model over `weights` on the session's device (see above).
inline lm make_lm(session const& s, std::shared_ptr<sd::llama_weights const> weights,
                  sd::cpu_llama_options const& options) {
  return make_lm(s.device, s.dtype, std::move(weights), options);
}

//! Whether `constrained_proposer` may wrap a `Proposer`: it drafts from tokens alone (it reads no
//! hidden rows of the target, scores no auxiliary tokens and does not draft with the target).
template <class Proposer>
inline constexpr bool constrainable_v =
    !sd::needs_target_hidden_v<Proposer> && !sd::has_auxiliary_tokens_v<Proposer> &&
    !sd::uses_target_v<Proposer>;

//! The encoder of forced spans: `tok`'s encoding without BOS or a dummy prefix space (empty when
//! there is no tokenizer).
inline std::function<std::vector<sd::token_id>(std::string_view)> forced_span_encoder(
    sd::tokenizer const* tok) {
  if (tok == nullptr) return {};
  return [tok](std::string_view text) { return tok->encode(text, false, false); };
}

namespace detail {

//! Decodes one request of `s` with `proposer` (already wrapped or not) and `verifier`.
template <class Proposer, class Verifier>
run_output decode_one(session& s, Proposer& proposer, Verifier verifier, std::string description,
                      std::string verifier_name) {
  sd::speculative_decoder<lm, Proposer, Verifier, cli_policy, chosen_speculation> decoder(
      s.target, proposer, std::move(verifier), s.policy, s.config, s.speculation);
  if (s.speculation.adaptive()) description += "; draft length per step: adaptive";
  run_output out{{}, std::move(description), std::move(verifier_name)};
  decoder.generate(s.prompt, out.result, s.observer);
  return out;
}

}  // namespace detail

//! Runs one request with `proposer` and `verifier`; the decoder takes the node budget of each
//! step from the proposer (`max_nodes()`). With --verifier typical, the typical acceptance
//! verifier replaces `verifier`. A proposer that `constrainable_v` allows drafts through
//! `constrained_proposer` under the session's constraint (with none, it passes everything
//! through), the others as they are: either way the policy keeps the output exact.
template <class Proposer, class Verifier>
run_output run_speculative(session& s, Proposer& proposer, Verifier verifier,
                           std::string description, std::string verifier_name) {
  if constexpr (!std::is_same_v<Verifier, sd::typical_acceptance_verifier>) {
    if (s.typical)
      return run_speculative(s, proposer, sd::typical_acceptance_verifier(*s.typical),
                             std::move(description), "typical acceptance (lossy)");
  }
  if constexpr (constrainable_v<Proposer>) {
    sd::constrained_proposer<Proposer&, sd::automaton_constraint> wrapped(
        proposer, s.constraint.automaton, forced_span_encoder(s.tok),
        {.forced_spans = s.constraint.forced_spans});
    run_output out = detail::decode_one(s, wrapped, std::move(verifier), std::move(description),
                                        std::move(verifier_name));
    if (s.constraint)
      out.constrained = constrained_drafts{.forced_steps = wrapped.forced_steps(),
                                           .pruned_nodes = wrapped.pruned_nodes()};
    return out;
  } else {
    return detail::decode_one(s, proposer, std::move(verifier), std::move(description),
                              std::move(verifier_name));
  }
}

//! Runs one request with a proposer of deterministic candidates (chains or trees): greedy
//! verification at temperature 0, else the tree verifier (each candidate a point mass).
template <class Proposer>
run_output run_candidates(session& s, Proposer& proposer, std::string description) {
  if (s.greedy)
    return run_speculative(s, proposer, sd::greedy_verifier{}, std::move(description), "greedy");
  return run_speculative(s, proposer, sd::tree_verifier{}, std::move(description),
                         "tree (point masses)");
}

//! Calls `f(std::integral_constant<draft_mode, M>{})` with M = greedy at temperature 0, else
//! sample: model-based drafts are greedy candidates under greedy decoding and sampled chains with
//! q rows under sampling.
template <class F>
run_output with_draft_mode(session const& s, F&& f) {
  if (s.greedy) return f(std::integral_constant<sd::draft_mode, sd::draft_mode::greedy>{});
  return f(std::integral_constant<sd::draft_mode, sd::draft_mode::sample>{});
}

//! The verifier of a model-drafted chain in mode M.
template <sd::draft_mode M>
using chain_verifier = std::conditional_t<M == sd::draft_mode::greedy, sd::greedy_verifier,
                                          sd::speculative_sampling_verifier>;

//! The name of chain_verifier<M>.
template <sd::draft_mode M>
constexpr char const* chain_verifier_name =
    M == sd::draft_mode::greedy ? "greedy" : "speculative sampling";

// ---------------------------------------------------------------------------------------------
// The strategies' options.

//! Options of the strategies (see `strategies` for which strategy declares which).
namespace opt {

//! Every strategy: how every file used while generating is read (listed with the general
//! options, options.hpp).
inline constexpr option_spec no_mmap{
    .flag = "--no-mmap",
    .help =
        "read the model, head and datastore files into memory instead of mapping them (a mapped "
        "file must not change while in use: truncating it kills the process with SIGBUS)"};

//! draft: the draft model.
inline constexpr option_spec draft_model{
    .flag = "--draft",
    .value_name = "PATH",
    .kind = value_kind::file,
    .help =
        "the draft model (llama2.c or GGUF; of another vocabulary with --draft-tokenizer, or a "
        "GGUF's own, or the target's padded to another size)",
    .required = true};
//! draft: the draft model's own vocabulary (a draft of another vocabulary).
inline constexpr option_spec draft_tokenizer{
    .flag = "--draft-tokenizer",
    .value_name = "PATH",
    .kind = value_kind::file,
    .help =
        "the draft model's own vocabulary (llama2.c tokenizer.bin): it drafts through the tokens "
        "it shares with the target's or through text (--vocab-mode)",
    .default_text = "a GGUF draft's own; else the target's, padded or cut to the draft's size"};
//! draft: how a draft of another vocabulary proposes.
inline constexpr option_spec vocab_mode{
    .flag = "--vocab-mode",
    .value_name = "NAME",
    .kind = value_kind::text,
    .help =
        "how a draft of another vocabulary proposes: 'intersection' (drafts among the tokens "
        "the vocabularies share, with q rows when sampling) or 'string' (its text re-tokenised "
        "by the target's tokenizer, verified as candidates)",
    .default_text = "intersection"};
//! draft: the draft model's threads.
inline constexpr option_spec draft_threads{.flag = "--draft-threads",
                                           .value_name = "N",
                                           .kind = value_kind::count,
                                           .help = "CPU threads of the draft model's forwards",
                                           .default_text = "--threads",
                                           .count_lo = 1,
                                           .count_hi = 1024};
//! draft: the draft model's context.
inline constexpr option_spec draft_context{
    .flag = "--draft-context",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "positions of the draft model's cache (past them it drafts nothing)",
    .default_text = "the target's context",
    .count_lo = 1,
    .count_hi = std::uint64_t{1} << 24};
//! draft: the chain's length (default: the library's, `draft_model_config`).
inline constexpr option_spec chain_length{.flag = "-k",
                                          .value_name = "N",
                                          .kind = value_kind::count,
                                          .help = "tokens drafted per step, as one chain",
                                          .count_lo = 1,
                                          .count_hi = 4095,
                                          .count_default = sd::draft_model_config{}.k};
//! draft: adaptive chain length (the library's default is a fixed one).
inline constexpr option_spec adaptive{
    .flag = "--adaptive",
    .help =
        "adapt k to acceptance (grow after a fully accepted step, shrink after a rejection), "
        "within [1, --k-max]"};
//! draft: the largest adaptive chain length.
inline constexpr option_spec k_max{.flag = "--k-max",
                                   .value_name = "N",
                                   .kind = value_kind::count,
                                   .help = "largest adaptive k (needs --adaptive; at least k)",
                                   .default_text = "max(8, k)",
                                   .count_lo = 1,
                                   .count_hi = 4095,
                                   .count_default = sd::draft_model_config{}.k_max};
//! layer-skip, sparse-kv (self-speculation on the target): the chain's starting length (default:
//! the library's, `layer_skip_config`, which `sparse_kv_config` shares).
inline constexpr option_spec layer_skip_k{
    .flag = "-k",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "tokens drafted per step, as one chain (the starting length unless --fixed-k)",
    .count_lo = 1,
    .count_hi = 4095,
    .count_default = sd::layer_skip_config{}.draft.k};
//! layer-skip, sparse-kv: a fixed chain length (the library's default adapts it).
inline constexpr option_spec fixed_k{
    .flag = "--fixed-k",
    .help =
        "draft exactly k tokens per step (by default k adapts to acceptance within [1, "
        "--k-max])"};
//! layer-skip, sparse-kv: the largest adaptive chain length.
inline constexpr option_spec layer_skip_k_max{
    .flag = "--k-max",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "largest adaptive k (at least k; not with --fixed-k)",
    .default_text = "max(8, k)",
    .count_lo = 1,
    .count_hi = 4095,
    .count_default = sd::layer_skip_config{}.draft.k_max};
//! sparse-kv: which positions the draft's view holds.
inline constexpr option_spec kv_policy{
    .flag = "--kv-policy",
    .value_name = "NAME",
    .kind = value_kind::text,
    .help =
        "the draft's view: 'streaming' (sinks and the latest positions), 'snapkv' (positions "
        "chosen per layer and kv head by the prompt's last queries' attention, and a window) "
        "or 'retrieval' (chunks of 8 chosen per layer and kv head by the root's query against "
        "their mean keys, and a window)",
    .default_text = "streaming"};
//! sparse-kv: the attention sinks of the draft's view.
inline constexpr option_spec kv_sinks{
    .flag = "--sinks",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "leading cache positions always in the draft's view (attention sinks; streaming)",
    .count_lo = 0,
    .count_hi = std::uint64_t{1} << 24,
    .count_default = sd::sparse_kv_config{}.sinks};
//! sparse-kv: the positions of the draft's view in all.
inline constexpr option_spec kv_budget{
    .flag = "--kv-budget",
    .alias = "--budget",
    .value_name = "N",
    .kind = value_kind::count,
    .help =
        "cache positions in the draft's view in all: the sinks or the selection, and the most "
        "recent ones (> --sinks, > --kv-window)",
    .count_lo = 1,
    .count_hi = std::uint64_t{1} << 24,
    .count_default = sd::sparse_kv_config{}.budget};
//! sparse-kv: the window of a selecting view.
inline constexpr option_spec kv_window{
    .flag = "--kv-window",
    .value_name = "N",
    .kind = value_kind::count,
    .help =
        "the latest positions in the draft's view beside the selection (snapkv, retrieval; "
        "snapkv's observation window too)",
    .count_lo = 1,
    .count_hi = std::uint64_t{1} << 24,
    .count_default = sd::sparse_kv_config{}.window};
//! jacobi: the block's length (default: the library's, `jacobi_config`).
inline constexpr option_spec jacobi_block{.flag = "-k",
                                          .value_name = "N",
                                          .kind = value_kind::count,
                                          .help = "guesses refined per step (the block's length)",
                                          .count_lo = 1,
                                          .count_hi = 4095,
                                          .count_default = sd::jacobi_config{}.block};
//! draft, layer-skip: the confidence cutoff.
inline constexpr option_spec confidence{
    .flag = "--confidence",
    .value_name = "P",
    .kind = value_kind::real,
    .help = "stop drafting once the draft's top probability falls below P (0 = off)",
    .real_lo = 0.0f,
    .real_hi = 1.0f};
//! layer-skip: the skipped layers.
inline constexpr option_spec skip_layers{.flag = "--skip-layers",
                                         .value_name = "LIST",
                                         .kind = value_kind::layers,
                                         .help = "the layers the draft skips, e.g. 2 or 1,3",
                                         .default_text = "the middle layer, n_layers / 2"};
//! prompt-lookup: tokens per continuation.
inline constexpr option_spec lookup_depth{
    .flag = "--depth",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "most tokens drafted per continuation (the tree's depth)",
    .count_lo = 1,
    .count_hi = 4095,
    .count_default = sd::prompt_lookup_config{}.k};
//! prompt-lookup: continuations merged into a tree.
inline constexpr option_spec lookup_branches{
    .flag = "--branches",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "most distinct continuations merged into a tree (1 = a chain)",
    .count_lo = 1,
    .count_hi = 4095,
    .count_default = sd::prompt_lookup_config{}.max_branches};
//! prompt-lookup: the longest n-gram matched.
inline constexpr option_spec lookup_ngram{.flag = "--ngram",
                                          .value_name = "N",
                                          .kind = value_kind::count,
                                          .help = "longest n-gram matched",
                                          .count_lo = 1,
                                          .count_hi = 16,
                                          .count_default = sd::prompt_lookup_config{}.n_max};
//! prompt-lookup: the shortest n-gram matched.
inline constexpr option_spec lookup_ngram_min{.flag = "--ngram-min",
                                              .value_name = "N",
                                              .kind = value_kind::count,
                                              .help = "shortest n-gram matched (at most --ngram)",
                                              .count_lo = 1,
                                              .count_hi = 16,
                                              .count_default = sd::prompt_lookup_config{}.n_min};
//! rest: the datastore.
inline constexpr option_spec datastore{
    .flag = "--datastore",
    .value_name = "PATH",
    .kind = value_kind::file,
    .help = "the retrieval datastore (built by specdec-datastore)",
    .required = true};
//! rest: tokens per continuation.
inline constexpr option_spec rest_depth{
    .flag = "--depth",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "most tokens drafted per continuation (the tree's depth)",
    .count_lo = 1,
    .count_hi = 4095,
    .count_default = sd::rest_config{}.depth};
//! rest: nodes of the pruned trie.
inline constexpr option_spec rest_nodes{
    .flag = "--max-nodes",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "draft nodes kept per step, the most frequent prefixes",
    .count_lo = 1,
    .count_hi = 4095,
    .count_default = sd::rest_config{}.max_nodes};
//! rest: the longest context suffix looked up.
inline constexpr option_spec rest_ngram{.flag = "--ngram",
                                        .value_name = "N",
                                        .kind = value_kind::count,
                                        .help = "longest context suffix looked up",
                                        .count_lo = 1,
                                        .count_hi = 256,
                                        .count_default = sd::rest_config{}.n_max};
//! rest: the shortest context suffix accepted.
inline constexpr option_spec rest_ngram_min{
    .flag = "--ngram-min",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "shortest context suffix accepted as a match (at most --ngram)",
    .count_lo = 1,
    .count_hi = 256,
    .count_default = sd::rest_config{}.n_min};
//! suffix: the trees' depth.
inline constexpr option_spec suffix_depth{.flag = "--suffix-depth",
                                          .value_name = "N",
                                          .kind = value_kind::count,
                                          .help = "longest suffix the local and global trees keep",
                                          .count_lo = 1,
                                          .count_hi = sd::suffix_tree::max_depth,
                                          .count_default = sd::suffix_cache_config{}.depth};
//! suffix: the most tokens drafted.
inline constexpr option_spec suffix_tokens{
    .flag = "--suffix-tokens",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "most tokens drafted per step (nodes, with --suffix-tree)",
    .count_lo = 1,
    .count_hi = 4095,
    .count_default = sd::suffix_speculation{}.max_tokens};
//! suffix: tokens allowed per matched token.
inline constexpr option_spec suffix_factor{
    .flag = "--suffix-factor",
    .value_name = "F",
    .kind = value_kind::real,
    .help = "a match of m tokens allows floor(m F) tokens drafted",
    .real_lo = 0.0f,
    .real_hi = 4096.0f,
    .real_default = sd::suffix_speculation{}.factor};
//! suffix: the least probability drafted.
inline constexpr option_spec suffix_min_prob{
    .flag = "--suffix-min-prob",
    .value_name = "P",
    .kind = value_kind::real,
    .help = "continuations the trees' counts give a probability below P are not drafted",
    .real_lo = 0.0f,
    .real_hi = 1.0f,
    .real_default = sd::suffix_speculation{}.min_probability};
//! suffix: best-first trees instead of paths.
inline constexpr option_spec suffix_tree{
    .flag = "--suffix-tree",
    .help = "draft a best-first tree of the likeliest continuations instead of one path"};
//! suffix: the persistent global tree.
inline constexpr option_spec suffix_cache{
    .flag = "--suffix-cache",
    .value_name = "PATH",
    .kind = value_kind::text,
    .help = "the global tree's file: loaded first when it exists, written back at the end"};
//! suffix: the outputs the global tree keeps.
inline constexpr option_spec suffix_requests{
    .flag = "--suffix-requests",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "outputs the global tree keeps (oldest dropped first)",
    .count_lo = 1,
    .count_hi = std::uint64_t{1} << 32,
    .count_default = sd::suffix_cache_config{}.max_requests};
//! lookahead: the window's width.
inline constexpr option_spec lookahead_window{.flag = "--lookahead-window",
                                              .value_name = "W",
                                              .kind = value_kind::count,
                                              .help = "columns of the Jacobi window",
                                              .count_lo = 1,
                                              .count_hi = 256,
                                              .count_default = sd::lookahead_config{}.window};
//! lookahead: the n-gram size.
inline constexpr option_spec lookahead_ngram{.flag = "--lookahead-ngram",
                                             .value_name = "N",
                                             .kind = value_kind::count,
                                             .help = "n-gram size (the window has N - 1 levels)",
                                             .count_lo = 2,
                                             .count_hi = 16,
                                             .count_default = sd::lookahead_config{}.ngram};
//! lookahead: the candidates verified per step.
inline constexpr option_spec lookahead_guesses{.flag = "--lookahead-guesses",
                                               .value_name = "G",
                                               .kind = value_kind::count,
                                               .help = "candidate n-grams verified per step",
                                               .count_lo = 0,
                                               .count_hi = 256,
                                               .count_default = sd::lookahead_config{}.guesses};

//! medusa, hydra: the heads' directory.
inline constexpr option_spec heads{
    .flag = "--heads",
    .value_name = "DIR",
    .kind = value_kind::text,
    .help =
        "the heads: a directory with config.json and the heads' safetensors file "
        "(tools/heads/README.md)",
    .required = true,
    .non_empty = true};
//! medusa, hydra: the sparse tree, given.
inline constexpr option_spec tree{.flag = "--tree",
                                  .value_name = "FILE",
                                  .kind = value_kind::text,
                                  .help = "the sparse tree: a JSON array of rank paths (tree.json)",
                                  .default_text = "DIR/tree.json, else --tree-nodes",
                                  .non_empty = true};
//! medusa, hydra: the sparse tree, built.
inline constexpr option_spec tree_nodes{
    .flag = "--tree-nodes",
    .value_name = "N",
    .kind = value_kind::count,
    .help =
        "build a tree of N nodes from the heads' accuracies, measured on the target's own "
        "greedy text (without --tree)",
    .count_lo = 1,
    .count_hi = 4095,
    .count_default = 32};
//! medusa, hydra: where to write the tree.
inline constexpr option_spec write_tree{.flag = "--write-tree",
                                        .value_name = "FILE",
                                        .kind = value_kind::text,
                                        .help = "write the tree used to FILE (tree.json format)",
                                        .non_empty = true};

//! pard: the mask token of the parallel draft model.
inline constexpr option_spec mask_token{
    .flag = "--mask-token",
    .value_name = "ID",
    .kind = value_kind::count,
    .help =
        "the draft's mask token id (a token of the vocabulary the text never uses; "
        "tools/draft/pard/stories_pard.bin: 0, tok512's <unk>)",
    .count_hi = std::uint64_t{1} << 24,
    .required = true};

//! dflash, dspark: the drafter's directory.
inline constexpr option_spec block{
    .flag = "--block",
    .value_name = "DIR",
    .kind = value_kind::text,
    .help =
        "the block drafter: a directory with config.json and model.safetensors "
        "(tools/block/README.md)",
    .required = true,
    .non_empty = true};
//! dflash, dspark: drafts per step.
inline constexpr option_spec block_length{
    .flag = "--block-length",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "drafts per step, at most the drafter's block size - 1",
    .default_text = "the block size - 1",
    .count_lo = 1,
    .count_hi = 63};
//! dflash, dspark: DDTree's trees instead of chains.
inline constexpr option_spec block_tree{
    .flag = "--block-tree",
    .value_name = "N",
    .kind = value_kind::count,
    .help =
        "draft DDTree's tree of the N most probable paths through the block instead of a chain "
        "(verified greedily, or by the tree verifier under sampling)",
    .count_lo = 1,
    .count_hi = 4095};
//! dspark: the confidence cutoff.
inline constexpr option_spec block_confidence{
    .flag = "--block-confidence",
    .value_name = "P",
    .kind = value_kind::real,
    .help =
        "stop drafting before the first draft at which the product of the confidence head's "
        "estimates falls below P (0 = off)",
    .real_lo = 0.0f,
    .real_hi = 1.0f};

//! eagle: the head's directory.
inline constexpr option_spec eagle{
    .flag = "--eagle",
    .value_name = "DIR",
    .kind = value_kind::text,
    .help =
        "the EAGLE head: a directory with config.json and model.safetensors "
        "(tools/eagle/README.md); EAGLE-1 or EAGLE-3 from its config",
    .required = true,
    .non_empty = true};
//! eagle: the dynamic tree's depth.
inline constexpr option_spec eagle_depth{
    .flag = "--eagle-depth",
    .value_name = "D",
    .kind = value_kind::count,
    .help = "depth of the dynamic tree (EAGLE-2): D - 1 expansions of the head",
    .count_lo = 1,
    .count_hi = 64,
    .count_default = sd::eagle_tree_config{}.depth};
//! eagle: the dynamic tree's top-k.
inline constexpr option_spec eagle_topk{
    .flag = "--eagle-topk",
    .value_name = "K",
    .kind = value_kind::count,
    .help = "nodes expanded per depth and children per expanded node (the dynamic tree)",
    .count_lo = 1,
    .count_hi = 64,
    .count_default = sd::eagle_tree_config{}.top_k};
//! eagle: the dynamic tree's node count.
inline constexpr option_spec eagle_nodes{
    .flag = "--tree-nodes",
    .value_name = "N",
    .kind = value_kind::count,
    .help = "drafted nodes kept per step, the most confident (the dynamic tree)",
    .count_lo = 1,
    .count_hi = 4095,
    .count_default = sd::eagle_tree_config{}.nodes};
//! eagle: a static tree instead (EAGLE-1).
inline constexpr option_spec eagle_tree{
    .flag = "--tree",
    .value_name = "FILE",
    .kind = value_kind::text,
    .help = "draft a static tree instead (EAGLE-1): a JSON array of rank paths (tree.json)",
    .non_empty = true};

}  // namespace opt

// ---------------------------------------------------------------------------------------------
// Checks between a strategy's options (run before any file is loaded).

//! draft: --k-max needs --adaptive and is at least -k.
inline void check_chain(option_values const& v) {
  if (!v.given(opt::k_max)) return;
  if (!v.flag(opt::adaptive)) throw usage_error("--k-max needs --adaptive");
  if (v.count(opt::k_max) < v.count(opt::chain_length))
    throw usage_error("--k-max " + std::to_string(v.count(opt::k_max)) + " is below -k " +
                      std::to_string(v.count(opt::chain_length)));
}

//! layer-skip, sparse-kv: --k-max excludes --fixed-k and is at least -k.
inline void check_layer_skip_chain(option_values const& v) {
  if (!v.given(opt::layer_skip_k_max)) return;
  if (v.flag(opt::fixed_k)) throw usage_error("--k-max does not apply with --fixed-k");
  if (v.count(opt::layer_skip_k_max) < v.count(opt::layer_skip_k))
    throw usage_error("--k-max " + std::to_string(v.count(opt::layer_skip_k_max)) +
                      " is below -k " + std::to_string(v.count(opt::layer_skip_k)));
}

//! sparse-kv: the policy named by --kv-policy.
inline sd::kv_policy kv_policy_of(option_values const& v) {
  std::string const name = v.text(opt::kv_policy).value_or("streaming");
  if (name == "streaming") return sd::kv_policy::streaming;
  if (name == "snapkv") return sd::kv_policy::snapkv;
  if (name == "retrieval") return sd::kv_policy::retrieval;
  throw usage_error("--kv-policy '" + name + "' is none of streaming, snapkv, retrieval");
}

//! sparse-kv: the chain's options, a known policy with its own options only, and a budget above
//! the sinks or the window (holding a chunk of the selection for retrieval).
inline void check_sparse_kv(option_values const& v) {
  check_layer_skip_chain(v);
  sd::kv_policy const policy = kv_policy_of(v);
  std::string const budget = "--kv-budget " + std::to_string(v.count(opt::kv_budget));
  if (policy == sd::kv_policy::streaming) {
    if (v.given(opt::kv_window))
      throw usage_error("--kv-window needs --kv-policy snapkv or retrieval");
    if (v.count(opt::kv_budget) <= v.count(opt::kv_sinks))
      throw usage_error(budget + " must exceed --sinks " + std::to_string(v.count(opt::kv_sinks)));
    return;
  }
  if (v.given(opt::kv_sinks)) throw usage_error("--sinks needs --kv-policy streaming");
  std::uint64_t const least =
      v.count(opt::kv_window) +
      (policy == sd::kv_policy::retrieval ? sd::sparse_kv_config{}.chunk : 1);
  if (v.count(opt::kv_budget) < least)
    throw usage_error(
        budget + " must be at least " + std::to_string(least) + " (--kv-window " +
        std::to_string(v.count(opt::kv_window)) +
        (policy == sd::kv_policy::retrieval ? " and a chunk of 8)" : " and one more)"));
}

//! prompt-lookup, rest: the shortest n-gram is at most the longest.
template <option_spec const& Max, option_spec const& Min>
void check_ngram(option_values const& v) {
  if (v.count(Min) > v.count(Max))
    throw usage_error(std::string(Min.flag) + " " + std::to_string(v.count(Min)) + " exceeds " +
                      std::string(Max.flag) + " " + std::to_string(v.count(Max)));
}

//! medusa, hydra: --tree and --tree-nodes exclude each other, --tree names a file (a text
//! option, so that it is parsed before this check).
inline void check_heads(option_values const& v) {
  if (v.given(opt::tree) && v.given(opt::tree_nodes))
    throw usage_error("--tree and --tree-nodes exclude each other");
  if (auto const tree = v.text(opt::tree)) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*tree, ec))
      throw usage_error("--tree: no such file '" + *tree + "'");
  }
}

//! dspark: the confidence cutoff cuts chains, not DDTree's trees.
inline void check_block(option_values const& v) {
  if (v.given(opt::block_tree) && v.given(opt::block_confidence))
    throw usage_error(
        "--block-tree (a tree of the most probable paths) excludes "
        "--block-confidence (a cutoff of chains)");
}

//! eagle: a static tree (--tree) excludes the dynamic tree's options, and names a file.
inline void check_eagle(option_values const& v) {
  if (v.given(opt::eagle_tree))
    for (option_spec const* o : {&opt::eagle_depth, &opt::eagle_topk, &opt::eagle_nodes})
      if (v.given(*o))
        throw usage_error(std::string("--tree (a static tree) excludes ") + std::string(o->flag));
  check_heads(v);
}

// ---------------------------------------------------------------------------------------------
// How each strategy runs one request.

//! A draft chain's configuration: `defaults` (the library's for the strategy) with -k, whether it
//! adapts, --k-max (default: the larger of the default's and k) and --confidence.
inline sd::draft_model_config chain_config(option_values const& v, option_spec const& k_spec,
                                           bool adaptive, option_spec const& k_max_spec,
                                           sd::draft_model_config defaults) {
  auto const k = static_cast<std::size_t>(v.count(k_spec));
  std::size_t const k_max =
      !adaptive ? k
      : v.given(k_max_spec)
          ? static_cast<std::size_t>(v.count(k_max_spec))
          : std::max<std::size_t>(static_cast<std::size_t>(v.count(k_max_spec)), k);
  defaults.k = k;
  defaults.adaptive = adaptive;
  defaults.k_max = k_max;
  defaults.k_min = std::min(defaults.k_min, k);
  defaults.confidence_threshold = v.real(opt::confidence);
  return defaults;
}

//! draft: the chain from -k, --adaptive, --k-max and --confidence over `draft_model_config`'s
//! defaults (a fixed k).
inline sd::draft_model_config chain_config(option_values const& v) {
  return chain_config(v, opt::chain_length, v.flag(opt::adaptive), opt::k_max,
                      sd::draft_model_config{});
}

//! layer-skip, sparse-kv: the chain from -k, --fixed-k, --k-max and --confidence over
//! `layer_skip_config`'s defaults (k adapts), which `sparse_kv_config`'s equal.
inline sd::draft_model_config layer_skip_chain(option_values const& v) {
  static_assert(sd::layer_skip_config{}.draft.k == sd::sparse_kv_config{}.draft.k &&
                sd::layer_skip_config{}.draft.k_max == sd::sparse_kv_config{}.draft.k_max &&
                sd::layer_skip_config{}.draft.adaptive == sd::sparse_kv_config{}.draft.adaptive);
  return chain_config(v, opt::layer_skip_k, !v.flag(opt::fixed_k), opt::layer_skip_k_max,
                      sd::layer_skip_config{}.draft);
}

//! Describes a draft chain's settings: "k = 4", or "adaptive k from 4 in [1, 8]", and the
//! confidence cutoff.
inline std::string chain_description(sd::draft_model_config const& c) {
  std::string d = c.adaptive ? "adaptive k from " + std::to_string(c.k) + " in [1, " +
                                   std::to_string(c.k_max) + "]"
                             : "k = " + std::to_string(c.k);
  if (c.confidence_threshold > 0.0f)
    d += ", confidence cutoff " + option_spec::number_text(c.confidence_threshold);
  return d;
}

//! draft: the bridge to a draft model of another vocabulary (--draft-tokenizer, a GGUF draft's
//! own vocabulary, or a vocabulary of another size: the target's padded or cut), or null when the
//! draft shares the target's. `target` is the target's tokenizer.
inline std::shared_ptr<sd::vocabulary_bridge const> draft_bridge(option_values const& v,
                                                                 sd::tokenizer const& target,
                                                                 std::size_t draft_vocab) {
  auto const target_vocab = static_cast<std::size_t>(target.vocab_size());
  std::string const path = *v.text(opt::draft_model);
  bool const gguf = sd::detect_model_format(path) == sd::model_format::gguf;
  std::shared_ptr<sd::vocabulary_bridge const> bridge;
  if (v.given(opt::draft_tokenizer) || (gguf && draft_vocab != target_vocab)) {
    std::optional<std::filesystem::path> tokenizer;
    if (auto const t = v.text(opt::draft_tokenizer)) tokenizer = *t;
    bridge = std::make_shared<sd::vocabulary_bridge const>(
        sd::vocabulary_bridge::between(target, sd::load_tokenizer(path, tokenizer)));
  } else if (draft_vocab != target_vocab) {
    bridge = std::make_shared<sd::vocabulary_bridge const>(
        sd::vocabulary_bridge::padded(target_vocab, draft_vocab));
  }
  if (!bridge && v.given(opt::vocab_mode))
    throw usage_error("--vocab-mode needs a draft of another vocabulary (--draft-tokenizer)");
  return bridge;
}

//! draft: the mode named by --vocab-mode.
inline sd::vocab_mode vocab_mode_of(option_values const& v) {
  std::string const name = v.text(opt::vocab_mode).value_or("intersection");
  if (name == "intersection") return sd::vocab_mode::intersection;
  if (name == "string") return sd::vocab_mode::string;
  throw usage_error("--vocab-mode '" + name + "' is none of intersection, string");
}

//! draft: the configuration of a draft of another vocabulary.
inline sd::cross_vocabulary_config cross_config(option_values const& v) {
  return {.draft = chain_config(v), .mode = vocab_mode_of(v)};
}

//! Describes a draft of another vocabulary: "draft model of another vocabulary (495 of 1024
//! tokens shared), intersection, k = 4".
inline std::string cross_description(sd::vocabulary_bridge const& bridge,
                                     sd::cross_vocabulary_config const& c) {
  return "draft model of another vocabulary (" + std::to_string(bridge.shared()) + " of " +
         std::to_string(bridge.draft_vocab()) + " tokens shared), " +
         (c.mode == sd::vocab_mode::string ? "string level, " : "intersection, ") +
         chain_description(c.draft);
}

//! autoregressive: the plain baseline (one target forward per token).
run_output run_autoregressive(session& s);

//! draft: a separate draft model drafts a chain of k tokens per step.
run_output run_draft(session& s);

//! layer-skip: the target with some layers skipped drafts a chain (self-speculation).
//! The layers --skip-layers names (default: the middle one), checked against a model of
//! `n_layers` layers.
inline std::vector<std::int32_t> skip_layers_of(option_values const& v, std::int32_t n_layers) {
  std::vector<std::int32_t> const layers =
      v.layers(opt::skip_layers).value_or(std::vector<std::int32_t>{n_layers / 2});
  for (std::int32_t l : layers)
    if (l >= n_layers)
      throw usage_error("--skip-layers: layer " + std::to_string(l) + " is beyond the model's " +
                        std::to_string(n_layers) + " layers (0.." + std::to_string(n_layers - 1) +
                        ")");
  return layers;
}

//! The description of a layer-skip run skipping `layers` with `chain`.
inline std::string layer_skip_description(std::span<std::int32_t const> layers,
                                          sd::draft_model_config const& chain) {
  std::string layer_list;
  for (std::int32_t l : layers) layer_list += (layer_list.empty() ? "" : ",") + std::to_string(l);
  return "layer skip (layers " + layer_list + "), " + chain_description(chain);
}

run_output run_layer_skip(session& s);

//! sparse-kv: the target over a view of its cache (sinks and a recent window) drafts a chain.
//! The configuration from --sinks, --budget and the chain's options.
inline sd::sparse_kv_config sparse_kv_config_of(option_values const& v) {
  return {.policy = kv_policy_of(v),
          .sinks = static_cast<std::size_t>(v.count(opt::kv_sinks)),
          .budget = static_cast<std::size_t>(v.count(opt::kv_budget)),
          .window = static_cast<std::size_t>(v.count(opt::kv_window)),
          .draft = layer_skip_chain(v)};
}

//! "sparse KV (16 sinks, budget 512), adaptive k from 4 in [1, 8]"; "sparse KV (snapkv, budget
//! 128, window 32), ...".
inline std::string sparse_kv_description(sd::sparse_kv_config const& c) {
  std::string const view =
      c.policy == sd::kv_policy::streaming
          ? std::to_string(c.sinks) + " sinks"
          : std::string(c.policy == sd::kv_policy::snapkv ? "snapkv" : "retrieval") + ", window " +
                std::to_string(c.window);
  return "sparse KV (" + view + ", budget " + std::to_string(c.budget) + "), " +
         chain_description(c.draft);
}

run_output run_sparse_kv(session& s);

//! The prompt-lookup configuration from --lookup-*.
inline sd::prompt_lookup_config lookup_config(option_values const& v) {
  return {.n_max = static_cast<std::size_t>(v.count(opt::lookup_ngram)),
          .n_min = static_cast<std::size_t>(v.count(opt::lookup_ngram_min)),
          .k = static_cast<std::size_t>(v.count(opt::lookup_depth)),
          .max_branches = static_cast<std::size_t>(v.count(opt::lookup_branches))};
}

//! prompt-lookup: n-gram matches in the prompt and the output draft chains or trees.
run_output run_prompt_lookup(session& s);

//! The REST configuration from --rest-*.
inline sd::rest_config rest_config_of(option_values const& v) {
  sd::rest_config c;
  c.n_max = static_cast<std::size_t>(v.count(opt::rest_ngram));
  c.n_min = static_cast<std::size_t>(v.count(opt::rest_ngram_min));
  c.depth = static_cast<std::size_t>(v.count(opt::rest_depth));
  c.max_nodes = static_cast<std::size_t>(v.count(opt::rest_nodes));
  return c;
}

//! The --datastore file (mapped, or read into memory with --no-mmap), checked against a model of
//! `vocab` tokens.
inline std::shared_ptr<sd::rest_datastore const> load_datastore(option_values const& v,
                                                                std::size_t vocab) {
  sd::file_access const access =
      v.flag(opt::no_mmap) ? sd::file_access::read : sd::file_access::map;
  auto datastore = std::make_shared<sd::rest_datastore const>(
      sd::rest_datastore::load(*v.text(opt::datastore), true, access));
  SPECDEC_CHECK(datastore->vocab_size() <= vocab, invalid_argument,
                "--datastore: its vocabulary of ", datastore->vocab_size(),
                " ids exceeds the model's ", vocab);
  return datastore;
}

//! rest: continuations retrieved from a datastore draft a tree.
run_output run_rest(session& s);

//! lookahead: a Jacobi window (auxiliary tokens) feeds an n-gram pool whose candidates for the
//! last token are verified as a tree, both in one forward.
//! The suffix proposer's configuration from --suffix-*.
inline sd::suffix_config suffix_config_of(option_values const& v) {
  sd::suffix_config c;
  c.depth = static_cast<std::size_t>(v.count(opt::suffix_depth));
  c.speculation.max_tokens = static_cast<std::size_t>(v.count(opt::suffix_tokens));
  c.speculation.factor = v.real(opt::suffix_factor);
  c.speculation.min_probability = v.real(opt::suffix_min_prob);
  c.speculation.tree = v.flag(opt::suffix_tree);
  return c;
}

//! The global tree from --suffix-*: empty, or loaded from --suffix-cache when that file exists.
inline std::shared_ptr<sd::suffix_cache> load_suffix_cache(option_values const& v,
                                                           std::size_t vocab) {
  auto cache = std::make_shared<sd::suffix_cache>(sd::suffix_cache_config{
      .depth = static_cast<std::size_t>(v.count(opt::suffix_depth)),
      .max_requests = static_cast<std::size_t>(v.count(opt::suffix_requests)),
      .vocab_size = vocab});
  if (auto const path = v.text(opt::suffix_cache); path && std::filesystem::exists(*path))
    cache->load(*path);
  return cache;
}

//! Describes the global tree on stderr when `describe` (outputs, tokens, nodes, memory per token
//! held) and writes it back to --suffix-cache, when given.
inline void save_suffix_cache(option_values const& v, sd::suffix_cache const& cache,
                              bool describe) {
  std::size_t const tokens = cache.tokens();
  std::size_t const bytes = cache.memory_bytes();
  if (describe)
    std::fprintf(stderr,
                 "  %-22s %zu outputs, %zu tokens, %zu nodes, %.1f KiB (%.1f bytes per token "
                 "held), %zu outputs evicted\n",
                 "suffix cache", cache.requests(), tokens, cache.nodes(),
                 static_cast<double>(bytes) / 1024.0,
                 tokens == 0 ? 0.0 : static_cast<double>(bytes) / static_cast<double>(tokens),
                 cache.evicted());
  if (auto const path = v.text(opt::suffix_cache)) cache.save(*path);
}

//! "suffix trees, depth 24, paths of <= 16 tokens, ...": the configuration in words.
inline std::string suffix_description(sd::suffix_config const& c, sd::suffix_cache const& cache) {
  return "suffix trees (local and global, " + std::to_string(cache.requests()) +
         " outputs cached), depth " + std::to_string(c.depth) + ", " +
         (c.speculation.tree ? "trees of <= " : "paths of <= ") +
         std::to_string(c.speculation.max_tokens) + " tokens, min probability " +
         option_spec::number_text(c.speculation.min_probability);
}

//! suffix: continuations of the context in suffix trees of the request's own text and of earlier
//! outputs draft a path or a tree (SuffixDecoding).
run_output run_suffix(session& s);

//! The lookahead configuration from --lookahead-*.
inline sd::lookahead_config lookahead_config_of(option_values const& v) {
  return {.window = static_cast<std::size_t>(v.count(opt::lookahead_window)),
          .ngram = static_cast<std::size_t>(v.count(opt::lookahead_ngram)),
          .guesses = static_cast<std::size_t>(v.count(opt::lookahead_guesses))};
}

//! "W = 5, N = 4, G = 5".
inline std::string lookahead_description(sd::lookahead_config const& c) {
  return "W = " + std::to_string(c.window) + ", N = " + std::to_string(c.ngram) +
         ", G = " + std::to_string(c.guesses);
}

run_output run_lookahead(session& s);

//! The Jacobi configuration from -k.
inline sd::jacobi_config jacobi_config_of(option_values const& v) {
  return {.block = static_cast<std::size_t>(v.count(opt::jacobi_block))};
}

//! jacobi: a block of k guesses refined by the target's own predictions (greedy only).
run_output run_jacobi(session& s);

//! The text --tree-nodes measures the heads' accuracies on: the target's greedy continuations of
//! 8 starts of 4 tokens sampled from BOS (temperature 1, seeds 1..8), 128 tokens each (fewer in a
//! short context), with the target's final hidden rows. Greedy text, because under greedy
//! verification the accepted tokens are the target's greedy continuation.
struct calibration_text {
  std::vector<sd::token_id> tokens;  //!< BOS, the sampled start, the greedy continuation
  std::vector<float> hidden;         //!< [tokens, dim]
};

//! The calibration texts of `s`'s target (see `calibration_text`).
inline std::vector<calibration_text> calibration_texts(session& s) {
  std::size_t const length = std::min<std::size_t>(128, s.target.max_context() - 1);
  std::size_t const start = std::min<std::size_t>(4, length);
  std::vector<sd::token_id> const bos{s.prompt.front()};
  std::vector<calibration_text> out;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    sd::sampling_params p;
    p.temperature = 1.0f;
    sd::decode_config c;
    c.max_new_tokens = start;
    c.seed = seed;
    sd::autoregressive_decoder sampled(s.target, sd::sampler(p), c);
    calibration_text text{bos, {}};
    auto const head = sampled.generate(bos).tokens;
    text.tokens.insert(text.tokens.end(), head.begin(), head.end());
    c.max_new_tokens = length - start;
    sd::autoregressive_decoder greedy(s.target, sd::greedy{}, c);
    auto const tail = greedy.generate(text.tokens).tokens;
    text.tokens.insert(text.tokens.end(), tail.begin(), tail.end());
    std::vector<sd::position_t> positions(text.tokens.size());
    for (std::size_t i = 0; i < positions.size(); ++i)
      positions[i] = static_cast<sd::position_t>(i);
    sd::forward_result f;
    s.target.cache().truncate(0);
    s.target.forward({.tokens = text.tokens, .positions = positions, .want_hidden = true}, f);
    s.target.cache().truncate(0);
    text.hidden = std::move(f.hidden);
    out.push_back(std::move(text));
  }
  return out;
}

//! The sparse tree of a medusa / hydra run: --tree, else --tree-nodes, else the heads'
//! tree.json, else --tree-nodes' default; built trees from the accuracies `measure(runner, hidden,
//! tokens, accuracy)` finds on the calibration texts. Writes it to --write-tree when given, and
//! describes it.
template <class Runner, class Measure>
sd::sparse_tree heads_tree(session& s, Runner& runner, std::filesystem::path const& dir,
                           Measure&& measure, std::string& description) {
  option_values const& v = s.values;
  std::filesystem::path const beside = dir / sd::heads_tree_file;
  sd::sparse_tree tree = sd::sparse_tree::chain(0);
  if (v.given(opt::tree) || (!v.given(opt::tree_nodes) && std::filesystem::exists(beside))) {
    std::filesystem::path const file =
        v.given(opt::tree) ? std::filesystem::path(*v.text(opt::tree)) : beside;
    tree = sd::sparse_tree::from_choices(sd::read_tree_choices(file));
    description = std::to_string(tree.size()) + "-node tree " + file.string();
  } else {
    sd::head_accuracy accuracy(runner.num_heads(), 10);
    for (calibration_text const& text : calibration_texts(s))
      measure(runner,
              sd::matrix_view<float const>(text.hidden.data(), text.tokens.size(),
                                           runner.hidden_size()),
              std::span<sd::token_id const>(text.tokens), accuracy);
    tree = sd::sparse_tree::build(accuracy, static_cast<std::size_t>(v.count(opt::tree_nodes)));
    char expected[32];
    std::snprintf(expected, sizeof expected, "%.2f", tree.expected_length());
    description = std::to_string(tree.size()) +
                  "-node tree built from measured accuracies (expected length " + expected + ")";
  }
  if (auto const out = v.text(opt::write_tree)) sd::write_tree_choices(*out, tree.choices());
  return tree;
}

//! The --heads directory, checked.
inline std::filesystem::path heads_directory(option_values const& v) {
  std::filesystem::path const dir = *v.text(opt::heads);
  if (!std::filesystem::is_directory(dir))
    throw usage_error("--heads: no such directory '" + dir.string() + "'");
  return dir;
}

//! medusa: Medusa heads on the target's hidden state draft a sparse tree.
run_output run_medusa(session& s);

//! hydra: Hydra heads (sequentially dependent) draft a sparse tree.
run_output run_hydra(session& s);

//! eagle: an EAGLE head on the target's features drafts a dynamic tree (EAGLE-2; EAGLE-3 heads
//! too) or a static one (--tree).
//! The --eagle head, loaded for `weights` (the directory checked).
inline std::shared_ptr<sd::eagle_weights const> load_eagle(
    option_values const& v, std::shared_ptr<sd::llama_weights const> const& weights,
    sd::file_access access) {
  std::filesystem::path const dir = *v.text(opt::eagle);
  if (!std::filesystem::is_directory(dir))
    throw usage_error("--eagle: no such directory '" + dir.string() + "'");
  return std::make_shared<sd::eagle_weights const>(sd::load_eagle_head(dir, weights, access));
}

//! How an EAGLE run drafts: a static tree (--eagle-tree) or EAGLE-2's dynamic trees
//! (--eagle-depth, --eagle-topk, --eagle-nodes); `make(runner)` builds its proposer.
struct eagle_drafting {
  std::optional<sd::sparse_tree> tree;  //!< the static tree, or none: dynamic
  sd::eagle_tree_config dynamic;        //!< the dynamic trees' shape
  std::string description;              //!< "EAGLE, EAGLE-3 head (...), dynamic tree: ..."

  //! The proposer over `runner`.
  template <class Runner>
  [[nodiscard]] sd::eagle_proposer<Runner> make(Runner& runner) const {
    return tree ? sd::eagle_proposer<Runner>(runner, *tree)
                : sd::eagle_proposer<Runner>(runner, dynamic);
  }
};

//! The drafting of an EAGLE run with `head` (see `eagle_drafting`).
inline eagle_drafting eagle_drafting_of(option_values const& v, sd::eagle_weights const& head) {
  std::string kind = "EAGLE-1 head";
  if (head.config.version == sd::eagle_version::eagle3) {
    kind = "EAGLE-3 head (layers";
    for (std::int32_t l : head.target_layers) kind += " " + std::to_string(l);
    kind += ", draft vocabulary " + std::to_string(head.draft_vocab) + ")";
  }
  eagle_drafting d;
  if (auto const file = v.text(opt::eagle_tree)) {
    d.tree = sd::sparse_tree::from_choices(sd::read_tree_choices(*file));
    d.description =
        "EAGLE, " + kind + ", static " + std::to_string(d.tree->size()) + "-node tree " + *file;
    return d;
  }
  d.dynamic = {.depth = static_cast<std::size_t>(v.count(opt::eagle_depth)),
               .top_k = static_cast<std::size_t>(v.count(opt::eagle_topk)),
               .nodes = static_cast<std::size_t>(v.count(opt::eagle_nodes))};
  d.description = "EAGLE, " + kind + ", dynamic tree: depth " + std::to_string(d.dynamic.depth) +
                  ", top-" + std::to_string(d.dynamic.top_k) + ", " +
                  std::to_string(d.dynamic.nodes) + " nodes";
  return d;
}

run_output run_eagle(session& s);

//! dflash, dspark: a block drafter reads the target's features and drafts a chain in one forward.
//! The --block drafter, loaded for `weights` (the directory checked; dspark needs the DSpark
//! heads).
inline std::shared_ptr<sd::block_drafter_weights const> load_block(
    option_values const& v, std::shared_ptr<sd::llama_weights const> const& weights,
    sd::file_access access, bool dspark) {
  std::filesystem::path const dir = *v.text(opt::block);
  if (!std::filesystem::is_directory(dir))
    throw usage_error("--block: no such directory '" + dir.string() + "'");
  auto w = std::make_shared<sd::block_drafter_weights const>(
      sd::load_block_drafter(dir, weights, access));
  if (dspark && !w->config.dspark)
    throw usage_error("--strategy dspark: the drafter in '" + dir.string() +
                      "' has no Markov and confidence heads (a DFlash drafter: --strategy dflash)");
  return w;
}

//! The proposer options of a dflash (`dspark` false: a DSpark drafter drafts as its DFlash body)
//! or dspark run, and its description.
inline sd::block_config block_config_of(option_values const& v, bool dspark) {
  return {.length = v.given(opt::block_length)
                        ? static_cast<std::size_t>(v.count(opt::block_length))
                        : std::size_t{0},
          .nodes = v.given(opt::block_tree) ? static_cast<std::size_t>(v.count(opt::block_tree))
                                            : std::size_t{32},
          .markov = dspark,
          .confidence_threshold = v.given(opt::block_confidence)
                                      ? static_cast<float>(v.real(opt::block_confidence))
                                      : 0.0f};
}
inline std::string block_description(sd::block_drafter_weights const& w, sd::block_config const& c,
                                     bool dspark, bool tree) {
  std::string d = std::string(dspark ? "DSpark" : "DFlash") + " block drafter (" +
                  std::to_string(w.config.num_layers) + " layers, block of " +
                  std::to_string(w.config.block_size) + ", target layers";
  for (std::int32_t l : w.config.target_layers) d += " " + std::to_string(l);
  std::size_t const length = c.length == 0 ? w.drafts() : c.length;
  if (tree)
    d += "), DDTree of " + std::to_string(c.nodes) + " nodes, depth " + std::to_string(length);
  else
    d += "), chain of " + std::to_string(length);
  if (dspark && c.confidence_threshold > 0.0f)
    d += ", confidence cutoff " + std::to_string(c.confidence_threshold).substr(0, 5);
  return d;
}

run_output run_pard(session& s);
run_output run_dflash(session& s);
run_output run_dspark(session& s);

// ---------------------------------------------------------------------------------------------
// The table.

//! One --strategy value: everything the command line, --help and the run need to know about it.
struct strategy {
  std::string_view name = {};                        //!< the --strategy value
  std::string_view help = {};                        //!< one line for --help
  std::span<option_spec const* const> options = {};  //!< its own options, in --help order
  bool greedy_only = false;                          //!< refused with --temp > 0
  void (*check)(option_values const&) = nullptr;     //!< checks between its options, or none
  run_output (*run)(session& s) = nullptr;           //!< runs one request
};

//! The options of each strategy.
namespace strategy_options {
inline constexpr option_spec const* draft[] = {
    &opt::draft_model,   &opt::chain_length,    &opt::adaptive,
    &opt::k_max,         &opt::confidence,      &opt::draft_threads,
    &opt::draft_context, &opt::draft_tokenizer, &opt::vocab_mode};
inline constexpr option_spec const* layer_skip[] = {
    &opt::skip_layers, &opt::layer_skip_k, &opt::fixed_k, &opt::layer_skip_k_max, &opt::confidence};
inline constexpr option_spec const* sparse_kv[] = {
    &opt::kv_policy,    &opt::kv_budget, &opt::kv_sinks,         &opt::kv_window,
    &opt::layer_skip_k, &opt::fixed_k,   &opt::layer_skip_k_max, &opt::confidence};
inline constexpr option_spec const* prompt_lookup[] = {&opt::lookup_depth, &opt::lookup_branches,
                                                       &opt::lookup_ngram, &opt::lookup_ngram_min};
inline constexpr option_spec const* rest[] = {&opt::datastore, &opt::rest_depth, &opt::rest_nodes,
                                              &opt::rest_ngram, &opt::rest_ngram_min};
inline constexpr option_spec const* suffix[] = {
    &opt::suffix_depth, &opt::suffix_tokens, &opt::suffix_factor,  &opt::suffix_min_prob,
    &opt::suffix_tree,  &opt::suffix_cache,  &opt::suffix_requests};
inline constexpr option_spec const* lookahead[] = {&opt::lookahead_window, &opt::lookahead_ngram,
                                                   &opt::lookahead_guesses};
inline constexpr option_spec const* jacobi[] = {&opt::jacobi_block};
inline constexpr option_spec const* heads[] = {&opt::heads, &opt::tree, &opt::tree_nodes,
                                               &opt::write_tree};
inline constexpr option_spec const* eagle[] = {&opt::eagle, &opt::eagle_depth, &opt::eagle_topk,
                                               &opt::eagle_nodes, &opt::eagle_tree};
inline constexpr option_spec const* pard[] = {&opt::draft_model, &opt::mask_token,
                                              &opt::chain_length, &opt::draft_threads,
                                              &opt::draft_context};
inline constexpr option_spec const* dflash[] = {&opt::block, &opt::block_length, &opt::block_tree};
inline constexpr option_spec const* dspark[] = {&opt::block, &opt::block_length, &opt::block_tree,
                                                &opt::block_confidence};
}  // namespace strategy_options

//! Every strategy, in --help order.
inline constexpr strategy strategies[] = {
    {.name = "autoregressive",
     .help = "the baseline: one target forward per token, nothing drafted",
     .options = {},
     .run = run_autoregressive},
    {.name = "draft",
     .help = "a separate, smaller model drafts a chain of k tokens per step",
     .options = strategy_options::draft,
     .check = check_chain,
     .run = run_draft},
    {.name = "prompt-lookup",
     .help = "continuations of n-grams matched in the prompt and the output draft a chain or a "
             "tree",
     .options = strategy_options::prompt_lookup,
     .check = check_ngram<opt::lookup_ngram, opt::lookup_ngram_min>,
     .run = run_prompt_lookup},
    {.name = "layer-skip",
     .help = "the target with some layers skipped drafts a chain (self-speculation)",
     .options = strategy_options::layer_skip,
     .check = check_layer_skip_chain,
     .run = run_layer_skip},
    {.name = "sparse-kv",
     .help = "the target over a bounded view of its own cache drafts a chain (MagicDec's and "
             "TriForce's self-speculation: StreamingLLM, SnapKV or chunk retrieval views)",
     .options = strategy_options::sparse_kv,
     .check = check_sparse_kv,
     .run = run_sparse_kv},
    {.name = "rest",
     .help = "continuations retrieved from a datastore draft a tree (REST)",
     .options = strategy_options::rest,
     .check = check_ngram<opt::rest_ngram, opt::rest_ngram_min>,
     .run = run_rest},
    {.name = "suffix",
     .help = "continuations found in suffix trees of the request's text and of earlier outputs "
             "draft a path or a tree (SuffixDecoding)",
     .options = strategy_options::suffix,
     .run = run_suffix},
    {.name = "lookahead",
     .help = "a Jacobi window feeds an n-gram pool whose candidates are verified as a tree",
     .options = strategy_options::lookahead,
     .run = run_lookahead},
    {.name = "jacobi",
     .help = "a block of k guesses refined by the target's own predictions",
     .options = strategy_options::jacobi,
     .greedy_only = true,
     .run = run_jacobi},
    {.name = "medusa",
     .help = "Medusa heads on the target's hidden state draft a sparse tree",
     .options = strategy_options::heads,
     .check = check_heads,
     .run = run_medusa},
    {.name = "hydra",
     .help = "Hydra heads (each also reading the drafted tokens) draft a sparse tree",
     .options = strategy_options::heads,
     .check = check_heads,
     .run = run_hydra},
    {.name = "eagle",
     .help = "an EAGLE head on the target's features drafts a dynamic tree (EAGLE-2, EAGLE-3)",
     .options = strategy_options::eagle,
     .check = check_eagle,
     .run = run_eagle},
    {.name = "pard",
     .help = "a draft model trained to fill mask tokens drafts a chain of k in one forward (PARD)",
     .options = strategy_options::pard,
     .run = run_pard},
    {.name = "dflash",
     .help = "a block drafter on the target's features drafts a chain in one forward (DFlash)",
     .options = strategy_options::dflash,
     .run = run_dflash},
    {.name = "dspark",
     .help = "a block drafter with a Markov head (drafts read the earlier drafts) and a "
             "confidence head that cuts the chain (DSpark)",
     .options = strategy_options::dspark,
     .check = check_block,
     .run = run_dspark},
};

//! The strategy called `name`, or null.
inline strategy const* find_strategy(std::string_view name) noexcept {
  for (strategy const& s : strategies)
    if (s.name == name) return &s;
  return nullptr;
}

//! Whether strategy `s` declares an option named `flag`.
inline option_spec const* find_option(strategy const& s, std::string_view flag) noexcept {
  for (option_spec const* o : s.options)
    if (o->flag == flag) return o;
  return nullptr;
}

}  // namespace generate
