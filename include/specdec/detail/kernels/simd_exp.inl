//! \file
//! `exp_nonpositive` on the vectors of detail/kernels/simd.inl: the algorithm of detail/exp.hpp
//! over `vector_exp_ops`. A kernel body, included with simd.inl (see detail/simd.hpp).
//! The operations of `exp_nonpositive_with` on `vfloat` lanes. With AVX-512 the clamp is one
//! maximum and the final er * 2^n (zero below the limit) one scaling instruction: scaling by a
//! power of two rounds the exact product once, as the multiplication by 2^n does (n >= -126: 2^n
//! is normal), so the values are those of the generic operations.
struct vector_exp_ops {
  using value = vfloat;  //!< the operand type

  [[nodiscard]] SPECDEC_INLINE static vfloat splat(float c) noexcept { return vfloat{} + c; }
  //! a * b lane by lane, never fused with the addition that follows (as `scalar_exp_ops::mul`).
  [[nodiscard]] SPECDEC_INLINE static vfloat mul(vfloat a, vfloat b) noexcept {
    vfloat r = a * b;
#if SPECDEC_VECTOR_EXTENSIONS && (defined(__x86_64__) || defined(__i386__))
    asm("" : "+v"(r));
#elif SPECDEC_VECTOR_EXTENSIONS && defined(__aarch64__)
    asm("" : "+w"(r));
#endif
    return r;
  }
  [[nodiscard]] SPECDEC_INLINE static vfloat add(vfloat a, vfloat b) noexcept {
    return a + b;
  }
  [[nodiscard]] SPECDEC_INLINE static vfloat sub(vfloat a, vfloat b) noexcept {
    return a - b;
  }
  //! max(x, `exp_lower_limit`) lane by lane (x not NaN).
  [[nodiscard]] SPECDEC_INLINE static vfloat clamp_low(vfloat x) noexcept {
#if SPECDEC_VECTOR_EXTENSIONS && SPECDEC_KERNEL_LEVEL >= 2
    if constexpr (simd_width == 16) {
      __m512 xv;
      std::memcpy(&xv, &x, sizeof xv);
      __m512 const m = _mm512_maskz_max_ps(0xFFFF, xv, _mm512_set1_ps(exp_lower_limit));
      vfloat out;
      std::memcpy(&out, &m, sizeof out);
      return out;
    }
#endif
    vfloat const lo = vfloat{} + exp_lower_limit;
    return select(x > lo, x, lo);
  }
  //! er * 2^n lane by lane (n also held in the low mantissa bits of `shifted`); 0 where `x` is
  //! below `exp_lower_limit`.
  [[nodiscard]] SPECDEC_INLINE static vfloat scale_pow2(vfloat er, vfloat n, vfloat shifted,
                                                        vfloat x) noexcept {
#if SPECDEC_VECTOR_EXTENSIONS && SPECDEC_KERNEL_LEVEL >= 2
    if constexpr (simd_width == 16) {
      __m512 e, k, xv;
      std::memcpy(&e, &er, sizeof e);
      std::memcpy(&k, &n, sizeof k);
      std::memcpy(&xv, &x, sizeof xv);
      __mmask16 const keep = _mm512_cmp_ps_mask(xv, _mm512_set1_ps(exp_lower_limit), _CMP_NLT_US);
      __m512 const y = _mm512_maskz_scalef_ps(keep, e, k);
      vfloat out;
      std::memcpy(&out, &y, sizeof out);
      return out;
    }
#endif
    (void)n;
    vint ni;
    std::memcpy(&ni, &shifted, sizeof ni);
    ni = ni - 0x4B400000;
    vint const bits = (ni + 127) << 23;
    vfloat scale;
    std::memcpy(&scale, &bits, sizeof scale);
    vfloat const y = mul(er, scale);
    return select(x < exp_lower_limit, vfloat{}, y);
  }
};

//! exp(x) lane by lane for lanes x <= 0 (see `exp_nonpositive_with`).
[[nodiscard]] SPECDEC_INLINE vfloat exp_nonpositive(vfloat x) noexcept {
#if defined(__CUDA_ARCH__)
  return x;  // host vectors only: nvcc's device pass never runs this, and cannot compile it
#else
  return exp_nonpositive_with<vector_exp_ops>(x);
#endif
}
