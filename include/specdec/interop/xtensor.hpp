#pragma once
//! \file
//! Adapters between xtensor (https://github.com/xtensor-stack/xtensor) and specdec's views,
//! without copying in either direction.
//!
//! xtensor -> specdec:
//! - `as_matrix_view(e)` / `as_mutable_matrix_view(e)`: a `matrix_view` over a 2-D xtensor
//!   container, adaptor or strided view (`xt::xtensor<float, 2>`, `xt::xarray<float>` of dimension
//!   2, `xt::adapt(...)`, `xt::view(a, xt::range(...), xt::all())`, ...) whose rows are contiguous
//!   (unit column stride) and laid out top to bottom (row stride >= number of columns).
//!   Column-major data, transposes, column slices with a step, and negative strides are rejected
//!   with `errc::invalid_argument` and a message naming the shape and the strides.
//! - `as_span(e)` / `as_mutable_span(e)`: a `std::span` over a contiguous 1-D expression (logits
//!   row, token ids, positions).
//! Only expressions with a data interface (`data()`, `strides()`, `data_offset()`) can be viewed;
//! lazy expressions (`a + b`, `xt::exp(a)`) have no memory to point at: evaluate them into a
//! named container first (`xt::xtensor<float, 2> t = a + b;`). Viewing a temporary container
//! (`as_matrix_view(xt::eval(a + b))`) is a compile error: the view would dangle.
//!
//! specdec -> xtensor:
//! - `as_xtensor(matrix_view)`: a 2-D xtensor expression (a strided view over an adaptor) over
//!   the view's memory, row stride kept; writes through it reach the viewed buffer when the view
//!   is mutable.
//! - `as_xtensor(std::span)`: a 1-D adaptor.
//! - `logits_as_xtensor(result)`, `hidden_as_xtensor(result)`: the rows of a `forward_result`.
//! The adaptors do not own the memory: they are valid while the viewed buffer is (for a
//! `forward_result`, until its next forward).
//!
//! This header needs xtensor (0.24 or later) on the include path; the umbrella header
//! specdec/specdec.hpp does not include it.

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xstrided_view.hpp>
#include <xtensor/xtensor.hpp>

#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"
#include "specdec/core/views.hpp"

