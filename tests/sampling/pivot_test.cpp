// The pivot search of the CUDA sampling kernel (detail/pivot.hpp), run by its host twin
// (reference/pivot.hpp), against `sampler` on many random rows: the same kept sets (top-k,
// top-p, min-p and their combinations, ties, -inf entries, rows small and large) and the same
// probabilities up to the order of the mass sums; the number of passes stays within the bound
// the decision functions promise; and the decision functions themselves on hand-made brackets.

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "rows.hpp"
#include "specdec/detail/pivot.hpp"
#include "specdec/reference/pivot.hpp"
#include "specdec/sampling/policy.hpp"

namespace {

namespace sd = specdec;
namespace pv = specdec::detail::pivot;
using sampling_test::row_kind;

// Ties at the top-k boundary: every entry from a set of 5 values.
// The twin and the sampler on one row: kept sets equal, probabilities within a few ulps.
struct comparison {
  std::size_t rows = 0, kept_mismatch = 0, prob_mismatch = 0;
  int max_passes = 0;
  double passes = 0.0;
  int searches = 0;
};

void compare(std::vector<float> const& z, sd::sampling_params const& p, comparison& c) {
  std::vector<float> want(z.size()), got(z.size());
  sd::sampler(p).distribution(z, {}, want);
  sd::pivot_trace const t = sd::reference_pivot_distribution(z, p, got);
  ++c.rows;
  bool kept_same = true;
  bool probs_same = true;
  for (std::size_t i = 0; i < z.size(); ++i) {
    kept_same = kept_same && ((want[i] > 0.0f) == (got[i] > 0.0f));
    // Kept masses are summed in different orders: a few float ulps of each probability.
    probs_same = probs_same && std::abs(want[i] - got[i]) <= 4e-7f * std::max(want[i], 1e-30f);
  }
  if (!kept_same) {
    ++c.kept_mismatch;
    std::size_t kw = 0, kg = 0;
    for (std::size_t i = 0; i < z.size(); ++i) {
      kw += want[i] > 0.0f;
      kg += got[i] > 0.0f;
    }
    MESSAGE("kept sets differ: vocab " << z.size() << ", T " << p.temperature << ", top_k "
                                       << p.top_k << ", top_p " << p.top_p << ", min_p " << p.min_p
                                       << ": " << kw << " vs " << kg << " kept");
  } else if (!probs_same) {
    ++c.prob_mismatch;
  }
  for (int passes : {t.top_k_passes, t.top_p_passes}) {
    if (passes == 0) continue;
    c.max_passes = std::max(c.max_passes, passes);
    c.passes += passes;
    ++c.searches;
  }
}

}  // namespace

TEST_CASE("pivot search: the twin keeps what sampler keeps, on many random rows") {
  std::mt19937_64 gen(20250611);
  comparison c;
  row_kind const kinds[] = {row_kind::flat,    row_kind::peaked, row_kind::ties,
                            row_kind::neg_inf, row_kind::grid,   row_kind::huge};
  float const temps[] = {0.5f, 1.0f, 1.7f};
  std::int32_t const ks[] = {0, 1, 3, 40, 300, 2000};
  float const tps[] = {1.0f, 0.95f, 0.8f, 0.3f};
  float const mps[] = {0.0f, 0.0f, 0.02f, 0.3f};
  std::uniform_int_distribution<int> die(0, 1 << 20);
  for (std::size_t vocab : {7ul, 512ul, 4113ul, 32000ul}) {
    int const rows = vocab == 32000 ? 40 : 120;
    for (int r = 0; r < rows; ++r) {
      row_kind const kind = kinds[static_cast<std::size_t>(die(gen)) % std::size(kinds)];
      std::vector<float> const z = sampling_test::make_row(kind, vocab, gen);
      sd::sampling_params p;
      p.temperature = temps[static_cast<std::size_t>(die(gen)) % std::size(temps)];
      p.top_k = ks[static_cast<std::size_t>(die(gen)) % std::size(ks)];
      p.top_p = tps[static_cast<std::size_t>(die(gen)) % std::size(tps)];
      p.min_p = mps[static_cast<std::size_t>(die(gen)) % std::size(mps)];
      CAPTURE(sampling_test::name(kind));
      compare(z, p, c);
    }
  }
  MESSAGE("pivot search: " << c.rows << " rows, " << c.searches << " searches, "
                           << c.passes / std::max(c.searches, 1) << " passes on average, at most "
                           << c.max_passes);
  CHECK(c.kept_mismatch == 0);
  CHECK(c.prob_mismatch == 0);
  // The bound of detail/pivot.hpp (22 passes reach adjacent ends); typical rows need a few.
  CHECK(c.max_passes <= 22);
}

