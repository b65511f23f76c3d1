#pragma once
//! \file
//! `mapped_file`: the bytes of a whole file in memory, owned by RAII: a read-only POSIX memory map
//! (the default), or a copy read into memory (`file_access::read`). Model readers open a
//! checkpoint once and point their weights into it; the `llama_weights::storage` shared_ptr keeps
//! it alive for as long as any pointer into it is in use.
//!
//! What mapping implies: the file's pages are read from disk when first touched and shared with
//! every process that maps the same file (and with the page cache), so loading is quick and a
//! model used by several processes is in memory once; but the file must stay as it is while it is
//! in use. A mapped file that is truncated (or replaced in place) while mapped makes the next
//! access to a page past its new end fail with SIGBUS, which kills the process, and a file
//! rewritten in place changes the weights under the model. Reading copies the file into private
//! memory instead: it costs the time to read it and its size in memory, and later changes to the
//! file do not affect the copy.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <span>
#include <string>

#include "specdec/core/error.hpp"
#include "specdec/detail/memory.hpp"

namespace specdec {

//! How `mapped_file::open` brings a file into memory.
enum class file_access {
  map,   //!< a read-only memory map (pages read on first use, shared; see the file comment)
  read,  //!< a private copy read into memory at open (immune to later changes of the file)
};

//! The bytes of an entire regular file: a read-only memory map, or a copy read into memory. Not
//! copyable; share it through `std::shared_ptr<mapped_file const>` (see `open`). An empty file is
//! an empty span.
class mapped_file {
 public:
  //! Maps (or reads) `path`. Throws `errc::io` (naming the file and the system's reason) when the
  //! file cannot be opened, is a directory or not a regular file, or cannot be mapped or read,
  //! and `errc::out_of_memory` when a copy does not fit in memory.
  [[nodiscard]] static std::shared_ptr<mapped_file const> open(
      std::filesystem::path const& path, file_access access = file_access::map) {
    return std::shared_ptr<mapped_file const>(new mapped_file(path, access));
  }

  mapped_file(mapped_file const&) = delete;
  mapped_file& operator=(mapped_file const&) = delete;

  ~mapped_file() {
    if (data_ == nullptr) return;
    if (access_ == file_access::map)
      ::munmap(data_, size_);
    else
      ::operator delete (data_, std::align_val_t{page_alignment});
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
  //! Whether the bytes are a memory map or a copy.
  [[nodiscard]] file_access access() const noexcept { return access_; }

 private:
  static constexpr std::size_t page_alignment = 4096;  // copies are aligned as a map would be

  mapped_file(std::filesystem::path const& path, file_access access)
      : path_(path), access_(access) {
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
    SPECDEC_CHECK(!S_ISDIR(st.st_mode), io, "'", path.string(), "' is a directory, not a file");
    SPECDEC_CHECK(S_ISREG(st.st_mode), io, "'", path.string(), "' is not a regular file");
    SPECDEC_CHECK(st.st_size >= 0, io, "'", path.string(), "' has a negative size");
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ == 0) return;
    if (access == file_access::read) {
      read_all(fd);
      return;
    }
    void* const p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int const err = errno;
      SPECDEC_THROW(io, "cannot map '", path.string(), "' (", size_,
                    " bytes): ", std::strerror(err));
    }
    data_ = p;
  }

  // Reads the whole file into a page-aligned buffer.
  void read_all(int fd) {
    data_ = detail::allocate_checked(
        size_, "mapped_file", "reading '" + path_.string() + "' into memory",
        [&] { return ::operator new (size_, std::align_val_t{page_alignment}); });
    auto* const out = static_cast<char*>(data_);
    std::size_t done = 0;
    while (done < size_) {
      ssize_t const got = ::pread(fd, out + done, size_ - done, static_cast<off_t>(done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        int const err = got < 0 ? errno : 0;
        ::operator delete (data_, std::align_val_t{page_alignment});
        data_ = nullptr;
        SPECDEC_THROW(io, "cannot read '", path_.string(), "' at byte ", done, " of ", size_, ": ",
                      err != 0 ? std::strerror(err) : "the file is shorter than its size");
      }
      done += static_cast<std::size_t>(got);
    }
  }

  std::filesystem::path path_;
  file_access access_ = file_access::map;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace specdec
