// rest_datastore: SA-IS against a brute-force sort, longest-suffix and pattern queries against a
// brute-force scan (small and large vocabularies), the file round trip, rejection of truncated,
// corrupt and wrong-version files, and concurrent queries (labelled for the tsan preset).
#include "specdec/propose/rest_datastore.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/propose/rest.hpp"
#include "support/files.hpp"

namespace sd = specdec;

namespace {

constexpr std::uint32_t sep = sd::rest_datastore::separator;

// The suffix array by sorting suffixes with std::lexicographical_compare (a prefix sorts first).
std::vector<std::uint32_t> brute_sa(std::vector<std::uint32_t> const& s) {
  std::vector<std::uint32_t> sa(s.size());
  for (std::size_t i = 0; i < sa.size(); ++i) sa[i] = static_cast<std::uint32_t>(i);
  std::sort(sa.begin(), sa.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::lexicographical_compare(s.begin() + a, s.end(), s.begin() + b, s.end());
  });
  return sa;
}

// A random corpus of `n` entries over `vocab` ids with separators at rate 1/`doc`, drawn from a
// skewed distribution (repeats make long matches) when `skew`.
std::vector<std::uint32_t> random_corpus(std::mt19937_64& rng, std::size_t n, std::size_t vocab,
                                         std::size_t doc, bool skew) {
  std::vector<std::uint32_t> c(n);
  std::uniform_int_distribution<std::size_t> any(0, vocab - 1);
  std::geometric_distribution<std::size_t> geo(0.3);
  for (std::size_t i = 0; i < n; ++i) {
    if (doc != 0 && rng() % doc == 0) {
      c[i] = sep;
      continue;
    }
    c[i] = static_cast<std::uint32_t>(skew ? std::min(geo(rng), vocab - 1) : any(rng));
  }
  // Copy some earlier stretches forward so that long matches exist.
  for (std::size_t k = 0; k < n / 50 && n > 40; ++k) {
    std::size_t const len = 5 + rng() % 20;
    std::size_t const from = rng() % (n - len), to = rng() % (n - len);
    std::copy_n(c.begin() + static_cast<std::ptrdiff_t>(from), len,
                c.begin() + static_cast<std::ptrdiff_t>(to));
  }
  return c;
}

// Occurrences of `pattern` in `corpus` (positions), brute force.
std::vector<std::uint32_t> brute_occurrences(std::span<std::uint32_t const> corpus,
                                             std::span<sd::token_id const> pattern) {
  std::vector<std::uint32_t> out;
  for (std::size_t p = 0; p + pattern.size() <= corpus.size(); ++p) {
    bool ok = true;
    for (std::size_t k = 0; k < pattern.size() && ok; ++k)
      ok = corpus[p + k] == static_cast<std::uint32_t>(pattern[k]);
    if (ok) out.push_back(static_cast<std::uint32_t>(p));
  }
  return out;
}

// The datastore's range as a sorted list of positions.
std::vector<std::uint32_t> positions(sd::rest_datastore const& ds, sd::rest_match const& m) {
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = m.lo; i < m.hi; ++i) out.push_back(ds.suffix_array()[i]);
  std::sort(out.begin(), out.end());
  return out;
}

// A file in a fresh temporary directory (support/files.hpp), removed with it.
struct temp_file {
  test_support::temp_dir dir;
  std::filesystem::path path;
  explicit temp_file(char const* name) : path(dir.file(name)) {}
};

