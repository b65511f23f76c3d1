// lookahead_proposer and the auxiliary-token mechanism: the auxiliary_proposer concept (positive
// and negative static_asserts), auxiliary_batch, the n-gram pool against a list model, the
// window's mask and positions against the documented rule, the window's movement and pooling,
// and the combined forward (tree + window) against each branch run alone on a CPU model.
#include "specdec/propose/lookahead.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "propose/context.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/auxiliary_batch.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/error.hpp"
#include "specdec/model/random.hpp"
#include "specdec/propose/jacobi.hpp"
#include "specdec/propose/prompt_lookup.hpp"
#include "support/llama_shapes.hpp"

namespace sd = specdec;

namespace {

// The concept and the trait.
static_assert(sd::proposer<sd::lookahead_proposer>);
static_assert(sd::auxiliary_proposer<sd::lookahead_proposer>);
static_assert(sd::has_auxiliary_tokens_v<sd::lookahead_proposer>);
static_assert(sd::produces_trees_v<sd::lookahead_proposer>);
static_assert(!sd::samples_drafts_v<sd::lookahead_proposer>);
static_assert(sd::auxiliary_proposer<sd::jacobi_proposer>);
static_assert(!sd::produces_trees_v<sd::jacobi_proposer>);
static_assert(!sd::has_auxiliary_tokens_v<sd::prompt_lookup_proposer>);
static_assert(!sd::auxiliary_proposer<sd::prompt_lookup_proposer>);

struct base_proposer {
  void begin(std::span<sd::token_id const>) {}
  void propose(sd::propose_context const&, sd::draft_tree&) {}
  void accept(sd::verify_result const&) {}
};
// Declares the trait but lacks observe: has the trait, is not an auxiliary_proposer (the decoder
// rejects it with a static_assert).
struct trait_without_observe : base_proposer {
  static constexpr bool has_auxiliary_tokens = true;
  void auxiliary(sd::propose_context const&, sd::draft_tree const&, sd::auxiliary_batch&) {}
};
static_assert(sd::has_auxiliary_tokens_v<trait_without_observe>);
static_assert(!sd::auxiliary_proposer<trait_without_observe>);
// Has the members but not the trait (or the trait false): not an auxiliary proposer.
struct members_without_trait : base_proposer {
  void auxiliary(sd::propose_context const&, sd::draft_tree const&, sd::auxiliary_batch&) {}
  void observe(sd::matrix_view<float const>, sd::matrix_view<float const>,
               sd::verify_result const&) {}
};
static_assert(!sd::auxiliary_proposer<members_without_trait>);
struct trait_false : members_without_trait {
  static constexpr bool has_auxiliary_tokens = false;
};
static_assert(!sd::has_auxiliary_tokens_v<trait_false>);
static_assert(!sd::auxiliary_proposer<trait_false>);
struct complete : members_without_trait {
  static constexpr bool has_auxiliary_tokens = true;
};
static_assert(sd::auxiliary_proposer<complete>);

using propose_test::make_ctx;

}  // namespace

