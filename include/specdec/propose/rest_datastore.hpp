#pragma once
//! \file
//! `rest_datastore`: the retrieval datastore of REST (He et al. 2023): a token corpus and its
//! suffix array, built in O(n) by SA-IS, saved to a versioned, checksummed file and memory-mapped
//! (or read into memory) when loaded; and the query REST needs, the longest suffix of a context
//! that occurs in the corpus, by binary search over the suffix array. One topic (the datastore: its
//! construction, file format and query) needs more than 600 lines here.
//!
//! Corpus. Documents of token ids (any id in [0, vocab), 32 bits) are concatenated, each followed
//! by `rest_datastore::separator` (0xFFFFFFFF, which is no token id), so that no match or
//! continuation crosses a document boundary. The suffix array orders the suffixes of the whole
//! corpus with the separator above every token and the end of the corpus below everything.
//!
//! File format (version 1, little-endian, 64-byte header then the payload):
//!
//! | offset | size | field                                                                  |
//! |-------:|-----:|------------------------------------------------------------------------|
//! |      0 |    8 | magic "SDRESTDS"                                                       |
//! |      8 |    4 | format version (1)                                                     |
//! |     12 |    4 | flags: bit 0 = a first-token bucket table follows the suffix array     |
//! |     16 |    8 | vocabulary size V                                                      |
//! |     24 |    8 | corpus length n (tokens + separators)                                  |
//! |     32 |    8 | number of documents                                                    |
//! |     40 |    8 | payload size in bytes                                                  |
//! |     48 |    8 | checksum of the payload (`detail::checksum64`)                         |
//! |     56 |    8 | checksum of bytes [0, 56) of the header                                |
//! |     64 |      | corpus: n x u32, zero-padded to 8 bytes                                |
//! |        |      | suffix array: n x u32, zero-padded to 8 bytes                          |
//! |        |      | buckets (flag bit 0): (V + 1) x u32, zero-padded to 8 bytes; entry c = |
//! |        |      | the number of suffixes whose first symbol is a token below c           |
//!
//! Loading checks the magic, the version, the header checksum, the sizes against the file size,
//! the payload checksum, and then every value the queries index with (suffix array entries < n,
//! corpus entries < V or the separator, a monotone bucket table), so that no file, however
//! corrupt, leads to an out-of-bounds read; any failure throws `specdec::error`.
//!
//! Thread safety: a datastore is immutable once built or loaded; every query is const and keeps
//! no state, so one datastore may serve any number of threads and sequences at once.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/model/binary_io.hpp"
#include "specdec/model/mapped_file.hpp"

