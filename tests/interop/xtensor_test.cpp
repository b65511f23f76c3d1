#include "specdec/interop/xtensor.hpp"

#include "support/doctest.hpp"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xfixed.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/philox.hpp"
#include "specdec/core/verify_result.hpp"
#include "specdec/core/views.hpp"
#include "specdec/sampling/policy.hpp"
#include "specdec/verify/greedy.hpp"
#include "specdec/verify/tree_sampling.hpp"

namespace sd = specdec;
namespace si = specdec::interop;

namespace {

// A [rows, cols] tensor with element (r, c) = 100 r + c.
xt::xtensor<float, 2> numbered(std::size_t rows, std::size_t cols) {
  xt::xtensor<float, 2> t = xt::zeros<float>({rows, cols});
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) t(r, c) = static_cast<float>(100 * r + c);
  return t;
}

// The message of the specdec::error that `f` throws (fails the test if it throws nothing).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (sd::error const& e) {
    CHECK(e.code() == sd::errc::invalid_argument);
    return e.what();
  }
  FAIL("no specdec::error thrown");
  return {};
}

}  // namespace

TEST_CASE("as_matrix_view over a row-major xtensor and xarray shares their memory") {
  xt::xtensor<float, 2> t = numbered(3, 5);
  sd::matrix_view<float const> v = si::as_matrix_view(t);
  CHECK(v.rows() == 3);
  CHECK(v.cols() == 5);
  CHECK(v.stride() == 5);
  CHECK(v.data() == t.data());
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t c = 0; c < 5; ++c) CHECK(v(r, c) == t(r, c));

  xt::xarray<float> a = numbered(4, 2);
  auto const va = si::as_matrix_view(a);
  CHECK(va.rows() == 4);
  CHECK(va.cols() == 2);
  CHECK(va(3, 1) == 301.0f);

  // A const container gives a read-only view; a mutable one writes through.
  xt::xtensor<float, 2> const& ct = t;
  static_assert(std::is_same_v<decltype(si::as_matrix_view(ct)), sd::matrix_view<float const>>);
  sd::matrix_view<float> m = si::as_mutable_matrix_view(t);
  m(2, 4) = -1.0f;
  CHECK(t(2, 4) == -1.0f);
}

TEST_CASE("as_matrix_view keeps the row stride of row and column slices") {
  xt::xtensor<float, 2> t = numbered(6, 8);
  // Rows 2..4: contiguous, dense.
  auto rows = xt::view(t, xt::range(2, 5), xt::all());
  auto const vr = si::as_matrix_view(rows);
  CHECK(vr.rows() == 3);
  CHECK(vr.cols() == 8);
  CHECK(vr(0, 0) == 200.0f);
  CHECK(vr(2, 7) == 407.0f);
  // Columns 1..3 of every other row: rows 16 elements apart, columns contiguous.
  auto block = xt::view(t, xt::range(0, 6, 2), xt::range(1, 4));
  auto const vb = si::as_matrix_view(block);
  CHECK(vb.rows() == 3);
  CHECK(vb.cols() == 3);
  CHECK(vb.stride() == 16);
  CHECK(vb(0, 0) == 1.0f);
  CHECK(vb(1, 2) == 203.0f);
  CHECK(vb(2, 1) == 402.0f);
  // Writing through a mutable view of the slice reaches the tensor.
  auto mb = si::as_mutable_matrix_view(xt::view(t, xt::range(0, 6, 2), xt::range(1, 4)));
  mb(2, 2) = 7.5f;
  CHECK(t(4, 3) == 7.5f);
  // An adapted buffer works like a container.
  std::vector<float> buf(12);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  auto adapted =
      xt::adapt(buf.data(), buf.size(), xt::no_ownership(), std::array<std::size_t, 2>{3, 4});
  auto const va = si::as_matrix_view(adapted);
  CHECK(va.data() == buf.data());
  CHECK(va(2, 3) == 11.0f);
}

