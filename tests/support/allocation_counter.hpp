#pragma once
// A counting replacement of the global operator new, for tests that check a hot path does not
// allocate: `test_support::allocations()` is the number of allocations the executable has made
// since it started (every thread), so a test compares it before and after the code it measures.
//
// The replacement functions are definitions, not inline (the standard forbids inline replacement
// allocation functions): include this header in exactly ONE translation unit of a test executable
// (each directory of tests is one executable: tests/CMakeLists.txt).
//
// Every non-aligned form is replaced, so that each allocation and its release pair up: operator new
// takes its memory from std::malloc, operator delete gives it back with std::free. The aligned
// forms keep the library's own pair and are not counted.

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

// The replacement operator delete frees with std::free what the replacement operator new got from
// std::malloc; GCC cannot see that pairing through inlined allocators and warns.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace test_support {

namespace detail {
inline std::atomic<std::size_t> allocation_count{0};

inline void* counted_malloc(std::size_t size) noexcept {
  allocation_count.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
}  // namespace detail

// Allocations through the global operator new (any non-aligned form) so far.
inline std::size_t allocations() noexcept {
  return detail::allocation_count.load(std::memory_order_relaxed);
}

}  // namespace test_support

void* operator new(std::size_t size) {
  if (void* p = test_support::detail::counted_malloc(size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  return ::operator new(size);
}
void* operator new(std::size_t size, std::nothrow_t const&) noexcept {
  return test_support::detail::counted_malloc(size);
}
void* operator new[](std::size_t size, std::nothrow_t const& tag) noexcept {
  return ::operator new(size, tag);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::nothrow_t const&) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::nothrow_t const&) noexcept {
  std::free(p);
}
