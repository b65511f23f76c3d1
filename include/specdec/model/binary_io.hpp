#pragma once
//! \file
//! Bounds-checked little-endian reading of mapped bytes, overflow-checked size arithmetic, the
//! finiteness check of weights, a streaming checksum and a checked binary file writer: the building
//! blocks of the model readers and writers.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "specdec/core/error.hpp"
#include "specdec/detail/rows.hpp"

namespace specdec {

static_assert(std::endian::native == std::endian::little,
              "specdec's model readers assume a little-endian host (as the file formats are)");

namespace detail {

//! a * b, throwing `errc::bad_file` (naming `where` and `what`) if it overflows 64 bits.
[[nodiscard]] inline std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b,
                                               std::string_view where, std::string_view what) {
  SPECDEC_CHECK(a == 0 || b <= std::numeric_limits<std::uint64_t>::max() / a, bad_file, where, ": ",
                what, " overflows (", a, " * ", b, ")");
  return a * b;
}

//! a + b, throwing `errc::bad_file` (naming `where` and `what`) if it overflows 64 bits.
[[nodiscard]] inline std::uint64_t checked_add(std::uint64_t a, std::uint64_t b,
                                               std::string_view where, std::string_view what) {
  SPECDEC_CHECK(b <= std::numeric_limits<std::uint64_t>::max() - a, bad_file, where, ": ", what,
                " overflows (", a, " + ", b, ")");
  return a + b;
}

//! Throws `errc::bad_file` ("<where>: tensor '<tensor>' holds -inf at element i ...") unless
//! every one of x[0..n) is finite: a model reader checks every float32 weight it hands out, in one
//! vectorised pass (`first_non_finite`), so that a corrupt weight fails the load in every build
//! rather than propagating NaNs whose effect depends on the kernels' order of operations.
inline void check_finite(float const* x, std::uint64_t n, std::string_view where,
                         std::string_view tensor) {
  std::size_t const i = first_non_finite(x, static_cast<std::size_t>(n));
  if (i == n) [[likely]]
    return;
  SPECDEC_THROW(bad_file, where, ": tensor '", tensor, "' holds ", x[i], " at element ", i, " of ",
                n, " (weights must be finite)");
}

//! A streaming 64-bit checksum over bytes: four independent multiply-rotate lanes over 32-byte
//! blocks (the round of xxHash64, though the result is not xxHash64), merged and avalanched at
//! the end. Any change of one bit changes the digest; it is not cryptographic.
class checksum64 {
 public:
  //! Adds `bytes` to the checksummed stream.
  void update(std::span<std::byte const> bytes) noexcept {
    if (bytes.empty()) return;
    total_ += bytes.size();
    std::size_t i = 0;
    if (buffered_ != 0) {
      std::size_t const take = std::min(bytes.size(), block - buffered_);
      std::memcpy(buffer_ + buffered_, bytes.data(), take);
      buffered_ += take;
      i = take;
      if (buffered_ < block) return;
      consume(buffer_);
      buffered_ = 0;
    }
    for (; i + block <= bytes.size(); i += block) consume(bytes.data() + i);
    std::size_t const rest = bytes.size() - i;
    if (rest != 0) std::memcpy(buffer_, bytes.data() + i, rest);
    buffered_ = rest;
  }

  //! The checksum of everything added so far (the stream may continue afterwards).
  [[nodiscard]] std::uint64_t digest() const noexcept {
    std::uint64_t h = std::rotl(lane_[0], 1) + std::rotl(lane_[1], 7) + std::rotl(lane_[2], 12) +
                      std::rotl(lane_[3], 18);
    for (std::uint64_t const v : lane_) h = (h ^ round(0, v)) * prime1 + prime4;
    h += static_cast<std::uint64_t>(total_);
    std::size_t i = 0;
    for (; i + 8 <= buffered_; i += 8)
      h = std::rotl(h ^ round(0, load(buffer_ + i)), 27) * prime1 + prime4;
    for (; i < buffered_; ++i)
      h = std::rotl(h ^ (std::to_integer<std::uint64_t>(buffer_[i]) * prime5), 11) * prime1;
    h ^= h >> 33;
    h *= prime2;
    h ^= h >> 29;
    h *= prime3;
    h ^= h >> 32;
    return h;
  }

  //! The checksum of `bytes` alone.
  [[nodiscard]] static std::uint64_t of(std::span<std::byte const> bytes) noexcept {
    checksum64 c;
    c.update(bytes);
    return c.digest();
  }

 private:
  static constexpr std::size_t block = 32;
  static constexpr std::uint64_t prime1 = 0x9E3779B185EBCA87ull;
  static constexpr std::uint64_t prime2 = 0xC2B2AE3D27D4EB4Full;
  static constexpr std::uint64_t prime3 = 0x165667B19E3779F9ull;
  static constexpr std::uint64_t prime4 = 0x85EBCA77C2B2AE63ull;
  static constexpr std::uint64_t prime5 = 0x27D4EB2F165667C5ull;

