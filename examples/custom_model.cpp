// Plugging an engine's own model into specdec.
//
// An inference engine already has a model and a KV cache. To use specdec's proposers, verifiers
// and decoder it implements one small adapter, `specdec::causal_lm`:
//
//   vocab_size(), max_context(), hidden_size()   sizes, read once
//   forward(request, result)                     score a batch of tokens at given positions, each
//                                                seeing the cache plus the batch tokens its mask
//                                                row allows; append the batch's KV entries
//   cache()                                      a `specdec::kv_cache`: size(), capacity(),
//                                                truncate(n), keep_path(n, keep)
//
// This program does that for a toy model: one attention layer over token embeddings with a
// recency bias, and a KV cache of its own. It checks the adapter (a tree forward must equal
// scoring each path alone), then decodes with
//   1. prompt lookup + greedy verification (checked token-identical to plain greedy decoding),
//   2. a sampling policy (temperature, top-p) + the tree verifier over multi-branch drafts,
// and prints what happened. Copy the adapter, replace the arithmetic with your engine's calls.
//
// Build: part of specdec's examples (example_custom_model); no model files needed.

#include <specdec/specdec.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace {

namespace sd = specdec;

// ---------------------------------------------------------------------------------------------
// The engine's KV cache. specdec only needs the four calls of `specdec::kv_cache`; how entries are
// stored is the engine's business. Here an entry is the token's key/value vector and its position.
class toy_kv_cache {
 public:
  toy_kv_cache(std::size_t capacity, std::size_t dim)
      : capacity_(capacity), dim_(dim), values_(capacity * dim), positions_(capacity) {}

  // Committed entries; a forward appends after them.
  [[nodiscard]] std::size_t size() const { return size_; }
  // Most entries it can hold (the decoder never asks for more).
  [[nodiscard]] std::size_t capacity() const { return capacity_; }

  // Rollback of a chain: drop entries >= n.
  void truncate(std::size_t n) {
    SPECDEC_CHECK(n <= size_, out_of_range, "toy_kv_cache::truncate: ", n, " > size ", size_);
    size_ = n;
  }

  // Commit of a tree step: keep [0, n), move entry n + keep[i] to n + i, drop the rest. After a
  // step the decoder keeps the root and the accepted nodes, so keep = {0, a_1, ..., a_m}
  // (strictly ascending: nodes are stored in topological order and a path descends).
  void keep_path(std::size_t n, std::span<std::int32_t const> keep) {
    SPECDEC_CHECK(n <= size_, out_of_range, "toy_kv_cache::keep_path: prefix ", n, " > size ",
                  size_);
    for (std::size_t i = 0; i < keep.size(); ++i) {
      SPECDEC_CHECK(keep[i] >= 0 && n + static_cast<std::size_t>(keep[i]) < size_ &&
                        (i == 0 || keep[i - 1] < keep[i]),
                    invalid_argument, "toy_kv_cache::keep_path: bad entry keep[", i,
                    "] = ", keep[i]);
    }
    for (std::size_t i = 0; i < keep.size(); ++i) {
      std::size_t const from = n + static_cast<std::size_t>(keep[i]);
      std::size_t const to = n + i;  // to <= from: copying in order never overwrites a source
      if (from != to) {
        for (std::size_t d = 0; d < dim_; ++d) values_[to * dim_ + d] = values_[from * dim_ + d];
      }
      // The node kept at index i has depth i, so it was scored at position n + i: exactly the slot
      // it lands in. Position-dependent data (keys rotated by RoPE) needs no fixing.
      positions_[to] = positions_[from];
    }
    size_ = n + keep.size();
  }

  // Engine-side helpers (not part of the concept).
  void append(std::span<float const> value, sd::position_t position) {
    std::copy(value.begin(), value.end(),
              values_.begin() + static_cast<std::ptrdiff_t>(size_ * dim_));
    positions_[size_++] = position;
  }
  [[nodiscard]] std::span<float const> value(std::size_t i) const {
    return std::span<float const>(values_.data() + i * dim_, dim_);
  }
  [[nodiscard]] sd::position_t position(std::size_t i) const { return positions_[i]; }

 private:
  std::size_t capacity_;
  std::size_t dim_;
  std::size_t size_ = 0;
  std::vector<float> values_;              // [capacity, dim], row-major
  std::vector<sd::position_t> positions_;  // [capacity]
};

