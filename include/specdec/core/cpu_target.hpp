#pragma once
//! \file
//! The instruction set the CPU kernels run on (`cpu_target`), chosen once at run time from the CPU
//! the program finds, and forcible for tests and benchmarks.
//!
//! specdec is header-only, so its kernels are compiled with the flags of whoever includes them.
//! With GCC or Clang on x86-64 and no `-m` flag that enables AVX2 (a plain Release build, as
//! distributions and most engines ship), the kernel headers are compiled three times, once per
//! target (the baseline of the flags, AVX2 + FMA, AVX-512), each copy in a namespace of its own
//! under a `target` pragma, and the copy for the best target this CPU supports is called. When
//! the flags already enable AVX2 + FMA (`-march=native` on an AVX2 machine) or AVX-512F, only that
//! target is compiled, as before. Elsewhere (another compiler or architecture,
//! `SPECDEC_SCALAR_SIMD`, or a CUDA translation unit, whose host front end cannot take the copies),
//! only the baseline is compiled. The functions whose definition depends on the set of compiled
//! targets live in an inline namespace named after it (`SPECDEC_TARGETS_NAMESPACE`), so that
//! translation units compiled with different sets (a CUDA unit, a -march unit) link without two
//! definitions of one function; the choice itself is one for the whole program.
//!
//! The choice: the environment variable `SPECDEC_CPU_TARGET` (`baseline`, `avx2`, `avx512`) if
//! set, else the best compiled target the CPU supports; `set_cpu_target` changes it. A model picks
//! its kernels (and the layout of its packed weights) when it is built and keeps them; sampling and
//! verification read the choice at each call. Sampling and verification give bit-identical results
//! on every target; a model's logits may differ in the last bits between targets (fused
//! multiply-adds, register widths), like between machines.

#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>

#include "specdec/core/error.hpp"

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && \
    !defined(SPECDEC_SCALAR_SIMD) && !defined(__CUDACC__)
#if defined(__AVX512F__)
#define SPECDEC_TARGET_BASELINE 0
#define SPECDEC_TARGET_AVX2 0
#define SPECDEC_TARGET_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define SPECDEC_TARGET_BASELINE 0
#define SPECDEC_TARGET_AVX2 1
#define SPECDEC_TARGET_AVX512 0
#else
//! 1 when the kernels are compiled for the flags' own baseline.
#define SPECDEC_TARGET_BASELINE 1
//! 1 when the kernels are compiled for AVX2 + FMA (+ F16C).
#define SPECDEC_TARGET_AVX2 1
//! 1 when the kernels are compiled for AVX-512 (F, BW, DQ, VL).
#define SPECDEC_TARGET_AVX512 1
#endif
#else
#define SPECDEC_TARGET_BASELINE 1
#define SPECDEC_TARGET_AVX2 0
#define SPECDEC_TARGET_AVX512 0
#endif

#define SPECDEC_DETAIL_TARGETS_CAT(a, b, c) targets_##a##b##c
#define SPECDEC_DETAIL_TARGETS_NAME(a, b, c) SPECDEC_DETAIL_TARGETS_CAT(a, b, c)
//! The inline namespace of what depends on the compiled targets (e.g. `targets_111`).
#define SPECDEC_TARGETS_NAMESPACE \
  SPECDEC_DETAIL_TARGETS_NAME(SPECDEC_TARGET_BASELINE, SPECDEC_TARGET_AVX2, SPECDEC_TARGET_AVX512)

//! The `target` attribute string of each target compiled under a pragma.
#define SPECDEC_AVX2_FEATURES "avx,avx2,fma,f16c"
#define SPECDEC_AVX512_FEATURES "avx,avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl"

#if defined(__clang__)
#define SPECDEC_DETAIL_PRAGMA(x) _Pragma(#x)
//! Compiles the functions up to `SPECDEC_END_TARGET` for the instruction set `features`.
#define SPECDEC_BEGIN_TARGET(features) \
  SPECDEC_DETAIL_PRAGMA(               \
      clang attribute push(__attribute__((target(features))), apply_to = function))
#define SPECDEC_END_TARGET _Pragma("clang attribute pop")
#elif defined(__GNUC__)
#define SPECDEC_DETAIL_PRAGMA(x) _Pragma(#x)
#define SPECDEC_BEGIN_TARGET(features) \
  _Pragma("GCC push_options") SPECDEC_DETAIL_PRAGMA(GCC target(features))
#define SPECDEC_END_TARGET _Pragma("GCC pop_options")
#else
#define SPECDEC_BEGIN_TARGET(features)
#define SPECDEC_END_TARGET
#endif