TEST_CASE("auxiliary_batch: tree rows keep the tree's mask, auxiliary rows their own") {
  std::vector<std::vector<sd::token_id>> const paths{{5, 6}, {7}};
  sd::draft_tree const tree = sd::draft_tree::from_paths(4, paths);  // 4 -> 5 -> 6, 4 -> 7
  sd::auxiliary_batch aux;
  aux.reset(tree, 10, 3, 100);
  CHECK(aux.tree_size() == 4);
  CHECK(aux.num_aux() == 0);
  std::size_t const a = aux.add(9, 11, false);
  std::size_t const b = aux.add(8, 12);
  CHECK(a == 4);
  CHECK(b == 5);
  aux.attend(a, 0);
  aux.attend(b, 0);
  aux.attend(b, a);
  CHECK_THROWS_AS(aux.attend(1, a), sd::error);  // tree rows are fixed
  CHECK_THROWS_AS(aux.attend(a, 9), sd::error);
  CHECK_THROWS_AS(aux.add(1, 100), sd::error);  // position limit
  CHECK_THROWS_AS(aux.add(-1, 12), sd::error);
  aux.add(1, 13);
  CHECK_THROWS_AS(aux.add(1, 14), sd::error);  // room of 3
  aux.finalize();
  CHECK_THROWS_AS(aux.add(1, 14), sd::error);
  std::vector<sd::position_t> const want_pos{10, 11, 12, 11, 11, 12, 13};
  CHECK(std::vector<sd::position_t>(aux.positions().begin(), aux.positions().end()) == want_pos);
  std::vector<sd::token_id> const want_tok{4, 5, 6, 7, 9, 8, 1};
  CHECK(std::vector<sd::token_id>(aux.tokens().begin(), aux.tokens().end()) == want_tok);
  // The combined mask: tree rows = ancestor mask, never an auxiliary column.
  REQUIRE(aux.mask_stride() == 1);
  auto const bit = [&](std::size_t i, std::size_t j) {
    return ((aux.mask()[i * aux.mask_stride()] >> j) & 1u) != 0;
  };
  for (std::size_t i = 0; i < aux.size(); ++i)
    for (std::size_t j = 0; j < aux.size(); ++j) {
      CAPTURE(i);
      CAPTURE(j);
      CHECK(bit(i, j) == aux.visible(i, j));
      if (i < 4 && j < 4)
        CHECK(bit(i, j) == tree.is_ancestor_or_self(static_cast<sd::node_index>(j),
                                                    static_cast<sd::node_index>(i)));
      if (i < 4 && j >= 4) CHECK(!bit(i, j));
    }
  CHECK(bit(4, 0));
  CHECK(bit(4, 4));
  CHECK(!bit(4, 1));
  CHECK(bit(5, 4));
  CHECK(!bit(6, 0));  // the third token attends to nothing but itself
  // Logits rows: every tree row, then the auxiliary rows that want them.
  std::vector<std::int32_t> const rows{0, 1, 2, 3, 5, 6};
  CHECK(std::vector<std::int32_t>(aux.logits_rows().begin(), aux.logits_rows().end()) == rows);
  CHECK(aux.num_aux_logits() == 2);

  // All rows wanting logits: logits_rows is empty (all rows); a wide tree (two mask words).
  std::vector<std::vector<sd::token_id>> wide;
  for (sd::token_id t = 0; t < 70; ++t) wide.push_back({t});
  sd::draft_tree const big = sd::draft_tree::from_paths(100, wide);
  aux.reset(big, 0, 200, 1000);
  for (int k = 0; k < 10; ++k) aux.attend(aux.add(k, 1 + k), 70);
  aux.finalize();
  CHECK(aux.logits_rows().empty());
  CHECK(aux.num_aux_logits() == 10);
  CHECK(aux.mask_stride() == 2);
  CHECK(aux.visible(75, 70));
  CHECK(aux.visible(70, 0));
  CHECK(!aux.visible(70, 71));
}

TEST_CASE("ngram_pool: most recent first, at most G per key (against a list model)") {
  std::mt19937_64 rng(21);
  for (std::size_t const capacity : {0u, 1u, 3u, 7u}) {
    for (std::size_t const length : {1u, 3u}) {
      sd::detail::ngram_pool pool(length, capacity);
      std::map<sd::token_id, std::deque<std::vector<sd::token_id>>> model;
      for (int op = 0; op < 3000; ++op) {
        auto const key = static_cast<sd::token_id>(rng() % 200);  // forces hash-table growth
        std::vector<sd::token_id> cont(length);
        for (auto& t : cont) t = static_cast<sd::token_id>(rng() % 3);
        pool.insert(key, cont);
        if (capacity > 0) {
          auto& list = model[key];
          auto const it = std::find(list.begin(), list.end(), cont);
          if (it != list.end()) list.erase(it);
          list.push_front(cont);
          if (list.size() > capacity) list.pop_back();
        }
        if (op % 97 == 0) {
          for (sd::token_id k = 0; k < 200; ++k) {
            auto const& list = model[k];
            REQUIRE(pool.count(k) == list.size());
            for (std::size_t e = 0; e < list.size(); ++e) {
              auto const got = pool.entry(k, e);
              CHECK(std::vector<sd::token_id>(got.begin(), got.end()) == list[e]);
            }
          }
        }
      }
      CHECK(pool.count(-1) == 0);
      pool.clear();
      CHECK(pool.count(5) == 0);
    }
  }
}

