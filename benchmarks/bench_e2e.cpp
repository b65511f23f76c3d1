// bench_e2e: end-to-end speculative decoding on the CPU, every figure against the autoregressive
// baseline measured in the same run.
//
// 1. The stories260K fixture: over the 14 prompts of tinystories_prompts.jsonl, 128 new tokens
//    each, greedy and temperature 1, each strategy (draft model, prompt lookup as a chain and as a
//    tree, layer skip, REST with a datastore of fixture-sampled text or of the 14 TinyStories
//    stories, lookahead W5 N4 G5, Jacobi k=4 greedy, Medusa and Hydra with the heads trained for
//    the fixture and their 32-node trees) and the autoregressive baseline, prompt by
//    prompt in turn: tokens/s of both, speedup, mean accepted length, mean tree size (+ auxiliary
//    tokens per step), and the library's own overhead -- all decode time not spent in model
//    forwards (target and draft, or the draft heads), as a share of the decode-step time. Forward
//    time is counted by `timed_lm`, an adapter around the model that satisfies causal_lm, and the
//    heads' time by `timed_heads`, one around a heads runner.
// 2. Controlled acceptance: a random-weight target of the stories110M shape (dim 768, hidden 2048,
//    12 layers, 12 heads, vocabulary 32000) and an oracle proposer that drafts the target's own
//    greedy continuation (computed once by the baseline run), corrupting each drafted token with
//    probability 1 - a, so that each draft token is accepted with probability a given its
//    predecessors were; a = 0.5, 0.7, 0.9, k = 4, greedy. Baseline and speculative runs alternate
//    (SPECDEC_BENCH_REPS pairs). Per pair, the measured speedup (ratio of the decode rates) is
//    set against the speedup predicted from the costs measured in the same two runs:
//    E[accepted + 1] x T_autoregressive / (T_draft + T_verify), with T_autoregressive the
//    baseline's forward time per token, T_verify the speculative run's scoring-forward time per
//    step, T_draft its propose time per step and E[accepted + 1] its mean accepted length; the
//    table shows medians over the pairs. Everything the library does besides forwards (verify,
//    commit, bookkeeping on both sides) shows up as measured < predicted. A second prediction
//    uses forwards over 1 and k + 1 tokens timed on their own, alternating, away from the runs.
// 3. Draft heads at the stories110M shape: random-weight Medusa heads (4 heads; 1 block, as the
//    reference publishes them, and 4 as the fixture's) and Hydra heads (4 heads, 4 blocks) of the
//    target's dim and vocabulary, each drafting the fixture heads' 32-node tree. Timed on their
//    own, alternating, medians of 15 in the middle of a sequence: one decode step (a forward over
//    the root alone: the yardstick), the scoring forward of the tree (root + 32 nodes with the
//    tree mask), and the proposer's step (the heads on the hidden row and the ranking). Cost ratio
//    = (scoring + proposing) / decode step; predicted speedup = the mean accepted length measured
//    on the fixture with the trained heads (greedy, 14 prompts x 128 tokens) x decode step /
//    (scoring + proposing).
//
// 4. EAGLE heads at the stories110M shape: random-weight heads of that shape (EAGLE-1 drafting
//    through the target's classifier, EAGLE-3 over a draft vocabulary of 8192 of the 32000 tokens)
//    drafting dynamic trees of several depths and widths, timed as the heads in 3; the drafting
//    cost per step (the proposer's step: 3 pairs appended and the tree drafted) / one decode step,
//    and the predicted speedup from the fixture heads' acceptance with the same tree.
//    The fixture rows of 1 include EAGLE-2 (the EAGLE-1 head) and EAGLE-3 with the trained heads
//    (tools/eagle) and their 32-node dynamic trees. EAGLE-3 chains of 7 (D7 K1) are the yardstick
//    of the block drafters (5).
// 5. Block drafters at the stories110M shape: random-weight DFlash and DSpark drafters of the
//    fixture drafter's depth (2 layers, blocks of 8) drafting a chain of 7 in one block forward,
//    or DDTree's tree of 32 nodes, timed as in 4; the acceptance is the trained fixture
//    drafter's (tools/block).
//
// After the benchmarks a summary table is printed with the bars: library overhead <= 5% of step
// time, measured speedup within 10% of the prediction, speedup >= 2.5x at acceptance 0.9, the
// Medusa tree's cost <= 1.3 decode steps at the stories110M shape.
//
// Environment: SPECDEC_MODEL_DIR, SPECDEC_DATA_DIR (default ../shared/{models,data} next to the
// repository), SPECDEC_BENCH_THREADS (threads of the stories110M-shape model; default: all
// cores), SPECDEC_BENCH_TOKENS (new tokens per controlled run; default 128), SPECDEC_BENCH_REPS
// (controlled baseline / speculative run pairs; default 3).
//
// Run (Release): build/<dir>/benchmarks/bench_e2e
//   [--benchmark_filter=fixture|controlled|heads|eagle|block]

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "e2e_support.hpp"
#include "jsonl.hpp"
#include "specdec/backend/cpu/block_drafter.hpp"
#include "specdec/backend/cpu/eagle.hpp"
#include "specdec/backend/cpu/heads.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/decode/autoregressive.hpp"
#include "specdec/decode/speculation.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/block_drafter.hpp"
#include "specdec/model/block_drafter_file.hpp"
#include "specdec/model/eagle.hpp"
#include "specdec/model/eagle_file.hpp"
#include "specdec/model/heads.hpp"
#include "specdec/model/heads_file.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/tokenizer.hpp"
#include "specdec/propose/block.hpp"
#include "specdec/propose/draft_model.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/propose/hydra.hpp"
#include "specdec/propose/jacobi.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/propose/lookahead.hpp"
#include "specdec/propose/medusa.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "specdec/propose/rest.hpp"
#include "specdec/propose/sparse_tree.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"

namespace sd = specdec;
namespace fs = std::filesystem;

namespace {

using bench::bench_threads;
using bench::env_count;
using bench::median;
using bench::oracle_proposer;
using bench::require;
using bench::seconds_of;
using bench::shared_dir;
using bench::stories110m;

// ---------------------------------------------------------------------------------------------
// Forward timing.

//! The instrument of `timed_lm`: a tick counter read twice per forward. On x86 it is the
//! time-stamp counter (about 10 ns a read on the 2-core test machine, a steady_clock read about
//! 22 ns): about one read per forward falls outside the forward's timed interval and would count
//! as library overhead, so the cheaper instrument perturbs the measurement less. Ticks become
//! seconds at the rate measured against steady_clock from the program's start to the conversion
//! (seconds of benchmark, so the rate is exact to a few parts per million).
struct tick_clock {
  //! The decoders' tick counter (`detail::tick_count`: the time-stamp counter on x86).
  [[nodiscard]] static std::uint64_t now() noexcept { return sd::detail::tick_count(); }
  //! Seconds per tick, calibrated from the program's start to now (at least 10 ms).
  [[nodiscard]] static double seconds_per_tick() {
    static std::uint64_t const ticks0 = now();
    static auto const time0 = std::chrono::steady_clock::now();
    for (;;) {
      std::uint64_t const ticks = now();
      double const elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - time0).count();
      if (elapsed >= 0.01 && ticks > ticks0) return elapsed / static_cast<double>(ticks - ticks0);
    }
  }
};
// The calibration starts before main.
[[maybe_unused]] double const tick_calibration_start = tick_clock::seconds_per_tick();

//! Time a model spent in forwards, in ticks of `tick_clock`.
struct forward_clock {
  std::uint64_t ticks = 0;             //!< all forwards
  std::uint64_t from_empty_ticks = 0;  //!< forwards made with an empty cache (the target's prefill)
  std::size_t calls = 0;
};

//! A causal_lm that forwards to the Model it owns and times every forward.
template <class Model>
class timed_lm {
 public:
  static constexpr bool supports_skip_layers = sd::supports_skip_layers_v<Model>;  //!< as Model

  //! Builds the owned model from `args`.
  template <class... Args>
  requires std::constructible_from<Model, Args&&...>
  explicit timed_lm(Args&&... args) : model_(std::forward<Args>(args)...) {}

  [[nodiscard]] std::size_t vocab_size() const noexcept { return model_.vocab_size(); }
  [[nodiscard]] std::size_t max_context() const noexcept { return model_.max_context(); }
  [[nodiscard]] std::size_t hidden_size() const noexcept { return model_.hidden_size(); }
  [[nodiscard]] decltype(auto) cache() noexcept { return model_.cache(); }
  [[nodiscard]] decltype(auto) cache() const noexcept { return model_.cache(); }

