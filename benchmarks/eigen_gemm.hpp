#pragma once
//! \file
//! The weight-times-activations product of the CPU backend's `detail::cpu::gemm_nt` written with
//! Eigen (Map + noalias): the yardstick of bench_model's matmul_vs_eigen, which measures the tiled
//! kernels against it (docs/cpu_backend.md). Not part of the library: the backend does not use
//! Eigen, and bench_model compiles this header only when CMake finds Eigen 3.4. It may allocate
//! (Eigen's GEMM packing buffers) when n > 1.

#include <cstddef>

// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics (the undefined
// pass-through register of the unmasked forms) once Eigen's kernels are inlined; not a defect of
// this code or Eigen's.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <Eigen/Core>

namespace bench {

//! y[t, r] (+)= sum_j w[r, j] x[t, j] for weight rows r in [r0, r1) and tokens t in [0, n): the
//! same contract as `gemm_nt` (w rows ldw apart, x [n, k] rows ldx apart, y rows ldy apart).
inline void eigen_gemm_nt(float const* w, std::size_t ldw, std::size_t r0, std::size_t r1,
                          float const* x, std::size_t ldx, std::size_t n, std::size_t k, float* y,
                          std::size_t ldy, bool accumulate) {
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using const_map = Eigen::Map<row_major const, Eigen::Unaligned, Eigen::OuterStride<>>;
  using map = Eigen::Map<row_major, Eigen::Unaligned, Eigen::OuterStride<>>;
  auto const idx = [](std::size_t v) { return static_cast<Eigen::Index>(v); };
  const_map const wm(w + r0 * ldw, idx(r1 - r0), idx(k), Eigen::OuterStride<>(idx(ldw)));
  const_map const xm(x, idx(n), idx(k), Eigen::OuterStride<>(idx(ldx)));
  map ym(y + r0, idx(n), idx(r1 - r0), Eigen::OuterStride<>(idx(ldy)));
  if (accumulate)
    ym.noalias() += xm * wm.transpose();
  else
    ym.noalias() = xm * wm.transpose();
}

}  // namespace bench

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
