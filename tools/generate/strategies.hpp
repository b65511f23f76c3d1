#pragma once
// specdec-generate's strategies: one function per --strategy value, each building its proposer
// and verifier and running one request through `run_speculative` (or the autoregressive
// baseline). Adding a strategy: write a `run_<name>(session&)` function and add one row to
// `strategies` (and its name to options.hpp's `strategy_names` and help text).
//
// Verification: temperature 0 is greedy, checked token by token by `greedy_verifier` (the output
// equals plain greedy decoding). Above 0 the sampler's distribution is verified losslessly: a
// sampled draft chain (draft model, layer skip) by `speculative_sampling_verifier` with the
// draft's q rows, deterministic candidates (prompt lookup, chains or trees) by `tree_verifier`,
// which treats each candidate as a point mass.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "generate/options.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/common.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/load.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/jacobi.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/lookahead.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/propose/rest.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"

namespace generate {

namespace sd = specdec;

//! What one request produced, and how it was run.
struct run_output {
  sd::decode_result result;  //!< tokens, finish reason and statistics
  std::string description;   //!< the strategy and its settings, e.g. "draft model, k = 4"
  std::string verifier;      //!< "greedy", "speculative sampling", "tree (point masses)" or "none"
};

//! What every strategy runs against: the options, the loaded target, the prompt, the decode
//! configuration and sampling policy, and the streaming callback (empty for --json).
struct session {
  options const& opt;
  std::shared_ptr<sd::llama_weights const> weights;  //!< the target's weights
  sd::cpu_llama& target;                             //!< the target model
  std::span<sd::token_id const> prompt;              //!< BOS + the encoded prompt
  sd::decode_config config;                          //!< stops, length, seed
  sd::sampler policy;                                //!< the sampling policy of every row
  sd::token_callback on_token;                       //!< called per committed token, or empty

