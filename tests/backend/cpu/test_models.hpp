#pragma once
// Test helpers for the CPU backend: tiny random Llama weights, an obviously-correct reference
// forward in double precision, and small comparison utilities.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "specdec/core/forward.hpp"
#include "specdec/core/types.hpp"
#include "specdec/model/llama_weights.hpp"

namespace specdec::test {

// Points a weights struct into one float buffer laid out in llama2.c order.
inline void point_llama2c(llama_weights& w, float const* base, bool shared_classifier) {
  llama_config const& c = w.config;
  auto const d = static_cast<std::size_t>(c.dim), h = static_cast<std::size_t>(c.hidden_dim),
             nl = static_cast<std::size_t>(c.n_layers), v = static_cast<std::size_t>(c.vocab_size),
             kv = static_cast<std::size_t>(c.kv_dim());
  float const* p = base;
  auto take = [&p](std::size_t count) {
    float const* r = p;
    p += count;
    return r;
  };
  w.token_embedding = take(v * d);
  w.layers.assign(nl, {});
  for (auto& l : w.layers) l.rms_att = take(d);
  for (auto& l : w.layers) l.wq = take(d * d);
  for (auto& l : w.layers) l.wk = take(kv * d);
  for (auto& l : w.layers) l.wv = take(kv * d);
  for (auto& l : w.layers) l.wo = take(d * d);
  for (auto& l : w.layers) l.rms_ffn = take(d);
  for (auto& l : w.layers) l.w1 = take(h * d);
  for (auto& l : w.layers) l.w2 = take(d * h);
  for (auto& l : w.layers) l.w3 = take(h * d);
  w.rms_final = take(d);
  w.classifier = shared_classifier ? w.token_embedding : take(v * d);
}

// Tiny random weights: N(0, 0.3) matrices (large enough that attention is far from uniform),
// norms around 1.
inline std::shared_ptr<llama_weights const> random_llama(llama_config c, std::uint64_t seed) {
  c.validate("random_llama");
  auto w = std::make_shared<llama_weights>();
  w->config = c;
  auto data = std::make_shared<std::vector<float>>(c.parameter_count());
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (float& f : *data) f = normal(rng);
  point_llama2c(*w, data->data(), c.shared_classifier);
  // Norm weights near 1 (they sit inside the buffer, so write through the buffer).
  auto fix = [&](float const* p, std::size_t count) {
    float* q = data->data() + (p - data->data());
    for (std::size_t i = 0; i < count; ++i) q[i] = 1.0f + 0.1f * normal(rng);
  };
  auto const d = static_cast<std::size_t>(c.dim);
  for (auto const& l : w->layers) {
    fix(l.rms_att, d);
    fix(l.rms_ffn, d);
  }
  fix(w->rms_final, d);
  w->storage = data;
  return w;
}

// The same weights without some layers (shares the storage).
inline std::shared_ptr<llama_weights const> drop_layers(llama_weights const& src,
                                                        std::vector<std::int32_t> const& drop) {
  auto w = std::make_shared<llama_weights>(src);
  w->layers.clear();
  for (std::size_t l = 0; l < src.layers.size(); ++l) {
    bool dropped = false;
    for (auto d : drop) dropped = dropped || static_cast<std::size_t>(d) == l;
    if (!dropped) w->layers.push_back(src.layers[l]);
  }
  w->config.n_layers = static_cast<std::int32_t>(w->layers.size());
  return w;
}

// What `reference_forward` returns.
struct reference_output {
  std::vector<double> logits;  // [n, vocab]
  // [layers, kv_heads, score_past]: over the last score_rows tokens and the query heads of each
  // kv head, the attention weight (or the scaled logit) of each position j < score_past it sees.
  std::vector<double> scores;
};

// An obviously-correct forward in double precision of the sequence `tokens` at positions
// 0..n-1, token t attending to token j <= t in layer l, kv head g when sees(l, g, t, j).
template <class Sees>
reference_output reference_forward(llama_weights const& w, std::span<token_id const> tokens,
                                   Sees sees, std::size_t score_rows = 0,
                                   std::size_t score_past = 0, bool logit_scores = false) {
  llama_config const& c = w.config;
  auto const d = static_cast<std::size_t>(c.dim), hd = static_cast<std::size_t>(c.hidden_dim),
             nh = static_cast<std::size_t>(c.n_heads), nkv = static_cast<std::size_t>(c.n_kv_heads),
             hs = static_cast<std::size_t>(c.head_size()),
             kvd = static_cast<std::size_t>(c.kv_dim()), v = static_cast<std::size_t>(c.vocab_size);
  std::size_t const n = tokens.size();
  auto matvec = [](float const* m, std::vector<double> const& x, std::size_t rows,
                   std::size_t cols) {
    std::vector<double> y(rows, 0.0);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < cols; ++j) y[r] += double(m[r * cols + j]) * x[j];
    return y;
  };
  auto norm = [&](std::vector<double> const& x, float const* g) {
    double ss = 0;
    for (double e : x) ss += e * e;
    double const s = 1.0 / std::sqrt(ss / double(x.size()) + double(c.rms_eps));
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * double(g[i]);
    return y;
  };
  auto rope = [&](std::vector<double>& x, std::size_t heads, std::size_t pos) {
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < hs; i += 2) {
        double const f = std::pow(double(c.rope_theta), -double(i) / double(hs));
        double const a = double(pos) * f, co = std::cos(a), si = std::sin(a);
        double const x0 = x[h * hs + i], x1 = x[h * hs + i + 1];
        x[h * hs + i] = x0 * co - x1 * si;
        x[h * hs + i + 1] = x0 * si + x1 * co;
      }
  };
  std::vector<std::vector<double>> x(n, std::vector<double>(d));
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t i = 0; i < d; ++i)
      x[t][i] = w.token_embedding[static_cast<std::size_t>(tokens[t]) * d + i];
  reference_output out;
  out.scores.assign(w.layers.size() * nkv * score_past, 0.0);
  for (std::size_t layer = 0; layer < w.layers.size(); ++layer) {
    llama_layer_weights const& lw = w.layers[layer];
    std::vector<std::vector<double>> q(n), k(n), val(n);
    for (std::size_t t = 0; t < n; ++t) {
      auto xb = norm(x[t], lw.rms_att);
      q[t] = matvec(lw.wq, xb, d, d);
      k[t] = matvec(lw.wk, xb, kvd, d);
      val[t] = matvec(lw.wv, xb, kvd, d);
      rope(q[t], nh, t);
      rope(k[t], nkv, t);
    }
    for (std::size_t t = 0; t < n; ++t) {
      std::vector<double> att(d, 0.0);
      for (std::size_t h = 0; h < nh; ++h) {
        std::size_t const g = h / (nh / nkv);
        std::vector<double> s(t + 1), p(t + 1, 0.0);
        double mx = -1e300;
        for (std::size_t j = 0; j <= t; ++j) {
          if (!sees(layer, g, t, j)) continue;
          double dot = 0;
          for (std::size_t i = 0; i < hs; ++i) dot += q[t][h * hs + i] * k[j][g * hs + i];
          s[j] = dot / std::sqrt(double(hs));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (std::size_t j = 0; j <= t; ++j)
          if (sees(layer, g, t, j)) sum += (p[j] = std::exp(s[j] - mx));
        for (std::size_t j = 0; j <= t; ++j)
          for (std::size_t i = 0; i < hs; ++i) att[h * hs + i] += p[j] / sum * val[j][g * hs + i];
        if (t + score_rows >= n)
          for (std::size_t j = 0; j < score_past && j <= t; ++j)
            if (sees(layer, g, t, j))
              out.scores[(layer * nkv + g) * score_past + j] += logit_scores ? s[j] : p[j] / sum;
      }
      auto o = matvec(lw.wo, att, d, d);
      for (std::size_t i = 0; i < d; ++i) x[t][i] += o[i];
      auto xb = norm(x[t], lw.rms_ffn);
      auto g1 = matvec(lw.w1, xb, hd, d);
      auto g3 = matvec(lw.w3, xb, hd, d);
      for (std::size_t i = 0; i < hd; ++i) g1[i] = g1[i] / (1.0 + std::exp(-g1[i])) * g3[i];
      auto down = matvec(lw.w2, g1, d, hd);
      for (std::size_t i = 0; i < d; ++i) x[t][i] += down[i];
    }
  }
  out.logits.resize(n * v);
  for (std::size_t t = 0; t < n; ++t) {
    auto xb = norm(x[t], w.rms_final);
    auto l = matvec(w.classifier, xb, v, d);
    std::copy(l.begin(), l.end(), out.logits.begin() + static_cast<std::ptrdiff_t>(t * v));
  }
  return out;
}

