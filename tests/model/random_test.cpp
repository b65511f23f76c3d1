#include "specdec/model/random.hpp"

#include "support/doctest.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "model/test_util.hpp"
#include "support/errors.hpp"
#include "support/llama_shapes.hpp"

using namespace specdec;

TEST_CASE("random: fill_normal is N(0, stddev^2) and position-addressed") {
  std::vector<float> whole(1 << 18);
  fill_normal(whole, 42, 3, 0.02f);
  double sum = 0.0, sq = 0.0, fourth = 0.0;
  std::size_t non_finite = 0;
  for (float x : whole) {
    non_finite += !std::isfinite(x);
    sum += x;
    sq += static_cast<double>(x) * x;
    fourth += std::pow(static_cast<double>(x), 4);
  }
  REQUIRE(non_finite == 0);
  double const n = static_cast<double>(whole.size());
  double const mean = sum / n, var = sq / n - mean * mean;
  // Tolerances: about 5 standard errors for n = 262144.
  CHECK(std::fabs(mean) < 5 * 0.02 / std::sqrt(n));
  CHECK(std::fabs(std::sqrt(var) - 0.02) < 0.02 * 5 / std::sqrt(2 * n));
  CHECK(fourth / n / (var * var) == doctest::Approx(3.0).epsilon(0.05));  // normal kurtosis
  // Filling in pieces, starting anywhere, gives the same values.
  std::vector<float> pieces(whole.size());
  for (std::size_t begin :
       {std::size_t{0}, std::size_t{1000}, std::size_t{1003}, std::size_t{77777}}) {
    std::size_t const end = std::min(whole.size(), begin + 5001);
    fill_normal(std::span<float>(pieces).subspan(begin, end - begin), 42, 3, 0.02f, begin);
    CHECK(std::memcmp(pieces.data() + begin, whole.data() + begin, (end - begin) * sizeof(float)) ==
          0);
  }
  std::vector<float> other(16);
  fill_normal(other, 42, 4, 0.02f);
  CHECK(std::memcmp(other.data(), whole.data(), 16 * sizeof(float)) != 0);
}

TEST_CASE("random: make_random_llama is deterministic, norms are 1, classifier as configured") {
  llama_config c = test_support::shapes::random_init();
  auto const a = make_random_llama(c, 7), b = make_random_llama(c, 7), d = make_random_llama(c, 8);
  CHECK(a.classifier == a.token_embedding);
  CHECK(std::memcmp(a.layers[2].w2, b.layers[2].w2, 32 * 48 * sizeof(float)) == 0);
  CHECK(std::memcmp(a.layers[2].w2, d.layers[2].w2, 32 * 48 * sizeof(float)) != 0);
  for (auto const& l : a.layers) {
    for (int i = 0; i < 32; ++i) {
      CHECK(l.rms_att[i] == 1.0f);
      CHECK(l.rms_ffn[i] == 1.0f);
    }
  }
  CHECK(a.rms_final[31] == 1.0f);
  // A tensor does not depend on the other shapes: one layer fewer, same embedding and layer 0.
  llama_config c2 = c;
  c2.n_layers = 2;
  c2.shared_classifier = false;
  auto const e = make_random_llama(c2, 7);
  CHECK(std::memcmp(a.token_embedding, e.token_embedding, 50 * 32 * sizeof(float)) == 0);
  CHECK(std::memcmp(a.layers[0].wq, e.layers[0].wq, 32 * 32 * sizeof(float)) == 0);
  CHECK(e.classifier != e.token_embedding);
  CHECK(std::memcmp(e.classifier, e.token_embedding, 50 * 32 * sizeof(float)) != 0);
  c.n_heads = 5;
  test_support::expect_error([&] { (void)make_random_llama(c, 1); }, errc::bad_file);
}