  //! The owned model's forward, timed.
  void forward(sd::forward_request const& req, sd::forward_result& out) {
    bool const empty = model_.cache().size() == 0;
    std::uint64_t const t0 = tick_clock::now();
    model_.forward(req, out);
    std::uint64_t const t = tick_clock::now() - t0;
    clock_.ticks += t;
    if (empty) clock_.from_empty_ticks += t;
    ++clock_.calls;
  }

  [[nodiscard]] forward_clock const& clock() const noexcept { return clock_; }
  [[nodiscard]] Model& model() noexcept { return model_; }

 private:
  Model model_;
  forward_clock clock_;
};

using timed_cpu = timed_lm<sd::cpu_llama>;
static_assert(sd::causal_lm<timed_cpu>);

//! A heads runner (Medusa or Hydra) that forwards to the Runner it owns and times every run: the
//! draft heads' share of a step, as `timed_lm` times a draft model's forwards.
template <class Runner>
class timed_heads {
 public:
  //! Builds the owned runner from `args`.
  template <class... Args>
  explicit timed_heads(Args&&... args) : runner_(std::forward<Args>(args)...) {}

  [[nodiscard]] std::size_t num_heads() const noexcept { return runner_.num_heads(); }
  [[nodiscard]] std::size_t hidden_size() const noexcept { return runner_.hidden_size(); }
  [[nodiscard]] std::size_t vocab_size() const noexcept { return runner_.vocab_size(); }

  //! The owned runner's run, timed.
  template <class... Args>
  void run(Args&&... args) {
    std::uint64_t const t0 = tick_clock::now();
    runner_.run(std::forward<Args>(args)...);
    clock_.ticks += tick_clock::now() - t0;
    ++clock_.calls;
  }

  [[nodiscard]] forward_clock const& clock() const noexcept { return clock_; }

 private:
  Runner runner_;
  forward_clock clock_;
};
static_assert(sd::medusa_heads_runner<timed_heads<sd::cpu_medusa_heads>>);
static_assert(sd::hydra_heads_runner<timed_heads<sd::cpu_hydra_heads>>);

//! An EAGLE head runner that forwards to the `cpu_eagle_head` it owns and times every forward and
//! logits call: the head's share of a step.
class timed_eagle {
 public:
  //! Builds the owned runner from `args`.
  template <class... Args>
  explicit timed_eagle(Args&&... args) : runner_(std::forward<Args>(args)...) {}

  [[nodiscard]] std::size_t hidden_size() const noexcept { return runner_.hidden_size(); }
  [[nodiscard]] std::size_t feature_width() const noexcept { return runner_.feature_width(); }
  [[nodiscard]] std::size_t vocab_size() const noexcept { return runner_.vocab_size(); }
  [[nodiscard]] std::size_t draft_vocab_size() const noexcept { return runner_.draft_vocab_size(); }
  [[nodiscard]] std::span<sd::token_id const> draft_to_target() const noexcept {
    return runner_.draft_to_target();
  }
  [[nodiscard]] std::span<std::int32_t const> target_layers() const noexcept {
    return runner_.target_layers();
  }
  [[nodiscard]] std::size_t max_context() const noexcept { return runner_.max_context(); }
  [[nodiscard]] sd::contiguous_cache& cache() noexcept { return runner_.cache(); }

  //! The owned runner's forward, timed.
  void forward(sd::eagle_batch const& batch, sd::matrix_view<float> out) {
    std::uint64_t const t0 = tick_clock::now();
    runner_.forward(batch, out);
    clock_.ticks += tick_clock::now() - t0;
    ++clock_.calls;
  }
  //! The owned runner's logits, timed.
  void logits(sd::matrix_view<float const> hidden, sd::matrix_view<float> out) {
    std::uint64_t const t0 = tick_clock::now();
    runner_.logits(hidden, out);
    clock_.ticks += tick_clock::now() - t0;
  }

  [[nodiscard]] forward_clock const& clock() const noexcept { return clock_; }

 private:
  sd::cpu_eagle_head runner_;
  forward_clock clock_;
};
static_assert(sd::eagle_head_runner<timed_eagle>);

// ---------------------------------------------------------------------------------------------
// Inputs.

//! The fixture: weights, tokenizer, the encoded prompts, and the trained draft when present.
struct fixture {
  std::shared_ptr<sd::llama_weights const> weights;
  std::shared_ptr<sd::llama_weights const> draft;  //!< tools/draft/stories_draft.bin, or null
  std::vector<std::vector<sd::token_id>> prompts;

  static fixture const& get() {
    static fixture const f = [] {
      fixture x;
      x.weights = bench::stories260k();
      fs::path const draft_file =
          fs::path(__FILE__).parent_path().parent_path() / "tools" / "draft" / "stories_draft.bin";
      if (fs::exists(draft_file))
        x.draft = std::make_shared<sd::llama_weights const>(sd::load_model(draft_file));
      x.prompts = bench::fixture_prompts();
      if (x.prompts.size() != 14) {
        std::fprintf(stderr, "bench_e2e: expected 14 prompts, read %zu\n", x.prompts.size());
        std::exit(1);
      }
      return x;
    }();
    return f;
  }
};

// ---------------------------------------------------------------------------------------------
// Accumulated results.

//! Sums over requests of one decoder.
struct totals {
  std::size_t generated = 0, steps = 0, drafted = 0, accepted = 0;
  std::size_t aux_tokens = 0;    //!< auxiliary tokens scored beside the trees (lookahead)
  double seconds = 0.0;          //!< wall time, prefill included
  double decode_seconds = 0.0;   //!< wall time after the prefill
  double forward_seconds = 0.0;  //!< model forward time after the prefill (target + draft)

  void add(sd::request_stats const& s, double forwards) {
    generated += s.generated;
    steps += s.steps;
    drafted += s.drafted;
    accepted += s.accepted;
    aux_tokens += s.aux_tokens;
    seconds += s.total_seconds;
    decode_seconds += s.total_seconds - s.prefill_seconds;
    forward_seconds += forwards;
  }
  [[nodiscard]] double tokens_per_second() const {
    return seconds > 0 ? static_cast<double>(generated) / seconds : 0.0;
  }
  [[nodiscard]] double decode_tokens_per_second() const {
    return decode_seconds > 0 ? static_cast<double>(generated) / decode_seconds : 0.0;
  }
  [[nodiscard]] double mean_accepted_length() const {
    return steps > 0 ? static_cast<double>(accepted + steps) / static_cast<double>(steps) : 0.0;
  }
  //! Share of the decode time not spent in model forwards.
  [[nodiscard]] double overhead() const {
    return decode_seconds > 0 ? std::max(0.0, decode_seconds - forward_seconds) / decode_seconds
                              : 0.0;
  }
};

//! One row of the summary table.
struct fixture_row {
  std::string name;
  totals spec, base;
};
struct controlled_row {
  double acceptance = 0.0;
  double expected_length = 0.0;  //!< (1 - a^(k+1)) / (1 - a)
  totals spec, base;
  std::size_t reps = 0;  //!< baseline / speculative run pairs
  // Medians over the pairs; the costs are the forwards timed in the pair's own runs.
  double t_ar = 0.0;      //!< baseline forward time per token
  double t_verify = 0.0;  //!< speculative scoring forward time per step
  double t_draft = 0.0;   //!< speculative propose time per step
  double measured = 0.0, predicted = 0.0, ratio = 0.0;
  // Costs timed on their own (alternating forwards over 1 and k + 1 tokens), and the prediction
  // they give with the measured mean accepted length.
  double iso_ar = 0.0, iso_verify = 0.0, iso_draft = 0.0, iso_predicted = 0.0;
};
std::vector<fixture_row> fixture_rows;
std::vector<controlled_row> controlled_rows;

//! Forward time of a request after its prefill: the target's minus its empty-cache forwards,
//! plus every forward of the draft.
double step_forwards(forward_clock const& target_before, forward_clock const& target_after,
                     forward_clock const* draft_before, forward_clock const* draft_after) {
  std::uint64_t t = (target_after.ticks - target_before.ticks) -
                    (target_after.from_empty_ticks - target_before.from_empty_ticks);
  if (draft_before != nullptr) t += draft_after->ticks - draft_before->ticks;
  return static_cast<double>(t) * tick_clock::seconds_per_tick();
}

