// The CPU EAGLE head runner (backend/cpu/eagle.hpp) against the slow reference
// (reference/eagle.hpp) on random EAGLE-1 and EAGLE-3 heads of several shapes, over causal rows
// and tree rows with a visibility mask; the same bits whether rows come in one call or in many
// with rollbacks between them, and for any thread count; errors for bad batches.
#include "specdec/backend/cpu/eagle.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "specdec/model/safetensors.hpp"
#include "specdec/propose/eagle.hpp"
#include "specdec/reference/eagle.hpp"
#include "support/eagle.hpp"
#include "support/errors.hpp"
#include "support/heads.hpp"
#include "support/llama_shapes.hpp"

namespace sd = specdec;
using test_support::check_error;

static_assert(sd::eagle_head_runner<sd::cpu_eagle_head>);

namespace {

struct head_case {
  char const* name;
  std::shared_ptr<sd::eagle_weights const> head;
};

// EAGLE-1 and EAGLE-3 heads on three targets: head sizes 8 (vector values), 6 (scalar values)
// and 16 (chunked values), grouped-query attention, a reduced draft vocabulary.
std::vector<head_case> head_cases() {
  namespace sh = test_support::shapes;
  auto const gqa = test_support::random_target(sh::odd_gqa(), 3);
  auto const hs6 = test_support::random_target(sh::head_size_6(), 4);
  auto const hs16 = test_support::random_target(sh::cuda_gqa(), 5);
  using v = sd::eagle_version;
  return {
      {"EAGLE-1, head size 8", test_support::random_eagle(v::eagle1, gqa, 6, 2, 0, {}, 11)},
      {"EAGLE-3, head size 8, draft vocab 40 of 75",
       test_support::random_eagle(v::eagle3, gqa, 6, 2, 40, {1, 2, 3}, 12)},
      {"EAGLE-1, head size 6", test_support::random_eagle(v::eagle1, hs6, 6, 3, 0, {}, 13)},
      {"EAGLE-3, head size 6, repeated layer",
       test_support::random_eagle(v::eagle3, hs6, 6, 2, 41, {1, 2, 2}, 14)},
      {"EAGLE-3, head size 16, rope theta 5e5",
       test_support::random_eagle(v::eagle3, hs16, 6, 2, 100, {3, 1, 2}, 15)},
  };
}

// One batch of rows and the reference entries they are.
struct rows {
  std::vector<float> inputs;
  bool from_target = true;
  std::vector<sd::token_id> tokens;
  std::vector<sd::position_t> positions;
  std::size_t shared = 0;
  std::vector<std::uint64_t> mask;
  std::size_t stride = 0;
};

sd::eagle_batch batch_of(rows const& r, std::size_t width) {
  return {.inputs = sd::matrix_view<float const>(r.inputs.data(), r.tokens.size(), width),
          .from_target = r.from_target,
          .tokens = r.tokens,
          .positions = r.positions,
          .shared = r.shared,
          .mask = r.mask,
          .mask_stride = r.stride};
}

double max_error(std::span<float const> got, std::vector<double> const& want) {
  double worst = 0.0;
  for (std::size_t j = 0; j < got.size(); ++j)
    worst = std::max(worst,
                     std::abs(static_cast<double>(got[j]) - want[j]) / (1.0 + std::abs(want[j])));
  return worst;
}

}  // namespace

