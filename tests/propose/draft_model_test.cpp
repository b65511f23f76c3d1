// draft_model_proposer and layer_skip_proposer: the draft cache after any sequence of partial and
// full acceptances gives the logits of a fresh recomputation (for layer skip, on the target's own
// cache, which keeps the committed tokens only); q rows, modes, adaptive k, the confidence cutoff,
// context limits and configuration errors.
#include "specdec/propose/draft_model.hpp"

#include "support/doctest.hpp"

#include <cmath>
#include <memory>
#include <vector>

#include "propose/context.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/target_handle.hpp"
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/model/random.hpp"
#include "specdec/propose/layer_skip.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/sampling/softmax.hpp"
#include "specdec/verify/greedy.hpp"
#include "support/errors.hpp"
#include "support/fixture.hpp"
#include "support/toy_model.hpp"

namespace sd = specdec;

namespace {

using propose_test::make_ctx;

using toy_greedy = sd::draft_model_proposer<toy::toy_lm, sd::greedy>;
using toy_sampled = sd::draft_model_proposer<toy::toy_lm, sd::sampler, sd::draft_mode::sample>;
static_assert(sd::proposer<toy_greedy>);
static_assert(sd::proposer<toy_sampled>);
static_assert(!sd::samples_drafts_v<toy_greedy>);
static_assert(sd::samples_drafts_v<toy_sampled>);
static_assert(!sd::produces_trees_v<toy_sampled>);
static_assert(!sd::needs_target_hidden_v<toy_sampled>);
static_assert(sd::proposer<sd::layer_skip_proposer<sd::greedy>>);
static_assert(sd::samples_drafts_v<sd::layer_skip_proposer<sd::sampler, sd::draft_mode::sample>>);

sd::sampler plain_sampler() {
  return sd::sampler(sd::sampling_params{});
}  // temperature 1

// Logits after the last token of `tokens` from a fresh instance (everything in one forward).
template <class MakeModel>
std::vector<float> fresh_logits(MakeModel const& make, std::vector<sd::token_id> const& tokens,
                                std::span<std::int32_t const> skip = {}, std::size_t full = 0) {
  // tokens[0, full) by the full model, the rest with `skip` skipped (a draft on the target's
  // cache).
  auto model = make();
  std::vector<sd::position_t> pos(tokens.size());
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<sd::position_t>(i);
  std::span<sd::token_id const> const all(tokens);
  std::span<sd::position_t const> const at(pos);
  sd::forward_result out;
  if (full > 0) model.forward({.tokens = all.first(full), .positions = at.first(full)}, out);
  model.forward({.tokens = all.subspan(full), .positions = at.subspan(full), .skip_layers = skip},
                out);
  auto const row = out.logits_view().row(out.logits_count - 1);
  return {row.begin(), row.end()};
}

// Drives `proposer` through random steps of partial and full acceptance; after each propose,
// checks every q row against a fresh recomputation (softmax of fresh logits at temperature 1) and
// the cache size. `tolerance` is absolute on probabilities.
template <class Proposer, class MakeModel>
void check_rollback(Proposer& proposer, MakeModel const& make, std::size_t vocab, double tolerance,
                    std::uint64_t seed, int steps) {
  sd::philox rng(seed, 3);
  std::vector<sd::token_id> committed{1, 7, 3};
  proposer.begin(committed);
  sd::draft_tree tree(9);
  std::vector<float> expected(vocab);
  int partial = 0, full = 0, empty = 0;
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    std::size_t const max_nodes = rng.next_u32() % 7;  // 0..6, k is 4
    sd::propose_context ctx = make_ctx(committed, max_nodes, &rng);
    proposer.propose(ctx, tree);
    std::size_t const drafted = tree.num_drafted();
    CHECK(drafted == std::min<std::size_t>(max_nodes, proposer.current_k()));
    REQUIRE(tree.has_q());
    // Every q row is the softmax of the fresh logits after committed + the drafts before it.
    std::vector<sd::token_id> path = committed;
    for (std::size_t i = 1; i <= drafted; ++i) {
      auto const logits = fresh_logits(make, path);
      sd::softmax(logits, expected);
      auto const q = tree.q_row(static_cast<sd::node_index>(i - 1));
      double worst = 0.0;
      for (std::size_t v = 0; v < vocab; ++v)
        worst = std::max(worst, std::abs(static_cast<double>(q[v]) - expected[v]));
      CHECK(worst <= tolerance);
      path.push_back(tree.token(static_cast<sd::node_index>(i)));
    }
    // The cache holds the committed tokens and every draft but the last.
    if (drafted > 0) CHECK(proposer.cached_positions() == committed.size() + drafted - 1);

    // A random outcome: m accepted drafts (0..drafted) and a random bonus token.
    std::size_t const m = drafted == 0 ? 0 : rng.next_u32() % (drafted + 1);
    (m == drafted ? (drafted == 0 ? empty : full) : partial) += 1;
    sd::verify_result r;
    for (std::size_t i = 1; i <= m; ++i) {
      r.accepted_nodes.push_back(static_cast<sd::node_index>(i));
      r.tokens.push_back(tree.token(static_cast<sd::node_index>(i)));
    }
    r.tokens.push_back(static_cast<sd::token_id>(rng.next_u32() % vocab));
    proposer.accept(r);
    CHECK(proposer.cached_positions() <= committed.size() + m);
    committed.insert(committed.end(), r.tokens.begin(), r.tokens.end());
  }
  CHECK(partial > 3);
  CHECK(full > 3);
  // The last logits (after a final propose with one draft) equal a fresh run over everything.
  sd::propose_context ctx = make_ctx(committed, 1, &rng);
  proposer.propose(ctx, tree);
  auto const fresh = fresh_logits(make, committed);
  auto const last = proposer.last_logits();
  REQUIRE(last.size() == vocab);
  double worst = 0.0;
  for (std::size_t v = 0; v < vocab; ++v)
    worst = std::max(worst, std::abs(static_cast<double>(last[v]) - fresh[v]));
  CHECK(worst <= 100 * tolerance);
}