namespace specdec {

namespace detail {

//! SA-IS (Nong, Zhang and Chan, 2009): writes into `sa` ([n]) the suffix array of `s` ([n],
//! symbols in [0, upper]) with a virtual end sentinel below every symbol. O(n + upper) time;
//! recursion on the reduced string of LMS substrings (at most half as long) allocates its own
//! buffers. Requires n < 2^31.
inline void sais(std::span<std::int32_t const> s, std::int32_t upper, std::span<std::int32_t> sa) {
  auto const n = static_cast<std::int32_t>(s.size());
  auto const at = [](auto& v, std::int32_t i) -> decltype(auto) {
    return v[static_cast<std::size_t>(i)];
  };
  if (n == 0) return;
  if (n <= 8) {  // tiny: compare suffixes directly
    for (std::int32_t i = 0; i < n; ++i) at(sa, i) = i;
    std::sort(sa.begin(), sa.end(), [&](std::int32_t a, std::int32_t b) {
      return std::lexicographical_compare(s.begin() + a, s.end(), s.begin() + b, s.end());
    });
    return;
  }
  // Types: S (true) when suffix i < suffix i + 1; the last suffix is L (the sentinel is smaller).
  std::vector<std::uint8_t> is_s(static_cast<std::size_t>(n), 0);
  for (std::int32_t i = n - 2; i >= 0; --i)
    at(is_s, i) = at(s, i) == at(s, i + 1) ? at(is_s, i + 1) : (at(s, i) < at(s, i + 1) ? 1 : 0);
  auto const type_s = [&](std::int32_t i) { return at(is_s, i) != 0; };
  auto const is_lms = [&](std::int32_t i) { return i > 0 && type_s(i) && !type_s(i - 1); };

  // Bucket c spans [l_start[c], l_start[c + 1]); its L-type suffixes come first, then its S-type
  // suffixes from s_start[c].
  std::size_t const buckets = static_cast<std::size_t>(upper) + 2;
  std::vector<std::int32_t> l_start(buckets, 0), s_start(buckets, 0), head(buckets, 0);
  for (std::int32_t i = 0; i < n; ++i) {
    if (type_s(i))
      ++l_start[static_cast<std::size_t>(at(s, i)) + 1];
    else
      ++s_start[static_cast<std::size_t>(at(s, i))];
  }
  for (std::size_t c = 0; c + 1 < buckets; ++c) {
    s_start[c] += l_start[c];      // start of c + L count of c
    l_start[c + 1] += s_start[c];  // + S count of c = start of c + 1
  }

  // Induced sorting from LMS suffixes placed in `lms` order at the starts of their S regions.
  auto const induce = [&](std::span<std::int32_t const> lms) {
    std::fill(sa.begin(), sa.end(), -1);
    std::copy(s_start.begin(), s_start.end(), head.begin());
    for (std::int32_t const d : lms) at(sa, head[static_cast<std::size_t>(at(s, d))]++) = d;
    std::copy(l_start.begin(), l_start.end(), head.begin());
    at(sa, head[static_cast<std::size_t>(at(s, n - 1))]++) = n - 1;
    for (std::int32_t i = 0; i < n; ++i) {
      std::int32_t const v = at(sa, i);
      if (v >= 1 && !type_s(v - 1)) at(sa, head[static_cast<std::size_t>(at(s, v - 1))]++) = v - 1;
    }
    std::copy(l_start.begin(), l_start.end(), head.begin());
    for (std::int32_t i = n - 1; i >= 0; --i) {
      std::int32_t const v = at(sa, i);
      if (v >= 1 && type_s(v - 1))
        at(sa, --head[static_cast<std::size_t>(at(s, v - 1)) + 1]) = v - 1;
    }
  };

  std::vector<std::int32_t> lms_index(static_cast<std::size_t>(n), -1);
  std::vector<std::int32_t> lms;
  for (std::int32_t i = 1; i < n; ++i) {
    if (is_lms(i)) {
      lms_index[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(lms.size());
      lms.push_back(i);
    }
  }
  auto const m = static_cast<std::int32_t>(lms.size());
  induce(lms);
  if (m == 0) return;

  // Name the LMS substrings in sorted order; equal substrings share a name.
  std::vector<std::int32_t> sorted;
  sorted.reserve(lms.size());
  for (std::int32_t const v : sa)
    if (v >= 0 && lms_index[static_cast<std::size_t>(v)] >= 0) sorted.push_back(v);
  SPECDEC_ASSERT(static_cast<std::int32_t>(sorted.size()) == m);
  std::vector<std::int32_t> reduced(lms.size(), 0);
  std::int32_t name = 0;
  auto const end_of = [&](std::int32_t p) {  // the next LMS position, or n (the sentinel)
    std::int32_t const k = lms_index[static_cast<std::size_t>(p)] + 1;
    return k < m ? at(lms, k) : n;
  };
  for (std::int32_t i = 1; i < m; ++i) {
    std::int32_t const a = at(sorted, i - 1), b = at(sorted, i);
    std::int32_t const len = end_of(a) - a;
    bool same = len == end_of(b) - b;
    // Compare the substrings including their closing LMS character; the sentinel is unique.
    for (std::int32_t k = 0; same && k <= len; ++k) {
      if (a + k >= n || b + k >= n || at(s, a + k) != at(s, b + k)) same = false;
    }
    if (!same) ++name;
    at(reduced, lms_index[static_cast<std::size_t>(b)]) = name;
  }
  if (name + 1 < m) {
    std::vector<std::int32_t> reduced_sa(lms.size());
    sais(reduced, name, reduced_sa);
    for (std::int32_t i = 0; i < m; ++i) at(sorted, i) = at(lms, at(reduced_sa, i));
  } else {
    // Every LMS substring is distinct: their names already give their order.
    for (std::int32_t i = 0; i < m; ++i) at(sorted, at(reduced, i)) = at(lms, i);
  }
  induce(sorted);
}

}  // namespace detail

//! The suffix array of `text` ([n] symbols, each <= `max_symbol`): the start positions of its
//! suffixes in increasing lexicographic order, where a suffix that is a prefix of another sorts
//! first. O(n + max_symbol) time by SA-IS; alphabets much larger than n are first compressed to
//! the symbols present (O(n log n)). Throws `errc::invalid_argument` when n >= 2^31 - 1 or a
//! symbol exceeds `max_symbol`.
[[nodiscard]] inline std::vector<std::uint32_t> build_suffix_array(
    std::span<std::uint32_t const> text, std::uint32_t max_symbol) {
  std::size_t const n = text.size();
  SPECDEC_CHECK(n < 0x7FFFFFFFu, invalid_argument, "build_suffix_array: a text of ", n,
                " symbols is too long (the limit is 2^31 - 2)");
  std::vector<std::int32_t> s(n);
  std::int32_t upper = 0;
  if (static_cast<std::uint64_t>(max_symbol) <= 4 * static_cast<std::uint64_t>(n) + (1u << 16)) {
    for (std::size_t i = 0; i < n; ++i) {
      SPECDEC_CHECK(text[i] <= max_symbol, invalid_argument, "build_suffix_array: symbol ", text[i],
                    " at ", i, " exceeds the maximum ", max_symbol);
      s[i] = static_cast<std::int32_t>(text[i]);
    }
    upper = static_cast<std::int32_t>(max_symbol);
  } else {
    // Rank the symbols present (order-preserving), so that bucket arrays stay O(n).
    std::vector<std::uint32_t> symbols(text.begin(), text.end());
    std::sort(symbols.begin(), symbols.end());
    symbols.erase(std::unique(symbols.begin(), symbols.end()), symbols.end());
    SPECDEC_CHECK(symbols.empty() || symbols.back() <= max_symbol, invalid_argument,
                  "build_suffix_array: symbol ", symbols.back(), " exceeds the maximum ",
                  max_symbol);
    for (std::size_t i = 0; i < n; ++i)
      s[i] = static_cast<std::int32_t>(std::lower_bound(symbols.begin(), symbols.end(), text[i]) -
                                       symbols.begin());
    upper = symbols.empty() ? 0 : static_cast<std::int32_t>(symbols.size() - 1);
  }
  std::vector<std::uint32_t> out(n);
  // int32 and uint32 may alias each other; SA-IS writes indices < 2^31 straight into `out`.
  detail::sais(s, upper, std::span<std::int32_t>(reinterpret_cast<std::int32_t*>(out.data()), n));
  return out;
}

//! A suffix-array range: the suffixes at suffix-array indices [lo, hi) all start with the matched
//! tokens (`length` of them; the last `length` tokens of the context for `longest_suffix_match`).
struct rest_match {
  std::size_t length = 0;  //!< matched tokens (0: no match)
  std::uint32_t lo = 0;    //!< first suffix-array index of the range
  std::uint32_t hi = 0;    //!< one past the last
  //! Number of occurrences.
  [[nodiscard]] std::size_t count() const noexcept { return hi - lo; }
  //! Whether anything matched.
  [[nodiscard]] bool empty() const noexcept { return length == 0 || hi <= lo; }
};

//! A token corpus with its suffix array (see the file comment). Built in memory by `build` /
//! `rest_datastore_builder`, written by `save`, memory-mapped (or read) by `load`. Immutable and
//! safe to query from any number of threads. Move-only.
class rest_datastore {
 public:
  //! The value that ends each document in the corpus (no token id has it).
  static constexpr std::uint32_t separator = 0xFFFFFFFFu;
  //! The file format version `save` writes and `load` reads.
  static constexpr std::uint32_t format_version = 1;
  //! Vocabularies up to this size get a first-token bucket table (4 (V + 1) bytes) that narrows
  //! every search to the suffixes starting with the pattern's first token.
  static constexpr std::size_t max_bucketed_vocab = std::size_t{1} << 24;