// ---------------------------------------------------------------------------------------------
// The engine's model: token embeddings E [vocab, dim]; a token at position p attends to every
// entry it may see with score dot(E[t], v_j) / sqrt(dim) - recency * (p - p_j); its hidden state
// is E[t] + the attention-weighted values; logits = U h (U: the classifier).
class toy_model {
 public:
  toy_model(std::size_t vocab, std::size_t dim, std::size_t max_context, std::uint64_t seed)
      : vocab_(vocab),
        dim_(dim),
        max_context_(max_context),
        embed_(vocab * dim),
        unembed_(vocab * dim),
        cache_(max_context, dim) {
    sd::philox rng(seed);
    for (float& w : embed_) w = 2.0f * rng.uniform() - 1.0f;
    for (float& w : unembed_) w = 2.0f * rng.uniform() - 1.0f;
  }

  [[nodiscard]] std::size_t vocab_size() const { return vocab_; }
  [[nodiscard]] std::size_t max_context() const { return max_context_; }
  [[nodiscard]] std::size_t hidden_size() const { return dim_; }
  [[nodiscard]] toy_kv_cache& cache() { return cache_; }
  [[nodiscard]] toy_kv_cache const& cache() const { return cache_; }
  [[nodiscard]] std::size_t forwards() const { return forwards_; }

  // Scores the batch and appends its entries. The contract (see specdec::forward_request):
  // - token i sees every cache entry and the batch tokens j with req.visible(i, j) -- a draft
  //   tree's ancestor mask, so sibling branches never see each other;
  // - logits rows in request order: all batch rows, or only req.logits_rows when given
  //   (the prefill asks for its last row only);
  // - the batch's entries are appended in batch order; the decoder then keeps what was accepted.
  // Errors are thrown before anything changes.
  void forward(sd::forward_request const& req, sd::forward_result& out) {
    req.validate(vocab_, max_context_);
    std::size_t const n = req.tokens.size();
    std::size_t const base = cache_.size();
    SPECDEC_CHECK(base + n <= cache_.capacity(), context_overflow, "toy_model: ", base, " + ", n,
                  " entries exceed the cache of ", cache_.capacity());
    std::size_t const rows = req.logits_rows.empty() ? n : req.logits_rows.size();
    out.vocab = vocab_;
    out.hidden_size = dim_;
    out.logits_count = rows;
    out.logits.resize(rows * vocab_);  // reused across calls: no allocation once warm
    out.hidden.resize(req.want_hidden ? n * dim_ : 0);
    out.layer_hidden.clear();

    hidden_.resize(n * dim_);
    scores_.resize(base + n);
    for (std::size_t i = 0; i < n; ++i) {
      std::span<float const> const q = embedding(req.tokens[i]);
      float const p = static_cast<float>(req.positions[i]);
      // Scores over the visible entries: the whole cache, then the visible batch tokens.
      float best = -INFINITY;
      for (std::size_t j = 0; j < base + n; ++j) {
        bool const in_cache = j < base;
        if (!in_cache && !req.visible(i, j - base)) {
          scores_[j] = -INFINITY;
          continue;
        }
        std::span<float const> const v =
            in_cache ? cache_.value(j) : embedding(req.tokens[j - base]);
        float const pj =
            static_cast<float>(in_cache ? cache_.position(j) : req.positions[j - base]);
        scores_[j] = dot(q, v) / std::sqrt(static_cast<float>(dim_)) - recency_ * (p - pj);
        best = std::max(best, scores_[j]);
      }
      float* h = hidden_.data() + i * dim_;
      std::copy(q.begin(), q.end(), h);
      float total = 0.0f;
      for (std::size_t j = 0; j < base + n; ++j)
        total += scores_[j] == -INFINITY ? 0.0f : std::exp(scores_[j] - best);
      for (std::size_t j = 0; j < base + n; ++j) {
        if (scores_[j] == -INFINITY) continue;
        float const w = std::exp(scores_[j] - best) / total;
        std::span<float const> const v =
            j < base ? cache_.value(j) : embedding(req.tokens[j - base]);
        for (std::size_t d = 0; d < dim_; ++d) h[d] += w * v[d];
      }
      if (req.want_hidden)
        std::copy(h, h + dim_, out.hidden.begin() + static_cast<std::ptrdiff_t>(i * dim_));
    }
    for (std::size_t r = 0; r < rows; ++r) {
      std::size_t const i =
          req.logits_rows.empty() ? r : static_cast<std::size_t>(req.logits_rows[r]);
      std::span<float const> const h(hidden_.data() + i * dim_, dim_);
      for (std::size_t v = 0; v < vocab_; ++v)
        out.logits[r * vocab_ + v] = 2.0f * dot(h, unembedding(v));
    }
    // Append the batch's entries in batch order (the value is the token's embedding here).
    for (std::size_t i = 0; i < n; ++i) cache_.append(embedding(req.tokens[i]), req.positions[i]);
    ++forwards_;
  }

