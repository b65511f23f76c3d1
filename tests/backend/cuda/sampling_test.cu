// The CUDA sampling kernels against sampling/ (softmax, sampler::distribution, sampler::sample) on
// odd vocabularies and batch sizes, with the same Philox inputs.

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "backend/cuda/test_util.cuh"
#include "specdec/backend/cuda/distribution.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/backend/cuda/sampling.cuh"
#include "specdec/backend/cuda/softmax.cuh"
#include "specdec/sampling/policy.hpp"
#include "specdec/sampling/softmax.hpp"

namespace {

using specdec::token_id;

std::int64_t ulp_distance(float a, float b) {
  std::int32_t ia = 0, ib = 0;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<std::int64_t>(ia) - static_cast<std::int64_t>(ib));
}

// Rows of logits: peaked, flat, and rows with many exact ties (integer logits).
std::vector<float> test_rows(std::size_t rows, std::size_t vocab, std::uint32_t seed) {
  std::vector<float> out = cuda_test::random_logits(rows, vocab, seed, 2.0f, true);
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = out.data() + r * vocab;
    if (r % 3 == 1)
      for (std::size_t i = 0; i < vocab; ++i) row[i] *= 0.05f;  // flat
    if (r % 3 == 2)
      for (std::size_t i = 0; i < vocab; ++i) row[i] = std::round(row[i]);  // ties
    if (r % 5 == 4) row[vocab / 2] = -INFINITY;
  }
  return out;
}

// The top-p boundary margin of a row: how close the running mass (largest first, ties by id) of
// the distribution before top-p comes to top_p * total. Small = within rounding.
double top_p_margin(std::vector<float> const& full, float top_p) {
  std::vector<std::size_t> order(full.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return full[a] > full[b] || (full[a] == full[b] && a < b);
  });
  double total = 0.0;
  for (float v : full) total += v;
  double const target = static_cast<double>(top_p) * total;
  double c = 0.0, best = 1.0;
  for (std::size_t i : order) {
    c += full[i];
    best = std::min(best, std::abs(c - target) / total);
  }
  return best;
}

}  // namespace

TEST_CASE("cuda softmax equals specdec::softmax") {
  cuda_test::require_device();
  std::int64_t worst = 0;
  std::size_t differing = 0, total = 0;
  for (std::size_t vocab : cuda_test::vocabs()) {
    for (std::size_t rows : cuda_test::batches()) {
      auto const logits = test_rows(rows, vocab, static_cast<std::uint32_t>(vocab + rows));
      std::vector<float> expect(logits.size());
      for (std::size_t r = 0; r < rows; ++r)
        specdec::softmax(std::span<float const>(logits.data() + r * vocab, vocab),
                         std::span<float>(expect.data() + r * vocab, vocab));
      auto dl = cuda_test::upload(logits);
      specdec::cuda::device_buffer<float> dp(logits.size());
      specdec::cuda::device_buffer<std::int32_t> flags(rows);
      flags.zero();
      specdec::cuda::draw_workspace ws(static_cast<std::int32_t>(vocab),
                                       static_cast<std::int32_t>(rows), 1);
      specdec::cuda::row_stats_params p;
      p.rows = dl.data();
      p.stride = static_cast<std::int64_t>(vocab);
      p.num_rows = static_cast<std::int32_t>(rows);
      p.vocab = static_cast<std::int32_t>(vocab);
      p.plan = specdec::cuda::plan_chunks(p.vocab, p.num_rows, ws.scratch().multiprocessors);
      p.scratch = ws.scratch();
      specdec::cuda::throw_if_failed(
          specdec::cuda::launch_softmax(p, dp.data(), p.stride, flags.data(), nullptr), "test");
      auto const got = cuda_test::download(dp, logits.size());
      for (auto f : cuda_test::download(flags, rows)) CHECK(f == 0);
      for (std::size_t i = 0; i < got.size(); ++i) {
        std::int64_t const d = ulp_distance(got[i], expect[i]);
        worst = std::max(worst, d);
        differing += d != 0 ? 1 : 0;
      }
      total += got.size();
    }
  }
  MESSAGE("softmax: " << differing << " of " << total
                      << " probabilities differ from the host, by at most " << worst << " ulp");
  CHECK(worst <= 1);  // only the double-summation order of the normaliser differs
}

