// cpu_block_drafter (backend/cpu/block_drafter.hpp): the training script's golden vectors of the
// drafters trained for the fixture (tools/block), the slow double-precision reference
// (reference/block_drafter.hpp) at several context lengths, a context extended in pieces against
// one extended at once (bit for bit), the Markov bias and the confidence against the formulas, and
// the runner's errors.
#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/backend/cpu/block_drafter.hpp"
#include "specdec/reference/block_drafter.hpp"
#include "support/block.hpp"
#include "support/errors.hpp"

namespace block_drafter_test {

namespace sd = specdec;

// Largest |got - want| / (1 + |want|).
inline double worst(std::span<float const> got, std::span<float const> want) {
  REQUIRE(got.size() == want.size());
  double w = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i)
    w = std::max(w, std::abs(static_cast<double>(got[i]) - want[i]) /
                        (1.0 + std::abs(static_cast<double>(want[i]))));
  return w;
}

// The golden file's context features [T, F] and sequence.
struct golden_case {
  std::vector<float> features;
  std::vector<std::int64_t> sequence;
  std::size_t rows = 0;
};

inline golden_case golden_of(sd::safetensors_file const& g, std::size_t width) {
  golden_case c;
  c.features = g.read("features");
  c.sequence = test_support::tensor_integers(g, "sequence");
  c.rows = c.sequence.size() - 1;
  REQUIRE(c.features.size() == c.rows * width);
  return c;
}

}  // namespace block_drafter_test

TEST_CASE("cpu block drafter: the training script's golden vectors (tools/block/*/golden)") {
  using namespace block_drafter_test;
  for (char const* kind : {"dflash", "dspark"}) {
    CAPTURE(kind);
    bool const dspark = std::string(kind) == "dspark";
    auto const w = dspark ? test_support::fixture_dspark() : test_support::fixture_dflash();
    sd::safetensors_file const g(test_support::block_dir(kind) / "golden.safetensors");
    sd::cpu_block_drafter runner(w);
    std::size_t const d = runner.hidden_size(), f = runner.feature_width(), v = runner.vocab_size(),
                      b = runner.block_size();
    CHECK(runner.dspark() == dspark);
    golden_case const c = golden_of(g, f);
    runner.extend(sd::matrix_view<float const>(c.features.data(), c.rows, f));
    CHECK(runner.context() == c.rows);
    std::vector<float> out(b * d), logits((b - 1) * v);
    runner.block(static_cast<sd::token_id>(c.sequence.back()),
                 sd::matrix_view<float>(out.data(), b, d));
    CHECK(runner.context() == c.rows);  // the block's rows are gone again
    CHECK(worst(out, g.read("block_out")) < 1e-4);
    runner.logits(sd::matrix_view<float const>(out.data() + d, b - 1, d),
                  sd::matrix_view<float>(logits.data(), b - 1, v));
    CHECK(worst(logits, g.read("block_logits")) < 1e-4);
    // The greedy chain (DSpark: the Markov bias after the previous token, and the confidence).
    std::vector<std::int64_t> const chain = test_support::tensor_integers(g, "chain_tokens");
    REQUIRE(chain.size() == b - 1);
    std::vector<float> const chain_logits = dspark ? g.read("chain_logits") : std::vector<float>{};
    std::vector<float> const chain_conf =
        dspark ? g.read("chain_confidence") : std::vector<float>{};
    sd::token_id prev = static_cast<sd::token_id>(c.sequence.back());
    for (std::size_t i = 1; i < b; ++i) {
      CAPTURE(i);
      std::span<float> const row(logits.data() + (i - 1) * v, v);
      if (dspark) {
        runner.add_markov(prev, row);
        CHECK(worst(row, std::span<float const>(chain_logits).subspan((i - 1) * v, v)) < 1e-4);
      }
      auto const y =
          static_cast<sd::token_id>(std::max_element(row.begin(), row.end()) - row.begin());
      CHECK(y == chain[i - 1]);
      if (dspark)
        CHECK(runner.confidence(std::span<float const>(out.data() + i * d, d), y, i) ==
              doctest::Approx(chain_conf[i - 1]).epsilon(1e-5));
      prev = y;
    }
  }
}

