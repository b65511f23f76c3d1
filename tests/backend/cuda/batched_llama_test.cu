// The CUDA batched model: concept conformance, ragged steps (prefills, chains, trees) over several
// slots against the CPU backend's single-sequence forward of each sequence, after random
// keep_path commits, with slots released and reused; bad batches.

#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "backend/cuda/cpu_reference.hpp"
#include "backend/cuda/test_util.cuh"
#include "specdec/backend/cuda/batched_llama.cuh"
#include "specdec/core/concepts.hpp"
#include "support/errors.hpp"
#include "support/files.hpp"
#include "support/llama_shapes.hpp"

namespace {

namespace sd = specdec;
using sd::position_t;
using sd::token_id;

static_assert(sd::batched_lm<sd::cuda_batched_llama>);
static_assert(!sd::causal_lm<sd::cuda_batched_llama>);

// Relative tolerance against the CPU backend, as in llama_test.cu.
constexpr float logits_tol = 2e-4f;

float max_rel_diff(std::span<float const> a, std::span<float const> b) {
  REQUIRE(a.size() == b.size());
  float worst = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (1.0f + std::abs(b[i])));
  return worst;
}

// A random draft under `past` committed tokens: a chain, a tree or a causal run of `nodes` tokens,
// with each node's parent, positions and mask.
struct draft {
  std::vector<token_id> tokens;
  std::vector<sd::node_index> parents;
  std::vector<position_t> positions;
  std::vector<std::uint64_t> mask;
};

draft random_draft(std::mt19937_64& rng, std::size_t past, std::size_t nodes, std::size_t vocab,
                   bool tree) {
  draft d;
  d.tokens.resize(nodes);
  for (auto& t : d.tokens) t = static_cast<token_id>(rng() % vocab);
  d.parents.assign(nodes, -1);
  for (std::size_t i = 1; i < nodes; ++i)
    d.parents[i] = static_cast<sd::node_index>(tree ? rng() % i : i - 1);
  std::vector<std::size_t> depth(nodes, 0);
  for (std::size_t i = 1; i < nodes; ++i)
    depth[i] = depth[static_cast<std::size_t>(d.parents[i])] + 1;
  for (std::size_t i = 0; i < nodes; ++i)
    d.positions.push_back(static_cast<position_t>(past + depth[i]));
  std::size_t const words = sd::mask_words(nodes);
  d.mask.assign(nodes * words, 0);
  for (std::size_t i = 0; i < nodes; ++i)
    for (auto a = static_cast<sd::node_index>(i); a >= 0;
         a = d.parents[static_cast<std::size_t>(a)])
      d.mask[i * words + static_cast<std::size_t>(a) / 64] |= std::uint64_t{1}
                                                              << (static_cast<std::size_t>(a) % 64);
  return d;
}

}  // namespace