  static std::uint64_t load(std::byte const* p) noexcept {
    std::uint64_t v = 0;
    std::memcpy(&v, p, 8);
    if constexpr (std::endian::native == std::endian::big) {
      std::uint64_t r = 0;
      for (int k = 0; k < 8; ++k) r = (r << 8) | ((v >> (8 * k)) & 0xFFu);
      v = r;
    }
    return v;
  }
  static std::uint64_t round(std::uint64_t acc, std::uint64_t v) noexcept {
    return std::rotl(acc + v * prime2, 31) * prime1;
  }
  void consume(std::byte const* p) noexcept {
    for (std::size_t k = 0; k < 4; ++k) lane_[k] = round(lane_[k], load(p + 8 * k));
  }

  std::uint64_t lane_[4] = {prime1 + prime2, prime2, 0, 0 - prime1};
  std::byte buffer_[block] = {};
  std::size_t buffered_ = 0;
  std::uint64_t total_ = 0;
};

//! A cursor over a byte span that reads little-endian values, throwing `errc::bad_file` (with the
//! file name, the offset and what was being read) instead of reading past the end.
class byte_reader {
 public:
  //! Reads `bytes`; `where` names the source (a file name) in error messages.
  byte_reader(std::span<std::byte const> bytes, std::string where)
      : bytes_(bytes), where_(std::move(where)) {}

  //! Bytes read so far (the current offset).
  [[nodiscard]] std::uint64_t offset() const noexcept { return offset_; }
  //! Bytes left.
  [[nodiscard]] std::uint64_t remaining() const noexcept { return bytes_.size() - offset_; }
  //! The source name given at construction.
  [[nodiscard]] std::string const& where() const noexcept { return where_; }

  //! Throws unless `count` more bytes are available for `what`.
  void require(std::uint64_t count, std::string_view what) const {
    SPECDEC_CHECK(count <= remaining(), bad_file, where_, ": truncated: ", what, " needs ", count,
                  " bytes at offset ", offset_, " but the file has ", bytes_.size(), " bytes");
  }

  //! Reads one trivially copyable value (unaligned reads are fine).
  template <class T>
  [[nodiscard]] T read(std::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    require(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  //! Returns the next `count` bytes and moves past them.
  [[nodiscard]] std::span<std::byte const> take(std::uint64_t count, std::string_view what) {
    require(count, what);
    auto const s =
        bytes_.subspan(static_cast<std::size_t>(offset_), static_cast<std::size_t>(count));
    offset_ += count;
    return s;
  }

  //! Skips `count` bytes.
  void skip(std::uint64_t count, std::string_view what) { (void)take(count, what); }

  //! Moves to absolute offset `offset` (<= size).
  void seek(std::uint64_t offset, std::string_view what) {
    SPECDEC_CHECK(offset <= bytes_.size(), bad_file, where_, ": ", what, " at offset ", offset,
                  " lies beyond the end of the file (", bytes_.size(), " bytes)");
    offset_ = offset;
  }

 private:
  std::span<std::byte const> bytes_;
  std::string where_;
  std::uint64_t offset_ = 0;
};

//! A binary file writer that throws `errc::io` (naming the file) when the file cannot be created
//! or a write fails.
class binary_writer {
 public:
  //! Creates (truncates) `path`.
  explicit binary_writer(std::filesystem::path const& path)
      : path_(path), out_(path, std::ios::binary | std::ios::trunc) {
    SPECDEC_CHECK(out_.is_open(), io, "cannot create '", path.string(), "'");
  }

  //! Writes `size` raw bytes.
  void write_bytes(void const* data, std::size_t size) {
    if (size == 0) return;
    SPECDEC_CHECK(size <= static_cast<std::size_t>(std::numeric_limits<std::streamsize>::max()), io,
                  "write of ", size, " bytes to '", path_.string(), "' is too large");
    out_.write(static_cast<char const*>(data), static_cast<std::streamsize>(size));
    SPECDEC_CHECK(out_.good(), io, "write to '", path_.string(), "' failed at byte ", written_);
    written_ += size;
  }

  //! Writes one trivially copyable value as its (little-endian) bytes.
  template <class T>
  void write(T const& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    write_bytes(&value, sizeof(T));
  }

  //! Writes `count` zero bytes.
  void write_zeros(std::size_t count) {
    char const zeros[64] = {};
    while (count > 0) {
      std::size_t const n = count < sizeof(zeros) ? count : sizeof(zeros);
      write_bytes(zeros, n);
      count -= n;
    }
  }

  //! Bytes written so far.
  [[nodiscard]] std::uint64_t written() const noexcept { return written_; }

  //! Flushes and closes, throwing `errc::io` on failure (the destructor closes silently).
  void close() {
    out_.flush();
    SPECDEC_CHECK(out_.good(), io, "flushing '", path_.string(), "' failed");
    out_.close();
    SPECDEC_CHECK(!out_.fail(), io, "closing '", path_.string(), "' failed");
  }

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  std::uint64_t written_ = 0;
};

}  // namespace detail
}  // namespace specdec
