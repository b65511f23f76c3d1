// A project that uses specdec as an installed package (find_package) or a subdirectory, through
// the umbrella header only, with -Werror: a proposer drafts, a verifier checks the draft under a
// greedy and a sampling policy, and the speculative decoder runs a tiny model of the project's own.
// No Eigen, no xtensor: the umbrella needs neither.
#include <specdec/specdec.hpp>

// The umbrella needs only the standard library (the package is found with nlohmann/json hidden).
#if defined(NLOHMANN_JSON_VERSION_MAJOR)
#error "specdec/specdec.hpp included nlohmann/json"
#endif

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

namespace {

constexpr std::size_t vocab = 8;

// The "target" predicts next = token % 4 + 1 with a margin of 4 logits.
void cyclic_logits(specdec::token_id token, std::span<float> row) {
  for (float& v : row) v = 0.0f;
  row[static_cast<std::size_t>(token % 4 + 1)] = 4.0f;
}

// A minimal causal_lm whose logits depend only on the scored token; its cache counts positions.
class cyclic_model {
 public:
  class cache_type {
   public:
    [[nodiscard]] std::size_t size() const { return size_; }
    [[nodiscard]] std::size_t capacity() const { return 64; }
    void truncate(std::size_t n) { size_ = n; }
    void keep_path(std::size_t n, std::span<std::int32_t const> keep) { size_ = n + keep.size(); }
    void grow(std::size_t n) { size_ += n; }

   private:
    std::size_t size_ = 0;
  };

  [[nodiscard]] std::size_t vocab_size() const { return vocab; }
  [[nodiscard]] std::size_t max_context() const { return 64; }
  [[nodiscard]] std::size_t hidden_size() const { return 1; }
  cache_type& cache() { return cache_; }

  void forward(specdec::forward_request const& req, specdec::forward_result& out) {
    req.validate(vocab, max_context());
    std::size_t const rows = req.logits_rows.empty() ? req.tokens.size() : req.logits_rows.size();
    out.vocab = vocab;
    out.logits_count = rows;
    out.logits.assign(rows * vocab, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      std::size_t const i =
          req.logits_rows.empty() ? r : static_cast<std::size_t>(req.logits_rows[r]);
      cyclic_logits(req.tokens[i], std::span<float>(out.logits.data() + r * vocab, vocab));
    }
    cache_.grow(req.tokens.size());
  }

 private:
  cache_type cache_;
};

static_assert(specdec::causal_lm<cyclic_model>);
static_assert(specdec::proposer<specdec::prompt_lookup_proposer>);
static_assert(specdec::verifier<specdec::tree_verifier, specdec::sampler>);

}  // namespace

int main() {
  namespace sd = specdec;
  // 1. A proposer: prompt lookup finds "1 2 3 4" after the last "3" and drafts "4 1 2".
  std::vector<sd::token_id> const context{1, 2, 3, 4, 1, 2, 3};
  sd::prompt_lookup_proposer proposer({.n_max = 2, .n_min = 1, .k = 3});
  proposer.begin(context);
  sd::philox rng(42);
  sd::propose_context ctx;
  ctx.tokens = context;
  ctx.max_nodes = 3;
  ctx.rng = &rng;
  sd::draft_tree tree(4);
  proposer.propose(ctx, tree);
  if (tree.size() != 4 || tree.root() != 3 || tree.token(1) != 4 || tree.token(3) != 2) {
    std::puts("prompt_lookup_proposer drafted an unexpected tree");
    return 1;
  }

  // 2. The target's rows for the tree, and a greedy verifier: everything is accepted.
  std::vector<float> logits(tree.size() * vocab);
  for (std::size_t i = 0; i < tree.size(); ++i)
    cyclic_logits(tree.token(static_cast<sd::node_index>(i)),
                  std::span<float>(logits.data() + i * vocab, vocab));
  sd::matrix_view<float const> const rows(logits.data(), tree.size(), vocab);
  sd::verify_result result;
  sd::greedy_verifier greedy_verifier;
  greedy_verifier.verify(tree, rows, sd::greedy{}, context, rng, result);
  if (result.num_accepted() != 3 || result.bonus() != 3) {
    std::puts("greedy_verifier: expected 3 accepted tokens and the bonus 3");
    return 1;
  }

  // 3. A sampler (temperature, top-k, top-p) and the tree verifier: a valid root-to-node path.
  sd::sampling_params params;
  params.temperature = 0.7f;
  params.top_k = 4;
  params.top_p = 0.95f;
  sd::sampler const policy(params);
  sd::tree_verifier tree_verifier;
  std::uint64_t const before = rng.offset();
  tree_verifier.verify(tree, rows, policy, context, rng, result);
  if (rng.offset() != before + tree.size() || result.tokens.size() != result.num_accepted() + 1 ||
      result.bonus() < 0 || static_cast<std::size_t>(result.bonus()) >= vocab) {
    std::puts("tree_verifier: malformed result or RNG advance");
    return 1;
  }

  // 4. The whole loop: the speculative decoder over the project's own model.
  cyclic_model model;
  sd::decode_config config;
  config.max_new_tokens = 12;
  sd::speculative_decoder decoder(model, proposer, sd::greedy_verifier{}, sd::greedy{}, config);
  sd::decode_result const out = decoder.generate(context);
  for (std::size_t i = 0; i < out.tokens.size(); ++i) {
    sd::token_id const previous = i == 0 ? context.back() : out.tokens[i - 1];
    if (out.tokens[i] != previous % 4 + 1) {
      std::puts("speculative_decoder: the output is not the model's greedy continuation");
      return 1;
    }
  }
  if (out.tokens.size() != 12 || out.stats.accepted == 0) {
    std::puts("speculative_decoder: expected 12 tokens and some accepted drafts");
    return 1;
  }
  std::printf("ok: %zu tokens in %zu steps (%zu drafts accepted)\n", out.tokens.size(),
              out.stats.steps, out.stats.accepted);
  return 0;
}