TEST_CASE("cuda_batched_llama: ragged steps equal the CPU backend's single-sequence forwards") {
  cuda_test::require_device();
  auto const w = cuda_test::random_weights(test_support::shapes::cuda_gqa(), 9, 0.1f);
  std::size_t const vocab = static_cast<std::size_t>(w->config.vocab_size);
  sd::cuda_batched_llama m(w, {.max_slots = 3});
  std::mt19937_64 rng(3);
  struct live {
    std::size_t slot;
    std::vector<token_id> seq;
  };
  std::vector<live> seqs;
  sd::batch_forward_result out;
  for (int step = 0; step < 12; ++step) {
    CAPTURE(step);
    if (!seqs.empty() && rng() % 4 == 0) {  // a request leaves; its slot is reused
      m.release_slot(seqs.front().slot);
      seqs.erase(seqs.begin());
    }
    while (m.free_slots() > 0) seqs.push_back({m.acquire_slot(), {}});
    std::vector<draft> drafts;
    std::vector<sd::batch_segment> segments;
    for (live const& l : seqs) {
      bool const prefill = l.seq.empty();
      drafts.push_back(random_draft(rng, l.seq.size(), prefill ? 9 : 1 + rng() % 5, vocab,
                                    !prefill && rng() % 2 == 0));
    }
    for (std::size_t i = 0; i < seqs.size(); ++i)
      segments.push_back({.slot = seqs[i].slot,
                          .tokens = drafts[i].tokens,
                          .positions = drafts[i].positions,
                          .mask = drafts[i].mask,
                          .mask_stride = sd::mask_words(drafts[i].tokens.size())});
    m.forward({.segments = segments}, out);
    for (std::size_t i = 0; i < seqs.size(); ++i) {
      CAPTURE(i);
      live& l = seqs[i];
      draft const& d = drafts[i];
      REQUIRE(out.logits(i).rows() == d.tokens.size());
      CHECK(m.cache(l.slot).size() == l.seq.size() + d.tokens.size());
      // Against the CPU backend: the same draft after the sequence's committed tokens.
      sd::forward_request req;
      req.tokens = d.tokens;
      req.positions = d.positions;
      req.mask = d.mask;
      req.mask_stride = sd::mask_words(d.tokens.size());
      sd::forward_result const cpu = cuda_test::cpu_forward(w, l.seq, req);
      for (std::size_t r = 0; r < d.tokens.size(); ++r)
        CHECK(max_rel_diff(out.logits(i).row(r), cpu.logits_view().row(r)) <= logits_tol);
      // Keep a random root-to-node path.
      std::size_t const leaf = rng() % d.tokens.size();
      std::vector<std::int32_t> keep;
      for (auto a = static_cast<sd::node_index>(leaf); a >= 0;
           a = d.parents[static_cast<std::size_t>(a)])
        keep.insert(keep.begin(), static_cast<std::int32_t>(a));
      m.cache(l.slot).keep_path(l.seq.size(), keep);
      for (std::int32_t k : keep) l.seq.push_back(d.tokens[static_cast<std::size_t>(k)]);
    }
  }
}

TEST_CASE("cuda_batched_llama: slots and bad batches") {
  cuda_test::require_device();
  auto const w = cuda_test::random_weights(test_support::shapes::cuda_gqa(), 10, 0.1f);
  sd::cuda_batched_llama m(w, {.model = {.max_context = 32}, .max_slots = 2});
  std::size_t const a = m.acquire_slot(), b = m.acquire_slot();
  test_support::expect_error([&] { (void)m.acquire_slot(); }, sd::errc::context_overflow);
  std::vector<token_id> const ten{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<position_t> pos(10);
  std::iota(pos.begin(), pos.end(), 0);
  sd::batch_forward_result out;
  sd::batch_segment const ok[] = {{.slot = a, .tokens = ten, .positions = pos},
                                  {.slot = b, .tokens = ten, .positions = pos}};
  m.forward({.segments = ok}, out);
  sd::batch_segment const twice[] = {{.slot = a, .tokens = ten, .positions = pos},
                                     {.slot = a, .tokens = ten, .positions = pos}};
  test_support::expect_error([&] { m.forward({.segments = twice}, out); },
                             sd::errc::invalid_argument);
  std::vector<token_id> const many(30, 3);
  std::vector<position_t> pos30(30);
  std::iota(pos30.begin(), pos30.end(), 10);
  sd::batch_segment const overflow[] = {
      {.slot = a, .tokens = std::span(ten).first(1), .positions = std::span(pos).first(1)},
      {.slot = b, .tokens = many, .positions = pos30}};
  test_support::expect_error([&] { m.forward({.segments = overflow}, out); },
                             sd::errc::context_overflow);
  CHECK(m.cache(a).size() == 10);
  CHECK(m.cache(b).size() == 10);
  m.release_slot(b);
  CHECK(m.acquire_slot() == b);
  CHECK(m.cache(b).size() == 0);
}
