// target_handle: forwards reach the sequence's cache (a single model's, or one slot of a batched
// model's), rollback keeps the committed positions, a handle on nothing says so.
#include "specdec/core/target_handle.hpp"

#include "support/doctest.hpp"

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "specdec/core/batch_forward.hpp"
#include "specdec/core/traits.hpp"
#include "support/errors.hpp"
#include "support/toy_model.hpp"

namespace sd = specdec;

namespace {

// A batched model of toy_lm slots (forwards one segment at a time): enough for a slot handle.
class toy_slots {
 public:
  toy_slots(std::size_t vocab, std::size_t context, std::size_t slots) {
    for (std::size_t s = 0; s < slots; ++s) models_.emplace_back(vocab, context);
  }
  std::size_t vocab_size() const { return models_[0].vocab_size(); }
  std::size_t max_context() const { return models_[0].max_context(); }
  toy::toy_cache& cache(std::size_t slot) { return models_.at(slot).cache(); }
  void forward(sd::batch_forward_request const& req, sd::batch_forward_result& out) {
    REQUIRE(req.segments.size() == 1);
    models_.at(req.segments[0].slot).forward(req.request(0), out.rows);
    out.set_offsets(req);
    ++forwards;
  }
  toy::toy_lm& model(std::size_t slot) { return models_.at(slot); }
  std::size_t forwards = 0;

 private:
  std::vector<toy::toy_lm> models_;
};

std::vector<sd::position_t> positions(std::size_t from, std::size_t n) {
  std::vector<sd::position_t> p(n);
  std::iota(p.begin(), p.end(), static_cast<sd::position_t>(from));
  return p;
}

// Fills the committed part (3 tokens) through `cache_forward`, then drives `h` as a proposer would.
template <class Forward>
void check_handle(sd::target_handle h, Forward&& full_forward, toy::toy_cache& cache) {
  std::vector<sd::token_id> const prompt{1, 2, 3};
  std::vector<sd::position_t> const at = positions(0, 3);
  sd::forward_result out;
  full_forward(sd::forward_request{.tokens = prompt, .positions = at}, out);
  h.set_committed(3);
  CHECK(h.committed() == 3);
  CHECK(h.size() == 3);
  CHECK(h.vocab_size() == 11);
  CHECK(h.capacity() == 32);
  std::vector<sd::token_id> const draft{4, 5};
  std::vector<sd::position_t> const after = positions(3, 2);
  std::int32_t const skip[] = {1};
  h.forward({.tokens = draft, .positions = after, .skip_layers = skip}, out);
  CHECK(out.logits_count == 2);
  CHECK(h.size() == 5);
  CHECK(cache.skipped()[4] == 1);  // a draft entry
  test_support::check_error([&] { h.rollback(2); }, sd::errc::invalid_argument,
                            "the committed positions stay");
  test_support::check_error([&] { h.rollback(6); }, sd::errc::invalid_argument, "outside [3, 5]");
  h.rollback(4);
  CHECK(h.size() == 4);
  h.rollback();
  CHECK(h.size() == 3);
  CHECK(cache.size() == 3);
  // A full forward after the rollback sees the committed entries only (the toy model would throw
  // on a draft entry).
  std::vector<sd::token_id> const root{4};
  std::vector<sd::position_t> const at3 = positions(3, 1);
  CHECK_NOTHROW(full_forward(sd::forward_request{.tokens = root, .positions = at3}, out));
}

}  // namespace

TEST_CASE("target_handle on a single model: forwards after the committed entries, rollback") {
  toy::toy_lm model(11, 32);
  check_handle(
      sd::target_handle(model),
      [&](sd::forward_request const& req, sd::forward_result& out) { model.forward(req, out); },
      model.cache());
  static_assert(sd::supports_skip_layers_v<toy::toy_lm>);
  static_assert(!sd::supports_skip_layers_v<toy_slots>);
}

TEST_CASE("target_handle on a slot of a batched model: one-segment forwards on that slot") {
  toy_slots model(11, 32, 3);
  sd::batch_forward_result scratch;
  sd::target_handle const h(model, 1, scratch);
  check_handle(
      h,
      [&](sd::forward_request const& req, sd::forward_result& out) {
        model.model(1).forward(req, out);
      },
      model.cache(1));
  CHECK(model.forwards == 1);  // the draft forward went through the batched model
  CHECK(model.cache(0).size() == 0);
  CHECK(model.cache(2).size() == 0);
}

TEST_CASE("target_handle on nothing names what is missing") {
  sd::target_handle const h;
  CHECK(!h.valid());
  sd::forward_result out;
  test_support::check_error([&] { h.forward({}, out); }, sd::errc::invalid_argument,
                            "target_handle: no target");
  test_support::check_error([&] { (void)h.size(); }, sd::errc::invalid_argument, "no target");
}
