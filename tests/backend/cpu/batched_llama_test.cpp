#include "specdec/backend/cpu/batched_llama.hpp"

#include "support/doctest.hpp"

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/test_models.hpp"
#include "specdec/core/concepts.hpp"
#include "support/errors.hpp"
#include "support/llama_shapes.hpp"

namespace sd = specdec;
namespace st = specdec::test;

static_assert(sd::batched_lm<sd::cpu_batched_llama>);
static_assert(!sd::batched_lm<sd::cpu_llama>);
static_assert(!sd::causal_lm<sd::cpu_batched_llama>);

namespace {

// The forward is batch-invariant (see llama_test.cpp): a sequence's rows in a batch are the same
// bits as a single-sequence forward of its tokens, so these comparisons are exact.

std::size_t const batched_pack_limits[] = {sd::cpu_llama_options{}.pack_limit, 0};

// One segment's draft: tokens, positions and mask of a chain or a tree under the sequence's
// committed tokens, with each node's parent.
struct draft {
  std::vector<sd::token_id> tokens;
  std::vector<sd::node_index> parents;
  std::vector<sd::position_t> positions;
  std::vector<std::uint64_t> mask;

  // The path from the draft's first node to node i (token ids).
  [[nodiscard]] std::vector<sd::token_id> path(std::size_t i) const {
    std::vector<sd::token_id> p;
    for (auto a = static_cast<sd::node_index>(i); a >= 0; a = parents[static_cast<std::size_t>(a)])
      p.insert(p.begin(), tokens[static_cast<std::size_t>(a)]);
    return p;
  }
};

// A random draft of `nodes` nodes at positions past + depth: a chain, a tree, or (prefill) a
// causal run.
draft random_draft(std::mt19937_64& rng, std::size_t past, std::size_t nodes, std::size_t vocab,
                   bool tree) {
  draft d;
  d.tokens.resize(nodes);
  for (auto& t : d.tokens) t = static_cast<sd::token_id>(rng() % vocab);
  d.parents.assign(nodes, -1);
  for (std::size_t i = 1; i < nodes; ++i)
    d.parents[i] = static_cast<sd::node_index>(tree ? rng() % i : i - 1);
  std::vector<std::size_t> depth(nodes, 0);
  for (std::size_t i = 1; i < nodes; ++i)
    depth[i] = depth[static_cast<std::size_t>(d.parents[i])] + 1;
  d.positions.resize(nodes);
  for (std::size_t i = 0; i < nodes; ++i)
    d.positions[i] = static_cast<sd::position_t>(past + depth[i]);
  d.mask = st::make_mask(nodes, [&](std::size_t i, std::size_t j) {
    for (auto a = static_cast<sd::node_index>(i); a >= 0;
         a = d.parents[static_cast<std::size_t>(a)])
      if (static_cast<std::size_t>(a) == j) return true;
    return false;
  });
  return d;
}

sd::batch_segment segment_of(std::size_t slot, draft const& d) {
  return {.slot = slot,
          .request = {.tokens = d.tokens,
                      .positions = d.positions,
                      .mask = d.mask,
                      .mask_stride = sd::mask_words(d.tokens.size())}};
}

// The logits of the last token of `tokens`, by a fresh single-sequence prefill.
std::vector<float> fresh_last_row(sd::cpu_llama& fresh, std::vector<sd::token_id> const& tokens) {
  fresh.reset();
  std::vector<sd::position_t> positions(tokens.size());
  std::iota(positions.begin(), positions.end(), 0);
  std::int32_t const last = static_cast<std::int32_t>(tokens.size() - 1);
  sd::forward_result out;
  fresh.forward({.tokens = tokens,
                 .positions = positions,
                 .logits_rows = std::span<std::int32_t const>(&last, 1)},
                out);
  return out.logits;
}

}  // namespace