sd::cpu_llama_options one_thread() {
  return {.threads = 1};
}

}  // namespace

TEST_CASE("draft cache rollback: q rows equal a fresh recomputation (toy model)") {
  constexpr std::size_t vocab = 20;
  toy::toy_lm draft(vocab, 300, 9, 4.0f);
  toy::toy_lm target(vocab, 300);
  toy_sampled p(draft, target, plain_sampler(), {.k = 4});
  auto const make = [] { return toy::toy_lm(vocab, 300, 9, 4.0f); };
  check_rollback(p, make, vocab, 1e-6, 1, 60);
}

TEST_CASE("draft cache rollback: q rows equal a fresh recomputation (stories260K)") {
  auto const weights = fixture::stories260k();
  sd::cpu_llama draft(weights, one_thread());
  sd::cpu_llama target(weights, one_thread());
  sd::draft_model_proposer<sd::cpu_llama, sd::sampler, sd::draft_mode::sample> p(
      draft, target, plain_sampler(), {.k = 4});
  auto const make = [&] { return sd::cpu_llama(weights, one_thread()); };
  check_rollback(p, make, 512, 1e-4, 2, 40);
}

TEST_CASE("layer skip on the target's cache: q rows equal a fresh recomputation (stories260K)") {
  // The decoder's part, played here: the target's cache holds the committed tokens but the root,
  // the handle says so, and after each step the accepted tokens enter the cache by a full forward.
  auto const weights = fixture::stories260k();
  std::vector<std::int32_t> const skip{1, 3};
  sd::layer_skip_proposer<sd::sampler, sd::draft_mode::sample> p(
      {.skip_layers = {3, 1, 3}, .draft = {.k = 4}}, plain_sampler());
  CHECK(std::vector<std::int32_t>(p.skip_layers().begin(), p.skip_layers().end()) == skip);
  static_assert(sd::uses_target_v<decltype(p)> && sd::skips_target_layers_v<decltype(p)>);
  auto const make = [&] { return sd::cpu_llama(weights, one_thread()); };
  sd::cpu_llama target = make();
  sd::target_handle handle(target);
  sd::philox rng(3, 3);
  std::vector<sd::token_id> committed{1, 7, 3};
  sd::forward_result fwd;
  auto const commit_to = [&](std::size_t n) {  // the cache holds committed[0, n)
    std::size_t const have = target.cache().size();
    std::vector<sd::position_t> pos;
    for (std::size_t i = have; i < n; ++i) pos.push_back(static_cast<sd::position_t>(i));
    if (n > have)
      target.forward({.tokens = std::span<sd::token_id const>(committed).subspan(have, n - have),
                      .positions = pos},
                     fwd);
  };
  p.begin(committed);
  sd::draft_tree tree(9);
  std::vector<float> expected(512);
  int partial = 0, full = 0;
  for (int step = 0; step < 30; ++step) {
    CAPTURE(step);
    commit_to(committed.size() - 1);
    handle.set_committed(committed.size() - 1);
    std::size_t const max_nodes = rng.next_u32() % 7;  // 0..6, k is 4
    sd::propose_context ctx = make_ctx(committed, max_nodes, &rng);
    ctx.target = &handle;
    p.propose(ctx, tree);
    // The draft's entries are gone: the target's cache holds the committed tokens but the root.
    CHECK(target.cache().size() == committed.size() - 1);
    std::size_t const drafted = tree.num_drafted();
    CHECK(drafted == std::min<std::size_t>(max_nodes, p.current_k()));
    REQUIRE(tree.has_q());
    std::vector<sd::token_id> path = committed;
    for (std::size_t i = 1; i <= drafted; ++i) {
      sd::softmax(fresh_logits(make, path, skip, committed.size() - 1), expected);
      auto const q = tree.q_row(static_cast<sd::node_index>(i - 1));
      double worst = 0.0;
      for (std::size_t v = 0; v < 512; ++v)
        worst = std::max(worst, std::abs(static_cast<double>(q[v]) - expected[v]));
      CHECK(worst <= 1e-4);
      path.push_back(tree.token(static_cast<sd::node_index>(i)));
    }
    std::size_t const m = drafted == 0 ? 0 : rng.next_u32() % (drafted + 1);
    if (drafted > 0) (m == drafted ? full : partial) += 1;
    sd::verify_result r;
    for (std::size_t i = 1; i <= m; ++i) {
      r.accepted_nodes.push_back(static_cast<sd::node_index>(i));
      r.tokens.push_back(tree.token(static_cast<sd::node_index>(i)));
    }
    r.tokens.push_back(static_cast<sd::token_id>(rng.next_u32() % 512));
    p.accept(r);
    committed.insert(committed.end(), r.tokens.begin(), r.tokens.end());
  }
  CHECK(partial > 3);
  CHECK(full > 3);
  // No target is refused, as is a cache that does not hold the committed tokens but the root.
  sd::propose_context ctx = make_ctx(committed, 2, &rng);
  CHECK_THROWS_WITH_AS(p.propose(ctx, tree), doctest::Contains("no target"), sd::error);
  ctx.target = &handle;
  test_support::check_error([&] { p.propose(ctx, tree); }, sd::errc::internal,
                            "the target's cache holds");
}

