#pragma once
//! \file
//! The weight dtypes on the device: the CUDA element type of each `weight_dtype` (float, __half,
//! __nv_bfloat16), conversions to and from float32 (round to nearest even), 8-element vector loads
//! of weight rows, the cuBLAS data type, and `with_dtype`, which calls a generic function with the
//! element type of a dtype known at run time. Internal to backend/cuda.

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "specdec/backend/cuda/weight_layout.hpp"

namespace specdec::cuda::detail {

//! The cuBLAS / CUDA data type of `t`.
[[nodiscard]] constexpr cudaDataType_t cuda_data_type(weight_dtype t) noexcept {
  switch (t) {
    case weight_dtype::f16:
      return CUDA_R_16F;
    case weight_dtype::bf16:
      return CUDA_R_16BF;
    case weight_dtype::f32:
      break;
  }
  return CUDA_R_32F;
}

//! Calls `f(T{})` with T the element type of `t` (float, __half or __nv_bfloat16) and returns
//! what it returns.
template <class F>
decltype(auto) with_dtype(weight_dtype t, F&& f) {
  switch (t) {
    case weight_dtype::f16:
      return f(__half{});
    case weight_dtype::bf16:
      return f(__nv_bfloat16{});
    case weight_dtype::f32:
      break;
  }
  return f(float{});
}

#if defined(__CUDACC__)

//! `x` as float32 (exact).
__device__ __forceinline__ float to_float(float x) noexcept {
  return x;
}
__device__ __forceinline__ float to_float(__half x) noexcept {
  return __half2float(x);
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) noexcept {
  return __bfloat162float(x);
}

//! `x` as T, rounded to nearest even.
template <class T>
__device__ __forceinline__ T from_float(float x) noexcept {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else
    return x;
}

//! The 8 elements at `p` (16-byte aligned for 2-byte types, 32-byte aligned rows of 16-byte
//! aligned halves for float) as float32, through the read-only cache.
__device__ __forceinline__ void load8(float const* p, float (&f)[8]) noexcept {
  float4 const a = __ldg(reinterpret_cast<float4 const*>(p));
  float4 const b = __ldg(reinterpret_cast<float4 const*>(p) + 1);
  f[0] = a.x;
  f[1] = a.y;
  f[2] = a.z;
  f[3] = a.w;
  f[4] = b.x;
  f[5] = b.y;
  f[6] = b.z;
  f[7] = b.w;
}
__device__ __forceinline__ void load8(__half const* p, float (&f)[8]) noexcept {
  uint4 const u = __ldg(reinterpret_cast<uint4 const*>(p));
  std::uint32_t const words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h;
    static_assert(sizeof h == sizeof words[i]);
    __builtin_memcpy(&h, &words[i], sizeof h);
    float2 const v = __half22float2(h);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}
__device__ __forceinline__ void load8(__nv_bfloat16 const* p, float (&f)[8]) noexcept {
  uint4 const u = __ldg(reinterpret_cast<uint4 const*>(p));
  std::uint32_t const words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162 h;
    static_assert(sizeof h == sizeof words[i]);
    __builtin_memcpy(&h, &words[i], sizeof h);
    float2 const v = __bfloat1622float2(h);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

#endif  // __CUDACC__

}  // namespace specdec::cuda::detail