std::vector<char> read_all(std::filesystem::path const& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void write_all(std::filesystem::path const& p, std::vector<char> const& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

sd::errc load_error(std::filesystem::path const& p, bool verify = true) {
  try {
    (void)sd::rest_datastore::load(p, verify);
  } catch (sd::error const& e) {
    return e.code();
  }
  FAIL("loading " << p.string() << " did not throw");
  return sd::errc::internal;
}

}  // namespace

TEST_CASE("build_suffix_array equals a brute-force sort (small, large and huge alphabets)") {
  std::mt19937_64 rng(1);
  for (std::uint32_t const alphabet : {1u, 2u, 3u, 7u, 100000u, 0xFFFFFFF0u}) {
    for (std::size_t const n : {0u, 1u, 2u, 3u, 5u, 9u, 17u, 64u, 257u, 1000u, 3000u}) {
      for (int rep = 0; rep < 3; ++rep) {
        CAPTURE(alphabet);
        CAPTURE(n);
        std::vector<std::uint32_t> s(n);
        for (auto& v : s)
          v = rep == 0 ? static_cast<std::uint32_t>(rng() % alphabet)
                       : static_cast<std::uint32_t>(std::min<std::uint64_t>(
                             alphabet - 1, std::geometric_distribution<std::uint32_t>(0.5)(rng)));
        if (rep == 2 && n > 10)  // long runs and periodic text (deep LMS recursion)
          for (std::size_t i = 0; i < n; ++i) s[i] = (i / 3) % 2 == 0 ? 0 : s[i % 5];
        CHECK(sd::build_suffix_array(s, alphabet - 1) == brute_sa(s));
      }
    }
  }
  // Degenerate texts: one symbol repeated, and strictly increasing / decreasing.
  for (std::size_t const n : {10u, 100u, 1000u}) {
    std::vector<std::uint32_t> same(n, 4), up(n), down(n);
    for (std::size_t i = 0; i < n; ++i) {
      up[i] = static_cast<std::uint32_t>(i);
      down[i] = static_cast<std::uint32_t>(n - i);
    }
    CHECK(sd::build_suffix_array(same, 4) == brute_sa(same));
    CHECK(sd::build_suffix_array(up, static_cast<std::uint32_t>(n)) == brute_sa(up));
    CHECK(sd::build_suffix_array(down, static_cast<std::uint32_t>(n)) == brute_sa(down));
  }
  std::vector<std::uint32_t> bad{1, 2, 9};
  CHECK_THROWS_AS((void)sd::build_suffix_array(bad, 5), sd::error);
}

TEST_CASE("rest_datastore: queries equal a brute-force scan (vocabularies of 3 and 100,000)") {
  std::mt19937_64 rng(2);
  for (std::size_t const vocab : {3u, 100000u}) {
    for (std::size_t const n : {0u, 1u, 50u, 2000u, 20000u}) {
      CAPTURE(vocab);
      CAPTURE(n);
      std::vector<std::uint32_t> corpus = random_corpus(rng, n, vocab, 97, vocab > 3);
      auto const ds = sd::rest_datastore::build(vocab, corpus);
      if (!corpus.empty() && corpus.back() != sep) corpus.push_back(sep);
      REQUIRE(std::vector<std::uint32_t>(ds.corpus().begin(), ds.corpus().end()) == corpus);
      // The separator sorts above every token.
      std::vector<std::uint32_t> mapped = corpus;
      for (auto& v : mapped)
        if (v == sep) v = static_cast<std::uint32_t>(vocab);
      REQUIRE(std::vector<std::uint32_t>(ds.suffix_array().begin(), ds.suffix_array().end()) ==
              brute_sa(mapped));

      for (int q = 0; q < 300; ++q) {
        // A context: random ids, or a stretch of the corpus (long matches), sometimes ending
        // in an id the vocabulary does not have.
        std::vector<sd::token_id> ctx;
        std::size_t const len = 1 + rng() % 24;
        if (q % 3 != 0 && corpus.size() > len) {
          std::size_t const from = rng() % (corpus.size() - len);
          for (std::size_t k = 0; k < len; ++k)
            ctx.push_back(corpus[from + k] == sep ? 0
                                                  : static_cast<sd::token_id>(corpus[from + k]));
          if (q % 5 == 0) ctx.push_back(static_cast<sd::token_id>(rng() % vocab));
        } else {
          for (std::size_t k = 0; k < len; ++k)
            ctx.push_back(static_cast<sd::token_id>(rng() % std::min<std::size_t>(vocab, 6)));
        }
        if (q % 17 == 0) ctx.insert(ctx.end() - 1, static_cast<sd::token_id>(vocab + 3));
        std::size_t const n_max = 1 + rng() % 20, n_min = 1 + rng() % 3;
        CAPTURE(q);
        auto const m = ds.longest_suffix_match(ctx, n_max, n_min);
        // Brute force: the longest valid suffix within [n_min, n_max] that occurs.
        std::size_t expect = 0;
        for (std::size_t l = std::min(n_max, ctx.size()); l >= n_min && l >= 1; --l) {
          std::span<sd::token_id const> suf(ctx.data() + ctx.size() - l, l);
          if (std::any_of(suf.begin(), suf.end(), [&](sd::token_id t) {
                return t < 0 || static_cast<std::size_t>(t) >= vocab;
              }))
            continue;
          if (!brute_occurrences(corpus, suf).empty()) {
            expect = l;
            break;
          }
        }
        REQUIRE(m.length == expect);
        if (expect != 0) {
          std::span<sd::token_id const> suf(ctx.data() + ctx.size() - expect, expect);
          CHECK(positions(ds, m) == brute_occurrences(corpus, suf));
          CHECK(!m.empty());
        } else {
          CHECK(m.empty());
        }
        // find() on a random pattern.
        std::span<sd::token_id const> pat(
            ctx.data() + ctx.size() - std::min<std::size_t>(3, ctx.size()),
            std::min<std::size_t>(3, ctx.size()));
        bool const valid = std::all_of(pat.begin(), pat.end(), [&](sd::token_id t) {
          return t >= 0 && static_cast<std::size_t>(t) < vocab;
        });
        auto const f = ds.find(pat);
        CHECK(f.length == pat.size());
        if (valid)
          CHECK(positions(ds, f) == brute_occurrences(corpus, pat));
        else
          CHECK(f.count() == 0);
      }
    }
  }
}

TEST_CASE("rest_datastore: builder, validation of ids") {
  sd::rest_datastore_builder b(10);
  std::vector<sd::token_id> const d1{1, 2, 3}, d2{}, d3{3, 4};
  b.add(d1);
  b.add(d2);
  b.add(d3);
  CHECK(b.size() == 7);
  CHECK(b.num_documents() == 2);
  std::vector<sd::token_id> const bad{1, 10};
  CHECK_THROWS_AS(b.add(bad), sd::error);
  std::vector<sd::token_id> const negative{-1};
  CHECK_THROWS_AS(b.add(negative), sd::error);
  auto const ds = b.build();
  CHECK(ds.size() == 7);
  CHECK(ds.num_documents() == 2);
  std::vector<sd::token_id> const q{2, 3};
  CHECK(ds.find(q).count() == 1);
  std::vector<sd::token_id> const across{3, 3};  // would cross the document boundary
  CHECK(ds.find(across).count() == 0);
  CHECK_THROWS_AS((void)sd::rest_datastore::build(0, {}), sd::error);
  CHECK_THROWS_AS((void)sd::rest_datastore::build(5, {1, 5}), sd::error);
  CHECK_THROWS_AS(sd::rest_datastore_builder(0), sd::error);
}

TEST_CASE("rest_datastore: file round trip through a memory map") {
  std::mt19937_64 rng(3);
  for (std::size_t const vocab : {std::size_t{5}, std::size_t{512}, (std::size_t{1} << 24) + 5}) {
    CAPTURE(vocab);
    auto const corpus = random_corpus(rng, 5001, vocab, 50, true);
    auto const ds = sd::rest_datastore::build(vocab, corpus);
    temp_file f("roundtrip.sdrest");
    ds.save(f.path);
    auto loaded = sd::rest_datastore::load(f.path);
    CHECK(loaded.is_mapped());
    CHECK(!ds.is_mapped());
    CHECK(loaded.vocab_size() == vocab);
    CHECK(loaded.num_documents() == ds.num_documents());
    CHECK(std::equal(loaded.corpus().begin(), loaded.corpus().end(), ds.corpus().begin(),
                     ds.corpus().end()));
    CHECK(std::equal(loaded.suffix_array().begin(), loaded.suffix_array().end(),
                     ds.suffix_array().begin(), ds.suffix_array().end()));
    CHECK(loaded.memory_bytes() == ds.memory_bytes());
    for (int q = 0; q < 200; ++q) {
      std::size_t const from = rng() % (corpus.size() - 12);
      std::vector<sd::token_id> ctx;
      for (std::size_t k = 0; k < 12; ++k)
        ctx.push_back(corpus[from + k] == sep ? 1 : static_cast<sd::token_id>(corpus[from + k]));
      auto const a = ds.longest_suffix_match(ctx, 10);
      auto const b = loaded.longest_suffix_match(ctx, 10);
      CHECK(a.length == b.length);
      CHECK(a.lo == b.lo);
      CHECK(a.hi == b.hi);
    }
    // Moving keeps the mapping alive.
    sd::rest_datastore moved = std::move(loaded);
    CHECK(moved.size() == ds.size());
  }
  // An empty datastore round-trips too.
  auto const empty = sd::rest_datastore::build(7, {});
  temp_file f("empty.sdrest");
  empty.save(f.path);
  auto const e = sd::rest_datastore::load(f.path);
  CHECK(e.size() == 0);
  std::vector<sd::token_id> const q{1, 2};
  CHECK(e.longest_suffix_match(q, 4).empty());
}

TEST_CASE("rest_datastore: truncated, corrupt and wrong-version files are rejected") {
  std::mt19937_64 rng(4);
  auto const ds = sd::rest_datastore::build(300, random_corpus(rng, 3000, 300, 40, true));
  temp_file good("good.sdrest");
  ds.save(good.path);
  std::vector<char> const bytes = read_all(good.path);
  REQUIRE(bytes.size() > 64);
  temp_file bad("bad.sdrest");

  SUBCASE("truncated at every header byte and at sampled payload lengths") {
    for (std::size_t len = 0; len < bytes.size(); len += len < 80 ? 1 : 997) {
      CAPTURE(len);
      write_all(bad.path,
                std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(len)));
      CHECK(load_error(bad.path) == sd::errc::bad_file);
    }
    std::vector<char> longer = bytes;
    longer.push_back(0);
    write_all(bad.path, longer);
    CHECK(load_error(bad.path) == sd::errc::bad_file);
  }
  SUBCASE("a flipped bit anywhere fails a checksum or a check") {
    for (std::size_t pos = 0; pos < bytes.size(); pos += pos < 64 ? 1 : 211) {
      CAPTURE(pos);
      std::vector<char> c = bytes;
      c[pos] = static_cast<char>(c[pos] ^ 0x10);
      write_all(bad.path, c);
      sd::errc const code = load_error(bad.path);
      CHECK((code == sd::errc::bad_file || code == sd::errc::unsupported));
    }
  }
  SUBCASE("wrong version and bad magic") {
    std::vector<char> c = bytes;
    c[8] = 2;  // version 2 (the header checksum is checked after the version)
    write_all(bad.path, c);
    CHECK(load_error(bad.path) == sd::errc::unsupported);
    c = bytes;
    c[0] = 'X';
    write_all(bad.path, c);
    CHECK(load_error(bad.path) == sd::errc::bad_file);
  }
  SUBCASE("without the payload checksum, out-of-range values are still caught") {
    std::vector<char> c = bytes;
    // Suffix array entry 0 := 0x7FFFFFF0 (corpus of 3000 + separators, padded to 8 bytes).
    std::size_t const n = ds.size();
    std::size_t const sa_offset = 64 + ((4 * n + 7) & ~std::size_t{7});
    std::uint32_t const big = 0x7FFFFFF0u;
    std::memcpy(c.data() + sa_offset, &big, 4);
    write_all(bad.path, c);
    CHECK(load_error(bad.path, false) == sd::errc::bad_file);
    CHECK(load_error(bad.path, true) == sd::errc::bad_file);
    c = bytes;
    std::uint32_t const token = 301;  // corpus entry 0 outside the vocabulary
    std::memcpy(c.data() + 64, &token, 4);
    write_all(bad.path, c);
    CHECK(load_error(bad.path, false) == sd::errc::bad_file);
  }
  SUBCASE("a missing file is an io error") {
    CHECK(load_error(temp_file("missing.sdrest").path) == sd::errc::io);
  }
}

