#pragma once
//! \file
//! `specdec::error`, its error codes, and the macros that raise it with a message saying what
//! went wrong and where.

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace specdec {

//! What kind of failure an `error` reports.
enum class errc {
  invalid_argument,  //!< a parameter or configuration value is out of its documented domain
  out_of_range,      //!< an index, token id or position lies outside its container or vocabulary
  bad_file,          //!< a file is truncated, corrupt, or its header disagrees with its contents
  unsupported,       //!< a valid input that this version does not handle (a tensor type, a format)
  context_overflow,  //!< a sequence or cache would grow beyond its capacity
  numerical,      //!< NaN or Inf where finite values are required, or a distribution with no mass
  io,             //!< the operating system refused a file operation
  internal,       //!< a broken internal invariant (a bug in specdec)
  out_of_memory,  //!< an allocation needs more memory than the machine has available
};

//! A short name for an error code, e.g. "bad_file".
[[nodiscard]] constexpr std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::out_of_range:
      return "out_of_range";
    case errc::bad_file:
      return "bad_file";
    case errc::unsupported:
      return "unsupported";
    case errc::context_overflow:
      return "context_overflow";
    case errc::numerical:
      return "numerical";
    case errc::io:
      return "io";
    case errc::internal:
      return "internal";
    case errc::out_of_memory:
      return "out_of_memory";
  }
  return "unknown";
}

//! The one exception type specdec throws. `what()` says what is wrong and where.
class error : public std::runtime_error {
 public:
  //! \param code the failure kind; \param message what went wrong and where.
  error(errc code, std::string const& message)
      : std::runtime_error("specdec: " + std::string(to_string(code)) + ": " + message),
        code_(code) {}

  //! The failure kind.
  [[nodiscard]] errc code() const noexcept { return code_; }

 private:
  errc code_;
};

namespace detail {

//! Concatenates streamable values into one string (libstdc++ 12 has no std::format).
template <class... Args>
[[nodiscard]] std::string concat(Args const&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

//! `e` with `context` put before its message: "specdec: <code>: <context><message>", the same
//! failure as seen by a caller that says where it happened (e.g. "segment 2: ").
[[nodiscard]] inline error with_context(error const& e, std::string_view context) {
  std::string_view what = e.what();
  std::string const head = "specdec: " + std::string(to_string(e.code())) + ": ";
  if (what.substr(0, head.size()) == head) what.remove_prefix(head.size());
  return error(e.code(), std::string(context) + std::string(what));
}

}  // namespace detail
}  // namespace specdec

//! Throws `specdec::error` with the code `errc::CODE` and a message built from the remaining
//! arguments (streamed one after another).
#define SPECDEC_THROW(CODE, ...) \
  throw ::specdec::error(::specdec::errc::CODE, ::specdec::detail::concat(__VA_ARGS__))

//! Throws `specdec::error(errc::CODE, message...)` unless COND holds.
#define SPECDEC_CHECK(COND, CODE, ...)  \
  do {                                  \
    if (!(COND)) [[unlikely]] {         \
      SPECDEC_THROW(CODE, __VA_ARGS__); \
    }                                   \
  } while (false)

//! Checks an internal invariant; a failure is a bug in specdec and throws `errc::internal` naming
//! the condition, file and line.
#define SPECDEC_ASSERT(COND)                                                                \
  do {                                                                                      \
    if (!(COND)) [[unlikely]] {                                                             \
      SPECDEC_THROW(internal, "assertion '" #COND "' failed at ", __FILE__, ":", __LINE__); \
    }                                                                                       \
  } while (false)
