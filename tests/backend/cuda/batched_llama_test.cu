// The CUDA batched model (cuda_batched_llama over cuda_llama's forward of several segments):
// concept conformance; ragged steps (prefills, chains, trees, chosen logits rows, hidden rows) over
// slots that come and go, each segment against the CPU backend's single-sequence forward of its
// sequence after random truncate / keep_path commits; greedy speculative decoding of staggered
// sequences of the stories260K fixture gives the MANIFEST's ids in every slot; bad batches throw
// and leave every cache unchanged.
//
// Tolerance: |a - b| <= 2e-4 (1 + |b|), that of the CUDA model against the CPU backend
// (llama_test.cu): float32 both, only the order of the sums differs.

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
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
static_assert(!sd::batched_lm<sd::cuda_llama>);
static_assert(!sd::causal_lm<sd::cuda_batched_llama>);

constexpr float logits_tol = 2e-4f;

// max |a - b| / (1 + |b|).
float max_rel_diff(std::span<float const> a, std::span<float const> b) {
  REQUIRE(a.size() == b.size());
  float worst = 0.0f;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / (1.0f + std::abs(b[i])));
  return worst;
}

token_id argmax(std::span<float const> row) {
  return static_cast<token_id>(std::max_element(row.begin(), row.end()) - row.begin());
}

// One segment's draft: a chain, a tree or (prefill) a causal run of nodes under `past` committed
// tokens, with each node's parent, its positions and mask.
struct draft {
  std::vector<token_id> tokens;
  std::vector<sd::node_index> parents;
  std::vector<position_t> positions;
  std::vector<std::uint64_t> mask;

  // Node indices from the draft's first node to node i.
  [[nodiscard]] std::vector<std::int32_t> path(std::size_t i) const {
    std::vector<std::int32_t> p;
    for (auto a = static_cast<sd::node_index>(i); a >= 0; a = parents[static_cast<std::size_t>(a)])
      p.insert(p.begin(), static_cast<std::int32_t>(a));
    return p;
  }
};

// A draft of the given nodes' tokens and parents (parents[i] < i; -1 for a root under the cache).
draft make_draft(std::size_t past, std::vector<token_id> tokens,
                 std::vector<sd::node_index> parents) {
  draft d{std::move(tokens), std::move(parents), {}, {}};
  std::size_t const nodes = d.tokens.size();
  std::size_t const words = sd::mask_words(nodes);
  d.mask.assign(nodes * words, 0);
  for (std::size_t i = 0; i < nodes; ++i) {
    std::vector<std::int32_t> const p = d.path(i);
    d.positions.push_back(static_cast<position_t>(past + p.size() - 1));
    for (std::int32_t a : p)
      d.mask[i * words + static_cast<std::size_t>(a) / 64] |= std::uint64_t{1}
                                                              << (static_cast<std::size_t>(a) % 64);
  }
  return d;
}

draft random_draft(std::mt19937_64& rng, std::size_t past, std::size_t nodes, std::size_t vocab,
                   bool tree) {
  std::vector<token_id> tokens(nodes);
  for (auto& t : tokens) t = static_cast<token_id>(rng() % vocab);
  std::vector<sd::node_index> parents(nodes, -1);
  for (std::size_t i = 1; i < nodes; ++i)
    parents[i] = static_cast<sd::node_index>(tree ? rng() % i : i - 1);
  return make_draft(past, std::move(tokens), std::move(parents));
}

sd::batch_segment segment_of(std::size_t slot, draft const& d) {
  return {.slot = slot,
          .request = {.tokens = d.tokens,
                      .positions = d.positions,
                      .mask = d.mask,
                      .mask_stride = sd::mask_words(d.tokens.size())}};
}

}  // namespace

