// Host-side logic of the CUDA headers, checked without a GPU: the headers compile as plain C++
// (device code is compiled only under nvcc), launch statuses map to specdec::error, device error
// flags are reported, ragged layouts and chunk plans are consistent.

#include "support/doctest.hpp"

#include <cstdint>
#include <vector>

#include "specdec/backend/cuda/attention.cuh"
#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/distribution.cuh"
#include "specdec/backend/cuda/draw.cuh"
#include "specdec/backend/cuda/elementwise.cuh"
#include "specdec/backend/cuda/greedy_walk.cuh"
#include "specdec/backend/cuda/heads.cuh"
#include "specdec/backend/cuda/kv_cache.cuh"
#include "specdec/backend/cuda/llama.cuh"
#include "specdec/backend/cuda/pivot_sampling.cuh"
#include "specdec/backend/cuda/policy.cuh"
#include "specdec/backend/cuda/process_logits.cuh"
#include "specdec/backend/cuda/row_stats.cuh"
#include "specdec/backend/cuda/sampling.cuh"
#include "specdec/backend/cuda/softmax.cuh"
#include "specdec/backend/cuda/tree.cuh"
#include "specdec/backend/cuda/verify.cuh"
#include "specdec/backend/cuda/walk.cuh"
#include "specdec/backend/cuda/walk_common.cuh"

namespace sc = specdec::cuda;

TEST_CASE("launch statuses map to specdec::error codes") {
  CHECK_NOTHROW(sc::throw_if_failed(sc::launch_status{}, "here"));
  auto const code_of = [](sc::launch_status s) {
    try {
      sc::throw_if_failed(s, "here");
    } catch (specdec::error const& e) {
      return e.code();
    }
    return specdec::errc::internal;
  };
  CHECK(code_of(sc::fail(sc::status::invalid_argument, "x")) == specdec::errc::invalid_argument);
  CHECK(code_of(sc::fail(sc::status::out_of_range, "x")) == specdec::errc::out_of_range);
  CHECK(code_of(sc::launch_status{sc::status::cuda_error, cudaErrorInvalidValue, "x"}) ==
        specdec::errc::internal);
  try {
    sc::throw_if_failed(sc::fail(sc::status::invalid_argument, "launch_x: vocab"), "caller");
    FAIL("no exception");
  } catch (specdec::error const& e) {
    std::string const what = e.what();
    CHECK(what.find("caller") != std::string::npos);
    CHECK(what.find("launch_x: vocab") != std::string::npos);
  }
}

TEST_CASE("device error flags name the sequence and the problem") {
  std::vector<std::int32_t> flags{0, 0, 0};
  CHECK_NOTHROW(sc::throw_if_flagged(flags, "v"));
  flags[2] = sc::token_out_of_range;
  CHECK_THROWS_WITH_AS(sc::throw_if_flagged(flags, "v"),
                       doctest::Contains("sequence 2 has a token id outside the vocabulary"),
                       specdec::error);
  flags[2] = sc::non_finite_logit;
  try {
    sc::throw_if_flagged(flags, "v");
  } catch (specdec::error const& e) {
    CHECK(e.code() == specdec::errc::numerical);
  }
  flags[2] = sc::bad_tree;
  try {
    sc::throw_if_flagged(flags, "v");
  } catch (specdec::error const& e) {
    CHECK(e.code() == specdec::errc::invalid_argument);
  }
}

TEST_CASE("ragged and padded layouts") {
  constexpr auto p = sc::ragged_layout::padded(4, 9);
  static_assert(p.valid());
  static_assert(p.total_rows == 36);
  CHECK(p.begin(2) == 18);
  CHECK(p.end(2) == 27);
  std::vector<std::int32_t> cu{0, 3, 3, 10};
  auto const r = sc::ragged_layout::ragged(cu.data(), 3, 10, 7);
  CHECK(r.valid());
  CHECK(r.begin(1) == 3);
  CHECK(r.end(1) == 3);
  CHECK(r.end(2) == 10);
  sc::ragged_layout bad = sc::ragged_layout::padded(2, 3);
  bad.total_rows = 5;
  CHECK_FALSE(bad.valid());
}

