//! \file
//! The kernel bodies in the order they depend on each other, then this target's table: what
//! backend/cpu/kernels.hpp includes once per CPU target (see there).

// clang-format off
#include "specdec/backend/cpu/kernels/registers.inl"
#include "specdec/backend/cpu/kernels/gemm.inl"
#include "specdec/backend/cpu/kernels/packed.inl"
#include "specdec/backend/cpu/kernels/attention.inl"
#include "specdec/backend/cpu/kernels/elementwise.inl"
#include "specdec/backend/cpu/kernels/table.inl"
// clang-format on
