#pragma once
//! \file
//! A slow, obviously-correct reference of the EAGLE head (model/eagle.hpp), in double precision:
//! the whole sequence of head entries recomputed from scratch, every entry's attention over the
//! entries it sees written out as the formula. Tests compare the backends' head runners and the
//! proposer's incremental cache against it; nothing else should call it.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/model/eagle.hpp"
#include "specdec/reference/heads.hpp"

namespace specdec {

//! One entry of an EAGLE head's sequence for `reference_eagle_outputs`.
struct reference_eagle_entry {
  std::vector<float> feature;  //!< [feature_width] the target feature, when `input` < 0
  std::int64_t input = -1;     //!< else the index of the earlier entry whose output is the input
  token_id token = 0;          //!< the token paired with the input
  position_t position = 0;     //!< the entry's position
  std::vector<std::size_t> visible;  //!< the earlier entries it attends to (itself is implied)
};

namespace detail {

//! RMSNorm in double: x / sqrt(mean(x^2) + eps) * weight.
[[nodiscard]] inline std::vector<double> reference_rmsnorm(std::vector<double> const& x,
                                                           float const* weight, float eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  double const scale =
      1.0 / std::sqrt(ss / static_cast<double>(x.size()) + static_cast<double>(eps));
  std::vector<double> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] * scale * static_cast<double>(weight[i]);
  return out;
}

//! Rotates the interleaved pairs of each of `heads` heads of `hs` values at position `pos`.
inline void reference_rope(std::vector<double>& v, std::size_t heads, std::size_t hs, double pos,
                           double theta) {
  for (std::size_t h = 0; h < heads; ++h)
    for (std::size_t i = 0; i < hs; i += 2) {
      double const angle = pos * std::pow(theta, -static_cast<double>(i) / static_cast<double>(hs));
      double const c = std::cos(angle), s = std::sin(angle);
      double const a = v[h * hs + i], b = v[h * hs + i + 1];
      v[h * hs + i] = a * c - b * s;
      v[h * hs + i + 1] = a * s + b * c;
    }
}

}  // namespace detail