TEST_CASE("chunk plans cover the row in multiples of the host's exp block") {
  for (std::int32_t vocab : {1, 111, 512, 513, 32000, 128256, 151936}) {
    for (std::int64_t rows : {1, 5, 7, 64, 1000, 100000}) {
      for (std::int32_t sms : {1, 108, 132}) {
        auto const plan = sc::plan_chunks(vocab, rows, sms);
        CHECK(plan.size % sc::host_row_block == 0);
        CHECK(plan.size > 0);
        CHECK(plan.count >= 1);
        CHECK(plan.count <= sc::max_chunks(vocab));
        CHECK(static_cast<std::int64_t>(plan.count) * plan.size >= vocab);
        CHECK(static_cast<std::int64_t>(plan.count - 1) * plan.size < vocab);
        CHECK(plan.size <= sc::max_blocks_per_chunk * sc::host_row_block);
        // Enough rows and a short row: one block per row.
        if (rows >= 2 * sms && vocab <= sc::max_blocks_per_chunk * sc::host_row_block)
          CHECK(plan.count == 1);
      }
    }
  }
  CHECK(sc::plan_chunks(0, 3, 1).count == 0);
  CHECK(sc::max_chunks(128256) == 251);
}

TEST_CASE("device policy flags follow the sampling parameters") {
  sc::device_policy p;
  CHECK_FALSE(p.processing());
  CHECK_FALSE(p.truncation());
  p.frequency_penalty = 0.5f;
  CHECK(p.penalties());
  CHECK(p.processing());
  p = {};
  p.num_bias = 1;
  CHECK(p.processing());
  CHECK_FALSE(p.penalties());
  p = {};
  p.top_p = 0.9f;
  CHECK(p.truncation());
  p = {};
  p.min_p = 0.1f;
  CHECK(p.truncation());
}

TEST_CASE("launchers are declared only for CUDA translation units; parameter structs are usable") {
  sc::verify_inputs in;
  CHECK(in.layout.batch == 0);
  sc::tree_mask_params tm;
  CHECK(tm.mask == nullptr);
  sc::kv_compaction_params kv;
  CHECK(kv.num_planes == 0);
  specdec::cuda_llama_options o;
  CHECK(o.max_context == 0);
}

TEST_CASE("pivot plans: rows shared by clusters while multiprocessors are idle") {
  constexpr std::size_t h100 = 227 * 1024, a100 = 163 * 1024;
  // Batch 1 on capability 9.0: 8 blocks (the portable cluster) of 16384 entries, in shared memory.
  constexpr auto big = sc::plan_pivot(128256, 1, 132, 9, h100);
  static_assert(big.group == 8 && big.chunk == 16384 && big.staged);
  static_assert(big.chunk % sc::host_row_block == 0);
  constexpr auto mid = sc::plan_pivot(32000, 1, 132, 9, h100);
  static_assert(mid.group == 8 && mid.chunk == 4096 && mid.staged);
  // Larger batches keep about two blocks per multiprocessor.
  constexpr auto batch64 = sc::plan_pivot(32000, 64, 132, 9, h100);
  static_assert(batch64.group == 4 && batch64.chunk == 8192);
  static_assert(sc::plan_pivot(32000, 512, 132, 9, h100).group == 1);
  // No clusters before capability 9.0: one block per row, in shared memory when it fits.
  constexpr auto a = sc::plan_pivot(32000, 1, 108, 8, a100);
  static_assert(a.group == 1 && a.chunk == 32256 && a.staged);
  static_assert(!sc::plan_pivot(128256, 1, 108, 8, a100).staged);
  // Small rows: one block.
  static_assert(sc::plan_pivot(111, 1, 132, 9, h100).group == 1);
  static_assert(sc::plan_pivot(111, 1, 132, 9, h100).chunk == 512);
  // Every entry is covered: group * chunk >= vocab > (group - 1) * chunk.
  for (std::int32_t vocab : {1, 111, 512, 513, 4113, 32000, 128256, 151936})
    for (std::int32_t rows : {1, 7, 64, 1000})
      for (int major : {8, 9}) {
        auto const p = sc::plan_pivot(vocab, rows, 132, major, h100);
        CHECK(static_cast<std::int64_t>(p.group) * p.chunk >= vocab);
        CHECK(static_cast<std::int64_t>(p.group - 1) * p.chunk < vocab);
        CHECK(p.group <= sc::pivot_max_group);
        CHECK(p.chunk % sc::host_row_block == 0);
      }
}
