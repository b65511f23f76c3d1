// cpu_llama with a view of the cache (forward_request::view): a forward that views the cache
// equals, bit for bit, the forward of a copy whose cache holds only the viewed entries (kept with
// keep_path, so they are the same keys and values at the same positions); the view changes what
// the batch sees, not the cache; segments of one forward each use their own view; bad views are
// refused with the cache unchanged. Views that list positions per layer and kv head, and the
// attention statistics of the cache (kv_scores), against the double-precision reference forward.

#include "specdec/backend/cpu/llama.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/test_models.hpp"
#include "specdec/core/traits.hpp"
#include "support/errors.hpp"
#include "support/llama_shapes.hpp"

namespace sd = specdec;
namespace st = specdec::test;

static_assert(sd::supports_kv_view_v<sd::cpu_llama>);

namespace {

std::size_t const view_pack_limits[] = {sd::cpu_llama_options{}.pack_limit, 0};

struct batch {
  std::vector<sd::token_id> tokens;
  std::vector<sd::position_t> positions;
  std::vector<std::uint64_t> mask;  // empty: causal

  [[nodiscard]] sd::forward_request request(sd::kv_view view = {}) const {
    return {.tokens = tokens,
            .positions = positions,
            .mask = mask,
            .mask_stride = mask.empty() ? 0 : sd::mask_words(tokens.size()),
            .view = view};
  }
};

std::vector<sd::token_id> random_tokens(std::mt19937_64& rng, std::size_t n, std::size_t vocab) {
  std::vector<sd::token_id> t(n);
  for (auto& x : t) x = static_cast<sd::token_id>(rng() % vocab);
  return t;
}

// A causal chain of n tokens at positions first.., or a random tree (ancestor mask).
batch random_batch(std::mt19937_64& rng, std::size_t first, std::size_t n, std::size_t vocab,
                   bool tree) {
  batch b;
  b.tokens = random_tokens(rng, n, vocab);
  b.positions.resize(n);
  if (!tree) {
    std::iota(b.positions.begin(), b.positions.end(), static_cast<sd::position_t>(first));
    return b;
  }
  std::size_t const words = sd::mask_words(n);
  b.mask.assign(n * words, 0);
  std::vector<std::size_t> parent(n, 0), depth(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) {
      parent[i] = rng() % i;
      depth[i] = depth[parent[i]] + 1;
      for (std::size_t w = 0; w < words; ++w) b.mask[i * words + w] = b.mask[parent[i] * words + w];
    }
    b.mask[i * words + i / 64] |= std::uint64_t{1} << (i % 64);
    b.positions[i] = static_cast<sd::position_t>(first + depth[i]);
  }
  return b;
}

// The cache entries `view` selects in a cache of `size`, as keep_path indices.
std::vector<std::int32_t> entries(sd::kv_view const& view, std::size_t size) {
  std::vector<std::int32_t> keep;
  view.for_each_run(size, [&](std::size_t first, std::size_t n) {
    for (std::size_t p = first; p < first + n; ++p) keep.push_back(static_cast<std::int32_t>(p));
  });
  return keep;
}

std::vector<float> logits_of(sd::cpu_llama& m, sd::forward_request const& req) {
  sd::forward_result out;
  m.forward(req, out);
  return out.logits;
}

}  // namespace

