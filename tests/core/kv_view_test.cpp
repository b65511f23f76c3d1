// kv_view (core/forward.hpp): the positions a view selects, against an obvious reference (a flag
// per position), on random views, lists of positions per layer and kv head, and cache sizes; its
// validation; the validation of a kv_scores request.

#include "support/doctest.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "specdec/core/forward.hpp"
#include "support/errors.hpp"

namespace sd = specdec;

namespace {

// Flags of the positions of a cache of `size` that `v` selects, by definition.
// Flags of the positions of a cache of `size` that `v` selects for list `list`, by definition.
std::vector<char> selected(sd::kv_view const& v, std::size_t size, std::size_t list = 0) {
  std::vector<char> on(size, 0);
  for (std::size_t p = 0; p < size; ++p) {
    bool in = p < v.sinks || p + v.window >= size;
    for (std::int32_t const b : v.blocks)
      in = in || (p >= static_cast<std::size_t>(b) * v.block_size &&
                  p < static_cast<std::size_t>(b + 1) * v.block_size);
    for (std::size_t i = 0; i < v.per_head && !v.positions.empty(); ++i)
      in = in || static_cast<std::size_t>(v.positions[list * v.per_head + i]) == p;
    on[p] = in ? 1 : 0;
  }
  return on;
}

}  // namespace

TEST_CASE("kv_view: runs cover exactly the selected positions, ascending and disjoint") {
  std::mt19937_64 rng(5);
  std::size_t runs_seen = 0;
  for (int i = 0; i < 3000; ++i) {
    std::size_t const size = rng() % 120;
    std::vector<std::int32_t> blocks;
    sd::kv_view v{.sinks = rng() % 3 == 0 ? 0 : rng() % 20,
                  .window = rng() % 3 == 0 ? 0 : rng() % 40,
                  .block_size = 1 + rng() % 12};
    for (std::int32_t b = 0; b < 20; ++b)
      if (rng() % 4 == 0) blocks.push_back(b);
    v.blocks = blocks;
    // Half the views also list positions per (layer, kv head): 3 lists, each strictly ascending
    // below 130 (some past the cache's end).
    std::vector<std::int32_t> lists;
    std::size_t const per_head = i % 2 == 0 ? 0 : 1 + rng() % 12;
    for (std::size_t l = 0; l < 3 && per_head > 0; ++l) {
      std::vector<std::int32_t> one;
      while (one.size() < per_head) {
        auto const p = static_cast<std::int32_t>(rng() % 130);
        if (std::find(one.begin(), one.end(), p) == one.end()) one.push_back(p);
      }
      std::sort(one.begin(), one.end());
      lists.insert(lists.end(), one.begin(), one.end());
    }
    v.positions = lists;
    v.per_head = per_head;
    CAPTURE(i);
    for (std::size_t list = 0; list < (per_head > 0 ? 3 : 1); ++list) {
      CAPTURE(list);
      std::vector<char> got(size, 0);
      std::size_t next = 0, count = 0, total = 0;
      v.for_each_run(
          size,
          [&](std::size_t first, std::size_t n) {
            CHECK(n > 0);
            CHECK(first >= next);  // ascending, disjoint
            CHECK(first + n <= size);
            for (std::size_t p = first; p < first + n; ++p) got[p] = 1;
            next = first + n;
            ++count;
            total += n;
          },
          list);
      CHECK(got == selected(v, size, list));
      CHECK(count <= v.max_runs());
      CHECK(total == v.rows(size, list));
      CHECK(total <= v.max_rows(size));
      runs_seen += count;
    }
  }
  CHECK(runs_seen > 4000);
  CHECK(sd::kv_view{}.empty());
  CHECK(!sd::kv_view{.window = 1}.empty());
}

