#pragma once
//! \file
//! The CPU model backend's kernels for each compiled CPU target (core/cpu_target.hpp), and the
//! table a model calls them through (`model_kernels`, `model_kernels_for`). Internal to
//! backend/cpu.
//!
//! The kernel bodies (kernels/*.inl: registers, matrix products, attention, elementwise) are
//! included here once per compiled target, each time in a namespace of its own
//! (`specdec::detail::cpu::baseline`, `::avx2`, `::avx512`) under a `target` pragma and with
//! `SPECDEC_KERNEL_LEVEL` set to 0, 1 or 2, which is how they choose their registers. Everything a
//! body calls is in that body or target-independent (backend/cpu/attention.hpp,
//! backend/cpu/packed_gemm.hpp), so each copy is compiled, and inlined, for its own instruction
//! set; a model reaches them only through its table, one indirect call per kernel call (a kernel
//! call covers rows, heads or a matrix block: the call is noise beside it).
//!
//! Why not Google Highway: the kernels are written against the instruction sets' own registers
//! (masked loads, register tiles sized to the register file, AVX-512 scale and rounding
//! instructions), which Highway would make a rewrite of every kernel; its dynamic dispatch is this
//! same mechanism (a body re-included per target under target attributes). Why not
//! `target_clones`: it compiles one source for several targets, while the bodies differ per target
//! (register types, tile sizes), and it needs an ifunc resolver per function.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "specdec/backend/cpu/attention.hpp"
#include "specdec/backend/cpu/packed_gemm.hpp"
#include "specdec/core/cpu_target.hpp"
#include "specdec/core/error.hpp"
#include "specdec/core/forward.hpp"

namespace specdec::detail::cpu {

//! Weight rows per tile of `gemm_nt` (and the unit the pool splits its rows in).
inline constexpr std::size_t tile_rows = 4;

//! The entry points of one target's kernels (see kernels/*.inl for what each computes).
struct model_kernels {
  cpu_target target;        //!< the instruction set they are compiled for
  std::size_t width;        //!< floats per register (`packed_matrix::width` of their products)
  bool transposed8;         //!< whether heads of 8 floats take the transposed path (`scores8`)
  std::size_t value_chunk;  //!< head sizes that `attend_heads` sums by vectors (0: none)
  void (*gemm_nt)(float const* w, std::size_t ldw, std::size_t r0, std::size_t r1, float const* x,
                  std::size_t ldx, std::size_t n, std::size_t k, float* y, std::size_t ldy,
                  bool accumulate) noexcept;
  //! `packed_gemm` storing, adding, or pairing through SwiGLU (`panel_op`).
  void (*packed_store)(packed_matrix const& w, std::size_t v0, std::size_t v1, float const* x,
                       std::size_t ldx, std::size_t n, float* y, std::size_t ldy) noexcept;
  void (*packed_add)(packed_matrix const& w, std::size_t v0, std::size_t v1, float const* x,
                     std::size_t ldx, std::size_t n, float* y, std::size_t ldy) noexcept;
  void (*packed_swiglu)(packed_matrix const& w, std::size_t v0, std::size_t v1, float const* x,
                        std::size_t ldx, std::size_t n, float* y, std::size_t ldy) noexcept;
  void (*rmsnorm)(float* out, float const* x, float const* weight, std::size_t n,
                  float eps) noexcept;
  void (*rope)(float* v, std::size_t heads, std::size_t head_size, float const* cos_sin) noexcept;
  void (*swiglu)(float* gate, float const* up, std::size_t n) noexcept;
  void (*add_silu)(float* x, float const* y, float const* bias, std::size_t n) noexcept;
  void (*transpose_rows8)(float const* x, std::size_t ld, std::size_t n, float* out) noexcept;
  void (*transpose_gather8)(float const* const* rows, float* out) noexcept;
  float (*scores8)(float const* q, float const* kt, std::size_t n, float scale, float* s) noexcept;
  void (*softmax_values8)(float const* s, std::size_t n, float max, float const* vt,
                          std::size_t from, float const* tail, float* out) noexcept;
  float (*row_max)(float const* s, std::size_t n) noexcept;
  void (*attend_heads)(float const* q, float const* kc, float const* vc, std::size_t ldkv,
                       std::size_t hs, std::size_t per_kv, std::size_t h0, std::size_t h1,
                       std::size_t end, row_run const* runs, std::size_t n_runs, std::size_t length,
                       float* scores, std::size_t stride, float* att) noexcept;
  void (*add_cache_scores)(float const* q, float const* k, std::size_t ldk, std::size_t hs,
                           row_run const* runs, std::size_t n_runs, std::size_t length,
                           std::size_t past, kv_score_kind kind, float* s, float* out) noexcept;

  //! `packed_gemm` with the operation `op`.
  void packed(panel_op op, packed_matrix const& w, std::size_t v0, std::size_t v1, float const* x,
              std::size_t ldx, std::size_t n, float* y, std::size_t ldy) const noexcept {
    (op == panel_op::store ? packed_store
     : op == panel_op::add ? packed_add
                           : packed_swiglu)(w, v0, v1, x, ldx, n, y, ldy);
  }
};

}  // namespace specdec::detail::cpu

// ---- the kernel bodies, once per compiled target.
#define SPECDEC_EACH_TARGET_NAMESPACE specdec::detail::cpu
#define SPECDEC_EACH_TARGET_BODY "specdec/backend/cpu/kernels/bodies.inl"
#include "specdec/detail/kernels/each_target.inl"

namespace specdec::detail::cpu {
inline namespace SPECDEC_TARGETS_NAMESPACE {

//! The kernels of target `t`; `errc::unsupported` if this build or CPU lacks it.
[[nodiscard]] inline model_kernels const& model_kernels_for(cpu_target t) {
  check_cpu_target(t, "CPU model kernels");
  switch (t) {
#if SPECDEC_TARGET_AVX512
    case cpu_target::avx512:
      return avx512::table;
#endif
#if SPECDEC_TARGET_AVX2
    case cpu_target::avx2:
      return avx2::table;
#endif
#if SPECDEC_TARGET_BASELINE
    case cpu_target::baseline:
      return baseline::table;
#endif
    default:
      break;
  }
  SPECDEC_THROW(internal, "no CPU model kernels for target ", to_string(t));
}

//! The kernels of the active target (`active_cpu_target`).
[[nodiscard]] inline model_kernels const& active_model_kernels() {
  return model_kernels_for(active_cpu_target());
}

}  // namespace SPECDEC_TARGETS_NAMESPACE
}  // namespace specdec::detail::cpu
