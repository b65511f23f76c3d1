#include "specdec/kv/contiguous_cache.hpp"

#include "support/doctest.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "specdec/core/concepts.hpp"

namespace sd = specdec;

static_assert(sd::kv_cache<sd::contiguous_cache>);

namespace {

// Fills positions [first, first + count) of every layer with a value identifying (layer, kind,
// position, element).
void fill(sd::contiguous_cache& c, std::size_t first, std::size_t count, float tag) {
  for (std::size_t l = 0; l < c.n_layers(); ++l)
    for (std::size_t p = first; p < first + count; ++p)
      for (std::size_t i = 0; i < c.kv_dim(); ++i) {
        c.keys(l)[p * c.kv_dim() + i] = tag + float(1000 * l + 10 * p + i);
        c.values(l)[p * c.kv_dim() + i] = -(tag + float(1000 * l + 10 * p + i));
      }
}

float key_at(sd::contiguous_cache const& c, std::size_t l, std::size_t p, std::size_t i) {
  return c.key_view(l)(p, i);
}
float value_at(sd::contiguous_cache const& c, std::size_t l, std::size_t p, std::size_t i) {
  return c.value_view(l)(p, i);
}

}  // namespace

TEST_CASE("contiguous_cache: construction and sizes") {
  sd::contiguous_cache c(3, 4, 10);
  CHECK(c.size() == 0);
  CHECK(c.empty());
  CHECK(c.capacity() == 10);
  CHECK(c.room() == 10);
  CHECK(c.n_layers() == 3);
  CHECK(c.kv_dim() == 4);
  CHECK_THROWS_AS(sd::contiguous_cache(0, 4, 10), sd::error);
  CHECK_THROWS_AS(sd::contiguous_cache(3, 0, 10), sd::error);
  CHECK_THROWS_AS(sd::contiguous_cache(3, 4, 0), sd::error);
  CHECK_THROWS_AS(sd::contiguous_cache(std::size_t{1} << 30, std::size_t{1} << 30, 1), sd::error);
  sd::contiguous_cache empty;
  CHECK(empty.capacity() == 0);
  CHECK_THROWS_AS(empty.append(1), sd::error);
}

TEST_CASE("contiguous_cache: append, overflow, truncate, clear") {
  sd::contiguous_cache c(2, 3, 8);
  CHECK(c.append(5) == 0);
  CHECK(c.size() == 5);
  CHECK(c.append(2) == 5);
  CHECK(c.size() == 7);
  try {
    (void)c.append(2);
    FAIL("no throw");
  } catch (sd::error const& e) {
    CHECK(e.code() == sd::errc::context_overflow);
  }
  CHECK(c.size() == 7);  // unchanged
  CHECK(c.append(1) == 7);
  CHECK(c.room() == 0);
  CHECK(c.append(0) == 8);

  c.truncate(3);
  CHECK(c.size() == 3);
  c.truncate(3);
  CHECK(c.size() == 3);
  try {
    c.truncate(4);
    FAIL("no throw");
  } catch (sd::error const& e) {
    CHECK(e.code() == sd::errc::out_of_range);
  }
  CHECK(c.size() == 3);
  c.clear();
  CHECK(c.size() == 0);
  CHECK(c.key_view(0).rows() == 0);
  CHECK_THROWS_AS((void)c.key_view(2), sd::error);
  CHECK_THROWS_AS((void)c.value_view(2), sd::error);
}

TEST_CASE("contiguous_cache: keep_path moves accepted entries and keeps the prefix") {
  sd::contiguous_cache c(2, 3, 16);
  (void)c.append(10);
  fill(c, 0, 10, 0.5f);
  // Prefix of 4, tree of 6 entries (positions 4..9); keep nodes 0, 2, 5.
  std::vector<std::int32_t> keep{0, 2, 5};
  c.keep_path(4, keep);
  CHECK(c.size() == 7);
  for (std::size_t l = 0; l < 2; ++l) {
    for (std::size_t p = 0; p < 4; ++p)
      for (std::size_t i = 0; i < 3; ++i)
        CHECK(key_at(c, l, p, i) == 0.5f + float(1000 * l + 10 * p + i));
    std::size_t const from[] = {4, 6, 9};
    for (std::size_t k = 0; k < 3; ++k)
      for (std::size_t i = 0; i < 3; ++i) {
        CHECK(key_at(c, l, 4 + k, i) == 0.5f + float(1000 * l + 10 * from[k] + i));
        CHECK(value_at(c, l, 4 + k, i) == -(0.5f + float(1000 * l + 10 * from[k] + i)));
      }
  }
  // Empty keep = truncate to n.
  c.keep_path(5, {});
  CHECK(c.size() == 5);
  // keep = identity is a no-op.
  std::vector<std::int32_t> ident{0, 1, 2};
  (void)c.append(3);
  fill(c, 5, 3, 7.0f);
  c.keep_path(5, ident);
  CHECK(c.size() == 8);
  CHECK(key_at(c, 1, 7, 2) == 7.0f + float(1000 + 70 + 2));
}

