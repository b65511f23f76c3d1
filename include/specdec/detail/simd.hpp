#pragma once
//! \file
//! The portable vector layer of the library's row kernels (sampling, drawing, verification,
//! drafting): `vfloat` / `vint` vectors of `simd_width` lanes, loads and stores, selects, lane
//! reductions in a fixed order, the branch-free scalar helpers the kernels share, and the vector
//! `exp_nonpositive`. Internals (namespace `specdec::detail`), not API.
//!
//! With GCC or Clang the vectors are the compilers' vector extensions: `simd_width` floats per
//! vector (16 with AVX-512, 8 with AVX, else 4). Elsewhere, or when `SPECDEC_SCALAR_SIMD` is
//! defined, the vectors are small structs of 4 lanes with the same operators, computed lane by
//! lane (the "scalar fallback"; the tests build it with GCC to keep it correct). Every reduction
//! the kernels make runs over `row_lanes` = 16 logical lanes combined in a fixed order whatever
//! the width, so results do not depend on which of these is used; the exp keeps its products from
//! being fused with the additions after them (`vector_exp_ops::mul`), so no flag or target changes
//! its bits either.
//!
//! The layer itself is kernels/simd.inl and kernels/simd_exp.inl, written once and included here
//! in `specdec::detail` at the level of the compiler flags (what the generic templates of
//! sampling/draw.hpp and verify/ use), and by detail/rows.hpp once per CPU target
//! (core/cpu_target.hpp) for the row kernels it dispatches at run time.
//!
//! The CPU model backend's matrix and attention kernels use native registers instead
//! (backend/cpu/kernels/registers.inl): they need masked loads, fused multiply-adds and register
//! tiling that the vector extensions do not express.
//!
//! The kernels use vector conditions through `select(mask, a, b)` (a mask lane is -1 for true and
//! 0 for false), never `mask ? a : b`, so that the fallback compiles.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "specdec/detail/exp.hpp"

#if !defined(SPECDEC_SCALAR_SIMD) && (defined(__GNUC__) || defined(__clang__))
//! 1 when the vectors are GCC / Clang vector extensions, 0 for the scalar fallback.
#define SPECDEC_VECTOR_EXTENSIONS 1
#else
#define SPECDEC_VECTOR_EXTENSIONS 0
#endif

#if SPECDEC_VECTOR_EXTENSIONS
//! Always inline (a hint; only GCC and Clang are told).
#define SPECDEC_INLINE [[gnu::always_inline]] inline
#else
#define SPECDEC_INLINE inline
#endif

#if SPECDEC_VECTOR_EXTENSIONS && defined(__SSE__)
#include <immintrin.h>
#endif

// The flags' level: 2 with AVX-512F, 1 with AVX, else 0.
#if SPECDEC_VECTOR_EXTENSIONS && defined(__AVX512F__)
#define SPECDEC_KERNEL_LEVEL 2
#elif SPECDEC_VECTOR_EXTENSIONS && defined(__AVX__)
#define SPECDEC_KERNEL_LEVEL 1
#else
#define SPECDEC_KERNEL_LEVEL 0
#endif

namespace specdec::detail {
// clang-format off
#include "specdec/detail/kernels/simd.inl"
#include "specdec/detail/kernels/simd_exp.inl"
// clang-format on
}  // namespace specdec::detail

#undef SPECDEC_KERNEL_LEVEL