TEST_CASE("cpu_llama view: equals a cache that holds only the viewed entries") {
  std::mt19937_64 rng(41);
  std::size_t cases = 0;
  for (std::size_t const limit : view_pack_limits) {
    // Head size 8 (odd_gqa): the transposed attention kernels where the build has them.
    auto const w = st::random_llama(test_support::shapes::odd_gqa(), 7);
    std::size_t const vocab = 75;
    for (int round = 0; round < 12; ++round) {
      CAPTURE(limit);
      CAPTURE(round);
      std::size_t const past = 20 + rng() % 50;
      std::vector<std::int32_t> blocks;
      std::size_t const block_size = 1 + rng() % 9;
      for (std::int32_t b = 0; static_cast<std::size_t>(b) * block_size < past; ++b)
        if (rng() % 3 == 0) blocks.push_back(b);
      sd::kv_view const view{.sinks = rng() % 6,
                             .window = rng() % 4 == 0 ? past + 3 : rng() % 16,
                             .block_size = block_size,
                             .blocks = blocks};
      if (view.empty()) continue;
      sd::cpu_llama viewed(w, {.threads = 2, .pack_limit = limit});
      sd::cpu_llama kept(w, {.threads = 1, .pack_limit = limit});
      batch const prompt = random_batch(rng, 0, past, vocab, false);
      (void)logits_of(viewed, prompt.request());
      (void)logits_of(kept, prompt.request());
      kept.cache().keep_path(0, entries(view, past));
      batch const draft = random_batch(rng, past, 1 + rng() % 7, vocab, rng() % 2 == 0);
      std::vector<float> const got = logits_of(viewed, draft.request(view));
      std::vector<float> const want = logits_of(kept, draft.request());
      REQUIRE(got.size() == want.size());
      CHECK(st::row_error(got.data(), want.data(), got.size()) == 0.0);
      CHECK(viewed.cache().size() == past + draft.tokens.size());
      // The view changed what the draft saw, not the cache: rolled back, the full cache scores as
      // a model that never ran the view.
      viewed.cache().truncate(past);
      sd::cpu_llama fresh(w, {.threads = 1, .pack_limit = limit});
      (void)logits_of(fresh, prompt.request());
      batch const next = random_batch(rng, past, 3, vocab, false);
      std::vector<float> const a = logits_of(viewed, next.request());
      std::vector<float> const b = logits_of(fresh, next.request());
      CHECK(st::row_error(a.data(), b.data(), a.size()) == 0.0);
      ++cases;
    }
  }
  CHECK(cases >= 16);
}

TEST_CASE("cpu_llama view: a view of the whole cache is the plain forward; a partial one differs") {
  std::mt19937_64 rng(3);
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 9);
  sd::cpu_llama m(w, {.threads = 2});
  batch const prompt = random_batch(rng, 0, 40, 75, false);
  (void)logits_of(m, prompt.request());
  batch const draft = random_batch(rng, 40, 4, 75, true);
  std::vector<float> const plain = logits_of(m, draft.request());
  m.cache().truncate(40);
  std::vector<float> const whole = logits_of(m, draft.request({.sinks = 40}));
  CHECK(st::row_error(plain.data(), whole.data(), plain.size()) == 0.0);
  m.cache().truncate(40);
  std::vector<float> const partial = logits_of(m, draft.request({.sinks = 4, .window = 8}));
  CHECK(st::row_error(plain.data(), partial.data(), plain.size()) > 0.0);
}

TEST_CASE("cpu_llama view: each segment of a multi-sequence forward uses its own view") {
  std::mt19937_64 rng(17);
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 11);
  sd::cpu_llama m(w, {.threads = 2});
  std::vector<sd::cpu_llama_sequence> seqs;
  std::vector<sd::kv_view> views{{.sinks = 2, .window = 5}, {}, {.window = 9}};
  std::vector<batch> prompts, drafts;
  for (std::size_t s = 0; s < 3; ++s) {
    seqs.push_back(m.make_sequence());
    prompts.push_back(random_batch(rng, 0, 25 + 6 * s, 75, false));
    drafts.push_back(random_batch(rng, 25 + 6 * s, 3 + s, 75, s == 1));
  }
  std::vector<sd::forward_request> reqs;
  std::vector<sd::cpu_llama_segment> segs;
  for (std::size_t s = 0; s < 3; ++s) segs.push_back({&seqs[s], prompts[s].request()});
  sd::forward_result out;
  m.forward(segs, out);
  segs.clear();
  for (std::size_t s = 0; s < 3; ++s) segs.push_back({&seqs[s], drafts[s].request(views[s])});
  m.forward(segs, out);
  std::size_t row = 0;
  for (std::size_t s = 0; s < 3; ++s) {
    CAPTURE(s);
    sd::cpu_llama alone(w, {.threads = 1});
    (void)logits_of(alone, prompts[s].request());
    std::vector<float> const want = logits_of(alone, drafts[s].request(views[s]));
    CHECK(st::row_error(out.logits.data() + row * 75, want.data(), want.size()) == 0.0);
    row += drafts[s].tokens.size();
  }
}

