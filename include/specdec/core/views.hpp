#pragma once
//! \file
//! Non-owning row-major matrix views over logits, probabilities and hidden states.

#include <cstddef>
#include <span>
#include <type_traits>

#include "specdec/core/error.hpp"

namespace specdec {

//! A non-owning view of a row-major matrix of `T` with a row stride (in elements) >= `cols`.
//! `matrix_view<float const>` is the read-only form; a `matrix_view<float>` converts to it.
template <class T>
class matrix_view {
 public:
  using element_type = T;

  //! An empty view (0 x 0).
  constexpr matrix_view() noexcept = default;

  //! A view of `rows` x `cols` elements at `data`, rows `stride` elements apart (default: dense).
  constexpr matrix_view(T* data, std::size_t rows, std::size_t cols, std::size_t stride = 0)
      : data_(data), rows_(rows), cols_(cols), stride_(stride == 0 ? cols : stride) {
    SPECDEC_CHECK(stride_ >= cols_, invalid_argument, "matrix_view: stride ", stride_,
                  " is smaller than the row length ", cols_);
    SPECDEC_CHECK(data_ != nullptr || rows_ == 0 || cols_ == 0, invalid_argument,
                  "matrix_view: null data for a ", rows_, " x ", cols_, " view");
  }

  //! A dense view over `span`, which must hold exactly rows * cols elements.
  constexpr matrix_view(std::span<T> span, std::size_t rows, std::size_t cols)
      : matrix_view(span.data(), rows, cols) {
    SPECDEC_CHECK(span.size() == rows * cols, invalid_argument, "matrix_view: a span of ",
                  span.size(), " elements cannot be viewed as ", rows, " x ", cols);
  }

  //! Read-only conversion.
  template <class U>
  requires(std::is_const_v<T>&& std::is_same_v<std::remove_const_t<T>, U>) constexpr matrix_view(
      matrix_view<U> other) noexcept  // NOLINT: implicit by design
      : data_(other.data()), rows_(other.rows()), cols_(other.cols()), stride_(other.stride()) {}

  [[nodiscard]] constexpr std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] constexpr std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] constexpr std::size_t stride() const noexcept { return stride_; }
  [[nodiscard]] constexpr T* data() const noexcept { return data_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return rows_ == 0 || cols_ == 0; }

  //! Row `r` (unchecked; see `at_row` for the checked form).
  [[nodiscard]] constexpr std::span<T> row(std::size_t r) const noexcept {
    return std::span<T>(data_ + r * stride_, cols_);
  }
  //! Row `r`, throwing `errc::out_of_range` when r >= rows().
  [[nodiscard]] constexpr std::span<T> at_row(std::size_t r) const {
    SPECDEC_CHECK(r < rows_, out_of_range, "matrix_view: row ", r, " of a view with ", rows_,
                  " rows");
    return row(r);
  }
  //! Element (r, c), unchecked.
  [[nodiscard]] constexpr T& operator()(std::size_t r, std::size_t c) const noexcept {
    return data_[r * stride_ + c];
  }
  //! Rows [first, first + count) as a view.
  [[nodiscard]] constexpr matrix_view subrows(std::size_t first, std::size_t count) const {
    SPECDEC_CHECK(first <= rows_ && count <= rows_ - first, out_of_range, "matrix_view: rows [",
                  first, ", ", first + count, ") of a view with ", rows_, " rows");
    return count == 0 ? matrix_view() : matrix_view(data_ + first * stride_, count, cols_, stride_);
  }

 private:
  T* data_ = nullptr;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::size_t stride_ = 0;
};

}  // namespace specdec
