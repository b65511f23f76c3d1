// The CPU heads runners (backend/cpu/heads.hpp) against the slow reference (reference/heads.hpp)
// on the fixture's trained heads and on random heads of other shapes; the same bits whatever the
// batch and the thread count; errors for bad shapes and tokens.
#include "specdec/backend/cpu/heads.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <vector>

#include "specdec/propose/hydra.hpp"
#include "specdec/propose/medusa.hpp"
#include "specdec/reference/heads.hpp"
#include "support/errors.hpp"
#include "support/fixture.hpp"
#include "support/heads.hpp"

namespace sd = specdec;
using test_support::check_error;

static_assert(sd::medusa_heads_runner<sd::cpu_medusa_heads>);
static_assert(sd::hydra_heads_runner<sd::cpu_hydra_heads>);
static_assert(!sd::medusa_heads_runner<sd::cpu_hydra_heads>);
static_assert(!sd::hydra_heads_runner<sd::cpu_medusa_heads>);

TEST_CASE("cpu heads: Medusa logits match the reference") {
  struct shape {
    std::shared_ptr<sd::medusa_weights const> heads;
    char const* name;
  };
  shape const shapes[] = {{test_support::fixture_medusa(), "fixture heads"},
                          {test_support::random_medusa(20, 37, 3, 1, 7), "dim 20, vocab 37"},
                          {test_support::random_medusa(70, 300, 2, 3, 8), "dim 70, vocab 300"}};
  for (shape const& s : shapes) {
    CAPTURE(s.name);
    sd::cpu_medusa_heads runner(s.heads);
    CHECK(runner.num_heads() == s.heads->heads.size());
    std::size_t const d = runner.hidden_size(), v = runner.vocab_size();
    std::vector<float> logits(runner.num_heads() * v);
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      std::vector<float> const h = test_support::random_floats(d, seed, 2.0f);
      runner.run(h, sd::matrix_view<float>(logits.data(), runner.num_heads(), v));
      for (std::size_t i = 0; i < runner.num_heads(); ++i)
        test_support::check_logits_close(std::span<float const>(logits).subspan(i * v, v),
                                         sd::reference_medusa_logits(*s.heads, i, h), 1e-4);
    }
  }
}

TEST_CASE("cpu heads: Hydra logits match the reference, batched or not") {
  auto const fixture_target = fixture::stories260k();
  struct shape {
    std::shared_ptr<sd::hydra_weights const> heads;
    std::shared_ptr<sd::llama_weights const> target;
    char const* name;
  };
  shape const shapes[] = {{test_support::fixture_hydra(), fixture_target, "fixture heads"},
                          {test_support::random_hydra(20, 37, 3, 1, 7),
                           test_support::embedding_only(20, 37), "dim 20, vocab 37"},
                          {test_support::random_hydra(36, 129, 2, 2, 9),
                           test_support::embedding_only(36, 129), "dim 36"}};
  for (shape const& s : shapes) {
    CAPTURE(s.name);
    sd::cpu_hydra_heads runner(s.heads, s.target);
    std::size_t const d = runner.hidden_size(), v = runner.vocab_size();
    std::vector<float> const h = test_support::random_floats(d, 3, 2.0f);
    for (std::size_t head = 0; head < runner.num_heads(); ++head) {
      CAPTURE(head);
      std::size_t const n = 5;
      std::vector<sd::token_id> paths(n * (head + 1));
      for (std::size_t k = 0; k < paths.size(); ++k)
        paths[k] = static_cast<sd::token_id>((k * 31 + head * 7 + 3) % v);
      std::vector<float> batched(n * v), single(v);
      runner.run(head, h, sd::matrix_view<sd::token_id const>(paths.data(), n, head + 1),
                 sd::matrix_view<float>(batched.data(), n, v));
      for (std::size_t r = 0; r < n; ++r) {
        std::span<sd::token_id const> const path(paths.data() + r * (head + 1), head + 1);
        test_support::check_logits_close(
            std::span<float const>(batched).subspan(r * v, v),
            sd::reference_hydra_logits(*s.heads, s.target->token_embedding, head, h, path), 1e-4);
        runner.run(head, h, sd::matrix_view<sd::token_id const>(path.data(), 1, head + 1),
                   sd::matrix_view<float>(single.data(), 1, v));
        // The batch does not change a row's bits.
        CHECK(std::equal(single.begin(), single.end(), batched.begin() + static_cast<long>(r * v)));
      }
    }
  }
}