TEST_CASE("lookahead_proposer: window mask and positions follow the documented rule") {
  for (std::size_t const w : {1u, 2u, 4u}) {
    for (std::size_t const n : {2u, 3u, 5u}) {
      CAPTURE(w);
      CAPTURE(n);
      sd::lookahead_proposer p({.window = w, .ngram = n, .guesses = 2, .pool_from_context = false});
      std::vector<sd::token_id> seq{1, 2, 3, 4, 5, 6};
      p.begin(seq);
      sd::draft_tree tree(16);
      sd::auxiliary_batch aux;
      for (int step = 0; step < 6; ++step) {
        CAPTURE(step);
        auto const ctx = make_ctx(seq, 8);
        p.propose(ctx, tree);
        std::size_t const levels = p.window_levels();
        CHECK(levels == std::min<std::size_t>(n - 1, static_cast<std::size_t>(step) + 1));
        auto const base = static_cast<sd::position_t>(seq.size() - 1);
        aux.reset(tree, base, 100, 1000);
        p.auxiliary(ctx, tree, aux);
        aux.finalize();
        // Label every batch row with (level, column); tree rows other than the root: none.
        std::vector<std::pair<int, int>> label(aux.size(), {-1, -1});
        label[0] = {0, 0};
        std::size_t row = tree.size();
        for (std::size_t l = 0; l < levels; ++l)
          for (std::size_t i = l == 0 ? 1 : 0; i < w; ++i) {
            REQUIRE(row < aux.size());
            label[row] = {static_cast<int>(l), static_cast<int>(i)};
            CHECK(aux.tokens()[row] == p.window_level(l)[i]);
            CHECK(aux.positions()[row] == base + static_cast<sd::position_t>(l + i));
            ++row;
          }
        REQUIRE(row == aux.size());
        // (l, i) sees the root, level 0 columns 1..i and levels 1..l of column i.
        for (std::size_t r = tree.size(); r < aux.size(); ++r) {
          auto const [l, i] = label[r];
          for (std::size_t c = 0; c < aux.size(); ++c) {
            auto const [cl, ci] = label[c];
            bool const want = c == 0 || (cl == 0 && ci >= 1 && ci <= i) ||
                              (cl >= 1 && cl <= l && ci == i && c >= tree.size());
            CAPTURE(r);
            CAPTURE(c);
            CHECK(aux.visible(r, c) == want);
          }
        }
        CHECK(aux.num_aux_logits() == (levels == 1 ? w - 1 : w));
        // Advance: one-hot outputs; accept nothing; commit the root's prediction.
        std::size_t const vocab = 50;
        std::vector<float> tl(tree.size() * vocab, 0.0f), al(aux.num_aux_logits() * vocab, 0.0f);
        for (std::size_t r = 0; r < tree.size(); ++r) tl[r * vocab + 40 + r % 5] = 1.0f;
        for (std::size_t r = 0; r < aux.num_aux_logits(); ++r)
          al[r * vocab + 10 + (r + static_cast<std::size_t>(step)) % 20] = 1.0f;
        sd::verify_result res;
        res.tokens = {40};
        p.observe(sd::matrix_view<float const>(tl.data(), tree.size(), vocab),
                  sd::matrix_view<float const>(al.data(), aux.num_aux_logits(), vocab), res);
        p.accept(res);
        seq.push_back(40);
      }
    }
  }
}