TEST_CASE("kv_view: validation") {
  using test_support::expect_error;
  std::vector<std::int32_t> const descending{3, 2};
  std::vector<std::int32_t> const negative{-1};
  std::vector<std::int32_t> const far{100};
  std::vector<std::int32_t> const ok{0, 3};
  expect_error([&] { sd::kv_view{.block_size = 0, .blocks = ok}.validate(64); },
               sd::errc::invalid_argument);
  expect_error([&] { sd::kv_view{.block_size = 4, .blocks = descending}.validate(64); },
               sd::errc::invalid_argument);
  expect_error([&] { sd::kv_view{.block_size = 4, .blocks = negative}.validate(64); },
               sd::errc::out_of_range);
  expect_error([&] { sd::kv_view{.block_size = 4, .blocks = far}.validate(64); },
               sd::errc::out_of_range);
  sd::kv_view{.block_size = 4, .blocks = ok}.validate(64);
  sd::kv_view{.block_size = 4, .blocks = ok}.check_fits(13, 1, 1);  // block 3 starts at 12 < 13
  std::string const msg =
      expect_error([&] { sd::kv_view{.block_size = 4, .blocks = ok}.check_fits(12, 1, 1); },
                   sd::errc::out_of_range);
  CHECK(msg.find("past the cache") != std::string::npos);
  // Lists of positions: whole lists, each strictly ascending, inside the context; one per layer
  // and kv head of the model, inside the cache.
  std::vector<std::int32_t> const lists{0, 5, 9, 1, 2, 30};  // 2 lists of 3
  std::vector<std::int32_t> const unsorted{0, 5, 9, 2, 1, 30};
  std::vector<std::int32_t> const negative_listed{0, 5, 9, -1, 2, 30};
  sd::kv_view const good{.positions = lists, .per_head = 3};
  good.validate(64);
  good.check_fits(31, 2, 1);
  good.check_fits(31, 1, 2);
  CHECK(expect_error([&] { sd::kv_view{.positions = lists, .per_head = 4}.validate(64); },
                     sd::errc::invalid_argument)
            .find("no whole number of lists") != std::string::npos);
  expect_error([&] { sd::kv_view{.positions = lists, .per_head = 0}.validate(64); },
               sd::errc::invalid_argument);
  CHECK(expect_error([&] { sd::kv_view{.positions = unsorted, .per_head = 3}.validate(64); },
                     sd::errc::invalid_argument)
            .find("list 1 must be strictly ascending") != std::string::npos);
  expect_error([&] { sd::kv_view{.positions = negative_listed, .per_head = 3}.validate(64); },
               sd::errc::out_of_range);
  expect_error([&] { good.validate(30); }, sd::errc::out_of_range);  // 30 is past a context of 30
  CHECK(expect_error([&] { good.check_fits(30, 2, 1); }, sd::errc::out_of_range)
            .find("past the cache") != std::string::npos);
  CHECK(expect_error([&] { good.check_fits(31, 2, 2); }, sd::errc::invalid_argument)
            .find("one list each") != std::string::npos);
  CHECK(!good.empty());
  CHECK(good.max_runs() == 5);
  // A request validates its view.
  std::vector<sd::token_id> const tokens{1};
  std::vector<sd::position_t> const positions{0};
  sd::forward_request req{.tokens = tokens, .positions = positions};
  req.view = sd::kv_view{.block_size = 4, .blocks = descending};
  expect_error([&] { req.validate(8, 64); }, sd::errc::invalid_argument);
  // A kv_scores request scores 1 to n rows of the batch.
  req.view = {};
  req.kv_scores = {.kind = sd::kv_score_kind::probability, .rows = 1};
  req.validate(8, 64);
  req.kv_scores.rows = 0;
  expect_error([&] { req.validate(8, 64); }, sd::errc::out_of_range);
  req.kv_scores.rows = 2;
  expect_error([&] { req.validate(8, 64); }, sd::errc::out_of_range);
  req.kv_scores.kind = sd::kv_score_kind::none;  // asks for nothing: rows do not matter
  req.validate(8, 64);
}