  //! Options for another model instance of this session (draft, layer-skipped copy).
  [[nodiscard]] sd::cpu_llama_options model_options() const {
    return {.threads = opt.threads, .max_context = opt.context};
  }
  //! The draft-chain configuration from -k, --adaptive, --k-max and --confidence.
  [[nodiscard]] sd::draft_model_config chain_config() const {
    std::size_t const k_max =
        opt.adaptive ? opt.k_max.value_or(std::max<std::size_t>(8, opt.k)) : opt.k;
    return {.k = opt.k,
            .adaptive = opt.adaptive,
            .k_min = 1,
            .k_max = std::max<std::size_t>(k_max, 1),
            .confidence_threshold = opt.confidence};
  }
  //! Whether decoding is greedy (temperature 0).
  [[nodiscard]] bool greedy() const noexcept { return opt.temperature == 0.0f; }
};

//! Runs one request with `proposer` and `verifier`, scoring at most `max_nodes` draft nodes per
//! step.
template <class Proposer, class Verifier>
run_output run_speculative(session& s, Proposer& proposer, Verifier verifier, std::size_t max_nodes,
                           std::string description, std::string verifier_name) {
  sd::decode_config config = s.config;
  config.max_draft_nodes = std::min<std::size_t>(max_nodes, sd::max_tree_nodes - 1);
  sd::speculative_decoder decoder(s.target, proposer, std::move(verifier), s.policy, config);
  run_output out{{}, std::move(description), std::move(verifier_name)};
  decoder.generate(s.prompt, out.result, s.on_token);
  return out;
}

//! Calls `f(std::integral_constant<draft_mode, M>{})` with M = greedy at temperature 0, else
//! sample: model-based drafts are greedy candidates under greedy decoding and sampled chains with
//! q rows under sampling.
template <class F>
run_output with_draft_mode(session const& s, F&& f) {
  if (s.greedy()) return f(std::integral_constant<sd::draft_mode, sd::draft_mode::greedy>{});
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

//! Describes -k / --adaptive for a model-drafted chain.
inline std::string chain_description(session const& s) {
  sd::draft_model_config const c = s.chain_config();
  std::string d = c.adaptive ? "adaptive k from " + std::to_string(c.k) + " in [1, " +
                                   std::to_string(c.k_max) + "]"
                             : "k = " + std::to_string(c.k);
  if (c.confidence_threshold > 0.0f)
    d += ", confidence cutoff " + std::to_string(c.confidence_threshold).substr(0, 5);
  return d;
}

//! --strategy autoregressive: the plain baseline (one target forward per token).
inline run_output run_autoregressive(session& s) {
  sd::autoregressive_decoder decoder(s.target, s.policy, s.config);
  run_output out{{}, "autoregressive", "none"};
  decoder.generate(s.prompt, out.result, s.on_token);
  return out;
}

//! --strategy draft: a separate draft model (--draft) drafts a chain of k tokens per step.
inline run_output run_draft(session& s) {
  auto const weights = std::make_shared<sd::llama_weights const>(sd::load_model(*s.opt.draft));
  sd::cpu_llama draft(weights, s.model_options());
  sd::draft_model_config const chain = s.chain_config();
  return with_draft_mode(s, [&]<sd::draft_mode M>(std::integral_constant<sd::draft_mode, M>) {
    sd::draft_model_proposer<sd::cpu_llama, sd::sampler, M> proposer(draft, s.target, s.policy,
                                                                     chain);
    return run_speculative(s, proposer, chain_verifier<M>{}, chain.adaptive ? chain.k_max : chain.k,
                           "draft model, " + chain_description(s), chain_verifier_name<M>);
  });
}

//! --strategy layer-skip: the target with --skip-layers skipped drafts a chain (self-speculation).
inline run_output run_layer_skip(session& s) {
  std::vector<std::int32_t> const layers = s.opt.skip_layers.value_or(std::vector<std::int32_t>{});
  sd::draft_model_config const chain = s.chain_config();
  std::string layer_list;
  for (std::int32_t l : layers) layer_list += (layer_list.empty() ? "" : ",") + std::to_string(l);
  return with_draft_mode(s, [&]<sd::draft_mode M>(std::integral_constant<sd::draft_mode, M>) {
    sd::layer_skip_proposer<sd::cpu_llama, sd::sampler, M> proposer(
        {.skip_layers = layers, .draft = chain}, s.policy, s.weights, s.model_options());
    return run_speculative(s, proposer, chain_verifier<M>{}, chain.adaptive ? chain.k_max : chain.k,
                           "layer skip (layers " + layer_list + "), " + chain_description(s),
                           chain_verifier_name<M>);
  });
}

//! --strategy prompt-lookup: n-gram matches in the prompt and output draft chains or trees.
inline run_output run_prompt_lookup(session& s) {
  options const& o = s.opt;
  sd::prompt_lookup_proposer proposer(
      {.n_max = o.ngram_max, .n_min = o.ngram_min, .k = o.k, .max_branches = o.branches});
  std::string const description =
      "prompt lookup, n-grams " + std::to_string(o.ngram_max) + ".." + std::to_string(o.ngram_min) +
      ", k = " + std::to_string(o.k) +
      (o.branches > 1 ? ", " + std::to_string(o.branches) + " branches" : "");
  std::size_t const nodes = o.k * o.branches;
  if (s.greedy())
    return run_speculative(s, proposer, sd::greedy_verifier{}, nodes, description, "greedy");
  return run_speculative(s, proposer, sd::tree_verifier{}, nodes, description,
                         "tree (point masses)");
}

//! --strategy rest: continuations retrieved from a datastore (--datastore) draft a tree.
inline run_output run_rest(session& s) {
  auto const datastore =
      std::make_shared<sd::rest_datastore const>(sd::rest_datastore::load(*s.opt.datastore));
  SPECDEC_CHECK(datastore->vocab_size() <= s.target.vocab_size(), invalid_argument,
                "--datastore: its vocabulary of ", datastore->vocab_size(),
                " ids exceeds the model's ", s.target.vocab_size());
  sd::rest_config config;
  if (s.opt.k_given) config.depth = s.opt.k;
  sd::rest_proposer proposer(datastore, config);
  std::string const description = "REST, " + std::to_string(datastore->size()) +
                                  "-entry datastore, depth " + std::to_string(config.depth) + ", " +
                                  std::to_string(config.max_nodes) + " nodes";
  if (s.greedy())
    return run_speculative(s, proposer, sd::greedy_verifier{}, config.max_nodes, description,
                           "greedy");
  return run_speculative(s, proposer, sd::tree_verifier{}, config.max_nodes, description,
                         "tree (point masses)");
}

//! --strategy lookahead: a Jacobi window (auxiliary tokens) feeds an n-gram pool whose candidates
//! for the last token are verified as a tree, both in one forward.
inline run_output run_lookahead(session& s) {
  options const& o = s.opt;
  sd::lookahead_proposer proposer(
      {.window = o.lookahead_window, .ngram = o.lookahead_ngram, .guesses = o.lookahead_guesses});
  std::string const description = "lookahead, W = " + std::to_string(o.lookahead_window) +
                                  ", N = " + std::to_string(o.lookahead_ngram) +
                                  ", G = " + std::to_string(o.lookahead_guesses);
  std::size_t const nodes = std::max<std::size_t>(1, o.lookahead_guesses * (o.lookahead_ngram - 1));
  if (s.greedy())
    return run_speculative(s, proposer, sd::greedy_verifier{}, nodes, description, "greedy");
  return run_speculative(s, proposer, sd::tree_verifier{}, nodes, description,
                         "tree (point masses)");
}

//! --strategy jacobi: a block of k guesses refined by the target's own predictions (greedy).
inline run_output run_jacobi(session& s) {
  sd::jacobi_proposer proposer({.block = s.opt.k});
  return run_speculative(s, proposer, sd::greedy_verifier{}, s.opt.k,
                         "Jacobi, k = " + std::to_string(s.opt.k), "greedy");
}

//! One --strategy value.
struct strategy {
  std::string_view name;          //!< the --strategy value
  run_output (*run)(session& s);  //!< runs one request
};

//! Every strategy, in --help order.
inline constexpr strategy strategies[] = {
    {"autoregressive", run_autoregressive},
    {"draft", run_draft},
    {"prompt-lookup", run_prompt_lookup},
    {"layer-skip", run_layer_skip},
    {"rest", run_rest},
    {"lookahead", run_lookahead},
    {"jacobi", run_jacobi},
};

static_assert(std::size(strategies) == std::size(strategy_names),
              "every strategy needs a name in options.hpp and a row here");

//! The strategy called `name`; throws `usage_error` for an unknown one.
inline strategy const& find_strategy(std::string_view name) {
  for (strategy const& s : strategies)
    if (s.name == name) return s;
  throw usage_error("unknown strategy '" + std::string(name) + "'");
}

}  // namespace generate