  rest_datastore(rest_datastore&&) noexcept = default;
  rest_datastore& operator=(rest_datastore&&) noexcept = default;
  rest_datastore(rest_datastore const&) = delete;
  rest_datastore& operator=(rest_datastore const&) = delete;

  //! Builds a datastore over `corpus` ([n] token ids < `vocab`, documents each ended by
  //! `separator`; a last document without one gets it appended). Throws `errc::invalid_argument`
  //! for a zero or too large vocabulary, an id outside it, or a corpus of 2^31 - 1 entries or
  //! more.
  [[nodiscard]] static rest_datastore build(std::size_t vocab, std::vector<std::uint32_t> corpus) {
    SPECDEC_CHECK(vocab >= 1 && vocab < separator, invalid_argument,
                  "rest_datastore: vocabulary size ", vocab, " is outside [1, 2^32 - 1)");
    if (!corpus.empty() && corpus.back() != separator) corpus.push_back(separator);
    std::size_t documents = 0;
    for (std::size_t i = 0; i < corpus.size(); ++i) {
      SPECDEC_CHECK(corpus[i] < vocab || corpus[i] == separator, invalid_argument,
                    "rest_datastore: corpus entry ", i, " is ", corpus[i],
                    ", outside the vocabulary of ", vocab);
      documents += corpus[i] == separator ? 1 : 0;
    }
    rest_datastore ds;
    ds.vocab_ = vocab;
    ds.documents_ = documents;
    // The separator sorts above every token: map it to symbol `vocab` for the construction.
    std::vector<std::uint32_t> symbols(corpus);
    for (std::uint32_t& v : symbols)
      if (v == separator) v = static_cast<std::uint32_t>(vocab);
    ds.owned_sa_ = build_suffix_array(symbols, static_cast<std::uint32_t>(vocab));
    symbols = {};
    ds.owned_corpus_ = std::move(corpus);
    if (vocab <= max_bucketed_vocab) {
      ds.owned_buckets_.assign(vocab + 1, 0);
      for (std::uint32_t const v : ds.owned_corpus_)
        if (v != separator) ++ds.owned_buckets_[v + 1];
      for (std::size_t c = 1; c <= vocab; ++c) ds.owned_buckets_[c] += ds.owned_buckets_[c - 1];
    }
    ds.corpus_ = ds.owned_corpus_;
    ds.sa_ = ds.owned_sa_;
    ds.buckets_ = ds.owned_buckets_;
    return ds;
  }

