#pragma once
//! \file
//! `mapped_file`: a read-only POSIX memory map of a whole file, owned by RAII. Model readers map
//! a checkpoint once and point their weights into it; the `llama_weights::storage` shared_ptr
//! keeps the map alive for as long as any pointer into it is in use.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>

#include "specdec/core/error.hpp"

namespace specdec {

//! A read-only memory map of an entire regular file. Not copyable; share it through
//! `std::shared_ptr<mapped_file const>` (see `open`). An empty file maps to an empty span.
class mapped_file {
 public:
  //! Maps `path` read-only. Throws `errc::io` (naming the file and the system's reason) when the
  //! file cannot be opened, is not a regular file, or cannot be mapped.
  [[nodiscard]] static std::shared_ptr<mapped_file const> open(std::filesystem::path const& path) {
    return std::shared_ptr<mapped_file const>(new mapped_file(path));
  }

  mapped_file(mapped_file const&) = delete;
  mapped_file& operator=(mapped_file const&) = delete;

  ~mapped_file() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }

  //! The file's bytes, [size()].
  [[nodiscard]] std::span<std::byte const> bytes() const noexcept {
    return {static_cast<std::byte const*>(data_), size_};
  }
  //! The first byte (page-aligned), or null for an empty file.
  [[nodiscard]] std::byte const* data() const noexcept {
    return static_cast<std::byte const*>(data_);
  }
  //! The file size in bytes.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  //! The path the file was opened with.
  [[nodiscard]] std::filesystem::path const& path() const noexcept { return path_; }

 private:
  explicit mapped_file(std::filesystem::path const& path) : path_(path) {
    int const fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int const err = errno;
      SPECDEC_THROW(io, "cannot open '", path.string(), "': ", std::strerror(err));
    }
    struct fd_closer {
      int fd;
      ~fd_closer() { ::close(fd); }
    } const closer{fd};
    struct ::stat st {};
    if (::fstat(fd, &st) != 0) {
      int const err = errno;
      SPECDEC_THROW(io, "cannot stat '", path.string(), "': ", std::strerror(err));
    }
    SPECDEC_CHECK(S_ISREG(st.st_mode), io, "'", path.string(), "' is not a regular file");
    SPECDEC_CHECK(st.st_size >= 0, io, "'", path.string(), "' has a negative size");
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ == 0) return;
    void* const p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int const err = errno;
      SPECDEC_THROW(io, "cannot map '", path.string(), "' (", size_,
                    " bytes): ", std::strerror(err));
    }
    data_ = p;
  }

  std::filesystem::path path_;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace specdec