void set_counters(benchmark::State& state, totals const& spec, totals const& base) {
  state.counters["tok_per_s"] = spec.tokens_per_second();
  state.counters["base_tok_per_s"] = base.tokens_per_second();
  state.counters["speedup"] =
      base.tokens_per_second() > 0 ? spec.tokens_per_second() / base.tokens_per_second() : 0.0;
  state.counters["mean_acc_len"] = spec.mean_accepted_length();
  state.counters["acc_rate"] =
      spec.drafted > 0 ? static_cast<double>(spec.accepted) / static_cast<double>(spec.drafted)
                       : 0.0;
  state.counters["overhead_pct"] = 100.0 * spec.overhead();
  state.counters["tree"] =
      spec.steps > 0 ? static_cast<double>(spec.drafted) / static_cast<double>(spec.steps) : 0.0;
  state.counters["aux_per_step"] =
      spec.steps > 0 ? static_cast<double>(spec.aux_tokens) / static_cast<double>(spec.steps) : 0.0;
  state.counters["base_overhead_pct"] = 100.0 * base.overhead();
}

// ---------------------------------------------------------------------------------------------
// 1. The fixture.

constexpr std::size_t fixture_tokens = 128;
constexpr std::size_t fixture_k = 4;

sd::sampler make_policy(bool greedy) {
  sd::sampling_params p;
  p.temperature = greedy ? 0.0f : 1.0f;
  return sd::sampler(p);
}

sd::decode_config fixture_config(std::size_t max_draft_nodes) {
  sd::decode_config c;
  c.max_new_tokens = fixture_tokens;
  c.max_draft_nodes = max_draft_nodes;
  return c;  // no EOS: every request generates exactly fixture_tokens
}

//! Runs every prompt through the baseline and through `decoder` in turn, `state` iterations.
template <class Decoder>
void run_fixture(benchmark::State& state, std::string const& name, timed_cpu& target,
                 Decoder& decoder, forward_clock const* draft_clock, bool greedy) {
  fixture const& f = fixture::get();
  sd::autoregressive_decoder baseline(target, make_policy(greedy), fixture_config(0));
  totals spec, base;
  sd::decode_result r;
  for (auto _ : state) {
    for (std::size_t i = 0; i < f.prompts.size(); ++i) {
      baseline.config().seed = i;
      decoder.config().seed = i;
      forward_clock t0 = target.clock();
      baseline.generate(f.prompts[i], r);
      base.add(r.stats, step_forwards(t0, target.clock(), nullptr, nullptr));
      t0 = target.clock();
      forward_clock const d0 = draft_clock != nullptr ? *draft_clock : forward_clock{};
      decoder.generate(f.prompts[i], r);
      spec.add(r.stats,
               step_forwards(t0, target.clock(), draft_clock ? &d0 : nullptr, draft_clock));
    }
  }
  set_counters(state, spec, base);
  fixture_rows.push_back({name, spec, base});
}

//! `run_fixture` for a proposer of deterministic tree candidates: verified by the greedy verifier
//! under greedy decoding, by the tree verifier under sampling; drafts of at most `nodes` nodes.
template <class Proposer>
void run_tree_fixture(benchmark::State& state, std::string const& name, timed_cpu& target,
                      Proposer& proposer, std::size_t nodes, bool greedy,
                      forward_clock const* draft_clock = nullptr) {
  if (greedy) {
    sd::speculative_decoder decoder(target, proposer, sd::greedy_verifier{}, make_policy(true),
                                    fixture_config(nodes));
    run_fixture(state, name, target, decoder, draft_clock, true);
  } else {
    sd::speculative_decoder decoder(target, proposer, sd::tree_verifier{}, make_policy(false),
                                    fixture_config(nodes));
    run_fixture(state, name, target, decoder, draft_clock, false);
  }
}

sd::cpu_llama_options one_thread() {
  return {.threads = 1};
}

template <sd::draft_mode M>
using chain_verifier = std::conditional_t<M == sd::draft_mode::greedy, sd::greedy_verifier,
                                          sd::speculative_sampling_verifier>;

template <sd::draft_mode M>
void bench_draft(benchmark::State& state) {
  fixture const& f = fixture::get();
  if (f.draft == nullptr) {
    state.SkipWithError("tools/draft/stories_draft.bin not found");
    return;
  }
  constexpr bool greedy = M == sd::draft_mode::greedy;
  timed_cpu target(f.weights, one_thread());
  timed_cpu draft(f.draft, one_thread());
  sd::draft_model_proposer<timed_cpu, sd::sampler, M> proposer(draft, target, make_policy(greedy),
                                                               {.k = fixture_k});
  sd::speculative_decoder decoder(target, proposer, chain_verifier<M>{}, make_policy(greedy),
                                  fixture_config(fixture_k));
  run_fixture(state, std::string("draft model k=4, ") + (greedy ? "greedy" : "temp 1"), target,
              decoder, &draft.clock(), greedy);
}

//! A decoder of `proposer` with the adaptive speculation policy (at most fixture_k draft tokens a
//! step), its forward costs measured before the timed runs.
template <class Proposer, class Verifier>
auto adaptive_decoder(timed_cpu& target, Proposer& proposer, Verifier verifier, bool greedy) {
  using decoder_type =
      sd::speculative_decoder<timed_cpu, Proposer, Verifier, sd::sampler, sd::adaptive_speculation>;
  auto d = std::make_unique<decoder_type>(target, proposer, std::move(verifier),
                                          make_policy(greedy), fixture_config(fixture_k),
                                          sd::adaptive_speculation({.max_k = fixture_k}));
  d->speculation().prepare(target);
  return d;
}

//! The draft model and prompt lookup (chains) with draft lengths chosen per step
//! (`adaptive_speculation`), greedy: on the compute-bound fixture they should draft little or
//! nothing and run at the autoregressive rate.
void bench_draft_adaptive(benchmark::State& state) {
  fixture const& f = fixture::get();
  if (f.draft == nullptr) {
    state.SkipWithError("tools/draft/stories_draft.bin not found");
    return;
  }
  timed_cpu target(f.weights, one_thread());
  timed_cpu draft(f.draft, one_thread());
  sd::draft_model_proposer<timed_cpu, sd::sampler, sd::draft_mode::greedy> proposer(
      draft, target, make_policy(true), {.k = fixture_k});
  auto decoder = adaptive_decoder(target, proposer, sd::greedy_verifier{}, true);
  run_fixture(state, "draft model k<=4, adaptive, greedy", target, *decoder, &draft.clock(), true);
}

void bench_prompt_lookup_adaptive(benchmark::State& state) {
  fixture const& f = fixture::get();
  timed_cpu target(f.weights, one_thread());
  sd::prompt_lookup_proposer proposer({.n_max = 3, .n_min = 1, .k = fixture_k});
  auto decoder = adaptive_decoder(target, proposer, sd::greedy_verifier{}, true);
  run_fixture(state, "prompt lookup chain k<=4, adaptive, greedy", target, *decoder, nullptr, true);
}

template <sd::draft_mode M>
void bench_layer_skip(benchmark::State& state) {
  fixture const& f = fixture::get();
  constexpr bool greedy = M == sd::draft_mode::greedy;
  timed_cpu target(f.weights, one_thread());
  sd::layer_skip_proposer<sd::sampler, M> proposer({.skip_layers = {2}, .draft = {.k = fixture_k}},
                                                   make_policy(greedy));
  sd::speculative_decoder decoder(target, proposer, chain_verifier<M>{}, make_policy(greedy),
                                  fixture_config(fixture_k));
  // The drafts are forwards of the target itself: its clock counts them.
  run_fixture(state, std::string("layer skip {2} k=4, ") + (greedy ? "greedy" : "temp 1"), target,
              decoder, nullptr, greedy);
}

void bench_prompt_lookup(benchmark::State& state, std::size_t branches, bool greedy) {
  fixture const& f = fixture::get();
  timed_cpu target(f.weights, one_thread());
  sd::prompt_lookup_proposer proposer(
      {.n_max = 3, .n_min = 1, .k = fixture_k, .max_branches = branches});
  std::string const name = std::string("prompt lookup ") +
                           (branches > 1 ? "tree x" + std::to_string(branches) : "chain") +
                           " k=4, " + (greedy ? "greedy" : "temp 1");
  run_tree_fixture(state, name, target, proposer, fixture_k * branches, greedy);
}

