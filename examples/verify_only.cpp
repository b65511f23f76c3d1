// Using only specdec's verification in an engine that runs its own loop.
//
// An engine that already drafts and scores (its own scheduler, batching, KV cache and kernels)
// can hand specdec just the decision of each step: given the draft and the target's rows it
// computes, which draft tokens are accepted and which token comes next -- exactly, losslessly,
// under the engine's sampling parameters. What specdec needs:
//
//   draft_tree         the draft (a chain is a tree); node 0 is the root = the last committed
//                      token, node i > 0 a draft token; q rows for drafts that were sampled
//   target rows        [tree.size(), vocab] logits (or probabilities), row i = the target's
//                      next-token row after the path root .. node i
//   sampling policy    `specdec::greedy` or `specdec::sampler` (temperature, top-k/p, min-p,
//                      penalties, logit bias): the exact distribution both sides sample from
//   history            every committed token, the root last (for penalties)
//   philox             the random stream: (seed, stream, offset); a verifier reads the words at
//                      offset + 0 .. offset + tree.size() - 1 and advances by tree.size()
//
// and what comes back: `verify_result` = the accepted node indices (the path to commit) and the
// tokens to emit (the accepted drafts, then one bonus token). This program shows five cases:
//   1. a greedy chain,               2. a sampled chain (speculative sampling) + a lossless check,
//   3. rows already softmaxed,       4. a multi-candidate tree,
//   5. a ragged batch of sequences in one call.
// The "target" here is a deterministic function of the context standing in for a real model.

#include <specdec/specdec.hpp>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

namespace sd = specdec;

namespace {

constexpr std::size_t vocab = 8;

// The engine's "target model": the next-token logits after a context (depends on the last two
// tokens). A real engine reads these rows from its forward pass over the draft tree.
void target_row(std::span<sd::token_id const> context, std::span<float> row) {
  sd::token_id const a = context.back();
  sd::token_id const b = context.size() > 1 ? context[context.size() - 2] : 0;
  for (std::size_t v = 0; v < vocab; ++v)
    row[v] = 2.0f * std::cos(0.9f * static_cast<float>(v) + 1.3f * static_cast<float>(a) +
                             0.4f * static_cast<float>(b));
}

// Fills rows [tree.size(), vocab] of the target for every node of `tree` after `history` (whose
// last token is the root): row i is the target's row after the path root .. node i. This is what
// one forward over the tree with its ancestor mask (`tree.mask()`) produces.
std::vector<float> target_rows(sd::draft_tree const& tree, std::span<sd::token_id const> history) {
  std::vector<float> rows(tree.size() * vocab);
  for (std::size_t i = 0; i < tree.size(); ++i) {
    std::vector<sd::token_id> context(history.begin(), history.end());
    std::vector<sd::token_id> path;
    for (auto n = static_cast<sd::node_index>(i); n > 0; n = tree.parent(n))
      path.insert(path.begin(), tree.token(n));
    context.insert(context.end(), path.begin(), path.end());
    target_row(context, std::span<float>(rows.data() + i * vocab, vocab));
  }
  return rows;
}

// The engine's draft model: a flatter, imperfect copy of the target. It samples a chain of k tokens
// after `history` from its distribution q under the SAME policy, reading `rng`, and records each q
// row in the tree (q row i = the distribution node i + 1 was drawn from).
void draft_chain(sd::sampler const& policy, std::span<sd::token_id const> history, std::size_t k,
                 sd::philox& rng, sd::draft_tree& tree) {
  if (tree.q_vocab() != vocab) tree.enable_q(vocab);
  tree.reset(history.back());
  std::vector<sd::token_id> context(history.begin(), history.end());
  std::vector<float> logits(vocab);
  for (std::size_t i = 0; i < k; ++i) {
    target_row(context, logits);
    for (float& l : logits) l *= 0.5f;
    std::span<float> const q = tree.q_row(static_cast<sd::node_index>(i));
    policy.distribution(logits, context, q);
    sd::token_id const t = policy.sample(q, rng);
    (void)tree.add_node(static_cast<sd::node_index>(i), t);
    context.push_back(t);
  }
}

void print_result(char const* label, sd::verify_result const& r) {
  std::printf("%s: accepted %zu", label, r.num_accepted());
  if (!r.accepted_nodes.empty()) {
    std::printf(" (nodes");
    for (sd::node_index n : r.accepted_nodes) std::printf(" %d", n);
    std::printf(")");
  }
  std::printf(", emit");
  for (sd::token_id t : r.tokens) std::printf(" %d", t);
  std::printf("\n");
}

}  // namespace

