// The minimal models of each concept shown in docs/concepts.md, verbatim: they must satisfy their
// concept and work together in the speculative decoder, so the page cannot drift from the code.
#include "support/doctest.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/specdec.hpp"

namespace doc {

using namespace specdec;

// --- sampling_policy (docs/concepts.md) ---
// Plain softmax at temperature 1, no processing.
struct softmax_policy {
  void distribution(std::span<float const> logits, std::span<token_id const> /*history*/,
                    std::span<float> probs) const {
    softmax(logits, probs);
  }
  token_id sample(std::span<float const> probs, philox& rng) const {
    return sample_from(probs, rng.uniform());  // exactly one word of rng
  }
  bool is_greedy() const { return false; }
  token_id greedy_token(std::span<float const> logits, std::span<token_id const>) const {
    return argmax(logits);
  }
};
static_assert(sampling_policy<softmax_policy>);

// --- verifier ---
// Accepts no draft and samples the next token from the root's row: lossless (it is plain
// sampling) and useless, but it keeps the contract, RNG included.
class root_only_verifier {
 public:
  static constexpr bool greedy_only = false;
  static constexpr bool supports_trees = true;
  static constexpr bool needs_draft_probs = false;
  static constexpr bool lossless = true;

  template <sampling_policy Policy>
  void verify(draft_tree const& tree, matrix_view<float const> target_logits, Policy const& policy,
              std::span<token_id const> history, philox& rng, verify_result& out) {
    SPECDEC_CHECK(target_logits.rows() == tree.size(), invalid_argument,
                  "root_only_verifier: ", target_logits.rows(), " rows for ", tree.size(),
                  " nodes");
    probs_.resize(target_logits.cols());  // grows once, then reused
    out.clear();
    policy.distribution(target_logits.row(0), history, probs_);
    philox word0 = rng;  // the final draw reads word offset() + 0
    out.tokens.push_back(policy.sample(probs_, word0));
    rng.skip(tree.size());  // every verifier advances by tree.size(), whatever happened
  }

 private:
  std::vector<float> probs_;
};
static_assert(verifier<root_only_verifier, softmax_policy>);

// --- proposer ---
// Drafts the last token repeated k times (a chain of deterministic candidates).
struct repeat_proposer {
  static constexpr bool produces_trees = false;
  static constexpr bool samples_drafts = false;
  static constexpr bool needs_target_hidden = false;

  std::size_t k = 3;

  void begin(std::span<token_id const> /*prompt*/) {}
  void propose(propose_context const& ctx, draft_tree& tree) {
    tree.reset(ctx.tokens.back());
    std::size_t const n = std::min({k, ctx.max_nodes, tree.capacity() - 1});
    for (std::size_t i = 0; i < n; ++i)
      (void)tree.add_node(static_cast<node_index>(i), ctx.tokens.back());
  }
  void accept(verify_result const& /*result*/) {}
};
static_assert(proposer<repeat_proposer>);

// --- kv_cache ---
// Counts positions; a real cache moves its K/V rows in keep_path.
class counting_cache {
 public:
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return 1024; }
  void truncate(std::size_t n) {
    SPECDEC_CHECK(n <= size_, out_of_range, "counting_cache: truncate to ", n, " > ", size_);
    size_ = n;
  }
  void keep_path(std::size_t n, std::span<std::int32_t const> keep) {
    SPECDEC_CHECK(n <= size_ && (keep.empty() || n + static_cast<std::size_t>(keep.back()) < size_),
                  out_of_range, "counting_cache: keep_path beyond the cache");
    size_ = n + keep.size();  // entry n + keep[i] would move to n + i
  }
  void append(std::size_t count) { size_ += count; }

 private:
  std::size_t size_ = 0;
};
static_assert(kv_cache<counting_cache>);

// --- causal_lm ---
// A bigram model: the logits of a token depend on that token only (so any mask is honoured
// trivially; examples/custom_model.cpp has a model that attends).
class bigram_lm {
 public:
  explicit bigram_lm(std::vector<float> table, std::size_t vocab)
      : table_(std::move(table)), vocab_(vocab) {}  // table: [vocab, vocab], row = current token

  std::size_t vocab_size() const { return vocab_; }
  std::size_t max_context() const { return 1024; }
  std::size_t hidden_size() const { return 0; }
  counting_cache& cache() { return cache_; }

  void forward(forward_request const& req, forward_result& out) {
    req.validate(vocab_, max_context());
    std::size_t const n = req.tokens.size();
    SPECDEC_CHECK(cache_.size() + n <= cache_.capacity(), context_overflow,
                  "bigram_lm: the cache is full");
    std::size_t const rows = req.logits_rows.empty() ? n : req.logits_rows.size();
    out.vocab = vocab_;
    out.logits_count = rows;
    out.logits.resize(rows * vocab_);
    out.hidden_size = 0;
    out.hidden.clear();
    out.layer_hidden.clear();
    for (std::size_t r = 0; r < rows; ++r) {
      std::size_t const i =
          req.logits_rows.empty() ? r : static_cast<std::size_t>(req.logits_rows[r]);
      auto const from =
          static_cast<std::ptrdiff_t>(static_cast<std::size_t>(req.tokens[i]) * vocab_);
      std::copy_n(table_.begin() + from, vocab_,
                  out.logits.begin() + static_cast<std::ptrdiff_t>(r * vocab_));
    }
    cache_.append(n);  // the batch's entries, in batch order
  }

