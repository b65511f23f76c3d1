#pragma once
// Minimal verifiers for tests that must not depend on verify/: greedy verification of chains and
// trees (accept the child equal to the policy's greedy token; the bonus is that token).

#include <span>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"

namespace toy {

struct greedy_stand_in_verifier {
  static constexpr bool greedy_only = true;
  template <class Policy>
  void verify(specdec::draft_tree const& tree, specdec::matrix_view<float const> logits,
              Policy const& policy, std::span<specdec::token_id const> history,
              specdec::philox& rng, specdec::verify_result& out) {
    out.clear();
    specdec::node_index at = 0;
    for (;;) {
      specdec::token_id const best =
          policy.greedy_token(logits.at_row(static_cast<std::size_t>(at)), history);
      specdec::node_index const child = tree.find_child(at, best);
      if (child < 0) {
        out.tokens.push_back(best);
        break;
      }
      out.accepted_nodes.push_back(child);
      out.tokens.push_back(best);
      at = child;
    }
    rng.skip(tree.size());
  }
};

}  // namespace toy
