#include "specdec/backend/cpu/llama.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "backend/cpu/test_models.hpp"
#include "specdec/core/concepts.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/model/load.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/llama_shapes.hpp"

namespace sd = specdec;
namespace st = specdec::test;

static_assert(sd::causal_lm<sd::cpu_llama>);
static_assert(sd::kv_cache<sd::contiguous_cache>);
static_assert(!sd::causal_lm<sd::contiguous_cache>);

namespace {

// The forward is batch-invariant: a token's logits are bitwise identical whatever else is in its
// batch (tree, chains, prefill), its batch index, the cache layout behind it and the number of
// threads. So these comparisons are exact.

// Both weight layouts: repacked for the small-model kernels (the default for these tiny models)
// and used in place (the layout of large models).
std::size_t const pack_limits[] = {sd::cpu_llama_options{}.pack_limit, 0};

// Runs a forward and returns a copy of its logits.
std::vector<float> run(sd::cpu_llama& m, std::vector<sd::token_id> const& tokens,
                       std::vector<sd::position_t> const& positions,
                       std::vector<std::uint64_t> const& mask = {}) {
  sd::forward_request req;
  req.tokens = tokens;
  req.positions = positions;
  req.mask = mask;
  req.mask_stride = sd::mask_words(tokens.size());
  sd::forward_result out;
  m.forward(req, out);
  REQUIRE(out.logits_count == tokens.size());
  REQUIRE(out.vocab == m.vocab_size());
  return out.logits;
}

std::vector<sd::position_t> iota_positions(std::size_t first, std::size_t n) {
  std::vector<sd::position_t> p(n);
  std::iota(p.begin(), p.end(), static_cast<sd::position_t>(first));
  return p;
}

std::vector<sd::token_id> random_tokens(std::size_t n, std::size_t vocab, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<sd::token_id> t(n);
  for (auto& x : t) x = static_cast<sd::token_id>(rng() % vocab);
  return t;
}

// Logits of each token of `seq` when run one at a time from an empty cache.
std::vector<float> sequential(sd::cpu_llama& m, std::vector<sd::token_id> const& seq) {
  m.reset();
  std::vector<float> all;
  for (std::size_t i = 0; i < seq.size(); ++i) {
    auto l = run(m, {seq[i]}, {static_cast<sd::position_t>(i)});
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

std::vector<sd::token_id> read_ids(std::filesystem::path const& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in.good(), "cannot open ", p.string());
  return {std::istream_iterator<sd::token_id>(in), std::istream_iterator<sd::token_id>()};
}

}  // namespace

TEST_CASE("cpu_llama: matches the double-precision reference forward") {
  for (std::size_t const limit : pack_limits) {
    CAPTURE(limit);
    for (bool shared : {false, true}) {
      CAPTURE(shared);
      auto w = st::random_llama(test_support::shapes::odd_gqa(shared), 11);
      auto const tokens = random_tokens(13, 75, 3);
      auto const ref = st::reference_logits(*w, tokens);
      for (std::size_t threads : {1u, 2u, 3u}) {
        CAPTURE(threads);
        sd::cpu_llama m(w, {.threads = threads, .pack_limit = limit});
        CHECK(m.vocab_size() == 75);
        CHECK(m.max_context() == 96);
        CHECK(m.hidden_size() == 48);
        CHECK(m.threads() == threads);
        CHECK(m.packed() == (limit != 0));
        auto const batched = run(m, tokens, iota_positions(0, tokens.size()));
        CHECK(m.cache().size() == tokens.size());
        auto const seq = sequential(m, tokens);
        CHECK(batched == seq);  // batch-invariant: prefill equals token-by-token, bit for bit
        for (std::size_t t = 0; t < tokens.size(); ++t) {
          CAPTURE(t);
          CHECK(st::row_error(batched.data() + t * 75, ref.data() + t * 75, 75) < 1e-4);
          CHECK(st::row_error(seq.data() + t * 75, ref.data() + t * 75, 75) < 1e-4);
        }
      }
    }
  }
}

TEST_CASE("cpu_llama: odd shapes (head size 6, rows not a multiple of the vector width)") {
  for (std::size_t const limit : pack_limits) {
    CAPTURE(limit);
    auto w = st::random_llama(test_support::shapes::head_size_6(), 71);
    auto const tokens = random_tokens(9, 41, 12);
    auto const ref = st::reference_logits(*w, tokens);
    sd::cpu_llama m(w, {.threads = 2, .pack_limit = limit});
    auto const batched = run(m, tokens, iota_positions(0, tokens.size()));
    for (std::size_t t = 0; t < tokens.size(); ++t)
      CHECK(st::row_error(batched.data() + t * 41, ref.data() + t * 41, 41) < 1e-4);
    CHECK(batched == sequential(m, tokens));
  }
}

TEST_CASE("cpu_llama: a prefill longer than one token block equals token-by-token decoding") {
  for (std::size_t const limit : pack_limits) {
    CAPTURE(limit);
    auto w = st::random_llama(test_support::shapes::odd_gqa(true), 81);
    auto const tokens = random_tokens(90, 75, 13);
    sd::cpu_llama m(w, {.threads = 2, .batch_capacity = 8, .pack_limit = limit});
    auto const batched = run(m, tokens, iota_positions(0, tokens.size()));
    CHECK(batched == sequential(m, tokens));
  }
}

TEST_CASE("cpu_llama: results do not depend on the number of threads") {
  for (std::size_t const limit : pack_limits) {
    CAPTURE(limit);
    auto w = st::random_llama(test_support::shapes::odd_gqa(), 5);
    auto const tokens = random_tokens(40, 75, 9);
    sd::cpu_llama one(w, {.threads = 1, .pack_limit = limit});
    sd::cpu_llama three(w, {.threads = 3, .pack_limit = limit});
    CHECK(run(one, tokens, iota_positions(0, 40)) == run(three, tokens, iota_positions(0, 40)));
    // A pool shared by two models.
    sd::cpu_llama a(w, {.pool = std::make_shared<sd::thread_pool>(2), .pack_limit = limit});
    sd::cpu_llama b(w, {.pool = a.pool(), .pack_limit = limit});
    CHECK(a.threads() == 2);
    CHECK(run(a, tokens, iota_positions(0, 40)) == run(b, tokens, iota_positions(0, 40)));
    // Models with the same thread count share the process-wide pool by default; models used from
    // two threads at once take turns on it.
    sd::cpu_llama c(w, {.threads = 2, .pack_limit = limit});
    sd::cpu_llama d(w, {.threads = 2, .pack_limit = limit});
    CHECK(c.pool() == d.pool());
    CHECK(c.pool() == sd::thread_pool::shared(2));
    one.reset();
    auto const want = run(one, tokens, iota_positions(0, 40));
    std::vector<float> got_c, got_d;
    std::thread tc([&] {
      for (int i = 0; i < 3; ++i) {
        c.reset();
        got_c = run(c, tokens, iota_positions(0, 40));
      }
    });
    std::thread td([&] {
      for (int i = 0; i < 3; ++i) {
        d.reset();
        got_d = run(d, tokens, iota_positions(0, 40));
      }
    });
    tc.join();
    td.join();
    CHECK(got_c == want);
    CHECK(got_d == want);
  }
}

TEST_CASE("cpu_llama: a tree forward equals running each root-to-leaf path alone") {
  for (std::size_t const limit : pack_limits) {
    CAPTURE(limit);
    auto w = st::random_llama(test_support::shapes::odd_gqa(), 21);
    sd::cpu_llama m(w, {.threads = 2, .pack_limit = limit});
    auto const prefix = random_tokens(9, 75, 1);
    // Root (last committed token) and a tree with branching at several depths.
    std::vector<sd::token_id> const tokens{4, 10, 11, 12, 20, 21, 30, 31, 32, 40, 41};
    std::vector<sd::node_index> const parents{-1, 0, 0, 0, 1, 1, 4, 4, 2, 8, 6};
    auto tree = sd::draft_tree::from_parents(tokens, parents);
    REQUIRE(tree.size() == tokens.size());

    (void)run(m, prefix, iota_positions(0, prefix.size()));
    std::size_t const past = m.cache().size();
    std::vector<sd::position_t> positions(tree.size());
    for (std::size_t i = 0; i < tree.size(); ++i)
      positions[i] = static_cast<sd::position_t>(past) + tree.depth(static_cast<sd::node_index>(i));
    sd::forward_request req;
    req.tokens = tree.tokens();
    req.positions = positions;
    req.mask = tree.mask();
    req.mask_stride = tree.mask_stride();
    sd::forward_result out;
    m.forward(req, out);
    REQUIRE(out.logits_count == tree.size());
    CHECK(m.cache().size() == past + tree.size());

    // Each node's path from the root, recomputed alone after the same prefix.
    sd::cpu_llama alone(w, {.threads = 1, .pack_limit = limit});
    for (std::size_t i = 0; i < tree.size(); ++i) {
      CAPTURE(i);
      std::vector<sd::token_id> path;
      for (auto j = static_cast<sd::node_index>(i); j >= 0; j = tree.parent(j))
        path.insert(path.begin(), tree.token(j));
      std::vector<sd::token_id> seq = prefix;
      seq.insert(seq.end(), path.begin(), path.end());
      alone.reset();
      auto const l = run(alone, seq, iota_positions(0, seq.size()));
      CHECK(st::row_error(out.logits.data() + i * 75, l.data() + (seq.size() - 1) * 75, 75) == 0.0);
    }

    // keep_path on the accepted path (root, 1, 4, 6, 10), then a forward equals recomputing.
    std::vector<std::int32_t> const keep{0, 1, 4, 6, 10};
    m.cache().keep_path(past, keep);
    CHECK(m.cache().size() == past + keep.size());
    auto const next = run(m, {7, 8}, iota_positions(past + keep.size(), 2));
    std::vector<sd::token_id> seq = prefix;
    for (auto k : keep) seq.push_back(tokens[static_cast<std::size_t>(k)]);
    seq.push_back(7);
    seq.push_back(8);
    alone.reset();
    auto const full = run(alone, seq, iota_positions(0, seq.size()));
    for (std::size_t r = 0; r < 2; ++r)
      CHECK(st::row_error(next.data() + r * 75, full.data() + (seq.size() - 2 + r) * 75, 75) ==
            0.0);
  }
}

TEST_CASE("cpu_llama: a non-tree mask (two independent chains in one batch)") {
  for (std::size_t const limit : pack_limits) {
    CAPTURE(limit);
    auto w = st::random_llama(test_support::shapes::odd_gqa(), 8);
    sd::cpu_llama m(w, {.threads = 2, .pack_limit = limit});
    auto const prefix = random_tokens(6, 75, 2);
    (void)run(m, prefix, iota_positions(0, 6));
    // Chain A = batch 0..2 at positions 6..8, chain B = batch 3..4 at positions 6..7, interleaved
    // order irrelevant: here A then B.
    std::vector<sd::token_id> const batch{3, 14, 15, 92 % 75, 26};
    std::vector<sd::position_t> const positions{6, 7, 8, 6, 7};
    auto const group = [](std::size_t i) { return i < 3 ? 0 : 1; };
    auto const mask = st::make_mask(
        5, [&](std::size_t i, std::size_t j) { return group(i) == group(j) && j <= i; });
    auto const got = run(m, batch, positions, mask);
    sd::cpu_llama alone(w, {.threads = 1, .pack_limit = limit});
    for (std::size_t i = 0; i < 5; ++i) {
      CAPTURE(i);
      std::vector<sd::token_id> seq = prefix;
      for (std::size_t j = 0; j <= i; ++j)
        if (group(j) == group(i)) seq.push_back(batch[j]);
      alone.reset();
      auto const l = run(alone, seq, iota_positions(0, seq.size()));
      CHECK(st::row_error(got.data() + i * 75, l.data() + (seq.size() - 1) * 75, 75) == 0.0);
    }
    // A mask that lets a token see a later batch token is honoured too (lookahead-style): token 0
    // seeing token 1 changes its logits.
    auto const full = st::make_mask(2, [](std::size_t, std::size_t) { return true; });
    m.cache().truncate(6);
    auto const both = run(m, {3, 14}, {6, 7}, full);
    m.cache().truncate(6);
    auto const causal = run(m, {3, 14}, {6, 7});
    CHECK(st::row_error(both.data(), causal.data(), 75) > 1e-3);
  }
}

TEST_CASE("cpu_llama: truncate then forward equals recomputing from scratch") {
  for (std::size_t const limit : pack_limits) {
    CAPTURE(limit);
    auto w = st::random_llama(test_support::shapes::odd_gqa(true), 31);
    sd::cpu_llama m(w, {.threads = 2, .pack_limit = limit});
    auto const seq = random_tokens(20, 75, 4);
    (void)run(m, seq, iota_positions(0, 20));
    m.cache().truncate(12);
    std::vector<sd::token_id> const more{1, 2, 3};
    auto const got = run(m, more, iota_positions(12, 3));
    std::vector<sd::token_id> full(seq.begin(), seq.begin() + 12);
    full.insert(full.end(), more.begin(), more.end());
    sd::cpu_llama fresh(w, {.threads = 1, .pack_limit = limit});
    auto const want = run(fresh, full, iota_positions(0, full.size()));
    for (std::size_t r = 0; r < 3; ++r)
      CHECK(st::row_error(got.data() + r * 75, want.data() + (12 + r) * 75, 75) == 0.0);
  }
}

TEST_CASE("cpu_llama: random chains, trees, truncations and keep_paths equal recomputation") {
  // The model keeps data derived from its cache rows across forwards (the transposed keys and
  // values of 8-float heads); whatever the cache went through, each forward must equal a fresh
  // prefill of the sequence the cache holds.
  auto w = st::random_llama(test_support::shapes::odd_gqa(), 61);
  for (std::size_t const limit : pack_limits) {
    CAPTURE(limit);
    sd::cpu_llama m(w, {.threads = 2, .pack_limit = limit});
    sd::cpu_llama fresh(w, {.threads = 1, .pack_limit = limit});
    std::mt19937_64 rng(17);
    auto const pick = [&](std::size_t lo, std::size_t hi) {  // uniform in [lo, hi]
      return lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
    };
    std::vector<sd::token_id> seq;  // what the cache holds
    for (int step = 0; step < 120; ++step) {
      CAPTURE(step);
      CAPTURE(seq.size());
      REQUIRE(m.cache().size() == seq.size());
      std::size_t const op = pick(0, 3);
      if ((op == 0 && !seq.empty()) || seq.size() > 80) {  // drop a suffix
        std::size_t const keep = pick(0, seq.size() - 1);
        m.cache().truncate(keep);
        seq.resize(keep);
        continue;
      }
      std::size_t const past = seq.size();
      std::size_t const nodes = pick(1, 6);
      std::vector<sd::token_id> tokens = random_tokens(nodes, 75, rng());
      std::vector<sd::node_index> parents(nodes, -1);
      if (op == 3)  // a tree: any earlier node as parent
        for (std::size_t i = 1; i < nodes; ++i)
          parents[i] = static_cast<sd::node_index>(pick(0, i - 1));
      else  // a chain
        for (std::size_t i = 1; i < nodes; ++i) parents[i] = static_cast<sd::node_index>(i - 1);
      // Drafts with equal siblings are fine here: the forward does not care.
      std::vector<std::size_t> depth(nodes, 0);
      std::vector<sd::position_t> positions(nodes);
      auto const mask = st::make_mask(nodes, [&](std::size_t i, std::size_t j) {
        for (auto a = static_cast<sd::node_index>(i); a >= 0;
             a = parents[static_cast<std::size_t>(a)])
          if (static_cast<std::size_t>(a) == j) return true;
        return false;
      });
      for (std::size_t i = 1; i < nodes; ++i)
        depth[i] = depth[static_cast<std::size_t>(parents[i])] + 1;
      for (std::size_t i = 0; i < nodes; ++i)
        positions[i] = static_cast<sd::position_t>(past + depth[i]);
      auto const got = run(m, tokens, positions, mask);
      // Each node against a fresh prefill of the sequence plus its path.
      for (std::size_t i = 0; i < nodes; ++i) {
        CAPTURE(i);
        std::vector<sd::token_id> path;
        for (auto a = static_cast<sd::node_index>(i); a >= 0;
             a = parents[static_cast<std::size_t>(a)])
          path.insert(path.begin(), tokens[static_cast<std::size_t>(a)]);
        std::vector<sd::token_id> full = seq;
        full.insert(full.end(), path.begin(), path.end());
        fresh.reset();
        auto const want = run(fresh, full, iota_positions(0, full.size()));
        CHECK(st::row_error(got.data() + i * 75, want.data() + (full.size() - 1) * 75, 75) == 0.0);
      }
      // Keep the path to a random node (a chain: a prefix of it; keep nothing sometimes).
      std::size_t const leaf = pick(0, nodes);
      std::vector<std::int32_t> keep;
      if (leaf < nodes)
        for (auto a = static_cast<sd::node_index>(leaf); a >= 0;
             a = parents[static_cast<std::size_t>(a)])
          keep.insert(keep.begin(), static_cast<std::int32_t>(a));
      m.cache().keep_path(past, keep);
      for (std::int32_t k : keep) seq.push_back(tokens[static_cast<std::size_t>(k)]);
    }
  }
}

TEST_CASE("cpu_llama: logits_rows, hidden rows, hidden_layer and skip_layers") {
  auto w = st::random_llama(test_support::shapes::odd_gqa(), 41);
  auto const tokens = random_tokens(10, 75, 6);
  auto const positions = iota_positions(0, 10);
  sd::cpu_llama m(w, {.threads = 2});
  auto const all = run(m, tokens, positions);

  m.reset();
  std::vector<std::int32_t> const rows{9, 2, 9};
  sd::forward_request req;
  req.tokens = tokens;
  req.positions = positions;
  req.logits_rows = rows;
  req.want_hidden = true;
  req.hidden_layer = 2;
  sd::forward_result out;
  m.forward(req, out);
  REQUIRE(out.logits_count == 3);
  REQUIRE(out.logits.size() == 3 * 75);
  for (std::size_t i = 0; i < 3; ++i)
    CHECK(st::row_error(out.logits.data() + i * 75,
                        all.data() + static_cast<std::size_t>(rows[i]) * 75, 75) == 0.0);
  REQUIRE(out.hidden_view().rows() == 10);
  REQUIRE(out.layer_hidden_view().rows() == 10);
  // The classifier applied to a hidden row gives its logits; the final norm of the last layer's
  // residual gives the hidden row.
  {
    auto const& wt = *w;
    std::size_t const d = 48;
    for (std::size_t t : {2u, 9u}) {
      auto const h = out.hidden_view().row(t);
      std::vector<double> logits(75, 0.0);
      for (std::size_t v = 0; v < 75; ++v)
        for (std::size_t i = 0; i < d; ++i) logits[v] += double(wt.classifier[v * d + i]) * h[i];
      CHECK(st::row_error(all.data() + t * 75, logits, 75) < 1e-5);
      auto const r = out.layer_hidden_view().row(t);
      double ss = 0;
      for (float x : r) ss += double(x) * x;
      double const s = 1.0 / std::sqrt(ss / double(d) + 1e-5);
      std::vector<double> normed(d);
      for (std::size_t i = 0; i < d; ++i) normed[i] = r[i] * s * double(wt.rms_final[i]);
      CHECK(st::row_error(h.data(), normed, d) < 1e-5);
    }
  }
  // A request without them clears the hidden outputs.
  m.reset();
  sd::forward_request plain;
  plain.tokens = tokens;
  plain.positions = positions;
  m.forward(plain, out);
  CHECK(out.hidden.empty());
  CHECK(out.layer_hidden.empty());
  CHECK(out.hidden_view().empty());

  // skip_layers {1}: the same as a model without layer 1; hidden_layer after the skipped layer
  // equals the residual after the layer before it.
  std::vector<std::int32_t> const skip{1};
  auto const w_skip = st::drop_layers(*w, skip);
  sd::cpu_llama reduced(w_skip, {.threads = 1});
  auto const want = run(reduced, tokens, positions);
  sd::cpu_llama skipper(w, {.threads = 2});
  sd::forward_request sreq;
  sreq.tokens = tokens;
  sreq.positions = positions;
  sreq.skip_layers = skip;
  sreq.hidden_layer = 1;
  sd::forward_result sout;
  skipper.forward(sreq, sout);
  for (std::size_t t = 0; t < 10; ++t)
    CHECK(st::row_error(sout.logits.data() + t * 75, want.data() + t * 75, 75) == 0.0);
  sd::cpu_llama first_layer(st::drop_layers(*w, {1, 2}), {.threads = 1});
  sd::forward_request freq;
  freq.tokens = tokens;
  freq.positions = positions;
  freq.hidden_layer = 0;
  sd::forward_result fout;
  first_layer.forward(freq, fout);
  CHECK(fout.layer_hidden == sout.layer_hidden);
  // Continuing with the same skip set keeps matching the reduced model.
  auto const a = run(reduced, {5}, {10});
  std::vector<sd::position_t> const p10{10};
  std::vector<sd::token_id> const t5{5};
  sreq.tokens = t5;
  sreq.positions = p10;
  sreq.hidden_layer = -1;
  skipper.forward(sreq, sout);
  CHECK(st::row_error(sout.logits.data(), a.data(), 75) == 0.0);
}

TEST_CASE("cpu_llama: hidden_layers returns several layers side by side, in the order asked") {
  auto w = st::random_llama(test_support::shapes::odd_gqa(), 43);
  auto const tokens = random_tokens(7, 75, 8);
  auto const positions = iota_positions(0, 7);
  std::size_t const d = 48;
  // Each layer alone, through hidden_layer.
  std::vector<std::vector<float>> single;
  for (std::int32_t l = 0; l < 3; ++l) {
    sd::cpu_llama m(w, {.threads = 1});
    sd::forward_request req{.tokens = tokens, .positions = positions};
    req.hidden_layer = l;
    sd::forward_result out;
    m.forward(req, out);
    CHECK(out.layer_count == 1);
    REQUIRE(out.layer_hidden_view().cols() == d);
    single.push_back(out.layer_hidden);
  }
  // Layers 2, 0, 2 at once: row t holds layer 2's stream, then layer 0's, then layer 2's again.
  std::vector<std::int32_t> const layers{2, 0, 2};
  sd::cpu_llama m(w, {.threads = 2});
  sd::forward_request req{.tokens = tokens, .positions = positions};
  req.hidden_layers = layers;
  sd::forward_result out;
  m.forward(req, out);
  CHECK(out.layer_count == 3);
  REQUIRE(out.layer_hidden_view().rows() == 7);
  REQUIRE(out.layer_hidden_view().cols() == 3 * d);
  for (std::size_t t = 0; t < 7; ++t)
    for (std::size_t j = 0; j < 3; ++j) {
      auto const row = out.layer_hidden_view().row(t).subspan(j * d, d);
      auto const& want = single[static_cast<std::size_t>(layers[j])];
      CHECK(std::equal(row.begin(), row.end(), want.begin() + static_cast<std::ptrdiff_t>(t * d)));
    }
  // Errors: a layer outside the model, both fields set.
  m.reset();
  std::vector<std::int32_t> const bad{0, 3};
  req.hidden_layers = bad;
  test_support::check_error([&] { m.forward(req, out); }, sd::errc::out_of_range, "hidden layer 3");
  req.hidden_layers = layers;
  req.hidden_layer = 1;
  test_support::check_error([&] { m.forward(req, out); }, sd::errc::invalid_argument,
                            "hidden_layer and hidden_layers are both set");
  CHECK(m.cache().size() == 0);
}

TEST_CASE("cpu_llama: bad requests throw specdec::error and leave the cache unchanged") {
  auto w = st::random_llama(test_support::shapes::odd_gqa(), 51);
  sd::cpu_llama m(w, {.threads = 2, .max_context = 16});
  CHECK(m.max_context() == 16);
  (void)run(m, {1, 2, 3}, {0, 1, 2});
  REQUIRE(m.cache().size() == 3);
  sd::forward_result out;
  auto expect = [&](sd::forward_request const& req, sd::errc code) {
    try {
      m.forward(req, out);
      FAIL("no throw");
    } catch (sd::error const& e) {
      CHECK(e.code() == code);
    }
    CHECK(m.cache().size() == 3);
  };
  std::vector<sd::token_id> const good{4, 5};
  std::vector<sd::position_t> const pos{3, 4};
  sd::forward_request req;
  req.tokens = good;
  req.positions = pos;

  SUBCASE("empty batch") {
    sd::forward_request r;
    expect(r, sd::errc::invalid_argument);
  }
  SUBCASE("token ids out of range") {
    std::vector<sd::token_id> const bad{4, 75};
    req.tokens = bad;
    expect(req, sd::errc::out_of_range);
    std::vector<sd::token_id> const neg{-1, 4};
    req.tokens = neg;
    expect(req, sd::errc::out_of_range);
  }
  SUBCASE("positions beyond the context or negative") {
    std::vector<sd::position_t> const far{3, 16};
    req.positions = far;
    expect(req, sd::errc::context_overflow);
    std::vector<sd::position_t> const neg{-1, 4};
    req.positions = neg;
    expect(req, sd::errc::context_overflow);
    std::vector<sd::position_t> const one{3};
    req.positions = one;
    expect(req, sd::errc::invalid_argument);
  }
  SUBCASE("cache overflow") {
    std::vector<sd::token_id> const many(14, 1);
    std::vector<sd::position_t> const p(14, 5);
    req.tokens = many;
    req.positions = p;
    expect(req, sd::errc::context_overflow);
    std::vector<sd::token_id> const fits(13, 1);
    std::vector<sd::position_t> const pf(13, 5);
    req.tokens = fits;
    req.positions = pf;
    m.forward(req, out);
    CHECK(m.cache().size() == 16);
    req.tokens = std::span<sd::token_id const>(good).first(1);
    req.positions = std::span<sd::position_t const>(pos).first(1);
    try {
      m.forward(req, out);
      FAIL("no throw");
    } catch (sd::error const& e) {
      CHECK(e.code() == sd::errc::context_overflow);
    }
    CHECK(m.cache().size() == 16);
    m.cache().truncate(3);
  }
  SUBCASE("malformed masks") {
    std::vector<std::uint64_t> const short_mask{1};  // one row for two tokens
    req.mask = short_mask;
    req.mask_stride = 1;
    expect(req, sd::errc::invalid_argument);
    std::vector<std::uint64_t> const zero_stride{1, 3};
    req.mask = zero_stride;
    req.mask_stride = 0;
    expect(req, sd::errc::invalid_argument);
    std::vector<std::uint64_t> const no_self{1, 1};  // token 1 does not see itself
    req.mask = no_self;
    req.mask_stride = 1;
    expect(req, sd::errc::invalid_argument);
  }
  SUBCASE("hidden_layer, skip_layers, logits_rows") {
    req.hidden_layer = 3;
    expect(req, sd::errc::out_of_range);
    req.hidden_layer = -2;
    expect(req, sd::errc::out_of_range);
    req.hidden_layer = -1;
    std::vector<std::int32_t> const skip_bad{3};
    req.skip_layers = skip_bad;
    expect(req, sd::errc::out_of_range);
    std::vector<std::int32_t> const skip_desc{1, 0};
    req.skip_layers = skip_desc;
    expect(req, sd::errc::invalid_argument);
    req.skip_layers = {};
    std::vector<std::int32_t> const rows{2};
    req.logits_rows = rows;
    expect(req, sd::errc::out_of_range);
  }
  SUBCASE("bad construction") {
    CHECK_THROWS_AS(sd::cpu_llama(nullptr), sd::error);
    CHECK_THROWS_AS(sd::cpu_llama(w, {.threads = 0}), sd::error);
    auto broken = std::make_shared<sd::llama_weights>(*w);
    broken->layers[1].w2 = nullptr;
    CHECK_THROWS_AS(sd::cpu_llama{broken}, sd::error);
    auto few = std::make_shared<sd::llama_weights>(*w);
    few->layers.pop_back();
    CHECK_THROWS_AS(sd::cpu_llama{few}, sd::error);
    auto bad_config = std::make_shared<sd::llama_weights>(*w);
    bad_config->config.n_kv_heads = 4;  // does not divide 6 heads
    CHECK_THROWS_AS(sd::cpu_llama{bad_config}, sd::error);
  }
  // The model still works after the errors.
  auto const l = run(m, {4}, {3});
  CHECK(l.size() == 75);
}

TEST_CASE("cpu_llama: stories260K greedy decoding reproduces the reference ids") {
  auto const ref = read_ids(test_support::model_file("reference_greedy_once_upon_a_time.ids"));
  REQUIRE(ref.size() == 256);
  for (char const* file : {"stories260K.bin", "stories260K.gguf"}) {
    CAPTURE(file);
    auto const w =
        std::make_shared<sd::llama_weights const>(sd::load_model(test_support::model_file(file)));
    // The GGUF file declares a context of 128 (llama.context_length); the .bin 512. RoPE works at
    // any position, so run both with a context of 512.
    sd::cpu_llama m(w, {.threads = 2, .max_context = 512});
    CHECK(m.vocab_size() == 512);
    CHECK(m.max_context() == 512);

    std::vector<sd::token_id> seq{1, 403, 407, 261, 378};  // BOS + encode("Once upon a time")
    // Prefill in one batched forward; logits of the last row only.
    std::vector<std::int32_t> const last{4};
    auto const positions = iota_positions(0, seq.size());
    sd::forward_request req;
    req.tokens = seq;
    req.positions = positions;
    req.logits_rows = last;
    sd::forward_result out;
    m.forward(req, out);
    REQUIRE(out.logits_count == 1);
    // Greedy until 256 ids after BOS; the last one needs no forward.
    while (seq.size() < 257) {
      sd::token_id const next = st::argmax(out.logits_view().row(0));
      seq.push_back(next);
      if (seq.size() == 257) break;
      sd::token_id const tok[1] = {next};
      sd::position_t const pos[1] = {static_cast<sd::position_t>(seq.size() - 1)};
      sd::forward_request step;
      step.tokens = tok;
      step.positions = pos;
      m.forward(step, out);
    }
    std::vector<sd::token_id> const got(seq.begin() + 1, seq.end());
    CHECK(got == ref);
    CHECK(m.cache().size() == 256);
  }
}
