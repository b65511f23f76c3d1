// The tests' main: doctest's, except that a run forced onto a CPU target (SPECDEC_CPU_TARGET,
// core/cpu_target.hpp) that this build did not compile or this CPU cannot run is skipped with
// ctest's skip code (tests/CMakeLists.txt runs the kernels' tests once per target), and so is one
// forced onto the target the run without it takes (the same run twice). An unknown name is not
// skipped: the tests then fail with the library's error.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "specdec/core/cpu_target.hpp"

int main(int argc, char** argv) {
  char const* const forced = std::getenv("SPECDEC_CPU_TARGET");
  if (forced != nullptr && *forced != '\0') {
    try {
      specdec::cpu_target const t = specdec::parse_cpu_target(forced);
      if (!(specdec::cpu_target_compiled(t) && specdec::cpu_target_supported(t))) {
        std::fprintf(
            stderr, "skipped: CPU target %s is not %s\n", forced,
            specdec::cpu_target_compiled(t) ? "supported by this CPU" : "compiled in this build");
        return 77;
      }
      if (t == specdec::best_cpu_target()) {  // the run without SPECDEC_CPU_TARGET is this one
        std::fprintf(stderr, "skipped: CPU target %s is the default here (run without it)\n",
                     forced);
        return 77;
      }
    } catch (specdec::error const&) {
      // an unknown name: the tests run and fail with the library's error
    }
  }
  return doctest::Context(argc, argv).run();
}
