// SuffixDecoding's data structures: the suffix tree against a slow reference (substring counts
// by brute force, and the drafting algorithm re-run over them), its invariants and canonical form
// (the same tree whatever the order of appends), the proposer's drafts, the global cache's FIFO
// eviction, its file round trip and its errors, and concurrent use of one cache from threads.
#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "propose/context.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/propose/suffix.hpp"
#include "specdec/propose/suffix_tree.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"

namespace sd = specdec;

namespace {

using sequences = std::vector<std::vector<sd::token_id>>;

// The slow reference: substring counts by scanning every sequence.
struct reference {
  sequences const& seqs;
  std::size_t depth;

  [[nodiscard]] std::size_t count(std::span<sd::token_id const> p) const {
    if (p.size() > depth) return 0;
    std::size_t c = 0;
    for (auto const& q : seqs) {
      if (p.empty()) {
        c += q.size();
        continue;
      }
      for (std::size_t i = 0; i + p.size() <= q.size(); ++i)
        c += std::equal(p.begin(), p.end(), q.begin() + static_cast<std::ptrdiff_t>(i)) ? 1 : 0;
    }
    return c;
  }

  // The continuations of `p`: (count, token) of every token that follows it, count descending
  // then token ascending.
  [[nodiscard]] std::vector<std::pair<std::size_t, sd::token_id>> next(std::vector<sd::token_id> p,
                                                                       sd::token_id vocab) const {
    std::vector<std::pair<std::size_t, sd::token_id>> out;
    p.push_back(0);
    for (sd::token_id t = 0; t < vocab; ++t) {
      p.back() = t;
      std::size_t const c = count(p);
      if (c > 0) out.emplace_back(c, t);
    }
    std::sort(out.begin(), out.end(), [](auto const& a, auto const& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    return out;
  }

  // suffix_tree::speculate, re-run over the counts: within an edge a path has one continuation of
  // the same count; at a node's end its children are the continuations of smaller counts.
  void speculate(std::vector<sd::token_id> const& context, sd::suffix_speculation const& how,
                 sd::token_id vocab, sd::suffix_draft& out) const {
    out.clear();
    std::size_t const longest = std::min(context.size(), depth);
    for (std::size_t m = 1; m <= longest; ++m) {
      std::vector<sd::token_id> const c(context.end() - static_cast<std::ptrdiff_t>(m),
                                        context.end());
      if (count(c) == 0) break;
      double const allowed = std::floor(static_cast<double>(m) * how.factor + how.offset + 1e-6);
      std::size_t const budget = allowed <= 0.0 ? 0
                                 : allowed >= static_cast<double>(how.max_tokens)
                                     ? how.max_tokens
                                     : static_cast<std::size_t>(allowed);
      sd::suffix_draft d;
      if (how.tree)
        tree(c, budget, how.min_probability, vocab, d);
      else
        path(c, budget, how.min_probability, vocab, d);
      if (d.score >= out.score) {
        out = d;
        out.match_length = m;
      }
    }
    if (out.size() == 0) out.match_length = 0;
  }

  void emit(sd::suffix_draft& d, sd::token_id t, std::int32_t parent, float p) const {
    d.tokens.push_back(t);
    d.parents.push_back(parent);
    d.probabilities.push_back(p);
    d.score += p;
  }

  void path(std::vector<sd::token_id> p, std::size_t budget, float min_p, sd::token_id vocab,
            sd::suffix_draft& d) const {
    float prob = 1.0f;
    while (d.size() < budget) {
      auto const nx = next(p, vocab);
      if (nx.empty()) break;
      std::size_t const here = count(p);
      if (nx[0].first != here) {  // a node's end: the most frequent child
        prob *= static_cast<float>(nx[0].first) / static_cast<float>(here);
        if (prob < min_p) break;
      }
      emit(d, nx[0].second, static_cast<std::int32_t>(d.size()) - 1, prob);
      p.push_back(nx[0].second);
    }
  }

  void tree(std::vector<sd::token_id> const& c, std::size_t budget, float min_p, sd::token_id vocab,
            sd::suffix_draft& d) const {
    struct item {
      float p;
      std::vector<sd::token_id> path;  // the path so far; `token` continues it (-1: a node's end)
      sd::token_id token;
      std::int32_t parent;
      std::uint32_t order;
    };
    std::vector<item> queue;
    std::uint32_t order = 0;
    // An item at `path` whose next token is `token` when inside an edge, or -1 at a node's end.
    auto const push = [&](float p, std::vector<sd::token_id> path, std::int32_t parent) {
      auto const nx = next(path, vocab);
      sd::token_id const token = !nx.empty() && nx[0].first == count(path) ? nx[0].second : -1;
      queue.push_back({p, std::move(path), token, parent, order++});
    };
    push(1.0f, c, -1);
    while (d.size() < budget && !queue.empty()) {
      auto const best = std::min_element(
          queue.begin(), queue.end(),
          [](item const& a, item const& b) { return a.p != b.p ? a.p > b.p : a.order < b.order; });
      item const it = *best;
      queue.erase(best);
      if (it.token >= 0) {
        emit(d, it.token, it.parent, it.p);
        std::vector<sd::token_id> longer = it.path;
        longer.push_back(it.token);
        push(it.p, std::move(longer), static_cast<std::int32_t>(d.size()) - 1);
        continue;
      }
      std::size_t const here = count(it.path);
      for (auto const& [n, t] : next(it.path, vocab)) {
        float const p = it.p * static_cast<float>(n) / static_cast<float>(here);
        if (p < min_p) continue;
        // The child's first token is drafted when the item is popped.
        std::vector<sd::token_id> path = it.path;
        queue.push_back({p, std::move(path), t, it.parent, order++});
      }
    }
  }
};

sequences random_sequences(std::mt19937& g, std::size_t count, std::size_t max_length,
                           sd::token_id vocab) {
  sequences out(count);
  for (auto& q : out) {
    q.resize(g() % (max_length + 1));
    for (auto& t : q) t = static_cast<sd::token_id>(g() % static_cast<unsigned>(vocab));
  }
  return out;
}

// Appends the sequences to `tree` with their tokens interleaved at random.
void interleaved(sd::suffix_tree& tree, sequences const& seqs, std::mt19937& g) {
  std::vector<sd::suffix_tree::sequence_id> ids;
  for (std::size_t i = 0; i < seqs.size(); ++i) ids.push_back(tree.add_sequence());
  std::vector<std::size_t> at(seqs.size(), 0);
  for (;;) {
    std::vector<std::size_t> live;
    for (std::size_t i = 0; i < seqs.size(); ++i)
      if (at[i] < seqs[i].size()) live.push_back(i);
    if (live.empty()) break;
    std::size_t const i = live[g() % live.size()];
    tree.append(ids[i], seqs[i][at[i]++]);
  }
}

void check_same(sd::suffix_draft const& a, sd::suffix_draft const& b) {
  CHECK(a.tokens == b.tokens);
  CHECK(a.parents == b.parents);
  CHECK(a.probabilities == b.probabilities);
  CHECK(a.score == b.score);
  CHECK(a.match_length == b.match_length);
}

}  // namespace

TEST_CASE("suffix tree: counts, invariants and drafts match the slow reference") {
  std::size_t drafted = 0;
  for (std::uint32_t trial = 0; trial < 120; ++trial) {
    std::mt19937 g(trial);
    std::size_t const depth = 1 + g() % 7;
    // Small vocabularies repeat much; every fourth trial a larger one gives nodes with enough
    // children to be indexed by hash (suffix_tree::wide).
    auto const vocab = static_cast<sd::token_id>(trial % 4 == 3 ? 12 + g() % 8 : 2 + g() % 4);
    sequences const seqs = random_sequences(g, 1 + g() % 4, trial % 4 == 3 ? 120 : 40, vocab);
    sd::suffix_tree a(depth);
    for (auto const& q : seqs) a.extend(a.add_sequence(), q);
    sd::suffix_tree b(depth);
    interleaved(b, seqs, g);
    INFO("trial ", trial, ", depth ", depth, ", vocab ", vocab);
    REQUIRE(a.check().empty());
    REQUIRE(b.check().empty());
    CHECK(a.num_nodes() == b.num_nodes());
    reference const ref{seqs, depth};
    for (int k = 0; k < 40; ++k) {
      std::vector<sd::token_id> p(g() % (depth + 3));
      for (auto& t : p) t = static_cast<sd::token_id>(g() % static_cast<unsigned>(vocab));
      REQUIRE(a.count(p) == ref.count(p));
      REQUIRE(b.count(p) == ref.count(p));
      sd::suffix_speculation how;
      how.tree = k % 2 == 1;
      how.max_tokens = 1 + g() % 12;
      how.factor = static_cast<float>(g() % 4) * 0.5f;
      how.offset = static_cast<float>(g() % 3);
      how.min_probability = static_cast<float>(g() % 4) * 0.1f;
      sd::suffix_draft da, db, want;
      a.speculate(p, how, da);
      b.speculate(p, how, db);
      ref.speculate(p, how, vocab, want);
      check_same(da, want);
      check_same(db, want);
      drafted += da.size();
    }
  }
  CHECK(drafted > 1000);  // the comparison covered real drafts, not only empty ones
}

TEST_CASE("suffix tree: path compression, depth limit, windows and errors") {
  sd::suffix_tree t(4);
  auto const s = t.add_sequence();
  std::vector<sd::token_id> const text{5, 6, 7, 8, 9, 10, 11, 12};
  t.extend(s, text);
  REQUIRE(t.check().empty());
  // Every 4-gram is unique: one leaf per start, no branching; the edges are ranges, not tokens.
  CHECK(t.num_nodes() == 1 + text.size());
  std::vector<sd::token_id> const four{6, 7, 8, 9};
  std::vector<sd::token_id> const five{6, 7, 8, 9, 10};
  CHECK(t.count(four) == 1);
  CHECK(t.count(five) == 0);  // beyond the depth
  sd::suffix_draft d;
  t.speculate(std::vector<sd::token_id>{6, 7}, {.max_tokens = 8, .factor = 4.0f}, d);
  // "7" drafts "8 9 10" (to the depth: "7 8 9 10"), "6 7" only "8 9": the better score wins.
  CHECK(d.tokens == std::vector<sd::token_id>{8, 9, 10});
  CHECK(d.match_length == 1);
  CHECK(d.score == doctest::Approx(3.0));

  test_support::check_error([&] { sd::suffix_tree(0); }, sd::errc::invalid_argument, "depth 0");
  test_support::check_error([&] { t.append(s, -1); }, sd::errc::out_of_range, "token -1");
  test_support::check_error([&] { t.append(7, 1); }, sd::errc::out_of_range, "unknown sequence 7");
  t.finish(s);
  test_support::check_error([&] { t.append(s, 1); }, sd::errc::out_of_range, "finished sequence");
  test_support::check_error([&] { sd::suffix_speculation{.max_tokens = 0}.validate(); },
                            sd::errc::invalid_argument, "max_tokens");
  test_support::check_error([&] { sd::suffix_speculation{.min_probability = 1.5f}.validate(); },
                            sd::errc::invalid_argument, "min_probability");

  // A repeated text: the second copy adds counts, not nodes.
  sd::suffix_tree r(24);
  auto const a = r.add_sequence();
  r.extend(a, text);
  std::size_t const nodes = r.num_nodes();
  auto const b = r.add_sequence();
  r.extend(b, text);
  CHECK(r.num_nodes() == nodes);
  CHECK(r.count(text) == 2);
  CHECK(r.check().empty());
}

TEST_CASE("suffix proposer: drafts the local and the global continuation") {
  auto cache = std::make_shared<sd::suffix_cache>();
  std::vector<sd::token_id> const earlier{1, 2, 3, 4, 5, 6, 7, 8, 9};
  {
    sd::suffix_proposer first(cache, {});
    std::vector<sd::token_id> const prompt{20, 21};
    first.begin(prompt);
    // The output reaches the cache with the context of the next step.
    std::vector<sd::token_id> context = prompt;
    context.insert(context.end(), earlier.begin(), earlier.end());
    sd::draft_tree scratch(16);
    first.propose(propose_test::make_ctx(context, 8), scratch);
    CHECK(cache->output(first.output()) == earlier);
  }  // finished when destroyed
  CHECK(cache->requests() == 1);
  CHECK(cache->check().empty());

  // A new request whose context ends like the earlier output: the global tree drafts the rest.
  sd::suffix_proposer p(cache, {.speculation = {.max_tokens = 4, .factor = 2.0f}});
  std::vector<sd::token_id> const prompt{30, 31, 3, 4};
  p.begin(prompt);
  sd::draft_tree tree(16);
  p.propose(propose_test::make_ctx(prompt, 16), tree);
  CHECK(p.last_source() == sd::suffix_source::global);
  std::vector<sd::token_id> const want{4, 5, 6, 7, 8};  // root, then the four drafted
  CHECK(std::vector<sd::token_id>(tree.tokens().begin(), tree.tokens().end()) == want);

  // Its own prompt repeated: the local tree drafts (the global one has never seen 30 31).
  std::vector<sd::token_id> const context{30, 31, 3, 4, 40, 30, 31};
  p.propose(propose_test::make_ctx(context, 16), tree);
  CHECK(p.last_source() == sd::suffix_source::local);
  // "30 31" matched twice, once followed by "3 4 40 30" (probability 1/2 each: score 2).
  std::vector<sd::token_id> const local{31, 3, 4, 40, 30};
  CHECK(std::vector<sd::token_id>(tree.tokens().begin(), tree.tokens().end()) == local);
  // The budget of the step bounds the draft.
  p.propose(propose_test::make_ctx(context, 1), tree);
  CHECK(tree.num_drafted() == 1);
  CHECK(p.drafts_from(sd::suffix_source::global) == 1);
  CHECK(p.drafts_from(sd::suffix_source::local) == 2);

  // Tree mode: branches where the texts differ.
  sd::suffix_proposer t(
      nullptr,
      {.speculation = {.max_tokens = 8, .factor = 4.0f, .min_probability = 0.0f, .tree = true}});
  std::vector<sd::token_id> const two{1, 2, 3, 9, 1, 2, 4, 9, 1, 2};
  t.begin(two);
  t.propose(propose_test::make_ctx(two, 8), tree);
  CHECK(tree.num_children(0) == 2);  // 3 and 4 after "1 2"
  CHECK(tree.num_drafted() == 8);
}

TEST_CASE("suffix cache: FIFO eviction keeps the newest outputs and the active ones") {
  sd::suffix_cache cache({.depth = 8, .max_requests = 8});
  std::mt19937 g(7);
  sequences const seqs = random_sequences(g, 20, 30, 6);
  auto const active = cache.start();
  cache.append(active, seqs[0]);
  std::vector<sd::suffix_cache::request_id> ids;
  for (std::size_t i = 1; i < seqs.size(); ++i) {
    ids.push_back(cache.start());
    cache.append(ids.back(), seqs[i]);
    cache.finish(ids.back());
    CHECK(cache.requests() <= 8);
    REQUIRE(cache.check().empty());
  }
  CHECK(cache.evicted() == seqs.size() - cache.requests());
  CHECK(cache.output(active) == seqs[0]);  // never evicted while active
  CHECK(cache.output(ids.back()) == seqs.back());
  test_support::check_error([&] { (void)cache.output(ids.front()); }, sd::errc::invalid_argument,
                            "unknown");
  cache.finish(ids.front());  // evicted: ignored
  cache.append(active, seqs[1]);
  // The tree equals one built from the kept outputs alone.
  sd::suffix_tree fresh(8);
  sequences kept;
  kept.push_back(seqs[0]);
  kept.back().insert(kept.back().end(), seqs[1].begin(), seqs[1].end());
  for (std::size_t i = seqs.size() - (cache.requests() - 1); i < seqs.size(); ++i)
    kept.push_back(seqs[i]);
  for (auto const& q : kept) fresh.extend(fresh.add_sequence(), q);
  CHECK(cache.tokens() == fresh.num_tokens());
  CHECK(cache.nodes() == fresh.num_nodes());
  sd::suffix_workspace work;
  for (auto const& q : kept) {
    sd::suffix_draft a, b;
    std::vector<sd::token_id> const ctx(q.begin(),
                                        q.begin() + static_cast<std::ptrdiff_t>(q.size() / 2));
    cache.speculate(ctx, {}, a, work);
    fresh.speculate(ctx, {}, b);
    check_same(a, b);
  }
  test_support::check_error([&] { cache.append(999, seqs[0]); }, sd::errc::invalid_argument, "999");
  test_support::check_error([&] { sd::suffix_cache({.max_requests = 0}); },
                            sd::errc::invalid_argument, "max_requests");
  sd::suffix_cache small({.vocab_size = 6});
  auto const id = small.start();
  test_support::check_error(
      [&] {
        small.append(id, std::vector<sd::token_id>{1, 6});
      },
      sd::errc::out_of_range, "vocabulary of 6");
}

TEST_CASE("suffix cache: a save and load round trip gives the same drafts") {
  test_support::temp_dir dir;
  std::mt19937 g(11);
  sequences const seqs = random_sequences(g, 12, 60, 5);
  sd::suffix_cache cache({.depth = 10});
  for (auto const& q : seqs) {
    auto const id = cache.start();
    cache.append(id, q);
    if (&q != &seqs.back()) cache.finish(id);  // the last one saved while active
  }
  auto const path = dir.file("cache.sdsuffix");
  cache.save(path);
  sd::suffix_cache loaded({.depth = 10});
  loaded.load(path);
  CHECK(loaded.requests() == cache.requests());
  CHECK(loaded.tokens() == cache.tokens());
  CHECK(loaded.nodes() == cache.nodes());
  CHECK(loaded.check().empty());
  sd::suffix_workspace work;
  for (int k = 0; k < 200; ++k) {
    std::vector<sd::token_id> ctx(1 + g() % 12);
    for (auto& t : ctx) t = static_cast<sd::token_id>(g() % 5);
    for (bool tree : {false, true}) {
      sd::suffix_draft a, b;
      cache.speculate(ctx, {.tree = tree}, a, work);
      loaded.speculate(ctx, {.tree = tree}, b, work);
      check_same(a, b);
    }
  }
  // Loaded into a cache with a smaller vocabulary: refused, naming the token.
  sd::suffix_cache narrow({.vocab_size = 3});
  test_support::check_error([&] { narrow.load(path); }, sd::errc::bad_file,
                            "outside the vocabulary of 3");
  CHECK(narrow.requests() == 0);  // nothing added
  test_support::check_error([&] { narrow.load(dir.file("missing.sdsuffix")); }, sd::errc::io,
                            "missing.sdsuffix");
}

TEST_CASE("suffix cache: concurrent appends, drafts and evictions from several threads") {
  sd::suffix_cache cache({.depth = 12, .max_requests = 24});
  constexpr int threads = 4;
  std::vector<sequences> work(threads);
  for (int i = 0; i < threads; ++i) {
    std::mt19937 g(100 + static_cast<unsigned>(i));
    work[static_cast<std::size_t>(i)] = random_sequences(g, 20, 80, 4);
  }
  std::vector<std::thread> pool;
  std::vector<std::size_t> drafted(threads, 0);
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&, i] {
      sd::suffix_workspace ws;
      sd::suffix_draft d;
      for (auto const& q : work[static_cast<std::size_t>(i)]) {
        auto const id = cache.start();
        for (std::size_t k = 0; k < q.size(); k += 4) {
          std::size_t const n = std::min<std::size_t>(4, q.size() - k);
          cache.append(id, std::span(q).subspan(k, n));
          cache.speculate(std::span(q).first(k + n), {.tree = k % 8 == 0}, d, ws);
          drafted[static_cast<std::size_t>(i)] += d.size();
        }
        cache.finish(id);
      }
    });
  }
  for (auto& t : pool) t.join();
  CHECK(cache.check().empty());
  CHECK(cache.requests() <= 24);
  CHECK(cache.evicted() + cache.requests() == threads * 20);
  std::size_t total = 0;
  for (std::size_t d : drafted) total += d;
  CHECK(total > 0);
}