TEST_CASE("cpu_batched_llama: random ragged steps equal fresh single-sequence recomputation") {
  // Slots come and go, each step scores a random subset of the live sequences (chains, trees,
  // prefills) in one forward, then each keeps a random accepted path (truncate / keep_path) or is
  // cut back. Every row of every segment must equal a fresh prefill of its sequence plus its path.
  for (auto const& shape : {test_support::shapes::odd_gqa(), test_support::shapes::head_size_6()}) {
    auto const w = st::random_llama(shape, 71);
    std::size_t const vocab = static_cast<std::size_t>(shape.vocab_size);
    for (std::size_t const limit : batched_pack_limits) {
      CAPTURE(shape.dim);
      CAPTURE(limit);
      sd::cpu_batched_llama m(w, {.model = {.threads = 2, .pack_limit = limit}, .max_slots = 4});
      sd::cpu_llama fresh(w, {.threads = 1, .pack_limit = limit});
      std::mt19937_64 rng(5);
      auto const pick = [&](std::size_t lo, std::size_t hi) {
        return lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
      };
      struct live {
        std::size_t slot;
        std::vector<sd::token_id> seq;  // what the slot's cache holds
      };
      std::vector<live> seqs;
      std::size_t reused = 0;
      sd::batch_forward_result out;
      for (int step = 0; step < 40; ++step) {
        CAPTURE(step);
        // Requests leave and join (a released slot is reused).
        if (!seqs.empty() && pick(0, 4) == 0) {
          std::size_t const i = pick(0, seqs.size() - 1);
          m.release_slot(seqs[i].slot);
          seqs.erase(seqs.begin() + static_cast<std::ptrdiff_t>(i));
        }
        while (m.free_slots() > 0 && (seqs.size() < 2 || pick(0, 2) == 0)) {
          std::size_t const slot = m.acquire_slot();
          REQUIRE(m.cache(slot).size() == 0);
          for (live const& l : seqs) REQUIRE(l.slot != slot);
          reused += m.reserved(slot) > 0 ? 1 : 0;
          seqs.push_back({slot, {}});
        }
        // A random subset, each with its own draft.
        std::vector<std::size_t> chosen;
        for (std::size_t i = 0; i < seqs.size(); ++i)
          if (pick(0, 3) != 0) chosen.push_back(i);
        if (chosen.empty()) chosen.push_back(pick(0, seqs.size() - 1));
        std::vector<draft> drafts;
        for (std::size_t i : chosen) {
          live const& l = seqs[i];
          bool const prefill = l.seq.empty() || pick(0, 5) == 0;
          std::size_t const nodes = prefill ? pick(1, 12) : pick(1, 6);
          drafts.push_back(random_draft(rng, l.seq.size(), nodes, vocab, !prefill && pick(0, 1)));
        }
        std::vector<sd::batch_segment> segments;
        for (std::size_t c = 0; c < chosen.size(); ++c)
          segments.push_back(segment_of(seqs[chosen[c]].slot, drafts[c]));
        m.forward({.segments = segments}, out);
        REQUIRE(out.segments() == chosen.size());
        for (std::size_t c = 0; c < chosen.size(); ++c) {
          CAPTURE(c);
          live& l = seqs[chosen[c]];
          draft const& d = drafts[c];
          auto const rows = out.logits(c);
          REQUIRE(rows.rows() == d.tokens.size());
          REQUIRE(m.cache(l.slot).size() == l.seq.size() + d.tokens.size());
          for (std::size_t i = 0; i < d.tokens.size(); ++i) {
            std::vector<sd::token_id> full = l.seq;
            auto const p = d.path(i);
            full.insert(full.end(), p.begin(), p.end());
            auto const want = fresh_last_row(fresh, full);
            CHECK(st::row_error(rows.at_row(i).data(), want.data(), vocab) == 0.0);
          }
          // Commit: keep a random path (a chain's prefix), or cut the sequence back.
          std::size_t const past = l.seq.size();
          if (past > 0 && pick(0, 6) == 0) {
            std::size_t const keep = pick(0, past - 1);
            m.cache(l.slot).truncate(keep);
            l.seq.resize(keep);
            continue;
          }
          std::size_t const leaf = pick(0, d.tokens.size());
          std::vector<std::int32_t> keep;
          if (leaf < d.tokens.size())
            for (auto a = static_cast<sd::node_index>(leaf); a >= 0;
                 a = d.parents[static_cast<std::size_t>(a)])
              keep.insert(keep.begin(), static_cast<std::int32_t>(a));
          m.cache(l.slot).keep_path(past, keep);
          for (std::int32_t k : keep) l.seq.push_back(d.tokens[static_cast<std::size_t>(k)]);
          if (l.seq.size() + 13 > m.max_context()) {  // leave room for the next draft
            m.cache(l.slot).truncate(10);
            l.seq.resize(10);
          }
        }
      }
      CHECK(reused > 0);  // some slot was released and reused with its memory
    }
  }
}