TEST_CASE("cpu eagle head: causal and tree rows match the reference") {
  for (head_case const& hc : head_cases()) {
    CAPTURE(hc.name);
    sd::eagle_weights const& w = *hc.head;
    sd::cpu_eagle_head runner(hc.head);
    std::size_t const d = runner.hidden_size(), f = runner.feature_width();
    std::size_t const v = runner.draft_vocab_size();
    CHECK(f == (w.config.version == sd::eagle_version::eagle1 ? d : 3 * d));
    std::vector<sd::reference_eagle_entry> entries;
    std::vector<std::vector<float>> got;  // the runner's outputs, by entry

    // Five committed pairs, causal.
    rows c;
    c.inputs = test_support::random_floats(5 * f, 21, 1.5f);
    c.tokens = {3, 17, 0, 29, 8};
    c.positions = {0, 1, 2, 3, 4};
    std::vector<float> out(5 * d);
    runner.forward(batch_of(c, f), sd::matrix_view<float>(out.data(), 5, d));
    for (std::size_t i = 0; i < 5; ++i) {
      sd::reference_eagle_entry e;
      e.feature.assign(c.inputs.begin() + static_cast<std::ptrdiff_t>(i * f),
                       c.inputs.begin() + static_cast<std::ptrdiff_t>((i + 1) * f));
      e.token = c.tokens[i];
      e.position = c.positions[i];
      for (std::size_t j = 0; j < i; ++j) e.visible.push_back(j);
      entries.push_back(e);
      got.emplace_back(out.begin() + static_cast<std::ptrdiff_t>(i * d),
                       out.begin() + static_cast<std::ptrdiff_t>((i + 1) * d));
    }
    // Depth 1: three children of the root, each seeing the pairs and itself (inputs: the last
    // pair's output).
    rows t1;
    t1.from_target = false;
    for (int i = 0; i < 3; ++i) t1.inputs.insert(t1.inputs.end(), got[4].begin(), got[4].end());
    t1.tokens = {5, 6, 7};
    t1.positions = {5, 5, 5};
    t1.shared = 5;
    t1.stride = 1;
    t1.mask = {1u << 0, 1u << 1, 1u << 2};
    std::vector<float> out1(3 * d);
    runner.forward(batch_of(t1, d), sd::matrix_view<float>(out1.data(), 3, d));
    for (std::size_t i = 0; i < 3; ++i) {
      sd::reference_eagle_entry e;
      e.input = 4;
      e.token = t1.tokens[i];
      e.position = 5;
      e.visible = {0, 1, 2, 3, 4};
      entries.push_back(e);
      got.emplace_back(out1.begin() + static_cast<std::ptrdiff_t>(i * d),
                       out1.begin() + static_cast<std::ptrdiff_t>((i + 1) * d));
    }
    // Depth 2: a child of the first and of the third depth-1 node.
    rows t2;
    t2.from_target = false;
    t2.inputs.insert(t2.inputs.end(), got[5].begin(), got[5].end());
    t2.inputs.insert(t2.inputs.end(), got[7].begin(), got[7].end());
    t2.tokens = {9, 10};
    t2.positions = {6, 6};
    t2.shared = 5;
    t2.stride = 1;
    t2.mask = {(1u << 0) | (1u << 3), (1u << 2) | (1u << 4)};
    std::vector<float> out2(2 * d);
    runner.forward(batch_of(t2, d), sd::matrix_view<float>(out2.data(), 2, d));
    for (std::size_t i = 0; i < 2; ++i) {
      sd::reference_eagle_entry e;
      e.input = i == 0 ? 5 : 7;
      e.token = t2.tokens[i];
      e.position = 6;
      e.visible = {0, 1, 2, 3, 4, i == 0 ? std::size_t{5} : std::size_t{7}};
      entries.push_back(e);
      got.emplace_back(out2.begin() + static_cast<std::ptrdiff_t>(i * d),
                       out2.begin() + static_cast<std::ptrdiff_t>((i + 1) * d));
    }
    CHECK(runner.cache().size() == 10);

    auto const want = sd::reference_eagle_outputs(w, entries);
    std::vector<float> logits(v);
    for (std::size_t e = 0; e < entries.size(); ++e) {
      CAPTURE(e);
      CHECK(max_error(got[e], want[e]) < 2e-4);
      runner.logits(sd::matrix_view<float const>(got[e].data(), 1, d),
                    sd::matrix_view<float>(logits.data(), 1, v));
      CHECK(max_error(logits, sd::reference_eagle_logits(w, want[e])) < 5e-4);
    }
  }
}