  //! Memory-maps the datastore file at `path` (or reads it into memory: `access`; see
  //! model/mapped_file.hpp for what mapping implies) and checks it (see the file comment). Throws
  //! `errc::io` when it cannot be read, `errc::bad_file` when it is truncated, corrupt or not a
  //! datastore, `errc::unsupported` for another format version or a big-endian host. With
  //! `verify_checksum` false the payload checksum is not computed (the bounds checks still run).
  [[nodiscard]] static rest_datastore load(std::filesystem::path const& path,
                                           bool verify_checksum = true,
                                           file_access access = file_access::map) {
    check_little_endian();
    auto file = mapped_file::open(path, access);
    std::string const where = "rest_datastore: '" + path.string() + "'";
    std::span<std::byte const> const bytes = file->bytes();
    SPECDEC_CHECK(bytes.size() >= header_size, bad_file, where, ": ", bytes.size(),
                  " bytes is too short for the ", header_size, "-byte header (truncated?)");
    SPECDEC_CHECK(std::memcmp(bytes.data(), magic, 8) == 0, bad_file, where,
                  ": not a REST datastore (bad magic)");
    auto const u32 = [&](std::size_t off) {
      std::uint32_t v = 0;
      std::memcpy(&v, bytes.data() + off, 4);
      return v;
    };
    auto const u64 = [&](std::size_t off) {
      std::uint64_t v = 0;
      std::memcpy(&v, bytes.data() + off, 8);
      return v;
    };
    std::uint32_t const version = u32(8);
    SPECDEC_CHECK(version == format_version, unsupported, where, ": format version ", version,
                  ", this build reads version ", format_version);
    SPECDEC_CHECK(detail::checksum64::of(bytes.first(56)) == u64(56), bad_file, where,
                  ": the header checksum does not match (corrupt header)");
    std::uint32_t const flags = u32(12);
    std::uint64_t const vocab = u64(16);
    std::uint64_t const n = u64(24);
    std::uint64_t const documents = u64(32);
    std::uint64_t const payload = u64(40);
    SPECDEC_CHECK((flags & ~1u) == 0, bad_file, where, ": unknown flags ", flags);
    SPECDEC_CHECK(vocab >= 1 && vocab < separator && n < 0x7FFFFFFFu, bad_file, where,
                  ": vocabulary ", vocab, " or corpus length ", n, " out of range");
    bool const bucketed = (flags & 1u) != 0;
    SPECDEC_CHECK(!bucketed || vocab <= max_bucketed_vocab, bad_file, where,
                  ": a bucket table for a vocabulary of ", vocab, " is not allowed");
    std::uint64_t const expected = payload_bytes(n, bucketed ? vocab + 1 : 0);
    SPECDEC_CHECK(payload == expected, bad_file, where, ": payload size ", payload,
                  " disagrees with the header (expected ", expected, ")");
    SPECDEC_CHECK(bytes.size() == header_size + payload, bad_file, where, ": file has ",
                  bytes.size(), " bytes, the header says ", header_size + payload,
                  bytes.size() < header_size + payload ? " (truncated)" : " (trailing bytes)");
    if (verify_checksum)
      SPECDEC_CHECK(detail::checksum64::of(bytes.subspan(header_size)) == u64(48), bad_file, where,
                    ": the payload checksum does not match (corrupt file)");

    rest_datastore ds;
    ds.vocab_ = static_cast<std::size_t>(vocab);
    ds.documents_ = static_cast<std::size_t>(documents);
    std::size_t const count = static_cast<std::size_t>(n);
    auto const array = [&](std::size_t offset, std::size_t size) {
      return std::span<std::uint32_t const>(
          reinterpret_cast<std::uint32_t const*>(bytes.data() + offset), size);
    };
    std::size_t offset = header_size;
    ds.corpus_ = array(offset, count);
    offset += padded(4 * count);
    ds.sa_ = array(offset, count);
    offset += padded(4 * count);
    if (bucketed) ds.buckets_ = array(offset, static_cast<std::size_t>(vocab) + 1);
    ds.file_ = std::move(file);
    ds.validate(where);
    return ds;
  }