// The reference forward's logits [n, vocab] for the causal sequence `tokens` at positions 0..n-1.
inline std::vector<double> reference_logits(llama_weights const& w,
                                            std::span<token_id const> tokens) {
  return reference_forward(w, tokens,
                           [](std::size_t, std::size_t, std::size_t, std::size_t) { return true; })
      .logits;
}

// Largest |a - b| / (1 + max |b|) over two rows.
template <class A, class B>
double row_error(A const& a, B const& b, std::size_t count) {
  double max_b = 0, err = 0;
  for (std::size_t i = 0; i < count; ++i) max_b = std::max(max_b, std::abs(double(b[i])));
  for (std::size_t i = 0; i < count; ++i)
    err = std::max(err, std::abs(double(a[i]) - double(b[i])));
  return err / (1.0 + max_b);
}

// Index of the largest value (first on ties).
inline token_id argmax(std::span<float const> row) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < row.size(); ++i)
    if (row[i] > row[best]) best = i;
  return static_cast<token_id>(best);
}

// A bit-packed [n, n] mask from a predicate.
template <class Visible>
std::vector<std::uint64_t> make_mask(std::size_t n, Visible visible) {
  std::size_t const words = mask_words(n);
  std::vector<std::uint64_t> mask(n * words, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      if (visible(i, j)) mask[i * words + j / 64] |= std::uint64_t{1} << (j % 64);
  return mask;
}

}  // namespace specdec::test
