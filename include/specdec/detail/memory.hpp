#pragma once
//! \file
//! Checked allocation: the memory this process can still use (Linux's MemAvailable, within the
//! control group's limit when there is one), a check of an allocation against it before it is
//! made, and `std::bad_alloc` turned into `errc::out_of_memory`. Both errors say what was being
//! allocated, how much and why, where a bare `std::bad_alloc` would say nothing. Internals
//! (namespace `specdec::detail`), not API.
//!
//! The check is a guard against requests that cannot fit (a file's context length of 2^24
//! positions, a model larger than the machine), not an accountant: allocations below
//! `checked_allocation_floor` are not checked, and where the available memory cannot be read
//! the allocation is attempted and only a `std::bad_alloc` is converted.
//!
//! Also the cache-line alignment of the buffers the CPU kernels stream (`cache_line`,
//! `cache_aligned_allocator`, `aligned_array`): a vector load of a row that starts at a multiple of
//! 16 floats of such a buffer never spans two cache lines, which on x86 halves the loads a
//! matrix product can issue per cycle.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "specdec/core/error.hpp"

namespace specdec::detail {

//! The alignment (bytes) of `cache_aligned_allocator` and `allocate_aligned`.
inline constexpr std::size_t cache_line = 64;

//! A standard allocator of cache-line-aligned storage (for `std::vector`).
template <class T>
struct cache_aligned_allocator {
  using value_type = T;
  cache_aligned_allocator() noexcept = default;
  template <class U>
  cache_aligned_allocator(cache_aligned_allocator<U> const&) noexcept {}  // NOLINT: rebinding
  [[nodiscard]] T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{cache_line}));
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete (p, std::align_val_t{cache_line});
  }
  template <class U>
  bool operator==(cache_aligned_allocator<U> const&) const noexcept {
    return true;
  }
};

//! Releases what `allocate_aligned` returned.
struct aligned_delete {
  void operator()(void* p) const noexcept { ::operator delete (p, std::align_val_t{cache_line}); }
};

//! An owned array of cache-line-aligned, trivially destructible values.
template <class T>
using aligned_array = std::unique_ptr<T[], aligned_delete>;

//! `count` uninitialised values of a trivial type T, cache-line aligned (throws std::bad_alloc).
template <class T>
[[nodiscard]] aligned_array<T> allocate_aligned(std::size_t count) {
  static_assert(std::is_trivially_default_constructible_v<T> &&
                std::is_trivially_destructible_v<T>);
  return aligned_array<T>(
      static_cast<T*>(::operator new (count * sizeof(T), std::align_val_t{cache_line})));
}

//! Allocations smaller than this are not checked against the available memory.
inline constexpr std::uint64_t checked_allocation_floor = std::uint64_t{64} << 20;

//! `bytes` for messages, in binary units: "512 bytes", "3.2 MiB", "2.5 GiB".
[[nodiscard]] inline std::string byte_text(std::uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  char const* const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  std::size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

//! The first number in the file at `path` (a /proc or /sys value), or nullopt.
[[nodiscard]] inline std::optional<std::uint64_t> read_number(char const* path) {
  std::ifstream in(path);
  std::uint64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

//! Bytes this process can still allocate without swapping, or nullopt when unknown: MemAvailable
//! of /proc/meminfo, lowered to the headroom of the cgroup v2 limit (memory.max minus
//! memory.current) when the process runs under one.
[[nodiscard]] inline std::optional<std::uint64_t> available_memory() {
  std::optional<std::uint64_t> available;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  auto const limit = read_number("/sys/fs/cgroup/memory.max");  // "max" reads as no number
  auto const used = read_number("/sys/fs/cgroup/memory.current");
  if (limit && used) {
    std::uint64_t const headroom = *limit > *used ? *limit - *used : 0;
    available = available ? std::min(*available, headroom) : headroom;
  }
  return available;
}

//! Throws `errc::out_of_memory` ("<who>: <what> needs N but only M of memory is available")
//! when `bytes` is at least `checked_allocation_floor` and more than `available_memory()`.
inline void check_memory(std::uint64_t bytes, std::string_view who, std::string_view what) {
  if (bytes < checked_allocation_floor) return;
  auto const available = available_memory();
  SPECDEC_CHECK(!available || bytes <= *available, out_of_memory, who, ": ", what, " needs ",
                byte_text(bytes), " but only ", byte_text(available.value_or(0)),
                " of memory is available");
}

//! Checks `bytes` (`check_memory`), then returns `allocate()`, turning a `std::bad_alloc` into
//! `errc::out_of_memory` naming `who`, `what` and the size.
template <class F>
decltype(auto) allocate_checked(std::uint64_t bytes, std::string_view who, std::string_view what,
                                F&& allocate) {
  check_memory(bytes, who, what);
  try {
    return std::forward<F>(allocate)();
  } catch (std::bad_alloc const&) {
    SPECDEC_THROW(out_of_memory, who, ": ", what, " needs ", byte_text(bytes),
                  ", which could not be allocated");
  }
}

}  // namespace specdec::detail