  //! Writes the datastore to `path` (through a temporary file renamed into place). Throws
  //! `errc::io` when the file cannot be written.
  void save(std::filesystem::path const& path) const {
    check_little_endian();
    std::uint32_t const flags = buckets_.empty() ? 0u : 1u;
    std::uint64_t const payload = payload_bytes(corpus_.size(), buckets_.size());
    static constexpr std::byte zeros[8] = {};
    auto const segments = [&](auto&& sink) {
      for (std::span<std::uint32_t const> a : {corpus_, sa_, buckets_}) {
        if (a.empty()) continue;
        sink(std::as_bytes(a));
        std::size_t const pad = padded(a.size_bytes()) - a.size_bytes();
        if (pad != 0) sink(std::span<std::byte const>(zeros, pad));
      }
    };
    detail::checksum64 sum;
    segments([&](std::span<std::byte const> b) { sum.update(b); });

    std::byte header[header_size] = {};
    auto const put = [&](std::size_t off, auto v) { std::memcpy(header + off, &v, sizeof v); };
    std::memcpy(header, magic, 8);
    put(8, format_version);
    put(12, flags);
    put(16, static_cast<std::uint64_t>(vocab_));
    put(24, static_cast<std::uint64_t>(corpus_.size()));
    put(32, static_cast<std::uint64_t>(documents_));
    put(40, payload);
    put(48, sum.digest());
    put(56, detail::checksum64::of(std::span<std::byte const>(header, 56)));

    std::filesystem::path tmp = path;
    tmp += ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      SPECDEC_CHECK(out.good(), io, "rest_datastore: cannot create '", tmp.string(), "'");
      out.write(reinterpret_cast<char const*>(header), header_size);
      segments([&](std::span<std::byte const> b) {
        out.write(reinterpret_cast<char const*>(b.data()), static_cast<std::streamsize>(b.size()));
      });
      out.flush();
      SPECDEC_CHECK(out.good(), io, "rest_datastore: writing '", tmp.string(), "' failed");
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    SPECDEC_CHECK(!ec, io, "rest_datastore: cannot rename '", tmp.string(), "' to '", path.string(),
                  "': ", ec.message());
  }