TEST_CASE("pivot search: long runs of ties at the cut are resolved by id") {
  // 10000 entries equal to 1, 30000 equal to 0: top-k 5000 keeps the first 5000 ones.
  std::vector<float> z(40000, 0.0f);
  for (std::size_t i = 0; i < z.size(); i += 4) z[i] = 1.0f;
  for (std::size_t i = 1; i < z.size(); i += 4) z[i] = 1.0f;
  for (std::int32_t k : {5000, 20000, 25000}) {
    sd::sampling_params p;
    p.top_k = k;
    std::vector<float> got(z.size());
    sd::pivot_trace const t = sd::reference_pivot_distribution(z, p, got);
    CHECK(t.top_k_ties);
    std::vector<float> want(z.size());
    sd::sampler(p).distribution(z, {}, want);
    std::size_t kept = 0, same = 0;
    for (std::size_t i = 0; i < z.size(); ++i) {
      kept += got[i] > 0.0f;
      same += (got[i] > 0.0f) == (want[i] > 0.0f);
    }
    CHECK(kept == static_cast<std::size_t>(k));
    CHECK(same == z.size());
  }
  // Top-p over equal probabilities: the fewest that reach the mass, the lowest ids.
  std::vector<float> flat(9000, 0.0f);
  sd::sampling_params p;
  p.top_p = 0.5f;
  std::vector<float> got(flat.size()), want(flat.size());
  sd::pivot_trace const t = sd::reference_pivot_distribution(flat, p, got);
  CHECK(t.top_p_ties);
  sd::sampler(p).distribution(flat, {}, want);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < flat.size(); ++i) {
    kept += got[i] > 0.0f;
    CHECK((got[i] > 0.0f) == (want[i] > 0.0f));
  }
  CHECK(kept == 4500);
  CHECK(got[0] > 0.0f);
  CHECK(got[8999] == 0.0f);
}

TEST_CASE("pivot search: pivots lie strictly inside the bracket, narrowing keeps the cut") {
  pv::bracket b;
  b.lo = -3.0f;
  b.hi = 5.0f;
  b.c_lo = 100;
  float p[pv::pivot_count];
  int const n = pv::place_pivots(b, pv::mode::count, p);
  REQUIRE(n == pv::pivot_count);
  for (int j = 0; j < n; ++j) {
    CHECK(p[j] > b.lo);
    CHECK(p[j] < b.hi);
    if (j > 0) CHECK(p[j] > p[j - 1]);
  }
  CHECK(p[0] == doctest::Approx(-2.0));
  // Odd passes space the pivots in float order; adjacent ends leave no room.
  b.passes = 1;
  CHECK(pv::place_pivots(b, pv::mode::count, p) == pv::pivot_count);
  b.hi = pv::next_up(b.lo);
  CHECK(pv::adjacent(b));
  CHECK(pv::place_pivots(b, pv::mode::count, p) == 0);
  CHECK(pv::done(b));
  // Two floats apart: one pivot fits.
  b.hi = pv::next_up(pv::next_up(b.lo));
  CHECK(pv::place_pivots(b, pv::mode::count, p) == 1);
  CHECK(p[0] == pv::next_up(b.lo));
  // Infinite ends: float-order spacing even on even passes.
  b = pv::bracket{};
  b.lo = -std::numeric_limits<float>::infinity();
  b.hi = 1.0f;
  CHECK(pv::place_pivots(b, pv::mode::count, p) == pv::pivot_count);
  // The mass ladder of the first pass: powers of two below hi.
  b = pv::bracket{};
  b.lo = std::numeric_limits<float>::denorm_min();
  b.hi = 1.0f;
  REQUIRE(pv::place_pivots(b, pv::mode::mass, p) == pv::pivot_count);
  CHECK(p[0] == 1.0f / 16384.0f);
  CHECK(p[6] == 0.5f);
  // Narrowing: weights 9, 7, 4, 2 at four pivots, target 5: the cut lies in [p1, p2).
  float const q[] = {1.0f, 2.0f, 3.0f, 4.0f};
  double const w[] = {9.0, 7.0, 4.0, 2.0};
  std::int64_t const c[] = {9, 7, 4, 2};
  b = pv::bracket{};
  b.lo = 0.0f;
  b.hi = 5.0f;
  b.c_lo = 10;
  pv::narrow(b, q, w, c, 4, 5.0);
  CHECK(b.lo == 2.0f);
  CHECK(b.hi == 3.0f);
  CHECK(b.c_lo == 7);
  CHECK(b.c_hi == 4);
  CHECK(b.w_hi == 4.0);
  CHECK(b.passes == 1);
  // The cut among gathered entries, in order: count and mass.
  float const v[] = {2.5f, 2.5f, 2.25f};
  std::int32_t const id[] = {3, 8, 1};
  pv::cut const k = pv::cut_sorted(v, id, 3, b, pv::mode::count, 6.0);  // 2 more than c_hi
  CHECK(k.t == 2.5f);
  CHECK(k.last_id == 8);
  pv::cut const m = pv::cut_sorted(v, id, 3, b, pv::mode::mass, 8.7);  // 4 + 2.5 + 2.5 > 8.7
  CHECK(m.t == 2.5f);
  CHECK(m.last_id == 8);
  CHECK(m.mass == 9.0);
  CHECK(pv::kept(2.5f, 8, m));
  CHECK_FALSE(pv::kept(2.5f, 9, m));
  CHECK(pv::kept(2.6f, 100, m));
}
