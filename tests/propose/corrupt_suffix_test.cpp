// The corrupted-file loop of the suffix cache reader (support/corrupt.hpp): a few hundred variants
// of a cache of the TinyStories stories, half of them with their checksums repaired so that the
// checks behind them are reached, each refused with a specdec::error (nothing added to the cache)
// or loaded, checked and drafted from. Marked skip: it runs as its own ctest
// (propose_corrupt_suffix; tests/CMakeLists.txt), under the asan preset too.
#include "support/doctest.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "propose/context.hpp"
#include "specdec/core/draft_tree.hpp"
#include "specdec/propose/suffix.hpp"
#include "support/corrupt.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

TEST_CASE("corrupted suffix cache files are refused or loaded and used" * doctest::skip()) {
  test_support::temp_dir dir;
  sd::suffix_cache cache;
  for (auto const& story : fixture::tinystories_stories()) {
    auto const id = cache.start();
    cache.append(id, fixture::tok512().encode(story, false));
    cache.finish(id);
  }
  auto const good = dir.file("good.sdsuffix");
  cache.save(good);
  std::vector<std::byte> const bytes = test_support::read_bytes(good);

  // The file's checksums made to match its bytes again: the payload's (at 32, over [48, end))
  // and the header's (at 40, over [0, 40)).
  auto const fix = [](std::vector<std::byte>& b) {
    if (b.size() < 48) return;
    std::uint64_t const payload = sd::detail::checksum64::of(std::span(b).subspan(48));
    std::memcpy(b.data() + 32, &payload, 8);
    std::uint64_t const head = sd::detail::checksum64::of(std::span(b).first(40));
    std::memcpy(b.data() + 40, &head, 8);
  };
  auto const probe = [](std::filesystem::path const& path) {
    sd::suffix_cache loaded({.vocab_size = 512});
    try {
      loaded.load(path);
    } catch (sd::error const&) {
      REQUIRE(loaded.requests() == 0);  // a refused file adds nothing
      throw;
    }
    REQUIRE(loaded.check().empty());
    std::vector<sd::token_id> const context = fixture::tok512().encode("Once upon a time", true);
    sd::suffix_draft d;
    sd::suffix_workspace work;
    loaded.speculate(context, {.tree = true}, d, work);
    for (sd::token_id t : d.tokens) REQUIRE((t >= 0 && t < 512));
  };
  auto const counts =
      test_support::corrupt_file_loop(bytes, 48, 71, 300, dir.file("variant.sdsuffix"), probe, fix);
  MESSAGE("suffix cache variants: ", counts.refused, " refused, ", counts.accepted,
          " loaded and used");
  CHECK(counts.refused > 0);
  CHECK(counts.accepted > 0);
}
