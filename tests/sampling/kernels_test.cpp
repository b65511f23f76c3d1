// The row kernels' fast passes give bit for bit what their plain definitions give: the draw's
// vectorised row sums against its per-block lane sums, the four-set row maximum against the
// one-set ordered maximum (signed zeros included), the exp pass without the top-k test or the
// multiplication against the general pass, the vector exp against the scalar one, the vector
// `any` against a lane loop, the validation sum, and the one-pass history check against the
// documented errors.
#include "support/doctest.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "rows.hpp"
#include "specdec/detail/rows.hpp"
#include "specdec/sampling/draw.hpp"
#include "specdec/sampling/policy.hpp"
#include "support/errors.hpp"

namespace sd = specdec;
using sampling_test::ninf;
using test_support::check_error;

namespace {

constexpr std::size_t sizes[] = {1,   2,   15,  16,  17,  63,   64,   65,   127,  128,  129,
                                 255, 256, 511, 512, 513, 1000, 1023, 1024, 4096, 32000};

// A probability-like row: mostly positive, with zeros, runs of zeros, subnormals and signed zeros.
std::vector<float> weights_row(std::size_t n, std::mt19937_64& gen) {
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  std::vector<float> p(n);
  for (float& v : p) {
    float const r = uni(gen);
    v = r < 0.2f    ? 0.0f
        : r < 0.25f ? -0.0f
        : r < 0.3f  ? 1e-40f * uni(gen)
        : r < 0.4f  ? std::ldexp(uni(gen), -100)
                    : uni(gen) * uni(gen);
  }
  // A run of zeros over a whole block and a half.
  if (n > 200)
    for (std::size_t i = 64; i < 160; ++i) p[i] = 0.0f;
  return p;
}

bool same_bits(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}
bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

}  // namespace

TEST_CASE("row_weight_sum equals weight_sum over the row, block sums and total bit for bit") {
  std::mt19937_64 gen(21);
  constexpr std::size_t block = sd::detail::reduce_block;
  for (std::size_t n : sizes) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> p = weights_row(n, gen);
      float const* data = p.data();
      auto const w = [data](std::size_t j) { return data[j]; };
      std::size_t const blocks = n / block;
      std::vector<float> sums(blocks + 1, -1.0f), expected_sums(blocks + 1, -1.0f);
      bool bad = true;
      double const total = sd::detail::row_weight_sum(data, n, sums.data(), bad);
      double const expected_total = sd::detail::weight_sum(n, w, expected_sums.data());
      for (std::size_t b = 0; b < blocks; ++b) {
        INFO("n ", n, " block ", b);
        CHECK(same_bits(sums[b], expected_sums[b]));
        CHECK(same_bits(sums[b], sd::detail::block_sum(b * block, w)));
      }
      INFO("n ", n);
      CHECK(same_bits(total, expected_total));
      CHECK(sums[blocks] == -1.0f);  // nothing written past the whole blocks
      CHECK_FALSE(bad);
    }
  }
}

TEST_CASE("row_weight_sum flags negative and NaN entries wherever they are") {
  std::mt19937_64 gen(22);
  for (std::size_t n : sizes) {
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      for (float poison : {-1e-30f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<float> p = weights_row(n, gen);
        p[at] = poison;
        bool bad = false;
        (void)sd::detail::row_weight_sum(p.data(), n, nullptr, bad);
        INFO("n ", n, " at ", at, " value ", poison);
        CHECK(bad);
      }
    }
  }
}

TEST_CASE("sample_from draws what the sequential double reference draws, on many uniforms") {
  std::mt19937_64 gen(23);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (std::size_t n : sizes) {
    std::vector<float> p = weights_row(n, gen);
    for (float& v : p) v = std::abs(v);
    p[n / 3] = 0.5f;  // some mass
    std::vector<double> const pd(p.begin(), p.end());
    for (int k = 0; k < 100; ++k) {
      float const u = k == 0 ? 0.0f : k == 1 ? 0.99999994f : uni(gen) * 0.99999994f;
      sd::token_id const a = sd::sample_from(p, u);
      INFO("n ", n, " u ", u);
      CHECK(a == sd::reference_sample(pd, u));
      CHECK(p[static_cast<std::size_t>(a)] > 0.0f);
    }
  }
}

