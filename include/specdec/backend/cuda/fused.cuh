#pragma once
//! \file
//! The fused small-batch kernels of `cuda_llama` (llama.cuh): for a forward of at most
//! `fused_max_tokens` tokens (a decode step, a short chain), each matrix product is one
//! matrix-vector kernel that streams the weights once for every token and does the work around
//! the product in the same launch:
//!
//! - the RMSNorm before it, folded into its input: sum_j W[o, j] * (w[j] * (s * x[j])) =
//!   s * sum_j W[o, j] * (w[j] * x[j]) with s = 1 / sqrt(mean(x^2) + eps), and every warp sums
//!   x^2 over the row it reads anyway, so the norm costs no pass and no launch of its own;
//! - after the QKV product, RoPE on the q and k pairs and the append of k and v to the cache
//!   (`matvec_out::rope_append`);
//! - after the gate/up product, SwiGLU (`matvec_out::swiglu`: each warp computes a gate row and its
//!   up row);
//! - after the output and down projections, the residual add (`matvec_out::add`).
//!
//! A layer is then four of these and the attention kernel, instead of the nine launches of the
//! reference path (llama.cuh's unfused forward, which the tests compare with). Weights are read in
//! their dtype (float32, binary16 or bfloat16) and converted in registers; inputs, accumulation
//! and outputs are float32. Sums run in another order than cuBLAS's, so logits differ from the
//! reference path by float rounding.
//!
//! Work split: one warp per pair of output rows (RoPE pairs (2i, 2i + 1); SwiGLU's gate row j and
//! up row hidden + j), each lane reading 8 consecutive weights of both rows per step (16-byte
//! loads) and the same 8 inputs of every token (read-only cache), so a weight is read once and used
//! for every token. Requires rows padded to multiples of 8 elements (weights.cuh) and input rows
//! whose starts are 16-byte aligned (strides multiples of 4 floats); `fused_supported` checks a
//! model's shape.
//!
//! The kernels are templates (common.cuh says why).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "specdec/backend/cuda/common.cuh"
#include "specdec/backend/cuda/dtype.cuh"
#include "specdec/backend/cuda/weights.cuh"

