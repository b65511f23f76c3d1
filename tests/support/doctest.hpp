#pragma once
// doctest for the tests: <doctest/doctest.h>, with a `char const*` (or `char*`) in a message, a
// capture or a failed check printed as the string it points to. doctest 2.4.9 (Debian's) prints
// every pointer as an address, and its own switch for strings, DOCTEST_CONFIG_TREAT_CHAR_STAR_AS_
// STRING, does not compile there; StringMaker is its documented place for such a conversion.

#include <doctest/doctest.h>

#if DOCTEST_VERSION_MAJOR == 2 && DOCTEST_VERSION_MINOR == 4 && DOCTEST_VERSION_PATCH <= 9
namespace doctest {
template <>
struct StringMaker<char const*> {
  static String convert(char const* s) { return s != nullptr ? String(s) : String("nullptr"); }
};
template <>
struct StringMaker<char*> {
  static String convert(char const* s) { return StringMaker<char const*>::convert(s); }
};
}  // namespace doctest
#endif