//! The output [dim] of every entry of `entries` (in order), recomputed from scratch in double:
//! u = fc(...) as model/eagle.hpp says, the attention of each entry over the entries it sees and
//! itself (keys and values with RoPE at their positions), h = u + o_proj(att), out = h +
//! MLP(post_norm(h)). Throws `errc::invalid_argument` for a malformed entry.
[[nodiscard]] inline std::vector<std::vector<double>> reference_eagle_outputs(
    eagle_weights const& w, std::span<reference_eagle_entry const> entries) {
  eagle_config const& c = w.config;
  bool const e3 = c.version == eagle_version::eagle3;
  std::size_t const d = w.dim, hs = c.head_dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  std::size_t const per_kv = c.num_heads / c.num_kv_heads;
  std::vector<std::vector<double>> out, keys, values;
  for (std::size_t e = 0; e < entries.size(); ++e) {
    reference_eagle_entry const& en = entries[e];
    SPECDEC_CHECK(en.token >= 0 && static_cast<std::size_t>(en.token) < w.vocab &&
                      (en.input < 0 ? en.feature.size() == w.feature_width()
                                    : static_cast<std::size_t>(en.input) < e),
                  invalid_argument, "reference_eagle_outputs: entry ", e, " is malformed");
    std::vector<double> emb(d);
    for (std::size_t j = 0; j < d; ++j)
      emb[j] = static_cast<double>(w.embedding[static_cast<std::size_t>(en.token) * d + j]);
    std::vector<double> input;
    if (en.input < 0)
      input.assign(en.feature.begin(), en.feature.end());
    else
      input = out[static_cast<std::size_t>(en.input)];
    std::vector<double> u;
    if (!e3) {
      std::vector<double> x = emb;
      x.insert(x.end(), input.begin(), input.end());
      u = detail::reference_affine(w.fc, w.fc_bias, d, x);
    } else if (en.input < 0) {
      u = detail::reference_affine(w.fc, nullptr, d, input);
    } else {
      u = input;
    }
    std::vector<double> a = u;
    if (e3) {
      a = detail::reference_rmsnorm(emb, w.input_norm, c.rms_eps);
      std::vector<double> const hn = detail::reference_rmsnorm(u, w.hidden_norm, c.rms_eps);
      a.insert(a.end(), hn.begin(), hn.end());
    }
    std::vector<double> q = detail::reference_affine(w.wq, nullptr, q_dim, a);
    std::vector<double> k = detail::reference_affine(w.wk, nullptr, kv_dim, a);
    keys.push_back(k);
    values.push_back(detail::reference_affine(w.wv, nullptr, kv_dim, a));
    double const pos = static_cast<double>(en.position);
    double const theta = static_cast<double>(c.rope_theta);
    detail::reference_rope(q, c.num_heads, hs, pos, theta);
    detail::reference_rope(keys.back(), c.num_kv_heads, hs, pos, theta);
    std::vector<std::size_t> seen = en.visible;
    for (std::size_t s : seen)
      SPECDEC_CHECK(s < e, invalid_argument, "reference_eagle_outputs: entry ", e, " sees entry ",
                    s);
    seen.push_back(e);
    std::sort(seen.begin(), seen.end());
    std::vector<double> att(q_dim, 0.0);
    for (std::size_t h = 0; h < c.num_heads; ++h) {
      std::size_t const g = h / per_kv;
      std::vector<double> score;
      double top = -INFINITY;
      for (std::size_t s : seen) {
        double dot = 0.0;
        for (std::size_t j = 0; j < hs; ++j) dot += q[h * hs + j] * keys[s][g * hs + j];
        score.push_back(dot / std::sqrt(static_cast<double>(hs)));
        top = std::max(top, score.back());
      }
      double sum = 0.0;
      for (double& sc : score) sum += sc = std::exp(sc - top);
      for (std::size_t i = 0; i < seen.size(); ++i)
        for (std::size_t j = 0; j < hs; ++j)
          att[h * hs + j] += score[i] / sum * values[seen[i]][g * hs + j];
    }
    std::vector<double> h = detail::reference_affine(w.wo, nullptr, d, att);
    for (std::size_t j = 0; j < d; ++j) h[j] += u[j];
    std::vector<double> const xb = detail::reference_rmsnorm(h, w.post_norm, c.rms_eps);
    std::vector<double> const g = detail::reference_affine(w.w1, nullptr, c.intermediate_size, xb);
    std::vector<double> const up = detail::reference_affine(w.w3, nullptr, c.intermediate_size, xb);
    std::vector<double> act(g.size());
    for (std::size_t j = 0; j < g.size(); ++j) act[j] = detail::reference_silu(g[j]) * up[j];
    std::vector<double> const down = detail::reference_affine(w.w2, nullptr, d, act);
    for (std::size_t j = 0; j < d; ++j) h[j] += down[j];
    out.push_back(std::move(h));
  }
  return out;
}

//! The draft-vocabulary logits [draft_vocab] of an output `h` [dim]: EAGLE-3 lm_head(norm(h)),
//! EAGLE-1 the target's classifier on h.
[[nodiscard]] inline std::vector<double> reference_eagle_logits(eagle_weights const& w,
                                                                std::vector<double> const& h) {
  SPECDEC_CHECK(h.size() == w.dim, invalid_argument, "reference_eagle_logits: an output of ",
                h.size());
  if (w.config.version == eagle_version::eagle3)
    return detail::reference_affine(w.lm_head, nullptr, w.draft_vocab,
                                    detail::reference_rmsnorm(h, w.norm, w.config.rms_eps));
  return detail::reference_affine(w.lm_head, nullptr, w.draft_vocab, h);
}

}  // namespace specdec
