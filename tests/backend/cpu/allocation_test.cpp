// A forward does not allocate once its buffers have grown to the batch size (and the result's
// vectors to their sizes): counted by the replacement global operator new of
// tests/support/allocation_counter.hpp.
#include "support/doctest.hpp"

#include <numeric>
#include <vector>

#include "backend/cpu/test_models.hpp"
#include "specdec/backend/cpu/llama.hpp"
#include "support/allocation_counter.hpp"
#include "support/llama_shapes.hpp"

namespace sd = specdec;
namespace st = specdec::test;

TEST_CASE("cpu_llama: no allocation in forward after warm-up") {
  auto w = st::random_llama(test_support::shapes::odd_gqa(), 61);
  sd::cpu_llama m(w, {.threads = 2, .batch_capacity = 4});
  std::vector<sd::token_id> tokens(12, 3);
  std::vector<sd::position_t> positions(12);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<std::int32_t> const rows{11};
  sd::forward_result out;
  auto forward = [&](std::size_t first, std::size_t n, bool want_hidden, bool last_only) {
    sd::forward_request req;
    req.tokens = std::span<sd::token_id const>(tokens).subspan(first, n);
    req.positions = std::span<sd::position_t const>(positions).subspan(first, n);
    req.want_hidden = want_hidden;
    req.hidden_layer = want_hidden ? 1 : -1;
    if (last_only) req.logits_rows = rows;
    m.forward(req, out);
  };
  // Warm-up: the largest batch (grows the buffers past batch_capacity) and the largest outputs.
  forward(0, 12, true, false);
  m.reset();
  std::size_t const before = test_support::allocations();
  forward(0, 12, true, true);  // prefill with one logits row
  m.cache().truncate(5);
  for (std::size_t i = 5; i < 12; ++i) forward(i, 1, false, false);  // decode steps
  m.cache().truncate(6);
  forward(6, 6, true, false);  // a verification batch
  CHECK(test_support::allocations() == before);
}