TEST_CASE("summarize_row's maximum equals the ordered one-set maximum, signed zeros included") {
  std::mt19937_64 gen(24);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_int_distribution<int> die(0, 5);
  for (std::size_t n : sizes) {
    for (int rep = 0; rep < 30; ++rep) {
      std::vector<float> x(n);
      int const kind = rep % 4;
      for (float& v : x) {
        int const d = die(gen);
        if (kind == 0) v = normal(gen);
        if (kind == 1) v = d == 0 ? ninf : normal(gen);  // -inf entries
        // Non-positive rows whose maximum is a zero of either sign, in any mix.
        if (kind == 2) v = d < 2 ? 0.0f : d < 4 ? -0.0f : -std::abs(normal(gen));
        if (kind == 3) v = d < 1 ? -0.0f : d < 2 ? 0.0f : -1.0f - std::abs(normal(gen));
      }
      if (kind == 1) x[n / 2] = 1.0f;
      bool bad = true;
      float const expected = sd::detail::ordered_row_max(x.data(), n, bad);
      CHECK_FALSE(bad);
      float const got = sd::detail::summarize_row(x, "test").max;
      INFO("n ", n, " kind ", kind, " expected ", expected, " got ", got);
      CHECK(same_bits(got, expected));
    }
  }
  // Every entry -0 but one +0, at each position of a 64-entry row: the ordered result decides.
  for (std::size_t at = 0; at < 64; ++at) {
    std::vector<float> x(64, -0.0f);
    x[at] = 0.0f;
    bool bad = false;
    CHECK(same_bits(sd::detail::summarize_row(x, "test").max,
                    sd::detail::ordered_row_max(x.data(), x.size(), bad)));
  }
}

TEST_CASE("summarize_row still names the first NaN or +inf of a row of any size") {
  float const nan = std::numeric_limits<float>::quiet_NaN();
  float const inf = std::numeric_limits<float>::infinity();
  for (std::size_t n : sizes) {
    for (std::size_t at : {std::size_t{0}, n / 2, n - 1}) {
      std::vector<float> x(n, 1.0f);
      x[at] = nan;
      check_error([&] { (void)sd::detail::summarize_row(x, "test"); }, sd::errc::numerical,
                  "logit " + std::to_string(at) + " of " + std::to_string(n) + " is NaN");
      x[at] = inf;
      check_error([&] { (void)sd::detail::summarize_row(x, "test"); }, sd::errc::numerical,
                  "logit " + std::to_string(at) + " of " + std::to_string(n) + " is +inf");
    }
    std::vector<float> const all_ninf(n, ninf);
    check_error([&] { (void)sd::detail::summarize_row(all_ninf, "test"); }, sd::errc::numerical,
                "no finite logit");
  }
}

TEST_CASE("the exp pass without the top-k test or the multiplication equals the general pass") {
  // The general pass (top-k test, multiplication by the scale) is the definition; the pass
  // without the test at zfloor = -inf and the pass without the multiplication at scale 1 must give
  // the same bits.
  std::mt19937_64 gen(25);
  for (std::size_t n : sizes) {
    for (auto kind : {sampling_test::row_kind::peaked, sampling_test::row_kind::neg_inf,
                      sampling_test::row_kind::huge}) {
      std::vector<float> const z = sampling_test::make_row(kind, n, gen);
      float const zmax = sd::detail::summarize_row(z, "test").max;
      for (float scale : {1.0f, 1.0f / 0.7f, 4.0f}) {
        std::vector<float> ref(n), b(n);
        auto const sr = sd::detail::exp_masked_pass<true, true, true>(z.data(), ref.data(), n, zmax,
                                                                      scale, ninf, 0.01f);
        auto const same_as_ref = [&](sd::detail::exp_sums const& sb) {
          bool equal =
              same_bits(sr.total, sb.total) && same_bits(sr.at_least_floor, sb.at_least_floor);
          for (std::size_t i = 0; i < n; ++i) equal = equal && same_bits(ref[i], b[i]);
          return equal;
        };
        INFO("n ", n, " kind ", sampling_test::name(kind), " scale ", scale);
        CHECK(same_as_ref(sd::detail::exp_masked_pass<true, false, true>(
            z.data(), b.data(), n, zmax, scale, ninf, 0.01f)));
        if (scale == 1.0f) {
          CHECK(same_as_ref(sd::detail::exp_masked_pass<true, true, false>(
              z.data(), b.data(), n, zmax, scale, ninf, 0.01f)));
          CHECK(same_as_ref(sd::detail::exp_masked_pass<true, false, false>(
              z.data(), b.data(), n, zmax, scale, ninf, 0.01f)));
        }
        // The dispatching entry point picks one of them.
        auto const sc =
            sd::detail::exp_masked<true>(z.data(), b.data(), n, zmax, scale, ninf, 0.01f);
        CHECK(same_as_ref(sc));
      }
    }
  }
}