TEST_CASE("lookahead_proposer: the window moves with the sequence and fills the pool") {
  // W = 3, N = 3 (two levels). Outputs are chosen per step; the rule is checked column by column.
  std::size_t const w = 3, vocab = 64;
  sd::lookahead_proposer p({.window = w, .ngram = 3, .guesses = 4, .pool_from_context = false});
  std::vector<sd::token_id> seq{1, 2, 3};
  p.begin(seq);
  sd::draft_tree tree(16);
  sd::auxiliary_batch aux;
  auto const step = [&](std::vector<sd::token_id> const& outputs, std::size_t accepted,
                        std::vector<sd::token_id> const& committed) {
    auto const ctx = make_ctx(seq, 8);
    p.propose(ctx, tree);
    aux.reset(tree, static_cast<sd::position_t>(seq.size() - 1), 100, 1000);
    p.auxiliary(ctx, tree, aux);
    aux.finalize();
    std::size_t const levels = p.window_levels();
    std::vector<float> tl(tree.size() * vocab, 0.0f), al(aux.num_aux_logits() * vocab, 0.0f);
    // Output of column i: tree row 0 for (level 0, column 0), else the top level's rows.
    for (std::size_t i = 0; i < w; ++i) {
      if (levels == 1 && i == 0)
        tl[static_cast<std::size_t>(outputs[0])] = 1.0f;
      else
        al[(levels == 1 ? i - 1 : i) * vocab + static_cast<std::size_t>(outputs[i])] = 1.0f;
    }
    sd::verify_result res;
    for (std::size_t k = 0; k < accepted; ++k)
      res.accepted_nodes.push_back(static_cast<sd::node_index>(k + 1));
    res.tokens = committed;
    p.observe(sd::matrix_view<float const>(tl.data(), tree.size(), vocab),
              sd::matrix_view<float const>(al.data(), aux.num_aux_logits(), vocab), res);
    p.accept(res);
    seq.insert(seq.end(), committed.begin(), committed.end());
  };
  auto const level = [&](std::size_t l) {
    auto const s = p.window_level(l);
    return std::vector<sd::token_id>(s.begin(), s.end());
  };
  std::vector<sd::token_id> const l0 = level(0);
  // Step 1 (warm-up, one token committed): levels grow to 2; level 0 and the outputs shift by 1.
  step({20, 21, 22}, 0, {9});
  REQUIRE(p.window_levels() == 2);
  CHECK(level(0)[0] == l0[1]);
  CHECK(level(0)[1] == l0[2]);
  CHECK(level(1)[0] == 21);
  CHECK(level(1)[1] == 22);
  std::vector<sd::token_id> const a0 = level(0), a1 = level(1);
  CHECK(p.pool_count(9) == 0);  // nothing pooled while warming up
  // Step 2 (full window, root 9): n-grams (9, a1[0], 30), (a0[1], a1[1], 31), (a0[2], a1[2], 32).
  step({30, 31, 32}, 0, {10});
  REQUIRE(p.pool_count(9) == 1);
  CHECK(std::vector<sd::token_id>(p.pool_entry(9, 0).begin(), p.pool_entry(9, 0).end()) ==
        std::vector<sd::token_id>{a1[0], 30});
  REQUIRE(p.pool_count(a0[2]) >= 1);
  CHECK(std::vector<sd::token_id>(p.pool_entry(a0[2], 0).begin(), p.pool_entry(a0[2], 0).end()) ==
        std::vector<sd::token_id>{a1[2], 32});
  // Full window, one token committed: rows shift up by one level, no column shift.
  CHECK(p.window_levels() == 2);
  CHECK(level(0) == a1);
  CHECK(level(1) == std::vector<sd::token_id>({30, 31, 32}));
  // Step 3: the root is 10; three tokens committed (two accepted): shift up one level and left two.
  std::vector<sd::token_id> const b1 = level(1);
  step({40, 41, 42}, 2, {11, 12, 13});
  CHECK(level(0)[0] == b1[2]);
  CHECK(level(1)[0] == 42);
  // The verification branch drafts the pooled continuations of the root.
  seq.push_back(9);
  p.propose(make_ctx(seq, 8), tree);
  REQUIRE(tree.size() == 3);
  CHECK(tree.token(1) == a1[0]);
  CHECK(tree.token(2) == 30);
  p.propose(make_ctx(seq, 1), tree);  // budget
  CHECK(tree.size() == 2);
}

TEST_CASE("lookahead_proposer: the pool learns the context's n-grams; configuration checks") {
  sd::lookahead_proposer p({.window = 2, .ngram = 3, .guesses = 2});
  std::vector<sd::token_id> const prompt{5, 6, 7, 5, 6, 8, 5};
  p.begin(prompt);
  sd::draft_tree tree(16);
  p.propose(make_ctx(prompt, 8), tree);
  // Continuations of 5: (6, 8) most recent, then (6, 7): a tree 5 -> 6 -> {8, 7}.
  REQUIRE(tree.size() == 4);
  CHECK(tree.token(1) == 6);
  CHECK(tree.token(2) == 8);
  CHECK(tree.token(3) == 7);
  CHECK(tree.parent(3) == 1);
  CHECK_THROWS_AS(sd::lookahead_proposer({.window = 0}), sd::error);
  CHECK_THROWS_AS(sd::lookahead_proposer({.ngram = 1}), sd::error);
  CHECK_THROWS_AS(sd::lookahead_proposer({.ngram = 17}), sd::error);
  CHECK_THROWS_AS(sd::lookahead_proposer({.guesses = 257}), sd::error);
  // The window is skipped when it does not fit (no room, or past the position limit).
  sd::auxiliary_batch aux;
  aux.reset(tree, 6, 1, 1000);
  p.auxiliary(make_ctx(prompt, 8), tree, aux);
  CHECK(aux.num_aux() == 1);  // level 0 only: W - 1 = 1 token fits
  aux.reset(tree, 6, 0, 1000);
  p.auxiliary(make_ctx(prompt, 8), tree, aux);
  CHECK(aux.num_aux() == 0);
  aux.reset(tree, 6, 100, 7);
  p.auxiliary(make_ctx(prompt, 8), tree, aux);
  CHECK(aux.num_aux() == 0);
}