namespace specdec::interop {

namespace detail {

//! Whether E (cv-ref stripped) is an xtensor container that owns its elements (xt::xtensor,
//! xt::xarray, xt::xtensor_fixed and their other instantiations); a view of a temporary one
//! would dangle.
template <class E>
struct owns_elements : std::false_type {};
template <class EC, std::size_t N, xt::layout_type L, class Tag>
struct owns_elements<xt::xtensor_container<EC, N, L, Tag>> : std::true_type {};
template <class EC, xt::layout_type L, class SC, class Tag>
struct owns_elements<xt::xarray_container<EC, L, SC, Tag>> : std::true_type {};
template <class ET, class S, xt::layout_type L, bool Sharable, class Tag>
struct owns_elements<xt::xfixed_container<ET, S, L, Sharable, Tag>> : std::true_type {};

//! Formats an xtensor shape or strides sequence as "(a, b, ...)".
template <class Seq>
[[nodiscard]] std::string sequence_text(Seq const& seq) {
  std::string out = "(";
  bool first = true;
  for (auto v : seq) {
    if (!first) out += ", ";
    out += std::to_string(v);
    first = false;
  }
  return out + ")";
}

}  // namespace detail

//! An xtensor expression that exposes its memory: a container, an adaptor or a strided view.
//! Lazy expressions (`a + b`) do not model it; evaluate them first.
template <class E>
concept strided_expression = requires(E& e) {
  e.data();
  e.data_offset();
  e.strides();
  e.shape();
  e.dimension();
  typename std::remove_cvref_t<E>::value_type;
};

//! The element type viewed through expression E: `value_type`, const when E's data is read-only.
template <class E>
using viewed_element_t =
    std::remove_pointer_t<decltype(std::declval<E&>().data() + std::declval<E&>().data_offset())>;

namespace detail {

//! Pointer to the first element of `e` (its data plus its offset into that data).
template <class E>
[[nodiscard]] auto first_element(E& e) {
  return e.data() + e.data_offset();
}

//! The row-major matrix layout of a 2-D strided expression, or an error naming `who`.
template <class E>
[[nodiscard]] std::array<std::size_t, 3> matrix_layout(E const& e, char const* who) {
  SPECDEC_CHECK(e.dimension() == 2, invalid_argument, who, ": expected a 2-D expression, got ",
                e.dimension(), " dimensions of shape ", sequence_text(e.shape()));
  std::size_t const rows = e.shape()[0];
  std::size_t const cols = e.shape()[1];
  auto const row_stride = static_cast<std::ptrdiff_t>(e.strides()[0]);
  auto const col_stride = static_cast<std::ptrdiff_t>(e.strides()[1]);
  // xtensor gives a dimension of extent 1 the stride 0: its stride is then irrelevant.
  SPECDEC_CHECK(cols <= 1 || col_stride == 1, invalid_argument, who, ": the ", rows, " x ", cols,
                " expression has strides ", sequence_text(e.strides()),
                "; its columns are not contiguous (column-major, transposed or a stepped column "
                "slice). Copy it into a row-major xt::xtensor<T, 2> first");
  std::size_t stride = cols;
  if (rows > 1) {
    SPECDEC_CHECK(row_stride >= 0 && static_cast<std::size_t>(row_stride) >= cols, invalid_argument,
                  who, ": the ", rows, " x ", cols, " expression has strides ",
                  sequence_text(e.strides()), "; its rows overlap or run backwards (row stride ",
                  row_stride, " < ", cols, " columns). Copy it into a row-major xt::xtensor<T, 2>");
    stride = static_cast<std::size_t>(row_stride);
  }
  return {rows, cols, stride};
}

//! The length of a contiguous 1-D strided expression, or an error naming `who`.
template <class E>
[[nodiscard]] std::size_t vector_length(E const& e, char const* who) {
  SPECDEC_CHECK(e.dimension() == 1, invalid_argument, who, ": expected a 1-D expression, got ",
                e.dimension(), " dimensions of shape ", sequence_text(e.shape()));
  std::size_t const n = e.shape()[0];
  SPECDEC_CHECK(n <= 1 || static_cast<std::ptrdiff_t>(e.strides()[0]) == 1, invalid_argument, who,
                ": the expression of ", n, " elements has stride ", sequence_text(e.strides()),
                "; it is not contiguous (a stepped slice or a column). Copy it first");
  return n;
}

}  // namespace detail

//! A read-only `matrix_view` over a 2-D strided xtensor expression `e` (row r of the view = row r
//! of `e`; the row stride is kept, so row slices of a larger tensor need no copy). Throws
//! `errc::invalid_argument` unless `e` has 2 dimensions, unit column stride and a row stride of at
//! least its number of columns. The view is valid while `e`'s memory is.
template <strided_expression E>
requires(!detail::owns_elements<std::remove_cvref_t<E>>::value || std::is_lvalue_reference_v<E>)
    [[nodiscard]] auto as_matrix_view(E&& e) {
  using T = std::remove_const_t<viewed_element_t<std::remove_reference_t<E>>>;
  auto const [rows, cols, stride] = detail::matrix_layout(e, "as_matrix_view");
  T const* const data = detail::first_element(e);
  return matrix_view<T const>(rows == 0 || cols == 0 ? nullptr : data, rows, cols, stride);
}

//! A mutable `matrix_view` over a 2-D strided xtensor expression with writable elements; same
//! layout rules and errors as `as_matrix_view`.
template <strided_expression E>
requires(!detail::owns_elements<std::remove_cvref_t<E>>::value || std::is_lvalue_reference_v<E>)
    [[nodiscard]] auto as_mutable_matrix_view(E&& e) {
  using T = viewed_element_t<std::remove_reference_t<E>>;
  static_assert(!std::is_const_v<T>,
                "as_mutable_matrix_view: the expression's elements are read-only; use "
                "as_matrix_view");
  auto const [rows, cols, stride] = detail::matrix_layout(e, "as_mutable_matrix_view");
  T* const data = detail::first_element(e);
  return matrix_view<T>(rows == 0 || cols == 0 ? nullptr : data, rows, cols, stride);
}

//! A read-only span over a contiguous 1-D strided xtensor expression (a logits row, token ids,
//! positions). Throws `errc::invalid_argument` unless `e` has 1 dimension and unit stride.
template <strided_expression E>
requires(!detail::owns_elements<std::remove_cvref_t<E>>::value || std::is_lvalue_reference_v<E>)
    [[nodiscard]] auto as_span(E&& e) {
  using T = std::remove_const_t<viewed_element_t<std::remove_reference_t<E>>>;
  std::size_t const n = detail::vector_length(e, "as_span");
  T const* const data = detail::first_element(e);
  return std::span<T const>(data, n);
}

//! A mutable span over a contiguous 1-D strided xtensor expression with writable elements; same
//! rules and errors as `as_span`.
template <strided_expression E>
requires(!detail::owns_elements<std::remove_cvref_t<E>>::value || std::is_lvalue_reference_v<E>)
    [[nodiscard]] auto as_mutable_span(E&& e) {
  using T = viewed_element_t<std::remove_reference_t<E>>;
  static_assert(!std::is_const_v<T>,
                "as_mutable_span: the expression's elements are read-only; use as_span");
  std::size_t const n = detail::vector_length(e, "as_mutable_span");
  return std::span<T>(detail::first_element(e), n);
}

//! A 2-D xtensor expression over `view`'s memory: shape [rows, cols], strides [stride, 1] (0 for
//! a dimension of extent 1, as xtensor expects). Nothing is copied: with `matrix_view<float>`
//! writes through it reach the viewed buffer (and never the padding between rows when stride >
//! cols); with `matrix_view<float const>` it is read-only. It is an `xt::xstrided_view` over a
//! 1-D adaptor of the view's exact extent, because xtensor containers assume dense storage: a
//! container adaptor with padded strides would be filled and assigned linearly, padding included.
//! A dense view reports `layout_type::row_major`, so xtensor's linear fast paths apply to it.
template <class T>
[[nodiscard]] auto as_xtensor(matrix_view<T> view) {
  std::size_t const rows = view.rows();
  std::size_t const cols = view.cols();
  std::size_t const extent = view.empty() ? 0 : (rows - 1) * view.stride() + cols;
  std::array<std::size_t, 1> const flat_shape{extent};
  auto flat = xt::adapt(view.data(), extent, xt::no_ownership(), flat_shape);
  std::array<std::size_t, 2> shape{rows, cols};
  std::array<std::ptrdiff_t, 2> strides{
      rows <= 1 ? std::ptrdiff_t{0} : static_cast<std::ptrdiff_t>(view.stride()),
      cols <= 1 ? std::ptrdiff_t{0} : std::ptrdiff_t{1}};
  bool const dense = rows <= 1 || view.stride() == cols;
  return xt::strided_view(std::move(flat), std::move(shape), std::move(strides), 0,
                          dense ? xt::layout_type::row_major : xt::layout_type::dynamic);
}

//! A 1-D xtensor adaptor over `span` (no copy; writable when T is).
template <class T, std::size_t Extent>
[[nodiscard]] auto as_xtensor(std::span<T, Extent> span) {
  std::array<std::size_t, 1> const shape{span.size()};
  return xt::adapt(span.data(), span.size(), xt::no_ownership(), shape);
}

//! The logits of `result` as a read-only [logits_count, vocab] xtensor adaptor (row r = the r-th
//! requested row); valid until `result` is reused by the next forward.
[[nodiscard]] inline auto logits_as_xtensor(forward_result const& result) {
  return as_xtensor(result.logits_view());
}

//! The final hidden states of `result` as a read-only [n, hidden_size] adaptor (empty unless the
//! request asked for them); valid until `result` is reused.
[[nodiscard]] inline auto hidden_as_xtensor(forward_result const& result) {
  return as_xtensor(result.hidden_view());
}

}  // namespace specdec::interop