//! The fixture's REST datastores: 0 = 200 stories of 256 tokens sampled from the fixture itself
//! (temperature 1, top-p 0.9, seeds 1..200, after BOS); 1 = the 14 TinyStories stories of
//! tinystories_prompts.jsonl (their "story" field, which begins with the prompt).
std::shared_ptr<sd::rest_datastore const> rest_datastore(int source) {
  static std::shared_ptr<sd::rest_datastore const> cache[2];
  if (cache[source]) return cache[source];
  fixture const& f = fixture::get();
  sd::rest_datastore_builder b(static_cast<std::size_t>(f.weights->config.vocab_size));
  if (source == 0) {
    sd::cpu_llama model(f.weights, one_thread());
    sd::sampling_params p;
    p.temperature = 1.0f;
    p.top_p = 0.9f;
    sd::decode_config c;
    c.max_new_tokens = 256;
    sd::autoregressive_decoder ar(model, sd::sampler(p), c);
    std::vector<sd::token_id> const bos{1};
    for (std::uint64_t seed = 1; seed <= 200; ++seed) {
      ar.config().seed = seed;
      b.add(ar.generate(bos).tokens);
    }
  } else {
    for (std::string const& text : bench::jsonl_strings(
             require(shared_dir("SPECDEC_DATA_DIR", "data") / "tinystories_prompts.jsonl"),
             "story"))
      b.add(bench::tok512().encode(text, false));
  }
  cache[source] = std::make_shared<sd::rest_datastore const>(b.build());
  return cache[source];
}

void bench_rest(benchmark::State& state, int source, bool greedy) {
  fixture const& f = fixture::get();
  auto const ds = rest_datastore(source);
  timed_cpu target(f.weights, one_thread());
  sd::rest_proposer proposer(ds);  // n_max 16, 128 occurrences, depth 8, 32 nodes
  std::string const name = std::string("REST ") + (source == 0 ? "fixture text" : "stories") +
                           " (" + std::to_string(ds->size() / 1000) + "k), " +
                           (greedy ? "greedy" : "temp 1");
  std::size_t const nodes = proposer.config().max_nodes;
  run_tree_fixture(state, name, target, proposer, nodes, greedy);
}

void bench_lookahead(benchmark::State& state, bool greedy) {
  fixture const& f = fixture::get();
  timed_cpu target(f.weights, one_thread());
  sd::lookahead_config const config{.window = 5, .ngram = 4, .guesses = 5};
  sd::lookahead_proposer proposer(config);
  std::string const name = std::string("lookahead W5 N4 G5, ") + (greedy ? "greedy" : "temp 1");
  std::size_t const nodes = config.guesses * (config.ngram - 1);
  run_tree_fixture(state, name, target, proposer, nodes, greedy);
}

void bench_jacobi(benchmark::State& state) {
  fixture const& f = fixture::get();
  timed_cpu target(f.weights, one_thread());
  sd::jacobi_proposer proposer({.block = fixture_k});
  sd::speculative_decoder decoder(target, proposer, sd::greedy_verifier{}, make_policy(true),
                                  fixture_config(fixture_k));
  run_fixture(state, "Jacobi k=4, greedy", target, decoder, nullptr, true);
}

//! tools/heads/<kind> next to the benchmarks (the heads trained for the fixture).
fs::path heads_dir(char const* kind) {
  return fs::path(__FILE__).parent_path().parent_path() / "tools" / "heads" / kind;
}

//! The committed 32-node sparse tree of `kind`.
sd::sparse_tree heads_tree(char const* kind) {
  return sd::sparse_tree::from_choices(sd::read_tree_choices(heads_dir(kind) / "tree.json"));
}

void bench_medusa(benchmark::State& state, bool greedy) {
  fixture const& f = fixture::get();
  timed_cpu target(f.weights, one_thread());
  timed_heads<sd::cpu_medusa_heads> heads(std::make_shared<sd::medusa_weights const>(
      sd::load_medusa_heads(heads_dir("medusa"), f.weights->config)));
  sd::medusa_proposer proposer(heads, heads_tree("medusa"));
  run_tree_fixture(state, std::string("Medusa tree 32, ") + (greedy ? "greedy" : "temp 1"), target,
                   proposer, proposer.max_nodes(), greedy, &heads.clock());
}

void bench_hydra(benchmark::State& state, bool greedy) {
  fixture const& f = fixture::get();
  timed_cpu target(f.weights, one_thread());
  timed_heads<sd::cpu_hydra_heads> heads(
      std::make_shared<sd::hydra_weights const>(
          sd::load_hydra_heads(heads_dir("hydra"), f.weights->config)),
      f.weights);
  sd::hydra_proposer proposer(heads, heads_tree("hydra"));
  run_tree_fixture(state, std::string("Hydra tree 32, ") + (greedy ? "greedy" : "temp 1"), target,
                   proposer, proposer.max_nodes(), greedy, &heads.clock());
}

//! tools/eagle/<kind> next to the benchmarks (the EAGLE heads trained for the fixture).
fs::path eagle_dir(char const* kind) {
  return fs::path(__FILE__).parent_path().parent_path() / "tools" / "eagle" / kind;
}

//! The EAGLE-2 dynamic tree of the fixture rows: depth 8, top-6 expansions, 32 nodes (the
//! training run's best of its grid, tools/eagle/README.md).
constexpr sd::eagle_tree_config eagle_fixture_tree{.depth = 8, .top_k = 6, .nodes = 32};

void bench_eagle(benchmark::State& state, char const* kind, bool greedy) {
  fixture const& f = fixture::get();
  timed_cpu target(f.weights, one_thread());
  timed_eagle head(
      std::make_shared<sd::eagle_weights const>(sd::load_eagle_head(eagle_dir(kind), f.weights)));
  sd::eagle_proposer proposer(head, eagle_fixture_tree);
  run_tree_fixture(state,
                   std::string(kind[5] == '1' ? "EAGLE-2 (EAGLE-1 head)" : "EAGLE-3") +
                       " tree 32, " + (greedy ? "greedy" : "temp 1"),
                   target, proposer, proposer.max_nodes(), greedy, &head.clock());
}

// ---------------------------------------------------------------------------------------------
// 2. Controlled acceptance.

constexpr std::size_t controlled_k = 4;

