#pragma once
//! \file
//! What a forward on the device leaves on the device: `cuda::device_rows`, a view of float rows in
//! device memory (a type of its own, so that no host code can take its rows for host memory), and
//! `cuda_forward_result`, the logits of a `cuda_llama` forward that stay where they were computed.
//! A model that declares `using device_forward_result = cuda_forward_result;` lets the
//! speculative decoder hand its rows straight to a verifier that reads device rows
//! (step_verifier.cuh), so that a step copies back only the verification's outcome.

#include <cstddef>

#include "specdec/core/error.hpp"

namespace specdec {
namespace cuda {

//! A [rows, cols] row-major view of floats in device memory, rows `stride` floats apart. Host
//! code may pass it around and take sub-views, never read through it.
class device_rows {
 public:
  constexpr device_rows() noexcept = default;
  //! A view of `rows` rows of `cols` floats at `data` (device memory), `stride` (>= cols; 0 =
  //! cols) floats apart.
  constexpr device_rows(float const* data, std::size_t rows, std::size_t cols,
                        std::size_t stride = 0) noexcept
      : data_(data), rows_(rows), cols_(cols), stride_(stride == 0 ? cols : stride) {}

  [[nodiscard]] constexpr float const* data() const noexcept { return data_; }
  [[nodiscard]] constexpr std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] constexpr std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] constexpr std::size_t stride() const noexcept { return stride_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return rows_ == 0 || cols_ == 0; }
  //! Rows [first, first + count). Throws `errc::out_of_range` beyond the view.
  [[nodiscard]] constexpr device_rows subrows(std::size_t first, std::size_t count) const {
    SPECDEC_CHECK(first <= rows_ && count <= rows_ - first, out_of_range, "device_rows: rows [",
                  first, ", ", first + count, ") of a view of ", rows_);
    return count == 0 ? device_rows() : device_rows(data_ + first * stride_, count, cols_, stride_);
  }

 private:
  float const* data_ = nullptr;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::size_t stride_ = 0;
};

}  // namespace cuda

//! The logits of a `cuda_llama` forward, left on the device: rows in request order (row r = batch
//! token r, or logits_rows[r] when given), valid until the model's next forward. Filled by
//! `cuda_llama::forward(req, cuda_forward_result&)`, which does not wait for the device.
struct cuda_forward_result {
  cuda::device_rows logits;      //!< [logits_count, vocab] on the device
  std::size_t vocab = 0;         //!< entries per row
  std::size_t logits_count = 0;  //!< rows

  //! The logits rows (device memory).
  [[nodiscard]] cuda::device_rows logits_view() const noexcept { return logits; }
};

}  // namespace specdec