TEST_CASE("cpu_batched_llama: a sequence's rows do not depend on the rest of the batch") {
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 72);
  std::mt19937_64 rng(9);
  sd::cpu_batched_llama alone(w, {.model = {.threads = 2}, .max_slots = 1});
  sd::cpu_batched_llama together(w, {.model = {.threads = 2}, .max_slots = 3});
  std::size_t const a = alone.acquire_slot();
  std::size_t const t0 = together.acquire_slot(), t1 = together.acquire_slot(),
                    t2 = together.acquire_slot();
  // The same prompt for the sequence of interest in both, others of their own in `together`.
  draft const prompt = random_draft(rng, 0, 9, 75, false);
  draft const other1 = random_draft(rng, 0, 30, 75, false);
  draft const other2 = random_draft(rng, 0, 4, 75, false);
  sd::batch_forward_result x, y;
  auto const with_hidden = [](sd::batch_segment s) {
    s.request.want_hidden = true;
    return s;
  };
  sd::batch_segment const sa[] = {with_hidden(segment_of(a, prompt))};
  alone.forward({.segments = sa}, x);
  // Its segment in the middle of the batch, between sequences of other lengths.
  sd::batch_segment const sb[] = {with_hidden(segment_of(t1, other1)),
                                  with_hidden(segment_of(t0, prompt)),
                                  with_hidden(segment_of(t2, other2))};
  together.forward({.segments = sb}, y);
  REQUIRE(x.logits(0).rows() == 9);
  REQUIRE(y.logits(1).rows() == 9);
  for (std::size_t i = 0; i < 9; ++i) {
    CHECK(st::row_error(x.logits(0).at_row(i).data(), y.logits(1).at_row(i).data(), 75) == 0.0);
    CHECK(st::row_error(x.hidden(0).at_row(i).data(), y.hidden(1).at_row(i).data(), 48) == 0.0);
  }
  // Then a tree step of the same sequence beside a long prefill.
  draft const tree = random_draft(rng, 9, 6, 75, true);
  draft const long_prefill = random_draft(rng, 30, 20, 75, false);
  std::int32_t const rows[] = {0, 3, 5};
  sd::batch_segment tree_a = segment_of(a, tree);
  tree_a.request.logits_rows = rows;
  sd::batch_segment tree_t = segment_of(t0, tree);
  tree_t.request.logits_rows = rows;
  sd::batch_segment const sc[] = {tree_a};
  sd::batch_segment const sd2[] = {tree_t, segment_of(t1, long_prefill)};
  alone.forward({.segments = sc}, x);
  together.forward({.segments = sd2}, y);
  REQUIRE(x.logits(0).rows() == 3);
  REQUIRE(y.logits(0).rows() == 3);
  REQUIRE(y.logits(1).rows() == 20);
  for (std::size_t i = 0; i < 3; ++i)
    CHECK(st::row_error(x.logits(0).at_row(i).data(), y.logits(0).at_row(i).data(), 75) == 0.0);
}