 private:
  [[nodiscard]] std::span<float const> embedding(sd::token_id t) const {
    return std::span<float const>(embed_.data() + static_cast<std::size_t>(t) * dim_, dim_);
  }
  [[nodiscard]] std::span<float const> unembedding(std::size_t v) const {
    return std::span<float const>(unembed_.data() + v * dim_, dim_);
  }
  static float dot(std::span<float const> a, std::span<float const> b) {
    float s = 0.0f;
    for (std::size_t d = 0; d < a.size(); ++d) s += a[d] * b[d];
    return s;
  }

  std::size_t vocab_;
  std::size_t dim_;
  std::size_t max_context_;
  float recency_ = 0.2f;        // score penalty per position of distance
  std::vector<float> embed_;    // [vocab, dim] token embeddings (also the keys and values)
  std::vector<float> unembed_;  // [vocab, dim] classifier
  toy_kv_cache cache_;
  std::vector<float> hidden_;  // [batch, dim] scratch
  std::vector<float> scores_;  // [cache + batch] scratch
  std::size_t forwards_ = 0;
};

// The adapter is checked at compile time: a missing or misspelled member fails here, with the
// concept's requirement named in the diagnostic.
static_assert(sd::kv_cache<toy_kv_cache>);
static_assert(sd::causal_lm<toy_model>);

// A word for each token id, so the output reads as text.
std::string word(sd::token_id t) {
  static char const* const words[] = {
      "the",  "cat", "sat",   "on",   "a",     "mat",  "and",    "dog",  "ran", "to",  "park",
      "sun",  "was", "warm",  "bird", "sang",  "in",   "tree",   "girl", "saw", "big", "red",
      "ball", "boy", "threw", "it",   "happy", "they", "played", "all",  "day", "."};
  return words[static_cast<std::size_t>(t) % (sizeof(words) / sizeof(words[0]))];
}

void print_text(char const* label, std::span<sd::token_id const> tokens) {
  std::printf("%s", label);
  for (sd::token_id t : tokens) std::printf(" %s", word(t).c_str());
  std::printf("\n");
}

// A self-check worth running on any adapter: scoring a draft tree in one forward must give, for
// every node, the same logits as scoring the path to that node alone with a causal mask. A model
// that ignores the mask (or the positions) fails it, and speculative output would then differ
// from plain decoding.
bool tree_forward_matches_paths(toy_model& model, std::span<sd::token_id const> prefix) {
  // Root 9 with two branches: 9 -> 4 -> 6 and 9 -> 5.
  sd::draft_tree tree(4);
  tree.reset(9);
  sd::node_index const a = tree.add_node(0, 4);
  (void)tree.add_node(a, 6);
  (void)tree.add_node(0, 5);
  auto const base = static_cast<sd::position_t>(prefix.size());

  auto prefill = [&] {
    model.cache().truncate(0);
    std::vector<sd::position_t> positions(prefix.size());
    for (std::size_t i = 0; i < positions.size(); ++i)
      positions[i] = static_cast<sd::position_t>(i);
    sd::forward_result ignored;
    model.forward({.tokens = prefix, .positions = positions}, ignored);
  };

  prefill();
  std::vector<sd::position_t> positions(tree.size());
  for (std::size_t i = 0; i < tree.size(); ++i)
    positions[i] = base + tree.depth(static_cast<sd::node_index>(i));
  sd::forward_result tree_out;
  model.forward({.tokens = tree.tokens(),
                 .positions = positions,
                 .mask = tree.mask(),
                 .mask_stride = tree.mask_stride()},
                tree_out);

  for (std::size_t node = 0; node < tree.size(); ++node) {
    // The path root .. node, scored alone (causal: an empty mask).
    std::vector<sd::token_id> path;
    for (auto i = static_cast<sd::node_index>(node); i >= 0; i = tree.parent(i))
      path.insert(path.begin(), tree.token(i));
    std::vector<sd::position_t> path_positions(path.size());
    for (std::size_t i = 0; i < path.size(); ++i)
      path_positions[i] = base + static_cast<sd::position_t>(i);
    prefill();
    sd::forward_result path_out;
    model.forward({.tokens = path, .positions = path_positions}, path_out);
    std::span<float const> const want = path_out.logits_view().row(path.size() - 1);
    std::span<float const> const got = tree_out.logits_view().row(node);
    for (std::size_t v = 0; v < want.size(); ++v)
      if (std::abs(want[v] - got[v]) > 1e-5f * (1.0f + std::abs(want[v]))) return false;
  }
  model.cache().truncate(0);
  return true;
}