void bench_controlled(benchmark::State& state, double acceptance) {
  std::size_t const new_tokens = env_count("SPECDEC_BENCH_TOKENS", 128);
  std::size_t const reps = env_count("SPECDEC_BENCH_REPS", 3);
  timed_cpu target(stories110m(), sd::cpu_llama_options{.threads = bench_threads()});
  std::vector<sd::token_id> const prompt = fixture::get().prompts[0];
  sd::decode_config config;
  config.max_new_tokens = new_tokens;
  config.max_draft_nodes = controlled_k;
  sd::autoregressive_decoder baseline(target, sd::greedy{}, config);
  controlled_row row;
  row.acceptance = acceptance;
  row.expected_length = (1.0 - std::pow(acceptance, controlled_k + 1)) / (1.0 - acceptance);
  sd::decode_result r;
  auto const decode_rate = [](sd::request_stats const& st) {
    return static_cast<double>(st.generated) / (st.total_seconds - st.prefill_seconds);
  };
  for (auto _ : state) {
    // Baseline and speculative runs alternate. Per pair: the measured speedup (the ratio of the
    // decode rates) and the prediction from the forwards timed in the same two runs; medians
    // over the pairs cancel most of a shared machine's drift.
    std::vector<sd::token_id> sequence;
    std::vector<double> measured, predicted, ratios, t_ar, t_verify, t_draft;
    for (std::size_t rep = 0; rep < reps; ++rep) {
      forward_clock t0 = target.clock();
      baseline.generate(prompt, r);
      double const base_forwards = step_forwards(t0, target.clock(), nullptr, nullptr);
      row.base.add(r.stats, base_forwards);
      double const base_rate = decode_rate(r.stats);
      t_ar.push_back(base_forwards / static_cast<double>(r.stats.steps));
      if (rep == 0) {  // the oracle's continuation: the greedy baseline's output
        sequence = prompt;
        sequence.insert(sequence.end(), r.tokens.begin(), r.tokens.end());
      }
      oracle_proposer oracle(sequence, controlled_k, acceptance, target.vocab_size(), 2024 + rep);
      sd::speculative_decoder decoder(target, oracle, sd::greedy_verifier{}, sd::greedy{}, config);
      t0 = target.clock();
      decoder.generate(prompt, r);
      double const spec_forwards = step_forwards(t0, target.clock(), nullptr, nullptr);
      row.spec.add(r.stats, spec_forwards);
      auto const steps = static_cast<double>(r.stats.steps);
      t_verify.push_back(spec_forwards / steps);
      t_draft.push_back(r.stats.propose_seconds / steps);
      measured.push_back(decode_rate(r.stats) / base_rate);
      predicted.push_back(r.stats.mean_accepted_length() * t_ar.back() /
                          (t_draft.back() + t_verify.back()));
      ratios.push_back(measured.back() / predicted.back());
      if (std::vector<sd::token_id>(sequence.begin() + static_cast<long>(prompt.size()),
                                    sequence.end()) != r.tokens)
        state.SkipWithError("speculative output differs from the greedy baseline");
    }
    row.measured = median(measured);
    row.predicted = median(predicted);
    row.ratio = median(ratios);
    row.t_ar = median(t_ar);
    row.t_verify = median(t_verify);
    row.t_draft = median(t_draft);

    // Costs measured on their own, in the middle of the sequence: a target forward over the
    // root alone (T_ar) and over the root + k drafted tokens (T_verify), alternately; the
    // oracle's propose (T_draft).
    std::size_t const base = prompt.size() + new_tokens / 2;
    auto& model = target.model();
    model.cache().truncate(0);
    std::vector<sd::position_t> positions(base - 1);
    for (std::size_t i = 0; i < positions.size(); ++i)
      positions[i] = static_cast<sd::position_t>(i);
    sd::forward_result out;
    model.forward(
        {.tokens = std::span<sd::token_id const>(sequence).first(base - 1), .positions = positions},
        out);
    sd::draft_tree tree = sd::draft_tree::chain(
        sequence[base - 1], std::span<sd::token_id const>(sequence).subspan(base, controlled_k));
    std::vector<sd::position_t> chain_positions(controlled_k + 1);
    for (std::size_t i = 0; i <= controlled_k; ++i)
      chain_positions[i] = static_cast<sd::position_t>(base - 1 + i);
    sd::forward_request const verify_req{.tokens = tree.tokens(),
                                         .positions = chain_positions,
                                         .mask = tree.mask(),
                                         .mask_stride = tree.mask_stride()};
    sd::forward_request const single_req{.tokens = tree.tokens().first(1),
                                         .positions = std::span(chain_positions).first(1)};
    std::vector<double> t_single, t_iso_verify;
    for (int i = 0; i < 15; ++i) {
      t_single.push_back(seconds_of([&] {
        model.forward(single_req, out);
        (void)sd::greedy{}.greedy_token(out.logits_view().at_row(0), sequence);
      }));
      model.cache().truncate(base - 1);
      t_iso_verify.push_back(seconds_of([&] { model.forward(verify_req, out); }));
      model.cache().truncate(base - 1);
    }
    row.iso_ar = median(t_single);
    row.iso_verify = median(t_iso_verify);
    sd::philox rng(1, 0, 0);
    sd::propose_context ctx;
    ctx.tokens = std::span<sd::token_id const>(sequence).first(base);
    ctx.max_nodes = controlled_k;
    ctx.rng = &rng;
    oracle_proposer oracle(sequence, controlled_k, acceptance, target.vocab_size(), 1);
    oracle.begin(prompt);
    std::vector<double> t_iso_draft;
    for (int i = 0; i < 7; ++i)
      t_iso_draft.push_back(seconds_of([&] {
                              for (int j = 0; j < 100; ++j) oracle.propose(ctx, tree);
                            }) /
                            100.0);
    row.iso_draft = median(t_iso_draft);
  }
  row.reps = reps;
  row.iso_predicted =
      row.spec.mean_accepted_length() * row.iso_ar / (row.iso_draft + row.iso_verify);
  set_counters(state, row.spec, row.base);
  state.counters["measured_speedup"] = row.measured;
  state.counters["predicted_speedup"] = row.predicted;
  state.counters["isolated_predicted_speedup"] = row.iso_predicted;
  state.counters["T_ar_ms"] = 1e3 * row.t_ar;
  state.counters["T_verify_ms"] = 1e3 * row.t_verify;
  controlled_rows.push_back(row);
}

// ---------------------------------------------------------------------------------------------
// 3. Draft heads at the stories110M shape.

//! One row of the heads' cost table.
struct heads_cost_row {
  std::string name;
  std::size_t nodes = 0;    //!< drafted nodes per step (the tree, pruned to the cap)
  double acceptance = 0.0;  //!< mean accepted length on the fixture, trained heads, greedy
  double t_step = 0.0;      //!< a decode step: a forward over the root alone
  double t_tree = 0.0;      //!< the scoring forward of root + tree
  double t_propose = 0.0;   //!< the proposer's step: the heads and the ranking
  [[nodiscard]] double ratio() const { return (t_tree + t_propose) / t_step; }
  [[nodiscard]] double predicted() const { return acceptance * t_step / (t_tree + t_propose); }
};
std::vector<heads_cost_row> heads_cost_rows;
std::vector<heads_cost_row> eagle_cost_rows;  //!< the same measurements for EAGLE heads

//! The mean accepted length of `proposer` on the fixture: greedy, the 14 prompts x 128 tokens,
//! at most `nodes` drafted nodes per step.
template <class Proposer>
double fixture_acceptance(Proposer& proposer, std::size_t nodes) {
  fixture const& f = fixture::get();
  sd::cpu_llama target(f.weights, one_thread());
  sd::speculative_decoder decoder(target, proposer, sd::greedy_verifier{}, sd::greedy{},
                                  fixture_config(nodes));
  totals t;
  sd::decode_result r;
  for (auto const& prompt : f.prompts) {
    decoder.generate(prompt, r);
    t.add(r.stats, 0.0);
  }
  return t.mean_accepted_length();
}

//! Times one decode step, the scoring forward of `proposer`'s tree (at most `nodes` nodes) and the
//! proposer's step on `model`, in the middle of a sequence, alternating, medians of 15.
template <class Proposer>
heads_cost_row measure_heads_cost(sd::cpu_llama& model, Proposer& proposer, std::size_t nodes) {
  constexpr std::size_t base = 96;  // tokens in the cache
  std::vector<sd::token_id> seq(base + 1);
  for (std::size_t i = 0; i < seq.size(); ++i)
    seq[i] = static_cast<sd::token_id>((i * 7919 + 13) % model.vocab_size());
  std::vector<sd::position_t> positions(base);
  for (std::size_t i = 0; i < base; ++i) positions[i] = static_cast<sd::position_t>(i);
  sd::forward_result out;
  model.cache().truncate(0);
  model.forward({.tokens = std::span<sd::token_id const>(seq).first(base),
                 .positions = positions,
                 .want_hidden = true},
                out);
  std::vector<float> const hidden(out.hidden.end() - static_cast<long>(model.hidden_size()),
                                  out.hidden.end());
  sd::philox rng(1, 0, 0);
  sd::propose_context ctx;
  ctx.tokens = seq;
  ctx.target_hidden = sd::matrix_view<float const>(hidden.data(), 1, hidden.size());
  ctx.max_nodes = nodes;
  ctx.rng = &rng;
  sd::draft_tree tree(64);
  proposer.propose(ctx, tree);
  std::vector<sd::position_t> tree_positions(tree.size());
  for (std::size_t i = 0; i < tree.size(); ++i)
    tree_positions[i] =
        static_cast<sd::position_t>(base) + tree.depth(static_cast<sd::node_index>(i));
  sd::forward_request const tree_req{.tokens = tree.tokens(),
                                     .positions = tree_positions,
                                     .mask = tree.mask(),
                                     .mask_stride = tree.mask_stride()};
  sd::forward_request const single_req{.tokens = tree.tokens().first(1),
                                       .positions = std::span(tree_positions).first(1)};
  std::vector<double> t_step, t_tree, t_propose;
  sd::draft_tree scratch(64);
  for (int i = 0; i < 15; ++i) {
    t_step.push_back(seconds_of([&] { model.forward(single_req, out); }));
    model.cache().truncate(base);
    t_tree.push_back(seconds_of([&] { model.forward(tree_req, out); }));
    model.cache().truncate(base);
    t_propose.push_back(seconds_of([&] { proposer.propose(ctx, scratch); }));
  }
  heads_cost_row row;
  row.nodes = tree.num_drafted();
  row.t_step = median(t_step);
  row.t_tree = median(t_tree);
  row.t_propose = median(t_propose);
  return row;
}

