#pragma once
//! \file
//! Bounds-checked little-endian reading of mapped bytes, overflow-checked size arithmetic, the
//! finiteness check of weights, and a checked binary file writer: the building blocks of the model
//! readers and writers.

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