TEST_CASE("the vector exp equals the scalar exp lane by lane, limits and -inf included") {
  // The vector form computes er * 2^n and the zero below the limit differently where the
  // instruction set allows (one scaling instruction); the values must not change.
  constexpr std::size_t w = sd::detail::simd_width;
  std::vector<float> xs;
  for (std::int64_t b = std::bit_cast<std::int32_t>(-0.0f);
       b <= std::bit_cast<std::int32_t>(-88.5f); b += 1021)
    xs.push_back(std::bit_cast<float>(static_cast<std::int32_t>(b)));
  for (float x :
       {0.0f, -0.0f, sd::detail::exp_lower_limit, std::nextafter(sd::detail::exp_lower_limit, 0.0f),
        std::nextafter(sd::detail::exp_lower_limit, -1.0f), -87.0f, -88.0f, -1e30f,
        -std::numeric_limits<float>::max(), ninf, -std::numeric_limits<float>::min()})
    xs.push_back(x);
  while (xs.size() % w != 0) xs.push_back(-1.0f);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < xs.size(); i += w) {
    float out[w];
    sd::detail::store(out, sd::detail::exp_nonpositive(sd::detail::load(xs.data() + i)));
    for (std::size_t j = 0; j < w; ++j)
      differ += same_bits(out[j], sd::detail::exp_nonpositive(xs[i + j])) ? 0 : 1;
  }
  CHECK(differ == 0);
}

