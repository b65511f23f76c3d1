// The runs of specdec-generate's strategies (declared in strategies.hpp, whose table names them):
// each builds its proposer and verifier and decodes one request. A translation unit of its own,
// compiled once for the program and the tests that read the table.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "generate/options.hpp"
#include "generate/strategies.hpp"

namespace generate {

run_output run_autoregressive(session& s) {
  sd::autoregressive_decoder decoder(s.target, s.policy, s.config);
  run_output out{{}, "autoregressive", "none"};
  decoder.generate(s.prompt, out.result, s.observer);
  return out;
}

run_output run_draft(session& s) {
  auto const weights = std::make_shared<sd::llama_weights const>(
      sd::load_model(*s.values.text(opt::draft_model), s.access));
  sd::cpu_llama_options options = s.model_options;
  if (s.values.given(opt::draft_threads)) {
    options.threads = static_cast<std::size_t>(s.values.count(opt::draft_threads));
    options.pool = nullptr;
  }
  if (s.values.given(opt::draft_context))
    options.max_context = static_cast<std::size_t>(s.values.count(opt::draft_context));
  lm draft = make_lm(s, weights, options);
  if (auto const bridge = draft_bridge(s.values, *s.tok, draft.vocab_size())) {
    // The draft's rows are in its own vocabulary: the plain sampler (the target's rows keep the
    // constraint).
    sd::cross_vocabulary_config const c = cross_config(s.values);
    std::string const description = cross_description(*bridge, c);
    if (c.mode == sd::vocab_mode::string) {
      sd::cross_vocabulary_proposer<lm, sd::sampler> proposer(draft, bridge, s.policy.policy(), c);
      return run_candidates(s, proposer, description);
    }
    return with_draft_mode(s, [&]<sd::draft_mode M>(std::integral_constant<sd::draft_mode, M>) {
      sd::cross_vocabulary_proposer<lm, sd::sampler, M> proposer(draft, bridge, s.policy.policy(),
                                                                 c);
      return run_speculative(s, proposer, chain_verifier<M>{}, description, chain_verifier_name<M>);
    });
  }
  sd::draft_model_config const chain = chain_config(s.values);
  return with_draft_mode(s, [&]<sd::draft_mode M>(std::integral_constant<sd::draft_mode, M>) {
    // The draft's rows under the same constrained policy: its drafts (and q rows) are masked.
    sd::draft_model_proposer<lm, cli_policy, M> proposer(draft, s.target, s.policy, chain);
    return run_speculative(s, proposer, chain_verifier<M>{},
                           "draft model, " + chain_description(chain), chain_verifier_name<M>);
  });
}

run_output run_layer_skip(session& s) {
  std::vector<std::int32_t> const layers = skip_layers_of(s.values, s.weights->config.n_layers);
  sd::draft_model_config const chain = layer_skip_chain(s.values);
  return with_draft_mode(s, [&]<sd::draft_mode M>(std::integral_constant<sd::draft_mode, M>) {
    sd::layer_skip_proposer<cli_policy, M> proposer({.skip_layers = layers, .draft = chain},
                                                    s.policy);
    return run_speculative(s, proposer, chain_verifier<M>{}, layer_skip_description(layers, chain),
                           chain_verifier_name<M>);
  });
}

run_output run_sparse_kv(session& s) {
  sd::sparse_kv_config const config = sparse_kv_config_of(s.values);
  return with_draft_mode(s, [&]<sd::draft_mode M>(std::integral_constant<sd::draft_mode, M>) {
    sd::sparse_kv_proposer<cli_policy, M> proposer(config, s.policy);
    return run_speculative(s, proposer, chain_verifier<M>{}, sparse_kv_description(config),
                           chain_verifier_name<M>);
  });
}

run_output run_prompt_lookup(session& s) {
  sd::prompt_lookup_config const c = lookup_config(s.values);
  sd::prompt_lookup_proposer proposer(c);
  return run_candidates(
      s, proposer,
      "prompt lookup, n-grams " + std::to_string(c.n_max) + ".." + std::to_string(c.n_min) +
          ", depth " + std::to_string(c.k) +
          (c.max_branches > 1 ? ", " + std::to_string(c.max_branches) + " branches" : ""));
}

run_output run_rest(session& s) {
  auto const datastore = load_datastore(s.values, s.target.vocab_size());
  sd::rest_config const c = rest_config_of(s.values);
  sd::rest_proposer proposer(datastore, c);
  return run_candidates(s, proposer,
                        "REST, " + std::to_string(datastore->size()) + "-entry datastore, depth " +
                            std::to_string(c.depth) + ", " + std::to_string(c.max_nodes) +
                            " nodes");
}

run_output run_suffix(session& s) {
  auto const cache = load_suffix_cache(s.values, s.target.vocab_size());
  sd::suffix_config const c = suffix_config_of(s.values);
  std::string const description = suffix_description(c, *cache);
  run_output out = [&] {
    sd::suffix_proposer proposer(cache, c);
    return run_candidates(s, proposer, description);
  }();
  save_suffix_cache(s.values, *cache, !s.values.flag(opt::json));
  return out;
}

run_output run_lookahead(session& s) {
  sd::lookahead_config const c = lookahead_config_of(s.values);
  sd::lookahead_proposer proposer(c);
  return run_candidates(s, proposer, "lookahead, " + lookahead_description(c));
}

run_output run_jacobi(session& s) {
  sd::jacobi_config const c = jacobi_config_of(s.values);
  sd::jacobi_proposer proposer(c);
  return run_speculative(s, proposer, sd::greedy_verifier{},
                         "Jacobi, k = " + std::to_string(c.block), "greedy");
}

run_output run_medusa(session& s) {
  std::filesystem::path const dir = heads_directory(s.values);
  auto const heads = std::make_shared<sd::medusa_weights const>(
      sd::load_medusa_heads(dir, s.weights->config, s.access));
  sd::cpu_medusa_heads runner(heads, {.threads = s.model_options.threads});
  std::string tree_text;
  sd::medusa_proposer proposer(
      runner,
      heads_tree(s, runner, dir, sd::measure_medusa_accuracy<sd::cpu_medusa_heads>, tree_text));
  return run_candidates(s, proposer,
                        "Medusa, " + std::to_string(runner.num_heads()) + " heads, " + tree_text);
}

run_output run_hydra(session& s) {
  std::filesystem::path const dir = heads_directory(s.values);
  auto const heads = std::make_shared<sd::hydra_weights const>(
      sd::load_hydra_heads(dir, s.weights->config, s.access));
  sd::cpu_hydra_heads runner(heads, s.weights, {.threads = s.model_options.threads});
  std::string tree_text;
  sd::hydra_proposer proposer(
      runner,
      heads_tree(s, runner, dir, sd::measure_hydra_accuracy<sd::cpu_hydra_heads>, tree_text));
  return run_candidates(s, proposer,
                        "Hydra, " + std::to_string(runner.num_heads()) + " heads, " + tree_text);
}

run_output run_eagle(session& s) {
  auto const head = load_eagle(s.values, s.weights, s.access);
  sd::cpu_eagle_head runner(head, {.threads = s.model_options.threads,
                                   .pool = s.model_options.pool,
                                   .max_context = s.target.max_context()});
  eagle_drafting const drafting = eagle_drafting_of(s.values, *head);
  auto proposer = drafting.make(runner);
  return run_candidates(s, proposer, drafting.description);
}

run_output run_pard(session& s) {
  auto const weights = std::make_shared<sd::llama_weights const>(
      sd::load_model(*s.values.text(opt::draft_model), s.access));
  sd::cpu_llama_options options = s.model_options;
  if (s.values.given(opt::draft_threads)) {
    options.threads = static_cast<std::size_t>(s.values.count(opt::draft_threads));
    options.pool = nullptr;
  }
  if (s.values.given(opt::draft_context))
    options.max_context = static_cast<std::size_t>(s.values.count(opt::draft_context));
  lm draft = make_lm(s, weights, options);
  sd::parallel_draft_config const c{
      .k = static_cast<std::size_t>(s.values.count(opt::chain_length)),
      .mask_token = static_cast<sd::token_id>(s.values.count(opt::mask_token))};
  std::string const description = "parallel draft model (PARD), k = " + std::to_string(c.k) +
                                  " from one forward, mask token " + std::to_string(c.mask_token);
  return with_draft_mode(s, [&]<sd::draft_mode M>(std::integral_constant<sd::draft_mode, M>) {
    // The draft's rows under the same constrained policy: its drafts (and q rows) are masked.
    sd::parallel_draft_proposer<lm, cli_policy, M> proposer(draft, s.target.vocab_size(), s.policy,
                                                            c);
    return run_speculative(s, proposer, chain_verifier<M>{}, description, chain_verifier_name<M>);
  });
}

namespace {

run_output run_block(session& s, bool dspark) {
  auto const drafter = load_block(s.values, s.weights, s.access, dspark);
  sd::cpu_block_drafter runner(drafter, {.threads = s.model_options.threads,
                                         .pool = s.model_options.pool,
                                         .max_context = s.target.max_context()});
  sd::block_config const c = block_config_of(s.values, dspark);
  bool const tree = s.values.given(opt::block_tree);
  std::string const description = block_description(*drafter, c, dspark, tree);
  if (tree) {  // DDTree: greedy candidates
    sd::block_proposer<sd::cpu_block_drafter, cli_policy, sd::draft_mode::greedy,
                       sd::block_shape::tree>
        proposer(runner, s.policy, c);
    return run_candidates(s, proposer, description);
  }
  return with_draft_mode(s, [&]<sd::draft_mode M>(std::integral_constant<sd::draft_mode, M>) {
    // The drafts' rows under the session's (constrained) policy: drafts and q rows are masked.
    sd::block_proposer<sd::cpu_block_drafter, cli_policy, M> proposer(runner, s.policy, c);
    return run_speculative(s, proposer, chain_verifier<M>{}, description, chain_verifier_name<M>);
  });
}

}  // namespace

run_output run_dflash(session& s) {
  return run_block(s, false);
}
run_output run_dspark(session& s) {
  return run_block(s, true);
}

}  // namespace generate
