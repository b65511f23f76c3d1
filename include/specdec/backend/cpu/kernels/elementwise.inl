//! \file
//! The elementwise kernels of the CPU backend: RMSNorm, RoPE, SwiGLU, the heads' residual SiLU. A
//! kernel body: backend/cpu/kernels.hpp compiles it once per CPU target.

//! out[:n] = x[:n] * (1 / sqrt(mean(x^2) + eps)) * weight[:n]; the sum of squares in simd::width
//! lanes by index, then a fixed tree.
inline void rmsnorm(float* out, float const* x, float const* weight, std::size_t n,
                    float eps) noexcept {
  constexpr std::size_t w = simd::width;
  typename simd::reg acc = simd::zero();
  std::size_t i = 0;
  for (; i + w <= n; i += w) {
    typename simd::reg const r = simd::load(x + i);
    acc = simd::fma(r, r, acc);
  }
  if (i < n) {
    typename simd::reg const r = simd::load_part(x + i, n - i);
    acc = simd::fma(r, r, acc);
  }
  float const scale = 1.0f / std::sqrt(simd::hsum(acc) / static_cast<float>(n) + eps);
  typename simd::reg const sv = simd::set1(scale);
  for (i = 0; i + w <= n; i += w)
    simd::store(out + i, simd::mul(simd::mul(simd::load(x + i), sv), simd::load(weight + i)));
  if (i < n)
    simd::store_part(
        out + i,
        simd::mul(simd::mul(simd::load_part(x + i, n - i), sv), simd::load_part(weight + i, n - i)),
        n - i);
}

//! Rotates the interleaved pairs (2i, 2i + 1) of each of `heads` heads of `head_size` floats at
//! `v` by the angles whose cosines and sines are cos_sin[2i], cos_sin[2i + 1].
inline void rope(float* v, std::size_t heads, std::size_t head_size,
                 float const* cos_sin) noexcept {
  for (std::size_t h = 0; h < heads; ++h) {
    float* const p = v + h * head_size;
    for (std::size_t i = 0; i < head_size; i += 2) {
      float const c = cos_sin[i];
      float const s = cos_sin[i + 1];
      float const a = p[i];
      float const b = p[i + 1];
      p[i] = a * c - b * s;
      p[i + 1] = a * s + b * c;
    }
  }
}

//! gate[i] = silu(gate[i]) * up[i] for i in [0, n) (`simd::silu_mul` on every element).
inline void swiglu(float* gate, float const* up, std::size_t n) noexcept {
  constexpr std::size_t w = simd::width;
  std::size_t i = 0;
  for (; i + w <= n; i += w)
    simd::store(gate + i, simd::silu_mul(simd::load(gate + i), simd::load(up + i)));
  if (i < n)
    simd::store_part(
        gate + i, simd::silu_mul(simd::load_part(gate + i, n - i), simd::load_part(up + i, n - i)),
        n - i);
}

//! x[:n] += SiLU(y[:n] + bias[:n]) (bias may be null), SiLU by `simd::silu_mul` with a factor 1.
inline void add_silu(float* x, float const* y, float const* bias, std::size_t n) noexcept {
  constexpr std::size_t w = simd::width;
  typename simd::reg const one = simd::set1(1.0f);
  std::size_t i = 0;
  auto const at = [&](std::size_t j, std::size_t count) {
    typename simd::reg z = simd::load_part(y + j, count);
    if (bias != nullptr) z = simd::add(z, simd::load_part(bias + j, count));
    simd::store_part(x + j, simd::add(simd::load_part(x + j, count), simd::silu_mul(z, one)),
                     count);
  };
  for (; i + w <= n; i += w) at(i, w);
  if (i < n) at(i, n - i);
}