TEST_CASE("cpu eagle head: the same bits in one call or many, after rollbacks, any threads") {
  for (head_case const& hc : head_cases()) {
    CAPTURE(hc.name);
    std::size_t const d = hc.head->dim, f = hc.head->feature_width();
    std::size_t const n = 9;
    std::vector<float> const features = test_support::random_floats(n * f, 31, 1.5f);
    std::vector<sd::token_id> const tokens = {4, 1, 22, 9, 9, 30, 2, 14, 5};
    std::vector<sd::position_t> positions(n);
    for (std::size_t i = 0; i < n; ++i) positions[i] = static_cast<sd::position_t>(i);

    // All at once.
    sd::cpu_eagle_head one(hc.head);
    std::vector<float> whole(n * d);
    one.forward({.inputs = sd::matrix_view<float const>(features.data(), n, f),
                 .tokens = tokens,
                 .positions = positions},
                sd::matrix_view<float>(whole.data(), n, d));

    // In pieces of 3, 1 and 5 rows, with tree rows appended and dropped between them, on two
    // threads.
    sd::cpu_eagle_head many(hc.head, {.threads = 2});
    std::vector<float> pieces(n * d), junk(4 * d);
    std::size_t at = 0;
    for (std::size_t count : {3, 1, 5}) {
      many.forward({.inputs = sd::matrix_view<float const>(features.data() + at * f, count, f),
                    .tokens = std::span<sd::token_id const>(tokens).subspan(at, count),
                    .positions = std::span<sd::position_t const>(positions).subspan(at, count)},
                   sd::matrix_view<float>(pieces.data() + at * d, count, d));
      at += count;
      std::vector<float> const tree_in = test_support::random_floats(4 * d, at, 1.0f);
      std::vector<sd::token_id> const tree_tokens = {1, 2, 3, 4};
      std::vector<sd::position_t> const tree_pos(4, static_cast<sd::position_t>(at));
      std::vector<std::uint64_t> const mask = {1, 3, 4, 9};  // chains and siblings
      many.forward({.inputs = sd::matrix_view<float const>(tree_in.data(), 4, d),
                    .from_target = false,
                    .tokens = tree_tokens,
                    .positions = tree_pos,
                    .shared = at,
                    .mask = mask,
                    .mask_stride = 1},
                   sd::matrix_view<float>(junk.data(), 4, d));
      many.cache().truncate(at);
    }
    CHECK(pieces == whole);
  }
}

TEST_CASE("cpu eagle head: bad batches throw and leave the cache as it was") {
  namespace sh = test_support::shapes;
  auto const target = test_support::random_target(sh::odd_gqa(), 3);
  auto const head =
      test_support::random_eagle(sd::eagle_version::eagle3, target, 6, 2, 40, {1, 2, 3}, 12);
  sd::cpu_eagle_head runner(head, {.max_context = 8});
  std::size_t const d = runner.hidden_size(), f = runner.feature_width();
  std::vector<float> const in = test_support::random_floats(4 * f, 1, 1.0f);
  std::vector<float> out(4 * d);
  std::vector<sd::token_id> tokens = {1, 2};
  std::vector<sd::position_t> positions = {0, 1};
  auto const run = [&](sd::eagle_batch b) {
    runner.forward(b, sd::matrix_view<float>(out.data(), b.tokens.size(), d));
  };
  sd::eagle_batch good{.inputs = sd::matrix_view<float const>(in.data(), 2, f),
                       .tokens = tokens,
                       .positions = positions};
  sd::eagle_batch b = good;
  b.inputs = sd::matrix_view<float const>(in.data(), 2, d);
  check_error([&] { run(b); }, sd::errc::invalid_argument, "need width 144");
  std::vector<sd::token_id> const bad_token = {1, 75};
  b = good;
  b.tokens = bad_token;
  check_error([&] { run(b); }, sd::errc::out_of_range, "token 75 of row 1");
  std::vector<sd::position_t> const far = {0, 8};
  b = good;
  b.positions = far;
  check_error([&] { run(b); }, sd::errc::context_overflow, "position 8");
  std::vector<std::uint64_t> const blind = {1, 1};  // row 1 does not see itself
  b = good;
  b.mask = blind;
  b.mask_stride = 1;
  check_error([&] { run(b); }, sd::errc::invalid_argument, "mask row 1");
  CHECK(runner.cache().size() == 0);
  run(good);
  run(good);
  run(good);
  run(good);
  CHECK(runner.cache().size() == 8);
  check_error([&] { run(good); }, sd::errc::context_overflow, "do not fit the head's cache");
  std::vector<float> logits(40);
  check_error(
      [&] {
        runner.logits(sd::matrix_view<float const>(out.data(), 1, d),
                      sd::matrix_view<float>(logits.data(), 1, 39));
      },
      sd::errc::invalid_argument, "draft vocabulary of 40");
}