TEST_CASE("cpu_llama view: a malformed view is refused and the cache left as it was") {
  std::mt19937_64 rng(23);
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 13);
  sd::cpu_llama m(w, {.threads = 1});
  batch const prompt = random_batch(rng, 0, 16, 75, false);
  (void)logits_of(m, prompt.request());
  batch const draft = random_batch(rng, 16, 2, 75, false);
  std::vector<std::int32_t> const late{1, 4};  // block 4 of 4 starts at 16: past the cache
  std::vector<std::int32_t> const unsorted{2, 1};
  std::string const msg = test_support::expect_error(
      [&] { (void)logits_of(m, draft.request({.block_size = 4, .blocks = late})); },
      sd::errc::out_of_range);
  CHECK(msg.find("past the cache") != std::string::npos);
  test_support::expect_error(
      [&] { (void)logits_of(m, draft.request({.block_size = 4, .blocks = unsorted})); },
      sd::errc::invalid_argument);
  CHECK(m.cache().size() == 16);
}

namespace {

// Random lists of `per_head` positions below `past`, one per layer and kv head, each ascending.
std::vector<std::int32_t> random_lists(std::mt19937_64& rng, std::size_t lists,
                                       std::size_t per_head, std::size_t past) {
  std::vector<std::int32_t> out;
  std::vector<std::int32_t> all(past);
  std::iota(all.begin(), all.end(), 0);
  for (std::size_t i = 0; i < lists; ++i) {
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<std::int32_t> one(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(per_head));
    std::sort(one.begin(), one.end());
    out.insert(out.end(), one.begin(), one.end());
  }
  return out;
}

// Whether cache position j < past is in `view` for layer l, kv head g (kv_heads per layer).
bool in_view(sd::kv_view const& view, std::size_t past, std::size_t kv_heads, std::size_t l,
             std::size_t g, std::size_t j) {
  if (view.empty()) return true;
  bool in = false;
  view.for_each_run(
      past, [&](std::size_t first, std::size_t n) { in = in || (j >= first && j < first + n); },
      l * kv_heads + g);
  return in;
}

}  // namespace

TEST_CASE("cpu_llama view: positions listed per layer and kv head match the double reference") {
  std::mt19937_64 rng(29);
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 19);
  std::size_t const layers = 3, kv_heads = 2, vocab = 75;
  for (std::size_t const limit : view_pack_limits) {
    for (int round = 0; round < 6; ++round) {
      CAPTURE(limit);
      CAPTURE(round);
      std::size_t const past = 20 + rng() % 30, d = 1 + rng() % 5;
      std::size_t const per_head = 1 + rng() % (past - 1);
      std::vector<std::int32_t> const lists = random_lists(rng, layers * kv_heads, per_head, past);
      sd::kv_view const view{
          .sinks = rng() % 3, .window = rng() % 5, .positions = lists, .per_head = per_head};
      sd::cpu_llama m(w, {.threads = 2, .pack_limit = limit});
      batch const prompt = random_batch(rng, 0, past, vocab, false);
      batch const draft = random_batch(rng, past, d, vocab, false);
      (void)logits_of(m, prompt.request());
      std::vector<float> const got = logits_of(m, draft.request(view));
      std::vector<sd::token_id> all = prompt.tokens;
      all.insert(all.end(), draft.tokens.begin(), draft.tokens.end());
      auto const ref = st::reference_forward(
          *w, all, [&](std::size_t l, std::size_t g, std::size_t t, std::size_t j) {
            return t < past || j >= past || in_view(view, past, kv_heads, l, g, j);
          });
      for (std::size_t t = 0; t < d; ++t)
        CHECK(st::row_error(got.data() + t * vocab, ref.logits.data() + (past + t) * vocab, vocab) <
              1e-4);
      // A list per head changes what each head sees: the same lists under other heads differ.
      std::vector<std::int32_t> swapped = lists;
      std::rotate(swapped.begin(), swapped.begin() + static_cast<std::ptrdiff_t>(per_head),
                  swapped.end());
      m.cache().truncate(past);
      sd::kv_view other = view;
      other.positions = swapped;
      if (per_head + view.sinks + view.window < past)
        CHECK(logits_of(m, draft.request(other)) != got);
    }
  }
}

