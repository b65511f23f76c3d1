#pragma once
// The proposer tests' step context: what the decoder hands a proposer at the start of a step.

#include <cstddef>
#include <span>

#include "specdec/core/philox.hpp"
#include "specdec/core/propose_context.hpp"
#include "specdec/core/types.hpp"

namespace propose_test {

// A propose_context over `tokens` with a budget of `max_nodes` draft nodes and the random stream
// `rng` (null for proposers that do not sample).
inline specdec::propose_context make_ctx(std::span<specdec::token_id const> tokens,
                                         std::size_t max_nodes, specdec::philox* rng = nullptr) {
  specdec::propose_context c;
  c.tokens = tokens;
  c.max_nodes = max_nodes;
  c.rng = rng;
  return c;
}

}  // namespace propose_test