void print_stats(sd::request_stats const& s, std::size_t forwards) {
  std::printf("  %zu tokens in %zu steps, %zu target forwards (prefill included)\n", s.generated,
              s.steps, forwards);
  std::printf("  drafted %zu, accepted %zu (acceptance %.2f), %.2f tokens per step\n", s.drafted,
              s.accepted, s.acceptance_rate(), s.mean_accepted_length());
  if (s.drafted == 0) return;
  std::printf("  acceptance by depth:");
  for (std::size_t d = 0; d < s.drafted_at_depth.size() && d < 8; ++d)
    std::printf(" %zu:%.2f", d + 1,
                static_cast<double>(s.accepted_at_depth[d]) /
                    static_cast<double>(std::max<std::size_t>(1, s.drafted_at_depth[d])));
  std::printf("\n");
}

}  // namespace

int main() {
  try {
    constexpr std::size_t vocab = 32;
    toy_model model(vocab, /*dim=*/16, /*max_context=*/256, /*seed=*/3);
    std::vector<sd::token_id> const prompt{0, 1, 2, 3, 4, 5, 31, 7, 8, 9, 0, 10, 31};

    if (!tree_forward_matches_paths(model, prompt)) {
      std::printf("ERROR: a tree forward differs from scoring each path alone\n");
      return 1;
    }
    std::printf("adapter check: a tree forward equals scoring each path alone\n");

    sd::decode_config config;
    config.max_new_tokens = 80;
    config.max_draft_nodes = 16;
    config.seed = 7;

    // --- Plain greedy decoding, the reference.
    std::size_t const f0 = model.forwards();
    sd::autoregressive_decoder baseline(model, sd::greedy{}, config);
    sd::decode_result const plain = baseline.generate(prompt);
    std::size_t const plain_forwards = model.forwards() - f0;
    print_text("prompt:", prompt);
    print_text("greedy:", plain.tokens);
    print_stats(plain.stats, plain_forwards);

    // --- 1. Prompt lookup drafts chains of up to 6 tokens copied from earlier in the sequence;
    // the greedy verifier accepts the longest prefix the model agrees with, plus one token.
    sd::prompt_lookup_proposer lookup({.n_max = 3, .n_min = 1, .k = 6});
    sd::speculative_decoder greedy_decoder(model, lookup, sd::greedy_verifier{}, sd::greedy{},
                                           config);
    std::size_t const f1 = model.forwards();
    sd::decode_result const fast = greedy_decoder.generate(prompt);
    std::printf("\nprompt lookup + greedy verifier:\n");
    print_stats(fast.stats, model.forwards() - f1);
    if (fast.tokens != plain.tokens) {
      std::printf("ERROR: speculative greedy output differs from plain greedy decoding\n");
      return 1;
    }
    std::printf("  output identical to plain greedy decoding\n");

    // --- 2. Sampling: temperature 0.8, top-p 0.95. Prompt lookup merges up to 3 continuations
    // into a tree; the tree verifier treats each candidate as a point mass, which keeps the output
    // distributed exactly as plain sampling from the same policy.
    sd::sampling_params params;
    params.temperature = 0.8f;
    params.top_p = 0.95f;
    sd::sampler const policy(params);
    sd::prompt_lookup_proposer branches({.n_max = 3, .n_min = 1, .k = 5, .max_branches = 3});
    sd::speculative_decoder sampling_decoder(model, branches, sd::tree_verifier{}, policy, config);
    std::size_t const f2 = model.forwards();
    sd::decode_result const sampled = sampling_decoder.generate(prompt);
    std::printf("\nprompt lookup (3 branches) + tree verifier, temperature 0.8, top-p 0.95:\n");
    print_text("sampled:", sampled.tokens);
    print_stats(sampled.stats, model.forwards() - f2);
    std::printf("  largest tree: %zu nodes\n", sampled.stats.max_tree_size);

    // The request's randomness is one Philox stream (config.seed): the same seed gives the same
    // tokens, a different seed other ones.
    if (sampling_decoder.generate(prompt).tokens != sampled.tokens) {
      std::printf("ERROR: the same seed gave different tokens\n");
      return 1;
    }
    std::printf("  same seed, same tokens\n");
    return 0;
  } catch (sd::error const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
