// softmax: agreement with the double reference, stability with huge and -inf logits, errors, and
// the accuracy of the float exp behind it.
#include "specdec/sampling/softmax.hpp"

#include "support/doctest.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "rows.hpp"
#include "specdec/reference/sampling.hpp"
#include "support/errors.hpp"

namespace sd = specdec;
using sampling_test::ninf;
using test_support::check_error;

namespace {

constexpr float float_max = std::numeric_limits<float>::max();
constexpr float pinf = std::numeric_limits<float>::infinity();

// Each probability within 4e-6 relative (+1e-30 absolute) of the double softmax of the same row.
void check_matches_reference(std::vector<float> const& logits) {
  std::vector<float> probs(logits.size());
  sd::softmax(logits, probs);
  std::vector<double> const ref = sd::reference_softmax(std::span<float const>(logits));
  double sum = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    INFO("entry ", i, " of ", logits.size(), ": ", probs[i], " vs ", ref[i]);
    CHECK(std::abs(probs[i] - ref[i]) <= 4e-6 * ref[i] + 1e-30);
    sum += probs[i];
  }
  CHECK(std::abs(sum - 1.0) < 1e-6);
}

}  // namespace

TEST_CASE("softmax matches the double reference on random rows of every size") {
  std::mt19937_64 gen(7);
  std::size_t const sizes[] = {1, 2, 3, 15, 16, 17, 31, 111, 513, 1000, 32000};
  for (std::size_t n : sizes) {
    for (auto kind : {sampling_test::row_kind::flat, sampling_test::row_kind::peaked,
                      sampling_test::row_kind::ties, sampling_test::row_kind::neg_inf,
                      sampling_test::row_kind::huge}) {
      INFO("vocab ", n, " kind ", sampling_test::name(kind));
      check_matches_reference(sampling_test::make_row(kind, n, gen));
    }
  }
}

TEST_CASE("softmax is stable for huge logits") {
  check_matches_reference({1e30f, 1e30f, -1e30f, 0.0f});
  check_matches_reference({float_max, float_max - 1e32f, 0.0f});
  check_matches_reference(
      {float_max, -float_max});  // float_max - (-float_max) overflows to -inf: probability 0
  check_matches_reference({88.0f, 89.0f, 90.0f, -100.0f});
  check_matches_reference({-1e30f, -1e30f + 1e24f});

  std::vector<float> probs(2);
  sd::softmax(std::vector<float>{float_max, -float_max}, probs);
  CHECK(probs[0] == 1.0f);
  CHECK(probs[1] == 0.0f);
  sd::softmax(std::vector<float>{3e38f, 3e38f}, probs);
  CHECK(probs[0] == 0.5f);
  CHECK(probs[1] == 0.5f);
}

TEST_CASE("softmax gives -inf logits probability 0") {
  std::vector<float> const logits = {ninf, 0.0f, ninf, std::log(3.0f), ninf};
  std::vector<float> probs(logits.size());
  sd::softmax(logits, probs);
  CHECK(probs[0] == 0.0f);
  CHECK(probs[2] == 0.0f);
  CHECK(probs[4] == 0.0f);
  CHECK(probs[1] == doctest::Approx(0.25).epsilon(1e-6));
  CHECK(probs[3] == doctest::Approx(0.75).epsilon(1e-6));
  // One finite entry among many -inf: one-hot.
  std::vector<float> row(100, ninf);
  row[63] = -5.0f;
  std::vector<float> p(row.size());
  sd::softmax(row, p);
  for (std::size_t i = 0; i < p.size(); ++i) CHECK(p[i] == (i == 63 ? 1.0f : 0.0f));
}

TEST_CASE("softmax can run in place") {
  std::mt19937_64 gen(3);
  std::vector<float> row = sampling_test::make_row(sampling_test::row_kind::peaked, 1000, gen);
  std::vector<float> out(row.size());
  sd::softmax(row, out);
  sd::softmax(row, row);
  CHECK(row == out);
}

TEST_CASE("softmax errors name the offending index") {
  std::vector<float> probs(5);
  float const nan = std::numeric_limits<float>::quiet_NaN();
  check_error(
      [&] {
        sd::softmax(std::vector<float>{0, 1, 2, nan, 4}, probs);
      },
      sd::errc::numerical, "logit 3 of 5 is NaN");
  check_error(
      [&] {
        sd::softmax(std::vector<float>{0, pinf, 2, 3, 4}, probs);
      },
      sd::errc::numerical, "logit 1 of 5 is +inf");
  check_error([&] { sd::softmax(std::vector<float>(5, ninf), probs); }, sd::errc::numerical,
              "no finite logit");
  std::vector<float> big(100, 0.0f);
  big[77] = nan;
  std::vector<float> big_out(100);
  check_error([&] { sd::softmax(big, big_out); }, sd::errc::numerical, "logit 77 of 100");
  check_error([&] { sd::softmax(std::vector<float>{}, std::span<float>{}); }, sd::errc::numerical,
              "no finite logit");
  check_error(
      [&] {
        sd::softmax(std::vector<float>{1, 2}, probs);
      },
      sd::errc::invalid_argument, "2 logits but 5 probabilities");
  std::vector<float> buf(10, 0.0f);
  check_error(
      [&] {
        sd::softmax(std::span<float const>(buf.data(), 5), std::span<float>(buf.data() + 2, 5));
      },
      sd::errc::invalid_argument, "overlap");
}

TEST_CASE("exp_nonpositive is within 1 ulp of the correctly rounded exp") {
  // An exhaustive run over every float in [-87.34, 0] found at most 1 ulp; here every 997th.
  std::int64_t worst = 0;
  for (float x = -0.0f; x > sd::detail::exp_lower_limit;) {
    float const y = sd::detail::exp_nonpositive(x);
    auto const exact = static_cast<float>(std::exp(static_cast<double>(x)));
    std::int64_t const ulps = std::abs(static_cast<std::int64_t>(std::bit_cast<std::int32_t>(y)) -
                                       std::bit_cast<std::int32_t>(exact));
    worst = std::max(worst, ulps);
    x = std::bit_cast<float>(std::bit_cast<std::int32_t>(x) + 997);
  }
  CHECK(worst <= 1);
  CHECK(sd::detail::exp_nonpositive(0.0f) == 1.0f);
  CHECK(sd::detail::exp_nonpositive(-0.0f) == 1.0f);
  CHECK(sd::detail::exp_nonpositive(-88.0f) == 0.0f);
  CHECK(sd::detail::exp_nonpositive(-float_max) == 0.0f);
  CHECK(sd::detail::exp_nonpositive(ninf) == 0.0f);
  CHECK(sd::detail::exp_nonpositive(-87.0f) > 0.0f);
}