//! Medusa (`hydra` false) or Hydra heads of `layers` blocks at the stories110M shape, drafting the
//! fixture heads' tree pruned to `nodes` nodes.
void bench_heads_cost(benchmark::State& state, bool hydra, std::size_t layers, std::size_t nodes) {
  fixture const& f = fixture::get();
  auto const& config = stories110m()->config;
  auto const dim = static_cast<std::size_t>(config.dim),
             vocab = static_cast<std::size_t>(config.vocab_size);
  std::size_t const threads = bench_threads();
  sd::cpu_llama model(stories110m(), sd::cpu_llama_options{.threads = threads});
  heads_cost_row row;
  for (auto _ : state) {
    if (hydra) {
      sd::cpu_hydra_heads trained(std::make_shared<sd::hydra_weights const>(
                                      sd::load_hydra_heads(heads_dir("hydra"), f.weights->config)),
                                  f.weights);
      sd::hydra_proposer fixture_proposer(trained, heads_tree("hydra"));
      double const acceptance = fixture_acceptance(fixture_proposer, nodes);
      sd::cpu_hydra_heads heads(std::make_shared<sd::hydra_weights const>(
                                    sd::make_random_hydra_heads(dim, vocab, 4, layers, 7, 0.02f)),
                                stories110m(), {.threads = threads});
      sd::hydra_proposer proposer(heads, heads_tree("hydra"));
      row = measure_heads_cost(model, proposer, nodes);
      row.acceptance = acceptance;
    } else {
      sd::cpu_medusa_heads trained(std::make_shared<sd::medusa_weights const>(
          sd::load_medusa_heads(heads_dir("medusa"), f.weights->config)));
      sd::medusa_proposer fixture_proposer(trained, heads_tree("medusa"));
      double const acceptance = fixture_acceptance(fixture_proposer, nodes);
      sd::cpu_medusa_heads heads(std::make_shared<sd::medusa_weights const>(
                                     sd::make_random_medusa_heads(dim, vocab, 4, layers, 7, 0.02f)),
                                 {.threads = threads});
      sd::medusa_proposer proposer(heads, heads_tree("medusa"));
      row = measure_heads_cost(model, proposer, nodes);
      row.acceptance = acceptance;
    }
  }
  row.name = std::string(hydra ? "Hydra" : "Medusa") + ", 4 heads x " + std::to_string(layers) +
             (layers == 1 ? " block" : " blocks");
  state.counters["nodes"] = static_cast<double>(row.nodes);
  state.counters["T_step_ms"] = 1e3 * row.t_step;
  state.counters["T_tree_ms"] = 1e3 * row.t_tree;
  state.counters["T_propose_ms"] = 1e3 * row.t_propose;
  state.counters["cost_ratio"] = row.ratio();
  state.counters["mean_acc_len"] = row.acceptance;
  state.counters["predicted_speedup"] = row.predicted();
  heads_cost_rows.push_back(row);
}

//! The middle of a sequence at the stories110M shape: 96 tokens in `model`'s cache and the
//! target's features of each (`layers`' residual streams, or the final hidden state when empty).
struct sequence_features {
  static constexpr std::size_t base = 96;  //!< tokens in the cache
  static constexpr std::size_t fresh = 3;  //!< rows a timed proposer step appends again
  std::vector<sd::token_id> tokens;        //!< [base + 1]: the cached tokens and the root
  std::vector<float> rows;                 //!< [base, cols] the features
  std::size_t cols = 0;

  sequence_features(sd::cpu_llama& model, std::span<std::int32_t const> layers) : tokens(base + 1) {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<sd::token_id>((i * 7919 + 13) % model.vocab_size());
    std::vector<sd::position_t> positions(base);
    for (std::size_t i = 0; i < base; ++i) positions[i] = static_cast<sd::position_t>(i);
    sd::forward_result out;
    model.cache().truncate(0);
    sd::forward_request req{.tokens = std::span<sd::token_id const>(tokens).first(base),
                            .positions = positions};
    req.want_hidden = layers.empty();
    req.hidden_layers = layers;
    model.forward(req, out);
    sd::matrix_view<float const> const f =
        layers.empty() ? out.hidden_view() : out.layer_hidden_view();
    rows.assign(f.data(), f.data() + base * f.cols());
    cols = f.cols();
  }
  //! All rows (the first step), or the last `fresh` (each timed step).
  [[nodiscard]] sd::matrix_view<float const> all() const {
    return sd::matrix_view<float const>(rows.data(), base, cols);
  }
  [[nodiscard]] sd::matrix_view<float const> last() const {
    return sd::matrix_view<float const>(rows.data() + (base - fresh) * cols, fresh, cols);
  }
};

//! Times 15 alternating rounds of a decode step (the root alone), the scoring forward of `tree`
//! above the 96 cached tokens and `propose_step()`, into `row`'s medians.
template <class Step>
void time_draft_step(sd::cpu_llama& model, sd::draft_tree const& tree, Step&& propose_step,
                     heads_cost_row& row) {
  constexpr std::size_t base = sequence_features::base;
  std::vector<sd::position_t> tree_positions(tree.size());
  for (std::size_t i = 0; i < tree.size(); ++i)
    tree_positions[i] =
        static_cast<sd::position_t>(base) + tree.depth(static_cast<sd::node_index>(i));
  sd::forward_request const tree_req{.tokens = tree.tokens(),
                                     .positions = tree_positions,
                                     .mask = tree.mask(),
                                     .mask_stride = tree.mask_stride()};
  sd::forward_request const single_req{.tokens = tree.tokens().first(1),
                                       .positions = std::span(tree_positions).first(1)};
  sd::forward_result out;
  std::vector<double> t_step, t_tree, t_propose;
  for (int i = 0; i < 15; ++i) {
    t_step.push_back(seconds_of([&] { model.forward(single_req, out); }));
    model.cache().truncate(base);
    t_tree.push_back(seconds_of([&] { model.forward(tree_req, out); }));
    model.cache().truncate(base);
    t_propose.push_back(seconds_of(propose_step));
  }
  row.nodes = tree.num_drafted();
  row.t_step = median(t_step);
  row.t_tree = median(t_tree);
  row.t_propose = median(t_propose);
}

//! The counters of a drafter's cost row.
void cost_counters(benchmark::State& state, heads_cost_row const& row) {
  state.counters["nodes"] = static_cast<double>(row.nodes);
  state.counters["T_step_ms"] = 1e3 * row.t_step;
  state.counters["T_tree_ms"] = 1e3 * row.t_tree;
  state.counters["T_propose_ms"] = 1e3 * row.t_propose;
  state.counters["propose_per_step"] = row.t_propose / row.t_step;
  state.counters["cost_ratio"] = row.ratio();
  state.counters["mean_acc_len"] = row.acceptance;
  state.counters["predicted_speedup"] = row.predicted();
}

//! EAGLE at the stories110M shape: a random-weight head (one layer of the target's shape, EAGLE-1
//! reading the final hidden state and drafting through the target's classifier, or EAGLE-3 reading
//! three layers and drafting over `draft_vocab` tokens) drafting the dynamic tree `tree`. Timed as
//! the heads above: a decode step, the scoring forward of the drafted tree, and the proposer's
//! step, which appends the pairs of the last 3 committed tokens (about a step's acceptance) and
//! drafts the tree. The acceptance is the trained fixture head's (greedy, same tree).
void bench_eagle_cost(benchmark::State& state, bool eagle3, std::size_t draft_vocab,
                      sd::eagle_tree_config tree_config) {
  fixture const& f = fixture::get();
  auto const& config = stories110m()->config;
  std::size_t const threads = bench_threads();
  sd::cpu_llama model(stories110m(), sd::cpu_llama_options{.threads = threads});
  heads_cost_row row;
  for (auto _ : state) {
    fs::path const trained_dir = eagle_dir(eagle3 ? "eagle3" : "eagle1");
    double acceptance = 0.0;  // without the trained head: no prediction
    if (fs::exists(trained_dir / sd::eagle_weights_file)) {
      sd::cpu_eagle_head trained(
          std::make_shared<sd::eagle_weights const>(sd::load_eagle_head(trained_dir, f.weights)));
      sd::eagle_proposer fixture_proposer(trained, tree_config);
      acceptance = fixture_acceptance(fixture_proposer, tree_config.nodes);
    }
    auto const version = eagle3 ? sd::eagle_version::eagle3 : sd::eagle_version::eagle1;
    auto const n = config.n_layers;
    auto const weights = std::make_shared<sd::eagle_weights const>(sd::make_random_eagle_head(
        version, stories110m(), static_cast<std::size_t>(config.n_heads),
        static_cast<std::size_t>(config.n_kv_heads), static_cast<std::size_t>(config.hidden_dim),
        draft_vocab, {2, n / 2, n - 3}, 7, 0.02f));
    sd::cpu_eagle_head head(weights, {.threads = threads});
    sd::eagle_proposer proposer(head, tree_config);
    sequence_features const seq(model, weights->target_layers);
    sd::propose_context ctx;
    ctx.tokens = seq.tokens;
    ctx.max_nodes = tree_config.nodes;
    proposer.begin(seq.tokens);
    ctx.target_hidden = seq.all();
    sd::draft_tree tree(tree_config.nodes + 1);
    proposer.propose(ctx, tree);
    proposer.accept({});
    // Each timed step: the last `fresh` pairs appended again, then the tree drafted.
    ctx.target_hidden = seq.last();
    sd::draft_tree scratch(tree_config.nodes + 1);
    time_draft_step(
        model, tree,
        [&] {
          proposer.propose(ctx, scratch);
          proposer.accept({});
        },
        row);
    row.acceptance = acceptance;
  }
  row.name = std::string(eagle3 ? "EAGLE-3, draft vocab " + std::to_string(draft_vocab)
                                : std::string("EAGLE-1 (EAGLE-2 tree)")) +
             ", D" + std::to_string(tree_config.depth) + " K" + std::to_string(tree_config.top_k);
  cost_counters(state, row);
  eagle_cost_rows.push_back(row);
}