TEST_CASE("sum_checked sums any row and flags negative and NaN entries wherever they are") {
  std::mt19937_64 gen(29);
  for (std::size_t n : sizes) {
    std::vector<float> p = weights_row(n, gen);
    for (float& v : p) v = std::abs(v);
    double exact = 0.0;
    for (float v : p) exact += static_cast<double>(v);
    bool bad = true;
    double const s = sd::detail::sum_checked(p.data(), n, bad);
    INFO("n ", n);
    CHECK_FALSE(bad);
    CHECK(std::abs(s - exact) <= 1e-6 * exact + 1e-30);
    for (std::size_t at : {std::size_t{0}, n / 3, n / 2, n - 1}) {
      for (float poison : {-1e-30f, -0.5f, std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<float> q = p;
        q[at] = poison;
        bad = false;
        (void)sd::detail::sum_checked(q.data(), n, bad);
        INFO("at ", at, " value ", poison);
        CHECK(bad);
      }
      std::vector<float> q = p;
      q[at] = std::numeric_limits<float>::infinity();
      bad = false;
      CHECK(std::isinf(sd::detail::sum_checked(q.data(), n, bad)));
    }
    // -0 is not negative.
    std::vector<float> z(n, -0.0f);
    bad = true;
    CHECK(sd::detail::sum_checked(z.data(), n, bad) == 0.0);
    CHECK_FALSE(bad);
  }
}

TEST_CASE("first_crossing finds the sequential crossing, targets on and beside every sum") {
  // The vector search must give the sequential loop's index in every case, in particular where
  // the target equals a sequential running sum or sits one double step beside it (there the
  // vector prefix sums, associated differently, may round to the other side and the search must
  // hand over to the sequential loop).
  std::mt19937_64 gen(31);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::size_t cases = 0, differ = 0;
  for (int rep = 0; rep < 300; ++rep) {
    std::size_t const len = rep % 10 == 9 ? 1 + static_cast<std::size_t>(rep) % 70 : 64;
    std::vector<float> x = weights_row(len, gen);
    if (rep % 3 == 1)  // a wide dynamic range: every addition rounds
      for (float& v : x) v = v > 0.0f ? std::ldexp(v, static_cast<int>(uni(gen) * 60.0) - 40) : v;
    double const running = rep % 4 == 0 ? 0.0 : uni(gen) * (rep % 4 == 3 ? 1e6 : 1.0);
    std::vector<double> targets;
    double c = running;
    for (float v : x) {
      c += static_cast<double>(v > 0.0f ? v : 0.0f);
      targets.push_back(c);
      targets.push_back(std::nextafter(c, 0.0));
      targets.push_back(std::nextafter(c, 1e300));
    }
    for (int k = 0; k < 20; ++k) targets.push_back(running + (c - running) * uni(gen));
    targets.push_back(running);
    targets.push_back(c * 2.0 + 1.0);  // beyond every sum: no crossing
    for (double t : targets) {
      if (t < running) continue;
      ++cases;
      std::size_t const fast = sd::detail::first_crossing(x.data(), len, running, t);
      std::size_t const slow = sd::detail::first_crossing_sequential(x.data(), len, running, t);
      if (fast != slow) {
        ++differ;
        INFO("rep ", rep, " len ", len, " running ", running, " target ", t);
        CHECK(fast == slow);
      }
    }
  }
  MESSAGE(cases, " targets, ", differ, " differ (the vector search runs with AVX-512 only)");
  CHECK(differ == 0);
}

TEST_CASE("reduce_lanes, positive_part and select_index") {
  constexpr std::size_t w = sd::detail::simd_width;
  float lanes[w];
  for (std::size_t j = 0; j < w; ++j) lanes[j] = static_cast<float>((j * 7) % w) - 3.0f;
  sd::detail::vfloat const v = sd::detail::load(lanes);
  float sum = 0.0f, mx = ninf;
  for (float x : lanes) {
    sum += x;
    mx = std::max(mx, x);
  }
  CHECK(sd::detail::reduce_lanes(v, [](auto a, auto b) { return a + b; }) == sum);
  CHECK(sd::detail::reduce_lanes(v, [](auto a, auto b) { return b > a ? b : a; }) == mx);
  CHECK(sd::detail::positive_part(2.5f) == 2.5f);
  CHECK(sd::detail::positive_part(-2.5f) == 0.0f);
  CHECK(sd::detail::positive_part(-0.0f) == 0.0f);
  CHECK(sd::detail::positive_part(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(sd::detail::positive_part(1e-40f) == 1e-40f);
  CHECK(sd::detail::select_index(true, 3, 9) == 3);
  CHECK(sd::detail::select_index(false, 3, 9) == 9);
  CHECK(sd::detail::select_index(true, static_cast<std::size_t>(-1), 0) ==
        static_cast<std::size_t>(-1));
}

TEST_CASE("any tests every lane of a mask") {
  for (std::size_t lane = 0; lane < sd::detail::simd_width; ++lane) {
    std::int32_t bits[sd::detail::simd_width] = {};
    bits[lane] = -1;
    sd::detail::vint m;
    __builtin_memcpy(&m, bits, sizeof m);
    CHECK(sd::detail::any(m));
  }
  CHECK_FALSE(sd::detail::any(sd::detail::vint{}));
}

TEST_CASE("the one-pass history check names the first bad token of long histories") {
  std::vector<float> const logits(100, 0.0f);
  std::vector<float> probs(100);
  sd::sampler const s({});
  std::vector<sd::token_id> history(1000);
  for (std::size_t i = 0; i < history.size(); ++i) history[i] = static_cast<sd::token_id>(i % 100);
  s.distribution(logits, history, probs);  // every id in range: no error
  (void)s.greedy_token(logits, history);
  for (std::size_t at : {std::size_t{0}, std::size_t{17}, std::size_t{640}, std::size_t{999}}) {
    for (sd::token_id bad : {100, -1, std::numeric_limits<sd::token_id>::min(),
                             std::numeric_limits<sd::token_id>::max()}) {
      std::vector<sd::token_id> h = history;
      h[at] = bad;
      if (at + 5 < h.size()) h[at + 5] = 7777;  // a later bad id is not the one named
      std::string const fragment =
          "history[" + std::to_string(at) + "] = " + std::to_string(bad) + " is not";
      check_error([&] { s.distribution(logits, h, probs); }, sd::errc::out_of_range, fragment);
      check_error([&] { (void)s.greedy_token(logits, h); }, sd::errc::out_of_range, fragment);
    }
  }
}

TEST_CASE("the vector layer in use, and sum_row_lanes adds the 16 lanes by the fixed tree") {
#if defined(SPECDEC_SCALAR_SIMD)
  // The fallback for compilers without vector extensions: lanes held in a struct.
  static_assert(SPECDEC_VECTOR_EXTENSIONS == 0);
  static_assert(std::is_class_v<sd::detail::vfloat>);
  MESSAGE("scalar fallback, ", sd::detail::simd_width, " lanes per vector");
#else
  static_assert(SPECDEC_VECTOR_EXTENSIONS == 1);
  MESSAGE("vector extensions, ", sd::detail::simd_width, " lanes per vector");
#endif
  std::mt19937_64 gen(31);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (int rep = 0; rep < 1000; ++rep) {
    float lanes[sd::detail::row_lanes];
    for (float& v : lanes) v = uni(gen) * std::ldexp(1.0f, static_cast<int>(gen() % 40) - 20);
    sd::detail::vfloat acc[sd::detail::row_vectors];
    for (std::size_t v = 0; v < sd::detail::row_vectors; ++v)
      acc[v] = sd::detail::load(lanes + v * sd::detail::simd_width);
    float tree[sd::detail::row_lanes];
    std::copy(std::begin(lanes), std::end(lanes), tree);
    for (std::size_t h = sd::detail::row_lanes / 2; h >= 1; h /= 2)
      for (std::size_t l = 0; l < h; ++l) tree[l] += tree[l + h];
    CHECK(same_bits(sd::detail::sum_row_lanes(acc), tree[0]));
  }
}

namespace {

// Restores the CPU target chosen before it, whatever a test does.
struct target_guard {
  sd::cpu_target saved = sd::active_cpu_target();
  ~target_guard() { sd::set_cpu_target(saved); }
};

// What the dispatched row passes give for `row` on the active target, as bits.
std::vector<std::uint64_t> row_results(std::vector<float> const& row, std::vector<float> const& p) {
  std::vector<std::uint64_t> out;
  auto const put = [&](auto v) {
    if constexpr (std::is_same_v<decltype(v), double>)
      out.push_back(std::bit_cast<std::uint64_t>(v));
    else if constexpr (std::is_same_v<decltype(v), float>)
      out.push_back(std::bit_cast<std::uint32_t>(v));
    else
      out.push_back(static_cast<std::uint64_t>(v));
  };
  std::size_t const n = row.size();
  float const max = sd::detail::summarize_row(row, "test").max;
  put(max);
  std::vector<float> e(n);
  put(sd::detail::exp_shifted(row.data(), e.data(), n, max, 1.25f));
  for (float const v : e) put(v);
  auto const masked =
      sd::detail::exp_masked<true>(row.data(), e.data(), n, max, 0.8f, max - 3.0f, 0.01f);
  put(masked.total);
  put(masked.at_least_floor);
  for (float const v : e) put(v);
  bool bad = false;
  put(sd::detail::sum_checked(p.data(), n, bad));
  put(bad);
  float const th[3] = {0.001f, 0.01f, 0.1f};
  double mass[3], count[3];
  sd::detail::threshold_stats<true, 3>(p.data(), n, th, mass, count);
  for (std::size_t k = 0; k < 3; ++k) {
    put(mass[k]);
    put(count[k]);
  }
  double total = 0.0;
  for (float const v : p) total += static_cast<double>(v);
  for (double const u : {0.0, 0.3, 0.77, 0.999})
    put(sd::detail::first_crossing(p.data(), n, 0.0, u * total));
  put(sd::detail::argmax_index(row.data(), n));
  put(sd::detail::first_non_finite(row.data(), n));
  std::vector<float> scaled(n);
  sd::detail::scale_row(row.data(), scaled.data(), n, 0.7f);
  for (float const v : scaled) put(v);
  return out;
}

}  // namespace

TEST_CASE("the row passes give the same bits on every CPU target this machine runs") {
  target_guard const guard;
  std::mt19937_64 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<sd::cpu_target> targets;
  for (sd::cpu_target t : sd::all_cpu_targets)
    if (sd::cpu_target_compiled(t) && sd::cpu_target_supported(t)) targets.push_back(t);
  MESSAGE(targets.size(),
          " CPU targets compiled and supported here; active: ", sd::to_string(guard.saved));
  for (std::size_t const n : sizes) {
    std::vector<float> row(n);
    for (float& v : row) v = normal(gen);
    if (n > 4) row[n / 3] = ninf;
    std::vector<float> const p = weights_row(n, gen);
    sd::set_cpu_target(targets.front());
    std::vector<std::uint64_t> const first = row_results(row, p);
    for (std::size_t i = 1; i < targets.size(); ++i) {
      sd::set_cpu_target(targets[i]);
      CAPTURE(n);
      CAPTURE(sd::to_string(targets[i]));
      CHECK(row_results(row, p) == first);
    }
  }
}

TEST_CASE("CPU targets: names, and targets this build or CPU lacks are refused") {
  target_guard const guard;
  CHECK(sd::parse_cpu_target("avx2") == sd::cpu_target::avx2);
  CHECK(sd::to_string(sd::parse_cpu_target("baseline")) == "baseline");
  check_error([] { (void)sd::parse_cpu_target("sse9"); }, sd::errc::invalid_argument,
              "unknown CPU target 'sse9'");
  CHECK(sd::cpu_target_supported(sd::cpu_target::baseline));
  CHECK(sd::cpu_target_compiled(sd::best_cpu_target()));
  for (sd::cpu_target t : sd::all_cpu_targets) {
    if (sd::cpu_target_compiled(t) && sd::cpu_target_supported(t)) {
      sd::set_cpu_target(t);
      CHECK(sd::active_cpu_target() == t);
    } else {
      check_error([&] { sd::set_cpu_target(t); }, sd::errc::unsupported,
                  std::string(sd::to_string(t)));
    }
  }
}