TEST_CASE("cpu_llama view: the same list for every head is a view of blocks of one position") {
  std::mt19937_64 rng(31);
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 23);
  for (std::size_t const limit : view_pack_limits) {
    for (int round = 0; round < 6; ++round) {
      CAPTURE(limit);
      CAPTURE(round);
      std::size_t const past = 30 + rng() % 30;
      std::vector<std::int32_t> const one = random_lists(rng, 1, 1 + rng() % 20, past);
      std::vector<std::int32_t> lists;
      for (std::size_t i = 0; i < 6; ++i) lists.insert(lists.end(), one.begin(), one.end());
      sd::cpu_llama m(w, {.threads = 2, .pack_limit = limit});
      (void)logits_of(m, random_batch(rng, 0, past, 75, false).request());
      batch const draft = random_batch(rng, past, 1 + rng() % 6, 75, rng() % 2 == 0);
      std::size_t const window = rng() % 6;
      std::vector<float> const listed = logits_of(
          m, draft.request({.window = window, .positions = lists, .per_head = one.size()}));
      m.cache().truncate(past);
      std::vector<float> const blocks =
          logits_of(m, draft.request({.window = window, .block_size = 1, .blocks = one}));
      CHECK(st::row_error(listed.data(), blocks.data(), listed.size()) == 0.0);
    }
  }
}

TEST_CASE("cpu_llama kv_scores: attention weights and logits of the cache match the reference") {
  std::mt19937_64 rng(37);
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 29);
  std::size_t const layers = 3, kv_heads = 2, vocab = 75;
  std::size_t cases = 0;
  for (std::size_t const limit : view_pack_limits) {
    for (int round = 0; round < 8; ++round) {
      CAPTURE(limit);
      CAPTURE(round);
      bool const logit = round % 2 == 1;
      std::size_t const past = 10 + rng() % 40, d = 1 + rng() % 6, rows = 1 + rng() % d;
      std::vector<std::int32_t> lists;
      sd::kv_view view;
      if (round % 4 >= 2) {  // half the rounds through a view with lists
        std::size_t const per_head = 1 + rng() % (past - 1);
        lists = random_lists(rng, layers * kv_heads, per_head, past);
        view = {.sinks = rng() % 3, .positions = lists, .per_head = per_head};
      }
      sd::cpu_llama m(w, {.threads = 1 + rng() % 3, .pack_limit = limit});
      batch const prompt = random_batch(rng, 0, past, vocab, false);
      batch const draft = random_batch(rng, past, d, vocab, false);
      (void)logits_of(m, prompt.request());
      sd::forward_request req = draft.request(view);
      req.kv_scores = {.kind = logit ? sd::kv_score_kind::logit : sd::kv_score_kind::probability,
                       .rows = rows};
      sd::forward_result out;
      m.forward(req, out);
      REQUIRE(out.kv_score_heads == kv_heads);
      REQUIRE(out.kv_score_positions == past);
      REQUIRE(out.kv_scores.size() == layers * kv_heads * past);
      std::vector<sd::token_id> all = prompt.tokens;
      all.insert(all.end(), draft.tokens.begin(), draft.tokens.end());
      auto const ref = st::reference_forward(
          *w, all,
          [&](std::size_t l, std::size_t g, std::size_t t, std::size_t j) {
            return t < past || j >= past || in_view(view, past, kv_heads, l, g, j);
          },
          rows, past, logit);
      double top = 0;
      for (double const x : ref.scores) top = std::max(top, std::abs(x));
      CHECK(top > 0);
      for (std::size_t i = 0; i < out.kv_scores.size(); ++i) {
        CAPTURE(i);
        CHECK(std::abs(double(out.kv_scores[i]) - ref.scores[i]) <= 1e-4 * (1 + top));
        if (ref.scores[i] == 0.0 &&
            !in_view(view, past, kv_heads, i / (kv_heads * past), i / past % kv_heads, i % past))
          CHECK(out.kv_scores[i] == 0.0f);  // outside the view: exactly nothing
      }
      // The logits are those of the same forward without kv_scores.
      m.cache().truncate(past);
      CHECK(logits_of(m, draft.request(view)) == out.logits);
      ++cases;
    }
  }
  CHECK(cases == 16);
}