TEST_CASE("rest_datastore: concurrent queries from several threads equal sequential ones") {
  std::mt19937_64 rng(5);
  auto const corpus = random_corpus(rng, 200000, 512, 300, true);
  auto const ds =
      std::make_shared<sd::rest_datastore const>(sd::rest_datastore::build(512, corpus));
  // Contexts: stretches of the corpus with a random tail.
  std::vector<std::vector<sd::token_id>> contexts;
  for (int q = 0; q < 400; ++q) {
    std::size_t const from = rng() % (corpus.size() - 20);
    std::vector<sd::token_id> ctx;
    for (std::size_t k = 0; k < 20; ++k)
      ctx.push_back(corpus[from + k] == sep ? 2 : static_cast<sd::token_id>(corpus[from + k]));
    if (q % 2 == 0) ctx.back() = static_cast<sd::token_id>(rng() % 512);
    contexts.push_back(std::move(ctx));
  }
  auto const run = [&](std::size_t first, std::size_t step,
                       std::vector<std::vector<sd::token_id>>& trees,
                       std::vector<sd::rest_match>& matches) {
    sd::rest_proposer p(ds, {.max_occurrences = 64, .depth = 6, .max_nodes = 24});
    sd::draft_tree tree(64);
    for (std::size_t i = first; i < contexts.size(); i += step) {
      sd::propose_context ctx;
      ctx.tokens = contexts[i];
      ctx.max_nodes = 24;
      p.propose(ctx, tree);
      std::vector<sd::token_id> flat(tree.tokens().begin(), tree.tokens().end());
      flat.insert(flat.end(), tree.parents().begin(), tree.parents().end());
      trees[i] = std::move(flat);
      matches[i] = ds->longest_suffix_match(contexts[i], 12, 2);
    }
  };
  std::vector<std::vector<sd::token_id>> seq_trees(contexts.size());
  std::vector<sd::rest_match> seq_matches(contexts.size());
  run(0, 1, seq_trees, seq_matches);

  constexpr std::size_t threads = 4;
  std::vector<std::vector<sd::token_id>> par_trees(contexts.size());
  std::vector<sd::rest_match> par_matches(contexts.size());
  {
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { run(t, threads, par_trees, par_matches); });
    for (auto& th : pool) th.join();
  }
  // And every thread answering every query at once (no partitioning).
  std::vector<std::vector<std::vector<sd::token_id>>> all(
      threads, std::vector<std::vector<sd::token_id>>(contexts.size()));
  std::vector<std::vector<sd::rest_match>> all_m(threads,
                                                 std::vector<sd::rest_match>(contexts.size()));
  {
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { run(0, 1, all[t], all_m[t]); });
    for (auto& th : pool) th.join();
  }
  for (std::size_t i = 0; i < contexts.size(); ++i) {
    CAPTURE(i);
    CHECK(par_trees[i] == seq_trees[i]);
    CHECK(par_matches[i].lo == seq_matches[i].lo);
    CHECK(par_matches[i].hi == seq_matches[i].hi);
    CHECK(par_matches[i].length == seq_matches[i].length);
    for (std::size_t t = 0; t < threads; ++t) {
      CHECK(all[t][i] == seq_trees[i]);
      CHECK(all_m[t][i].length == seq_matches[i].length);
    }
  }
}