TEST_CASE("cuda softmax flags NaN and +inf rows") {
  cuda_test::require_device();
  std::vector<float> logits(3 * 111, 0.5f);
  logits[7] = NAN;
  logits[111 + 9] = INFINITY;
  auto dl = cuda_test::upload(logits);
  specdec::cuda::device_buffer<float> dp(logits.size());
  specdec::cuda::device_buffer<std::int32_t> flags(3);
  flags.zero();
  specdec::cuda::draw_workspace ws(111, 3, 1);
  specdec::cuda::row_stats_params p;
  p.rows = dl.data();
  p.stride = 111;
  p.num_rows = 3;
  p.vocab = 111;
  p.plan = specdec::cuda::plan_chunks(111, 3, 1);
  p.scratch = ws.scratch();
  specdec::cuda::throw_if_failed(
      specdec::cuda::launch_softmax(p, dp.data(), 111, flags.data(), nullptr), "test");
  auto const f = cuda_test::download(flags, 3);
  CHECK(f[0] == specdec::cuda::non_finite_logit);
  CHECK(f[1] == specdec::cuda::non_finite_logit);
  CHECK(f[2] == 0);
  p.vocab = 0;
  CHECK_FALSE(specdec::cuda::launch_softmax(p, dp.data(), 111, flags.data(), nullptr).ok());
  // Chunk plans the row kernels cannot take: more chunks than the row has blocks of 512 entries
  // (the scratch holds that many per row), and chunks larger than the shared-memory stage.
  p.vocab = 111;
  specdec::cuda::row_stats_params bad = p;
  bad.plan = specdec::cuda::chunk_plan{512, 2};
  CHECK(specdec::cuda::launch_row_stats(bad, nullptr).code ==
        specdec::cuda::status::invalid_argument);
  bad.plan = specdec::cuda::chunk_plan{2 * specdec::cuda::max_blocks_per_chunk * 512, 1};
  CHECK(specdec::cuda::launch_row_stats(bad, nullptr).code ==
        specdec::cuda::status::invalid_argument);
}