TEST_CASE("cpu block drafter: blocks against the slow reference, contexts fed in pieces") {
  using namespace block_drafter_test;
  auto const w = test_support::fixture_dspark();
  sd::safetensors_file const g(test_support::block_dir("dspark") / "golden.safetensors");
  std::size_t const f = w->feature_width(), d = w->dim, b = w->config.block_size, v = w->vocab;
  golden_case const c = golden_of(g, f);
  for (std::size_t t : {std::size_t{0}, std::size_t{1}, std::size_t{5}, c.rows}) {
    CAPTURE(t);
    sd::matrix_view<float const> const feats(c.features.data(), t, f);
    auto const root = static_cast<sd::token_id>(c.sequence[t]);
    auto const want = sd::reference_block_outputs(*w, feats, root);
    // At once.
    sd::cpu_block_drafter once(w);
    once.extend(feats);
    std::vector<float> a(b * d);
    once.block(root, sd::matrix_view<float>(a.data(), b, d));
    double err = 0.0;
    for (std::size_t i = 0; i < b; ++i)
      for (std::size_t j = 0; j < d; ++j)
        err = std::max(err, std::abs(a[i * d + j] - want[i][j]) / (1.0 + std::abs(want[i][j])));
    CHECK(err < 1e-4);
    // In pieces of 1, 2, 3, ... rows, with blocks run in between: the same bits.
    sd::cpu_block_drafter pieces(w, {.max_context = 64});
    std::vector<float> scratch(b * d), bits(b * d);
    for (std::size_t at = 0, n = 1; at < t; at += n, ++n) {
      std::size_t const m = std::min(n, t - at);
      pieces.extend(sd::matrix_view<float const>(c.features.data() + at * f, m, f));
      pieces.block(static_cast<sd::token_id>(c.sequence[at + m]),
                   sd::matrix_view<float>(scratch.data(), b, d));
    }
    pieces.block(root, sd::matrix_view<float>(bits.data(), b, d));
    CHECK(bits == a);
    // Logits with the Markov bias, against the reference's.
    std::vector<float> row(v);
    pieces.logits(sd::matrix_view<float const>(bits.data() + d, 1, d),
                  sd::matrix_view<float>(row.data(), 1, v));
    pieces.add_markov(root, row);
    std::vector<double> const want_row = sd::reference_block_logits(*w, want[1], root);
    double lerr = 0.0;
    for (std::size_t j = 0; j < v; ++j)
      lerr = std::max(lerr, std::abs(row[j] - want_row[j]) / (1.0 + std::abs(want_row[j])));
    CHECK(lerr < 1e-4);
    // A context cut back and extended again gives the same block.
    if (t > 1) {
      pieces.truncate(t / 2);
      CHECK(pieces.context() == t / 2);
      pieces.extend(sd::matrix_view<float const>(c.features.data() + (t / 2) * f, t - t / 2, f));
      pieces.block(root, sd::matrix_view<float>(scratch.data(), b, d));
      CHECK(scratch == a);
    }
  }
}

TEST_CASE("cpu block drafter: errors name what is wrong") {
  using namespace block_drafter_test;
  using test_support::check_error;
  auto const dflash = test_support::fixture_dflash();
  sd::cpu_block_drafter runner(dflash, {.max_context = 4});
  std::size_t const f = runner.feature_width(), d = runner.hidden_size(), b = runner.block_size();
  std::vector<float> feats(6 * f, 0.5f), out(b * d), row(runner.vocab_size());
  check_error([&] { runner.extend(sd::matrix_view<float const>(feats.data(), 2, f - 1)); },
              sd::errc::invalid_argument, "feature rows of");
  check_error([&] { runner.extend(sd::matrix_view<float const>(feats.data(), 5, f)); },
              sd::errc::context_overflow, "exceed the context of 4");
  CHECK(runner.context() == 0);
  check_error([&] { runner.block(512, sd::matrix_view<float>(out.data(), b, d)); },
              sd::errc::out_of_range, "outside the vocabulary");
  check_error([&] { runner.block(1, sd::matrix_view<float>(out.data(), b - 1, d)); },
              sd::errc::invalid_argument, "outputs of");
  check_error([&] { runner.add_markov(1, row); }, sd::errc::invalid_argument, "no Markov head");
  runner.extend(sd::matrix_view<float const>(feats.data(), 4, f));
  check_error([&] { runner.block(1, sd::matrix_view<float>(out.data(), b, d)); },
              sd::errc::context_overflow, "outside the context of 4");
}
