#pragma once
// The host verifiers (verify/*.hpp) and the speculative decoder, as the CUDA tests (compiled by
// nvcc) include them. nvcc's front end flags a lambda that captures a not yet filled local array by
// reference as a use before set (diagnostic 549) in the host verifiers' block reductions; the host
// compiler does not. The suppression covers these host-only headers and nothing else.

#if defined(__NVCC__)
#pragma nv_diag_suppress 549
#endif
#include "specdec/decode/speculative_decoder.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/speculative_sampling.hpp"
#include "specdec/verify/tree_sampling.hpp"
#if defined(__NVCC__)
#pragma nv_diag_default 549
#endif
