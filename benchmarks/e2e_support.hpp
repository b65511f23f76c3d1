#pragma once
// What the end-to-end benchmarks (bench_e2e, bench_batch, bench_suffix) share: where the fixture
// files are, the fixture and its prompts, the environment's counts, the random-weight target of the
// stories110M shape, medians, and the oracle proposer that drafts a target's own greedy
// continuation with a set acceptance rate.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "jsonl.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/model/llama_weights.hpp"
#include "specdec/model/load.hpp"
#include "specdec/model/random.hpp"
#include "specdec/model/tokenizer.hpp"

namespace bench {

//! The directory of environment variable `var`, else ../shared/`sub` next to the repository.
inline std::filesystem::path shared_dir(char const* var, char const* sub) {
  if (char const* v = std::getenv(var); v != nullptr && *v != '\0') return v;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "shared" / sub;
}

//! `p`, or the end of the program with a message when it does not exist.
inline std::filesystem::path require(std::filesystem::path const& p) {
  if (!std::filesystem::exists(p)) {
    std::fprintf(stderr, "benchmark: missing %s (set SPECDEC_MODEL_DIR / SPECDEC_DATA_DIR)\n",
                 p.string().c_str());
    std::exit(1);
  }
  return p;
}

//! The stories260K fixture's weights, loaded once.
inline std::shared_ptr<specdec::llama_weights const> const& stories260k() {
  static std::shared_ptr<specdec::llama_weights const> const w =
      std::make_shared<specdec::llama_weights const>(specdec::load_model(
          require(shared_dir("SPECDEC_MODEL_DIR", "models") / "stories260K.bin")));
  return w;
}

//! The fixture's tokenizer (tok512.bin), loaded once.
inline specdec::tokenizer const& tok512() {
  static specdec::tokenizer const t = [] {
    auto const models = shared_dir("SPECDEC_MODEL_DIR", "models");
    return specdec::load_tokenizer(models / "stories260K.bin", require(models / "tok512.bin"));
  }();
  return t;
}

//! The 14 prompts of tinystories_prompts.jsonl, encoded with BOS, loaded once.
inline std::vector<std::vector<specdec::token_id>> const& fixture_prompts() {
  static std::vector<std::vector<specdec::token_id>> const prompts = [] {
    std::vector<std::vector<specdec::token_id>> out;
    for (std::string const& text : jsonl_strings(
             require(shared_dir("SPECDEC_DATA_DIR", "data") / "tinystories_prompts.jsonl"),
             "prompt"))
      out.push_back(tok512().encode(text, true));
    return out;
  }();
  return prompts;
}

//! The positive count in environment variable `var`, else `fallback`.
inline std::size_t env_count(char const* var, std::size_t fallback) {
  char const* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  unsigned long long const n = std::strtoull(v, &end, 10);
  return end != v && *end == '\0' && n > 0 ? static_cast<std::size_t>(n) : fallback;
}

//! Threads of the stories110M-shape model: SPECDEC_BENCH_THREADS, default all cores.
inline std::size_t bench_threads() {
  return env_count("SPECDEC_BENCH_THREADS",
                   std::max<std::size_t>(1, std::thread::hardware_concurrency()));
}

//! The stories110M-shape random target (dim 768, hidden 2048, 12 layers, 12 heads, vocabulary
//! 32000, context 1024, tied classifier), built once.
inline std::shared_ptr<specdec::llama_weights const> const& stories110m() {
  static std::shared_ptr<specdec::llama_weights const> const w = [] {
    specdec::llama_config c;
    c.dim = 768;
    c.hidden_dim = 2048;
    c.n_layers = 12;
    c.n_heads = 12;
    c.n_kv_heads = 12;
    c.vocab_size = 32000;
    c.seq_len = 1024;
    c.shared_classifier = true;
    return std::make_shared<specdec::llama_weights const>(
        specdec::make_random_llama(c, 110, 0.02f));
  }();
  return w;
}

//! The median of `v` (not empty).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

//! Seconds of `f()`.
template <class F>
double seconds_of(F&& f) {
  auto const t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

//! Drafts the target's own greedy continuation `sequence` (prompt included), with the token at each
//! position replaced by another one with probability 1 - acceptance, so that each draft token is
//! accepted with probability `acceptance` given its predecessors were (greedy verification).
//!
//! Which positions are replaced is drawn once per sequence from `seed` (Philox), not per draft: a
//! position is tested when it is the first drafted one past the committed tokens, and its draw is
//! independent of every other position's, so the acceptance model is the same whatever the draft
//! length; and every draft length meets the same replaced positions. Policies that differ only in
//! how much they draft are then compared on the same luck (common random numbers), which removes
//! most of the run-to-run spread of a short request.
class oracle_proposer {
 public:
  static constexpr bool produces_trees = false;
  static constexpr bool samples_drafts = false;
  static constexpr bool needs_target_hidden = false;

  oracle_proposer(std::vector<specdec::token_id> sequence, std::size_t k, double acceptance,
                  std::size_t vocab, std::uint64_t seed)
      : sequence_(std::move(sequence)), k_(k), drafted_(sequence_) {
    specdec::philox rng(seed, 0, 0);
    for (specdec::token_id& token : drafted_) {
      if (static_cast<double>(rng.uniform()) < acceptance) continue;
      auto const shift = 1 + rng.next_u32() % static_cast<std::uint32_t>(vocab - 1);
      token = static_cast<specdec::token_id>((static_cast<std::size_t>(token) + shift) % vocab);
    }
  }

  void begin(std::span<specdec::token_id const>) {}

  void propose(specdec::propose_context const& ctx, specdec::draft_tree& tree) {
    tree.reset(ctx.tokens.back());
    std::size_t const t = ctx.tokens.size();
    SPECDEC_CHECK(t <= sequence_.size() && sequence_[t - 1] == ctx.tokens.back(), internal,
                  "oracle_proposer: the committed tokens left the greedy continuation at ", t);
    std::size_t const n = std::min({k_, ctx.max_nodes, sequence_.size() - t});
    specdec::node_index parent = 0;
    for (std::size_t i = 0; i < n; ++i) parent = tree.add_node(parent, drafted_[t + i]);
  }

  void accept(specdec::verify_result const&) noexcept {}

  //! The longest chain it drafts.
  [[nodiscard]] std::size_t max_nodes() const noexcept { return k_; }

 private:
  std::vector<specdec::token_id> sequence_;  // the greedy continuation
  std::size_t k_;
  std::vector<specdec::token_id> drafted_;  // what is drafted at each position
};

}  // namespace bench