namespace specdec::cuda {

//! Most tokens (batch rows, and logits rows) a fused forward takes.
inline constexpr int fused_max_tokens = 8;

//! What a fused matrix-vector kernel does with its two output rows (see the file comment).
enum class matvec_out {
  store,        //!< y[t, o] = result (the logits)
  add,          //!< y[t, o] += result (the residual stream)
  rope_append,  //!< q rows: RoPE, y[t, o] = result; k rows: RoPE, into the cache; v: into it
  swiglu,       //!< y[t, j] = silu(gate) * up, gate row j and up row hidden + j
};

//! The parameters of one fused matrix-vector launch. All pointers are device pointers.
struct matvec_params {
  device_matrix w;                       //!< [out, in] weights (rows padded to 8 elements)
  float const* x = nullptr;              //!< [*, x_stride] input rows
  std::int64_t x_stride = 0;             //!< floats between input rows (a multiple of 4)
  std::int32_t const* x_rows = nullptr;  //!< [n] input row of token t, or null for row t
  std::int32_t n = 0;                    //!< tokens, 1..fused_max_tokens
  float const* norm = nullptr;           //!< [in] RMSNorm weight folded in, or null for none
  float eps = 0.0f;                      //!< RMSNorm epsilon
  float* y = nullptr;                    //!< [n, y_stride] outputs (q rows for rope_append)
  std::int64_t y_stride = 0;             //!< floats between output rows
  // rope_append: the rows are [q (dim) | k (kv_dim) | v (kv_dim)].
  std::int32_t const* positions = nullptr;  //!< [n] RoPE positions
  std::int32_t const* base = nullptr;       //!< [1] cache slot of token 0 (token t: *base + t)
  float* keys = nullptr;                    //!< [capacity, kv_dim] the layer's K plane
  float* values = nullptr;                  //!< [capacity, kv_dim] the layer's V plane
  std::int32_t dim = 0;                     //!< query width
  std::int32_t kv_dim = 0;                  //!< key / value width
  std::int32_t head_size = 0;               //!< RoPE pairs rotate within a head
  float theta = 10000.0f;                   //!< RoPE base
  // swiglu
  std::int32_t hidden = 0;  //!< gate rows [0, hidden), up rows [hidden, 2 hidden)
};

namespace detail {

//! Threads per block of the fused matrix-vector kernels (4 warps, one pair of rows each).
inline constexpr int matvec_threads = 128;

#if defined(__CUDACC__)

//! The fused matrix-vector product (see the file comment): warp g computes output rows
//! (2g, 2g + 1), or (g, hidden + g) for SwiGLU, for every token.
template <class W, matvec_out Out>
__global__ void __launch_bounds__(matvec_threads) matvec_kernel(matvec_params p) {
  constexpr int T = fused_max_tokens;
  std::int32_t const lane = static_cast<std::int32_t>(threadIdx.x) & 31;
  std::int32_t const g = static_cast<std::int32_t>(
      (blockIdx.x * static_cast<unsigned>(matvec_threads) + threadIdx.x) >> 5);
  std::int32_t r0 = 0, r1 = 0;  // the warp's rows; r1 < 0 when row 2g + 1 does not exist
  if constexpr (Out == matvec_out::swiglu) {
    if (g >= p.hidden) return;  // warp-uniform: no shuffle is left half done
    r0 = g;
    r1 = p.hidden + g;
  } else {
    r0 = 2 * g;
    if (r0 >= p.w.rows) return;
    r1 = r0 + 1 < p.w.rows ? r0 + 1 : -1;
  }
  W const* const w0 = static_cast<W const*>(p.w.data) + static_cast<std::int64_t>(r0) * p.w.ld;
  W const* const w1 = r1 >= 0
                          ? static_cast<W const*>(p.w.data) + static_cast<std::int64_t>(r1) * p.w.ld
                          : w0;  // a missing row repeats row r0; its result is dropped
  std::int32_t const n = p.n;
  std::int32_t const in = p.w.cols;
  bool const norm = p.norm != nullptr;
  float const* xs[T];
#pragma unroll
  for (int t = 0; t < T; ++t) {
    std::int32_t const row = t < n ? (p.x_rows != nullptr ? p.x_rows[t] : t) : 0;
    xs[t] = p.x + static_cast<std::int64_t>(row) * p.x_stride;
  }
  float acc0[T], acc1[T], ss[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = ss[t] = 0.0f;

  std::int32_t const in8 = in & ~7;
#pragma unroll 2
  for (std::int32_t c = lane * 8; c < in8; c += 32 * 8) {
    float a[8], b[8];
    load8(w0 + c, a);
    load8(w1 + c, b);
    float nw[8];
    if (norm) {
      load8(p.norm + c, nw);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) nw[k] = 1.0f;
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < n) {
        float xv[8];
        load8(xs[t] + c, xv);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          ss[t] = fmaf(xv[k], xv[k], ss[t]);
          float const v = nw[k] * xv[k];
          acc0[t] = fmaf(a[k], v, acc0[t]);
          acc1[t] = fmaf(b[k], v, acc1[t]);
        }
      }
    }
  }
  for (std::int32_t c = in8 + lane; c < in; c += 32) {  // the columns after the last 8
    float const a = to_float(w0[c]), b = to_float(w1[c]);
    float const nw = norm ? p.norm[c] : 1.0f;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < n) {
        float const xv = xs[t][c];
        ss[t] = fmaf(xv, xv, ss[t]);
        float const v = nw * xv;
        acc0[t] = fmaf(a, v, acc0[t]);
        acc1[t] = fmaf(b, v, acc1[t]);
      }
    }
  }
  // Every lane gets every sum; lane t writes token t's outputs.
  float y0 = 0.0f, y1 = 0.0f, sq = 0.0f;