  //! Vocabulary size: every corpus token is below it.
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_; }
  //! Corpus length, separators included.
  [[nodiscard]] std::size_t size() const noexcept { return corpus_.size(); }
  //! Number of documents.
  [[nodiscard]] std::size_t num_documents() const noexcept { return documents_; }
  //! Whether the data lives in a memory-mapped file (not when built, nor when loaded with
  //! `file_access::read`).
  [[nodiscard]] bool is_mapped() const noexcept {
    return file_ != nullptr && file_->access() == file_access::map;
  }
  //! The corpus, [size()] token ids and separators.
  [[nodiscard]] std::span<std::uint32_t const> corpus() const noexcept { return corpus_; }
  //! The suffix array, [size()] corpus positions.
  [[nodiscard]] std::span<std::uint32_t const> suffix_array() const noexcept { return sa_; }
  //! Bytes of corpus, suffix array and bucket table.
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return 4 * (corpus_.size() + sa_.size() + buckets_.size());
  }

  //! The suffix-array range of the suffixes that start with `pattern` (length = pattern.size();
  //! an empty range when it does not occur or holds an id outside the vocabulary). O(|pattern|
  //! log n).
  [[nodiscard]] rest_match find(std::span<token_id const> pattern) const noexcept {
    rest_match r;
    r.length = pattern.size();
    if (pattern.empty()) {
      r.hi = static_cast<std::uint32_t>(sa_.size());
      return r;
    }
    for (token_id const t : pattern)
      if (t < 0 || static_cast<std::size_t>(t) >= vocab_) return r;
    auto [lo, hi] = first_token_range(pattern[0]);
    std::uint32_t const first = lower_bound(pattern, lo, hi);
    if (first == hi || compare(sa_[first], pattern) != 0) {
      r.lo = r.hi = first;
      return r;
    }
    r.lo = first;
    r.hi = upper_bound(pattern, first, hi);
    return r;
  }