//! tools/block/<kind> next to the benchmarks (the block drafters trained for the fixture).
fs::path block_dir(char const* kind) {
  return fs::path(__FILE__).parent_path().parent_path() / "tools" / "block" / kind;
}

//! Block drafters at the stories110M shape: a random-weight drafter of the fixture drafter's
//! depth (2 layers of the target's shape, blocks of 8, features of three target layers; DSpark's
//! heads of rank 32) drafting a chain of 7 or DDTree's tree of `nodes`, timed as the EAGLE heads
//! above (the proposer step appends the context rows of the last 3 committed tokens and runs one
//! block). The acceptance is the trained fixture drafter's (greedy, same shape of draft).
template <sd::block_shape Shape>
void bench_block_cost(benchmark::State& state, bool dspark, std::size_t nodes) {
  fixture const& f = fixture::get();
  auto const& config = stories110m()->config;
  std::size_t const threads = bench_threads();
  sd::cpu_llama model(stories110m(), sd::cpu_llama_options{.threads = threads});
  sd::block_config const bc{.nodes = nodes};
  using proposer_type =
      sd::block_proposer<sd::cpu_block_drafter, sd::greedy, sd::draft_mode::greedy, Shape>;
  heads_cost_row row;
  for (auto _ : state) {
    fs::path const trained_dir = block_dir(dspark ? "dspark" : "dflash");
    double acceptance = 0.0;  // without the trained drafter: no prediction
    if (fs::exists(trained_dir / sd::block_drafter_weights_file)) {
      sd::cpu_block_drafter trained(std::make_shared<sd::block_drafter_weights const>(
          sd::load_block_drafter(trained_dir, f.weights)));
      proposer_type fixture_proposer(trained, sd::greedy{}, bc);
      acceptance = fixture_acceptance(fixture_proposer, fixture_proposer.max_nodes());
    }
    auto const n = config.n_layers;
    auto const weights = std::make_shared<sd::block_drafter_weights const>(
        sd::make_random_block_drafter(stories110m(), 2, static_cast<std::size_t>(config.n_heads),
                                      static_cast<std::size_t>(config.n_kv_heads),
                                      static_cast<std::size_t>(config.hidden_dim), 8,
                                      {2, n / 2, n - 3}, dspark ? 32 : 0, 7, 0.02f));
    sd::cpu_block_drafter drafter(weights, {.threads = threads});
    proposer_type proposer(drafter, sd::greedy{}, bc);
    sequence_features const seq(model, weights->config.target_layers);
    sd::propose_context ctx;
    ctx.tokens = seq.tokens;
    ctx.max_nodes = proposer.max_nodes();
    proposer.begin(seq.tokens);
    ctx.target_hidden = seq.all();
    sd::draft_tree tree(proposer.max_nodes() + 1);
    proposer.propose(ctx, tree);
    // Each timed step: the last `fresh` context rows appended again, then the block drafted.
    ctx.target_hidden = seq.last();
    sd::draft_tree scratch(proposer.max_nodes() + 1);
    time_draft_step(
        model, tree, [&] { proposer.propose(ctx, scratch); }, row);
    row.acceptance = acceptance;
  }
  row.name = std::string(dspark ? "DSpark" : "DFlash") + ", 2 layers, " +
             (Shape == sd::block_shape::tree ? "DDTree N" + std::to_string(nodes) : "chain 7");
  cost_counters(state, row);
  eagle_cost_rows.push_back(row);
}

// ---------------------------------------------------------------------------------------------
// The summary.

char const* verdict(bool ok) {
  return ok ? "ok" : "MISSED";
}

void print_summary() {
  if (!fixture_rows.empty()) {
    std::printf(
        "\nstories260K fixture: 14 prompts x %zu new tokens, k = %zu, 1 thread; the baseline ran "
        "prompt by prompt in turn\nwith each strategy. overhead = decode time outside model "
        "forwards (target + draft) / decode time.\n\n",
        fixture_tokens, fixture_k);
    std::printf("%-36s %10s %10s %8s %9s %9s %10s %9s %12s\n", "strategy", "tok/s", "base tok/s",
                "speedup", "acc.len", "acc.rate", "overhead", "<= 5%", "tree (+aux)");
    for (fixture_row const& r : fixture_rows) {
      double const rate = r.spec.drafted > 0 ? static_cast<double>(r.spec.accepted) /
                                                   static_cast<double>(r.spec.drafted)
                                             : 0.0;
      double const steps = std::max<double>(1.0, static_cast<double>(r.spec.steps));
      std::string tree = std::to_string(static_cast<double>(r.spec.drafted) / steps).substr(0, 4);
      if (r.spec.aux_tokens != 0)
        tree += " +" + std::to_string(static_cast<double>(r.spec.aux_tokens) / steps).substr(0, 4);
      std::printf("%-36s %10.0f %10.0f %7.2fx %9.2f %8.1f%% %9.1f%% %9s %12s\n", r.name.c_str(),
                  r.spec.tokens_per_second(), r.base.tokens_per_second(),
                  r.spec.tokens_per_second() / r.base.tokens_per_second(),
                  r.spec.mean_accepted_length(), 100.0 * rate, 100.0 * r.spec.overhead(),
                  verdict(r.spec.overhead() <= 0.05), tree.c_str());
    }
    double worst = 0.0;
    for (fixture_row const& r : fixture_rows) worst = std::max(worst, r.base.overhead());
    std::printf("%-36s %54s %9.1f%% %9s\n", "autoregressive baseline (worst run)", "",
                100.0 * worst, verdict(worst <= 0.05));
  }
  if (!controlled_rows.empty()) {
    std::printf(
        "\ncontrolled acceptance: random-weight stories110M shape (dim 768, 12 layers, vocab "
        "32000), %zu threads, k = %zu, greedy,\noracle drafts corrupted with probability 1 - a; "
        "%zu alternating baseline / speculative run pairs of %zu new tokens per row.\n"
        "Per pair: measured = ratio of the decode rates (prefill excluded); predicted = "
        "E[accepted + 1] x T_ar / (T_draft + T_verify)\nwith E the run's mean accepted length, "
        "T_ar the baseline's forward time per token, T_verify the speculative run's scoring\n"
        "forward time per step, T_draft its propose time per step; the table shows medians over "
        "the pairs. 'isolated' predicts\nfrom forwards over 1 and k + 1 tokens timed on their own "
        "(alternating medians of 15). overhead = decode time outside\ntarget forwards / decode "
        "time, over every speculative run.\n\n",
        bench_threads(), controlled_k, controlled_rows.front().reps,
        env_count("SPECDEC_BENCH_TOKENS", 128));
    std::printf("%5s %7s %8s %8s %9s %9s %9s %10s %7s %7s %9s %9s %7s\n", "a", "E[len]", "acc.len",
                "T_ar ms", "T_verify", "T_draft", "measured", "predicted", "ratio", "+-10%",
                "isolated", "overhead", ">=2.5x");
    for (controlled_row const& r : controlled_rows) {
      std::printf(
          "%5.2f %7.3f %8.3f %8.2f %9.2f %9.5f %8.2fx %9.2fx %7.3f %7s %8.2fx %8.2f%% %7s\n",
          r.acceptance, r.expected_length, r.spec.mean_accepted_length(), 1e3 * r.t_ar,
          1e3 * r.t_verify, 1e3 * r.t_draft, r.measured, r.predicted, r.ratio,
          verdict(std::abs(r.ratio - 1.0) <= 0.10), r.iso_predicted, 100.0 * r.spec.overhead(),
          r.acceptance >= 0.9 ? verdict(r.measured >= 2.5) : "-");
    }
  }
  if (!heads_cost_rows.empty()) {
    std::printf(
        "\ndraft heads at the stories110M shape (random weights: dim 768, 12 layers, vocab 32000), "
        "%zu threads; the fixture heads'\n32-node trees pruned to the nodes shown; medians of 15 "
        "alternating timings in the middle of a sequence.\ncost = (tree scoring forward + "
        "proposer step) / decode step; acc.len = mean accepted length of the trained fixture "
        "heads\n(greedy, 14 prompts x 128 tokens, same node cap); predicted = acc.len x decode "
        "step "
        "/ (scoring + proposing).\n\n",
        bench_threads());
    std::printf("%-28s %6s %9s %9s %11s %7s %7s %8s %10s\n", "heads", "nodes", "step ms", "tree ms",
                "propose ms", "cost", "<= 1.3", "acc.len", "predicted");
    for (heads_cost_row const& r : heads_cost_rows)
      std::printf("%-28s %6zu %9.2f %9.2f %11.2f %6.2fx %7s %8.3f %9.2fx\n", r.name.c_str(),
                  r.nodes, 1e3 * r.t_step, 1e3 * r.t_tree, 1e3 * r.t_propose, r.ratio(),
                  r.name.rfind("Medusa", 0) == 0 && r.nodes == 32 ? verdict(r.ratio() <= 1.3) : "-",
                  r.acceptance, r.predicted());
  }
  if (!eagle_cost_rows.empty()) {
    std::printf(
        "\nEAGLE heads and block drafters at the stories110M shape (random weights: EAGLE one "
        "layer "
        "of the target's shape,\nblock drafters two), %zu threads; EAGLE's dynamic trees (depth D, "
        "top-K, the nodes shown; K1 = a chain), block\ndrafters' chains of 7 and DDTree trees; "
        "medians of 15 alternating "
        "timings in the middle of a sequence, the proposer step\nappending 3 pairs and drafting. "
        "draft = proposer step / decode step (bar: <= 0.5); cost = (scoring + proposing) /\n"
        "decode step; acc.len = mean accepted length of the trained fixture head with the same "
        "tree; predicted = acc.len x\ndecode step / (scoring + proposing).\n\n",
        bench_threads());
    std::printf("%-36s %6s %9s %9s %11s %7s %7s %7s %8s %10s\n", "drafter", "nodes", "step ms",
                "tree ms", "propose ms", "draft", "<= 0.5", "cost", "acc.len", "predicted");
    for (heads_cost_row const& r : eagle_cost_rows)
      std::printf("%-36s %6zu %9.2f %9.2f %11.2f %6.2fx %7s %6.2fx %8.3f %9.2fx\n", r.name.c_str(),
                  r.nodes, 1e3 * r.t_step, 1e3 * r.t_tree, 1e3 * r.t_propose,
                  r.t_propose / r.t_step, verdict(r.t_propose / r.t_step <= 0.5), r.ratio(),
                  r.acceptance, r.predicted());
  }
}

}  // namespace

