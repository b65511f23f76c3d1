// The pivot kernels (backend/cuda/pivot_sampling.cuh) against their host twin
// (reference/pivot.hpp, itself checked against sampler on the host) and the radix kernel they
// replace, on rows that exercise every branch of the search: long runs of ties at the cut (the
// adjacent-ends path), -inf entries, peaked and flat rows, every vocabulary and batch of the
// sweeps (rows shared by clusters of blocks at small batches on capability 9.0 and above); and the
// fused draw against sampler::sample with the same Philox word, whatever the block split.

#include "support/doctest.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "backend/cuda/test_util.cuh"
#include "specdec/backend/cuda/distribution.cuh"
#include "specdec/backend/cuda/pivot_sampling.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/reference/pivot.hpp"
#include "specdec/sampling/policy.hpp"

namespace {

namespace sd = specdec;
namespace sc = specdec::cuda;
using sd::token_id;

// Rows: peaked, flat, integer logits (ties everywhere), a constant block at the top (a run of
// ties longer than the gather at the top-k cut), -inf entries.
std::vector<float> pivot_rows(std::size_t rows, std::size_t vocab, std::uint32_t seed) {
  std::vector<float> out = cuda_test::random_logits(rows, vocab, seed, 2.0f, true);
  for (std::size_t r = 0; r < rows; ++r) {
    float* row = out.data() + r * vocab;
    switch (r % 5) {
      case 1:
        for (std::size_t i = 0; i < vocab; ++i) row[i] *= 0.05f;
        break;
      case 2:
        for (std::size_t i = 0; i < vocab; ++i) row[i] = std::round(row[i]);
        break;
      case 3:
        for (std::size_t i = 0; i < vocab; i += 3) row[i] = 9.0f;
        break;
      case 4:
        for (std::size_t i = 0; i < vocab; i += 4) row[i] = -INFINITY;
        break;
      default:
        break;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("cuda pivot distribution equals its host twin and the radix kernel") {
  cuda_test::require_device();
  std::vector<sd::sampling_params> params(6);
  params[0].top_k = 50;
  params[1].top_p = 0.9f;
  params[2].temperature = 0.7f;
  params[2].top_k = 3000;
  params[2].top_p = 0.5f;
  params[3].min_p = 0.1f;
  params[3].top_p = 0.99f;
  params[4].top_k = 1;
  params[5].temperature = 1.6f;
  std::size_t rows_total = 0, same_twin = 0, same_radix = 0;
  for (auto const& sp : params) {
    sc::device_sampler const dev(sp);
    for (std::size_t vocab : cuda_test::vocabs()) {
      for (std::size_t rows : cuda_test::batches()) {
        auto const logits = pivot_rows(rows, vocab, static_cast<std::uint32_t>(vocab * 3 + rows));
        auto dl = cuda_test::upload(logits);
        sc::device_buffer<float> dp(logits.size()), dr(logits.size());
        sc::device_buffer<std::int32_t> flags(rows);
        flags.zero();
        sc::distribution_params p;
        p.z = dl.data();
        p.z_stride = static_cast<std::int64_t>(vocab);
        p.probs = dp.data();
        p.probs_stride = p.z_stride;
        p.rows = static_cast<std::int32_t>(rows);
        p.vocab = static_cast<std::int32_t>(vocab);
        p.policy = dev.policy();
        p.row_flags = flags.data();
        sc::throw_if_failed(sc::launch_distribution(p, nullptr), "pivot");
        p.probs = dr.data();
        sc::throw_if_failed(sc::launch_distribution_radix(p, nullptr), "radix");
        auto const got = cuda_test::download(dp, logits.size());
        auto const radix = cuda_test::download(dr, logits.size());
        for (auto f : cuda_test::download(flags, rows)) CHECK(f == 0);
        for (std::size_t r = 0; r < rows; ++r) {
          ++rows_total;
          std::vector<float> twin(vocab);
          (void)sd::reference_pivot_distribution(
              std::span<float const>(logits.data() + r * vocab, vocab), sp, twin);
          bool kept_twin = true, kept_radix = true;
          double rel = 0.0;
          for (std::size_t i = 0; i < vocab; ++i) {
            float const a = got[r * vocab + i];
            kept_twin = kept_twin && ((a > 0.0f) == (twin[i] > 0.0f));
            kept_radix = kept_radix && ((a > 0.0f) == (radix[r * vocab + i] > 0.0f));
            if (twin[i] > 0.0f)
              rel = std::max(rel, std::abs(static_cast<double>(a) - twin[i]) / twin[i]);
          }
          same_twin += kept_twin ? 1 : 0;
          same_radix += kept_radix ? 1 : 0;
          INFO("T " << sp.temperature << ", top_k " << sp.top_k << ", top_p " << sp.top_p
                    << ", min_p " << sp.min_p << "; vocab " << vocab << ", row " << r);
          // The same decisions as the twin (masses summed in another order can move a top-p cut
          // only within rounding, which these rows do not come near).
          CHECK(kept_twin);
          if (kept_twin) CHECK(rel <= 1e-5);
        }
      }
    }
  }
  MESSAGE("pivot distribution: " << rows_total << " rows, " << same_twin
                                 << " with the twin's kept set, " << same_radix
                                 << " with the radix kernel's");
}

TEST_CASE("cuda pivot sampling draws sampler's token with the same Philox word") {
  cuda_test::require_device();
  std::vector<sd::sampling_params> params(4);
  params[0].top_k = 50;
  params[1].top_p = 0.9f;
  params[2].temperature = 0.6f;
  params[2].min_p = 0.05f;
  params[3].temperature = 0.0f;
  std::size_t draws = 0, rounding = 0;
  for (auto const& sp : params) {
    sd::sampler const host(sp);
    sc::device_sampler const dev(sp);
    for (std::size_t vocab : cuda_test::vocabs()) {
      for (std::size_t rows : cuda_test::batches()) {
        auto const logits = pivot_rows(rows, vocab, static_cast<std::uint32_t>(vocab + 7 * rows));
        std::vector<sd::philox> rngs;
        for (std::size_t r = 0; r < rows; ++r) rngs.emplace_back(91, r, 3 * r);
        auto dl = cuda_test::upload(logits);
        auto drng = cuda_test::upload(rngs);
        sc::device_buffer<float> scratch(logits.size());
        sc::device_buffer<token_id> dt(rows);
        sc::device_buffer<std::int32_t> flags(rows);
        flags.zero();
        sc::pivot_params p;
        p.z = dl.data();
        p.z_stride = static_cast<std::int64_t>(vocab);
        p.rows = static_cast<std::int32_t>(rows);
        p.vocab = static_cast<std::int32_t>(vocab);
        p.policy = dev.policy();
        p.probs = scratch.data();
        p.probs_stride = p.z_stride;
        p.rng = drng.data();
        p.tokens = dt.data();
        p.error_flags = flags.data();
        sc::throw_if_failed(sc::launch_pivot_sample(p, nullptr), "test");
        auto const got = cuda_test::download(dt, rows);
        auto const after = cuda_test::download(drng, rows, sd::philox(0));
        for (auto f : cuda_test::download(flags, rows)) CHECK(f == 0);
        for (std::size_t r = 0; r < rows; ++r) {
          ++draws;
          std::vector<float> probs(vocab);
          host.distribution(std::span<float const>(logits.data() + r * vocab, vocab), {}, probs);
          sd::philox g = rngs[r];
          token_id const want = host.sample(probs, g);
          CHECK(after[r].offset() == rngs[r].offset() + 1);
          if (got[r] == want) continue;
          double const margin = cuda_test::draw_margin(
              vocab, [&](std::size_t i) { return probs[i]; }, rngs[r].uniform_at(0), want);
          INFO("row " << r << " vocab " << vocab << ": host " << want << " device " << got[r]
                      << ", draw margin " << margin);
          CHECK(margin < 1e-5);
          ++rounding;
        }
      }
    }
  }
  MESSAGE("pivot sampling: " << draws << " draws, " << rounding << " differ within rounding");
}

TEST_CASE("cuda pivot kernels flag bad rows and check their parameters") {
  cuda_test::require_device();
  std::vector<float> logits(3 * 4096, 0.25f);
  logits[17] = NAN;
  logits[4096 + 9] = INFINITY;
  auto dl = cuda_test::upload(logits);
  std::vector<sd::philox> const rngs(3, sd::philox(5, 0, 40));
  auto drng = cuda_test::upload(rngs);
  sc::device_buffer<float> dp(logits.size());
  sc::device_buffer<token_id> dt(3);
  sc::device_buffer<std::int32_t> flags(3);
  flags.zero();
  sd::sampling_params sp;
  sp.top_p = 0.8f;
  sc::device_sampler const dev(sp);
  sc::pivot_params p;
  p.z = dl.data();
  p.z_stride = 4096;
  p.rows = 3;
  p.vocab = 4096;
  p.policy = dev.policy();
  p.probs = dp.data();
  p.probs_stride = 4096;
  p.rng = drng.data();
  p.tokens = dt.data();
  p.error_flags = flags.data();
  sc::throw_if_failed(sc::launch_pivot_sample(p, nullptr), "test");
  auto const f = cuda_test::download(flags, 3);
  auto const after = cuda_test::download(drng, 3, sd::philox(0));
  CHECK(f[0] == sc::non_finite_logit);
  CHECK(f[1] == sc::non_finite_logit);
  CHECK(f[2] == 0);
  CHECK(after[0].offset() == 40);  // flagged rows keep their generator
  CHECK(after[2].offset() == 41);
  // Parameters the kernels refuse.
  sc::pivot_params bad = p;
  bad.vocab = 0;
  CHECK(sc::launch_pivot_sample(bad, nullptr).code == sc::status::invalid_argument);
  bad = p;
  bad.policy.num_bias = 1;  // bias and penalties run before
  CHECK(sc::launch_pivot_sample(bad, nullptr).code == sc::status::invalid_argument);
  bad = p;
  bad.tokens = nullptr;
  CHECK(sc::launch_pivot_sample(bad, nullptr).code == sc::status::invalid_argument);
  bad = p;
  bad.probs = dl.data() + 1;  // overlaps z partially
  CHECK(sc::launch_pivot_distribution(bad, nullptr).code == sc::status::invalid_argument);
}