  //! The longest suffix of `context` of at most `n_max` and at least `n_min` tokens that occurs
  //! in the corpus, with its range (`length` 0 when none does). Only the trailing run of valid ids
  //! (in [0, vocab)) is considered. Binary search over the length (an occurring suffix implies
  //! that its own suffixes occur): O(log(n_max) |suffix| log n).
  [[nodiscard]] rest_match longest_suffix_match(std::span<token_id const> context,
                                                std::size_t n_max,
                                                std::size_t n_min = 1) const noexcept {
    std::size_t valid = 0;
    while (valid < context.size() && valid < n_max) {
      token_id const t = context[context.size() - 1 - valid];
      if (t < 0 || static_cast<std::size_t>(t) >= vocab_) break;
      ++valid;
    }
    n_min = std::max<std::size_t>(n_min, 1);
    if (valid < n_min || corpus_.empty()) return {};
    auto const suffix = [&](std::size_t len) { return context.subspan(context.size() - len); };
    // Invariant: length `good` occurs (or good = n_min - 1), length `bad` does not (or valid + 1).
    // The last successful probe's lower bound is kept for the final range.
    std::size_t good = n_min - 1, bad = valid + 1;
    std::uint32_t good_lo = 0, good_end = 0;
    while (bad - good > 1) {
      std::size_t const mid = good + (bad - good) / 2;
      std::span<token_id const> const pattern = suffix(mid);
      auto const [lo, hi] = first_token_range(pattern[0]);
      std::uint32_t const first = lower_bound(pattern, lo, hi);
      if (first < hi && compare(sa_[first], pattern) == 0) {
        good = mid;
        good_lo = first;
        good_end = hi;
      } else {
        bad = mid;
      }
    }
    if (good < n_min) return {};
    std::span<token_id const> const pattern = suffix(good);
    return {good, good_lo, upper_bound(pattern, good_lo, good_end)};
  }

 private:
  static constexpr std::size_t header_size = 64;
  static constexpr char magic[9] = "SDRESTDS";

  rest_datastore() = default;

  static void check_little_endian() {
    if constexpr (std::endian::native != std::endian::little)
      SPECDEC_THROW(unsupported,
                    "rest_datastore: datastore files are little-endian; this host "
                    "is not");
  }
  static constexpr std::size_t padded(std::size_t bytes) noexcept {
    return (bytes + 7) & ~std::size_t{7};
  }
  static constexpr std::uint64_t payload_bytes(std::uint64_t n, std::uint64_t buckets) noexcept {
    return 2 * padded(static_cast<std::size_t>(4 * n)) +
           padded(static_cast<std::size_t>(4 * buckets));
  }

  //! Checks every value a query indexes with.
  void validate(std::string const& where) const {
    std::size_t const n = corpus_.size();
    std::size_t documents = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint32_t const v = corpus_[i];
      SPECDEC_CHECK(v < vocab_ || v == separator, bad_file, where, ": corpus entry ", i, " is ", v,
                    ", outside the vocabulary of ", vocab_);
      documents += v == separator ? 1 : 0;
    }
    SPECDEC_CHECK(documents == documents_, bad_file, where, ": ", documents,
                  " document separators, the header says ", documents_);
    for (std::size_t i = 0; i < n; ++i)
      SPECDEC_CHECK(sa_[i] < n, bad_file, where, ": suffix array entry ", i, " is ", sa_[i],
                    ", outside the corpus of ", n);
    if (!buckets_.empty()) {
      SPECDEC_CHECK(buckets_[0] == 0, bad_file, where, ": bucket table does not start at 0");
      for (std::size_t c = 1; c < buckets_.size(); ++c)
        SPECDEC_CHECK(buckets_[c - 1] <= buckets_[c] && buckets_[c] <= n, bad_file, where,
                      ": bucket table entry ", c, " is not monotone within the corpus");
    }
  }

  //! The suffix-array range to search for patterns starting with `first`.
  [[nodiscard]] std::pair<std::uint32_t, std::uint32_t> first_token_range(
      token_id first) const noexcept {
    if (buckets_.empty()) return {0u, static_cast<std::uint32_t>(sa_.size())};
    auto const c = static_cast<std::size_t>(first);
    return {buckets_[c], buckets_[c + 1]};
  }

  //! Compares the suffix at corpus position `pos` with `pattern` over the pattern's length:
  //! negative when the suffix sorts before every string starting with the pattern, 0 when it
  //! starts with the pattern, positive when after.
  [[nodiscard]] int compare(std::uint32_t pos, std::span<token_id const> pattern) const noexcept {
    std::size_t const n = corpus_.size();
    for (std::size_t k = 0; k < pattern.size(); ++k) {
      if (pos + k >= n) return -1;
      std::uint32_t const a = corpus_[pos + k];
      auto const b = static_cast<std::uint32_t>(pattern[k]);
      if (a != b) return a < b ? -1 : 1;
    }
    return 0;
  }
  [[nodiscard]] std::uint32_t lower_bound(std::span<token_id const> pattern, std::uint32_t lo,
                                          std::uint32_t hi) const noexcept {
    while (lo < hi) {
      std::uint32_t const mid = lo + (hi - lo) / 2;
      prefetch_midpoints(lo, mid, hi);
      if (compare(sa_[mid], pattern) < 0)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo;
  }
  [[nodiscard]] std::uint32_t upper_bound(std::span<token_id const> pattern, std::uint32_t lo,
                                          std::uint32_t hi) const noexcept {
    while (lo < hi) {
      std::uint32_t const mid = lo + (hi - lo) / 2;
      prefetch_midpoints(lo, mid, hi);
      if (compare(sa_[mid], pattern) <= 0)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo;
  }
  //! Prefetches the suffix-array entries of both possible next midpoints of a binary search.
  void prefetch_midpoints(std::uint32_t lo, std::uint32_t mid, std::uint32_t hi) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(sa_.data() + lo + (mid - lo) / 2);
    __builtin_prefetch(sa_.data() + mid + (hi - mid) / 2);
#else
    (void)lo;
    (void)mid;
    (void)hi;
#endif
  }

  std::size_t vocab_ = 0;
  std::size_t documents_ = 0;
  std::span<std::uint32_t const> corpus_;
  std::span<std::uint32_t const> sa_;
  std::span<std::uint32_t const> buckets_;  //!< [vocab + 1] or empty
  std::vector<std::uint32_t> owned_corpus_;
  std::vector<std::uint32_t> owned_sa_;
  std::vector<std::uint32_t> owned_buckets_;
  std::shared_ptr<mapped_file const> file_;
};

