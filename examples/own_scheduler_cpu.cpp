// An engine with its own scheduler drives specdec's step itself, on the CPU backend.
//
//   example_own_scheduler_cpu [MODEL_DIR]
//
// MODEL_DIR holds stories260K.bin and tok512.bin (default: the SPECDEC_MODEL_DIR environment
// variable).
//
// `sequence_step` (specdec/decode/sequence.hpp) is the speculative step of one sequence, phase by
// phase; `speculative_decoder` and `batch_decoder` are two drivers over it. Here the engine is the
// driver: three requests, each with its own model instance (its own KV cache), its own proposer,
// seed and sampling policy, advance one step at a time in round-robin, interleaved as a scheduler
// of the engine's own would interleave them. Each phase is a call: the draft limit, the propose
// context, the draft checks, the target forward the engine runs itself, verification, and the
// commit (cache rollback, proposer update, token emission through the stop checks). The program
// checks that every request's tokens equal what `speculative_decoder` emits for it.

#include <specdec/backend/cpu/llama.hpp>  // cpu_llama: the CPU forward pass
#include <specdec/specdec.hpp>            // sequence_step, proposers, verifiers, policies

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sd = specdec;

namespace {

// One request as the engine holds it.
struct request {
  request(std::shared_ptr<sd::llama_weights const> const& weights, std::vector<sd::token_id> p,
          sd::sampler pol, sd::decode_config c)
      : target(weights, {.threads = 1}),
        proposer({.k = 4, .max_branches = 2}),
        prompt(std::move(p)),
        policy(std::move(pol)),
        config(std::move(c)) {}

  sd::cpu_llama target;                 // this request's model instance and KV cache
  sd::prompt_lookup_proposer proposer;  // drafts from n-gram matches in its own text
  std::vector<sd::token_id> prompt;
  sd::sampler policy;
  sd::decode_config config;
  sd::sequence_step<sd::prompt_lookup_proposer> step;
  sd::decode_result out;
  sd::forward_result rows;
};

// Starts `r`: the step begins, the prompt x_1..x_{t-1} is scored, the proposer starts.
void start(request& r) {
  std::size_t const budget = sd::node_budget(r.proposer, r.config);
  r.step.begin(r.prompt, r.config, budget, r.target.max_context(), r.out);
  if (r.step.prompt_rows() > 0) {
    r.target.forward(r.step.prefill_request(), r.rows);
    r.step.prefilled({});  // prompt lookup reads no hidden rows
  }
  r.proposer.begin(r.prompt);
}

// One speculative step of `r`; false when the request is over.
bool advance(request& r, sd::tree_verifier& verifier) {
  if (r.step.done()) return false;
  std::optional<std::size_t> const limit = r.step.draft_limit();  // nullopt: the context is full
  if (!limit) return false;
  sd::propose_context const ctx = r.step.context(*limit);
  r.proposer.propose(ctx, r.step.tree());
  r.step.check_draft(*limit);
  r.target.forward(r.step.request(), r.rows);  // the engine runs its model's forward
  sd::matrix_view<float const> const logits = r.rows.logits_view();
  r.step.verify(verifier, logits, r.policy);
  r.step.commit(r.target.cache(), logits, {}, [&] { r.proposer.accept(r.step.result()); });
  return !r.step.done();
}

sd::sampler policy_of(float temperature) {
  sd::sampling_params p;
  p.temperature = temperature;
  p.top_p = 0.95f;
  return sd::sampler(p);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    char const* env_dir = std::getenv("SPECDEC_MODEL_DIR");
    std::filesystem::path const model_dir = argc > 1 ? argv[1] : env_dir != nullptr ? env_dir : "";
    if (model_dir.empty()) {
      std::fprintf(stderr, "usage: %s MODEL_DIR (or set SPECDEC_MODEL_DIR)\n", argv[0]);
      return 2;
    }
    std::filesystem::path const target_path = model_dir / "stories260K.bin";
    auto const weights = std::make_shared<sd::llama_weights const>(sd::load_model(target_path));
    sd::tokenizer const tok = sd::load_tokenizer(target_path, model_dir / "tok512.bin");

    std::vector<std::unique_ptr<request>> requests;
    char const* const texts[] = {"Once upon a time", "The little dog", "Lily wanted to"};
    for (std::size_t i = 0; i < 3; ++i) {
      sd::decode_config config;
      config.max_new_tokens = 60;
      config.eos_tokens = tok.end_of_text();
      config.seed = 100 + i;
      requests.push_back(std::make_unique<request>(weights, tok.encode(texts[i], /*bos=*/true),
                                                   policy_of(i == 0 ? 0.0f : 0.8f), config));
    }

    // The engine's scheduler: start every request, then one step of each in turn.
    sd::tree_verifier verifier;
    for (auto& r : requests) start(*r);
    for (bool any = true; any;) {
      any = false;
      for (auto& r : requests) any = advance(*r, verifier) || any;
    }

    // Each request decoded by specdec's own single-sequence driver, for comparison.
    int status = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      request const& r = *requests[i];
      sd::cpu_llama target(weights, {.threads = 1});
      sd::prompt_lookup_proposer proposer({.k = 4, .max_branches = 2});
      sd::speculative_decoder decoder(target, proposer, sd::tree_verifier{}, r.policy, r.config);
      sd::decode_result const alone = decoder.generate(r.prompt);
      std::string text = texts[i];
      sd::token_id previous = r.prompt.back();
      for (sd::token_id t : r.out.tokens) {
        text += tok.decode(previous, t);
        previous = t;
      }
      bool const same = alone.tokens == r.out.tokens;
      std::printf("request %zu (%s): %zu tokens in %zu steps, %s as speculative_decoder\n  %s\n", i,
                  i == 0 ? "greedy" : "temperature 0.8", r.out.tokens.size(), r.out.stats.steps,
                  same ? "the same" : "NOT the same", text.c_str());
      if (!same) status = 1;
    }
    return status;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "example_own_scheduler_cpu: %s\n", e.what());
    return 1;
  }
}