TEST_CASE("cuda_batched_llama: ragged steps equal the CPU backend's single-sequence forwards") {
  cuda_test::require_device();
  auto const w = cuda_test::random_weights(test_support::shapes::cuda_gqa(), 9, 0.1f);
  auto const vocab = static_cast<std::size_t>(w->config.vocab_size);
  auto const dim = static_cast<std::size_t>(w->config.dim);
  sd::cuda_batched_llama m(w, {.max_slots = 4});
  std::mt19937_64 rng(3);
  auto const pick = [&](std::size_t lo, std::size_t hi) {
    return lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
  };
  struct live {
    std::size_t slot;
    std::vector<token_id> seq;  // what the slot's cache holds
  };
  std::vector<live> seqs;
  std::size_t reused = 0, single = 0, several = 0;
  std::vector<bool> used(m.max_slots(), false);
  sd::batch_forward_result out;
  for (int step = 0; step < 16; ++step) {
    CAPTURE(step);
    // Requests leave and join; a released slot is reused, its cache emptied.
    if (!seqs.empty() && pick(0, 3) == 0) {
      std::size_t const i = pick(0, seqs.size() - 1);
      m.release_slot(seqs[i].slot);
      seqs.erase(seqs.begin() + static_cast<std::ptrdiff_t>(i));
    }
    while (m.free_slots() > 0 && (seqs.size() < 2 || pick(0, 2) == 0)) {
      std::size_t const slot = m.acquire_slot();
      REQUIRE(m.cache(slot).size() == 0);
      reused += used[slot] ? 1 : 0;
      used[slot] = true;
      seqs.push_back({slot, {}});
    }
    // A random subset (every fourth step one sequence: the single-segment path), each with its
    // own draft, some with chosen logits rows.
    std::vector<std::size_t> chosen;
    if (step % 4 == 3) {
      chosen.push_back(pick(0, seqs.size() - 1));
    } else {
      for (std::size_t i = 0; i < seqs.size(); ++i)
        if (pick(0, 3) != 0) chosen.push_back(i);
      if (chosen.size() < 2) chosen = {0, 1};
    }
    (chosen.size() == 1 ? single : several) += 1;
    bool const want_hidden = pick(0, 2) == 0;
    std::vector<draft> drafts;
    std::vector<std::vector<std::int32_t>> rows(chosen.size());
    std::vector<sd::batch_segment> segments;
    for (std::size_t c = 0; c < chosen.size(); ++c) {
      live const& l = seqs[chosen[c]];
      bool const prefill = l.seq.empty() || pick(0, 5) == 0;
      std::size_t const nodes = prefill ? pick(1, 12) : pick(1, 6);
      drafts.push_back(random_draft(rng, l.seq.size(), nodes, vocab, !prefill && pick(0, 1) == 1));
      if (pick(0, 3) == 0)
        for (std::size_t i = 0; i < nodes; ++i)
          if (pick(0, 1) == 0) rows[c].push_back(static_cast<std::int32_t>(i));
    }
    for (std::size_t c = 0; c < chosen.size(); ++c) {
      segments.push_back(segment_of(seqs[chosen[c]].slot, drafts[c]));
      segments.back().request.logits_rows = rows[c];
      segments.back().request.want_hidden = want_hidden;
    }
    m.forward({.segments = segments}, out);
    REQUIRE(out.segments() == chosen.size());
    for (std::size_t c = 0; c < chosen.size(); ++c) {
      CAPTURE(c);
      live& l = seqs[chosen[c]];
      draft const& d = drafts[c];
      REQUIRE(out.logits(c).rows() == segments[c].logits_count());
      REQUIRE(m.cache(l.slot).size() == l.seq.size() + d.tokens.size());
      // Against the CPU backend: the same request after the sequence's committed tokens.
      sd::forward_request req = segments[c].request;
      sd::forward_result const cpu = cuda_test::cpu_forward(w, l.seq, req);
      for (std::size_t r = 0; r < out.logits(c).rows(); ++r)
        CHECK(max_rel_diff(out.logits(c).row(r), cpu.logits_view().row(r)) <= logits_tol);
      if (want_hidden) {
        REQUIRE(out.hidden(c).rows() == d.tokens.size());
        for (std::size_t r = 0; r < d.tokens.size(); ++r)
          CHECK(max_rel_diff(out.hidden(c).row(r),
                             std::span<float const>(cpu.hidden).subspan(r * dim, dim)) <=
                logits_tol);
      }
      // Commit: keep a random root-to-node path (a chain's prefix), or cut the sequence back.
      std::size_t const past = l.seq.size();
      if (past > 0 && pick(0, 5) == 0) {
        std::size_t const keep = pick(0, past - 1);
        m.cache(l.slot).truncate(keep);
        l.seq.resize(keep);
        continue;
      }
      std::size_t const leaf = pick(0, d.tokens.size());
      std::vector<std::int32_t> const keep =
          leaf < d.tokens.size() ? d.path(leaf) : std::vector<std::int32_t>{};
      m.cache(l.slot).keep_path(past, keep);
      for (std::int32_t k : keep) l.seq.push_back(d.tokens[static_cast<std::size_t>(k)]);
      if (l.seq.size() + 13 > m.max_context()) {  // leave room for the next draft
        m.cache(l.slot).truncate(10);
        l.seq.resize(10);
      }
    }
  }
  CHECK(reused > 0);
  CHECK(single > 0);
  CHECK(several > 0);
  // Forwards against the slots' caches are never captured (a graph holds its cache's addresses).
  CHECK(m.model().graphs_captured() == 0);
}