TEST_CASE("jacobi_proposer: guesses are the target's predictions after the accepted prefix") {
  sd::jacobi_proposer p({.block = 4});
  std::vector<sd::token_id> seq{3, 7};
  p.begin(seq);
  CHECK(std::vector<sd::token_id>(p.guesses().begin(), p.guesses().end()) ==
        std::vector<sd::token_id>(4, 7));
  sd::draft_tree tree(16);
  p.propose(make_ctx(seq, 8), tree);
  REQUIRE(tree.size() == 5);
  CHECK(tree.is_chain());
  std::size_t const vocab = 32;
  std::vector<float> rows(5 * vocab, 0.0f);
  sd::token_id const pred[5] = {11, 12, 13, 14, 15};
  for (std::size_t r = 0; r < 5; ++r) rows[r * vocab + static_cast<std::size_t>(pred[r])] = 2.0f;
  sd::verify_result res;
  res.accepted_nodes = {1};  // one guess accepted, bonus = row 1's prediction
  res.tokens = {7, 12};
  p.observe(sd::matrix_view<float const>(rows.data(), 5, vocab), {}, res);
  // Rows 2..4 predict the next three positions; the last is repeated.
  CHECK(std::vector<sd::token_id>(p.guesses().begin(), p.guesses().end()) ==
        std::vector<sd::token_id>({13, 14, 15, 15}));
  // Everything accepted: the bonus pads the block.
  seq = {3, 7, 7, 12};
  p.propose(make_ctx(seq, 2), tree);  // budget 2
  REQUIRE(tree.size() == 3);
  std::vector<float> rows3(3 * vocab, 0.0f);
  for (std::size_t r = 0; r < 3; ++r) rows3[r * vocab + 20 + r] = 1.0f;
  res.accepted_nodes = {1, 2};
  res.tokens = {13, 14, 22};
  p.observe(sd::matrix_view<float const>(rows3.data(), 3, vocab), {}, res);
  CHECK(std::vector<sd::token_id>(p.guesses().begin(), p.guesses().end()) ==
        std::vector<sd::token_id>(4, 22));
  CHECK_THROWS_AS(p.observe(sd::matrix_view<float const>(rows3.data(), 2, vocab), {}, res),
                  sd::error);
  CHECK_THROWS_AS(sd::jacobi_proposer({.block = 0}), sd::error);
}

