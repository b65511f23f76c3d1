// The corrupted-file loop of the REST datastore reader (support/corrupt.hpp): a few hundred
// variants of a datastore of the TinyStories stories, half of them with their checksums repaired
// so that the checks behind them are reached, each refused with a specdec::error or loaded and
// queried (longest suffix matches, REST drafts). Marked skip: it runs as its own ctest
// (propose_corrupt_datastore; tests/CMakeLists.txt), under the asan preset too.
#include "support/doctest.hpp"

#include <algorithm>
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
#include "specdec/propose/rest.hpp"
#include "specdec/propose/rest_datastore.hpp"
#include "support/corrupt.hpp"
#include "support/files.hpp"
#include "support/fixture.hpp"

namespace sd = specdec;

TEST_CASE("corrupted REST datastore files are refused or queried" * doctest::skip()) {
  test_support::temp_dir dir;
  sd::rest_datastore_builder builder(512);
  for (auto const& story : fixture::tinystories_stories())
    builder.add(fixture::tok512().encode(story, false));
  auto const good = dir.file("good.sdrest");
  builder.build().save(good);
  std::vector<std::byte> const bytes = test_support::read_bytes(good);

  // The file's checksums made to match its bytes again: the payload's (at 48, over [64, end))
  // and the header's (at 56, over [0, 56)).
  auto const fix = [](std::vector<std::byte>& b) {
    if (b.size() < 64) return;
    std::uint64_t const payload = sd::detail::checksum64::of(std::span(b).subspan(64));
    std::memcpy(b.data() + 48, &payload, 8);
    std::uint64_t const head = sd::detail::checksum64::of(std::span(b).first(56));
    std::memcpy(b.data() + 56, &head, 8);
  };
  auto const probe = [](std::filesystem::path const& path) {
    auto const ds = std::make_shared<sd::rest_datastore const>(sd::rest_datastore::load(path));
    std::vector<sd::token_id> const context = fixture::tok512().encode("Once upon a time", true);
    auto const match = ds->longest_suffix_match(context, 16);
    REQUIRE(match.hi <= ds->size());
    sd::rest_proposer proposer(ds, {});
    proposer.begin(context);
    sd::draft_tree tree(64);
    proposer.propose(propose_test::make_ctx(context, 32), tree);
    for (sd::token_id t : tree.tokens())
      REQUIRE(
          (t >= 0 && static_cast<std::size_t>(t) < std::max<std::size_t>(ds->vocab_size(), 512)));
  };
  auto const counts =
      test_support::corrupt_file_loop(bytes, 64, 53, 300, dir.file("variant.sdrest"), probe, fix);
  MESSAGE("datastore variants: ", counts.refused, " refused, ", counts.accepted,
          " loaded and queried");
  CHECK(counts.refused > 0);
  CHECK(counts.accepted > 0);
}

// --no-mmap: a datastore read into memory is queried as before after its file is truncated; a
// mapped one would end the process with SIGBUS at the next query that reads past the new end.
TEST_CASE("corrupted REST datastore: one read into memory survives the truncation of its file" *
          doctest::skip()) {
  test_support::temp_dir dir;
  sd::rest_datastore_builder builder(512);
  for (auto const& story : fixture::tinystories_stories())
    builder.add(fixture::tok512().encode(story, false));
  auto const path = dir.file("read.sdrest");
  sd::rest_datastore const built = builder.build();
  built.save(path);
  auto const ds = std::make_shared<sd::rest_datastore const>(
      sd::rest_datastore::load(path, true, sd::file_access::read));
  CHECK(!ds->is_mapped());
  std::filesystem::resize_file(path, 64);
  std::vector<sd::token_id> const context = fixture::tok512().encode("Once upon a time", true);
  auto const match = ds->longest_suffix_match(context, 16);
  auto const expected = built.longest_suffix_match(context, 16);
  CHECK(match.length == expected.length);
  CHECK(match.lo == expected.lo);
  CHECK(match.hi == expected.hi);
  CHECK(match.hi > match.lo);
  sd::rest_proposer proposer(ds, {});
  proposer.begin(context);
  sd::draft_tree tree(64);
  proposer.propose(propose_test::make_ctx(context, 32), tree);
  CHECK(tree.size() > 1);
  CHECK(std::equal(ds->suffix_array().begin(), ds->suffix_array().end(),
                   built.suffix_array().begin(), built.suffix_array().end()));
}