int main() {
  try {
    std::vector<sd::token_id> const history{1, 5, 2};  // committed tokens; 2 is the root

    // ---------------------------------------------------------------------------------------
    // 1. Greedy chain. The engine drafted 3 tokens; the greedy verifier accepts the longest
    // prefix equal to the target's argmax and emits the argmax after it. One verifier per thread
    // (it owns scratch buffers); one verify_result reused every step.
    {
      std::vector<float> probe(vocab);
      std::vector<sd::token_id> context = history;
      std::vector<sd::token_id> drafts;
      for (int i = 0; i < 2; ++i) {  // two tokens the target agrees with ...
        target_row(context, probe);
        sd::token_id const t = sd::argmax(std::span<float const>(probe));
        drafts.push_back(t);
        context.push_back(t);
      }
      drafts.push_back((drafts.back() + 3) % static_cast<sd::token_id>(vocab));  // ... one it won't
      sd::draft_tree const tree = sd::draft_tree::chain(history.back(), drafts);
      std::vector<float> const rows = target_rows(tree, history);

      sd::greedy_verifier verifier;
      sd::philox rng(/*seed=*/1, /*stream=*/0);
      sd::verify_result result;
      verifier.verify(tree, sd::matrix_view<float const>(rows.data(), tree.size(), vocab),
                      sd::greedy{}, history, rng, result);
      print_result("1. greedy chain", result);
      // Commit in the engine: its KV cache holds the committed tokens before the root, then the
      // tree's entries in node order. Keep the root and the accepted nodes: for a chain whose
      // accepted nodes are 1..m that is a truncation to base + 1 + m entries; for a tree, move
      // entry base + a_i to base + i (specdec::kv_cache::keep_path). The bonus token is the next
      // root: it is not in the cache yet.
      std::printf("   keep %zu of the tree's %zu cache entries; rng advanced to offset %llu\n",
                  result.num_accepted() + 1, tree.size(),
                  static_cast<unsigned long long>(rng.offset()));
    }

    // ---------------------------------------------------------------------------------------
    // 2. Sampled chain (speculative sampling). The engine's draft model sampled each token from
    // its own distribution q under the SAME policy; those q rows go into the tree. The verifier
    // accepts x with probability min(1, p(x)/q(x)) and resamples a rejection from max(p - q, 0).
    sd::sampling_params params;
    params.temperature = 0.9f;
    params.top_k = 6;
    sd::sampler const policy(params);
    {
      sd::draft_tree tree(3);
      sd::philox rng(/*seed=*/7, /*stream=*/42);   // e.g. stream = the request id
      draft_chain(policy, history, 2, rng, tree);  // the draft reads its words first ...
      std::vector<float> const rows = target_rows(tree, history);
      sd::matrix_view<float const> const view(rows.data(), tree.size(), vocab);
      sd::speculative_sampling_verifier verifier;
      sd::verify_result result;
      verifier.verify(tree, view, policy, history, rng, result);  // ... then the verifier
      print_result("2. sampled chain", result);

      // Lossless, checked: over many independent streams (draft and verification both random),
      // the first emitted token follows the target's own distribution p (row 0 under the policy).
      std::vector<float> p(vocab);
      policy.distribution(view.row(0), history, p);
      constexpr int trials = 20000;
      std::array<int, vocab> counts{};
      sd::draft_tree t(3);
      for (int s = 0; s < trials; ++s) {
        sd::philox r(/*seed=*/7, /*stream=*/static_cast<std::uint64_t>(s));
        draft_chain(policy, history, 2, r, t);
        std::vector<float> const trial_rows = target_rows(t, history);
        verifier.verify(t, sd::matrix_view<float const>(trial_rows.data(), t.size(), vocab), policy,
                        history, r, result);
        ++counts[static_cast<std::size_t>(result.tokens.front())];
      }
      double worst = 0.0;
      for (std::size_t v = 0; v < vocab; ++v)
        worst = std::max(worst, std::abs(counts[v] / double{trials} - double{p[v]}));
      std::printf(
          "   first token over %d requests: largest gap to the target's p = %.4f "
          "(sampling noise ~ %.4f)\n",
          trials, worst, 0.5 / std::sqrt(double{trials}));
      if (worst > 0.02) {
        std::printf("ERROR: the emitted token does not follow the target distribution\n");
        return 1;
      }

      // -------------------------------------------------------------------------------------
      // 3. Rows already softmaxed by the engine (a fused kernel): verify_probs takes the target
      // distributions p directly (the policy must already be applied to them).
      std::vector<float> probs(rows.size());
      std::vector<sd::token_id> path_history = history;
      for (std::size_t i = 0; i < tree.size(); ++i) {
        policy.distribution(view.row(i), path_history,
                            std::span<float>(probs.data() + i * vocab, vocab));
        if (i + 1 < tree.size())
          path_history.push_back(tree.token(static_cast<sd::node_index>(i + 1)));
      }
      // Two generators at the same position read the same words, so both calls decide alike.
      sd::philox a(/*seed=*/7, /*stream=*/42);
      sd::philox b(/*seed=*/7, /*stream=*/42);
      sd::verify_result from_logits;
      sd::verify_result from_probs;
      verifier.verify(tree, view, policy, history, a, from_logits);
      verifier.verify_probs(tree, sd::matrix_view<float const>(probs.data(), tree.size(), vocab), b,
                            from_probs);
      print_result("3. from probabilities", from_probs);
      if (from_probs.tokens != from_logits.tokens) {
        std::printf("ERROR: verify_probs and verify disagree on the same stream\n");
        return 1;
      }
    }

    // ---------------------------------------------------------------------------------------
    // 4. A tree of deterministic candidates (e.g. the top-3 of a draft at the first position,
    // then a chain under the best one, or n-gram continuations). Siblings are tried in order,
    // each as a point mass: lossless for any number of children.
    sd::draft_tree tree(8);
    tree.reset(history.back());
    sd::node_index const first = tree.add_node(0, 3);
    (void)tree.add_node(first, 4);
    (void)tree.add_node(0, 6);
    (void)tree.add_node(0, 0);
    std::vector<float> const tree_rows = target_rows(tree, history);
    sd::tree_verifier tree_verifier;
    sd::verify_result tree_result;
    sd::philox tree_rng(/*seed=*/3);
    tree_verifier.verify(tree, sd::matrix_view<float const>(tree_rows.data(), tree.size(), vocab),
                         policy, history, tree_rng, tree_result);
    print_result("4. candidate tree", tree_result);

    // ---------------------------------------------------------------------------------------
    // 5. A ragged batch: the engine scored the trees of several sequences in one forward, rows
    // stacked; sequence b owns rows [cu_nodes[b], cu_nodes[b + 1]). Each sequence keeps its own
    // random stream (here: seed 11, stream = sequence id). Same results as one call per sequence.
    std::vector<sd::token_id> const other_history{4, 4, 7};
    std::vector<sd::token_id> const other_drafts{1};
    sd::draft_tree const other = sd::draft_tree::chain(other_history.back(), other_drafts);
    std::vector<float> stacked = target_rows(tree, history);
    std::vector<float> const other_rows = target_rows(other, other_history);
    stacked.insert(stacked.end(), other_rows.begin(), other_rows.end());
    std::array<sd::draft_tree const*, 2> const trees{&tree, &other};
    std::array<std::int32_t, 3> const cu_nodes{
        0, static_cast<std::int32_t>(tree.size()),
        static_cast<std::int32_t>(tree.size() + other.size())};
    std::array<std::span<sd::token_id const>, 2> const histories{history, other_history};
    std::array<sd::philox, 2> rngs{sd::philox(11, 0), sd::philox(11, 1)};
    std::array<sd::verify_result, 2> results;
    tree_verifier.verify_batch(
        trees, sd::matrix_view<float const>(stacked.data(), stacked.size() / vocab, vocab),
        cu_nodes, policy, histories, rngs, results);
    print_result("5. batch, sequence 0", results[0]);
    print_result("   batch, sequence 1", results[1]);
    for (std::size_t b = 0; b < 2; ++b) {
      sd::philox alone(11, b);
      sd::verify_result single;
      auto const first_row = static_cast<std::size_t>(cu_nodes[b]);
      tree_verifier.verify(
          *trees[b],
          sd::matrix_view<float const>(stacked.data() + first_row * vocab, trees[b]->size(), vocab),
          policy, histories[b], alone, single);
      if (single.tokens != results[b].tokens || alone.offset() != rngs[b].offset()) {
        std::printf("ERROR: the batched call differs from one call per sequence\n");
        return 1;
      }
    }
    return 0;
  } catch (sd::error const& e) {
    // Malformed input (row counts that disagree with the tree, token ids outside the vocabulary,
    // NaN logits, q rows that are not distributions) throws specdec::error, saying what and where.
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