TEST_CASE("cuda distribution equals sampler::distribution for every policy step") {
  cuda_test::require_device();
  std::vector<specdec::sampling_params> params(7);
  params[0].temperature = 0.8f;
  params[1].top_k = 50;
  params[2].top_p = 0.9f;
  params[3].min_p = 0.05f;
  params[4].temperature = 1.3f;
  params[4].top_k = 1000;
  params[4].top_p = 0.95f;
  params[4].min_p = 0.01f;
  params[5].temperature = 0.0f;
  params[6].top_k = 1;
  std::size_t rows_total = 0, rows_exact = 0, rows_rounding = 0;
  std::int64_t worst = 0;
  for (auto const& sp : params) {
    specdec::sampler const host(sp);
    specdec::cuda::device_sampler const dev(sp);
    for (std::size_t vocab : cuda_test::vocabs()) {
      for (std::size_t rows : cuda_test::batches()) {
        if (vocab == 128256 && rows == 64 && sp.top_p < 1.0f) continue;  // keep the test fast
        auto const logits = test_rows(rows, vocab, static_cast<std::uint32_t>(vocab * 5 + rows));
        std::vector<float> expect(logits.size());
        for (std::size_t r = 0; r < rows; ++r)
          host.distribution(std::span<float const>(logits.data() + r * vocab, vocab), {},
                            std::span<float>(expect.data() + r * vocab, vocab));
        auto dl = cuda_test::upload(logits);
        specdec::cuda::device_buffer<float> dp(logits.size());
        specdec::cuda::device_buffer<std::int32_t> flags(rows);
        flags.zero();
        specdec::cuda::distribution_params p;
        p.z = dl.data();
        p.z_stride = static_cast<std::int64_t>(vocab);
        p.probs = dp.data();
        p.probs_stride = p.z_stride;
        p.rows = static_cast<std::int32_t>(rows);
        p.vocab = static_cast<std::int32_t>(vocab);
        p.policy = dev.policy();
        p.row_flags = flags.data();
        specdec::cuda::throw_if_failed(specdec::cuda::launch_distribution(p, nullptr), "test");
        auto const got = cuda_test::download(dp, logits.size());
        for (auto f : cuda_test::download(flags, rows)) CHECK(f == 0);
        for (std::size_t r = 0; r < rows; ++r) {
          ++rows_total;
          bool same_support = true;
          std::int64_t row_worst = 0;
          double row_rel = 0.0;
          for (std::size_t i = 0; i < vocab; ++i) {
            float const a = got[r * vocab + i], b = expect[r * vocab + i];
            same_support = same_support && ((a > 0.0f) == (b > 0.0f));
            row_worst = std::max(row_worst, ulp_distance(a, b));
            if (b > 0.0f) row_rel = std::max(row_rel, std::abs(static_cast<double>(a) - b) / b);
          }
          if (same_support) {
            // The kept set is the host's; the probabilities differ only through the rounding
            // of the normaliser (the host sums it along one of several paths: float lanes or
            // doubles, sorted or not), i.e. by a few float ulps at most.
            worst = std::max(worst, row_worst);
            CHECK(row_rel <= 1e-5);
            rows_exact += row_worst == 0 ? 1 : 0;
            continue;
          }
          // Only top-p's mass threshold involves rounding; it must be the cause.
          INFO("policy: T " << sp.temperature << ", top_k " << sp.top_k << ", top_p " << sp.top_p
                            << ", min_p " << sp.min_p << "; vocab " << vocab << ", row " << r);
          REQUIRE(sp.top_p < 1.0f);
          specdec::sampling_params no_p = sp;
          no_p.top_p = 1.0f;
          no_p.min_p = 0.0f;
          std::vector<float> full(vocab);
          specdec::sampler(no_p).distribution(
              std::span<float const>(logits.data() + r * vocab, vocab), {}, full);
          double const margin = top_p_margin(full, sp.top_p);
          INFO("row " << r << " of vocab " << vocab << ": top-p boundary margin " << margin);
          CHECK(margin < 1e-5);
          ++rows_rounding;
        }
      }
    }
  }
  MESSAGE("distribution: " << rows_total << " rows, " << rows_exact << " bit-identical, "
                           << rows_rounding << " with a top-p cut within rounding; worst " << worst
                           << " ulp on identical supports");
}

