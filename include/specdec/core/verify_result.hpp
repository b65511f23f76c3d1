#pragma once
//! \file
//! `verify_result`: what a verifier decided for one sequence in one step.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "specdec/core/types.hpp"

namespace specdec {

//! The accepted path of a draft tree plus the bonus token.
//!
//! `accepted_nodes` lists the accepted draft nodes in depth order (root excluded), `tokens` their
//! tokens followed by the bonus token, so `tokens.size() == accepted_nodes.size() + 1`. The bonus
//! token is sampled from the target at the last accepted node (the correction after a rejection,
//! or the extra token after a full acceptance). Buffers keep their capacity across `clear()`.
struct verify_result {
  std::vector<node_index> accepted_nodes;  //!< [num_accepted], node indices, depth order
  std::vector<token_id> tokens;            //!< [num_accepted + 1], accepted tokens then the bonus

  //! Number of accepted draft tokens.
  [[nodiscard]] std::size_t num_accepted() const noexcept { return accepted_nodes.size(); }
  //! The token sampled after the accepted path.
  [[nodiscard]] token_id bonus() const noexcept {
    return tokens.empty() ? no_token : tokens.back();
  }
  //! The node whose target row produced the bonus token (0 = the root).
  [[nodiscard]] node_index last_node() const noexcept {
    return accepted_nodes.empty() ? 0 : accepted_nodes.back();
  }
  //! Empties both lists, keeping capacity.
  void clear() noexcept {
    accepted_nodes.clear();
    tokens.clear();
  }
};

}  // namespace specdec
