#pragma once
// The CPU model options of the decode tests' models: one thread each (ctest runs the test
// programs side by side, and their outputs do not depend on the thread count).

#include "specdec/backend/cpu/llama.hpp"

namespace decode_test {

inline specdec::cpu_llama_options one_thread() {
  return {.threads = 1};
}

}  // namespace decode_test
