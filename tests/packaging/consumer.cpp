// A project that uses specdec as an installed package or a subdirectory: greedy-verifies a chain.
#include <specdec/specdec.hpp>

#include <cstdio>
#include <vector>

int main() {
  std::vector<specdec::token_id> drafts{2, 1};
  auto tree = specdec::draft_tree::chain(0, drafts);
  if (tree.size() != 3 || tree.depth(2) != 2 || !tree.is_ancestor_or_self(1, 2)) {
    std::puts("draft_tree misbehaves");
    return 1;
  }
  specdec::philox rng(42);
  float const u = rng.uniform();
  if (!(u >= 0.0f && u < 1.0f)) return 1;
  std::puts("ok");
  return 0;
}