TEST_CASE("cpu heads: the same bits with one thread or two") {
  auto const medusa = test_support::random_medusa(256, 5000, 2, 1, 21);  // large enough to split
  sd::cpu_medusa_heads one(medusa, {.threads = 1});
  sd::cpu_medusa_heads two(medusa, {.threads = 2});
  std::vector<float> const h = test_support::random_floats(256, 4, 1.0f);
  std::vector<float> a(2 * 5000), b(2 * 5000);
  one.run(h, sd::matrix_view<float>(a.data(), 2, 5000));
  two.run(h, sd::matrix_view<float>(b.data(), 2, 5000));
  CHECK(a == b);

  auto const hydra = test_support::random_hydra(256, 5000, 2, 2, 22);
  auto const target = test_support::embedding_only(256, 5000);
  sd::cpu_hydra_heads h1(hydra, target, {.threads = 1});
  sd::cpu_hydra_heads h2(hydra, target, {.threads = 2});
  std::vector<sd::token_id> const paths{1, 2, 3, 4, 4999, 0};
  std::vector<float> c(3 * 5000), e(3 * 5000);
  h1.run(1, h, sd::matrix_view<sd::token_id const>(paths.data(), 3, 2),
         sd::matrix_view<float>(c.data(), 3, 5000));
  h2.run(1, h, sd::matrix_view<sd::token_id const>(paths.data(), 3, 2),
         sd::matrix_view<float>(e.data(), 3, 5000));
  CHECK(c == e);
}

TEST_CASE("cpu heads: errors") {
  auto const medusa = test_support::random_medusa(16, 40, 2, 1, 1);
  sd::cpu_medusa_heads runner(medusa);
  std::vector<float> h(16), logits(2 * 40);
  check_error(
      [&] {
        runner.run(std::span<float const>(h).first(15), {logits.data(), 2, 40});
      },
      sd::errc::invalid_argument, "cpu_medusa_heads::run: a hidden row of 15");
  check_error(
      [&] {
        runner.run(h, {logits.data(), 1, 40});
      },
      sd::errc::invalid_argument, "logits of 1 x 40 for 2 heads");
  check_error([] { sd::cpu_medusa_heads bad(nullptr); }, sd::errc::invalid_argument, "no heads");

  auto const hydra = test_support::random_hydra(16, 40, 2, 1, 1);
  sd::cpu_hydra_heads hr(hydra, test_support::embedding_only(16, 40));
  std::vector<sd::token_id> path{3, 40};
  check_error(
      [&] {
        hr.run(1, h, {path.data(), 1, 2}, {logits.data(), 1, 40});
      },
      sd::errc::out_of_range, "token 40 of path 0 is outside the vocabulary of 40");
  check_error(
      [&] {
        hr.run(2, h, {path.data(), 1, 2}, {logits.data(), 1, 40});
      },
      sd::errc::invalid_argument, "head 2 of 2");
  check_error(
      [&] {
        hr.run(0, h, {path.data(), 1, 2}, {logits.data(), 1, 40});
      },
      sd::errc::invalid_argument, "paths of 1 x 2");
  check_error([&] { sd::cpu_hydra_heads bad(hydra, test_support::embedding_only(16, 41)); },
              sd::errc::invalid_argument, "heads of dim 16 and vocab 40 for a target of dim 16");
}
