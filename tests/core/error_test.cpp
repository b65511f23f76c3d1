#include "specdec/core/error.hpp"

#include "support/doctest.hpp"

#include <string>

TEST_CASE("specdec::error carries a code and a message with what and where") {
  try {
    SPECDEC_THROW(bad_file, "model.bin: header says ", 7, " layers");
    FAIL("no throw");
  } catch (specdec::error const& e) {
    CHECK(e.code() == specdec::errc::bad_file);
    CHECK(std::string(e.what()) == "specdec: bad_file: model.bin: header says 7 layers");
  }
  CHECK_THROWS_AS(SPECDEC_CHECK(1 + 1 == 3, invalid_argument, "math"), specdec::error);
  CHECK_NOTHROW(SPECDEC_CHECK(1 + 1 == 2, invalid_argument, "math"));
  try {
    SPECDEC_ASSERT(2 < 1);
  } catch (specdec::error const& e) {
    CHECK(e.code() == specdec::errc::internal);
    CHECK(std::string(e.what()).find("2 < 1") != std::string::npos);
    CHECK(std::string(e.what()).find("error_test.cpp") != std::string::npos);
  }
  CHECK(specdec::to_string(specdec::errc::context_overflow) == "context_overflow");
}

TEST_CASE("specdec::error is a std::runtime_error") {
  CHECK_THROWS_AS(SPECDEC_THROW(io, "x"), std::runtime_error);
}