TEST_CASE("cpu_batched_llama: slots are acquired, released and reused") {
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 73);
  sd::cpu_batched_llama m(w, {.model = {.threads = 1}, .max_slots = 2});
  CHECK(m.max_slots() == 2);
  CHECK(m.free_slots() == 2);
  std::size_t const s0 = m.acquire_slot();
  std::size_t const s1 = m.acquire_slot();
  CHECK(s0 != s1);
  CHECK(m.free_slots() == 0);
  test_support::check_error([&] { (void)m.acquire_slot(); }, sd::errc::context_overflow,
                            "all 2 sequence slots are in use");
  draft const d{.tokens = {1, 2, 3}, .parents = {-1, 0, 1}, .positions = {0, 1, 2}, .mask = {}};
  sd::batch_segment const seg[] = {
      {.slot = s1, .request = {.tokens = d.tokens, .positions = d.positions}}};
  sd::batch_forward_result out;
  m.forward({.segments = seg}, out);
  CHECK(m.cache(s1).size() == 3);
  std::size_t const held = m.reserved(s1);
  CHECK(held >= 3);
  m.release_slot(s1);
  CHECK(m.free_slots() == 1);
  test_support::expect_error([&] { m.release_slot(s1); }, sd::errc::invalid_argument);
  test_support::expect_error([&] { (void)m.cache(s1); }, sd::errc::invalid_argument);
  test_support::expect_error([&] { m.forward({.segments = seg}, out); },
                             sd::errc::invalid_argument);
  std::size_t const again = m.acquire_slot();
  CHECK(again == s1);  // the released slot comes back first, empty, its memory kept
  CHECK(m.cache(again).size() == 0);
  CHECK(m.reserved(again) == held);
  test_support::expect_error([&] { m.release_slot(7); }, sd::errc::invalid_argument);
  test_support::expect_error([] { sd::slot_allocator bad(0); }, sd::errc::invalid_argument);
}

TEST_CASE("cpu_batched_llama: a bad batch throws and leaves every cache unchanged") {
  auto const w = st::random_llama(test_support::shapes::odd_gqa(), 74);
  sd::cpu_batched_llama m(w, {.model = {.threads = 1, .max_context = 16}, .max_slots = 3});
  std::size_t const a = m.acquire_slot(), b = m.acquire_slot();
  std::vector<sd::token_id> const ten{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<sd::position_t> pos(10);
  std::iota(pos.begin(), pos.end(), 0);
  sd::batch_forward_result out;
  sd::batch_segment const warm[] = {{.slot = a, .request = {.tokens = ten, .positions = pos}},
                                    {.slot = b, .request = {.tokens = ten, .positions = pos}}};
  m.forward({.segments = warm}, out);
  std::vector<sd::position_t> pos2(10);
  std::iota(pos2.begin(), pos2.end(), 10);
  std::vector<sd::token_id> bad_token = ten;
  bad_token[4] = 75;
  auto const unchanged = [&] {
    CHECK(m.cache(a).size() == 10);
    CHECK(m.cache(b).size() == 10);
  };
  std::vector<sd::token_id> const one{3};
  std::vector<sd::position_t> const at10{10};
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
                              "segment 1: forward_request: token 75");
    unchanged();
  }
  {  // the same slot twice
    sd::batch_segment const s[] = {{.slot = a, .request = {.tokens = one, .positions = at10}},
                                   {.slot = a, .request = {.tokens = one, .positions = at10}}};
    test_support::check_error([&] { m.forward({.segments = s}, out); }, sd::errc::invalid_argument,
                              "both use slot");
    unchanged();
  }
  {  // a slot out of range, no segment
    sd::batch_segment const s[] = {{.slot = 9, .request = {.tokens = one, .positions = at10}}};
    test_support::expect_error([&] { m.forward({.segments = s}, out); }, sd::errc::out_of_range);
    test_support::expect_error([&] { m.forward({}, out); }, sd::errc::invalid_argument);
    unchanged();
  }
  {  // the engine checks too: a sequence of another shape, one given twice
    sd::cpu_llama other(st::random_llama(test_support::shapes::head_size_6(), 1), {.threads = 1});
    sd::cpu_llama_sequence foreign = other.make_sequence();
    sd::cpu_llama_sequence mine = m.model().make_sequence();
    sd::cpu_llama_segment const s1[] = {{&foreign, {.tokens = one, .positions = at10}}};
    test_support::check_error([&] { m.model().forward(s1, out.rows); }, sd::errc::invalid_argument,
                              "was not made for this model");
    sd::cpu_llama_segment const s2[] = {{&mine, {.tokens = one, .positions = at10}},
                                        {&mine, {.tokens = one, .positions = at10}}};
    test_support::check_error([&] { m.model().forward(s2, out.rows); }, sd::errc::invalid_argument,
                              "score the same sequence");
    CHECK(mine.cache().size() == 0);
  }
}