TEST_CASE(
    "cuda_batched_llama: greedy speculation of staggered sequences gives the MANIFEST's ids") {
  // Four requests over three slots, joining at different steps (the fourth when the first leaves),
  // each decoding greedily with a draft of the reference continuation corrupted at random: a chain
  // (truncated after the first rejection) or a tree with a wrong sibling beside the right token
  // (kept with keep_path). Every request's ids must be the reference ids, whatever the batch.
  cuda_test::require_device();
  auto const dir = test_support::model_dir();
  std::vector<token_id> ref;
  {
    std::ifstream in(dir / "reference_greedy_once_upon_a_time.ids");
    for (token_id t; in >> t;) ref.push_back(t);
  }
  REQUIRE(ref.size() == 256);
  constexpr std::size_t length = 128;  // ids compared per request (the prompt's 4 included)
  auto const w = cuda_test::load_weights(dir / "stories260K.bin");
  auto const vocab = static_cast<token_id>(w->config.vocab_size);
  sd::cuda_batched_llama m(w, {.max_slots = 3});
  std::mt19937_64 rng(11);
  struct request {
    std::size_t joins = 0;  // the step it joins at
    std::size_t slot = 0;
    bool live = false, done = false, tree = false;
    std::vector<token_id> seq;  // BOS + ids so far; the cache holds all but the last
    draft d;
    std::vector<std::int32_t> logits_row;
  };
  std::size_t const joins[] = {0, 2, 5, 6};
  std::vector<request> reqs(std::size(joins));
  for (std::size_t r = 0; r < reqs.size(); ++r) reqs[r].joins = joins[r];
  std::vector<token_id> const prompt{1, 403, 407, 261, 378};  // BOS + encode("Once upon a time")
  sd::batch_forward_result out;
  std::size_t trees = 0, rejections = 0;
  for (std::size_t step = 0; step < 400; ++step) {
    CAPTURE(step);
    std::vector<std::size_t> active;
    std::vector<sd::batch_segment> segments;
    for (std::size_t r = 0; r < reqs.size(); ++r) {
      request& q = reqs[r];
      if (q.done || step < q.joins) continue;
      if (!q.live) {
        if (m.free_slots() == 0) continue;
        q.slot = m.acquire_slot();
        q.live = true;
        q.d = make_draft(0, prompt, {-1, 0, 1, 2, 3});
        q.logits_row = {4};
      } else {
        // The pending token (root) and up to 4 reference tokens after it, each wrong with
        // probability 1/4; half the steps add a wrong sibling of the first draft token.
        std::size_t const past = q.seq.size() - 1;
        std::size_t const next = q.seq.size() - 1;  // index in ref of the token after pending
        std::vector<token_id> tokens{q.seq.back()};
        std::vector<sd::node_index> parents{-1};
        std::size_t const k = std::min<std::size_t>(rng() % 5, length - next);
        q.tree = k > 0 && rng() % 2 == 0;
        bool const sibling_first = rng() % 2 == 0;
        token_id const wrong = (ref[next] + 7) % vocab;
        if (q.tree && sibling_first) {
          tokens.push_back(wrong);
          parents.push_back(0);
        }
        sd::node_index previous = 0;
        for (std::size_t i = 0; i < k; ++i) {
          token_id const t = rng() % 4 == 0 ? (ref[next + i] + 1) % vocab : ref[next + i];
          tokens.push_back(t);
          parents.push_back(previous);
          previous = static_cast<sd::node_index>(tokens.size() - 1);
        }
        if (q.tree && !sibling_first) {
          tokens.push_back(wrong);
          parents.push_back(0);
        }
        trees += q.tree ? 1 : 0;
        q.d = make_draft(past, std::move(tokens), std::move(parents));
        q.logits_row.clear();
      }
      active.push_back(r);
      segments.push_back(segment_of(q.slot, q.d));
      segments.back().request.logits_rows = q.logits_row;
    }
    if (active.empty()) break;
    m.forward({.segments = segments}, out);
    for (std::size_t a = 0; a < active.size(); ++a) {
      request& q = reqs[active[a]];
      if (q.seq.empty()) {  // the prefill: the cache holds the prompt, its next id is pending
        q.seq = prompt;
        q.seq.push_back(argmax(out.logits(a).row(0)));
      } else {
        // Greedy walk: from the root, follow the child holding the argmax of the current node.
        std::size_t const past = q.seq.size() - 1;
        std::vector<std::int32_t> path{0};
        for (bool moved = true; moved;) {
          moved = false;
          token_id const want = argmax(out.logits(a).row(static_cast<std::size_t>(path.back())));
          for (std::size_t i = 1; i < q.d.tokens.size(); ++i)
            if (q.d.parents[i] == path.back() && q.d.tokens[i] == want) {
              path.push_back(static_cast<std::int32_t>(i));
              q.seq.push_back(want);
              moved = true;
              break;
            }
        }
        rejections += path.size() < q.d.tokens.size() ? 1 : 0;
        if (q.tree)
          m.cache(q.slot).keep_path(past, path);
        else
          m.cache(q.slot).truncate(past + path.size());
        q.seq.push_back(argmax(out.logits(a).row(static_cast<std::size_t>(path.back()))));
      }
      REQUIRE(m.cache(q.slot).size() == q.seq.size() - 1);
      if (q.seq.size() >= length + 1) {
        CAPTURE(active[a]);
        CHECK(std::equal(q.seq.begin() + 1, q.seq.begin() + 1 + length, ref.begin()));
        m.release_slot(q.slot);
        q.live = false;
        q.done = true;
      }
    }
  }
  for (request const& q : reqs) CHECK(q.done);
  CHECK(trees > 0);
  CHECK(rejections > 0);
}