//! Accumulates documents into a corpus and builds a `rest_datastore` from it.
class rest_datastore_builder {
 public:
  //! A builder for a vocabulary of `vocab` ids.
  explicit rest_datastore_builder(std::size_t vocab) : vocab_(vocab) {
    SPECDEC_CHECK(vocab >= 1 && vocab < rest_datastore::separator, invalid_argument,
                  "rest_datastore_builder: vocabulary size ", vocab, " is outside [1, 2^32 - 1)");
  }

  //! Appends one document (ids in [0, vocab); empty documents are skipped). Throws
  //! `errc::out_of_range` naming the first bad id, `errc::context_overflow` past 2^31 - 2 entries.
  void add(std::span<token_id const> document) {
    if (document.empty()) return;
    for (std::size_t i = 0; i < document.size(); ++i)
      SPECDEC_CHECK(document[i] >= 0 && static_cast<std::size_t>(document[i]) < vocab_,
                    out_of_range, "rest_datastore_builder: token ", document[i], " at ", i,
                    " of document ", documents_, " is outside the vocabulary of ", vocab_);
    SPECDEC_CHECK(corpus_.size() + document.size() + 1 < 0x7FFFFFFFu, context_overflow,
                  "rest_datastore_builder: the corpus would exceed 2^31 - 2 entries");
    corpus_.insert(corpus_.end(), document.begin(), document.end());
    corpus_.push_back(rest_datastore::separator);
    ++documents_;
  }

  //! Corpus entries so far (tokens + separators).
  [[nodiscard]] std::size_t size() const noexcept { return corpus_.size(); }
  //! Documents so far.
  [[nodiscard]] std::size_t num_documents() const noexcept { return documents_; }

  //! Builds the datastore (the builder is left empty).
  [[nodiscard]] rest_datastore build() {
    documents_ = 0;
    return rest_datastore::build(vocab_, std::exchange(corpus_, {}));
  }

 private:
  std::size_t vocab_;
  std::size_t documents_ = 0;
  std::vector<std::uint32_t> corpus_;
};

}  // namespace specdec
