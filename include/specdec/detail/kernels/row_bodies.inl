//! \file
//! The row kernels' bodies in the order they depend on each other: what detail/rows.hpp compiles
//! once per CPU target (see there).

// clang-format off
#include "specdec/detail/kernels/simd.inl"
#include "specdec/detail/kernels/exp_with.inl"
#include "specdec/detail/kernels/simd_exp.inl"
#include "specdec/detail/kernels/rows.inl"
// clang-format on