TEST_CASE("cpu_llama kv_scores: refused across segments; a skipped layer scores nothing") {
  std::mt19937_64 rng(43);
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 31);
  sd::cpu_llama m(w, {.threads = 2});
  std::vector<sd::cpu_llama_sequence> seqs;
  seqs.push_back(m.make_sequence());
  seqs.push_back(m.make_sequence());
  batch const a = random_batch(rng, 0, 6, 75, false), b = random_batch(rng, 0, 5, 75, false);
  sd::forward_request ra = a.request();
  ra.kv_scores = {.kind = sd::kv_score_kind::probability, .rows = 2};
  std::vector<sd::cpu_llama_segment> const segs{{&seqs[0], ra}, {&seqs[1], b.request()}};
  sd::forward_result out;
  CHECK(test_support::expect_error([&] { m.forward(segs, out); }, sd::errc::invalid_argument)
            .find("kv_scores") != std::string::npos);
  CHECK(seqs[0].cache().size() == 0);
  (void)logits_of(m, random_batch(rng, 0, 12, 75, false).request());
  batch const next = random_batch(rng, 12, 2, 75, false);
  sd::forward_request req = next.request();
  std::vector<std::int32_t> const skip{1};
  req.skip_layers = skip;
  req.kv_scores = {.kind = sd::kv_score_kind::probability, .rows = 2};
  m.forward(req, out);
  REQUIRE(out.kv_scores.size() == 3 * 2 * 12);
  for (std::size_t i = 0; i < out.kv_scores.size(); ++i) {
    CAPTURE(i);
    if (i / 24 == 1)
      CHECK(out.kv_scores[i] == 0.0f);
    else
      CHECK(out.kv_scores[i] > 0.0f);  // every position seen by 3 heads x 2 rows
  }
  // Without kv_scores the result holds none.
  m.cache().truncate(12);
  m.forward(next.request(), out);
  CHECK(out.kv_scores.empty());
  CHECK(out.kv_score_positions == 0);
}

TEST_CASE("cpu_llama view: lists that do not fit the model or the cache are refused") {
  std::mt19937_64 rng(47);
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 37);
  sd::cpu_llama m(w, {.threads = 1});
  (void)logits_of(m, random_batch(rng, 0, 16, 75, false).request());
  batch const draft = random_batch(rng, 16, 2, 75, false);
  std::vector<std::int32_t> const five = random_lists(rng, 5, 3, 16);  // 5 lists for 3 x 2
  CHECK(test_support::expect_error(
            [&] { (void)logits_of(m, draft.request({.positions = five, .per_head = 3})); },
            sd::errc::invalid_argument)
            .find("one list each") != std::string::npos);
  std::vector<std::int32_t> late = random_lists(rng, 6, 3, 16);
  late.back() = 16;  // past the cache's 16 positions
  std::sort(late.end() - 3, late.end());
  test_support::expect_error(
      [&] { (void)logits_of(m, draft.request({.positions = late, .per_head = 3})); },
      sd::errc::out_of_range);
  CHECK(m.cache().size() == 16);
}