TEST_CASE("lookahead: the combined forward equals each branch alone (CPU backend, bit for bit)") {
  // Tolerance: zero. The CPU forward is batch-invariant (each row's arithmetic is independent of
  // the other rows of the batch), so a row's logits must not change when unrelated rows are added.
  auto const weights = std::make_shared<sd::llama_weights const>(
      sd::make_random_llama(test_support::shapes::prime_vocab(), 5, 0.3f));
  sd::cpu_llama model(weights, {.threads = 1});
  std::vector<sd::token_id> const prompt{1, 17, 33, 17, 45, 60, 17, 33, 2, 9};
  std::size_t const base = prompt.size() - 1;
  auto const prefill = [&] {
    model.cache().truncate(0);
    std::vector<sd::position_t> pos(base);
    for (std::size_t i = 0; i < base; ++i) pos[i] = static_cast<sd::position_t>(i);
    sd::forward_result r;
    model.forward({.tokens = std::span<sd::token_id const>(prompt.data(), base), .positions = pos},
                  r);
  };
  for (std::size_t const levels_wanted : {1u, 3u}) {
    CAPTURE(levels_wanted);
    sd::lookahead_proposer p({.window = 4, .ngram = 4, .guesses = 3});
    p.begin(prompt);
    // Warm the window up to the wanted number of levels with made-up outputs.
    sd::draft_tree tree(32);
    sd::auxiliary_batch aux;
    std::vector<sd::token_id> seq = prompt;
    while (p.window_levels() < levels_wanted) {
      auto const ctx = make_ctx(seq, 8);
      p.propose(ctx, tree);
      aux.reset(tree, static_cast<sd::position_t>(seq.size() - 1), 100, 128);
      p.auxiliary(ctx, tree, aux);
      aux.finalize();
      std::vector<float> tl(tree.size() * 97, 0.0f), al(aux.num_aux_logits() * 97, 0.0f);
      for (std::size_t r = 0; r < aux.num_aux_logits(); ++r) al[r * 97 + (r * 7 + 3) % 97] = 1.0f;
      sd::verify_result res;
      res.tokens = {prompt.back()};
      p.observe(sd::matrix_view<float const>(tl.data(), tree.size(), 97),
                sd::matrix_view<float const>(al.data(), aux.num_aux_logits(), 97), res);
    }
    REQUIRE(p.window_levels() == levels_wanted);
    // A verification tree with two branches under the root.
    std::vector<std::vector<sd::token_id>> const paths{{17, 33, 2}, {45, 60}};
    sd::draft_tree const vtree = sd::draft_tree::from_paths(prompt.back(), paths);
    aux.reset(vtree, static_cast<sd::position_t>(base), 100, 128);
    p.auxiliary(make_ctx(prompt, 8), vtree, aux);
    aux.finalize();
    REQUIRE(aux.num_aux() > 0);

    prefill();
    sd::forward_result combined;
    model.forward({.tokens = aux.tokens(),
                   .positions = aux.positions(),
                   .mask = aux.mask(),
                   .mask_stride = aux.mask_stride(),
                   .logits_rows = aux.logits_rows()},
                  combined);
    // The tree alone.
    prefill();
    std::vector<sd::position_t> tpos(vtree.size());
    for (std::size_t i = 0; i < vtree.size(); ++i)
      tpos[i] = static_cast<sd::position_t>(base) + vtree.depth(static_cast<sd::node_index>(i));
    sd::forward_result tree_alone;
    model.forward({.tokens = vtree.tokens(),
                   .positions = tpos,
                   .mask = vtree.mask(),
                   .mask_stride = vtree.mask_stride()},
                  tree_alone);
    // The window alone: the root, then the auxiliary tokens with their visibility renumbered.
    std::size_t const t = vtree.size(), k = aux.num_aux(), m = 1 + k;
    std::vector<sd::token_id> wtok{prompt.back()};
    std::vector<sd::position_t> wpos{static_cast<sd::position_t>(base)};
    std::size_t const stride = sd::mask_words(m);
    std::vector<std::uint64_t> wmask(m * stride, 0);
    wmask[0] = 1;
    for (std::size_t r = 0; r < k; ++r) {
      wtok.push_back(aux.tokens()[t + r]);
      wpos.push_back(aux.positions()[t + r]);
      for (std::size_t col = 0; col < aux.size(); ++col) {
        if (!aux.visible(t + r, col)) continue;
        REQUIRE((col == 0 || col >= t));  // the window sees no tree node but the root
        std::size_t const wc = col == 0 ? 0 : 1 + (col - t);
        wmask[(1 + r) * stride + wc / 64] |= std::uint64_t{1} << (wc % 64);
      }
    }
    prefill();
    sd::forward_result window_alone;
    model.forward({.tokens = wtok, .positions = wpos, .mask = wmask, .mask_stride = stride},
                  window_alone);

    auto const same = [](std::span<float const> a, std::span<float const> b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
    };
    auto const cv = combined.logits_view();
    for (std::size_t i = 0; i < t; ++i) {
      CAPTURE(i);
      CHECK(same(cv.row(i), tree_alone.logits_view().row(i)));
    }
    // Auxiliary rows with logits, in batch order.
    std::size_t got = 0;
    std::vector<std::int32_t> rows(aux.logits_rows().begin(), aux.logits_rows().end());
    if (rows.empty())  // every row has logits
      for (std::size_t i = 0; i < aux.size(); ++i) rows.push_back(static_cast<std::int32_t>(i));
    for (std::size_t i = 0; i < rows.size(); ++i) {
      auto const row = static_cast<std::size_t>(rows[i]);
      if (row < t) continue;
      CAPTURE(row);
      CHECK(same(cv.row(i), window_alone.logits_view().row(1 + (row - t))));
      ++got;
    }
    CHECK(got == aux.num_aux_logits());
    CHECK(got == (levels_wanted == 1 ? 3u : 4u));
  }
}
