// cpu_llama with a view of the cache (forward_request::view): a forward that views the cache
// equals, bit for bit, the forward of a copy whose cache holds only the viewed entries (kept with
// keep_path, so they are the same keys and values at the same positions); the view changes what
// the batch sees, not the cache; segments of one forward each use their own view; bad views are
// refused with the cache unchanged.

#include "specdec/backend/cpu/llama.hpp"

#include "support/doctest.hpp"

#include <cstdint>
#include <numeric>
#include <random>
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