TEST_CASE("contiguous_cache: unchanged_rows tracks the lowest row dropped or moved") {
  sd::contiguous_cache c(1, 2, 32);
  CHECK(c.unchanged_rows() == 0);
  (void)c.append(20);
  CHECK(c.unchanged_rows() == 0);  // appended rows are new until marked
  c.mark_unchanged();
  CHECK(c.unchanged_rows() == 20);
  (void)c.append(5);
  CHECK(c.unchanged_rows() == 20);
  c.truncate(22);
  CHECK(c.unchanged_rows() == 20);
  c.truncate(12);
  CHECK(c.unchanged_rows() == 12);
  c.mark_unchanged();
  (void)c.append(6);  // rows 12..17: a tree of 6 nodes after a prefix of 12
  std::vector<std::int32_t> const keep{0, 1, 3, 5};
  c.keep_path(12, keep);  // rows 12, 13 stay; 15 -> 14 and 17 -> 15 move
  CHECK(c.size() == 16);
  CHECK(c.unchanged_rows() == 12);  // never above the rows marked
  c.mark_unchanged();
  (void)c.append(4);
  c.keep_path(16, std::vector<std::int32_t>{0, 1});  // nothing moves
  CHECK(c.unchanged_rows() == 16);
  c.mark_unchanged();
  (void)c.append(4);
  c.keep_path(10, std::vector<std::int32_t>{0, 2});  // row 12 -> 11: rows from 11 changed
  CHECK(c.unchanged_rows() == 11);
  c.mark_unchanged();
  c.keep_path(8, {});
  CHECK(c.unchanged_rows() == 8);
  // A failed keep_path or truncate changes nothing.
  c.mark_unchanged();
  CHECK_THROWS_AS(c.keep_path(2, std::vector<std::int32_t>{3, 1}), sd::error);
  CHECK_THROWS_AS(c.truncate(9), sd::error);
  CHECK(c.unchanged_rows() == 8);
  c.clear();
  CHECK(c.unchanged_rows() == 0);
}

TEST_CASE("contiguous_cache: bad keep_path arguments throw and change nothing") {
  sd::contiguous_cache c(1, 2, 16);
  (void)c.append(8);
  fill(c, 0, 8, 0.0f);
  auto expect = [&](std::size_t n, std::vector<std::int32_t> keep, sd::errc code) {
    try {
      c.keep_path(n, keep);
      FAIL("no throw");
    } catch (sd::error const& e) {
      CHECK(e.code() == code);
    }
    CHECK(c.size() == 8);
    CHECK(key_at(c, 0, 5, 1) == float(50 + 1));
  };
  expect(9, {}, sd::errc::out_of_range);           // prefix beyond size
  expect(4, {0, 4}, sd::errc::out_of_range);       // 4 + 4 = 8 is beyond the size
  expect(8, {0}, sd::errc::out_of_range);          // nothing after the prefix
  expect(4, {-1, 2}, sd::errc::invalid_argument);  // negative
  expect(4, {1, 1}, sd::errc::invalid_argument);   // not strictly ascending
  expect(4, {2, 1}, sd::errc::invalid_argument);   // descending
  expect(4, {0, 2, 900}, sd::errc::out_of_range);  // far beyond
}

TEST_CASE("contiguous_cache: memory grows on demand and keeps the stored rows") {
  sd::contiguous_cache c(2, 3, 100);
  CHECK(c.reserved() == 0);  // construction allocates nothing
  CHECK(c.append(3) == 0);
  CHECK(c.reserved() == 3);
  fill(c, 0, 3, 0.5f);
  CHECK(c.append(2) == 3);
  CHECK(c.reserved() == 6);  // at least doubled
  fill(c, 3, 2, 0.25f);
  for (std::size_t l = 0; l < 2; ++l)
    for (std::size_t p = 0; p < 5; ++p)
      for (std::size_t i = 0; i < 3; ++i) {
        float const tag = p < 3 ? 0.5f : 0.25f;
        CHECK(key_at(c, l, p, i) == tag + float(1000 * l + 10 * p + i));
        CHECK(value_at(c, l, p, i) == -(tag + float(1000 * l + 10 * p + i)));
      }
  c.reserve(40);
  CHECK(c.reserved() == 40);
  CHECK(key_at(c, 1, 4, 2) == 0.25f + float(1000 + 40 + 2));
  c.reserve(10);  // never shrinks
  CHECK(c.reserved() == 40);
  c.reserve(1000);  // within the capacity
  CHECK(c.reserved() == 100);
  CHECK(c.append(95) == 5);
  CHECK(c.reserved() == 100);
  CHECK(c.bytes_for(10) == 2 * 2 * 3 * 10 * sizeof(float));
}

TEST_CASE("contiguous_cache: a size the machine cannot hold is refused before allocating") {
  // 4 layers x 2 x 8192 floats x 2^24 positions: 4 TiB.
  sd::contiguous_cache c(4, 8192, std::size_t{1} << 24);
  (void)c.append(2);
  fill(c, 0, 2, 1.0f);
  try {
    c.reserve(std::size_t{1} << 24);
    FAIL("no throw");
  } catch (sd::error const& e) {
    CHECK(e.code() == sd::errc::out_of_memory);
    std::string const m = e.what();
    CHECK(m.find("16777216 positions") != std::string::npos);
    CHECK(m.find("4.0 TiB") != std::string::npos);
    CHECK(m.find("available") != std::string::npos);
  }
  CHECK(c.reserved() == 2);  // unchanged
  CHECK(key_at(c, 3, 1, 5) == 1.0f + float(3000 + 10 + 5));
}