TEST_CASE(
    "cuda sampling equals sampler::distribution + sampler::sample with the same Philox words") {
  cuda_test::require_device();
  std::vector<specdec::sampling_params> params(6);
  params[1].temperature = 0.7f;
  params[2].top_k = 50;
  params[3].top_p = 0.9f;
  params[4].temperature = 0.0f;
  params[5].top_k = 40;
  params[5].top_p = 0.95f;
  params[5].min_p = 0.02f;
  params[5].repetition_penalty = 1.3f;
  params[5].frequency_penalty = 0.2f;
  params[5].presence_penalty = 0.1f;
  params[5].logit_bias = {{2, 3.0f}, {4, -INFINITY}};
  std::size_t draws = 0, rounding = 0;
  for (auto const& sp : params) {
    specdec::sampler const host(sp);
    specdec::cuda::device_sampler const dev(sp);
    for (std::size_t vocab : cuda_test::vocabs()) {
      for (std::size_t rows : cuda_test::batches()) {
        auto const logits = test_rows(rows, vocab, static_cast<std::uint32_t>(vocab * 11 + rows));
        // Histories (for the penalties): a few dozen tokens per row.
        std::vector<token_id> hist;
        std::vector<std::int32_t> cu{0};
        for (std::size_t r = 0; r < rows; ++r) {
          for (std::size_t i = 0; i < 30 + r % 7; ++i)
            hist.push_back(static_cast<token_id>((r * 131 + i * i * 7) % vocab));
          cu.push_back(static_cast<std::int32_t>(hist.size()));
        }
        std::vector<specdec::philox> rngs;
        for (std::size_t r = 0; r < rows; ++r) rngs.emplace_back(77, r, 5 * r);
        std::vector<token_id> expect(rows);
        std::vector<std::vector<float>> probs(rows, std::vector<float>(vocab));
        for (std::size_t r = 0; r < rows; ++r) {
          std::span<token_id const> h(hist.data() + cu[r],
                                      static_cast<std::size_t>(cu[r + 1] - cu[r]));
          host.distribution(std::span<float const>(logits.data() + r * vocab, vocab), h, probs[r]);
          specdec::philox g = rngs[r];
          expect[r] = host.sample(probs[r], g);
        }
        auto dl = cuda_test::upload(logits);
        auto dh = cuda_test::upload(hist);
        auto dcu = cuda_test::upload(cu);
        auto drng = cuda_test::upload(rngs);
        specdec::cuda::device_buffer<token_id> dt(rows);
        specdec::cuda::device_buffer<std::int32_t> flags(rows);
        flags.zero();
        specdec::cuda::sampling_workspace ws(static_cast<std::int32_t>(vocab),
                                             static_cast<std::int32_t>(rows));
        specdec::cuda::sample_params p;
        p.logits = dl.data();
        p.stride = static_cast<std::int64_t>(vocab);
        p.rows = static_cast<std::int32_t>(rows);
        p.vocab = static_cast<std::int32_t>(vocab);
        p.history = dh.data();
        p.cu_history = dcu.data();
        p.rng = drng.data();
        p.tokens = dt.data();
        p.error_flags = flags.data();
        specdec::cuda::throw_if_failed(specdec::cuda::launch_sample(p, dev.policy(), ws, nullptr),
                                       "test");
        auto const got = cuda_test::download(dt, rows);
        auto const after = cuda_test::download(drng, rows, specdec::philox(0));
        for (auto f : cuda_test::download(flags, rows)) CHECK(f == 0);
        for (std::size_t r = 0; r < rows; ++r) {
          ++draws;
          CHECK(after[r].offset() == rngs[r].offset() + 1);
          if (got[r] == expect[r]) continue;
          double const margin = cuda_test::draw_margin(
              vocab, [&](std::size_t i) { return probs[r][i]; }, rngs[r].uniform_at(0), expect[r]);
          INFO("row " << r << " vocab " << vocab << ": host " << expect[r] << " device " << got[r]
                      << ", draw margin " << margin);
          CHECK(margin < 1e-5);
          ++rounding;
        }
      }
    }
  }
  MESSAGE("sampling: " << draws << " draws, " << rounding << " differ within rounding");
}

TEST_CASE("cuda sampling launchers validate their parameters") {
  cuda_test::require_device();
  specdec::cuda::sampling_workspace ws(111, 4);
  specdec::cuda::device_policy pol;
  specdec::cuda::sample_params p;
  CHECK(specdec::cuda::launch_sample(p, pol, ws, nullptr).ok());  // zero rows: nothing to do
  p.rows = 2;
  CHECK(specdec::cuda::launch_sample(p, pol, ws, nullptr).code ==
        specdec::cuda::status::invalid_argument);
  specdec::cuda::device_buffer<float> l(10 * 111);
  specdec::cuda::device_buffer<specdec::philox> r(10);
  specdec::cuda::device_buffer<token_id> t(10);
  p.logits = l.data();
  p.stride = 111;
  p.vocab = 111;
  p.rng = r.data();
  p.tokens = t.data();
  p.rows = 10;
  CHECK(specdec::cuda::launch_sample(p, pol, ws, nullptr).code ==
        specdec::cuda::status::out_of_range);
  specdec::sampling_params bad;
  bad.top_p = 0.0f;
  CHECK_THROWS_AS(specdec::cuda::device_sampler{bad}, specdec::error);
}
