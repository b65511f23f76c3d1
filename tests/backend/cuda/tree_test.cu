// Tree masks, depths and positions built on the device equal draft_tree's; KV compaction moves
// exactly the accepted rows.

#include "support/doctest.hpp"

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/test_util.cuh"
#include "specdec/backend/cuda/tree.cuh"
#include "specdec/core/draft_tree.hpp"

TEST_CASE("cuda tree masks and positions equal draft_tree's ancestor masks and depths") {
  cuda_test::require_device();
  std::mt19937 gen(3);
  for (std::size_t nodes : {std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{130}}) {
    std::size_t const batch = 5;
    std::vector<specdec::draft_tree> trees;
    std::vector<std::int32_t> parents, cu{0}, base;
    for (std::size_t b = 0; b < batch; ++b) {
      std::size_t const n = 1 + (nodes - 1) * (b + 1) / batch;
      specdec::draft_tree t(n);
      t.reset(0);
      for (std::size_t i = 1; i < n; ++i)
        t.add_node(static_cast<specdec::node_index>(gen() % i), static_cast<specdec::token_id>(i));
      parents.insert(parents.end(), t.parents().begin(), t.parents().end());
      cu.push_back(cu.back() + static_cast<std::int32_t>(n));
      base.push_back(static_cast<std::int32_t>(100 * b));
      trees.push_back(std::move(t));
    }
    auto const stride = static_cast<std::int32_t>(specdec::mask_words(nodes));
    auto const total = static_cast<std::size_t>(cu.back());
    auto dpar = cuda_test::upload(parents);
    auto dcu = cuda_test::upload(cu);
    auto dbase = cuda_test::upload(base);
    specdec::cuda::device_buffer<std::uint64_t> mask(total * static_cast<std::size_t>(stride));
    specdec::cuda::device_buffer<std::int32_t> depth(total), pos(total), flags(batch);
    flags.zero();
    specdec::cuda::tree_mask_params p;
    p.layout = specdec::cuda::ragged_layout::ragged(dcu.data(), static_cast<std::int32_t>(batch),
                                                    static_cast<std::int32_t>(total),
                                                    static_cast<std::int32_t>(nodes));
    p.parents = dpar.data();
    p.base_positions = dbase.data();
    p.mask = mask.data();
    p.mask_stride = stride;
    p.depths = depth.data();
    p.positions = pos.data();
    p.error_flags = flags.data();
    specdec::cuda::throw_if_failed(specdec::cuda::launch_build_tree_masks(p), "test");
    SPECDEC_CUDA_CHECK(cudaDeviceSynchronize());
    auto const m = cuda_test::download(mask, total * static_cast<std::size_t>(stride));
    auto const dd = cuda_test::download(depth, total);
    auto const pp = cuda_test::download(pos, total);
    auto const ff = cuda_test::download(flags, batch);
    for (std::size_t b = 0; b < batch; ++b) {
      CHECK(ff[b] == 0);
      auto const& t = trees[b];
      for (std::size_t i = 0; i < t.size(); ++i) {
        std::size_t const r = static_cast<std::size_t>(cu[b]) + i;
        CHECK(dd[r] == t.depth(static_cast<specdec::node_index>(i)));
        CHECK(pp[r] == base[b] + t.depth(static_cast<specdec::node_index>(i)));
        for (std::size_t j = 0; j < t.size(); ++j) {
          bool const bit = (m[r * static_cast<std::size_t>(stride) + j / 64] >> (j % 64)) & 1u;
          CHECK(bit == t.is_ancestor_or_self(static_cast<specdec::node_index>(j),
                                             static_cast<specdec::node_index>(i)));
        }
      }
    }
  }
}

