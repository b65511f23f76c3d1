#pragma once
//! \file
//! How `cuda_llama` stores its matrices on the device, as plain host code (no CUDA header): the
//! element type (`weight_dtype`: float32, IEEE binary16 or bfloat16), rows padded to a multiple of
//! 8 elements (16 bytes, so that every row starts aligned for vector loads) and `pack_rows`, the
//! host conversion that fills a device-bound buffer. float32 to binary16 / bfloat16 rounds to
//! nearest, ties to even (model/half.hpp); a matrix stored as F16 or BF16 in a GGUF file, which the
//! readers convert exactly to float32, packs back to its original bits.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "specdec/core/error.hpp"
#include "specdec/model/half.hpp"

namespace specdec {

//! Element type of a `cuda_llama`'s matrices (embedding, attention and FFN matrices, classifier)
//! on the device. The norm vectors, the activations, the KV cache and the logits stay float32;
//! every product accumulates in float32.
enum class weight_dtype : std::uint8_t {
  f32,   //!< float32 (the default; the greedy-equality tests run on it)
  f16,   //!< IEEE binary16
  bf16,  //!< bfloat16
};

//! "f32", "f16" or "bf16".
[[nodiscard]] constexpr std::string_view to_string(weight_dtype t) noexcept {
  switch (t) {
    case weight_dtype::f32:
      return "f32";
    case weight_dtype::f16:
      return "f16";
    case weight_dtype::bf16:
      return "bf16";
  }
  return "?";
}

//! The dtype named "f32", "f16" or "bf16"; nothing for another text.
[[nodiscard]] constexpr std::optional<weight_dtype> parse_weight_dtype(
    std::string_view text) noexcept {
  for (weight_dtype t : {weight_dtype::f32, weight_dtype::f16, weight_dtype::bf16})
    if (text == to_string(t)) return t;
  return std::nullopt;
}

//! Bytes of one element.
[[nodiscard]] constexpr std::size_t dtype_bytes(weight_dtype t) noexcept {
  return t == weight_dtype::f32 ? 4 : 2;
}

namespace cuda {

//! Elements per padded row unit: rows are padded to a multiple of 8 elements, 16 bytes or more.
inline constexpr std::size_t row_align_elements = 8;

//! The padded length (elements between row starts) of rows of `cols` elements.
[[nodiscard]] constexpr std::size_t padded_cols(std::size_t cols) noexcept {
  return (cols + row_align_elements - 1) / row_align_elements * row_align_elements;
}

//! Bytes of a [rows, cols] matrix packed by `pack_rows`.
[[nodiscard]] constexpr std::size_t packed_bytes(std::size_t rows, std::size_t cols,
                                                 weight_dtype t) noexcept {
  return rows * padded_cols(cols) * dtype_bytes(t);
}

//! Packs the row-major float32 matrix `src` [rows, cols] into `dst` (`packed_bytes(rows, cols, t)`
//! bytes, any alignment): row r at byte r * padded_cols(cols) * dtype_bytes(t), its elements
//! converted to `t` (round to nearest, ties to even), the padding zero. Throws
//! `errc::numerical` naming `what` and the entry when a value is not finite or overflows binary16
//! (an infinite weight would turn every product it enters into NaN).
inline void pack_rows(float const* src, std::size_t rows, std::size_t cols, weight_dtype t,
                      std::byte* dst, char const* what) {
  std::size_t const ld = padded_cols(cols);
  std::size_t const esize = dtype_bytes(t);
  for (std::size_t r = 0; r < rows; ++r) {
    float const* in = src + r * cols;
    std::byte* out = dst + r * ld * esize;
    if (t == weight_dtype::f32) {
      std::memcpy(out, in, cols * sizeof(float));
    } else {
      for (std::size_t c = 0; c < cols; ++c) {
        std::uint16_t const h =
            t == weight_dtype::f16 ? float_to_half(in[c]) : float_to_bf16(in[c]);
        float const back = t == weight_dtype::f16 ? half_to_float(h) : bf16_to_float(h);
        SPECDEC_CHECK(back - back == 0.0f, numerical, what, ": entry (", r, ", ", c, ") = ", in[c],
                      " is not finite as ", to_string(t));
        std::memcpy(out + c * 2, &h, 2);
      }
    }
    if (ld > cols) std::memset(out + cols * esize, 0, (ld - cols) * esize);
  }
}

}  // namespace cuda
}  // namespace specdec