namespace specdec {

//! An instruction set the CPU kernels can be compiled for (ordered: each includes the previous).
enum class cpu_target {
  baseline,  //!< what the compiler flags give (SSE2 on plain x86-64; the scalar fallback elsewhere)
  avx2,      //!< AVX2, FMA and F16C
  avx512,    //!< AVX-512 F, BW, DQ and VL
};

//! Every target, in order.
inline constexpr cpu_target all_cpu_targets[] = {cpu_target::baseline, cpu_target::avx2,
                                                 cpu_target::avx512};

//! The target's name: "baseline", "avx2" or "avx512".
[[nodiscard]] constexpr std::string_view to_string(cpu_target t) noexcept {
  switch (t) {
    case cpu_target::avx2:
      return "avx2";
    case cpu_target::avx512:
      return "avx512";
    case cpu_target::baseline:
      break;
  }
  return "baseline";
}

//! The target named `name` ("baseline", "avx2", "avx512"); `errc::invalid_argument` otherwise.
[[nodiscard]] inline cpu_target parse_cpu_target(std::string_view name) {
  for (cpu_target t : all_cpu_targets)
    if (name == to_string(t)) return t;
  SPECDEC_THROW(invalid_argument, "unknown CPU target '", name,
                "' (expected baseline, avx2 or avx512)");
}

inline namespace SPECDEC_TARGETS_NAMESPACE {

//! Whether the kernels of this build include a copy for `t`.
[[nodiscard]] constexpr bool cpu_target_compiled(cpu_target t) noexcept {
  switch (t) {
    case cpu_target::avx2:
      return SPECDEC_TARGET_AVX2 != 0;
    case cpu_target::avx512:
      return SPECDEC_TARGET_AVX512 != 0;
    case cpu_target::baseline:
      break;
  }
  return SPECDEC_TARGET_BASELINE != 0;
}

}  // namespace SPECDEC_TARGETS_NAMESPACE

//! Whether this CPU can run `t`'s instructions (the baseline always).
[[nodiscard]] inline bool cpu_target_supported(cpu_target t) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
  switch (t) {
    case cpu_target::avx2:
      // Every CPU with AVX2 and FMA has F16C (Clang 14 cannot ask for it).
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case cpu_target::avx512:
      return cpu_target_supported(cpu_target::avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
    case cpu_target::baseline:
      break;
  }
  return true;
#else
  return t == cpu_target::baseline;
#endif
}

inline namespace SPECDEC_TARGETS_NAMESPACE {

//! The best target this build compiled and this CPU supports.
[[nodiscard]] inline cpu_target best_cpu_target() noexcept {
  for (cpu_target t : {cpu_target::avx512, cpu_target::avx2})
    if (cpu_target_compiled(t) && cpu_target_supported(t)) return t;
  return cpu_target::baseline;
}

}  // namespace SPECDEC_TARGETS_NAMESPACE

namespace detail {
inline namespace SPECDEC_TARGETS_NAMESPACE {

//! Throws unless this build compiled `t` and this CPU runs it.
inline void check_cpu_target(cpu_target t, std::string_view where) {
  SPECDEC_CHECK(cpu_target_compiled(t), unsupported, where, ": CPU target ", to_string(t),
                " is not compiled in this build (its flags fix the target to ",
                to_string(best_cpu_target()), ")");
  SPECDEC_CHECK(cpu_target_supported(t), unsupported, where, ": this CPU cannot run CPU target ",
                to_string(t));
}

//! The target the environment asks for (`SPECDEC_CPU_TARGET`), else the best one.
inline cpu_target initial_cpu_target() {
  char const* const env = std::getenv("SPECDEC_CPU_TARGET");
  if (env == nullptr || *env == '\0') return best_cpu_target();
  cpu_target const t = parse_cpu_target(env);
  check_cpu_target(t, "SPECDEC_CPU_TARGET");
  return t;
}

}  // namespace SPECDEC_TARGETS_NAMESPACE

//! The chosen target, one for the whole program (initialised on first use, by the first
//! translation unit that asks).
inline std::atomic<cpu_target>& cpu_target_choice() {
  static std::atomic<cpu_target> choice{initial_cpu_target()};
  return choice;
}

}  // namespace detail

//! The target the CPU kernels use now (see the file comment). The first call reads
//! `SPECDEC_CPU_TARGET` and throws `errc::invalid_argument` for an unknown name or
//! `errc::unsupported` for a target this build or CPU lacks.
[[nodiscard]] inline cpu_target active_cpu_target() {
  return detail::cpu_target_choice().load(std::memory_order_relaxed);
}

inline namespace SPECDEC_TARGETS_NAMESPACE {

//! Makes `t` the target of sampling, verification and of the models built from now on (a model
//! keeps the target it was built with). `errc::unsupported` if this build or CPU lacks it.
inline void set_cpu_target(cpu_target t) {
  detail::check_cpu_target(t, "set_cpu_target");
  detail::cpu_target_choice().store(t, std::memory_order_relaxed);
}

}  // namespace SPECDEC_TARGETS_NAMESPACE
}  // namespace specdec