TEST_CASE("cuda_batched_llama: slots, and a bad batch throws and leaves every cache unchanged") {
  cuda_test::require_device();
  auto const w = cuda_test::random_weights(test_support::shapes::cuda_gqa(), 10, 0.1f);
  sd::cuda_batched_llama m(w, {.model = {.max_context = 16}, .max_slots = 2});
  CHECK(m.max_slots() == 2);
  std::size_t const a = m.acquire_slot(), b = m.acquire_slot();
  CHECK(m.free_slots() == 0);
  test_support::expect_error([&] { (void)m.acquire_slot(); }, sd::errc::context_overflow);
  std::vector<token_id> const ten{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<position_t> pos(10), pos2(10);
  std::iota(pos.begin(), pos.end(), 0);
  std::iota(pos2.begin(), pos2.end(), 10);
  sd::batch_forward_result out;
  sd::batch_segment const warm[] = {{.slot = a, .request = {.tokens = ten, .positions = pos}},
                                    {.slot = b, .request = {.tokens = ten, .positions = pos}}};
  m.forward({.segments = warm}, out);
  auto const unchanged = [&] {
    CHECK(m.cache(a).size() == 10);
    CHECK(m.cache(b).size() == 10);
  };
  unchanged();
  std::vector<token_id> const one{3};
  std::vector<position_t> const at10{10};
  std::vector<token_id> bad_token = ten;
  bad_token[4] = static_cast<token_id>(w->config.vocab_size);
  {  // b's segment does not fit its cache (16 positions)
    sd::batch_segment const s[] = {{.slot = a, .request = {.tokens = one, .positions = at10}},
                                   {.slot = b, .request = {.tokens = ten, .positions = pos2}}};
    test_support::check_error([&] { m.forward({.segments = s}, out); }, sd::errc::context_overflow,
                              "segment 1: ");
    unchanged();
  }
  {  // a token outside the vocabulary
    sd::batch_segment const s[] = {{.slot = a, .request = {.tokens = one, .positions = at10}},
                                   {.slot = b, .request = {.tokens = bad_token, .positions = pos}}};
    test_support::check_error([&] { m.forward({.segments = s}, out); }, sd::errc::out_of_range,
                              "segment 1: forward_request: token");
    unchanged();
  }
  {  // the same slot twice; a slot out of range; no segment
    sd::batch_segment const s[] = {{.slot = a, .request = {.tokens = one, .positions = at10}},
                                   {.slot = a, .request = {.tokens = one, .positions = at10}}};
    test_support::check_error([&] { m.forward({.segments = s}, out); }, sd::errc::invalid_argument,
                              "both use slot");
    sd::batch_segment const far[] = {{.slot = 9, .request = {.tokens = one, .positions = at10}}};
    test_support::expect_error([&] { m.forward({.segments = far}, out); }, sd::errc::out_of_range);
    test_support::expect_error([&] { m.forward({}, out); }, sd::errc::invalid_argument);
    unchanged();
  }
  {  // a slot not in use
    m.release_slot(b);
    sd::batch_segment const s[] = {{.slot = a, .request = {.tokens = one, .positions = at10}},
                                   {.slot = b, .request = {.tokens = one, .positions = at10}}};
    test_support::check_error([&] { m.forward({.segments = s}, out); }, sd::errc::invalid_argument,
                              "which is not in use");
    test_support::expect_error([&] { m.release_slot(b); }, sd::errc::invalid_argument);
    test_support::expect_error([&] { (void)m.cache(b); }, sd::errc::invalid_argument);
    CHECK(m.cache(a).size() == 10);
    CHECK(m.acquire_slot() == b);  // the released slot comes back, empty
    CHECK(m.cache(b).size() == 0);
  }
  {  // the engine's own checks: a null cache, one given twice, one of another shape, segments
     // that disagree on the batch-wide fields
    sd::cuda_llama& model = m.model();
    auto mine = model.make_cache();
    auto other = model.make_cache();
    sd::cuda_kv_cache foreign(w->config.n_layers, w->config.kv_dim(), 32, model.stream());
    sd::forward_result res;
    sd::forward_request const req{.tokens = one, .positions = std::span(pos).first(1)};
    sd::cuda_llama_segment const null_cache[] = {{mine.get(), req}, {nullptr, req}};
    test_support::check_error([&] { model.forward(null_cache, res); }, sd::errc::invalid_argument,
                              "segment 1 has no cache");
    sd::cuda_llama_segment const twice[] = {{mine.get(), req}, {mine.get(), req}};
    test_support::check_error([&] { model.forward(twice, res); }, sd::errc::invalid_argument,
                              "score the same cache");
    sd::cuda_llama_segment const shape[] = {{&foreign, req}};
    test_support::check_error([&] { model.forward(shape, res); }, sd::errc::invalid_argument,
                              "was not made for this model");
    sd::forward_request hidden = req;
    hidden.want_hidden = true;
    sd::cuda_llama_segment const mixed[] = {{mine.get(), req}, {other.get(), hidden}};
    test_support::check_error([&] { model.forward(mixed, res); }, sd::errc::invalid_argument,
                              "they apply to the whole batch");
    std::int32_t const skip[] = {1};
    sd::forward_request skipping = req;
    skipping.skip_layers = skip;
    sd::cuda_llama_segment const skipped[] = {{mine.get(), skipping}, {other.get(), req}};
    test_support::check_error([&] { model.forward(skipped, res); }, sd::errc::invalid_argument,
                              "they apply to the whole batch");
    test_support::expect_error(
        [&] { model.forward(std::span<sd::cuda_llama_segment const>{}, res); },
        sd::errc::invalid_argument);
    CHECK(mine->size() == 0);
    CHECK(other->size() == 0);
    CHECK(foreign.size() == 0);
    CHECK(model.cache().size() == 0);
    // Then a good forward of both: each cache takes its own segment's entries.
    sd::cuda_llama_segment const good[] = {{mine.get(), req}, {other.get(), req}};
    model.forward(good, res);
    CHECK(res.logits_count == 2);
    CHECK(mine->size() == 1);
    CHECK(other->size() == 1);
  }
}