TEST_CASE("non-contiguous and column-major inputs are rejected with a clear error") {
  xt::xtensor<float, 2> t = numbered(4, 6);
  // Column-major storage.
  xt::xarray<float, xt::layout_type::column_major> cm = numbered(3, 4);
  std::string msg = error_of([&] { (void)si::as_matrix_view(cm); });
  CHECK(msg.find("as_matrix_view") != std::string::npos);
  CHECK(msg.find("columns are not contiguous") != std::string::npos);
  CHECK(msg.find("(1, 3)") != std::string::npos);  // the strides are named
  xt::xtensor<float, 2, xt::layout_type::column_major> cm2 = numbered(3, 4);
  (void)error_of([&] { (void)si::as_matrix_view(cm2); });
  // A transpose.
  (void)error_of([&] { (void)si::as_matrix_view(xt::transpose(t)); });
  // Every other column.
  (void)error_of([&] { (void)si::as_matrix_view(xt::view(t, xt::all(), xt::range(0, 6, 2))); });
  // Rows in reverse.
  msg = error_of([&] { (void)si::as_matrix_view(xt::flip(t, 0)); });
  CHECK(msg.find("backwards") != std::string::npos);
  // Wrong dimension.
  xt::xarray<float> cube = xt::zeros<float>({2, 3, 4});
  msg = error_of([&] { (void)si::as_matrix_view(cube); });
  CHECK(msg.find("2-D") != std::string::npos);
  xt::xtensor<float, 1> line = xt::zeros<float>({5});
  (void)error_of([&] { (void)si::as_matrix_view(line); });
  (void)error_of([&] { (void)si::as_span(t); });
  // A column of a row-major matrix is not contiguous; a row is.
  msg = error_of([&] { (void)si::as_span(xt::col(t, 2)); });
  CHECK(msg.find("not contiguous") != std::string::npos);
  std::span<float const> const row = si::as_span(xt::row(t, 2));
  CHECK(row.size() == 6);
  CHECK(row[5] == 205.0f);
}

TEST_CASE("degenerate shapes: extent-1 dimensions (stride 0 in xtensor) and empty tensors") {
  // One column of a column-major array is contiguous: rows 1 element apart.
  xt::xarray<float, xt::layout_type::column_major> col = numbered(4, 1);
  auto const vc = si::as_matrix_view(col);
  CHECK(vc.rows() == 4);
  CHECK(vc.cols() == 1);
  CHECK(vc(3, 0) == 300.0f);
  // A 1 x n column-major array has its columns 1 apart: a valid row.
  xt::xarray<float, xt::layout_type::column_major> one_row = numbered(1, 5);
  auto const vo = si::as_matrix_view(one_row);
  CHECK(vo.rows() == 1);
  CHECK(vo(0, 4) == 4.0f);
  xt::xtensor<float, 2> empty = xt::zeros<float>({0, 7});
  auto const ve = si::as_matrix_view(empty);
  CHECK(ve.rows() == 0);
  CHECK(ve.empty());
}

TEST_CASE("as_span views token ids and logits rows of 1-D expressions") {
  xt::xtensor<std::int32_t, 1> tokens = {1, 403, 407, 261, 378};
  std::span<sd::token_id const> const ids = si::as_span(tokens);
  CHECK(ids.size() == 5);
  CHECK(ids.data() == tokens.data());
  CHECK(ids[4] == 378);
  std::span<std::int32_t> const mut = si::as_mutable_span(tokens);
  mut[0] = 2;
  CHECK(tokens(0) == 2);
  // A contiguous slice keeps its offset.
  auto const tail = si::as_span(xt::view(tokens, xt::range(2, 5)));
  CHECK(tail.size() == 3);
  CHECK(tail[0] == 407);
  (void)error_of([&] { (void)si::as_span(xt::view(tokens, xt::range(0, 5, 2))); });
}

TEST_CASE("as_xtensor adapts matrix views, spans and forward results without copying") {
  std::vector<float> data(4 * 6);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  // A 4 x 5 view with row stride 6.
  sd::matrix_view<float> view(data.data(), 4, 5, 6);
  auto x = si::as_xtensor(view);
  CHECK(x.dimension() == 2);
  CHECK(x.shape()[0] == 4);
  CHECK(x.shape()[1] == 5);
  CHECK(x(3, 4) == 22.0f);
  CHECK(x.data() == data.data());
  x(1, 2) = -3.0f;  // writes through
  CHECK(data[8] == -3.0f);
  // Round trip: xtensor -> matrix_view -> xtensor -> matrix_view gives back the same memory.
  auto const back = si::as_matrix_view(x);
  CHECK(back.data() == view.data());
  CHECK(back.rows() == 4);
  CHECK(back.cols() == 5);
  CHECK(back.stride() == 6);
  // Assigning through the adaptor writes the 4 x 5 elements and leaves the row padding alone.
  xt::xtensor<float, 2> const saved = x;
  x.fill(-7.0f);
  for (std::size_t r = 0; r < 4; ++r) {
    for (std::size_t c = 0; c < 5; ++c) CHECK(data[r * 6 + c] == -7.0f);
    CHECK(data[r * 6 + 5] == static_cast<float>(r * 6 + 5));
  }
  x = saved + 0.0f;
  CHECK(data[8] == -3.0f);
  CHECK(data[5] == 5.0f);
  // A dense view is row-major for xtensor (linear fast paths) and fills exactly its elements.
  std::vector<float> dense_buf(6, 1.0f);
  auto dx = si::as_xtensor(sd::matrix_view<float>(dense_buf.data(), 2, 3));
  CHECK(dx.layout() == xt::layout_type::row_major);
  CHECK(x.layout() == xt::layout_type::dynamic);
  dx.fill(2.0f);
  CHECK(std::count(dense_buf.begin(), dense_buf.end(), 2.0f) == 6);
  // xtensor algorithms run on it; copying gives a dense tensor with the same values.
  xt::xtensor<float, 2> const dense = x;
  CHECK(dense.shape()[1] == 5);
  CHECK(dense(3, 4) == 22.0f);
  CHECK(xt::sum(x)() == doctest::Approx(xt::sum(dense)()));
  // Read-only views give read-only adaptors.
  sd::matrix_view<float const> const cview = view;
  auto const cx = si::as_xtensor(cview);
  CHECK(cx(0, 1) == 1.0f);
  // 1-D.
  std::span<float> const row = view.row(2);
  auto xr = si::as_xtensor(row);
  CHECK(xr.dimension() == 1);
  CHECK(xr.size() == 5);
  xr(0) = 99.0f;
  CHECK(data[12] == 99.0f);
  // One-row and one-column views follow xtensor's convention of stride 0 on extent-1 dimensions.
  auto const one = si::as_xtensor(sd::matrix_view<float const>(data.data(), 1, 3));
  CHECK(one.strides()[0] == 0);
  CHECK(one(0, 2) == 2.0f);
  auto const empty = si::as_xtensor(sd::matrix_view<float const>());
  CHECK(empty.size() == 0);

  sd::forward_result result;
  result.vocab = 3;
  result.logits_count = 2;
  result.logits = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f};
  result.hidden_size = 2;
  result.hidden = {1.0f, 2.0f, 3.0f, 4.0f};
  auto const logits = si::logits_as_xtensor(result);
  CHECK(logits.shape()[0] == 2);
  CHECK(logits.shape()[1] == 3);
  CHECK(logits(1, 2) == 5.5f);
  CHECK(logits.data() == result.logits.data());
  auto const hidden = si::hidden_as_xtensor(result);
  CHECK(hidden.shape()[0] == 2);
  CHECK(hidden(1, 0) == 3.0f);
}