#pragma unroll
  for (int t = 0; t < T; ++t) {
    if (t < n) {
      float const s0 = warp_sum(acc0[t]);
      float const s1 = warp_sum(acc1[t]);
      float const s2 = norm ? warp_sum(ss[t]) : 0.0f;
      if (lane == t) {
        y0 = s0;
        y1 = s1;
        sq = s2;
      }
    }
  }
  if (lane >= n) return;
  std::int32_t const t = lane;
  if (norm) {
    float const s = 1.0f / sqrtf(sq / static_cast<float>(in) + p.eps);
    y0 *= s;
    y1 *= s;
  }
  float* const y = p.y + static_cast<std::int64_t>(t) * p.y_stride;
  if constexpr (Out == matvec_out::store) {
    y[r0] = y0;
    if (r1 >= 0) y[r1] = y1;
  } else if constexpr (Out == matvec_out::add) {
    y[r0] += y0;
    if (r1 >= 0) y[r1] += y1;
  } else if constexpr (Out == matvec_out::swiglu) {
    float gate = y0;
    gate *= 1.0f / (1.0f + expf(-gate));
    y[r0] = gate * y1;
  } else {
    // RoPE as rope_kernel (elementwise.cuh): pair (j, j + 1) of q or k, j even.
    std::int64_t const slot = static_cast<std::int64_t>(*p.base) + t;
    if (r0 < p.dim + p.kv_dim) {
      std::int32_t const j = r0 < p.dim ? r0 : r0 - p.dim;
      std::int32_t const in_head = j % p.head_size;
      float const freq =
          1.0f / powf(p.theta, static_cast<float>(in_head) / static_cast<float>(p.head_size));
      float const val = static_cast<float>(p.positions[t]) * freq;
      float const fcr = cosf(val), fci = sinf(val);
      float const a = y0 * fcr - y1 * fci;
      float const b = y0 * fci + y1 * fcr;
      if (r0 < p.dim) {
        y[r0] = a;
        y[r0 + 1] = b;
      } else {
        float* k = p.keys + slot * p.kv_dim;
        k[j] = a;
        k[j + 1] = b;
      }
    } else {
      std::int32_t const j = r0 - p.dim - p.kv_dim;
      float* v = p.values + slot * p.kv_dim;
      v[j] = y0;
      v[j + 1] = y1;
    }
  }
}

#endif  // __CUDACC__

}  // namespace detail

//! Whether a model of this shape can take the fused kernels: float inputs read 4 at a time need
//! widths that are multiples of 4 (so that every row of the activations starts 16-byte aligned),
//! and RoPE pairs and the q / k / v boundaries fall on even rows.
[[nodiscard]] constexpr bool fused_supported(std::int32_t dim, std::int32_t hidden,
                                             std::int32_t kv_dim) noexcept {
  return dim % 4 == 0 && hidden % 4 == 0 && kv_dim % 2 == 0;
}

#if defined(__CUDACC__)

//! Launches the fused matrix-vector kernel `Out` for weights of element type W (see
//! `matvec_params`). Checks the shapes and pointers it can see; never throws.
template <class W, matvec_out Out>
inline launch_status launch_matvec(matvec_params const& p, cudaStream_t stream) noexcept {
  if (p.n < 1 || p.n > fused_max_tokens || p.w.data == nullptr || p.x == nullptr ||
      p.y == nullptr || p.w.rows <= 0 || p.w.cols <= 0 || p.w.ld < p.w.cols || p.w.ld % 8 != 0 ||
      p.x_stride < p.w.cols || p.x_stride % 4 != 0)
    return fail(status::invalid_argument, "launch_matvec: shapes");
  std::int64_t groups = (p.w.rows + 1) / 2;
  if constexpr (Out == matvec_out::swiglu) {
    if (p.hidden <= 0 || 2 * static_cast<std::int64_t>(p.hidden) != p.w.rows ||
        p.y_stride < p.hidden)
      return fail(status::invalid_argument, "launch_matvec: swiglu rows");
    groups = p.hidden;
  } else if constexpr (Out == matvec_out::rope_append) {
    if (p.positions == nullptr || p.base == nullptr || p.keys == nullptr || p.values == nullptr ||
        p.dim <= 0 || p.kv_dim <= 0 || p.head_size <= 0 || p.dim % 2 != 0 || p.kv_dim % 2 != 0 ||
        p.head_size % 2 != 0 || p.w.rows != p.dim + 2 * p.kv_dim || p.y_stride < p.dim)
      return fail(status::invalid_argument, "launch_matvec: rope_append rows");
  } else {
    if (p.y_stride < p.w.rows) return fail(status::invalid_argument, "launch_matvec: y_stride");
  }
  constexpr std::int64_t warps = detail::matvec_threads / 32;
  auto const blocks = static_cast<unsigned>((groups + warps - 1) / warps);
  detail::matvec_kernel<W, Out><<<blocks, detail::matvec_threads, 0, stream>>>(p);
  return last_launch_status("launch_matvec");
}

#endif  // __CUDACC__

}  // namespace specdec::cuda
