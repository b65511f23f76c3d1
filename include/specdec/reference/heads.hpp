#pragma once
//! \file
//! Slow, obviously-correct reference versions of the Medusa and Hydra head computations, in double
//! precision, read straight from the formulas of model/heads.hpp. Tests compare the backends'
//! heads runners against these; nothing else should call them.

#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/model/heads.hpp"

namespace specdec {

namespace detail {

//! SiLU(z) = z / (1 + exp(-z)), in double.
[[nodiscard]] inline double reference_silu(double z) {
  return z / (1.0 + std::exp(-z));
}

//! out[r] = sum_j w[r * cols + j] x[j] (+ bias[r] when not null) for r < rows, in double.
[[nodiscard]] inline std::vector<double> reference_affine(float const* w, float const* bias,
                                                          std::size_t rows,
                                                          std::vector<double> const& x) {
  std::vector<double> out(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    double s = bias != nullptr ? static_cast<double>(bias[r]) : 0.0;
    for (std::size_t j = 0; j < x.size(); ++j) s += static_cast<double>(w[r * x.size() + j]) * x[j];
    out[r] = s;
  }
  return out;
}

//! x = x + SiLU(W x + b): one residual block.
inline void reference_block(head_block const& b, std::vector<double>& x) {
  std::vector<double> const z = reference_affine(b.weight, b.bias, x.size(), x);
  for (std::size_t j = 0; j < x.size(); ++j) x[j] += reference_silu(z[j]);
}

}  // namespace detail

//! The logits of Medusa head `head` on the hidden row `hidden`: x = h; x = x + SiLU(W_l x + b_l)
//! per block; U x.
[[nodiscard]] inline std::vector<double> reference_medusa_logits(medusa_weights const& w,
                                                                 std::size_t head,
                                                                 std::span<float const> hidden) {
  SPECDEC_CHECK(head < w.heads.size() && hidden.size() == w.dim, invalid_argument,
                "reference_medusa_logits: head ", head, ", hidden row of ", hidden.size());
  std::vector<double> x(hidden.begin(), hidden.end());
  for (head_block const& b : w.heads[head].blocks) detail::reference_block(b, x);
  return detail::reference_affine(w.heads[head].lm_head, nullptr, w.vocab, x);
}

//! The logits of Hydra head `head` on the hidden row `hidden` for the path `path` (the root, then
//! the tokens drafted at depths 1..head): u = concat(h, E[path]) with E = `embedding` [vocab,
//! dim]; x = R u + r + SiLU(A u + a); x = x + SiLU(W_l x + b_l) per further block; U x + c.
[[nodiscard]] inline std::vector<double> reference_hydra_logits(hydra_weights const& w,
                                                                float const* embedding,
                                                                std::size_t head,
                                                                std::span<float const> hidden,
                                                                std::span<token_id const> path) {
  SPECDEC_CHECK(head < w.heads.size() && hidden.size() == w.dim && path.size() == head + 1,
                invalid_argument, "reference_hydra_logits: head ", head, ", hidden row of ",
                hidden.size(), ", path of ", path.size());
  std::vector<double> u(hidden.begin(), hidden.end());
  for (token_id t : path) {
    SPECDEC_CHECK(t >= 0 && static_cast<std::size_t>(t) < w.vocab, out_of_range,
                  "reference_hydra_logits: token ", t);
    for (std::size_t j = 0; j < w.dim; ++j)
      u.push_back(static_cast<double>(embedding[static_cast<std::size_t>(t) * w.dim + j]));
  }
  hydra_weights::head const& h = w.heads[head];
  std::vector<double> const a = detail::reference_affine(h.in_weight, h.in_bias, w.dim, u);
  std::vector<double> x = detail::reference_affine(h.res_weight, h.res_bias, w.dim, u);
  for (std::size_t j = 0; j < w.dim; ++j) x[j] += detail::reference_silu(a[j]);
  for (head_block const& b : h.blocks) detail::reference_block(b, x);
  return detail::reference_affine(h.lm_head, h.lm_bias, w.vocab, x);
}

}  // namespace specdec