TEST_CASE("verifiers read logits straight from an xtensor") {
  // Target logits for a 3-node chain over a vocabulary of 6, kept by the engine in an xtensor.
  xt::xtensor<float, 2> logits = xt::zeros<float>({3, 6});
  logits(0, 4) = 5.0f;  // after the root: 4 (drafted: 4, accepted)
  logits(1, 2) = 5.0f;  // after 4: 2 (drafted: 3, rejected; bonus 2)
  logits(2, 1) = 5.0f;
  std::vector<sd::token_id> const drafts{4, 3};
  sd::draft_tree const tree = sd::draft_tree::chain(0, drafts);
  std::vector<sd::token_id> const history{0};
  sd::greedy_verifier v;
  sd::philox rng(1);
  sd::verify_result out;
  v.verify(tree, si::as_matrix_view(logits), sd::greedy{}, history, rng, out);
  CHECK(out.num_accepted() == 1);
  CHECK(out.tokens == std::vector<sd::token_id>{4, 2});

  // The same rows embedded in a wider buffer (a row slice): identical decisions under sampling.
  xt::xtensor<float, 2> wide = xt::zeros<float>({5, 6});
  xt::view(wide, xt::range(1, 4), xt::all()) = logits;
  sd::sampling_params params;
  params.temperature = 0.8f;
  sd::sampler const policy(params);
  sd::tree_verifier tv;
  sd::philox rng_a(7);
  sd::philox rng_b(7);
  sd::verify_result a;
  sd::verify_result b;
  tv.verify(tree, si::as_matrix_view(logits), policy, history, rng_a, a);
  tv.verify(tree, si::as_matrix_view(xt::view(wide, xt::range(1, 4), xt::all())), policy, history,
            rng_b, b);
  CHECK(a.tokens == b.tokens);
  CHECK(a.accepted_nodes == b.accepted_nodes);
  CHECK(rng_a.offset() == rng_b.offset());
}

// Compile-time rules: lazy expressions have no memory, temporaries would dangle.
template <class E>
concept viewable = requires(E&& e) {
  si::as_matrix_view(std::forward<E>(e));
};
static_assert(viewable<xt::xtensor<float, 2>&>);
static_assert(viewable<xt::xtensor<float, 2> const&>);
static_assert(viewable<xt::xarray<float>&>);
static_assert(!viewable<xt::xtensor<float, 2>>);  // a temporary container
static_assert(!viewable<xt::xarray<float>>);
static_assert(!viewable<xt::xtensor_fixed<float, xt::xshape<2, 3>>>);
static_assert(viewable<xt::xtensor_fixed<float, xt::xshape<2, 3>>&>);
static_assert(!viewable<decltype(std::declval<xt::xtensor<float, 2>&>() + 1.0f)>);  // lazy
static_assert(si::strided_expression<xt::xtensor<float, 2>>);
static_assert(!si::strided_expression<decltype(std::declval<xt::xtensor<float, 2>&>() * 2.0f)>);