TEST_CASE("greedy drafts are the policy's greedy tokens, without q rows") {
  constexpr std::size_t vocab = 20;
  toy::toy_lm draft(vocab, 300, 9);
  toy_greedy p(draft, vocab, sd::greedy{}, {.k = 5});
  std::vector<sd::token_id> committed{1, 2, 3, 4};
  p.begin(committed);
  sd::draft_tree tree(8);
  tree.enable_q(vocab);  // left over from another proposer: must be dropped
  p.propose(make_ctx(committed, 5), tree);
  REQUIRE(tree.size() == 6);
  CHECK(!tree.has_q());
  CHECK(tree.is_chain());
  auto const make = [] { return toy::toy_lm(vocab, 300, 9); };
  std::vector<sd::token_id> path = committed;
  for (sd::node_index i = 1; i <= 5; ++i) {
    auto const logits = fresh_logits(make, path);
    CHECK(tree.token(i) == sd::greedy{}.greedy_token(logits, path));
    path.push_back(tree.token(i));
  }
}

TEST_CASE("sampled drafts draw from the request's Philox stream") {
  constexpr std::size_t vocab = 20;
  toy::toy_lm draft(vocab, 300, 9, 2.0f);
  toy_sampled p(draft, vocab, plain_sampler(), {.k = 3});
  std::vector<sd::token_id> committed{1, 2};
  sd::draft_tree a(8), b(8);
  sd::philox r1(77), r2(77);
  p.begin(committed);
  p.propose(make_ctx(committed, 3, &r1), a);
  p.begin(committed);
  p.propose(make_ctx(committed, 3, &r2), b);
  CHECK(std::vector<sd::token_id>(a.tokens().begin(), a.tokens().end()) ==
        std::vector<sd::token_id>(b.tokens().begin(), b.tokens().end()));
  CHECK(r1.offset() == 3);  // one word per sampled draft
  // Each draft is the verifiers' draw rule applied to its recorded q row with its word.
  for (sd::node_index i = 1; i < static_cast<sd::node_index>(a.size()); ++i) {
    double total = 0.0;
    std::size_t const drawn = sd::detail::draw_index(
        a.q_row(a.parent(i)), sd::philox(77).uniform_at(static_cast<std::uint64_t>(i - 1)), total);
    CHECK(static_cast<sd::token_id>(drawn) == a.token(i));
    CHECK(total == doctest::Approx(1.0).epsilon(1e-5));
  }
  p.begin(committed);
  CHECK_THROWS_AS(p.propose(make_ctx(committed, 3, nullptr), a), sd::error);
  // Tokens enter the draft cache checked (the policy is told the cache needs no check).
  std::vector<sd::token_id> const outside{1, 2, static_cast<sd::token_id>(vocab)};
  p.begin(outside);
  sd::philox r3(77);
  try {
    p.propose(make_ctx(outside, 3, &r3), a);
    FAIL("a committed token outside the vocabulary was accepted");
  } catch (sd::error const& e) {
    CHECK(e.code() == sd::errc::out_of_range);
    CHECK(std::string(e.what()).find("outside the draft's vocabulary") != std::string::npos);
  }
}

