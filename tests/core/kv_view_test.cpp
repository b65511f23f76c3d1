// kv_view (core/forward.hpp): the positions a view selects, against an obvious reference (a flag
// per position), on random views and cache sizes; its validation.

#include "support/doctest.hpp"

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "specdec/core/forward.hpp"
#include "support/errors.hpp"

namespace sd = specdec;

namespace {

// Flags of the positions of a cache of `size` that `v` selects, by definition.
std::vector<char> selected(sd::kv_view const& v, std::size_t size) {
  std::vector<char> on(size, 0);
  for (std::size_t p = 0; p < size; ++p) {
    bool in = p < v.sinks || p + v.window >= size;
    for (std::int32_t const b : v.blocks)
      in = in || (p >= static_cast<std::size_t>(b) * v.block_size &&
                  p < static_cast<std::size_t>(b + 1) * v.block_size);
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
    CAPTURE(i);
    std::vector<char> got(size, 0);
    std::size_t next = 0, count = 0, total = 0;
    v.for_each_run(size, [&](std::size_t first, std::size_t n) {
      CHECK(n > 0);
      CHECK(first >= next);  // ascending, disjoint
      CHECK(first + n <= size);
      for (std::size_t p = first; p < first + n; ++p) got[p] = 1;
      next = first + n;
      ++count;
      total += n;
    });
    CHECK(got == selected(v, size));
    CHECK(count <= v.max_runs());
    CHECK(total == v.rows(size));
    runs_seen += count;
  }
  CHECK(runs_seen > 3000);
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
  sd::kv_view{.block_size = 4, .blocks = ok}.validate(64, 13);  // block 3 starts at 12 < 13
  std::string const msg = expect_error(
      [&] { sd::kv_view{.block_size = 4, .blocks = ok}.validate(64, 12); }, sd::errc::out_of_range);
  CHECK(msg.find("past the cache") != std::string::npos);
  // A request validates its view.
  std::vector<sd::token_id> const tokens{1};
  std::vector<sd::position_t> const positions{0};
  sd::forward_request req{.tokens = tokens, .positions = positions};
  req.view = sd::kv_view{.block_size = 4, .blocks = descending};
  expect_error([&] { req.validate(8, 64); }, sd::errc::invalid_argument);
}
