#pragma once
// Checks that code throws specdec::error: the code it throws, or that it throws a given code (and
// a message with a given fragment). Code that throws nothing FAILS the test.

#include "support/doctest.hpp"

#include <exception>
#include <string>

#include "specdec/core/error.hpp"

namespace test_support {

// The code of the specdec::error that `f()` throws; fails the test when it throws none (any other
// exception propagates).
template <class F>
specdec::errc code_of(F&& f) {
  try {
    f();
  } catch (specdec::error const& e) {
    return e.code();
  }
  FAIL("no specdec::error was thrown");
  return specdec::errc::internal;
}

// Runs `f` and checks that it throws specdec::error with code `code`; returns the message.
template <class F>
std::string expect_error(F&& f, specdec::errc code) {
  try {
    f();
  } catch (specdec::error const& e) {
    CHECK_MESSAGE(e.code() == code, "expected ", specdec::to_string(code),
                  ", got: ", std::string(e.what()));
    return e.what();
  } catch (std::exception const& e) {
    FAIL("expected specdec::error, got std::exception: ", std::string(e.what()));
    return {};
  }
  FAIL("expected specdec::error (", specdec::to_string(code), "), nothing was thrown");
  return {};
}

// Runs `f` and checks that it throws specdec::error with `code` and a message containing
// `fragment`.
template <class F>
void check_error(F&& f, specdec::errc code, std::string const& fragment) {
  try {
    f();
    FAIL("expected specdec::error(", specdec::to_string(code), ") containing '", fragment, "'");
  } catch (specdec::error const& e) {
    INFO("message: ", e.what());
    CHECK(e.code() == code);
    CHECK(std::string(e.what()).find(fragment) != std::string::npos);
  }
}

}  // namespace test_support