TEST_CASE("adaptive k and the confidence cutoff") {
  constexpr std::size_t vocab = 20;
  toy::toy_lm draft(vocab, 400, 9);
  std::vector<sd::token_id> committed{1, 2};
  sd::draft_tree tree(16);

  toy_greedy p(draft, vocab, sd::greedy{},
               {.k = 3, .adaptive = true, .k_min = 2, .k_max = 7, .k_step_up = 2});
  p.begin(committed);
  auto step = [&](bool accept_all) {
    p.propose(make_ctx(committed, 15), tree);
    sd::verify_result r;
    std::size_t const m = accept_all ? tree.num_drafted() : 0;
    for (std::size_t i = 1; i <= m; ++i) {
      r.accepted_nodes.push_back(static_cast<sd::node_index>(i));
      r.tokens.push_back(tree.token(static_cast<sd::node_index>(i)));
    }
    r.tokens.push_back(5);
    p.accept(r);
    committed.insert(committed.end(), r.tokens.begin(), r.tokens.end());
    return tree.num_drafted();
  };
  CHECK(step(true) == 3);
  CHECK(p.current_k() == 5);
  CHECK(step(true) == 5);
  CHECK(p.current_k() == 7);
  CHECK(step(true) == 7);
  CHECK(p.current_k() == 7);  // capped at k_max
  CHECK(step(false) == 7);
  CHECK(p.current_k() == 6);
  for (int i = 0; i < 6; ++i) (void)step(false);
  CHECK(p.current_k() == 2);  // floored at k_min
  p.begin(committed);
  CHECK(p.current_k() == 3);  // a new sequence starts from k

  // A cutoff of 1 stops after the first draft token (no row of the toy model is one-hot).
  toy_greedy c(draft, vocab, sd::greedy{}, {.k = 6, .confidence_threshold = 1.0f});
  c.begin(committed);
  c.propose(make_ctx(committed, 6), tree);
  CHECK(tree.num_drafted() == 1);
  // A cutoff of 0 never stops.
  toy_greedy none(draft, vocab, sd::greedy{}, {.k = 6, .confidence_threshold = 0.0f});
  none.begin(committed);
  none.propose(make_ctx(committed, 6), tree);
  CHECK(tree.num_drafted() == 6);
  // A peaked toy model is confident on some rows and not on others.
  toy::toy_lm peaked(vocab, 400, 9, 9.0f);
  toy_greedy some(peaked, vocab, sd::greedy{}, {.k = 8, .confidence_threshold = 0.5f});
  some.begin(committed);
  std::size_t total = 0;
  for (int i = 0; i < 20; ++i) {
    some.propose(make_ctx(committed, 8), tree);
    total += tree.num_drafted();
    some.accept(sd::verify_result{.accepted_nodes = {}, .tokens = {3}});
    committed.push_back(3);
  }
  CHECK(total > 20);
  CHECK(total < 160);
}