 private:
  std::vector<float> table_;
  std::size_t vocab_;
  counting_cache cache_;
};
static_assert(causal_lm<bigram_lm>);

// --- auxiliary_proposer ---
// Guesses that the root repeats: scores "root, root" beside the tree as one auxiliary token and,
// when the step's token did repeat the root, drafts the auxiliary row's argmax next step.
class repeat_lookahead {
 public:
  static constexpr bool has_auxiliary_tokens = true;

  void begin(std::span<token_id const> /*prompt*/) { guess_ = no_token; }
  void propose(propose_context const& ctx, draft_tree& tree) {
    tree.reset(ctx.tokens.back());
    if (guess_ != no_token && ctx.max_nodes > 0) (void)tree.add_node(0, guess_);
  }
  void auxiliary(propose_context const& /*ctx*/, draft_tree const& tree, auxiliary_batch& aux) {
    root_ = tree.root();
    auto const position = static_cast<std::size_t>(aux.base()) + 1;
    if (aux.room() == 0 || position >= aux.position_limit()) return;
    std::size_t const row = aux.add(root_, static_cast<position_t>(position));
    aux.attend(row, 0);  // it sees the root (and itself), nothing else of the tree
  }
  void observe(matrix_view<float const> /*tree_logits*/, matrix_view<float const> aux_logits,
               verify_result const& result) {
    // With nothing accepted the next root is result.bonus(), at position base + 1: if it equals
    // the root, the auxiliary row is the target's row after it.
    guess_ = aux_logits.rows() == 1 && result.num_accepted() == 0 && result.bonus() == root_
                 ? argmax(aux_logits.row(0))
                 : no_token;
  }
  void accept(verify_result const& /*result*/) {}

 private:
  token_id root_ = no_token;
  token_id guess_ = no_token;
};
static_assert(auxiliary_proposer<repeat_lookahead>);

}  // namespace doc

TEST_CASE("the minimal models of docs/concepts.md decode together") {
  namespace sd = specdec;
  constexpr std::size_t vocab = 5;
  // Token t strongly predicts (t + 1) % 5, except 3, which predicts 3 again.
  std::vector<float> table(vocab * vocab, 0.0f);
  for (std::size_t t = 0; t < vocab; ++t) table[t * vocab + (t == 3 ? 3 : (t + 1) % vocab)] = 8.0f;
  doc::bigram_lm model(table, vocab);
  std::vector<sd::token_id> const prompt{0, 1, 2};

  // The repeat proposer with the greedy verifier: greedy output equals plain greedy decoding, and
  // once the model loops on 3 every draft is accepted.
  sd::decode_config config;
  config.max_new_tokens = 20;
  doc::repeat_proposer repeat{.k = 4};
  sd::speculative_decoder greedy_decoder(model, repeat, sd::greedy_verifier{}, sd::greedy{},
                                         config);
  sd::decode_result const fast = greedy_decoder.generate(prompt);
  sd::autoregressive_decoder baseline(model, sd::greedy{}, config);
  CHECK(fast.tokens == baseline.generate(prompt).tokens);
  CHECK(fast.tokens.front() == 3);
  CHECK(fast.stats.accepted >= 12);

  // The softmax policy with the root-only verifier: one token per step, the stream of the
  // autoregressive baseline (same seed, same tokens).
  config.seed = 9;
  sd::speculative_decoder root_only(model, repeat, doc::root_only_verifier{}, doc::softmax_policy{},
                                    config);
  sd::decode_result const sampled = root_only.generate(prompt);
  CHECK(sampled.stats.accepted == 0);
  CHECK(sampled.tokens.size() == 20);
  // With a single-node tree (max_draft_nodes = 0) the stream matches the baseline's exactly.
  config.max_draft_nodes = 0;
  sd::speculative_decoder root_only_no_drafts(model, repeat, doc::root_only_verifier{},
                                              doc::softmax_policy{}, config);
  sd::autoregressive_decoder sampling_baseline(model, doc::softmax_policy{}, config);
  CHECK(root_only_no_drafts.generate(prompt).tokens == sampling_baseline.generate(prompt).tokens);

  // The auxiliary proposer: greedy output still equals plain greedy decoding, its guesses about the
  // repeating 3 are accepted, and the auxiliary tokens are counted.
  config = {};
  config.max_new_tokens = 20;
  doc::repeat_lookahead lookahead;
  sd::speculative_decoder aux_decoder(model, lookahead, sd::greedy_verifier{}, sd::greedy{},
                                      config);
  sd::decode_result const aux = aux_decoder.generate(prompt);
  CHECK(aux.tokens == fast.tokens);
  CHECK(aux.stats.aux_tokens > 0);
  CHECK(aux.stats.accepted > 0);
}