TEST_CASE("cuda tree masks flag parents that do not precede their node") {
  cuda_test::require_device();
  std::vector<std::int32_t> parents{-1, 0, 2, -1, 0, 0};  // sequence 0: node 2's parent is itself
  std::vector<std::int32_t> cu{0, 3, 6};
  auto dpar = cuda_test::upload(parents);
  auto dcu = cuda_test::upload(cu);
  specdec::cuda::device_buffer<std::uint64_t> mask(6);
  specdec::cuda::device_buffer<std::int32_t> flags(2);
  flags.zero();
  specdec::cuda::tree_mask_params p;
  p.layout = specdec::cuda::ragged_layout::ragged(dcu.data(), 2, 6, 3);
  p.parents = dpar.data();
  p.mask = mask.data();
  p.mask_stride = 1;
  p.error_flags = flags.data();
  specdec::cuda::throw_if_failed(specdec::cuda::launch_build_tree_masks(p), "test");
  auto const f = cuda_test::download(flags, 2);
  CHECK(f[0] == specdec::cuda::bad_tree);
  CHECK(f[1] == 0);
  // Host-side validation.
  p.mask_stride = 0;
  CHECK(specdec::cuda::launch_build_tree_masks(p).code == specdec::cuda::status::invalid_argument);
  p.mask_stride = 1;
  p.parents = nullptr;
  CHECK(specdec::cuda::launch_build_tree_masks(p).code == specdec::cuda::status::invalid_argument);
}

TEST_CASE("cuda KV compaction keeps the accepted rows in order") {
  cuda_test::require_device();
  std::int32_t const planes = 3, width = 37, capacity = 40, batch = 4;
  std::size_t const plane_size = static_cast<std::size_t>(batch) * capacity * width;
  std::vector<float> host(plane_size * planes);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  auto data = cuda_test::upload(host);
  std::vector<float*> ptrs;
  for (std::int32_t p = 0; p < planes; ++p)
    ptrs.push_back(data.data() + static_cast<std::size_t>(p) * plane_size);
  auto dptrs = cuda_test::upload(ptrs);
  std::vector<std::int32_t> base{5, 0, 10, 3};
  std::vector<std::int32_t> keep{1, 3, 4, /*seq1*/ 0, 1, 2, /*seq2*/ 2, 9, /*seq3*/ 4, 2};
  std::vector<std::int32_t> cu{0, 3, 6, 8, 10};  // sequence 3's list is not ascending: untouched
  auto dbase = cuda_test::upload(base);
  auto dkeep = cuda_test::upload(keep);
  auto dcu = cuda_test::upload(cu);
  specdec::cuda::device_buffer<std::int32_t> flags(batch);
  flags.zero();
  specdec::cuda::kv_compaction_params p;
  p.planes = dptrs.data();
  p.num_planes = planes;
  p.row_width = width;
  p.seq_stride = static_cast<std::int64_t>(capacity) * width;
  p.capacity = capacity;
  p.batch = batch;
  p.base = dbase.data();
  p.cu_keep = dcu.data();
  p.keep = dkeep.data();
  p.error_flags = flags.data();
  specdec::cuda::throw_if_failed(specdec::cuda::launch_compact_kv(p), "test");
  auto const out = cuda_test::download(data, host.size());
  auto const f = cuda_test::download(flags, static_cast<std::size_t>(batch));
  CHECK(f[0] == 0);
  CHECK(f[1] == 0);
  CHECK(f[2] == 0);
  CHECK(f[3] == specdec::cuda::bad_tree);
  // Expected: the same moves done sequentially on the host.
  std::vector<float> expect = host;
  for (std::int32_t b = 0; b < 3; ++b) {
    for (std::int32_t pl = 0; pl < planes; ++pl) {
      float* seq = expect.data() + static_cast<std::size_t>(pl) * plane_size +
                   static_cast<std::size_t>(b) * capacity * width;
      for (std::int32_t i = cu[b]; i < cu[b + 1]; ++i) {
        std::int32_t const src = base[b] + keep[i], dst = base[b] + (i - cu[b]);
        for (std::int32_t e = 0; e < width; ++e) seq[dst * width + e] = seq[src * width + e];
      }
    }
  }
  CHECK(out == expect);
}