TEST_CASE("the draft's context bounds the draft; no overflow") {
  constexpr std::size_t vocab = 20;
  toy::toy_lm draft(vocab, 10, 9);
  toy_greedy p(draft, vocab, sd::greedy{}, {.k = 4});
  std::vector<sd::token_id> committed{1, 2, 3, 4, 5, 6, 7, 8};
  p.begin(committed);
  sd::draft_tree tree(8);
  p.propose(make_ctx(committed, 4), tree);
  CHECK(tree.num_drafted() == 3);  // positions 0..9: the root at 7, drafts fed at 8 and 9
  CHECK(draft.cache().size() == 10);
  sd::verify_result r{.accepted_nodes = {1}, .tokens = {tree.token(1), 10}};
  p.accept(r);
  committed.insert(committed.end(), r.tokens.begin(), r.tokens.end());
  p.propose(make_ctx(committed, 4), tree);  // 10 tokens: room for one draft
  CHECK(tree.num_drafted() == 1);
  r = {.accepted_nodes = {}, .tokens = {11}};
  p.accept(r);
  committed.push_back(11);
  p.propose(make_ctx(committed, 4), tree);  // 11 tokens: the root does not fit
  CHECK(tree.num_drafted() == 0);
  CHECK(draft.cache().size() <= 10);
}

TEST_CASE("a history that disagrees with the draft cache is resynchronised") {
  constexpr std::size_t vocab = 20;
  toy::toy_lm draft(vocab, 300, 9);
  toy_sampled p(draft, vocab, plain_sampler(), {.k = 3});
  sd::philox rng(1);
  std::vector<sd::token_id> a{1, 2, 3, 4, 5};
  p.begin(a);
  sd::draft_tree tree(8);
  p.propose(make_ctx(a, 3, &rng), tree);
  // No accept(), and a different sequence sharing a prefix: the cache is cut to the prefix.
  std::vector<sd::token_id> b{1, 2, 9, 9};
  p.propose(make_ctx(b, 3, &rng), tree);
  auto const make = [] { return toy::toy_lm(vocab, 300, 9); };
  std::vector<float> expected(vocab);
  sd::softmax(fresh_logits(make, b), expected);
  auto const q = tree.q_row(0);
  for (std::size_t v = 0; v < vocab; ++v) CHECK(q[v] == doctest::Approx(expected[v]).epsilon(1e-6));
  // The cache was used by someone else: detected through its size and rebuilt.
  draft.cache().truncate(1);
  p.propose(make_ctx(b, 3, &rng), tree);
  auto const q2 = tree.q_row(0);
  for (std::size_t v = 0; v < vocab; ++v)
    CHECK(q2[v] == doctest::Approx(expected[v]).epsilon(1e-6));
}

TEST_CASE("configuration errors") {
  constexpr std::size_t vocab = 20;
  toy::toy_lm draft(vocab, 300);
  toy::toy_lm other(vocab + 1, 300);
  CHECK_THROWS_AS(toy_greedy(draft, other, sd::greedy{}), sd::error);
  try {
    toy_greedy bad(draft, other, sd::greedy{});
  } catch (sd::error const& e) {
    CHECK(e.code() == sd::errc::invalid_argument);
  }
  CHECK_THROWS_AS(toy_greedy(draft, vocab, sd::greedy{}, {.k = sd::max_tree_nodes}), sd::error);
  CHECK_THROWS_AS(toy_greedy(draft, vocab, sd::greedy{}, {.k = 3, .adaptive = true, .k_min = 4}),
                  sd::error);
  CHECK_THROWS_AS(toy_greedy(draft, vocab, sd::greedy{}, {.k = 3, .adaptive = false, .k_min = 0}),
                  sd::error);
  CHECK_THROWS_AS(toy_greedy(draft, vocab, sd::greedy{}, {.k = 3, .confidence_threshold = 1.5f}),
                  sd::error);
  CHECK_THROWS_AS((sd::layer_skip_proposer<sd::greedy>({.skip_layers = {-1}}, sd::greedy{})),
                  sd::error);
  // A layer the target does not have: its forward says so at the first draft.
  auto const weights = fixture::stories260k();
  sd::cpu_llama target(weights, one_thread());
  sd::layer_skip_proposer<sd::greedy> beyond({.skip_layers = {5}}, sd::greedy{});
  sd::speculative_decoder dec(target, beyond, sd::greedy_verifier{}, sd::greedy{});
  std::vector<sd::token_id> const prompt{1, 7, 3};
  test_support::check_error([&] { (void)dec.generate(prompt); }, sd::errc::out_of_range,
                            "skip layer 5 is outside the model's 5 layers");
}
