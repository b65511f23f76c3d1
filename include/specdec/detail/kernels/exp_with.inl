//! \file
//! `exp_nonpositive_with<Ops>`, the one definition of the rows' exp (see detail/exp.hpp). A kernel
//! body: detail/exp.hpp includes it in `specdec::detail` (floats, host and device), detail/rows.hpp
//! once per CPU target (the vectors of that target), so that each copy is compiled, and inlined,
//! for its own instruction set.

//! exp(x) for x <= 0 (x may be -inf; callers pass no NaN), computed with the operations of `Ops` on
//! `Ops::value` operands: within 1 ulp of the correctly rounded value (checked exhaustively over
//! [-87.34, 0]); exactly 1 at x = 0 and exactly 0 below `exp_lower_limit` (results that would be
//! subnormal are flushed to 0). Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, and the
//! Cephes expf polynomial for exp(r).
template <class Ops, class F = typename Ops::value>
[[nodiscard]] SPECDEC_HOST_DEVICE inline F exp_nonpositive_with(F x) noexcept {
  namespace c = exp_constants;
  F const xc = Ops::clamp_low(x);
  F const shifted = Ops::add(Ops::mul(xc, Ops::splat(c::log2e)), Ops::splat(c::round_magic));
  F const n = Ops::sub(shifted, Ops::splat(c::round_magic));
  F const r = Ops::sub(Ops::sub(xc, Ops::mul(n, Ops::splat(c::ln2_hi))),
                       Ops::mul(n, Ops::splat(c::ln2_lo)));
  F p = Ops::splat(c::p0);
  p = Ops::add(Ops::mul(p, r), Ops::splat(c::p1));
  p = Ops::add(Ops::mul(p, r), Ops::splat(c::p2));
  p = Ops::add(Ops::mul(p, r), Ops::splat(c::p3));
  p = Ops::add(Ops::mul(p, r), Ops::splat(c::p4));
  p = Ops::add(Ops::mul(p, r), Ops::splat(c::p5));
  F const er = Ops::add(Ops::add(Ops::mul(Ops::mul(p, r), r), r), Ops::splat(1.0f));
  return Ops::scale_pow2(er, n, shifted, x);
}
