//! \file
//! Compiles a kernel body once per compiled CPU target (core/cpu_target.hpp): the one home of the
//! mechanism that backend/cpu/kernels.hpp and detail/rows.hpp use. Before including it, define
//! - `SPECDEC_EACH_TARGET_NAMESPACE`: the namespace the copies go under (each copy in
//!   `<it>::baseline`, `<it>::avx2`, `<it>::avx512`);
//! - `SPECDEC_EACH_TARGET_BODY`: the body's include path (a string literal);
//! Each copy sees `SPECDEC_KERNEL_LEVEL` (0, 1, 2) and `this_target`. The two macros are undefined
//! after use.

#if SPECDEC_TARGET_BASELINE
namespace SPECDEC_EACH_TARGET_NAMESPACE::baseline {
#define SPECDEC_KERNEL_LEVEL 0
inline constexpr cpu_target this_target = cpu_target::baseline;
#include SPECDEC_EACH_TARGET_BODY
#undef SPECDEC_KERNEL_LEVEL
}  // namespace SPECDEC_EACH_TARGET_NAMESPACE::baseline
#endif

#if SPECDEC_TARGET_AVX2
SPECDEC_BEGIN_TARGET(SPECDEC_AVX2_FEATURES)
namespace SPECDEC_EACH_TARGET_NAMESPACE::avx2 {
#define SPECDEC_KERNEL_LEVEL 1
inline constexpr cpu_target this_target = cpu_target::avx2;
#include SPECDEC_EACH_TARGET_BODY
#undef SPECDEC_KERNEL_LEVEL
}  // namespace SPECDEC_EACH_TARGET_NAMESPACE::avx2
SPECDEC_END_TARGET
#endif

#if SPECDEC_TARGET_AVX512
SPECDEC_BEGIN_TARGET(SPECDEC_AVX512_FEATURES)
namespace SPECDEC_EACH_TARGET_NAMESPACE::avx512 {
#define SPECDEC_KERNEL_LEVEL 2
inline constexpr cpu_target this_target = cpu_target::avx512;
#include SPECDEC_EACH_TARGET_BODY
#undef SPECDEC_KERNEL_LEVEL
}  // namespace SPECDEC_EACH_TARGET_NAMESPACE::avx512
SPECDEC_END_TARGET
#endif

#undef SPECDEC_EACH_TARGET_NAMESPACE
#undef SPECDEC_EACH_TARGET_BODY
