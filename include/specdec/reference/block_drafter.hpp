#pragma once
//! \file
//! A slow, obviously-correct reference of a block drafter (model/block_drafter.hpp), in double
//! precision: the context rows and one block recomputed from scratch, every attention written
//! out as the formula. Tests compare `cpu_block_drafter` and `block_proposer` against it; nothing
//! else should call it.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "specdec/core/error.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/views.hpp"
#include "specdec/model/block_drafter.hpp"
#include "specdec/reference/eagle.hpp"
#include "specdec/reference/heads.hpp"

namespace specdec {

//! The block of root `root` over the context rows of `features` [T, feature_width] (tokens 0..T-1
//! at positions 0..T-1; the block at T..T+B-1): rms(h_i, norm) of its B rows, [B][dim], in
//! double.
[[nodiscard]] inline std::vector<std::vector<double>> reference_block_outputs(
    block_drafter_weights const& w, matrix_view<float const> features, token_id root) {
  block_drafter_config const& c = w.config;
  std::size_t const d = w.dim, hs = c.head_dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  std::size_t const per_kv = c.num_heads / c.num_kv_heads, T = features.rows(), B = c.block_size;
  SPECDEC_CHECK((T == 0 || features.cols() == w.feature_width()) && root >= 0 &&
                    static_cast<std::size_t>(root) < w.vocab,
                invalid_argument, "reference_block_outputs: malformed features or root");
  double const theta = static_cast<double>(c.rope_theta);
  std::vector<std::vector<double>> ctx(T);
  for (std::size_t j = 0; j < T; ++j) {
    std::span<float const> const f = features.row(j);
    std::vector<double> const x(f.begin(), f.end());
    ctx[j] = detail::reference_rmsnorm(detail::reference_affine(w.fc, nullptr, d, x), w.hidden_norm,
                                       c.rms_eps);
  }
  std::vector<std::vector<double>> h(B, std::vector<double>(d));
  for (std::size_t j = 0; j < d; ++j) {
    h[0][j] = static_cast<double>(w.embedding[static_cast<std::size_t>(root) * d + j]);
    for (std::size_t i = 1; i < B; ++i) h[i][j] = static_cast<double>(w.mask_embedding[j]);
  }
  for (block_drafter_layer const& L : w.layers) {
    // keys and values: the context rows at 0..T-1, then the block's rows at T..T+B-1
    std::vector<std::vector<double>> keys, values, queries;
    for (std::size_t j = 0; j < T; ++j) {
      keys.push_back(detail::reference_affine(L.wk, nullptr, kv_dim, ctx[j]));
      detail::reference_rope(keys.back(), c.num_kv_heads, hs, static_cast<double>(j), theta);
      values.push_back(detail::reference_affine(L.wv, nullptr, kv_dim, ctx[j]));
    }
    for (std::size_t i = 0; i < B; ++i) {
      std::vector<double> const a = detail::reference_rmsnorm(h[i], L.input_norm, c.rms_eps);
      double const pos = static_cast<double>(T + i);
      queries.push_back(detail::reference_affine(L.wq, nullptr, q_dim, a));
      detail::reference_rope(queries.back(), c.num_heads, hs, pos, theta);
      keys.push_back(detail::reference_affine(L.wk, nullptr, kv_dim, a));
      detail::reference_rope(keys.back(), c.num_kv_heads, hs, pos, theta);
      values.push_back(detail::reference_affine(L.wv, nullptr, kv_dim, a));
    }
    for (std::size_t i = 0; i < B; ++i) {
      std::vector<double> att(q_dim, 0.0);
      for (std::size_t hd = 0; hd < c.num_heads; ++hd) {
        std::size_t const g = hd / per_kv;
        std::vector<double> score(keys.size());
        double top = -INFINITY;
        for (std::size_t s = 0; s < keys.size(); ++s) {
          double dot = 0.0;
          for (std::size_t j = 0; j < hs; ++j) dot += queries[i][hd * hs + j] * keys[s][g * hs + j];
          score[s] = dot / std::sqrt(static_cast<double>(hs));
          top = std::max(top, score[s]);
        }
        double sum = 0.0;
        for (double& sc : score) sum += sc = std::exp(sc - top);
        for (std::size_t s = 0; s < keys.size(); ++s)
          for (std::size_t j = 0; j < hs; ++j)
            att[hd * hs + j] += score[s] / sum * values[s][g * hs + j];
      }
      std::vector<double> const o = detail::reference_affine(L.wo, nullptr, d, att);
      for (std::size_t j = 0; j < d; ++j) h[i][j] += o[j];
      std::vector<double> const xb = detail::reference_rmsnorm(h[i], L.post_norm, c.rms_eps);
      std::vector<double> const gate =
          detail::reference_affine(L.w1, nullptr, c.intermediate_size, xb);
      std::vector<double> const up =
          detail::reference_affine(L.w3, nullptr, c.intermediate_size, xb);
      std::vector<double> act(gate.size());
      for (std::size_t j = 0; j < gate.size(); ++j)
        act[j] = detail::reference_silu(gate[j]) * up[j];
      std::vector<double> const down = detail::reference_affine(L.w2, nullptr, d, act);
      for (std::size_t j = 0; j < d; ++j) h[i][j] += down[j];
    }
  }
  for (auto& row : h) row = detail::reference_rmsnorm(row, w.norm, c.rms_eps);
  return h;
}

//! The logits [vocab] of a block output (the target's classifier), plus the Markov bias after
//! `prev` when `prev` >= 0 (DSpark).
[[nodiscard]] inline std::vector<double> reference_block_logits(block_drafter_weights const& w,
                                                                std::vector<double> const& out,
                                                                token_id prev = -1) {
  std::vector<double> l = detail::reference_affine(w.classifier, nullptr, w.vocab, out);
  if (prev >= 0) {
    std::size_t const r = w.config.markov_rank;
    for (std::size_t v = 0; v < w.vocab; ++v)
      for (std::size_t k = 0; k < r; ++k)
        l[v] += static_cast<double>(w.markov_out[v * r + k]) *
                static_cast<double>(w.markov_in[static_cast<std::size_t>(prev) * r + k]);
  }
  return l;
}

}  // namespace specdec