int main(int argc, char** argv) {
  using sd::draft_mode;
  benchmark::RegisterBenchmark("fixture/draft/greedy", bench_draft<draft_mode::greedy>)
      ->Iterations(3);
  benchmark::RegisterBenchmark("fixture/draft/temp1", bench_draft<draft_mode::sample>)
      ->Iterations(3);
  benchmark::RegisterBenchmark("fixture/draft_adaptive/greedy", bench_draft_adaptive)
      ->Iterations(3);
  benchmark::RegisterBenchmark("fixture/prompt_lookup_chain_adaptive/greedy",
                               bench_prompt_lookup_adaptive)
      ->Iterations(3);
  benchmark::RegisterBenchmark("fixture/prompt_lookup_chain/greedy", [](benchmark::State& s) {
    bench_prompt_lookup(s, 1, true);
  })->Iterations(3);
  benchmark::RegisterBenchmark("fixture/prompt_lookup_chain/temp1", [](benchmark::State& s) {
    bench_prompt_lookup(s, 1, false);
  })->Iterations(3);
  benchmark::RegisterBenchmark("fixture/prompt_lookup_tree/greedy", [](benchmark::State& s) {
    bench_prompt_lookup(s, 3, true);
  })->Iterations(3);
  benchmark::RegisterBenchmark("fixture/prompt_lookup_tree/temp1", [](benchmark::State& s) {
    bench_prompt_lookup(s, 3, false);
  })->Iterations(3);
  benchmark::RegisterBenchmark("fixture/layer_skip/greedy", bench_layer_skip<draft_mode::greedy>)
      ->Iterations(3);
  benchmark::RegisterBenchmark("fixture/layer_skip/temp1", bench_layer_skip<draft_mode::sample>)
      ->Iterations(3);
  for (int source : {0, 1})
    for (bool greedy : {true, false})
      benchmark::RegisterBenchmark(
          (std::string("fixture/rest_") + (source == 0 ? "fixture_text" : "stories") +
           (greedy ? "/greedy" : "/temp1"))
              .c_str(),
          [source, greedy](benchmark::State& s) { bench_rest(s, source, greedy); })
          ->Iterations(3);
  benchmark::RegisterBenchmark("fixture/lookahead/greedy", [](benchmark::State& s) {
    bench_lookahead(s, true);
  })->Iterations(3);
  benchmark::RegisterBenchmark("fixture/lookahead/temp1", [](benchmark::State& s) {
    bench_lookahead(s, false);
  })->Iterations(3);
  benchmark::RegisterBenchmark("fixture/jacobi/greedy", bench_jacobi)->Iterations(3);
  for (bool greedy : {true, false}) {
    benchmark::RegisterBenchmark(greedy ? "fixture/medusa/greedy" : "fixture/medusa/temp1",
                                 [greedy](benchmark::State& s) { bench_medusa(s, greedy); })
        ->Iterations(3);
    benchmark::RegisterBenchmark(greedy ? "fixture/hydra/greedy" : "fixture/hydra/temp1",
                                 [greedy](benchmark::State& s) { bench_hydra(s, greedy); })
        ->Iterations(3);
  }
  for (char const* kind : {"eagle1", "eagle3"})
    for (bool greedy : {true, false})
      benchmark::RegisterBenchmark(
          (std::string("fixture/") + kind + (greedy ? "/greedy" : "/temp1")).c_str(),
          [kind, greedy](benchmark::State& s) { bench_eagle(s, kind, greedy); })
          ->Iterations(3);
  for (double a : {0.5, 0.7, 0.9}) {
    benchmark::RegisterBenchmark(
        ("controlled/acceptance:" + std::to_string(a).substr(0, 3)).c_str(),
        [a](benchmark::State& s) { bench_controlled(s, a); })
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  struct heads_case {
    bool hydra;
    std::size_t layers, nodes;
  };
  for (heads_case const c :
       {heads_case{false, 1, 32}, heads_case{false, 1, 16}, heads_case{false, 1, 8},
        heads_case{false, 4, 32}, heads_case{true, 4, 32}, heads_case{true, 4, 16},
        heads_case{true, 4, 8}}) {
    std::string const name = std::string("heads/") + (c.hydra ? "hydra" : "medusa") + "_" +
                             std::to_string(c.layers) + "blocks/nodes:" + std::to_string(c.nodes);
    benchmark::RegisterBenchmark(
        name.c_str(), [c](benchmark::State& s) { bench_heads_cost(s, c.hydra, c.layers, c.nodes); })
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  struct eagle_case {
    bool eagle3;
    std::size_t draft_vocab;
    sd::eagle_tree_config tree;
  };
  for (eagle_case const c :
       {eagle_case{false, 32000, {8, 6, 32}}, eagle_case{true, 8192, {8, 6, 32}},
        eagle_case{true, 8192, {4, 4, 16}}, eagle_case{true, 8192, {3, 8, 16}},
        eagle_case{true, 8192, {3, 4, 8}}, eagle_case{true, 8192, {7, 1, 7}},
        eagle_case{true, 32000, {7, 1, 7}}}) {
    std::string const name = std::string("eagle/") + (c.eagle3 ? "eagle3_vocab" : "eagle1_vocab") +
                             std::to_string(c.draft_vocab) + "/D" + std::to_string(c.tree.depth) +
                             "_K" + std::to_string(c.tree.top_k) + "_N" +
                             std::to_string(c.tree.nodes);
    benchmark::RegisterBenchmark(
        name.c_str(),
        [c](benchmark::State& s) { bench_eagle_cost(s, c.eagle3, c.draft_vocab, c.tree); })
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  for (bool const dspark : {false, true}) {
    std::string const kind = dspark ? "dspark" : "dflash";
    benchmark::RegisterBenchmark(
        ("block/" + kind + "/chain7").c_str(),
        [dspark](benchmark::State& s) { bench_block_cost<sd::block_shape::chain>(s, dspark, 32); })
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(
        ("block/" + kind + "/ddtree32").c_str(),
        [dspark](benchmark::State& s) { bench_block_cost<sd::block_shape::tree>(s, dspark, 32); })
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary();
  return 0;
}