TEST_CASE("cpu eagle head: the training script's golden vectors (tools/eagle/*/golden)") {
  for (char const* kind : {"eagle1", "eagle3"}) {
    CAPTURE(kind);
    auto const head = std::string(kind) == "eagle1" ? test_support::fixture_eagle1()
                                                    : test_support::fixture_eagle3();
    sd::safetensors_file const golden(test_support::eagle_dir(kind) / "golden.safetensors");
    auto const ints = [&](char const* name) {
      sd::safetensors_tensor const& t = golden.require(name);
      std::vector<std::int64_t> v(static_cast<std::size_t>(t.elements));
      golden.read_integers(t, v);
      return v;
    };
    std::vector<float> const features = golden.read("features");
    std::vector<float> const want_out = golden.read("out_hidden");
    std::vector<float> const want_logits = golden.read("logits");
    std::vector<std::int64_t> const tok64 = ints("tokens"), pos64 = ints("positions");
    std::size_t const n = tok64.size();
    sd::cpu_eagle_head runner(head);
    std::size_t const d = runner.hidden_size(), f = runner.feature_width();
    std::size_t const v = runner.draft_vocab_size();
    REQUIRE(features.size() == n * f);
    std::vector<sd::token_id> tokens(tok64.begin(), tok64.end());
    std::vector<sd::position_t> positions(pos64.begin(), pos64.end());
    std::vector<float> out(n * d), logits(n * v);
    runner.forward({.inputs = sd::matrix_view<float const>(features.data(), n, f),
                    .tokens = tokens,
                    .positions = positions},
                   sd::matrix_view<float>(out.data(), n, d));
    runner.logits(sd::matrix_view<float const>(out.data(), n, d),
                  sd::matrix_view<float>(logits.data(), n, v));
    auto const close = [](std::span<float const> got, std::vector<float> const& want) {
      REQUIRE(got.size() == want.size());
      double worst = 0.0;
      for (std::size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]) /
                                    (1.0 + std::abs(static_cast<double>(want[i]))));
      return worst;
    };
    CHECK(close(out, want_out) < 1e-4);
    CHECK(close(logits, want_logits) < 1e-4);
    // The chain drafted after the rows: one tree row per call, each seeing the committed rows,
    // the chain rows before it and itself.
    std::vector<std::int64_t> const ct = ints("chain_tokens"), cp = ints("chain_positions");
    std::vector<float> const chain_out = golden.read("chain_out_hidden");
    std::vector<float> const chain_logits = golden.read("chain_logits");
    std::vector<float> in(out.end() - static_cast<std::ptrdiff_t>(d), out.end());
    std::vector<float> got_out, got_logits(v);
    for (std::size_t j = 0; j < ct.size(); ++j) {
      std::vector<sd::token_id> const t = {static_cast<sd::token_id>(ct[j])};
      std::vector<sd::position_t> const p = {static_cast<sd::position_t>(cp[j])};
      std::vector<std::uint64_t> const mask = {(std::uint64_t{1} << (j + 1)) - 1};
      std::vector<float> o(d);
      runner.forward({.inputs = sd::matrix_view<float const>(in.data(), 1, d),
                      .from_target = false,
                      .tokens = t,
                      .positions = p,
                      .shared = n,
                      .mask = mask,
                      .mask_stride = 1},
                     sd::matrix_view<float>(o.data(), 1, d));
      runner.logits(sd::matrix_view<float const>(o.data(), 1, d),
                    sd::matrix_view<float>(got_logits.data(), 1, v));
      CHECK(close(got_logits,
                  std::vector<float>(
                      chain_logits.begin() + static_cast<std::ptrdiff_t>(j * v),
                      chain_logits.begin() + static_cast<std::ptrdiff_t>((j + 1) * v))) < 1e-4);
      got_out.insert(got_out.end(), o.begin(), o.end());
      in = o;
    }
    CHECK(close(got_out, chain_out) < 1e-4);
  }
}
